#!/usr/bin/env bash
# Multi-GPU check of the service (issue 6): a coordinator and one dattn-worker-gpu per GPU on this
# host, 2- and 4-rank attention jobs submitted through the CLI and compared with the same job on one
# GPU. Builds nothing on the GPU machine.
#
#   scripts/gpu-ring-check.sh stage   (here, no GPU needed) build the coordinator, the GPU worker and
#                                     the CLI with Bazel and pack them, with the shared libraries the
#                                     GPU machine lacks, into .device/service.tar.xz (git-ignored;
#                                     about 22 MB: the unpacked files are about 100 MB)
#   scripts/gpu-ring-check.sh [run]   (on the GPU machine, from the repo root, with .device carried)
#                                     start everything, run the jobs, print a table last
#   scripts/gpu-ring-check.sh smoke   (here) the same flow with CPU workers (dattn-worker from
#                                     bazel-bin, fp32 and smaller shapes): checks the script itself
#
# Environment: OUT (a folder for logs and job JSON; a temporary one otherwise), JOB_TIMEOUT seconds
# per job (default 300), SEQ_LEN (default 65536: the bf16 jobs' N), RANKS (default "2 4", capped by
# the GPUs present).
#
# Exit status: 0 when every row passed; 1 when a job failed or a ring's result differs from the
# single-GPU result beyond the dtype's tolerance (docs/ENGINE.md); 3 when nothing failed but some
# ring rows could not run because the GPU workers registered without ring support (the coordinator
# refuses those jobs with RESOURCE_EXHAUSTED saying so); 2 when the set-up itself failed (binaries
# missing, fewer than 2 GPUs, a daemon that does not start).
set -uo pipefail
cd "$(dirname "$0")/.."

mode="${1:-run}"
pack=.device/service.tar.xz
if [ "$mode" = "stage" ]; then
  set -e
  bazel build //server:dattn-coordinator //worker:dattn-worker-gpu //client:dattn
  bin=$(mktemp -d)/service
  mkdir -p "$bin/lib"
  for b in server/dattn-coordinator worker/dattn-worker-gpu client/dattn; do
    # Debug info is most of their size; the carried tree is limited to 64 MiB.
    strip --strip-debug -o "$bin/$(basename "$b")" "bazel-bin/$b"
  done
  # Every shared library they load that an Ubuntu GPU image need not have: not glibc's, not the
  # C++ runtime, and not the CUDA libraries, which come from the GPU machine (see "run").
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
  tar -C "$(dirname "$bin")" -cJf "$pack" service
  rm -rf "$(dirname "$bin")"
  ls -la "$pack"
  exit 0
fi

if [ "$mode" = "smoke" ]; then
  coordinator=bazel-bin/server/dattn-coordinator
  worker=bazel-bin/worker/dattn-worker
  cli=bazel-bin/client/dattn
  device=cpu
else
  if [ ! -f "$pack" ]; then
    echo "missing $pack: run 'scripts/gpu-ring-check.sh stage' on the build machine first"
    exit 2
  fi
  bin="${OUT:-/tmp}/dattn-service-bin"
  rm -rf "$bin" && mkdir -p "$bin" && tar -C "$bin" -xJf "$pack" || exit 2
  bin="$bin/service"
  coordinator="$bin/dattn-coordinator"
  worker="$bin/dattn-worker-gpu"
  cli="$bin/dattn"
  device=gpu
fi
for b in "$coordinator" "$worker" "$cli"; do
  if [ ! -x "$b" ]; then
    echo "missing $b: run 'scripts/gpu-ring-check.sh stage' on the build machine first"
    exit 2
  fi
done
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
job_timeout="${JOB_TIMEOUT:-300}"
seq_len="${SEQ_LEN:-65536}"

# cuDNN and NVRTC from PyTorch's wheels when present (the build used cuDNN 9.19 headers), then the
# system's CUDA and NCCL, then what stage copied.
. scripts/gpu-libs.sh
libs=$(wheel_lib_path cudnn cuda_nvrtc cu13 cublas)
libs="$libs:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu${bin:+:$bin/lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH="${libs#:}"
export NCCL_NVLS_ENABLE=0  # Never NVLink multicast on these machines.

if [ "$mode" = "smoke" ]; then
  gpus="${WORKERS:-4}"
else
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
{
  echo "== environment =="
  date -u
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>&1 | head -9
  echo "GPUs: $gpus"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ldd "$worker" 2>&1 | grep -E "cudnn|nccl|not found" || true
} | tee "$out/env.log"
if [ "$gpus" -lt 2 ]; then
  echo "need at least 2 GPUs, found $gpus"
  exit 2
fi

pids=()
# shellcheck disable=SC2317  # Called by the trap.
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 2
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# The coordinator, on ephemeral ports; it prints the real ones once ready.
# Plaintext (--insecure): one machine, loopback only, a throwaway cluster for measurements.
"$coordinator" --insecure --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  --data-dir "$out/data" --ring-formation-timeout-ms 120000 --heartbeat-ms 1000 \
  2>"$out/coordinator.log" &
pids+=($!)
addr=""
for _ in $(seq 1 300); do
  addr=$(sed -n 's/^dattn-coordinator listening on \([0-9.:]*\), metrics on .*/\1/p' "$out/coordinator.log")
  [ -n "$addr" ] && break
  sleep 0.1
done
if [ -z "$addr" ]; then
  echo "the coordinator did not start:"; cat "$out/coordinator.log"; exit 2
fi
metrics=$(sed -n 's/^dattn-coordinator listening on .*, metrics on \([0-9.:]*\)$/\1/p' "$out/coordinator.log")
export DATTN_COORDINATOR="$addr"
echo "coordinator on $addr, metrics on $metrics"

# One worker per GPU (smoke: one CPU worker per would-be GPU, one thread each).
for ((i = 0; i < gpus; i++)); do
  if [ "$mode" = "smoke" ]; then
    where=(--threads 1)
  else
    where=(--gpu --gpu-index "$i")
  fi
  "$worker" --insecure "${where[@]}" --name "$device-$i" --coordinator "$addr" \
    --health-port 0 --slots 1 2>"$out/worker-$i.log" &
  pids+=($!)
done
ready=0
for _ in $(seq 1 600); do
  ready=$("$cli" --json workers 2>/dev/null |
          python3 -c 'import json,sys; print(sum(w["state"]=="WORKER_STATE_READY" for w in json.load(sys.stdin).get("workers",[])))' 2>/dev/null || echo 0)
  [ "$ready" -ge "$gpus" ] && break
  sleep 0.2
done
"$cli" workers | tee "$out/workers.txt"
if [ "$ready" -lt "$gpus" ]; then
  echo "only $ready of $gpus GPU workers became ready"; tail -n 20 "$out"/worker-*.log; exit 2
fi

# Submits one job and waits for its end; the final Job (JSON) goes to $out/NAME.json, a refusal's
# message (or a timeout's) to $out/NAME.err.
run_job() {
  local name="$1"; shift
  echo "== $name: dattn submit $* --device $device --wait"
  timeout "$job_timeout" "$cli" --json submit "$@" --device "$device" --wait \
    >"$out/$name.json" 2>"$out/$name.err" || echo "   exit status $?"
}

# Cases: bf16 at the issue's scale (checksums compared), and fp32 small enough to return its output
# (compared element by element). Same seed, so every ring sees exactly the single-GPU inputs.
declare -a cases=(
  "bf16|-n $seq_len --heads 16 --head-dim 64 --segments 2048,4096,8192 --rates 1,2,4 --dtype bf16 --pass fwd-bwd --iterations 5 --seed 1"
  "bf16-causal-mixture|-n $seq_len --heads 16 --head-dim 64 --segments 2048,4096,8192 --rates 1,2,4 --mode mixture --causal --dtype bf16 --pass fwd-bwd --iterations 5 --seed 2"
  "fp32-output|-n 8192 --heads 8 --head-dim 64 --segments 1024,4096 --rates 1,2 --dtype fp32 --pass fwd --iterations 3 --seed 3 --return-output"
)
if [ "$mode" = "smoke" ]; then
  cases=(
    "fp32|-n 2048 --heads 4 --head-dim 32 --segments 256,1024 --rates 1,2 --dtype fp32 --pass fwd-bwd --iterations 2 --seed 1"
    "fp32-causal-mixture|-n 2048 --heads 4 --head-dim 32 --segments 256,1024 --rates 1,2 --mode mixture --causal --dtype fp32 --pass fwd-bwd --iterations 2 --seed 2"
    "fp32-output|-n 1024 --heads 4 --head-dim 32 --segments 128,512 --rates 1,2 --dtype fp32 --pass fwd --iterations 2 --seed 3 --return-output"
  )
fi
# Engine time inside a job against the standalone engine benchmark on the same card (issue 6's
# benchmark): a 1-GPU job with exactly the benchmark's row (bench/cuda_bench, --suite=parity).
parity_flags="-n 1048576 --heads 16 --head-dim 64 --segments 2048,4096,8192,16384 --rates 1,2,4,8 --dtype bf16 --pass fwd --iterations 20 --seed 4"
parity_bench=""
if [ "$mode" != "smoke" ] && [ -x .device/cuda_attention_bench ]; then
  # shellcheck disable=SC2086
  run_job "parity-p1" $parity_flags --ranks 1
  echo "== standalone: .device/cuda_attention_bench --suite=parity"
  .device/cuda_attention_bench --suite=parity 2>&1 | tee "$out/parity-bench.txt"
  parity_bench=$(sed -n 's/^parity grouped fwd N=2^20 H=16 D=64 *dattn *\([0-9.]*\) ms.*/\1/p' "$out/parity-bench.txt" | head -1)
fi

ranks_list=""
for p in ${RANKS:-2 4}; do
  if [ "$p" -le "$gpus" ]; then ranks_list="$ranks_list $p"; else echo "skipping $p ranks: $gpus GPUs"; fi
done
for c in "${cases[@]}"; do
  label="${c%%|*}"
  flags="${c#*|}"
  # shellcheck disable=SC2086
  run_job "$label-p1" $flags --ranks 1
  for p in $ranks_list; do
    # shellcheck disable=SC2086
    run_job "$label-p$p" $flags --ranks "$p"
  done
done

# The table: each ring against its single-GPU job.
PARITY_BENCH_MS="$parity_bench" python3 - "$out" "$ranks_list" "${cases[@]}" <<'PY' | tee "$out/table.txt"
import base64, datetime, json, math, os, struct, sys
out, ranks = sys.argv[1], [int(r) for r in sys.argv[2].split()]
labels = [c.split("|", 1)[0] for c in sys.argv[3:]]

def seconds(ts):
    # protobuf JSON timestamps: RFC 3339 with a Z and up to 9 fractional digits.
    base, _, frac = ts.rstrip("Z").partition(".")
    t = datetime.datetime.strptime(base, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    return t.timestamp() + (float("0." + frac) if frac else 0.0)

def start_latency(job):
    # Submit (create_time) to the first engine step (start_time: the first rank's STARTED report,
    # sent once its ring is formed and its inputs exist, right before step 1).
    try:
        return seconds(job["start_time"]) - seconds(job["create_time"])
    except (KeyError, ValueError):
        return float("nan")
tol = {"DTYPE_BF16": 1e-2, "DTYPE_FP16": 2e-3, "DTYPE_FP32": 1e-5}

def load(name):
    path = os.path.join(out, name + ".json")
    try:
        with open(path) as f:
            text = f.read().strip()
        return json.loads(text) if text else None
    except (OSError, ValueError):
        return None

def err(name):
    try:
        with open(os.path.join(out, name + ".err")) as f:
            return " ".join(f.read().split())[:160]
    except OSError:
        return ""

def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-300)

def output(job):
    t = job.get("result", {}).get("attention", {}).get("output", {})
    data = base64.b64decode(t.get("data", "")) if t.get("data") else b""
    if not data or t.get("dtype") != "DTYPE_FP32":
        return None
    return struct.unpack("<%df" % (len(data) // 4), data)

print("%-22s %5s %-10s %10s %9s %8s %12s %12s %12s %s" % (
    "case", "ranks", "state", "ms/step", "TFLOP/s", "start s", "out_sq diff", "grad_sq diff",
    "output err", "verdict"))
failed = unavailable = False
for label in labels:
    base = load(label + "-p1")
    for p in [1] + ranks:
        name = "%s-p%d" % (label, p)
        job = load(name)
        if job is None:
            e = err(name) or "no answer"
            if "join sequence-parallel rings" in e:
                unavailable = True
                verdict = "UNAVAILABLE"
            else:
                failed = True
                verdict = "FAIL"
            print("%-22s %5d %-10s %s: %s" % (label, p, "refused", verdict, e))
            continue
        state = job.get("state", "?").replace("JOB_STATE_", "")
        r = job.get("result", {}).get("attention", {})
        ms = 1e3 * float(r.get("seconds_per_step", 0))
        tf = float(r.get("tflops", 0))
        verdict, d_out, d_grad, d_o = "PASS", "-", "-", "-"
        if state != "SUCCEEDED":
            verdict = "FAIL: " + job.get("state_reason", "")[:120]
        elif p > 1 and base is not None and base.get("state") == "JOB_STATE_SUCCEEDED":
            b = base["result"]["attention"]
            t = tol.get(job["spec"]["attention"]["dtype"], 1e-2)
            diffs = [rel(float(r.get("out_sum_squares", 0)), float(b.get("out_sum_squares", 0)))]
            d_out = "%.3g" % diffs[0]
            if float(b.get("grad_sum_squares", 0)):
                diffs.append(rel(float(r.get("grad_sum_squares", 0)),
                                 float(b.get("grad_sum_squares", 0))))
                d_grad = "%.3g" % diffs[-1]
            x, y = output(job), output(base)
            if x is not None and y is not None and len(x) == len(y):
                num = sum((u - v) ** 2 for u, v in zip(x, y))
                den = sum(v * v for v in y)
                diffs.append(math.sqrt(num / den) if den else float("inf"))
                d_o = "%.3g" % diffs[-1]
            if max(diffs) > t:
                verdict = "FAIL: differs from 1 GPU beyond %g" % t
        elif p > 1:
            verdict = "FAIL: no single-GPU result to compare with"
        if verdict != "PASS":
            failed = True
        print("%-22s %5d %-10s %10.3f %9.2f %8.2f %12s %12s %12s %s" % (
            label, p, state, ms, tf, start_latency(job), d_out, d_grad, d_o, verdict))
parity = load("parity-p1")
bench_ms = os.environ.get("PARITY_BENCH_MS", "")
if parity is not None and bench_ms:
    job_ms = 1e3 * float(parity.get("result", {}).get("attention", {}).get("seconds_per_step", 0))
    if parity.get("state") == "JOB_STATE_SUCCEEDED" and job_ms > 0:
        ratio = float(bench_ms) / job_ms
        print("engine parity (N=2^20 bf16 grouped fwd, 1 GPU): standalone %.3f ms, inside a job "
              "%.3f ms/step: %.1f%% of the standalone speed (target >= 95%%), submit -> first step "
              "%.2f s" % (float(bench_ms), job_ms, 100 * ratio, start_latency(parity)))
    else:
        print("engine parity job did not succeed: %s" % parity.get("state_reason", "")[:160])
        failed = True
sys.exit(1 if failed else 3 if unavailable else 0)
PY
status=${PIPESTATUS[0]}

{
  echo "== coordinator metrics (rings, workers) =="
  curl -sf "http://$metrics/metrics" |
    grep -E '^dattn_(ring_formations_total|ring_formation_seconds_(sum|count)|worker_memory_(free|used)_bytes|worker_attention_tflops|attention_job_tflops_(sum|count))' || true
} | tee "$out/metrics.txt"
echo "logs and job JSON in $out"
exit "$status"
