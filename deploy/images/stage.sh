#!/usr/bin/env bash
# Stages the build contexts of dattn's three images from built binaries: OUT_DIR/IMAGE/ holds the
# image's Containerfile, bin/ (its binaries, debug info stripped) and lib/ (every shared library
# they load that the base image lacks: not glibc's, not the C++ runtime, not CUDA's, which the GPU
# image's base provides). build.sh runs it on Bazel's outputs; deploy tests run it on theirs.
#
# Usage: deploy/images/stage.sh BIN_DIR OUT_DIR
#   BIN_DIR holds dattn-coordinator, dattn-worker, dattn-worker-gpu and dattn.
# Exit status: 0 when staged; 1 naming a binary that is missing or a library that cannot be found.
set -euo pipefail
bin_dir="${1:?usage: stage.sh BIN_DIR OUT_DIR}"
out="${2:?usage: stage.sh BIN_DIR OUT_DIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# image -> the binaries in it (the CLI in every image, for `kubectl exec` with the CA and a
# token).
declare -A binaries=(
  [coordinator]="dattn-coordinator dattn"
  [worker]="dattn-worker dattn"
  [worker-gpu]="dattn-worker-gpu dattn"
)
for image in coordinator worker worker-gpu; do
  context="$out/$image"
  rm -rf "$context"
  mkdir -p "$context/bin" "$context/lib"
  cp "$here/$image.Containerfile" "$context/Containerfile"
  for b in ${binaries[$image]}; do
    [ -x "$bin_dir/$b" ] || { echo "stage.sh: $bin_dir/$b is missing" >&2; exit 1; }
    strip --strip-debug -o "$context/bin/$b" "$bin_dir/$b"
    # The libraries it loads, as this machine resolves them.
    while read -r name arrow path _; do
      case "$name" in
        libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | *ld-linux* | linux-vdso*) ;;
        libstdc++.so* | libgcc_s.so*) ;;
        libcuda.so* | libcudart* | libcudnn* | libcublas* | libnccl.so* | libnvrtc*) ;;
        *)
          if [ "$arrow" != "=>" ] || [ ! -f "$path" ]; then
            echo "stage.sh: $b needs $name, which this machine does not resolve" >&2
            exit 1
          fi
          cp -fL "$path" "$context/lib/"
          ;;
      esac
    done < <(ldd "$context/bin/$b" | sed 's/^[[:space:]]*//')
  done
  chmod -R u+w "$context"
  echo "stage.sh: $image: $(du -sh "$context" | cut -f1) in $context"
done
