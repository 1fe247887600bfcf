#!/usr/bin/env bash
# GPU check of training on several GPUs (model/cuda/cuda_distributed_test: the NCCL collective, the
# CUDA model's attention factory, the ring's sequence-parallel step, D x S training through the
# trainer), in one call. Builds nothing on the GPU machine.
#
#   scripts/gpu-train-dist-check.sh stage   (here, no GPU needed) build the test and pack it with
#                                           OpenBLAS and its runtime, which the GPU image lacks,
#                                           into .device/train_dist/bundle.tar.xz (git-ignored)
#   scripts/gpu-train-dist-check.sh [run]   (on the GPU machine, from the repo root, with
#                                           .device/train_dist carried) run it; a summary comes last
#
# The test uses every GPU it sees (CUDA_VISIBLE_DEVICES narrows them): one GPU runs the one-GPU
# tests, 2 the collective, the ring's step at S = 2 and the 2x1 (and 1x2) runs, 4 also S = 4 and
# 4x1, 2x2, 1x4; the multi-GPU tests skip, saying why, with fewer. It needs no data file (its corpus
# is generated). Environment: GTEST_FILTER, TEST_TIMEOUT (seconds, default 300), OUT (a folder for
# the log; a temporary one otherwise). Libraries: cuDNN, NVRTC, cuBLASLt and NCCL from PyTorch's
# wheels when present, else the machine's CUDA libraries (scripts/gpu-libs.sh). NVLink multicast
# stays off.
set -uo pipefail
cd "$(dirname "$0")/.."

dir=.device/train_dist
mode="${1:-run}"
if [ "$mode" = "stage" ]; then
  set -e
  bazel build //model/cuda:cuda_distributed_test 2>&1 | tail -2
  rm -rf "$dir"
  mkdir -p "$dir/bin" "$dir/lib"
  cp -fL bazel-bin/model/cuda/cuda_distributed_test "$dir/bin/"
  chmod -R u+w "$dir"
  strip --strip-debug "$dir/bin/cuda_distributed_test"
  for lib in libopenblas.so.0 libgfortran.so.5 libquadmath.so.0 libatomic.so.1; do
    cp -fL "/usr/lib/x86_64-linux-gnu/$lib" "$dir/lib/"
  done
  # One archive (58 MB unpacked; the device tool carries at most 64 MiB).
  tar -cJf "$dir/bundle.tar.xz" -C "$dir" bin lib
  rm -rf "${dir:?}/bin" "${dir:?}/lib"
  du -sh "$dir"
  exit 0
fi
[ "$mode" = "run" ] || {
  echo "usage: scripts/gpu-train-dist-check.sh stage|run" >&2
  exit 2
}
[ -f "$dir/bundle.tar.xz" ] || {
  echo "no $dir/bundle.tar.xz: run scripts/gpu-train-dist-check.sh stage first" >&2
  exit 2
}
[ -d "$dir/bin" ] || tar -xJf "$dir/bundle.tar.xz" -C "$dir"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export NVSHMEM_DISABLE_NVLS=1
. scripts/gpu-libs.sh
libs=$(wheel_lib_path cudnn nccl cuda_nvrtc cu13 cublas)
export LD_LIBRARY_PATH="${libs#:}:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}:$PWD/$dir/lib"
{
  echo "== environment =="
  date -u
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>&1 | head -9
  ldd "$dir/bin/cuda_distributed_test" 2>&1 | grep -E "cudnn|cublas|nccl|openblas|not found" || true
} | tee "$out/env.log"
echo "== cuda_distributed_test =="
start=$(date +%s)
TEST_TMPDIR="$(mktemp -d)" timeout "${TEST_TIMEOUT:-300}" "$dir/bin/cuda_distributed_test" \
  --gtest_filter="${GTEST_FILTER:-*}" >"$out/test.log" 2>&1
rc=$?
end=$(date +%s)
passed=$(grep -c '^\[       OK \]' "$out/test.log" || true)
failed=$(grep -c '^\[  FAILED  \] .*(' "$out/test.log" || true)
skipped=$(grep -c '^\[  SKIPPED \] .*(' "$out/test.log" || true)
grep -B3 -A25 '^\[  FAILED  \] .*(' "$out/test.log" | grep -vE '^\[ RUN' | head -150 || true
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  # Killed (a signal, the timeout) inside a test: its last lines say where.
  echo "== the test binary ended with status $rc; the last lines of its log =="
  tail -n 40 "$out/test.log"
fi
echo
echo "================ gpu-train-dist-check results ================"
grep -E '^\[ parity \]|^\[ skipped  \]|Skipped|^needs' "$out/test.log" || true
echo "$passed passed, $failed failed, $skipped skipped in $((end - start)) s (exit $rc); log $out/test.log"
[ "$rc" -eq 0 ] && [ "$failed" -eq 0 ]
