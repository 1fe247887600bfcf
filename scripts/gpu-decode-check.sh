#!/usr/bin/env bash
# GPU check of incremental decoding on one GPU (issue 18): the GPU decoder's tests against the CPU
# decoder, the CUDA model's tests (the decoder adds to it), and the decode benchmark, in one call.
# Builds nothing on the GPU machine.
#
#   scripts/gpu-decode-check.sh stage        (here, no GPU needed) build the binaries with Bazel
#                                            and pack them, with the CPU model's OpenBLAS, into
#                                            .device/decode.tar.xz (git-ignored)
#   scripts/gpu-decode-check.sh [run] [steps] (on the GPU machine, from the repo root, with
#                                            .device/decode.tar.xz carried) run them, a table
#                                            last
# steps: comma-separated subset of test,bench (default both). Environment: GTEST_FILTER (test),
# BENCH_ARGS (flags for cuda_decode_bench; default: its own, a 1M-token context and 32 streams),
# TEST_TIMEOUT, BENCH_TIMEOUT seconds (default 300 each), OUT (a folder for logs).
set -uo pipefail
cd "$(dirname "$0")/.."

dir=.device/decode
mode="${1:-run}"
if [ "$mode" = "stage" ]; then
  set -e
  bazel build //model/cuda:cuda_decoder_test //model/cuda:cuda_longnet_test \
    //bench/decode_bench:cuda_decode_bench
  rm -rf "$dir"
  mkdir -p "$dir/lib"
  cp -fL bazel-bin/model/cuda/cuda_decoder_test bazel-bin/model/cuda/cuda_longnet_test \
    bazel-bin/bench/decode_bench/cuda_decode_bench "$dir/"
  chmod u+w "$dir"/*
  strip --strip-debug "$dir"/cuda_decoder_test "$dir"/cuda_longnet_test "$dir"/cuda_decode_bench
  for lib in libopenblas.so.0 libgfortran.so.5 libquadmath.so.0 libatomic.so.1; do
    cp -fL "/usr/lib/x86_64-linux-gnu/$lib" "$dir/lib/"
  done
  # One compressed archive (a device call carries 64 MiB at most): unpacked by run.
  tar -cJf "$dir.tar.xz" -C .device decode
  rm -rf "$dir"
  ls -la "$dir.tar.xz"
  exit 0
fi
[ "$mode" = "run" ] && shift || true
steps="${1:-test,bench}"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
have() { [[ ",$steps," == *",$1,"* ]]; }

if [ -f "$dir.tar.xz" ] && [ ! -d "$dir" ]; then tar -xJf "$dir.tar.xz" -C .device; fi
. scripts/gpu-libs.sh
libs=$(wheel_lib_path cudnn cu13 cublas)
export LD_LIBRARY_PATH="${libs#:}:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}:$PWD/$dir/lib"
{
  echo "== environment =="
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -3
} | tee "$out/env.log"

declare -A result
test_summary="not run"
if have test; then
  echo "== test: cuda_decoder_test, then cuda_longnet_test =="
  start=$(date +%s)
  rc=0
  timeout "${TEST_TIMEOUT:-300}" "$dir/cuda_decoder_test" --gtest_filter="${GTEST_FILTER:-*}" \
    >"$out/test.decoder.log" 2>&1 || rc=$?
  timeout "${TEST_TIMEOUT:-300}" "$dir/cuda_longnet_test" --gtest_filter="${GTEST_FILTER:-*}" \
    >"$out/test.model.log" 2>&1 || rc=$?
  end=$(date +%s)
  cat "$out"/test.decoder.log "$out"/test.model.log >"$out/test.log"
  passed=$(grep -c '^\[       OK \]' "$out/test.log" || true)
  failed=$(grep -c '^\[  FAILED  \] .*(' "$out/test.log" || true)
  skipped=$(grep -c '^\[  SKIPPED \] .*(' "$out/test.log" || true)
  grep -E '^\[ parity \]' "$out/test.decoder.log" || true
  grep -B3 -A15 '^\[  FAILED  \] .*(' "$out/test.log" | grep -vE '^\[ RUN' | head -120 || true
  test_summary="$passed passed, $failed failed, $skipped skipped in $((end - start)) s (exit $rc)"
  if [ "$rc" -eq 0 ] && [ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]; then
    result[test]=PASS
  else
    result[test]=FAIL
  fi
fi

if have bench; then
  echo "== bench: cuda_decode_bench ${BENCH_ARGS:-} =="
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
  timeout "${BENCH_TIMEOUT:-300}" "$dir/cuda_decode_bench" ${BENCH_ARGS:-} >"$out/bench.log" 2>&1
  rc=$?
  grep -vE '^\|' "$out/bench.log" | tail -20
  [ "$rc" -eq 0 ] && result[bench]=PASS || result[bench]="FAIL (exit $rc)"
fi

echo
echo "================ gpu-decode-check results ================"
[ -f "$out/bench.log" ] && grep -E '^(==|copy|\|)' "$out/bench.log"
echo
echo "| step | result | detail |"
echo "|---|---|---|"
have test && echo "| test | ${result[test]} | $test_summary |"
have bench && echo "| bench | ${result[bench]} | $out/bench.log |"
for k in "${!result[@]}"; do
  [[ "${result[$k]}" == PASS ]] || exit 1
done
exit 0
