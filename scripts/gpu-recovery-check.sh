#!/usr/bin/env bash
# Recovery with real faults on the GPUs of one host (issue 19): a coordinator and dattn-worker-gpu
# processes, jobs through the CLI, and two kinds of fault.
#
#   shrink  (4 GPUs, or 2): kill -9 of one rank's worker, not restarted, under a ring attention job
#           that allows a shrink (4 ranks, bf16) and under a training gang (2 x 2; 1 x 2 on 2
#           GPUs) of the LongNet base model after its first checkpoint. The workers left cannot
#           hold either as it ran, so each continues on fewer ranks. Checked: the attention job's
#           checksums against the 1-GPU run of its inputs, the gang's losses against its
#           uninterrupted run (bf16, LOSS_TOLERANCE); timed: the kill to the next attempt running
#           (attention) and to the "resumed" event (training).
#   oom     (GPU 0 alone): another process (the GPU machine's PyTorch) takes 30%, 60% and 90% of
#           the GPU's free memory after the worker last told the coordinator its free memory, then
#           a training job of the base model that needs about 60% of the GPU (64K tokens x 4 rows
#           in one micro-batch) is submitted. Each ends as the ladder says: as asked, with more
#           micro-batches, or failed with the planner's estimate and the measured free memory; the
#           runs that ran are compared with the undisturbed run's losses. Then the worker's own
#           step: a worker whose first allocation fails once (--fault-allocation-failures 1:1)
#           retries after releasing its caches, and an attention job succeeds on attempt 1.
#
#   chaos   (all GPUs): JOBS jobs (default 50) submitted at once, 2-rank bf16 attention jobs and 1 x 2
#           training gangs of a small LongNet (checkpoints every 5 steps) in turn, and KILLS faults
#           (default 10) at random moments: kill -9 of a random running rank's worker (started again
#           0-4 s later) and, every third fault, of the coordinator (started again on the same data
#           folder and port 1 s later). Checked: every job SUCCEEDED, once; each checkpoint
#           announced once; the attention checksums equal the 1-GPU run's, the training losses the
#           uninterrupted run's (LOSS_TOLERANCE).
#
#   scripts/gpu-recovery-check.sh stage   (here) the binaries and the corpus, as
#                                         scripts/gpu-train-service-check.sh stage packs them
#   scripts/gpu-recovery-check.sh [run]   (GPU machine, .device carried) PARTS="shrink oom chaos"
#   scripts/gpu-recovery-check.sh smoke   (here) the shrink and chaos parts with CPU workers and tiny
#                                         shapes (PARTS to choose)
#
# Environment: OUT (logs and job JSON; a temporary folder otherwise), PARTS (default "shrink oom
# chaos"; "oom" needs run mode), JOBS and KILLS (chaos), SEED (chaos: the random moments; printed),
# JOB_TIMEOUT seconds per job (default 600), LOSS_TOLERANCE (default 0.03), PACK (default
# .device/train-service.tar.xz).
#
# Exit status: 0 when every job ended as the ladder or the shrink says it should, with the right
# results; 1 otherwise; 2 when the set-up failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

mode="${1:-run}"
pack="${PACK:-.device/train-service.tar.xz}"
if [ "$mode" = "stage" ]; then
  exec env PACK="$pack" scripts/gpu-train-service-check.sh stage
fi
parts="${PARTS:-shrink oom chaos}"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
out=$(cd "$out" && pwd)
if [ "$mode" = "smoke" ]; then
  coordinator=bazel-bin/server/dattn-coordinator
  worker=bazel-bin/worker/dattn-worker
  cli=bazel-bin/client/dattn
  corpus=$PWD/bazel-bin/model/kjv.txt
  device=cpu
  gpus=4
  parts="${PARTS:-shrink chaos}"
elif [ "$mode" = "run" ]; then
  [ -f "$pack" ] || { echo "missing $pack: run 'scripts/gpu-recovery-check.sh stage' first"; exit 2; }
  bin="$out/bin"
  rm -rf "$bin" && mkdir -p "$bin" && tar -C "$bin" -xJf "$pack" || exit 2
  bin="$bin/train-service"
  coordinator="$bin/dattn-coordinator"
  worker="$bin/dattn-worker-gpu"
  cli="$bin/dattn"
  corpus="$bin/kjv.txt"
  device=gpu
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  . scripts/gpu-libs.sh
  libs=$(wheel_lib_path cudnn nccl cuda_nvrtc cu13 cublas)
  libs="$libs:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH="${libs#:}"
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1  # Never NVLink multicast here.
else
  echo "usage: scripts/gpu-recovery-check.sh stage|run|smoke" >&2
  exit 2
fi
for b in "$coordinator" "$worker" "$cli" "$corpus"; do
  [ -e "$b" ] || { echo "missing $b"; exit 2; }
done
job_timeout="${JOB_TIMEOUT:-600}"
tolerance="${LOSS_TOLERANCE:-0.03}"
{
  echo "== environment =="
  date -u
  [ "$device" = gpu ] && nvidia-smi --query-gpu=index,name,memory.total --format=csv 2>&1 | head -9
  echo "GPUs/workers: $gpus ($device); parts: $parts"
} | tee "$out/env.log"

pids=()
declare -A worker_pid
# shellcheck disable=SC2317  # Called by the trap.
cleanup() {
  for p in "${pids[@]}" "${worker_pid[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 2
  for p in "${pids[@]}" "${worker_pid[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# A coordinator on its own data folder (one per part), plaintext on loopback. Workers heartbeat
# every HEARTBEAT_MS (the oom part uses a slow one, so that the coordinator places on what the
# worker said before the other process took its memory).
coordinator_pid=""
start_coordinator() {  # NAME [PORT [MAX_ATTEMPTS]]
  local name="$1" port="${2:-0}"
  "$coordinator" --insecure --listen "127.0.0.1:$port" --metrics-listen 127.0.0.1:0 \
    --data-dir "$out/$name-data" --ring-formation-timeout-ms 120000 --dead-after-ms 4000 \
    --max-attempts "${3:-4}" --feasibility-settle-ms 2000 2>>"$out/$name-coordinator.log" &
  coordinator_pid=$!
  pids+=($!)
  addr=""
  for _ in $(seq 1 300); do
    addr=$(sed -n 's/^dattn-coordinator listening on \([0-9.:]*\), metrics on .*/\1/p' "$out/$name-coordinator.log" | tail -1)
    [ -n "$addr" ] && break
    sleep 0.1
  done
  [ -n "$addr" ] || { echo "the coordinator did not start:"; cat "$out/$name-coordinator.log"; exit 2; }
  export DATTN_COORDINATOR="$addr"
}
start_worker() {  # INDEX HEARTBEAT_MS [MORE FLAGS]
  local i="$1" beat="$2"
  shift 2
  local where=(--gpu --gpu-index "$i")
  [ "$mode" = "smoke" ] && where=(--threads 1)
  "$worker" --insecure "${where[@]}" --name "$device-$i" --coordinator "$addr" \
    --health-port 0 --slots 1 --heartbeat-ms "$beat" "$@" 2>>"$out/worker-$i.log" &
  worker_pid[$i]=$!
}
wait_ready() {  # COUNT
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
stop_all() {
  cleanup
  pids=()
  worker_pid=()
}
job_id() { python3 -c 'import json,sys; j = json.load(open(sys.argv[1])); print(j.get("job", j)["job_id"])' "$1" 2>/dev/null; }
status_json() { "$cli" --json status "$1" --events 2>/dev/null; }
# Waits for job $1 to reach a state matching the Python expression $2 over `job` (a dict); prints
# the worker id to kill when the expression returns one, "ended" when the job ended first.
wait_for() {
  local id="$1" expr="$2"
  for _ in $(seq 1 $((job_timeout * 10))); do
    status_json "$id" >"$out/now.json" || true
    r=$(python3 - "$out/now.json" "$expr" <<'EOF'
import json, sys
try:
    job = json.load(open(sys.argv[1]))
except Exception:
    sys.exit(0)
if job.get("state") in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"):
    print("ended"); sys.exit(0)
got = eval(sys.argv[2], {"job": job})
if got:
    print(got)
EOF
)
    [ -n "$r" ] && { echo "$r"; return 0; }
    sleep 0.1
  done
  echo timeout
}
killed_at=""
kill_worker_of() {  # WORKER_ID: kills its process (not restarted); the time in $killed_at
  local name i
  name=$("$cli" --json workers 2>/dev/null | python3 -c 'import json,sys
for w in json.load(sys.stdin).get("workers",[]):
    if w.get("worker_id")==sys.argv[1]: print(w["name"])' "$1")
  i=${name##*-}
  killed_at=$(date +%s.%N)
  kill -KILL "${worker_pid[$i]}"
  unset "worker_pid[$i]"
  echo "killed $name (worker $1) under a running job"
}
train_config() {  # FILE SEQ_LEN MICRO_BATCHES STEPS CHECKPOINT_EVERY
  local model
  if [ "$mode" = "smoke" ]; then
    model='"vocab_size": 256, "d_model": 32, "num_layers": 2, "num_heads": 4, "ffn_dim": 64,
           "attention": {"segment_lengths": [64, 128, 256], "dilation_rates": [1, 2, 4]}'
  else
    model='"vocab_size": 256, "d_model": 768, "num_layers": 12, "num_heads": 12, "ffn_dim": 3072,
           "attention": {"segment_lengths": [2048, 4096, 8192, 16384, 32768],
                         "dilation_rates": [1, 2, 4, 6, 12]}'
  fi
  cat >"$1" <<EOF
{"model": {$model},
 "data": {"paths": ["$corpus"], "format": "text", "validation_fraction": 0.05},
 "seq_len": $2, "batch_size": 4, "micro_batches": $3, "steps": $4, "seed": 1,
 "optimizer": {"lr": 6e-4, "min_lr": 6e-5, "warmup_steps": 5},
 "eval": {"every": 0, "batches": 1},
 "checkpoint": {"every": $5, "keep_last": 2}}
EOF
}

# ---- shrink ---------------------------------------------------------------------------------------
if [[ " $parts " == *" shrink "* ]]; then
  echo "== shrink =="
  [ "$gpus" -ge 2 ] || { echo "the shrink part needs 2 or more GPUs"; exit 2; }
  [ "$gpus" -ge 4 ] && ranks=4 || ranks=2
  start_coordinator shrink
  for ((i = 0; i < ranks; i++)); do start_worker "$i" 500; done
  wait_ready "$ranks" || exit 2
  if [ "$mode" = "smoke" ]; then
    att=(--seq-len 4096 --heads 4 --head-dim 32 --segments "512,2048" --rates "1,2" --dtype fp32)
    iterations=40; seq=512; steps=30; every=10
  else
    att=(--seq-len 1048576 --heads 8 --head-dim 128 --segments "2048,8192,32768" --rates "1,4,16"
         --dtype bf16)
    iterations=300; seq=32768; steps=40; every=10
  fi
  # The attention control: one rank, one step (every step of a job computes the same pass).
  "$cli" --json submit "${att[@]}" --pass fwd-bwd --seed 9 --device "$device" --ranks 1 \
    --iterations 1 --wait >"$out/att-control.json" 2>"$out/att-control.err"
  "$cli" --json submit "${att[@]}" --pass fwd-bwd --seed 9 --device "$device" --ranks "$ranks" \
    --iterations "$iterations" --shrink-ring true --single-device true \
    >"$out/att.submit.json" 2>"$out/att.err"
  id=$(job_id "$out/att.submit.json")
  victim=$(wait_for "$id" 'job["worker_ids"][-1] if job.get("state") == "JOB_STATE_RUNNING" and int(job.get("progress", {}).get("steps_done", 0)) >= 3 and len(job.get("worker_ids", [])) > 1 else ""')
  att_killed=""
  case "$victim" in
    ended|timeout|"") echo "the attention job did not run to its third step: $victim" ;;
    *) kill_worker_of "$victim"; att_killed=$killed_at ;;
  esac
  [ -n "$id" ] && timeout "$job_timeout" "$cli" watch "$id" >/dev/null 2>&1
  [ -n "$id" ] && status_json "$id" >"$out/att.json"
  # Training: the uninterrupted gang, then the same gang with a worker killed after its first
  # checkpoint (a spare-less cluster: the gang must shrink). On 4 GPUs the killed one is restarted
  # between the two so that both start on 4.
  [ "$ranks" = 4 ] && shape=(2 2) || shape=(1 2)
  for name in reference shrunk; do
    mkdir -p "$out/$name"
    train_config "$out/$name/trainer.json" "$seq" 1 "$steps" "$every"
    cat >"$out/$name/job.yaml" <<EOF
name: $name
training:
  config_file: trainer.json
  data_parallel: ${shape[0]}
  sequence_parallel: ${shape[1]}
  device: $device
  checkpoint_dir: $out/$name/checkpoints
EOF
  done
  for ((i = 0; i < ranks; i++)); do [ -n "${worker_pid[$i]:-}" ] || start_worker "$i" 500; done
  wait_ready "$ranks" || exit 2
  timeout "$job_timeout" "$cli" --json submit -f "$out/reference/job.yaml" --wait \
    >"$out/train-reference.json" 2>"$out/train-reference.err"
  "$cli" --json submit -f "$out/shrunk/job.yaml" >"$out/train.submit.json" 2>"$out/train.err"
  id=$(job_id "$out/train.submit.json")
  victim=$(wait_for "$id" 'job["worker_ids"][-1] if job.get("state") == "JOB_STATE_RUNNING" and job.get("progress", {}).get("training", {}).get("checkpoints") else ""')
  train_killed=""
  case "$victim" in ended|timeout|"") echo "the training job did not reach a checkpoint: $victim" ;; *)
    kill_worker_of "$victim"; train_killed=$killed_at ;;
  esac
  timeout "$job_timeout" "$cli" watch "$id" >/dev/null 2>&1
  status_json "$id" >"$out/train-shrunk.json"
  echo "$att_killed $train_killed" >"$out/killed_at"
  stop_all
fi

# ---- oom ------------------------------------------------------------------------------------------
if [[ " $parts " == *" oom "* ]]; then
  echo "== out of memory at three severities =="
  start_coordinator oom
  start_worker 0 10000  # Heartbeats 10 s apart: placement on what the worker said before.
  wait_ready 1 || exit 2
  for severity in 0 30 60 90; do
    name="oom-$severity"
    mkdir -p "$out/$name"
    train_config "$out/$name/trainer.json" 65536 1 20 20  # No checkpoint_dir: none written.
    cat >"$out/$name/job.yaml" <<EOF
name: $name
training:
  config_file: trainer.json
  device: gpu
EOF
    hog=""
    if [ "$severity" != 0 ]; then
      # Another process takes SEVERITY% of the free memory and holds it until killed.
      python3 - "$severity" >"$out/$name.hog" 2>&1 <<'EOF' &
import sys, time, torch
free, total = torch.cuda.mem_get_info(0)
x = torch.empty(int(free * int(sys.argv[1]) / 100), dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print(f"held {x.numel() / 2**30:.2f} GiB of {free / 2**30:.2f} GiB free", flush=True)
time.sleep(3600)
EOF
      hog=$!
      for _ in $(seq 1 600); do grep -q held "$out/$name.hog" && break; sleep 0.1; done
      cat "$out/$name.hog"
    fi
    timeout "$job_timeout" "$cli" --json submit -f "$out/$name/job.yaml" --wait \
      >"$out/$name.submit.json" 2>"$out/$name.err"
    id=$(job_id "$out/$name.submit.json")
    [ -n "$id" ] && status_json "$id" >"$out/$name.json"
    [ -n "$hog" ] && { kill -KILL "$hog"; wait "$hog" 2>/dev/null; }
    sleep 12  # A heartbeat with the memory back before the next severity.
  done
  # The worker's own step on the GPU: its first allocation fails once (--fault-allocation-failures
  # 1:1); it releases its caches (the default memory pool trimmed) and allocates again, and the
  # attention job succeeds on its first attempt.
  kill -TERM "${worker_pid[0]}"
  wait "${worker_pid[0]}" 2>/dev/null
  start_worker 0 500 --fault-allocation-failures 1:1
  wait_ready 1 || exit 2
  timeout "$job_timeout" "$cli" --json submit --seq-len 65536 --heads 8 --head-dim 128 \
    --segments "2048,8192" --rates "1,4" --dtype bf16 --pass fwd-bwd --device gpu --wait \
    >"$out/oom-retry.submit.json" 2>"$out/oom-retry.err"
  id=$(job_id "$out/oom-retry.submit.json")
  [ -n "$id" ] && status_json "$id" >"$out/oom-retry.json"
  grep -h "out of memory (" "$out/worker-0.log" | tail -1
  stop_all
fi

# ---- chaos ----------------------------------------------------------------------------------------
if [[ " $parts " == *" chaos "* ]]; then
  echo "== chaos =="
  [ "$gpus" -ge 2 ] || { echo "the chaos part needs 2 or more GPUs"; exit 2; }
  jobs="${JOBS:-50}"
  kills="${KILLS:-10}"
  seed="${SEED:-$RANDOM}"
  echo "SEED=$seed JOBS=$jobs KILLS=$kills"
  RANDOM=$seed
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  start_coordinator chaos "$port" 100
  for ((i = 0; i < gpus; i++)); do start_worker "$i" 500; done
  wait_ready "$gpus" || exit 2
  if [ "$mode" = "smoke" ]; then
    att=(--seq-len 2048 --heads 2 --head-dim 32 --segments "256,1024" --rates "1,2" --dtype fp64)
    iterations=150
    model='"vocab_size": 256, "d_model": 32, "num_layers": 2, "num_heads": 2, "ffn_dim": 64,
           "attention": {"segment_lengths": [16, 32], "dilation_rates": [1, 2]}'
    seq=64; steps=100; threads='"threads": 1,'
  else
    att=(--seq-len 262144 --heads 8 --head-dim 128 --segments "2048,8192" --rates "1,4"
         --dtype bf16)
    iterations=200
    model='"vocab_size": 256, "d_model": 256, "num_layers": 4, "num_heads": 4, "ffn_dim": 1024,
           "attention": {"segment_lengths": [1024, 4096], "dilation_rates": [1, 4]}'
    seq=8192; steps=40; threads=''
  fi
  chaos_job() {  # NAME: a 1 x 2 training job file of the small model
    mkdir -p "$out/$1"
    cat >"$out/$1/trainer.json" <<EOF
{"model": {$model}, $threads
 "data": {"paths": ["$corpus"], "format": "text", "validation_fraction": 0.05},
 "seq_len": $seq, "batch_size": 4, "micro_batches": 1, "steps": $steps, "seed": 3,
 "optimizer": {"lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 5},
 "eval": {"every": 0, "batches": 1},
 "checkpoint": {"every": 5, "keep_last": 2}}
EOF
    cat >"$out/$1/job.yaml" <<EOF
name: $1
training:
  config_file: trainer.json
  data_parallel: 1
  sequence_parallel: 2
  device: $device
  checkpoint_dir: $out/$1/checkpoints
EOF
  }
  # The references, undisturbed: the training run, and the attention inputs on one rank.
  chaos_job chaos-reference
  timeout "$job_timeout" "$cli" --json submit -f "$out/chaos-reference/job.yaml" --wait \
    >"$out/chaos-reference.json" 2>"$out/chaos-reference.err"
  for s in 1 2; do
    timeout "$job_timeout" "$cli" --json submit "${att[@]}" --pass fwd-bwd --seed "$s" \
      --device "$device" --ranks 1 --iterations 1 --wait >"$out/chaos-control-$s.json" 2>&1
  done
  : >"$out/chaos-jobs.txt"
  for ((n = 0; n < jobs; n++)); do
    if ((n % 2 == 0)); then
      s=$((1 + (n / 2) % 2))
      "$cli" --json submit "${att[@]}" --pass fwd-bwd --seed "$s" --device "$device" --ranks 2 \
        --iterations "$iterations" >"$out/chaos-submit.json" 2>>"$out/chaos.err"
      echo "$(job_id "$out/chaos-submit.json") attention $s" >>"$out/chaos-jobs.txt"
    else
      chaos_job "chaos-$n"
      "$cli" --json submit -f "$out/chaos-$n/job.yaml" >"$out/chaos-submit.json" 2>>"$out/chaos.err"
      echo "$(job_id "$out/chaos-submit.json") training -" >>"$out/chaos-jobs.txt"
    fi
  done
  # The faults, at random moments; a killed worker comes back 0-4 s later, the coordinator 1 s later
  # on the same port and data folder.
  : >"$out/chaos-faults.txt"
  done_kills=0
  declare -A restart_at
  deadline=$((SECONDS + job_timeout))
  while ((done_kills < kills && SECONDS < deadline)); do
    sleep "$((RANDOM % 3)).$((RANDOM % 10))"
    for i in "${!restart_at[@]}"; do
      if ((SECONDS >= restart_at[$i])); then start_worker "$i" 500; unset "restart_at[$i]"; fi
    done
    if (((done_kills + 1) % 3 == 0)); then
      kill -KILL "$coordinator_pid"
      echo "$(date -u +%T) kill -9 of the coordinator" >>"$out/chaos-faults.txt"
      sleep 1
      start_coordinator chaos "$port" 100
      done_kills=$((done_kills + 1))
      continue
    fi
    # A random worker among those holding a rank of a running job ("done" when every job ended:
    # the jobs were too short for the faults asked, which the summary reports as a failure).
    victim=$("$cli" --json list --limit 200 2>/dev/null | python3 -c 'import json, random, sys
random.seed(int(sys.argv[1]))
jobs = json.load(sys.stdin).get("jobs", [])
ids = [w for j in jobs if j.get("state") == "JOB_STATE_RUNNING" for w in j.get("worker_ids", [])]
ended = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED")
print(random.choice(ids) if ids else "" if any(j.get("state") not in ended for j in jobs) else "done")' "$RANDOM")
    [ "$victim" = "done" ] && break
    [ -n "$victim" ] || continue
    name=$("$cli" --json workers 2>/dev/null | python3 -c 'import json,sys
for w in json.load(sys.stdin).get("workers",[]):
    if w.get("worker_id")==sys.argv[1]: print(w["name"])' "$victim")
    i=${name##*-}
    [ -n "$i" ] && [ -n "${worker_pid[$i]:-}" ] || continue
    kill -KILL "${worker_pid[$i]}"
    unset "worker_pid[$i]"
    restart_at[$i]=$((SECONDS + RANDOM % 5))
    echo "$(date -u +%T) kill -9 of $name (worker $victim)" >>"$out/chaos-faults.txt"
    done_kills=$((done_kills + 1))
  done
  for i in "${!restart_at[@]}"; do start_worker "$i" 500; done
  cat "$out/chaos-faults.txt"
  # Each job to its end (polled: a watch would end with an error while the coordinator restarts).
  while read -r id _ _; do
    wait_for "$id" 'False' >/dev/null
    status_json "$id" >"$out/chaos-$id.json"
  done <"$out/chaos-jobs.txt"
  stop_all
fi

python3 - "$out" "$tolerance" "$parts" "${KILLS:-10}" <<'EOF'
import datetime, json, os, sys
out, tolerance, parts, kills = sys.argv[1], float(sys.argv[2]), sys.argv[3].split(), int(sys.argv[4])
def load(name):
    try:
        return json.load(open(os.path.join(out, name + ".json")))
    except Exception as e:
        return {"state": "MISSING", "state_reason": str(e)}
def at(event):
    return datetime.datetime.fromisoformat(event["time"].replace("Z", "+00:00")).timestamp()
def losses(job):
    return [p["loss"] for p in job.get("result", {}).get("training", {}).get("loss_curve", [])]
failed = False
rows = []
if "shrink" in parts:
    killed = (open(os.path.join(out, "killed_at")).read().split() + ["", ""])[:2]
    att, control = load("att"), load("att-control")
    control = control.get("job", control)
    events = att.get("events", [])
    shrunk = [e for e in events if e.get("kind") == "shrunk"]
    started = [e for e in events if e.get("kind") == "started"]
    asked = int(att.get("requested_spec", {}).get("attention", {}).get("num_ranks", 0) or 0)
    ran = int(att.get("spec", {}).get("attention", {}).get("num_ranks", 0) or 0)
    took = at(started[-1]) - float(killed[0]) if started and killed[0] else float("nan")
    one, got = control.get("result", {}).get("attention", {}), att.get("result", {}).get("attention", {})
    # bf16 on GPUs (fp32 on CPUs): the ring of the shrunk size against one GPU's pass.
    tol = 1e-2 if att.get("spec", {}).get("attention", {}).get("dtype") == "DTYPE_BF16" else 1e-5
    worst = max((abs(got.get(k, 0) - one.get(k, 0)) / abs(one.get(k, 1) or 1)
                 for k in ("out_sum_squares", "grad_sum_squares")), default=float("nan"))
    ok = (att.get("state") == "JOB_STATE_SUCCEEDED" and bool(shrunk) and 0 < ran < asked
          and control.get("state") == "JOB_STATE_SUCCEEDED" and worst <= tol)
    rows.append(("attention ring, kill -9 of a rank's worker",
                 f"{asked} -> {ran} ranks, {att.get('state', '?')[10:]}",
                 f"{took:.1f} s to running again", f"sum sq rel diff {worst:.2e} (bound {tol:g})"))
    failed |= not ok
    ref, run = load("train-reference"), load("train-shrunk")
    ref = ref.get("job", ref)
    a, b = losses(ref), losses(run)
    worst = max((abs(x - y) / abs(y) for x, y in zip(b, a)), default=float("nan"))
    resumed = [e for e in run.get("events", []) if e.get("kind") == "resumed"]
    shrunk = [e for e in run.get("events", []) if e.get("kind") == "shrunk"]
    t = run.get("result", {}).get("training", {})
    took = at(resumed[-1]) - float(killed[1]) if resumed and killed[1] else float("nan")
    ok = (run.get("state") == "JOB_STATE_SUCCEEDED" and bool(shrunk) and len(a) == len(b)
          and worst <= tolerance)
    rows.append(("training gang, kill -9 after a checkpoint",
                 f"{t.get('data_parallel')} x {t.get('sequence_parallel')}, {run.get('state','?')[10:]}",
                 f"{took:.1f} s to resumed (restore {t.get('restore_seconds', 0):.2f} s)",
                 f"max rel dloss {worst:.2e}"))
    failed |= not ok
    for e in shrunk[:1]:
        print("shrunk:", e.get("message", "")[:400])
if "oom" in parts:
    base = losses(load("oom-0"))
    for severity in ("0", "30", "60", "90"):
        job = load(f"oom-{severity}")
        job = job.get("job", job)
        state = job.get("state", "?")
        cfg = json.loads(job.get("spec", {}).get("training", {}).get("config_json", "{}") or "{}")
        text = " ".join(e.get("message", "") for e in job.get("events", []))
        how = ("as asked" if state == "JOB_STATE_SUCCEEDED" and cfg.get("micro_batches") == 1 else
               f"micro_batches {cfg.get('micro_batches')}" if state == "JOB_STATE_SUCCEEDED" else
               "failed")
        got = losses(job)
        worst = max((abs(x - y) / abs(y) for x, y in zip(got, base)), default=float("nan"))
        note = f"max rel dloss {worst:.2e}" if got else job.get("state_reason", "")[:160]
        where = ("ladder at submit" if "out of memory as asked" in text else
                 "ladder while running" if "out of memory while running" in text else "")
        rows.append((f"oom, another process holds {severity}%", how, where, note))
        if state == "JOB_STATE_SUCCEEDED" and got and not worst <= tolerance:
            failed = True
        if state == "JOB_STATE_FAILED" and "planner estimate" not in job.get("state_reason", ""):
            failed = True  # A failure must carry the planner's numbers.
        if severity == "0" and state != "JOB_STATE_SUCCEEDED":
            failed = True
if "chaos" in parts:
    ref = load("chaos-reference")
    ref = ref.get("job", ref)
    base = losses(ref)
    controls = {}
    for s in ("1", "2"):
        c = load(f"chaos-control-{s}")
        controls[s] = c.get("job", c).get("result", {}).get("attention", {})
    n = lost = wrong = twice = 0
    kinds = {}
    for line in open(os.path.join(out, "chaos-jobs.txt")):
        jid, kind, s = line.split()
        job = load(f"chaos-{jid}")
        n += 1
        if job.get("state") != "JOB_STATE_SUCCEEDED":
            lost += 1
            print("not succeeded:", jid, job.get("state"), job.get("state_reason", "")[:300])
            continue
        ev = job.get("events", [])
        seen = {}
        for e in ev:
            if e.get("kind") == "checkpoint":
                k = e.get("message", "").split(":")[0]
                seen[k] = seen.get(k, 0) + 1
        if sum(e.get("kind") == "succeeded" for e in ev) != 1 or any(v != 1 for v in seen.values()):
            twice += 1
            print("reported twice:", jid)
        kinds[kind] = kinds.get(kind, 0) + 1
        if kind == "attention":
            one, got = controls[s], job.get("result", {}).get("attention", {})
            tol = 1e-2 if job.get("spec", {}).get("attention", {}).get("dtype") == "DTYPE_BF16" else 1e-9
            worst = max(abs(got.get(k, 0) - one.get(k, 0)) / abs(one.get(k, 1) or 1)
                        for k in ("out_sum_squares", "grad_sum_squares"))
        else:
            got = losses(job)
            worst = (max((abs(x - y) / abs(y) for x, y in zip(got, base)), default=float("inf"))
                     if len(got) == len(base) else float("inf"))
            tol = tolerance
        if not worst <= tol:
            wrong += 1
            print("wrong result:", jid, kind, f"{worst:.3e} > {tol:g}")
    faults = [l.strip() for l in open(os.path.join(out, "chaos-faults.txt"))]
    coord = sum("coordinator" in f for f in faults)
    rows.append((f"chaos: {n} jobs ({kinds.get('attention', 0)} attention, {kinds.get('training', 0)} training)",
                 f"{len(faults)} faults ({coord} of the coordinator)",
                 f"lost {lost}, reported twice {twice}", f"wrong {wrong}"))
    failed |= bool(lost or wrong or twice) or ref.get("state") != "JOB_STATE_SUCCEEDED"
    if len(faults) < kills:
        failed = True
        print(f"only {len(faults)} of {kills} faults: the jobs ended first (longer jobs, or more)")
if "oom" in parts:
    job = load("oom-retry")
    ranks = job.get("result", {}).get("attention", {}).get("ranks", [])
    retried = sum(int(r.get("out_of_memory_retries", 0)) for r in ranks)
    ok = job.get("state") == "JOB_STATE_SUCCEEDED" and int(job.get("attempt", 0)) == 1 and retried == 1
    rows.append(("oom, the first allocation fails once", f"{job.get('state', '?')[10:]}, attempt {job.get('attempt')}",
                 "the worker's own retry", f"out_of_memory_retries {retried}"))
    failed |= not ok
print("\n== recovery with real faults ==")
for r in rows:
    print(f"{r[0]:42} {r[1]:26} {r[2]:38} {r[3]}")
sys.exit(1 if failed else 0)
EOF
