#!/usr/bin/env bash
# deploy:images_test: the three image contexts stage from the built binaries (images/stage.sh),
# each Containerfile copies only what its context holds, runs as the non-root user 65532:65532,
# enters through a binary it copied; and each binary starts (--help) in a root file system that
# holds nothing but its context at the Containerfile's paths and what the base image provides
# (glibc, the C++ runtime; for the GPU image also the CUDA libraries) and a /proc, as a container
# has, with the Containerfile's LD_LIBRARY_PATH: a library missing from the context fails here. The images themselves are not
# built: no registry with the base images is reachable from this machine (docs/DEPLOY.md).
# tests/deploy_manifests_test checks that the manifests agree with the Containerfiles.
set -uo pipefail
cd "${TEST_SRCDIR:?run under bazel test}/${TEST_WORKSPACE:?}"
fail() { echo "FAIL: $*"; exit 1; }
tmp="${TEST_TMPDIR:?}"

mkdir -p "$tmp/bin"
for b in server/dattn-coordinator worker/dattn-worker worker/dattn-worker-gpu client/dattn; do
  cp "$b" "$tmp/bin/" || fail "missing $b"
done
deploy/images/stage.sh "$tmp/bin" "$tmp/contexts" || fail "stage.sh failed"

# The root file system a base image gives: the dynamic loader, glibc and the C++ runtime, as this
# machine has them (Debian 12, the coordinator's and CPU worker's base), and for the GPU image the
# CUDA libraries the binary loads (from its base, nvidia/cuda ...-cudnn-runtime).
base_root() {
  local root="$1" gpu_binary="${2:-}"
  mkdir -p "$root/lib64" "$root/lib/x86_64-linux-gnu" "$root/usr/local/cuda/lib64" "$root/proc"
  cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib64/"
  for lib in libc.so.6 libm.so.6 libdl.so.2 librt.so.1 libpthread.so.0 libstdc++.so.6 \
             libgcc_s.so.1; do
    cp -L "/lib/x86_64-linux-gnu/$lib" "$root/lib/x86_64-linux-gnu/" || fail "no $lib here"
  done
  if [ -n "$gpu_binary" ]; then
    ldd "$gpu_binary" | awk '$1 ~ /^lib(cudnn|cublas|nccl|nvrtc)/ && $3 ~ /^\// {print $3}' |
      while read -r path; do cp -L "$path" "$root/usr/local/cuda/lib64/"; done
  fi
}

for image in coordinator worker worker-gpu; do
  context="$tmp/contexts/$image"
  file="$context/Containerfile"
  [ -f "$file" ] || fail "$image: no Containerfile staged"
  # COPY lines: every source is in the context.
  while read -r _ args; do
    set -- $args
    dest="${*: -1}"
    for src in "${@:1:$#-1}"; do
      [ -e "$context/$src" ] || fail "$image: COPY $src: not in the context"
    done
  done < <(grep '^COPY ' "$file")
  grep -qx 'USER 65532:65532' "$file" || fail "$image: not USER 65532:65532"
  entry="$(sed -n 's/^ENTRYPOINT \["\([^"]*\)"\]$/\1/p' "$file")"
  [ -n "$entry" ] || fail "$image: no ENTRYPOINT [\"/path\"]"
  binary="$(basename "$entry")"
  [ -x "$context/bin/$binary" ] || fail "$image: ENTRYPOINT $entry is not a staged binary"
  grep -q "^COPY .*bin/$binary .*$(dirname "$entry")/\$" "$file" ||
    fail "$image: ENTRYPOINT $entry is not where COPY puts bin/$binary"
  library_path="$(sed -n 's/^ENV LD_LIBRARY_PATH=\([^$]*\).*/\1/p' "$file" | cut -d: -f1)"
  [ "$library_path" = /usr/local/lib/dattn ] || fail "$image: LD_LIBRARY_PATH does not start at lib/"

  # Start each binary in a root with only the context and the base's libraries.
  root="$tmp/root-$image"
  if [ "$image" = worker-gpu ]; then base_root "$root" "$context/bin/$binary"; else base_root "$root"; fi
  mkdir -p "$root/usr/local/bin" "$root/usr/local/lib/dattn"
  cp "$context"/bin/* "$root/usr/local/bin/"
  cp "$context"/lib/* "$root/usr/local/lib/dattn/"
  for b in "$context"/bin/*; do
    name="$(basename "$b")"
    out="$(env -i LD_LIBRARY_PATH=/usr/local/lib/dattn:/usr/local/cuda/lib64 \
      "$(command -v unshare)" --user --map-root-user --mount --pid --fork --mount-proc=/proc \
      --root="$root" "/usr/local/bin/$name" --help 2>&1)" ||
      fail "$image: $name does not start with only its context and the base image:"$'\n'"$out"
  done
  echo "$image: $(ls "$context/bin" | tr '\n' ' ')start with $(ls "$context/lib" | wc -l) staged libraries"
done
echo "PASS"
