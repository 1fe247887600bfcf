# shellcheck shell=bash
# Sourced by the GPU scripts (scripts/gpu-check.sh, gpu-ring-check.sh, gpu-ring-engine-check.sh).
#
# wheel_lib_path SUBDIR...: the library folders nvidia/SUBDIR/lib of PyTorch's wheels that exist
# on this machine, each preceded by ':' (nothing where PyTorch is absent). The builds use cuDNN 9.19
# headers, which is the cuDNN those wheels carry; the system's libraries come after these.
wheel_lib_path() {
  local site d path=""
  site=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null ||
    true)
  [ -n "$site" ] || return 0
  for d in "$@"; do
    [ -d "$site/nvidia/$d/lib" ] && path="$path:$site/nvidia/$d/lib"
  done
  printf '%s' "$path"
}
