#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds everything (the CUDA code included: it must
# compile without a GPU) and runs every test. GPU tests skip, saying why, where no GPU exists.
# Exit status: non-zero on any build or test failure. Last line: "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh || { echo "setup failed"; exit 1; }

log=$(mktemp)
# 2 cores in CI: Bazel runs tests two at a time; multi-process tests bind ephemeral loopback ports only.
bazel test //... --test_output=errors --test_summary=short --local_test_jobs=2 2>&1 | tee "$log"
status=${PIPESTATUS[0]}

passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log" || true)
failed=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE)' "$log" || true)
rm -f "$log"
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
  echo "bazel test exited with $status (build failure?)"
  failed=1
fi
echo "${passed} passed, ${failed} failed"
[ "$status" -eq 0 ]
