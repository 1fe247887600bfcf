#!/usr/bin/env bash
# The main job: a coordinator and two CPU workers on loopback with a data directory, a real attention
# job submitted through the dattn CLI and watched to completion, its result, Attend on .npy files, a
# small language model trained on docs/ as a training job, deployed and generating text, and where
# the metrics are.
# Secure as a real cluster (docs/SECURITY.md): a CA and certificates from scripts/make-certs.sh (TLS,
# workers with certificates), and a client token from `dattn token new`.
#
#   scripts/demo.sh          run the demo, then shut everything down gracefully (SIGTERM)
#   scripts/demo.sh --keep   leave the daemons running until Ctrl-C
#
# The binaries are built and put on your PATH first by scripts/install.sh (into ~/.local/bin, or
# DATTN_PREFIX/bin; the GPU worker is left out), so `dattn` works in your shell afterwards.
#
# Environment: DATTN_DEMO_DIR (data + logs; default ./dattn-demo), DATTN_DEMO_PORT (gRPC, default
# 7070; metrics on the next port), DATTN_PREFIX (install prefix; default ~/.local).
set -euo pipefail
cd "$(dirname "$0")/.."

keep=0
for arg in "$@"; do
  case "$arg" in
    --keep) keep=1 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "demo.sh: unknown argument '$arg' (expected --keep)" >&2; exit 2 ;;
  esac
done

scripts/setup.sh
prefix=${DATTN_PREFIX:-$HOME/.local}
echo "== building dattn and putting it on your PATH (scripts/install.sh --no-gpu --prefix $prefix)"
scripts/install.sh --no-gpu --prefix "$prefix"
export PATH="$prefix/bin:$PATH"

dir=${DATTN_DEMO_DIR:-$PWD/dattn-demo}
port=${DATTN_DEMO_PORT:-7070}
metrics_port=$((port + 1))
mkdir -p "$dir"
export DATTN_COORDINATOR=127.0.0.1:$port

pids=()
stop_all() {
  # Workers first, and wait for them (they deliver their tasks' final reports), then the coordinator
  # (it flushes its store). pids[0] is the coordinator.
  for ((i = 1; i < ${#pids[@]}; i++)); do kill -TERM "${pids[$i]}" 2>/dev/null || true; done
  for ((i = 1; i < ${#pids[@]}; i++)); do wait "${pids[$i]}" 2>/dev/null || true; done
  if [ ${#pids[@]} -gt 0 ]; then
    kill -TERM "${pids[0]}" 2>/dev/null || true
    wait "${pids[0]}" 2>/dev/null || true
  fi
}
trap stop_all EXIT
trap 'exit 130' INT TERM

echo "== a cluster CA and certificates ($dir/certs, scripts/make-certs.sh) and an admin token"
scripts/make-certs.sh "$dir/certs" --hosts localhost,127.0.0.1 --worker cpu-0 --worker cpu-1 >/dev/null
if [ ! -f "$dir/token" ]; then
  (umask 077; dattn token new --tenant demo --role admin --name demo-admin > "$dir/token-new.txt")
  sed -n 2p "$dir/token-new.txt" > "$dir/token"
  sed -n 5p "$dir/token-new.txt" > "$dir/tokens"
  rm -f "$dir/token-new.txt"
fi
export DATTN_TLS_CA="$dir/certs/ca.pem"
DATTN_TOKEN=$(cat "$dir/token")
export DATTN_TOKEN

echo "== starting dattn-coordinator on 127.0.0.1:$port (store in $dir/data, log $dir/coordinator.log)"
dattn-coordinator --listen="127.0.0.1:$port" --metrics-listen="127.0.0.1:$metrics_port" \
  --data-dir="$dir/data" --tls-ca="$dir/certs/ca.pem" --tls-cert="$dir/certs/coordinator.pem" \
  --tls-key="$dir/certs/coordinator-key.pem" --token-file="$dir/tokens" 2>"$dir/coordinator.log" &
pids+=($!)
for _ in $(seq 100); do
  grep -q "listening on" "$dir/coordinator.log" && break
  kill -0 "${pids[0]}" 2>/dev/null || { cat "$dir/coordinator.log"; exit 1; }
  sleep 0.1
done

threads=$(( $(nproc) / 2 )); [ "$threads" -ge 1 ] || threads=1
for i in 0 1; do
  echo "== starting dattn-worker cpu-$i ($threads engine threads, log $dir/worker-$i.log)"
  dattn-worker --coordinator="$DATTN_COORDINATOR" --name="cpu-$i" --threads="$threads" \
    --tls-ca="$dir/certs/ca.pem" --tls-cert="$dir/certs/cpu-$i.pem" \
    --tls-key="$dir/certs/cpu-$i-key.pem" 2>"$dir/worker-$i.log" &
  pids+=($!)
done
for _ in $(seq 100); do
  [ "$(dattn workers --json 2>/dev/null | grep -c WORKER_STATE_READY)" -ge 2 ] && break
  sleep 0.1
done
dattn workers

echo
echo "== submitting a grouped-mode dilated attention job (forward + backward, fp32) and watching it"
set -x
dattn submit --name=demo --seq-len=16384 --heads=8 --head-dim=64 \
  --segments=1024,2048,4096 --rates=1,2,4 --dtype=fp32 --pass=fwd-bwd --iterations=4 --seed=42 \
  --watch
{ set +x; } 2>/dev/null
echo
echo "== all jobs"
dattn list
echo
echo "== the shipped example job file, as it is (dattn submit -f client/examples/attention-job.yaml)"
dattn submit -f client/examples/attention-job.yaml --wait | sed -n '1,8p'
echo
echo "== attention on your own tensors: q, k, v as .npy files streamed to a ring of 2 ranks (dattn attend)"
/usr/bin/python3 - "$dir" <<'PY'
import sys
import numpy as np
rng = np.random.default_rng(0)
for name in ("q", "k", "v"):
    np.save(f"{sys.argv[1]}/{name}.npy", rng.standard_normal((1, 8192, 8, 64)).astype(np.float32))
PY
dattn attend "$dir/q.npy" "$dir/k.npy" "$dir/v.npy" --segments 1024,2048 --rates 1,2 --causal \
  --ranks 2 -o "$dir/out.npy"
/usr/bin/python3 -c "import numpy as np; o = np.load('$dir/out.npy'); print('out.npy:', o.shape, o.dtype, 'finite:', bool(np.isfinite(o).all()))"
echo
echo "== a language model: a training job on this repository's docs (byte-level, CPU, checkpoints in"
echo "   $dir/checkpoints), then a deployment of its final checkpoint, text generated from it and a"
echo "   score (docs/TRAINING_JOBS.md, docs/SERVING.md)"
cat > "$dir/lm.json" <<JSON
{"model": {"vocab_size": 256, "d_model": 64, "num_layers": 2, "num_heads": 4, "ffn_dim": 256,
           "attention": {"segment_lengths": [32, 64, 128], "dilation_rates": [1, 2, 4]}},
 "data": {"paths": ["$PWD/docs"], "format": "text", "validation_fraction": 0.02},
 "seq_len": 128, "batch_size": 8, "steps": 200, "seed": 1,
 "optimizer": {"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 10},
 "eval": {"every": 100, "batches": 2}, "retrieval": {"examples": 0},
 "checkpoint": {"every": 200, "keep_last": 1}, "log_every": 50}
JSON
train=$(dattn --json submit --name=demo-lm --train-config "$dir/lm.json" \
  --checkpoint-dir "$dir/checkpoints" --device=cpu |
  /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["job"]["job_id"])')
dattn watch "$train"
set -x
dattn deploy --from-job "$train" --max-context 1024 --wait 120 | tee "$dir/deploy.txt"
{ set +x; } 2>/dev/null
deployment=$(grep -o 'j-[0-9a-f]*' "$dir/deploy.txt" | head -1)
set -x
dattn generate "$deployment" --prompt "The coordinator " --max-tokens 160 --temperature 0.7 --seed 3
dattn score "$deployment" --text "dilated attention on a ring of workers" | head -1
dattn models
dattn cancel "$deployment"
{ set +x; } 2>/dev/null
echo
echo "== metrics: http://127.0.0.1:$metrics_port/metrics (Prometheus text; /healthz answers liveness); a few of them:"
curl -sf "http://127.0.0.1:$metrics_port/metrics" |
  grep -E '^dattn_(jobs|attention_tokens_total|attention_flops_total|workers|generated_tokens_total)\b' | head -14 || true

if [ "$keep" = 1 ]; then
  echo
  echo "== running; try: DATTN_COORDINATOR=$DATTN_COORDINATOR DATTN_TLS_CA=$DATTN_TLS_CA DATTN_TOKEN=\$(cat $dir/token) dattn list   (Ctrl-C stops)"
  wait
fi
