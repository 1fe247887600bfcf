#!/usr/bin/env bash
# GPU check of the CUDA engine (issue 4), of the GPU worker's device (inputs generated on the GPU)
# and of the ring's CUDA block kernels on one GPU (P ranks simulated in one process; the ring over
# NCCL needs several GPUs: scripts/gpu-ring-engine-check.sh). Builds nothing on the GPU machine.
#
#   scripts/gpu-check.sh stage        (here, no GPU needed) build the GPU test and benchmark binaries
#                                     with Bazel and copy them into .device/ (git-ignored)
#   scripts/gpu-check.sh [run] [steps] (on the GPU machine, from the repo root, with the binaries
#                                     in .device/ and .device/lib.tar.xz carried) run the copied
#                                     binaries and print a pass/fail table last.
#
# steps: comma-separated subset of test,bench,ref,longest (default: test,bench,ref,longest).
# Environment: GTEST_FILTER (test step), BENCH_SUITE=issue|quick|grouped-fwd|fwd-bwd, BENCH_ARGS (more
# flags for the benchmark, e.g. --longest), STEP_TIMEOUT seconds per step
# (TEST_TIMEOUT, BENCH_TIMEOUT, REF_TIMEOUT, LONGEST_TIMEOUT override it per step),
# OUT (a folder for logs; a temporary one otherwise). cuDNN: PyTorch's bundled cuDNN 9.19 if present
# (the headers we build against are 9.19), else the system's.
set -uo pipefail
cd "$(dirname "$0")/.."

mode="${1:-run}"
if [ "$mode" = "stage" ]; then
  set -e
  bazel build //engine/cuda:cuda_backend_test //engine/cuda:cuda_vs_cpu_test \
    //worker:cuda_device_test //engine/ring:cuda_block_kernels_test \
    //bench/cuda_bench:cuda_attention_bench
  mkdir -p .device/lib
  cp -fL bazel-bin/engine/cuda/cuda_backend_test bazel-bin/engine/cuda/cuda_vs_cpu_test \
    bazel-bin/worker/cuda_device_test bazel-bin/engine/ring/cuda_block_kernels_test \
    bazel-bin/bench/cuda_bench/cuda_attention_bench .device/
  # The CPU reference backend's OpenBLAS (and its Fortran runtime), which the GPU image lacks,
  # compressed (39 MB -> 5 MB of the 64 MiB a device call carries); the run step unpacks them.
  for lib in libopenblas.so.0 libgfortran.so.5 libquadmath.so.0; do
    cp -fL "/usr/lib/x86_64-linux-gnu/$lib" .device/lib/
  done
  tar -cJf .device/lib.tar.xz -C .device lib
  rm -rf .device/lib
  chmod -R u+w .device
  ls -la .device
  exit 0
fi
[ "$mode" = "run" ] && shift || true
steps="${1:-test,bench,ref,longest}"
out="${OUT:-$(mktemp -d)}"
step_timeout="${STEP_TIMEOUT:-540}"
mkdir -p "$out"

have() { [[ ",$steps," == *",$1,"* ]]; }

# Libraries: cuDNN (and NVRTC, which cuDNN's runtime-compiled engines load) from PyTorch's wheels
# when they exist, then the system's CUDA.
if [ -f .device/lib.tar.xz ] && [ ! -d .device/lib ]; then tar -xJf .device/lib.tar.xz -C .device; fi
. scripts/gpu-libs.sh
libs=$(wheel_lib_path cudnn cuda_nvrtc cu13 cublas)
export LD_LIBRARY_PATH="${libs#:}:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}:$PWD/.device/lib"
export CUDNN_LOGLEVEL_DBG="${CUDNN_LOGLEVEL_DBG:-1}"
export CUDNN_LOGDEST_DBG="${CUDNN_LOGDEST_DBG:-$out/cudnn_errors.log}"

{
  echo "== environment =="
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | head -3
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ldd .device/cuda_backend_test 2>&1 | grep -E "cudnn|not found" || true
} | tee "$out/env.log"

declare -A result
test_summary="not run"
if have test; then
  # Shards in parallel processes: building cuDNN plans and the float64 oracle are CPU work.
  shards="${TEST_SHARDS:-8}"
  echo "== test: cuda_backend_test ($shards shards) ==" | tee -a "$out/env.log"
  start=$(date +%s)
  pids=()
  for ((i = 0; i < shards; i++)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout "${TEST_TIMEOUT:-$step_timeout}" \
      .device/cuda_backend_test --gtest_filter="${GTEST_FILTER:-*}" >"$out/test.$i.tmp" 2>&1 &
    pids+=($!)
  done
  # The larger shapes against the CPU backend in fp64 (uses the CPU's cores: one process).
  timeout "${TEST_TIMEOUT:-$step_timeout}" .device/cuda_vs_cpu_test \
    --gtest_filter="${GTEST_FILTER:-*}" >"$out/test.cpu.tmp" 2>&1 &
  pids+=($!)
  # The GPU worker's device (inputs generated on the GPU against the host generator), and the
  # ring's CUDA block kernels (P ranks simulated on this one GPU, against the float64 oracle).
  for extra in cuda_device_test cuda_block_kernels_test; do
    [ -x ".device/$extra" ] || continue
    timeout "${TEST_TIMEOUT:-$step_timeout}" ".device/$extra" \
      --gtest_filter="${GTEST_FILTER:-*}" >"$out/test.$extra.tmp" 2>&1 &
    pids+=($!)
  done
  rc=0
  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
  end=$(date +%s)
  for f in "$out"/test.*.tmp; do cat "$f"; rm -f "$f"; done >"$out/test.log"
  passed=$(grep -c '^\[       OK \]' "$out/test.log" || true)
  failed=$(grep -c '^\[  FAILED  \] .*(' "$out/test.log" || true)
  skipped=$(grep -c '^\[  SKIPPED \] .*(' "$out/test.log" || true)
  grep -E '^\[ (head dim|planner ) \]' "$out/test.log" || true
  grep -B2 -A12 '^\[  FAILED  \] .*(' "$out/test.log" | grep -vE '^\[ RUN' | head -80 || true
  test_summary="$passed passed, $failed failed, $skipped skipped in $((end - start)) s (exit $rc)"
  if [ "$rc" -eq 0 ] && [ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]; then
    result[test]=PASS
  else
    result[test]=FAIL
  fi
fi

if have bench; then
  echo "== bench: cuda_attention_bench --suite=${BENCH_SUITE:-issue} =="
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
  timeout "${BENCH_TIMEOUT:-$step_timeout}" .device/cuda_attention_bench --suite="${BENCH_SUITE:-issue}" \
    ${BENCH_ARGS:-} --csv="$out/bench.csv" >"$out/bench.log" 2>&1
  rc=$?
  grep -vE '^\|' "$out/bench.log" | tail -30
  [ "$rc" -eq 0 ] && result[bench]=PASS || result[bench]="FAIL (exit $rc)"
fi

if have ref; then
  echo "== ref: bench/cuda_reference.py =="
  quick=""
  [ "${BENCH_SUITE:-issue}" = "quick" ] && quick="--quick"
  PYTHONUNBUFFERED=1 timeout "${REF_TIMEOUT:-$step_timeout}" python3 bench/cuda_reference.py $quick \
    >"$out/reference.log" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] && result[ref]=PASS || result[ref]="FAIL (exit $rc)"
fi

if have longest; then
  echo "== longest: forward at N = 2^23 and 9 * 2^20 =="
  timeout "${LONGEST_TIMEOUT:-$step_timeout}" .device/cuda_attention_bench --suite=none --longest \
    >"$out/longest.log" 2>&1
  rc=$?
  grep -E '^longest' "$out/longest.log" || tail -5 "$out/longest.log"
  grep -q '^longest grouped fwd N=8388608.* ran ' "$out/longest.log" && result[longest]=PASS \
    || result[longest]="FAIL (exit $rc)"
fi

echo
echo "================ gpu-check results ================"
[ -f "$out/bench.log" ] && grep -E '^(==|\|)' "$out/bench.log"
[ -f "$out/reference.log" ] && grep -E '^(==|\||torch )' "$out/reference.log"
[ -f "$out/longest.log" ] && grep -E '^\| longest' "$out/longest.log"
echo
echo "| step | result | detail |"
echo "|---|---|---|"
have test && echo "| test | ${result[test]} | $test_summary |"
have bench && echo "| bench | ${result[bench]} | $out/bench.log |"
have ref && echo "| ref | ${result[ref]} | $out/reference.log |"
have longest && echo "| longest | ${result[longest]} | $out/longest.log |"
for k in "${!result[@]}"; do
  [[ "${result[$k]}" == PASS ]] || exit 1
done
exit 0
