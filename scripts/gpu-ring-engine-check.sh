#!/usr/bin/env bash
# GPU check of the sequence-parallel ring (issue 5), on a machine with several GPUs. Builds and
# stages nothing: it runs binaries already copied into .device/ring_engine/ (git-ignored), from the repo
# root. Stage them on the build machine (no GPU needed) with
#
#   bazel build //engine/ring:cuda_block_kernels_test //engine/ring:ring_attention_gpu_test \
#     //engine/comm:nccl_communicator_test //bench/ring_bench:ring_bench
#   mkdir -p .device/ring_engine && cp -fL bazel-bin/engine/ring/cuda_block_kernels_test \
#     bazel-bin/engine/ring/ring_attention_gpu_test bazel-bin/engine/comm/nccl_communicator_test \
#     bazel-bin/bench/ring_bench/ring_bench .device/ring_engine/ && chmod -R u+w .device/ring_engine
#
# and carry .device/ring_engine to the GPU machine. Then:
#
#   scripts/gpu-ring-engine-check.sh [steps]
#
# steps: comma-separated subset of kernels,nccl,ring,bench,longest (default: all of them).
#   kernels  cuda_block_kernels_test: P ranks simulated on one GPU vs the float64 oracle (shards
#            spread over the GPUs, one process each)
#   nccl     nccl_communicator_test: the NCCL communicator (exchange, collectives, counters, a
#            killed peer, abort)
#   ring     ring_attention_gpu_test: one process per GPU, P = 1..4, vs the oracle and the
#            single-GPU backend, bytes vs plan, a killed peer (GTEST_FILTER narrows it)
#   bench    ring_bench: weak scaling at P = 1, 2, 4 against the one-GPU backend (BENCH_ARGS adds
#            flags, e.g. --backward)
#   longest  ring_bench --longest: the longest forward on all GPUs (LONGEST_SHARDS tokens per GPU)
# Environment: STEP_TIMEOUT seconds per step (default 300; <STEP>_TIMEOUT overrides), OUT (a folder
# for logs; a temporary one otherwise). Libraries: cuDNN 9.19 and NCCL from PyTorch's wheels when
# present (the headers we build against), else the system's. NVLink multicast stays off.
set -uo pipefail
cd "$(dirname "$0")/.."

steps="${1:-kernels,nccl,ring,bench,longest}"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
bin=.device/ring_engine
have() { [[ ",$steps," == *",$1,"* ]]; }
timeout_of() {
  local var="${1^^}_TIMEOUT"
  echo "${!var:-${STEP_TIMEOUT:-300}}"
}

export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export NVSHMEM_DISABLE_NVLS=1
. scripts/gpu-libs.sh
libs=$(wheel_lib_path cudnn nccl cuda_nvrtc cu13 cublas)
export LD_LIBRARY_PATH="${libs#:}:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
{
  echo "== environment =="
  date -u
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>&1 | head -9
  nvidia-smi topo -m 2>&1 | head -8
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ldd "$bin/ring_attention_gpu_test" 2>&1 | grep -E "cudnn|nccl|not found" || true
} | tee "$out/env.log"

declare -A result detail
order=()
gtest_summary() {  # log -> "P passed, F failed, S skipped"
  local p f s
  p=$(grep -c '^\[       OK \]' "$1" || true)
  f=$(grep -c '^\[  FAILED  \] .*(' "$1" || true)
  s=$(grep -c '^\[  SKIPPED \] .*(' "$1" || true)
  echo "$p passed, $f failed, $s skipped"
}
record() {  # step rc log
  order+=("$1")
  local summary
  summary=$(gtest_summary "$3")
  local failed
  failed=$(grep -c '^\[  FAILED  \] .*(' "$3" || true)
  if [ "$2" -eq 0 ] && [ "$failed" -eq 0 ]; then result[$1]=PASS; else result[$1]="FAIL (exit $2)"; fi
  detail[$1]="$summary; $3"
}

if have kernels; then
  echo "== kernels: cuda_block_kernels_test on $gpus GPU(s) =="
  start=$(date +%s)
  pids=()
  n=$((gpus > 0 ? gpus : 1))
  for ((i = 0; i < n; i++)); do
    CUDA_VISIBLE_DEVICES=$i GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i \
      timeout "$(timeout_of kernels)" "$bin/cuda_block_kernels_test" \
      --gtest_filter="${KERNELS_FILTER:-*}" >"$out/kernels.$i.tmp" 2>&1 &
    pids+=($!)
  done
  rc=0
  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
  for f in "$out"/kernels.*.tmp; do cat "$f"; rm -f "$f"; done >"$out/kernels.log"
  grep -B2 -A20 '^\[  FAILED  \] .*(' "$out/kernels.log" | grep -vE '^\[ RUN' | head -120 || true
  record kernels "$rc" "$out/kernels.log"
  detail[kernels]="${detail[kernels]} ($(( $(date +%s) - start )) s)"
fi

if have nccl; then
  echo "== nccl: nccl_communicator_test =="
  timeout "$(timeout_of nccl)" "$bin/nccl_communicator_test" >"$out/nccl.log" 2>&1
  rc=$?
  grep -E '^rank|FAILED|OK \]' "$out/nccl.log" | head -40
  record nccl "$rc" "$out/nccl.log"
fi

if have ring; then
  echo "== ring: ring_attention_gpu_test =="
  start=$(date +%s)
  # Three processes at once (the GPUs are shared, the tests do not time anything but the dead
  # peer's error, which has seconds of slack): P = 2, P = 4, the killed peers.
  if [ -n "${GTEST_FILTER:-}" ]; then filters=("$GTEST_FILTER"); else
    filters=("*TwoGpus*" "*FourGpus*" "*Killed*")
  fi
  pids=()
  for ((i = 0; i < ${#filters[@]}; i++)); do
    timeout "$(timeout_of ring)" "$bin/ring_attention_gpu_test" --gtest_filter="${filters[$i]}" \
      >"$out/ring.$i.tmp" 2>&1 &
    pids+=($!)
  done
  rc=0
  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
  for f in "$out"/ring.*.tmp; do cat "$f"; rm -f "$f"; done >"$out/ring.log"
  grep -E 'cases passed|shrunk|survivors|: call [0-9]|FAILED|OK \]|SKIPPED \]' "$out/ring.log" | head -80
  grep -A25 'FAILED ' "$out/ring.log" | head -150 || true
  record ring "$rc" "$out/ring.log"
  detail[ring]="${detail[ring]} ($(( $(date +%s) - start )) s)"
fi

if have bench; then
  echo "== bench: ring_bench ${BENCH_ARGS:-} =="
  # shellcheck disable=SC2086
  timeout "$(timeout_of bench)" "$bin/ring_bench" --ranks="${BENCH_RANKS:-1,2,4}" ${BENCH_ARGS:-} \
    --csv="$out/bench.csv" >"$out/bench.log" 2>&1
  rc=$?
  grep -vE '^\|' "$out/bench.log" | tail -25
  order+=(bench)
  [ "$rc" -eq 0 ] && result[bench]=PASS || result[bench]="FAIL (exit $rc)"
  detail[bench]="$out/bench.log"
fi

if have longest; then
  echo "== longest: ring_bench --longest =="
  timeout "$(timeout_of longest)" "$bin/ring_bench" --no_weak --longest \
    --ranks="${LONGEST_RANKS:-$gpus}" --longest_shards="${LONGEST_SHARDS:-8388608,9437184}" \
    >"$out/longest.log" 2>&1
  rc=$?
  grep -E '^\| longest' "$out/longest.log" || tail -8 "$out/longest.log"
  order+=(longest)
  grep -q '^| longest.*ran, finite' "$out/longest.log" && result[longest]=PASS \
    || result[longest]="FAIL (exit $rc)"
  detail[longest]="$out/longest.log"
fi

echo
echo "================ gpu-ring-engine-check results ================"
[ -f "$out/bench.log" ] && grep -E '^\|' "$out/bench.log"
[ -f "$out/longest.log" ] && grep -E '^\| longest' "$out/longest.log"
echo
echo "| step | result | detail |"
echo "|---|---|---|"
for k in "${order[@]}"; do echo "| $k | ${result[$k]} | ${detail[$k]} |"; done
for k in "${order[@]}"; do
  [[ "${result[$k]}" == PASS ]] || exit 1
done
exit 0
