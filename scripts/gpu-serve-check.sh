#!/usr/bin/env bash
# GPU deployments through the service (issue 18): a coordinator, RANKS dattn-worker-gpu (one per
# GPU) and one CPU dattn-worker, and the same checkpoint deployed on each kind (`dattn deploy
# --device gpu --ranks RANKS`, on a ring of RANKS GPUs over NCCL when RANKS > 1, and `--device
# cpu`); then on both Score of the same text (the losses and every token's log-probability
# compared: bf16 against fp32), greedy Generate of the same prompt (the tokens compared), and on
# the GPU deployment S concurrent Generate calls (their tokens/s). Builds nothing on the GPU
# machine.
#
#   scripts/gpu-serve-check.sh stage CHECKPOINT  (here) build the coordinator, both workers and the
#                                    CLI and pack them, the shared libraries the GPU machine lacks
#                                    and the checkpoint step folder into .device/serve.tar.xz
#   scripts/gpu-serve-check.sh [run]             (on the GPU machine, from the repo root, with
#                                    .device carried) run it, a table last
#   scripts/gpu-serve-check.sh smoke CHECKPOINT  (here) the same flow with two CPU workers: checks
#                                    the script
#
# Environment: OUT (a folder for logs), RANKS (GPU workers and the GPU deployment's ring, default
# 1; smoke: CPU workers standing in), STREAMS (concurrent Generate calls, default 8), TOKENS
# (tokens each generates, default 128), TOLERANCE (largest |log-probability difference| of a token
# between the deployments, default 0.1: bf16 against fp32).
# Exit status: 0 when both deployments served and agreed; 1 when they did not; 2 set-up failures.
set -uo pipefail
cd "$(dirname "$0")/.."

mode="${1:-run}"
pack=.device/serve.tar.xz
if [ "$mode" = "stage" ]; then
  set -e
  checkpoint="${2:?usage: scripts/gpu-serve-check.sh stage CHECKPOINT_STEP_FOLDER}"
  bazel build //server:dattn-coordinator //worker:dattn-worker-gpu //worker:dattn-worker \
    //client:dattn
  bin=$(mktemp -d)/serve
  mkdir -p "$bin/lib"
  for b in server/dattn-coordinator worker/dattn-worker-gpu worker/dattn-worker client/dattn; do
    strip --strip-debug -o "$bin/$(basename "$b")" "bazel-bin/$b"
  done
  cp -r "$checkpoint" "$bin/model"
  for b in "$bin"/dattn-coordinator "$bin"/dattn-worker-gpu "$bin"/dattn-worker "$bin"/dattn; do
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
  tar -C "$(dirname "$bin")" -cJf "$pack" serve
  rm -rf "$(dirname "$bin")"
  ls -la "$pack"
  exit 0
fi

out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
out=$(cd "$out" && pwd)
if [ "$mode" = "smoke" ]; then
  coordinator=bazel-bin/server/dattn-coordinator
  gpu_worker=bazel-bin/worker/dattn-worker
  cpu_worker=bazel-bin/worker/dattn-worker
  cli=bazel-bin/client/dattn
  model="${2:?usage: scripts/gpu-serve-check.sh smoke CHECKPOINT_STEP_FOLDER}"
  model=$(cd "$model" && pwd)
  gpu_flags=(--threads 1)
  gpu_index=()
  first_device=cpu
elif [ "$mode" = "run" ]; then
  [ -f "$pack" ] || { echo "missing $pack: run 'scripts/gpu-serve-check.sh stage' first"; exit 2; }
  rm -rf "${out:?}/bin" && mkdir -p "$out/bin" && tar -C "$out/bin" -xJf "$pack" || exit 2
  bin="$out/bin/serve"
  coordinator="$bin/dattn-coordinator"
  gpu_worker="$bin/dattn-worker-gpu"
  cpu_worker="$bin/dattn-worker"
  cli="$bin/dattn"
  model="$bin/model"
  gpu_flags=(--gpu)
  gpu_index=(--gpu-index)
  first_device=gpu
else
  echo "usage: scripts/gpu-serve-check.sh stage|run|smoke" >&2
  exit 2
fi
ranks="${RANKS:-1}"
streams="${STREAMS:-8}"
tokens="${TOKENS:-128}"
tolerance="${TOLERANCE:-0.1}"

. scripts/gpu-libs.sh
libs=$(wheel_lib_path cudnn nccl cuda_nvrtc cu13 cublas)
libs="$libs:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu${bin:+:$bin/lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH="${libs#:}"
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on these machines
{
  echo "== environment =="
  date -u
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>&1 | head -3
  echo "model: $model"
} | tee "$out/env.log"

pids=()
# shellcheck disable=SC2317  # Called by the trap.
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 2
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# Plaintext (--insecure): one machine, loopback only, a throwaway cluster for measurements.
"$coordinator" --insecure --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  --data-dir "$out/data" --heartbeat-ms 500 --dead-after-ms 3000 2>"$out/coordinator.log" &
pids+=($!)
addr=""
for _ in $(seq 1 300); do
  addr=$(sed -n 's/^dattn-coordinator listening on \([0-9.:]*\), metrics on .*/\1/p' "$out/coordinator.log")
  [ -n "$addr" ] && break
  sleep 0.1
done
[ -n "$addr" ] || { echo "the coordinator did not start:"; cat "$out/coordinator.log"; exit 2; }
export DATTN_COORDINATOR="$addr"
for ((r = 0; r < ranks; r++)); do
  index=()
  [ ${#gpu_index[@]} -gt 0 ] && index=("${gpu_index[@]}" "$r")
  "$gpu_worker" --insecure "${gpu_flags[@]}" "${index[@]}" --name "$first_device-$r" \
    --coordinator "$addr" --health-port 0 --slots 1 2>"$out/worker-$first_device-$r.log" &
  pids+=($!)
done
"$cpu_worker" --insecure --threads 8 --name cpu-x --coordinator "$addr" --health-port 0 \
  --slots 1 2>"$out/worker-cpu.log" &
pids+=($!)
for _ in $(seq 1 600); do
  ready=$("$cli" --json workers 2>/dev/null |
          python3 -c 'import json,sys; print(sum(w["state"]=="WORKER_STATE_READY" for w in json.load(sys.stdin).get("workers",[])))' 2>/dev/null || echo 0)
  [ "$ready" -ge $((ranks + 1)) ] && break
  sleep 0.2
done
"$cli" workers | tee "$out/workers.txt"

deploy() {  # DEVICE RANKS -> job id
  "$cli" deploy --checkpoint "$model" --max-context 4096 --max-batch 16 --device "$1" \
    --ranks "$2" --name "on-$1" --wait 120 >"$out/deploy-$1.txt" 2>&1 ||
    { cat "$out/deploy-$1.txt" >&2; return 1; }
  sed -n 's/.*\(j-[0-9a-f]\{16\}\).*/\1/p' "$out/deploy-$1.txt" | head -1
}
gpu_job=$(deploy "$first_device" "$ranks") || exit 2
cpu_job=$(deploy cpu 1) || exit 2
"$cli" status "$gpu_job" | tee "$out/status-gpu.txt"
"$cli" models | tee "$out/models.txt"

# The text: Genesis 1 (the training corpus's first lines) and a line that is not in it.
text="In the beginning God created the heaven and the earth. And the earth was without form, and void; and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God said, Let there be light: and there was light. The quick brown fox jumps over the lazy dog."
"$cli" --json score "$gpu_job" --text "$text" >"$out/score-gpu.json" || exit 1
"$cli" --json score "$cpu_job" --text "$text" >"$out/score-cpu.json" || exit 1
prompt="And God said, Let"
"$cli" generate "$gpu_job" --prompt "$prompt" --max-tokens "$tokens" --print-tokens \
  >"$out/gen-gpu.txt" 2>"$out/gen-gpu.err" || exit 1
"$cli" generate "$cpu_job" --prompt "$prompt" --max-tokens "$tokens" --print-tokens \
  >"$out/gen-cpu.txt" 2>"$out/gen-cpu.err" || exit 1
"$cli" generate "$gpu_job" --prompt "$prompt" --max-tokens "$tokens" >"$out/gen-gpu-text.txt" \
  2>/dev/null || true

# S concurrent streams on the GPU deployment (sampled, each its own seed).
start=$(date +%s.%N)
spids=()
for ((i = 0; i < streams; i++)); do
  "$cli" generate "$gpu_job" --prompt "$prompt" --max-tokens "$tokens" --temperature 0.8 \
    --seed "$i" --print-tokens >"$out/stream-$i.txt" 2>"$out/stream-$i.err" &
  spids+=($!)
done
failed=0
for p in "${spids[@]}"; do wait "$p" || failed=$((failed + 1)); done
end=$(date +%s.%N)

python3 - "$out" "$streams" "$tokens" "$start" "$end" "$failed" "$tolerance" "$first_device" "$ranks" <<'EOF'
import json, sys
out, streams, tokens, start, end, failed, tol, dev, ranks = sys.argv[1:]
dev = dev if ranks == "1" else f"{dev} x {ranks} ring"
streams, tokens, failed, tol = int(streams), int(tokens), int(failed), float(tol)
g = json.load(open(f"{out}/score-gpu.json"))
c = json.load(open(f"{out}/score-cpu.json"))
lg = [float(x) for x in g.get("logprobs", [])]
lc = [float(x) for x in c.get("logprobs", [])]
worst = max(abs(a - b) for a, b in zip(lg, lc)) if lg and len(lg) == len(lc) else float("inf")
loss_g, loss_c = float(g.get("loss", "nan")), float(c.get("loss", "nan"))
tg = [l.strip() for l in open(f"{out}/gen-gpu.txt") if l.strip()]
tc = [l.strip() for l in open(f"{out}/gen-cpu.txt") if l.strip()]
same = 0
for a, b in zip(tg, tc):
    if a != b:
        break
    same += 1
made = sum(sum(1 for l in open(f"{out}/stream-{i}.txt") if l.strip()) for i in range(streams))
secs = float(end) - float(start)
ok = worst <= tol and len(tg) == tokens and len(tc) == tokens and failed == 0
print()
print("================ gpu-serve-check results ================")
print(f"| check | {dev} deployment ({'bf16' if dev.startswith('gpu') else 'fp32'}) | cpu deployment (fp32) | difference |")
print("|---|---|---|---|")
print(f"| Score loss, {len(lg)} tokens (nats/token) | {loss_g:.5f} | {loss_c:.5f} | {abs(loss_g - loss_c):.2e} |")
print(f"| largest token log-probability difference | | | {worst:.4f} (tolerance {tol}) |")
print(f"| greedy Generate, {tokens} tokens: same as fp32 | {same} first tokens | | first difference at {same if same < min(len(tg), len(tc)) else 'none'} |")
print(f"| {streams} concurrent sampled streams x {tokens} tokens | {made} tokens in {secs:.2f} s: {made / secs:.0f} tokens/s, {failed} failed | | |")
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
EOF
rc=$?
grep -h "first token" "$out"/gen-*.err | head -2
echo "generated (GPU, greedy): $(head -c 300 "$out/gen-gpu-text.txt")"
exit $rc
