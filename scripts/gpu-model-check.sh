#!/usr/bin/env bash
# GPU check of the LongNet model on one GPU (issue 15): the model's GPU tests, the training-step
# benchmark and the PyTorch reference built from the seed library's layers, in one call. Builds
# nothing on the GPU machine.
#
#   scripts/gpu-model-check.sh stage SEED_LIB   (here, no GPU needed) build the test and benchmark
#                                    binaries with Bazel and copy them into .device/model/
#                                    (git-ignored), with the CPU model's OpenBLAS and a copy of the
#                                    seed library (SEED_LIB: the folder holding the
#                                    dilated_attention_pytorch package; never committed)
#   scripts/gpu-model-check.sh [run] [steps]    (on the GPU machine, from the repo root, with
#                                    .device/model carried) run them and print a table last.
# With BUNDLE=folder, stage also copies this script, gpu-libs.sh, torch_reference.py and
# .device/model into that folder as a small tree of its own (for a device call made from another
# checkout than this one: carry the folder and run folder/scripts/gpu-model-check.sh there).
#
# steps: comma-separated subset of test,bench,ref (default: all three). Environment: GTEST_FILTER
# (test step), BENCH_ARGS (flags for model_bench; default --kernels --longest), REF_ARGS (flags
# for torch_reference.py), TEST_TIMEOUT, BENCH_TIMEOUT, REF_TIMEOUT seconds (default 300 each),
# OUT (a folder for logs; a temporary one otherwise). cuDNN, cuBLASLt: PyTorch's wheels if
# present, else the system's CUDA.
set -uo pipefail
cd "$(dirname "$0")/.."

dir=.device/model
mode="${1:-run}"
if [ "$mode" = "stage" ]; then
  set -e
  seed="${2:?usage: scripts/gpu-model-check.sh stage SEED_LIB_PATH}"
  [ -d "$seed/dilated_attention_pytorch" ] || {
    echo "$seed holds no dilated_attention_pytorch package" >&2
    exit 2
  }
  bazel build //model/cuda:model_kernels_test //model/cuda:cuda_adamw_test \
    //model/cuda:cuda_longnet_test //bench/model_bench:model_bench
  rm -rf "$dir"
  mkdir -p "$dir/lib"
  cp -fL bazel-bin/model/cuda/model_kernels_test bazel-bin/model/cuda/cuda_adamw_test \
    bazel-bin/model/cuda/cuda_longnet_test bazel-bin/bench/model_bench/model_bench "$dir/"
  chmod u+w "$dir"/*
  strip --strip-debug "$dir"/model_kernels_test "$dir"/cuda_adamw_test "$dir"/cuda_longnet_test \
    "$dir"/model_bench
  # The CPU model's OpenBLAS (and its Fortran runtime), which the GPU image lacks.
  for lib in libopenblas.so.0 libgfortran.so.5 libquadmath.so.0 libatomic.so.1; do
    cp -fL "/usr/lib/x86_64-linux-gnu/$lib" "$dir/lib/"
  done
  tar -cJf "$dir/lib.tar.xz" -C "$dir" lib
  rm -rf "$dir/lib"
  mkdir -p "$dir/seed-lib"
  cp -r "$seed/dilated_attention_pytorch" "$dir/seed-lib/"
  find "$dir/seed-lib" -name __pycache__ -prune -exec rm -rf {} +
  chmod -R u+w "$dir"
  if [ -n "${BUNDLE:-}" ]; then
    rm -rf "$BUNDLE"
    mkdir -p "$BUNDLE/scripts" "$BUNDLE/bench/model_bench" "$BUNDLE/.device"
    cp scripts/gpu-model-check.sh scripts/gpu-libs.sh "$BUNDLE/scripts/"
    cp bench/model_bench/torch_reference.py "$BUNDLE/bench/model_bench/"
    cp -r "$dir" "$BUNDLE/.device/"
    du -sh "$BUNDLE"
  fi
  du -sh "$dir"
  ls -la "$dir"
  exit 0
fi
[ "$mode" = "run" ] && shift || true
steps="${1:-test,bench,ref}"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
have() { [[ ",$steps," == *",$1,"* ]]; }

if [ -f "$dir/lib.tar.xz" ] && [ ! -d "$dir/lib" ]; then tar -xJf "$dir/lib.tar.xz" -C "$dir"; fi
. scripts/gpu-libs.sh
libs=$(wheel_lib_path cudnn nccl cuda_nvrtc cu13 cublas)
export LD_LIBRARY_PATH="${libs#:}:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}:$PWD/$dir/lib"

{
  echo "== environment =="
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 |
    head -3
  ldd "$dir/cuda_longnet_test" 2>&1 | grep -E "cudnn|cublas|openblas|not found" || true
} | tee "$out/env.log"

declare -A result
test_summary="not run"
if have test; then
  echo "== test: model_kernels_test, cuda_adamw_test (together), then cuda_longnet_test =="
  start=$(date +%s)
  rc=0
  timeout "${TEST_TIMEOUT:-300}" "$dir/model_kernels_test" --gtest_filter="${GTEST_FILTER:-*}" \
    >"$out/test.kernels.log" 2>&1 &
  p1=$!
  timeout "${TEST_TIMEOUT:-300}" "$dir/cuda_adamw_test" --gtest_filter="${GTEST_FILTER:-*}" \
    >"$out/test.adamw.log" 2>&1 &
  p2=$!
  wait $p1 || rc=$?
  wait $p2 || rc=$?
  # Alone on the GPU: its memory test reads the device's free memory.
  timeout "${TEST_TIMEOUT:-300}" "$dir/cuda_longnet_test" --gtest_filter="${GTEST_FILTER:-*}" \
    >"$out/test.model.log" 2>&1 || rc=$?
  end=$(date +%s)
  cat "$out"/test.kernels.log "$out"/test.adamw.log "$out"/test.model.log >"$out/test.log"
  passed=$(grep -c '^\[       OK \]' "$out/test.log" || true)
  failed=$(grep -c '^\[  FAILED  \] .*(' "$out/test.log" || true)
  skipped=$(grep -c '^\[  SKIPPED \] .*(' "$out/test.log" || true)
  grep -E '^\[ (parity|planner) \]' "$out/test.log" || true
  grep -B3 -A15 '^\[  FAILED  \] .*(' "$out/test.log" | grep -vE '^\[ RUN' | head -120 || true
  test_summary="$passed passed, $failed failed, $skipped skipped in $((end - start)) s (exit $rc)"
  if [ "$rc" -eq 0 ] && [ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]; then
    result[test]=PASS
  else
    result[test]=FAIL
  fi
fi

if have bench; then
  echo "== bench: model_bench ${BENCH_ARGS:---kernels --longest} =="
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
  timeout "${BENCH_TIMEOUT:-300}" "$dir/model_bench" ${BENCH_ARGS:---kernels --longest} \
    --csv="$out/bench.csv" >"$out/bench.log" 2>&1
  rc=$?
  grep -vE '^\|' "$out/bench.log" | tail -40
  [ "$rc" -eq 0 ] && result[bench]=PASS || result[bench]="FAIL (exit $rc)"
fi

if have ref; then
  echo "== ref: bench/model_bench/torch_reference.py =="
  # shellcheck disable=SC2086  # REF_ARGS is a list of flags
  PYTHONUNBUFFERED=1 timeout "${REF_TIMEOUT:-300}" python3 bench/model_bench/torch_reference.py \
    "$dir/seed-lib" --ours "$out/bench.csv" ${REF_ARGS:-} >"$out/reference.log" 2>&1
  rc=$?
  grep -vE '^\|' "$out/reference.log" | grep -E '^torch' | tail -12
  [ "$rc" -eq 0 ] && result[ref]=PASS || result[ref]="FAIL (exit $rc)"
fi

echo
echo "================ gpu-model-check results ================"
[ -f "$out/bench.log" ] && grep -E '^(=|ceilings|\|)' "$out/bench.log"
[ -f "$out/reference.log" ] && grep -E '^\|' "$out/reference.log"
echo
echo "| step | result | detail |"
echo "|---|---|---|"
have test && echo "| test | ${result[test]} | $test_summary |"
have bench && echo "| bench | ${result[bench]} | $out/bench.log |"
have ref && echo "| ref | ${result[ref]} | $out/reference.log |"
for k in "${!result[@]}"; do
  [[ "${result[$k]}" == PASS ]] || exit 1
done
exit 0
