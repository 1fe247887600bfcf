#!/usr/bin/env bash
# Puts dattn on your PATH: builds the binaries with Bazel (a no-op when they are up to date) and
# installs dattn, dattn-coordinator, dattn-worker and dattn-worker-gpu into PREFIX/bin.
#
#   scripts/install.sh                  install into ~/.local/bin (PREFIX ~/.local)
#   scripts/install.sh --prefix DIR     install into DIR/bin (created if missing)
#   scripts/install.sh --no-build       install what bazel-bin already holds; build nothing
#   scripts/install.sh --no-gpu         leave out dattn-worker-gpu (its CUDA build takes longest)
#   scripts/install.sh --from DIR       install the binaries of DIR, laid out like bazel-bin
#                                       (DIR/client/dattn, DIR/server/dattn-coordinator, ...);
#                                       build nothing
#
# Idempotent: a binary already installed and identical is left as it is; a changed one is replaced
# atomically (copied beside it, then renamed over it), so a daemon running from the old file keeps
# running. dattn-worker-gpu needs the CUDA toolkit (/usr/local/cuda) to build; without it the other
# three are installed and the script says so. Exit codes: 0 installed (or already up to date),
# 1 the build or a copy failed, 2 bad arguments.
set -euo pipefail
here=$PWD
cd "$(dirname "$0")/.."

usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; }

prefix=""
build=1
gpu=1
from=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] && [ -n "$2" ] || { echo "install.sh: --prefix needs a directory" >&2; exit 2; }
              prefix="$2"; shift 2 ;;
    --prefix=*) prefix="${1#--prefix=}"; shift
                [ -n "$prefix" ] || { echo "install.sh: --prefix needs a directory" >&2; exit 2; } ;;
    --no-build) build=0; shift ;;
    --no-gpu) gpu=0; shift ;;
    --from) [ $# -ge 2 ] && [ -n "$2" ] || { echo "install.sh: --from needs a directory" >&2; exit 2; }
            from="$2"; build=0; shift 2 ;;
    --from=*) from="${1#--from=}"; build=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

# workspace path -> installed name
targets=(client/dattn server/dattn-coordinator worker/dattn-worker)
if [ "$gpu" = 1 ]; then
  targets+=(worker/dattn-worker-gpu)
  if [ -z "$from" ] && [ "$build" = 1 ] && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    echo "install.sh: no CUDA toolkit in /usr/local/cuda: dattn-worker-gpu is left out" >&2
    targets=(client/dattn server/dattn-coordinator worker/dattn-worker)
  fi
fi

if [ "$build" = 1 ]; then
  labels=()
  for t in "${targets[@]}"; do labels+=("//${t%/*}:${t##*/}"); done
  echo "install.sh: bazel build ${labels[*]}"
  if ! log=$(bazel build "${labels[@]}" 2>&1); then
    echo "$log" >&2
    echo "install.sh: the build failed (output above); nothing was installed" >&2
    exit 1
  fi
fi
if [ -z "$prefix" ]; then
  [ -n "${HOME:-}" ] || { echo "install.sh: HOME is not set: give --prefix DIR" >&2; exit 2; }
  prefix="$HOME/.local"
fi
# Relative paths are the caller's, not the repository's.
case "$prefix" in /*) ;; *) prefix="$here/$prefix" ;; esac
if [ -n "$from" ]; then case "$from" in /*) ;; *) from="$here/$from" ;; esac; fi
src_root=${from:-bazel-bin}

bin="$prefix/bin"
mkdir -p "$bin"
installed=0
for t in "${targets[@]}"; do
  name=${t##*/}
  src="$src_root/$t"
  if [ ! -f "$src" ]; then
    if [ "$name" = dattn-worker-gpu ]; then
      echo "install.sh: skipped $name: not built (it needs the CUDA toolkit in /usr/local/cuda)" >&2
      continue
    fi
    echo "install.sh: $src is missing: build it (scripts/install.sh without --no-build/--from)" >&2
    exit 1
  fi
  dest="$bin/$name"
  if [ -f "$dest" ] && cmp -s "$src" "$dest"; then
    echo "  $dest (unchanged)"
    continue
  fi
  tmp=$(mktemp "$bin/.$name.XXXXXX")
  if ! install -m 0755 "$src" "$tmp" || ! mv -f "$tmp" "$dest"; then
    rm -f "$tmp"
    echo "install.sh: cannot install $dest" >&2
    exit 1
  fi
  echo "  $dest"
  installed=$((installed + 1))
done
echo "install.sh: $installed binaries installed or updated in $bin"

case ":$PATH:" in
  *":$bin:"*) ;;
  *) echo "install.sh: $bin is not on your PATH; add it, e.g. in ~/.bashrc:"
     echo "  export PATH=\"$bin:\$PATH\"" ;;
esac
