#!/usr/bin/env bash
# GPU check of the trainer on one GPU and of the model's parity with the seed library (issue 15),
# in one call: the GPU trainer tests, dattn-train-gpu against dattn-train on the KJV demo config,
# a GPU run resumed in another process, and the logits against a PyTorch model built from the
# seed library's layers. Builds nothing on the GPU machine.
#
#   scripts/gpu-train-check.sh stage SEED_LIB   (here, no GPU needed) build the binaries with
#                                    Bazel and copy them into .device/train/ (git-ignored) with
#                                    the King James Bible, OpenBLAS (which the GPU image lacks)
#                                    and a copy of the seed library (SEED_LIB: the folder holding
#                                    the dilated_attention_pytorch package; never committed)
#   scripts/gpu-train-check.sh [run] [steps]    (on the GPU machine, from the repo root, with
#                                    .device/train carried) run them; a table comes last.
#
# steps: comma-separated subset of test,train,parity (default all three).
#   test    cuda_adamw_test and cuda_trainer_test (model/cuda): the trainer on the GPU against the
#           CPU trainer, accumulation, skips, shards, checkpoints between devices, resume.
#   train   trainer/configs/kjv-small.json, the same config and seed, on both binaries:
#           dattn-train-gpu --device cuda, and dattn-train on this machine's cores (started first,
#           in the background, with CPU_THREADS threads, default: cores - 4, leaving the GPU run's
#           host thread and the tests theirs). The loss at steps 1, 25, 50, 100, 200, 300 of both,
#           the largest relative difference of the step losses over steps 1-100 (bound 3e-2: bf16
#           products against fp32, as cuda_trainer_test), the validation losses. Then the GPU
#           run's step-200 checkpoint is resumed by a second dattn-train-gpu process to step 300:
#           its losses against the first run's (bound 3e-2; not bit-exact: cuBLASLt's algorithms
#           are chosen by timing in each process).
#   parity  model/testing/seed_parity.py on the GPU run's final checkpoint and on a seeded XPOS
#           model: our logits (CPU fp32 and GPU bf16) against the seed's layers in PyTorch.
# Into OUT (default: a temporary folder): every log, and kjv-small-{gpu,cpu}/ with each run's
# history.json, loss.svg and config.json, and kjv-small-gpu-vs-cpu.svg (both curves, plot_runs).
# Environment: CPU_THREADS, CPU_TIMEOUT (seconds the CPU run may take before it is stopped with
# SIGINT, which still writes its curve; default 360), TEST_TIMEOUT, TRAIN_TIMEOUT, PARITY_TIMEOUT
# (default 300, 240, 240), GTEST_FILTER.
set -uo pipefail
cd "$(dirname "$0")/.."

dir=.device/train
mode="${1:-run}"
if [ "$mode" = "stage" ]; then
  set -e
  seed="${2:?usage: scripts/gpu-train-check.sh stage SEED_LIB_PATH}"
  [ -d "$seed/dilated_attention_pytorch" ] || {
    echo "$seed holds no dilated_attention_pytorch package" >&2
    exit 2
  }
  targets=(//model/cuda:cuda_adamw_test //model/cuda:cuda_trainer_test //trainer:dattn-train
           //trainer:dattn-train-gpu //trainer:plot_runs //model/tools:dump_logits_gpu)
  bazel build //model:kjv_corpus "${targets[@]}" 2>&1 | tail -2
  rm -rf "$dir"
  mkdir -p "$dir/bin" "$dir/lib" "$dir/model"
  for t in "${targets[@]}"; do
    path="${t#//}"
    cp -fL "bazel-bin/${path/://}" "$dir/bin/"
  done
  chmod u+w "$dir"/bin/*
  strip --strip-debug "$dir"/bin/*
  cp -fL bazel-bin/model/kjv.txt "$dir/model/kjv.txt"
  # The CPU model's OpenBLAS (and its Fortran runtime), which the GPU image lacks.
  for lib in libopenblas.so.0 libgfortran.so.5 libquadmath.so.0 libatomic.so.1; do
    cp -fL "/usr/lib/x86_64-linux-gnu/$lib" "$dir/lib/"
  done
  mkdir -p "$dir/seed-lib"
  cp -r "$seed/dilated_attention_pytorch" "$dir/seed-lib/"
  find "$dir/seed-lib" -name __pycache__ -prune -exec rm -rf {} +
  # One archive (the device tool carries at most 64 MiB).
  tar -cJf "$dir/bundle.tar.xz" -C "$dir" bin lib model seed-lib
  rm -rf "${dir:?}/bin" "${dir:?}/lib" "${dir:?}/model" "${dir:?}/seed-lib"
  chmod -R u+w "$dir"
  du -sh "$dir"
  ls -la "$dir"
  exit 0
fi
[ "$mode" = "run" ] && shift || true
steps="${1:-test,train,parity}"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
work=$(mktemp -d)
have() { [[ ",$steps," == *",$1,"* ]]; }

[ -f "$dir/bundle.tar.xz" ] || {
  echo "no $dir/bundle.tar.xz: run scripts/gpu-train-check.sh stage SEED_LIB first" >&2
  exit 2
}
[ -d "$dir/bin" ] || tar -xJf "$dir/bundle.tar.xz" -C "$dir"
bin="$PWD/$dir/bin"
kjv="$PWD/$dir/model/kjv.txt"
. scripts/gpu-libs.sh
libs=$(wheel_lib_path cudnn cuda_nvrtc cu13 cublas)
export LD_LIBRARY_PATH="${libs#:}:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}:$PWD/$dir/lib"
cores=$(nproc)
cpu_threads="${CPU_THREADS:-$((cores > 5 ? cores - 4 : 1))}"

{
  echo "== environment =="
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -3
  echo "$cores cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  ldd "$bin/dattn-train-gpu" 2>&1 | grep -E "cudnn|cublas|openblas|not found" || true
} | tee "$out/env.log"

declare -A result detail
order=()
record() {  # record NAME PASS|FAIL DETAIL
  order+=("$1")
  result[$1]="$2"
  detail[$1]="$3"
}

# The CPU run first, in the background: it takes the longest.
config=trainer/configs/kjv-small.json
cpu_pid=""
cpu_start=$(date +%s)
if have train; then
  echo "== train (background): dattn-train, $cpu_threads threads =="
  timeout -s INT "${CPU_TIMEOUT:-360}" "$bin/dattn-train" --config "$config" --data "$kjv" \
    --threads "$cpu_threads" --out "$work/kjv-small-cpu" >"$out/train.cpu.log" 2>&1 &
  cpu_pid=$!
fi

if have test; then
  echo "== test: cuda_adamw_test, cuda_trainer_test =="
  start=$(date +%s)
  rc=0
  # The trainer test reads model/kjv.txt from its working folder, as under Bazel.
  mkdir -p "$work/test"
  : >"$out/test.log"
  for t in cuda_adamw_test cuda_trainer_test; do
    (cd "$dir" && TEST_TMPDIR="$work/test" timeout "${TEST_TIMEOUT:-300}" "$bin/$t" \
      --gtest_filter="${GTEST_FILTER:-*}") >>"$out/test.log" 2>&1 || rc=$?
  done
  end=$(date +%s)
  passed=$(grep -c '^\[       OK \]' "$out/test.log" || true)
  failed=$(grep -c '^\[  FAILED  \] .*(' "$out/test.log" || true)
  skipped=$(grep -c '^\[  SKIPPED \] .*(' "$out/test.log" || true)
  grep -E '^\[ parity \]' "$out/test.log" || true
  grep -B3 -A20 '^\[  FAILED  \] .*(' "$out/test.log" | grep -vE '^\[ RUN' | head -120 || true
  summary="$passed passed, $failed failed, $skipped skipped in $((end - start)) s (exit $rc)"
  if [ "$rc" -eq 0 ] && [ "$failed" -eq 0 ] && [ "$skipped" -eq 0 ] && [ "$passed" -gt 0 ]; then
    record test PASS "$summary"
  else
    record test FAIL "$summary"
  fi
fi

gpu_ckpt=""
if have train; then
  echo "== train: dattn-train-gpu --device cuda =="
  start=$(date +%s)
  timeout "${TRAIN_TIMEOUT:-240}" "$bin/dattn-train-gpu" --config "$config" --data "$kjv" \
    --device cuda --out "$work/kjv-small-gpu" >"$out/train.gpu.log" 2>&1
  rc=$?
  end=$(date +%s)
  grep -E '^(model|step:|eval step 300|done)' "$out/train.gpu.log" || tail -5 "$out/train.gpu.log"
  mkdir -p "$out/kjv-small-gpu"
  cp "$work/kjv-small-gpu"/{history.json,loss.svg,config.json} "$out/kjv-small-gpu/" 2>/dev/null
  [ "$rc" -eq 0 ] && gpu_ckpt="$work/kjv-small-gpu/checkpoints/step-00000300"
  record train-gpu "$([ "$rc" -eq 0 ] && echo PASS || echo FAIL)" \
    "exit $rc in $((end - start)) s; $(grep -E '^eval step 300' "$out/train.gpu.log" | cut -c1-80)"

  echo "== train: the step-200 checkpoint resumed by a second dattn-train-gpu process =="
  if [ "$rc" -eq 0 ]; then
    mkdir -p "$work/resume/checkpoints"
    cp -r "$work/kjv-small-gpu/checkpoints/step-00000200" "$work/resume/checkpoints/"
    timeout "${TRAIN_TIMEOUT:-240}" "$bin/dattn-train-gpu" --out "$work/resume" --resume \
      >"$out/train.resume.log" 2>&1
    rrc=$?
    grep -E '^resumed' "$out/train.resume.log"
    cp "$work/resume/history.json" "$out/kjv-small-gpu/resumed-history.json" 2>/dev/null
  else
    rrc=1
    echo "skipped: the GPU run failed" | tee "$out/train.resume.log"
  fi

  echo "== train: waiting for dattn-train (CPU) =="
  wait "$cpu_pid"
  crc=$?
  cpu_end=$(date +%s)
  grep -E '^(model|step:|eval step 300|done)' "$out/train.cpu.log" || tail -5 "$out/train.cpu.log"
  mkdir -p "$out/kjv-small-cpu"
  cp "$work/kjv-small-cpu"/{history.json,loss.svg,config.json} "$out/kjv-small-cpu/" 2>/dev/null
  last_cpu=$(grep -E '^step +[0-9]+/' "$out/train.cpu.log" | tail -1 | awk '{print $2}')
  if [ "$crc" -eq 124 ]; then
    cpu_note="stopped by CPU_TIMEOUT (${CPU_TIMEOUT:-360} s) at step $last_cpu; its curve is kept"
  else
    cpu_note="exit $crc"
  fi
  record train-cpu "$([ "$crc" -eq 0 ] && echo PASS || echo FAIL)" \
    "$cpu_note in $((cpu_end - cpu_start)) s, $cpu_threads threads; $(grep -E '^eval step 300' "$out/train.cpu.log" | cut -c1-80)"
  if [ -f "$out/kjv-small-gpu/history.json" ] && [ -f "$out/kjv-small-cpu/history.json" ]; then
    "$bin/plot_runs" --out "$out/kjv-small-gpu-vs-cpu.svg" \
      --title "LongNet on kjv.txt (bytes): dattn-train-gpu (H200, bf16) and dattn-train (CPU, fp32)" \
      "$out/kjv-small-gpu/history.json" "$out/kjv-small-cpu/history.json" >>"$out/train.cpu.log" 2>&1
  fi

  # The table of losses and the two bounded comparisons.
  python3 - "$out/kjv-small-gpu/history.json" "$out/kjv-small-cpu/history.json" \
    "$out/kjv-small-gpu/resumed-history.json" "$out/train.gpu.log" "$out/train.cpu.log" \
    >"$out/curves.txt" 2>&1 <<'PY'
import json, math, os, re, sys
gpu_path, cpu_path, resumed_path, gpu_log, cpu_log = sys.argv[1:6]
BOUND = 3e-2
def load(p):
    if not os.path.exists(p):
        return None
    with open(p) as f:
        h = json.load(f)
    return {"train": {s: l for s, l in h["train"]}, "evals": {e["step"]: e for e in h["evals"]}}
def rate(log):
    if not os.path.exists(log):
        return "-"
    rates = re.findall(r"  ([0-9.]+K?) tok/s  MFU ([0-9.]+)%", open(log).read())
    return "%s tok/s, MFU %s%% (last line)" % rates[-1] if rates else "-"
g, c, r = load(gpu_path), load(cpu_path), load(resumed_path)
def fmt(h, s):
    v = h["train"].get(s) if h else None
    return "%.4f" % v if isinstance(v, float) else "-"
print("| step | GPU bf16 loss | CPU fp32 loss | relative difference |")
print("|---|---|---|---|")
for s in (1, 25, 50, 100, 200, 300):
    gv = g["train"].get(s) if g else None
    cv = c["train"].get(s) if c else None
    d = "%.2e" % (abs(gv - cv) / cv) if isinstance(gv, float) and isinstance(cv, float) else "-"
    print("| %d | %s | %s | %s |" % (s, fmt(g, s), fmt(c, s), d))
print()
print("| eval step | GPU validation loss (bits/byte) | CPU validation loss (bits/byte) | GPU retrieval | CPU retrieval |")
print("|---|---|---|---|---|")
steps = sorted(set((g or {"evals": {}})["evals"]) | set((c or {"evals": {}})["evals"]))
def ev(h, s):
    e = h["evals"].get(s) if h else None
    if not e or e.get("loss") is None:
        return "-", "-"
    rt = e.get("retrieval")
    return ("%.4f (%.3f)" % (e["loss"], e["bits_per_byte"]),
            "%d/%d exact, %d/%d digits" % (rt["exact"], rt["examples"], rt["correct_tokens"],
                                             rt["answer_tokens"]) if rt else "-")
for s in steps:
    gl, gr = ev(g, s)
    cl, cr = ev(c, s)
    print("| %d | %s | %s | %s | %s |" % (s, gl, cl, gr, cr))
print()
ok = True
if g and c:
    diffs = [(abs(g["train"][s] - c["train"][s]) / c["train"][s], s) for s in range(1, 101)
             if isinstance(g["train"].get(s), float) and isinstance(c["train"].get(s), float)]
    if len(diffs) == 100:
        worst, at = max(diffs)
        ok = worst <= BOUND
        print("CURVE %s: steps 1-100, largest relative difference GPU vs CPU %.2e at step %d "
              "(bound %g)" % ("PASS" if ok else "FAIL", worst, at, BOUND))
    else:
        ok = False
        print("CURVE FAIL: only %d of steps 1-100 in both runs" % len(diffs))
else:
    ok = False
    print("CURVE FAIL: a run's history.json is missing")
if g and r:
    diffs = [(abs(r["train"][s] - g["train"][s]) / g["train"][s], s) for s in range(201, 301)
             if isinstance(r["train"].get(s), float) and isinstance(g["train"].get(s), float)]
    exact = all(r["train"].get(s) == g["train"].get(s) for s in range(201, 301))
    same_history = all(r["train"].get(s) == g["train"].get(s) for s in range(1, 201))
    if len(diffs) == 100 and same_history:
        worst, at = max(diffs)
        rok = worst <= BOUND
        print("RESUME %s: steps 201-300 of the resumed process vs the first, largest relative "
              "difference %.2e at step %d (bound %g)%s" % ("PASS" if rok else "FAIL", worst, at,
                                                          BOUND, ", bit-exact" if exact else ""))
    else:
        print("RESUME FAIL: %d of steps 201-300; steps 1-200 from the checkpoint %s"
              % (len(diffs), "intact" if same_history else "differ"))
else:
    print("RESUME FAIL: no resumed history")
print("RATE gpu: %s; cpu: %s" % (rate(gpu_log), rate(cpu_log)))
PY
  cat "$out/curves.txt"
  curve=$(grep -E '^CURVE' "$out/curves.txt")
  record curve "$([[ "$curve" == "CURVE PASS"* ]] && echo PASS || echo FAIL)" "${curve#CURVE * }"
  resume=$(grep -E '^RESUME' "$out/curves.txt")
  record resume-gpu "$([ "$rrc" -eq 0 ] && [[ "$resume" == "RESUME PASS"* ]] && echo PASS ||
    echo FAIL)" "${resume#RESUME * }"
fi

if have parity; then
  echo "== parity: model/testing/seed_parity.py =="
  ckpt_args=()
  [ -n "$gpu_ckpt" ] && ckpt_args=(--checkpoint "$gpu_ckpt")
  start=$(date +%s)
  PYTHONUNBUFFERED=1 timeout "${PARITY_TIMEOUT:-240}" python3 model/testing/seed_parity.py \
    "$dir/seed-lib" --dump "$bin/dump_logits_gpu" --data "$kjv" "${ckpt_args[@]}" \
    --work "$work/parity" >"$out/parity.log" 2>&1
  rc=$?
  end=$(date +%s)
  grep -vE '^\|' "$out/parity.log" | tail -30
  record parity "$([ "$rc" -eq 0 ] && echo PASS || echo FAIL)" \
    "exit $rc in $((end - start)) s$([ -z "$gpu_ckpt" ] && echo '; no trained checkpoint (seeded case only)')"
fi

echo
echo "================ gpu-train-check results ================"
[ -f "$out/curves.txt" ] && grep -E '^\|' "$out/curves.txt" && echo
[ -f "$out/parity.log" ] && grep -E '^\|' "$out/parity.log" && echo
echo "| step | result | detail |"
echo "|---|---|---|"
status=0
for k in "${order[@]}"; do
  echo "| $k | ${result[$k]} | ${detail[$k]} |"
  [ "${result[$k]}" = PASS ] || status=1
done
echo "logs and curves: $out"
rm -rf "$work"
exit $status
