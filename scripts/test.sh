#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds everything with gcc (the CUDA code
# included: it must compile without a GPU) and runs every test twice: as built, then built by clang
# with AddressSanitizer, LeakSanitizer and UndefinedBehaviorSanitizer and clang's thread-safety
# analysis as errors (.bazelrc's --config=sanitize), where memory errors that pass silently in the
# plain build fail and every lock annotation is checked. GPU tests skip, saying why, where no GPU
# exists; they are tagged "gpu" and the sanitized pass leaves them out (`bazel test
# --test_tag_filters=gpu //...` runs just them on a GPU host).
# Then the objects that no sanitized test needed (benchmarks, tools, the GPU tests) are compiled the
# same way (a build, no links), so that the analysis sees all the host code.
# Last, every libFuzzer target of fuzz/ runs for 60 seconds (scripts/fuzz.sh, two at a time; built by
# clang with libFuzzer and the sanitizers, .bazelrc's --config=fuzz; docs/FUZZING.md).
# Exit status: non-zero on any build or test failure. Last line: "N passed, N failed" (the tests of
# both passes; a failed analysis build and a failed fuzz run count as one failure each and are named
# on that line).
set -uo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh || { echo "setup failed"; exit 1; }

log=$(mktemp)
startup=()     # Bazel startup options (a fresh output root after an environment failure)
fresh_root=""
# run_pass NAME [options]: one `bazel test //...`; appends to $log and sets $status.
# 2 cores in CI: Bazel runs tests two at a time; multi-process tests bind ephemeral loopback ports only.
run_pass() {
  local name="$1"
  shift
  echo "== tests: $name =="
  bazel "${startup[@]}" test //... "$@" --test_output=errors --test_summary=short \
    --local_test_jobs=2 2>&1 | tee -a "$log"
  status=${PIPESTATUS[0]}
}

total=0
for pass in plain sanitize; do
  options=()
  # The sanitized pass builds the tests only (no benchmark or tool binary that no test runs) and
  # leaves out the tests tagged "gpu" (without a GPU they skip; the plain pass runs them, saying
  # why; and CUDA's runtime does not run under AddressSanitizer anyway) and "no-cxx" (they run no
  # C++ of ours: promtool's rule tests, the manifests' renderer).
  [ "$pass" = sanitize ] &&
    options=(--config=sanitize --build_tests_only --test_tag_filters=-gpu,-no-cxx)
  run_pass "$pass" "${options[@]}"
  # Exit 36 ("local environmental issue": output base unusable, install base corrupt, disk full) and
  # 37 (Bazel's own crash) say nothing about the code. One CI run ended with 36 two seconds in,
  # before any action ran. Say what the machine looks like, then retry once in a fresh output root,
  # which rebuilds everything instead of trusting the old output base.
  if { [ "$status" -eq 36 ] || [ "$status" -eq 37 ]; } && [ -z "$fresh_root" ]; then
    echo "bazel exited with $status (Bazel's environment, not the code):"
    df -h "${HOME:-/}" "${TMPDIR:-/tmp}" . 2>&1 | sed 's/^/  /'
    echo "  output base: $(timeout 60 bazel info output_base 2>&1 | tail -1)"
    bazel shutdown >/dev/null 2>&1 || true
    fresh_root=$(mktemp -d "${TMPDIR:-/tmp}/dattn-bazel-root.XXXXXX")
    startup=(--output_user_root="$fresh_root")
    echo "retrying once with --output_user_root=$fresh_root"
    run_pass "$pass (retried)" "${options[@]}"
  fi
  [ "$status" -ne 0 ] && [ "$total" -eq 0 ] && total=$status
done

# The rest of the host code through clang's thread-safety analysis: objects only (no links), and
# the sanitized pass compiled most of them already, so it adds a minute or two.
echo "== build: the other objects under clang's thread-safety analysis (--config=sanitize) =="
bazel "${startup[@]}" build //... --config=sanitize --output_groups=compilation_outputs \
  --keep_going 2>&1 | tee -a "$log"
tsa_status=${PIPESTATUS[0]}

# The fuzz targets, 60 s each, two at a time (CI has 2 cores): about 3 minutes, plus their build.
echo "== fuzz: every target for 60 s (scripts/fuzz.sh) =="
DATTN_BAZEL_STARTUP="${startup[*]}" scripts/fuzz.sh --seconds 60 --jobs 2 2>&1 | tee -a "$log"
fuzz_status=${PIPESTATUS[0]}

if [ -n "$fresh_root" ]; then
  bazel "${startup[@]}" shutdown >/dev/null 2>&1 || true
  chmod -R u+w "$fresh_root" 2>/dev/null
  rm -rf "$fresh_root"
fi

passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log" || true)
failed=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE)' "$log" || true)
rm -f "$log"
if [ "$total" -ne 0 ] && [ "$failed" -eq 0 ]; then
  echo "bazel test exited with $total (build failure?)"
  failed=1
fi
tsa_note=""
if [ "$tsa_status" -ne 0 ]; then
  echo "bazel build --config=sanitize exited with $tsa_status (clang or its thread-safety analysis)"
  failed=$((failed + 1))
  tsa_note=" (the thread-safety build failed)"
fi
if [ "$fuzz_status" -ne 0 ]; then
  echo "scripts/fuzz.sh exited with $fuzz_status (a fuzz target found a failing input, or did not build)"
  failed=$((failed + 1))
  tsa_note="${tsa_note} (the fuzz run failed)"
fi
echo "${passed} passed, ${failed} failed${tsa_note}"
[ "$total" -eq 0 ] && [ "$tsa_status" -eq 0 ] && [ "$fuzz_status" -eq 0 ]
