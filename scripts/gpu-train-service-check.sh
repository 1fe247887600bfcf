#!/usr/bin/env bash
# Training jobs through the service on the GPUs of one host (issue 16): a coordinator and one
# dattn-worker-gpu per GPU, the LongNet base model (about 86M parameters, docs/MODEL.md) trained on
# the King James Bible through the CLI on 1 GPU and as 4 x 1, 2 x 2 and 1 x 4 (data x sequence
# parallel) gangs with the same global batch; the losses compared with the 1-GPU run step by step,
# tokens/s and MFU against 4 x the 1-GPU job's, checkpoint write times, and the time from a killed
# rank's worker to the training resumed on a restarted one. Builds nothing on the GPU machine.
#
#   scripts/gpu-train-service-check.sh stage   (here, no GPU needed) build the coordinator, the GPU
#                                              worker and the CLI and pack them with the shared
#                                              libraries the GPU machine lacks and the corpus into
#                                              .device/train-service.tar.xz (git-ignored)
#   scripts/gpu-train-service-check.sh [run]   (on the GPU machine, from the repo root, with .device
#                                              carried) start everything, run the jobs, print a
#                                              table last
#   scripts/gpu-train-service-check.sh smoke   (here) the same flow with CPU workers (dattn-worker
#                                              from bazel-bin) and a tiny model: checks the script
#
# Environment: OUT (a folder for logs and job JSON; a temporary one otherwise), SEQ_LEN (default
# 32768), ONE_SEQ_LEN (the 1-GPU job's, default SEQ_LEN: set SEQ_LEN / S for weak scaling of
# sequence parallelism; the losses are then not compared), BATCH (the global batch of the D x S
# jobs, default 4 like the 1-GPU job's; 4 D gives every data-parallel rank the 1-GPU job's 4 rows
# per step: weak scaling, losses not compared; one row per micro-batch), VALIDATION_FRACTION
# (default 0.05; at least one window of SEQ_LEN + 1 per data-parallel rank), CORPUS (run mode: a
# text file or folder instead of the Bible, for sequences longer than its 4.3M bytes allow),
# CHECKPOINT_ACTIVATIONS (default false; true for long sequences), STEPS (default 100), SHAPES (D x
# S each; D may be "auto", data_parallel: auto, the coordinator's pick; default "4x1 2x2 1x4" on 4
# or more GPUs, "2x1 1x2" on 2), KILL (default 1: the recovery run, 2 x 2 or 1 x 2), JOB_TIMEOUT
# seconds per job (default 900), LOSS_TOLERANCE (default 0.03: the largest relative difference of a
# step's loss from the 1-GPU run's, bf16 compute), PACK (the archive stage writes and run reads,
# default .device/train-service.tar.xz: two builds can be staged and run in one call to compare).
#
# Exit status: 0 when every job succeeded and followed the 1-GPU losses; 1 when a job failed or
# diverged; 2 when the set-up failed (binaries missing, too few GPUs, a daemon that does not start).
set -uo pipefail
cd "$(dirname "$0")/.."

mode="${1:-run}"
pack="${PACK:-.device/train-service.tar.xz}"
if [ "$mode" = "stage" ]; then
  set -e
  bazel build //server:dattn-coordinator //worker:dattn-worker-gpu //client:dattn //model:kjv_corpus
  bin=$(mktemp -d)/train-service
  mkdir -p "$bin/lib"
  for b in server/dattn-coordinator worker/dattn-worker-gpu client/dattn; do
    strip --strip-debug -o "$bin/$(basename "$b")" "bazel-bin/$b"
  done
  cp -fL bazel-bin/model/kjv.txt "$bin/kjv.txt"
  # Every shared library they load that an Ubuntu GPU image need not have (not glibc's, not the C++
  # runtime, not the CUDA libraries, which come from the GPU machine).
  for b in "$bin"/dattn-coordinator "$bin"/dattn-worker-gpu "$bin"/dattn; do
    ldd "$b" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
      case "$name" in
        libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
        libnccl.so*|libcudnn*|libcublas*|libcuda.so*|libnvrtc*) ;;
        *) cp -fL "$path" "$bin/lib/" ;;
      esac
    done
  done
  chmod -R u+w "$bin"
  du -sh "$bin"
  mkdir -p .device
  tar -C "$(dirname "$bin")" -cJf "$pack" train-service
  rm -rf "$(dirname "$bin")"
  ls -la "$pack"
  exit 0
fi

out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
out=$(cd "$out" && pwd)
if [ "$mode" = "smoke" ]; then
  coordinator=bazel-bin/server/dattn-coordinator
  worker=bazel-bin/worker/dattn-worker
  cli=bazel-bin/client/dattn
  corpus=$PWD/bazel-bin/model/kjv.txt
  device=cpu
  gpus="${WORKERS:-4}"
elif [ "$mode" = "run" ]; then
  if [ ! -f "$pack" ]; then
    echo "missing $pack: run 'scripts/gpu-train-service-check.sh stage' on the build machine first"
    exit 2
  fi
  bin="$out/bin"
  rm -rf "$bin" && mkdir -p "$bin" && tar -C "$bin" -xJf "$pack" || exit 2
  bin="$bin/train-service"
  coordinator="$bin/dattn-coordinator"
  worker="$bin/dattn-worker-gpu"
  cli="$bin/dattn"
  corpus="${CORPUS:-$bin/kjv.txt}"
  device=gpu
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
else
  echo "usage: scripts/gpu-train-service-check.sh stage|run|smoke" >&2
  exit 2
fi
for b in "$coordinator" "$worker" "$cli" "$corpus"; do
  [ -e "$b" ] || { echo "missing $b: run 'scripts/gpu-train-service-check.sh stage' first"; exit 2; }
done
job_timeout="${JOB_TIMEOUT:-900}"
seq_len="${SEQ_LEN:-32768}"
one_seq_len="${ONE_SEQ_LEN:-$seq_len}"
validation="${VALIDATION_FRACTION:-0.05}"
recompute="${CHECKPOINT_ACTIVATIONS:-false}"
steps="${STEPS:-100}"
batch="${BATCH:-4}"
tolerance="${LOSS_TOLERANCE:-0.03}"

. scripts/gpu-libs.sh
libs=$(wheel_lib_path cudnn nccl cuda_nvrtc cu13 cublas)
libs="$libs:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu${bin:+:$bin/lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH="${libs#:}"
export NCCL_NVLS_ENABLE=0  # Never NVLink multicast on these machines.
{
  echo "== environment =="
  date -u
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>&1 | head -9
  echo "workers: $gpus ($device)"
} | tee "$out/env.log"
if [ "$gpus" -lt 2 ]; then
  echo "need 2 or 4 GPUs (or WORKERS=2|4 in smoke mode), found $gpus"
  exit 2
fi
[ "$gpus" -ge 4 ] && gpus=4 || gpus=2
if [ "$gpus" = 4 ]; then
  shapes="${SHAPES:-4x1 2x2 1x4}"
  recover_shape=(2 2)
else
  shapes="${SHAPES:-2x1 1x2}"
  recover_shape=(1 2)
fi

pids=()
worker_pid=()
# shellcheck disable=SC2317  # Called by the trap.
cleanup() {
  for p in "${pids[@]}" "${worker_pid[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 2
  for p in "${pids[@]}" "${worker_pid[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# Plaintext (--insecure): one machine, loopback only, a throwaway cluster for measurements.
"$coordinator" --insecure --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  --data-dir "$out/data" --ring-formation-timeout-ms 120000 --heartbeat-ms 500 \
  --dead-after-ms 3000 2>"$out/coordinator.log" &
pids+=($!)
addr=""
for _ in $(seq 1 300); do
  addr=$(sed -n 's/^dattn-coordinator listening on \([0-9.:]*\), metrics on .*/\1/p' "$out/coordinator.log")
  [ -n "$addr" ] && break
  sleep 0.1
done
[ -n "$addr" ] || { echo "the coordinator did not start:"; cat "$out/coordinator.log"; exit 2; }
export DATTN_COORDINATOR="$addr"
echo "coordinator on $addr"

start_worker() {
  local i="$1"
  local where=(--gpu --gpu-index "$i")
  [ "$mode" = "smoke" ] && where=(--threads 1)
  "$worker" --insecure "${where[@]}" --name "$device-$i" --coordinator "$addr" \
    --health-port 0 --slots 1 2>>"$out/worker-$i.log" &
  worker_pid[$i]=$!
}
wait_ready() {
  local want="$1" ready=0
  for _ in $(seq 1 600); do
    ready=$("$cli" --json workers 2>/dev/null |
            python3 -c 'import json,sys; print(sum(w["state"]=="WORKER_STATE_READY" for w in json.load(sys.stdin).get("workers",[])))' 2>/dev/null || echo 0)
    [ "$ready" -ge "$want" ] && return 0
    sleep 0.2
  done
  echo "only $ready of $want workers became ready"; tail -n 20 "$out"/worker-*.log
  return 1
}
for ((i = 0; i < gpus; i++)); do start_worker "$i"; done
wait_ready "$gpus" || exit 2
"$cli" workers | tee "$out/workers.txt"

# The model and data: LongNet base (d 768, 12 layers, 12 heads, FFN 3072, bytes) on the Bible; in
# smoke mode a tiny model on CPUs. The global batch is 4 rows in every shape; micro-batches make
# every rank's micro-batch one row, so every shape does the same work per rank and step.
if [ "$mode" = "smoke" ]; then
  model='"vocab_size": 256, "d_model": 32, "num_layers": 2, "num_heads": 4, "ffn_dim": 64,
         "attention": {"segment_lengths": [64, 128, 256], "dilation_rates": [1, 2, 4]}'
  seq_len="${SEQ_LEN:-512}"
  steps="${STEPS:-30}"
else
  model='"vocab_size": 256, "d_model": 768, "num_layers": 12, "num_heads": 12, "ffn_dim": 3072,
         "attention": {"segment_lengths": [2048, 4096, 8192, 16384, 32768],
                       "dilation_rates": [1, 2, 4, 6, 12]}'
fi
every=$((steps / 2))
write_job() {  # NAME D S MICRO_BATCHES [STEPS [SEQ_LEN [BATCH]]]
  local name="$1" d="$2" s="$3" micro="$4" n="${5:-$steps}" len="${6:-$seq_len}" rows="${7:-4}"
  mkdir -p "$out/$name"
  cat >"$out/$name/trainer.json" <<EOF
{"model": {$model},
 "data": {"paths": ["$corpus"], "format": "text", "validation_fraction": $validation},
 "checkpoint_activations": $recompute,
 "seq_len": $len, "batch_size": $rows, "micro_batches": $micro, "steps": $n, "seed": 1,
 "optimizer": {"lr": 6e-4, "min_lr": 6e-5, "warmup_steps": 10},
 "eval": {"every": 0, "batches": 1},
 "checkpoint": {"every": $every, "keep_last": 2}}
EOF
  cat >"$out/$name/job.yaml" <<EOF
name: $name
training:
  config_file: trainer.json
  data_parallel: $d
  sequence_parallel: $s
  device: $device
  checkpoint_dir: $out/checkpoints
EOF
}
run_job() {  # NAME [extra CLI flags]: the final Job as JSON in $out/NAME.json
  local name="$1"; shift
  echo "== $name: dattn submit -f $out/$name/job.yaml --wait"
  timeout "$job_timeout" "$cli" --json submit -f "$out/$name/job.yaml" --wait "$@" \
    >"$out/$name.json" 2>"$out/$name.err" || echo "   exit status $?"
}

write_job one 1 1 4 "$steps" "$one_seq_len"
run_job one
for shape in $shapes; do
  d=${shape%x*}
  s=${shape#*x}
  if [ "$d" = auto ]; then
    # data_parallel: auto: the coordinator picks D; micro-batches of one row per rank if it takes
    # every GPU.
    write_job "dp$d-sp$s" "$d" "$s" $((batch * s / gpus)) "$steps" "$seq_len" "$batch"
  else
    write_job "dp$d-sp$s" "$d" "$s" $((batch / d)) "$steps" "$seq_len" "$batch"
  fi
  run_job "dp$d-sp$s"
done

# Recovery: kill -9 one rank's worker after the first checkpoint, start it again at once, and time
# the fault to the "resumed" event of the next attempt.
if [ "${KILL:-1}" = 1 ]; then
  write_job recover "${recover_shape[0]}" "${recover_shape[1]}" $((4 / recover_shape[0])) $((steps * 2))
  "$cli" --json submit -f "$out/recover/job.yaml" >"$out/recover.submit.json" 2>"$out/recover.err"
  job=$(python3 -c 'import json,sys; j = json.load(open(sys.argv[1])); print(j.get("job", j)["job_id"])' "$out/recover.submit.json" 2>/dev/null)
  killed_at=""
  [ -n "$job" ] || { echo "the recovery job was not accepted:"; cat "$out/recover.err"; }
  for _ in $(seq 1 $((job_timeout * 10))); do
    [ -n "$job" ] || break
    "$cli" --json status "$job" >"$out/recover.now.json" 2>/dev/null || true
    victim=$(python3 - "$out/recover.now.json" <<'EOF'
import json, sys
try:
    job = json.load(open(sys.argv[1]))
except Exception:
    sys.exit(0)
t = job.get("progress", {}).get("training", {})
if job.get("state") in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"):
    print("ended")
elif job.get("state") == "JOB_STATE_RUNNING" and t.get("checkpoints") and len(job.get("worker_ids", [])) > 1:
    print(job["worker_ids"][1])
EOF
)
    [ "$victim" = ended ] && { echo "the recovery job ended before a checkpoint"; break; }
    if [ -n "$victim" ]; then
      name=$("$cli" --json workers 2>/dev/null | python3 -c 'import json,sys
for w in json.load(sys.stdin).get("workers",[]):
    if w.get("worker_id")==sys.argv[1]: print(w["name"])' "$victim")
      i=${name##*-}
      killed_at=$(date +%s.%N)
      kill -KILL "${worker_pid[$i]}"
      echo "killed $name (worker $victim) at $(date -u +%T.%N)"
      start_worker "$i"
      break
    fi
    sleep 0.1
  done
  if [ -n "$job" ]; then
    timeout "$job_timeout" "$cli" watch "$job" >"$out/recover.watch.txt" 2>>"$out/recover.err"
    "$cli" --json status "$job" --events >"$out/recover.json" 2>>"$out/recover.err"
  fi
  echo "$killed_at" >"$out/recover.killed_at"
fi

python3 - "$out" "$tolerance" "$shapes" "$device" "$seq_len" "$one_seq_len" "$batch" <<'EOF'
import datetime, json, os, sys
out, tolerance, shapes, device = sys.argv[1], float(sys.argv[2]), sys.argv[3].split(), sys.argv[4]
# The same sequence length and batch: the same steps, losses compared. Different: weak scaling,
# rates only.
same_work = sys.argv[5] == sys.argv[6] and sys.argv[7] == "4"
# A shape's tokens per step over the 1-GPU job's (4 rows of ONE_SEQ_LEN).
tokens_ratio = int(sys.argv[5]) * int(sys.argv[7]) / (int(sys.argv[6]) * 4)
def load(name):
    try:
        return json.load(open(os.path.join(out, name + ".json")))
    except Exception as e:
        return {"state": "MISSING", "state_reason": str(e)}
def losses(job):
    return [p["loss"] for p in job.get("result", {}).get("training", {}).get("loss_curve", [])]
failed = False
one = load("one")
base = losses(one)
r1 = one.get("result", {}).get("training", {})
rows = [("1 x 1", one, r1, 0.0, 1, 1)]
for shape in shapes:
    d, s = shape.split("x")
    job = load(f"dp{d}-sp{s}")
    r = job.get("result", {}).get("training", {})
    got = losses(job)
    worst = max((abs(a - b) / abs(b) for a, b in zip(got, base)), default=float("nan"))
    if not same_work:
        worst = float("nan")
    if job.get("state") != "JOB_STATE_SUCCEEDED" or len(got) != len(base):
        failed = True
    if same_work and not worst <= tolerance:
        failed = True
    # "auto": the D the coordinator picked (the result says it).
    dd = int(r.get("data_parallel", 0)) if d == "auto" else int(d)
    rows.append((f"{d} x {s}" if d != "auto" else f"{dd}x{s} auto", job, r, worst, dd, int(s)))
if one.get("state") != "JOB_STATE_SUCCEEDED":
    failed = True
print(f"\n== training jobs through the service ({device}) ==")
# tokens/s and MFU: over every step of the run (the first steps warm up); "median step" and the
# last column: the steady rate, from the median step time. Both ratios: a shape's tokens/s over W
# times the 1-GPU job's.
print(f"{'shape':7} {'state':10} {'steps':>5} {'final loss':>10} {'max rel dloss':>13} {'tokens/s':>10} "
      f"{'vs W x 1 GPU':>12} {'MFU':>6} {'ckpt s':>7} {'median step s':>13} {'steady vs W x 1':>15} "
      f"{'plan GiB':>8} {'peak/plan':>9}")
single = r1.get("tokens_per_second", 0.0)
single_median = r1.get("median_step_seconds", 0.0)
for name, job, r, worst, d, s in rows:
    ckpt = [c.get("seconds", 0) for c in r.get("checkpoints", [])]
    ratio = r.get("tokens_per_second", 0.0) / (d * s * single) if single and name != "1 x 1" else float("nan")
    median = r.get("median_step_seconds", 0.0)
    # Rank 0's planned memory and its measured peak (device memory in use after a step, above the
    # rank's start).
    planned = int(r.get("planned_rank_bytes", 0))
    peak = int(r.get("measured_rank_peak_bytes", 0))
    steady = (tokens_ratio * single_median / (d * s * median)
              if median and name != "1 x 1" else float("nan"))
    print(f"{name:7} {job.get('state','?')[10:]:10} {int(r.get('steps',0)):5d} {r.get('final_loss',0):10.4f} "
          f"{worst:13.2e} {r.get('tokens_per_second',0):10.0f} {ratio:12.3f} "
          f"{100*r.get('mfu',0):5.1f}% {max(ckpt, default=0):7.2f} {median:13.4f} {steady:15.3f} "
          f"{planned / 2**30:8.2f} {peak / planned if planned else float('nan'):9.3f}")
    if job.get("state") != "JOB_STATE_SUCCEEDED":
        print("   ", job.get("state_reason", "")[:300])
rec = load("recover")
if rec.get("state") != "MISSING":
    killed = open(os.path.join(out, "recover.killed_at")).read().strip()
    resumed = [e for e in rec.get("events", []) if e.get("kind") == "resumed"]
    r = rec.get("result", {}).get("training", {})
    line = f"recovery: {rec.get('state','?')}, attempt {rec.get('attempt')}, resumed from step {r.get('resumed_from_step')}"
    if killed and resumed:
        t = datetime.datetime.fromisoformat(resumed[-1]["time"].replace("Z", "+00:00")).timestamp()
        line += f", {t - float(killed):.1f} s from the kill to the resumed event"
    line += f" (of which restoring the checkpoint {r.get('restore_seconds', 0):.2f} s)"
    print(line)
    if rec.get("state") != "JOB_STATE_SUCCEEDED" or not resumed:
        failed = True
sys.exit(1 if failed else 0)
EOF
