#!/usr/bin/env bash
# The two trainer binaries as built: dattn-train links no CUDA (no CUDA symbol, no CUDA library)
# and refuses --device cuda naming dattn-train-gpu; dattn-train-gpu has the "cuda" device (in
# --help and in its config check), trains on the CPU like dattn-train, and without a GPU refuses
# --device cuda with exit 1 and the CUDA runtime's reason; plot_runs draws both runs' history.json
# on one SVG. The GPU runs are scripts/gpu-train-check.sh's.
set -uo pipefail
root="$TEST_SRCDIR/$TEST_WORKSPACE"
cpu="$root/trainer/dattn-train"
gpu="$root/trainer/dattn-train-gpu"
kjv="$root/model/kjv.txt"
dir="$TEST_TMPDIR/binaries"
rm -rf "$dir"
mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }

# No CUDA in the CPU binary: neither a CUDA runtime symbol nor a CUDA library.
# (Through files: with pipefail, grep -q ending a pipe early would fail the pipe.)
nm "$cpu" > "$dir/cpu.nm" || fail "nm dattn-train"
nm "$gpu" > "$dir/gpu.nm" || fail "nm dattn-train-gpu"
ldd "$cpu" > "$dir/cpu.ldd" || fail "ldd dattn-train"
if grep -E ' (cudaMalloc|cudaLaunchKernel|cublasLtCreate)$' "$dir/cpu.nm"; then
  fail "dattn-train holds CUDA symbols"
fi
if grep -iE 'cuda|cublas|cudnn' "$dir/cpu.ldd"; then fail "dattn-train links CUDA libraries"; fi
grep -qE ' cudaMalloc$' "$dir/gpu.nm" || fail "dattn-train-gpu holds no CUDA runtime"

"$gpu" --help > "$dir/help.txt" 2>&1 || fail "dattn-train-gpu --help: $(cat "$dir/help.txt")"
grep -q 'Devices in this build: cpu, cuda' "$dir/help.txt" || fail "help: $(head -3 "$dir/help.txt")"
"$cpu" --help > "$dir/help_cpu.txt" 2>&1
grep -q 'Devices in this build: cpu\.' "$dir/help_cpu.txt" ||
  fail "cpu help: $(head -3 "$dir/help_cpu.txt")"

cat > "$dir/model.json" <<'JSON'
{"d_model": 32, "num_layers": 1, "num_heads": 2, "ffn_dim": 64,
 "attention": {"segment_lengths": [64], "dilation_rates": [1]}}
JSON
common=(--data "$kjv" --model-config "$dir/model.json" --seq-len 64 --batch-size 2 --threads 1
        --peak-flops 1e11 --eval-every 0 --steps 2 --warmup 1)

"$cpu" "${common[@]}" --out "$dir/cpu_cuda" --device cuda > "$dir/out.txt" 2> "$dir/err.txt"
code=$?
[ "$code" -eq 2 ] || fail "dattn-train --device cuda: exit $code, want 2"
grep -q '"cuda" is not available in this build (cpu).*dattn-train-gpu' "$dir/err.txt" ||
  fail "dattn-train --device cuda said: $(cat "$dir/err.txt")"

# The GPU build trains on the CPU too.
"$gpu" "${common[@]}" --out "$dir/gpu_cpu" --device cpu > "$dir/out.txt" 2>&1 ||
  fail "dattn-train-gpu --device cpu: $(cat "$dir/out.txt")"
grep -q '^step 2/2 ' "$dir/out.txt" || fail "no last step: $(cat "$dir/out.txt")"
grep -q '"program": "dattn-train-gpu"' "$dir/gpu_cpu/history.json" || fail "history.json"

# plot_runs: this run and a dattn-train run of the same config on one SVG, named by device.
"$cpu" "${common[@]}" --out "$dir/cpu_cpu" > "$dir/out.txt" 2>&1 ||
  fail "dattn-train: $(cat "$dir/out.txt")"
plot="$root/trainer/plot_runs"
"$plot" --out "$dir/both.svg" --title "two <runs>" "$dir/gpu_cpu/history.json" \
  "$dir/cpu_cpu/history.json" > "$dir/out.txt" 2>&1 || fail "plot_runs: $(cat "$dir/out.txt")"
grep -q '>two &lt;runs&gt;</text>' "$dir/both.svg" || fail "plot_runs: no title"
[ "$(grep -c '<g class="train' "$dir/both.svg")" -eq 2 ] || fail "plot_runs: not two runs"
grep -q '>cpu: cpu fp32, 1 thread: training (2 steps)</text>' "$dir/both.svg" ||
  fail "plot_runs: no labels in $(grep legend -A4 "$dir/both.svg")"
"$plot" --out "$dir/bad.svg" "$dir/model.json" > "$dir/out.txt" 2>&1
code=$?
[ "$code" -eq 2 ] && grep -q "model.json is not a dattn-train history.json" "$dir/out.txt" ||
  fail "plot_runs on a model config: exit $code: $(cat "$dir/out.txt")"
[ ! -e "$dir/bad.svg" ] || fail "plot_runs wrote bad.svg"

# --device cuda is accepted by its config check; without a GPU the model cannot be made.
if nvidia-smi -L > /dev/null 2>&1; then
  echo "a GPU is present: the run without one is not checked here"
else
  "$gpu" "${common[@]}" --out "$dir/gpu_cuda" --device cuda > "$dir/out.txt" 2> "$dir/err.txt"
  code=$?
  [ "$code" -eq 1 ] || fail "dattn-train-gpu --device cuda without a GPU: exit $code, want 1"
  grep -q 'dattn-train-gpu: error: no CUDA device' "$dir/err.txt" ||
    fail "dattn-train-gpu --device cuda without a GPU said: $(cat "$dir/err.txt")"
fi
echo "PASS"
