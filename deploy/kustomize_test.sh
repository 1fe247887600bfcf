#!/usr/bin/env bash
# deploy:kustomize_test: every overlay under deploy/kubernetes/overlays renders with
# `kubectl kustomize` (render.sh), and every object rendered is valid for the Kubernetes API
# schemas, offline (validate/validate.js on the kubernetes-models npm packages that
# scripts/setup.sh installs into ~/.cache/dattn/npm/HASH, HASH from validate/package-lock.json).
# First it shows that the validator rejects what it must (a string port, a missing container name,
# an unknown kind), so that a validator that accepts everything cannot pass this test.
set -uo pipefail
cd "${TEST_SRCDIR:?run under bazel test}/${TEST_WORKSPACE:?}"
fail() { echo "FAIL: $*"; exit 1; }

home="$(getent passwd "$(id -u)" | cut -d: -f6)"
hash="$(sha256sum deploy/validate/package-lock.json | cut -c1-16)"
modules="$home/.cache/dattn/npm/$hash/node_modules"
[ -f "$modules/../complete" ] ||
  fail "no validator packages in $modules: run scripts/setup.sh (it installs them from npm)"
command -v node >/dev/null || fail "node not found: run scripts/setup.sh (Debian's nodejs)"
validate() { NODE_PATH="$modules" node deploy/validate/validate.js "$@"; }

tmp="${TEST_TMPDIR:?}"
cat >"$tmp/bad.yaml" <<'BAD'
apiVersion: v1
kind: Pod
metadata: {name: bad-port}
spec:
  containers:
    - name: c
      image: i
      readinessProbe: {grpc: {port: "7080"}}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: no-container-name}
spec:
  selector: {matchLabels: {a: b}}
  serviceName: s
  template: {spec: {containers: [{image: i}]}}
---
apiVersion: dattn.example/v1
kind: Unknown
metadata: {name: unknown-kind}
BAD
out="$(validate "$tmp/bad.yaml")" && fail "the validator accepted invalid objects: $out"
for want in "bad-port: INVALID" "no-container-name: INVALID" "unknown-kind: INVALID" \
            "3 object(s), 3 invalid"; do
  grep -qF "$want" <<<"$out" || fail "the validator did not say '$want':"$'\n'"$out"
done

deploy/render.sh "$tmp/rendered" || fail "an overlay does not render"
overlays=(deploy/kubernetes/overlays/*/)
[ "${#overlays[@]}" -ge 3 ] || fail "expected the gpu, cpu-demo and monitoring overlays"
files=()
for overlay in "${overlays[@]}"; do
  name="$(basename "$overlay")"
  [ -s "$tmp/rendered/$name.yaml" ] || fail "$name rendered nothing"
  # kubectl's own messages: kustomize v5 warns about the fields kept for kubectl 1.20
  # (bases, patchesStrategicMerge); anything else is a failure.
  if grep -v "^# Warning: '\(bases\|patchesStrategicMerge\)' is deprecated" \
      "$tmp/rendered/$name.stderr" | grep -q .; then
    fail "$name: kubectl said:"$'\n'"$(cat "$tmp/rendered/$name.stderr")"
  fi
  files+=("$tmp/rendered/$name.yaml")
done
validate "${files[@]}" || fail "rendered objects are not valid (above)"
echo "PASS: ${#files[@]} overlays render and validate"
