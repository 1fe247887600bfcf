#!/usr/bin/env bash
# GPU check of JobService.Attend (docs/ATTEND.md): a coordinator and one dattn-worker-gpu per GPU on
# this host, Attend calls on random tensors in bf16 and fp16 at 1, 2 and 4 ranks, forward and
# backward, grouped causal and mixture, each compared with the CPU backend in fp64 on the same
# inputs (tests/attend_check.cc; docs/ENGINE.md's tolerances). Builds nothing on the GPU machine.
#
#   scripts/gpu-attend-check.sh stage   (here) build the coordinator, the GPU worker and
#                                       attend_check, pack them with the shared libraries the GPU
#                                       machine lacks into .device/attend.tar.xz (git-ignored)
#   scripts/gpu-attend-check.sh [run]   (on the GPU machine, from the repo root, .device carried)
#   scripts/gpu-attend-check.sh smoke   (here) the same flow with CPU workers, fp32, small N
#
# Environment: OUT (logs; a temporary folder otherwise), SEQ_LEN (default 16384), RANKS (default
# "1,2,4", capped by the GPUs present), DTYPES (default "bf16,fp16"); BENCH=1 then runs
# bench/attend_bench (BENCH_N, LONGEST, STREAM_ROUNDS, SHARED_RANKS, LONGEST_SHARED: see below).
# Exit status: 0 when every row passed, 1 when one failed, 2 when the set-up failed.
set -uo pipefail
cd "$(dirname "$0")/.."

mode="${1:-run}"
pack=.device/attend.tar.xz
if [ "$mode" = "stage" ]; then
  set -e
  bazel build //server:dattn-coordinator //worker:dattn-worker-gpu //tests:attend_check \
    //bench/attend_bench:attend_bench
  bin=$(mktemp -d)/attend
  mkdir -p "$bin/lib"
  for b in server/dattn-coordinator worker/dattn-worker-gpu tests/attend_check \
      bench/attend_bench/attend_bench; do
    strip --strip-debug -o "$bin/$(basename "$b")" "bazel-bin/$b"
  done
  for b in "$bin"/dattn-coordinator "$bin"/dattn-worker-gpu "$bin"/attend_check \
      "$bin"/attend_bench; do
    ldd "$b" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
      case "$name" in
        libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
        libnccl.so*|libcudnn*|libcublas*|libcuda.so*|libnvrtc*) ;;
        *) cp -fL "$path" "$bin/lib/" ;;
      esac
    done
  done
  chmod -R u+w "$bin"
  mkdir -p .device
  tar -C "$(dirname "$bin")" -cJf "$pack" attend
  rm -rf "$(dirname "$bin")"
  ls -la "$pack"
  exit 0
fi

if [ "$mode" = "smoke" ]; then
  coordinator=bazel-bin/server/dattn-coordinator
  worker=bazel-bin/worker/dattn-worker
  check=bazel-bin/tests/attend_check
  device=cpu
  gpus="${WORKERS:-4}"
  dtypes="${DTYPES:-fp32}"
  seq_len="${SEQ_LEN:-1024}"
else
  if [ ! -f "$pack" ]; then
    echo "missing $pack: run 'scripts/gpu-attend-check.sh stage' on the build machine first"
    exit 2
  fi
  bin="${OUT:-/tmp}/dattn-attend-bin"
  rm -rf "$bin" && mkdir -p "$bin" && tar -C "$bin" -xJf "$pack" || exit 2
  bin="$bin/attend"
  coordinator="$bin/dattn-coordinator"
  worker="$bin/dattn-worker-gpu"
  check="$bin/attend_check"
  device=gpu
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  dtypes="${DTYPES:-bf16,fp16}"
  seq_len="${SEQ_LEN:-16384}"
  . scripts/gpu-libs.sh
  libs=$(wheel_lib_path cudnn cuda_nvrtc cu13 cublas)
  libs="$libs:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH="${libs#:}"
  export NCCL_NVLS_ENABLE=0  # Never NVLink multicast on these machines.
fi
for b in "$coordinator" "$worker" "$check"; do
  [ -x "$b" ] || { echo "missing $b"; exit 2; }
done
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
ranks="${RANKS:-1,2,4}"
# Ring sizes beyond the GPUs present are left out.
ranks=$(echo "$ranks" | tr ',' '\n' | awk -v g="$gpus" '$1 <= g' | paste -sd, -)
{
  echo "== environment =="
  date -u
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>&1 | head -9
  echo "workers: $gpus ($device), ranks: $ranks, dtypes: $dtypes, N: $seq_len"
} | tee "$out/env.log"

pids=()
# shellcheck disable=SC2317  # Called by the trap.
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 2
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# Plaintext (--insecure): one machine, loopback only, a throwaway cluster.
"$coordinator" --insecure --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  --data-dir "$out/data" --ring-formation-timeout-ms 120000 --heartbeat-ms 1000 \
  --attend-shared-memory \
  2>"$out/coordinator.log" &
pids+=($!)
addr=""
for _ in $(seq 1 300); do
  addr=$(sed -n 's/^dattn-coordinator listening on \([0-9.:]*\), metrics on .*/\1/p' "$out/coordinator.log")
  [ -n "$addr" ] && break
  sleep 0.1
done
[ -n "$addr" ] || { echo "the coordinator did not start:"; cat "$out/coordinator.log"; exit 2; }
for ((i = 0; i < gpus; i++)); do
  if [ "$mode" = "smoke" ]; then where=(--threads 1); else where=(--gpu --gpu-index "$i"); fi
  "$worker" --insecure "${where[@]}" --name "$device-$i" --coordinator "$addr" \
    --health-port 0 --slots 1 2>"$out/worker-$i.log" &
  pids+=($!)
done
# Workers register within seconds; attend_check's calls with num_ranks P wait in the queue until
# P workers are ready, so a short wait for the registrations is all that is needed.
sleep 5
"$check" --coordinator "$addr" --device "$device" --dtypes "$dtypes" --ranks "$ranks" \
  --seq-len "$seq_len" 2>&1 | tee "$out/attend.txt"
status=${PIPESTATUS[0]}
# BENCH=1 (GPU only): Attend over loopback against the same call in-process (bench/attend_bench),
# at N = BENCH_N (default 2^20): streamed (STREAM_ROUNDS timed calls) and through shared memory
# at each ring size of SHARED_RANKS (e.g. 1,4); one streamed Attend of LONGEST tokens and one
# shared-memory Attend of LONGEST_SHARED tokens when set.
if [ "$status" -eq 0 ] && [ "${BENCH:-0}" = 1 ] && [ "$mode" != "smoke" ]; then
  "$bin/attend_bench" --coordinator "$addr" --seq-len "${BENCH_N:-1048576}" \
    --longest "${LONGEST:-0}" --stream-rounds "${STREAM_ROUNDS:-1}" \
    --shared-ranks "${SHARED_RANKS:-1}" --longest-shared "${LONGEST_SHARED:-0}" \
    2>&1 | tee "$out/bench.txt"
  status=${PIPESTATUS[0]}
fi
if [ "$status" -ne 0 ]; then
  echo "== logs =="; tail -n 15 "$out/coordinator.log" "$out"/worker-*.log
fi
exit "$status"
