#!/usr/bin/env bash
# Renders every overlay under deploy/kubernetes/overlays with `kubectl kustomize` into OUT_DIR:
# OUT_DIR/OVERLAY.yaml (the objects) and OUT_DIR/OVERLAY.stderr (kubectl's warnings). The tree is
# copied first, links resolved: kustomize refuses files that resolve outside a kustomization's
# folder, which Bazel's runfiles (links into the source tree) would be.
#
# Usage: deploy/render.sh OUT_DIR   (from the repository root or a Bazel runfiles tree)
# Exit status: 0 when every overlay rendered; 1 naming the overlay that did not; 2 without kubectl.
set -euo pipefail
out="${1:?usage: deploy/render.sh OUT_DIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
kubectl="$(command -v kubectl || true)"
if [ -z "$kubectl" ]; then
  echo "render.sh: kubectl not found: install Debian's kubernetes-client (scripts/setup.sh)" >&2
  exit 2
fi
mkdir -p "$out"
tree="$(mktemp -d)"
trap 'rm -rf "$tree"' EXIT
for part in kubernetes prometheus grafana; do cp -rL "$here/$part" "$tree/$part"; done
status=0
for overlay in "$tree"/kubernetes/overlays/*/; do
  name="$(basename "$overlay")"
  if "$kubectl" kustomize "$overlay" >"$out/$name.yaml" 2>"$out/$name.stderr"; then
    echo "render.sh: $name: $(grep -c '^kind:' "$out/$name.yaml") objects"
  else
    echo "render.sh: $name does not render:" >&2
    cat "$out/$name.stderr" >&2
    status=1
  fi
done
exit "$status"
