#!/usr/bin/env bash
# Builds dattn's container images: dattn-coordinator, dattn-worker (CPU) and dattn-worker-gpu
# (CUDA runtime base), from the Bazel outputs of this checkout (docs/DEPLOY.md, "Images").
#
# Usage: deploy/images/build.sh [--registry PREFIX] [--tag TAG] [--builder podman|buildah|docker]
#                               [--push] [--stage-only DIR]
#   --registry  prefix of the image names (default "localhost/": dattn-coordinator becomes
#               localhost/dattn-coordinator, as the overlays name them)
#   --tag       image tag (default "dev", as the overlays name them)
#   --builder   the first of podman, buildah, docker found, unless given
#   --push      push the three images after building them
#   --stage-only DIR   build the binaries and stage the contexts in DIR; no image is built (what can
#               be done without a builder or without network access to the base images)
# The base images (docker.io/library/debian:bookworm-slim, docker.io/nvidia/cuda:...-cudnn-runtime)
# are pulled by the builder: it needs access to their registry.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

registry="localhost/"
tag="dev"
builder=""
push=0
stage_only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --registry) registry="${2:?--registry needs a value}"; shift 2 ;;
    --tag) tag="${2:?--tag needs a value}"; shift 2 ;;
    --builder) builder="${2:?--builder needs a value}"; shift 2 ;;
    --push) push=1; shift ;;
    --stage-only) stage_only="${2:?--stage-only needs a folder}"; shift 2 ;;
    *) echo "build.sh: unknown argument '$1' (see the header of deploy/images/build.sh)" >&2; exit 2 ;;
  esac
done
case "$registry" in */ | "") ;; *) registry="$registry/" ;; esac

if [ -z "$stage_only" ] && [ -z "$builder" ]; then
  for candidate in podman buildah docker; do
    if command -v "$candidate" >/dev/null 2>&1; then builder="$candidate"; break; fi
  done
  if [ -z "$builder" ]; then
    echo "build.sh: no image builder: install podman, buildah or docker.io (Debian packages), or" \
      "use --stage-only DIR" >&2
    exit 2
  fi
fi

bazel build //server:dattn-coordinator //worker:dattn-worker //worker:dattn-worker-gpu //client:dattn
bin_dir="$(mktemp -d)"
trap 'rm -rf "$bin_dir"' EXIT
bazel_bin="$(bazel info bazel-bin)"
for b in server/dattn-coordinator worker/dattn-worker worker/dattn-worker-gpu client/dattn; do
  cp "$bazel_bin/$b" "$bin_dir/"
done
contexts="${stage_only:-$(mktemp -d)}"
deploy/images/stage.sh "$bin_dir" "$contexts"
if [ -n "$stage_only" ]; then
  echo "build.sh: contexts staged in $contexts; build each with: podman build -t NAME $contexts/IMAGE"
  exit 0
fi

for image in coordinator worker worker-gpu; do
  name="${registry}dattn-${image}:${tag}"
  case "$builder" in
    buildah) buildah bud -f "$contexts/$image/Containerfile" -t "$name" "$contexts/$image" ;;
    *) "$builder" build -f "$contexts/$image/Containerfile" -t "$name" "$contexts/$image" ;;
  esac
  if [ "$push" = 1 ]; then "$builder" push "$name"; fi
  echo "build.sh: built $name"
done
rm -rf "$contexts"
