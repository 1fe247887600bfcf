#!/usr/bin/env bash
# deploy:netns_e2e_test: netns-cluster.sh's check with the built binaries: a coordinator and two
# CPU workers on different network addresses (one network namespace each, inside a user namespace
# of the test's own: no root needed, the machine's network untouched), a 2-rank Gloo ring job
# across them through the CLI from a fourth address (docs/DEPLOY.md, "Several hosts without
# Kubernetes").
set -uo pipefail
cd "${TEST_SRCDIR:?run under bazel test}/${TEST_WORKSPACE:?}"
bin="${TEST_TMPDIR:?}/bin"
mkdir -p "$bin"
for b in server/dattn-coordinator worker/dattn-worker client/dattn; do
  ln -sf "$PWD/$b" "$bin/$(basename "$b")"
done
exec deploy/multihost/netns-cluster.sh run "$bin"
