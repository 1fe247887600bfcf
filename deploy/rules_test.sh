#!/usr/bin/env bash
# deploy:rules_test: the alert rules pass `promtool check rules` and their unit tests
# (`promtool test rules`, prometheus/rules/dattn.rules.test.yml); and every alert is really tested
# both ways: with its expression replaced by one that never fires, and by one that always fires,
# the unit tests must fail.
set -uo pipefail
cd "${TEST_SRCDIR:?run under bazel test}/${TEST_WORKSPACE:?}/deploy/prometheus/rules"
fail() { echo "FAIL: $*"; exit 1; }
promtool="$(command -v promtool || true)"
[ -n "$promtool" ] || fail "promtool not found: install Debian's prometheus (scripts/setup.sh)"

"$promtool" check rules dattn.rules.yml || fail "promtool check rules"
"$promtool" test rules dattn.rules.test.yml || fail "promtool test rules"

# A copy of the rules with alert $1's expression replaced by $2 (a multi-line expression's
# continuation lines go too).
replace_expr() {
  awk -v alert="$1" -v expr="$2" '
    /^ *- alert: / { mine = ($3 == alert) }
    skipping {
      match($0, /^ */)
      if ($0 !~ /^ *$/ && RLENGTH <= indent) skipping = 0; else next
    }
    mine && /^ *expr:/ {
      match($0, /^ */); indent = RLENGTH
      printf "%sexpr: %s\n", substr($0, 1, indent), expr
      skipping = 1; next
    }
    { print }' dattn.rules.yml
}

# The unit test groups that name alert $1 (with the file's header): promtool compares only the
# alerts a group's alert_rule_test names, so a mutant of $1 can fail no other group, and running
# just these keeps the test well inside its timeout (the whole file takes ~2 s; 32 mutants of it
# took 58 s on 2 cores, at the edge of a small test's 60 s).
groups_of() {
  awk -v alert="$1" '
    function flush() { if (group != "" && keep) printf "%s", group; group = ""; keep = 0 }
    /^  - name: / { flush(); in_group = 1 }
    !in_group { print; next }
    { group = group $0 "\n" }
    $1 == "alertname:" && $2 == alert { keep = 1 }
    END { flush() }' dattn.rules.test.yml
}

tmp="${TEST_TMPDIR:?}"
alerts=$(sed -n 's/^ *- alert: //p' dattn.rules.yml)
[ "$(wc -w <<<"$alerts")" -ge 10 ] || fail "expected at least 10 alerts, found: $alerts"
for alert in $alerts; do
  groups_of "$alert" >"$tmp/dattn.rules.test.yml"
  grep -q "^  - name: " "$tmp/dattn.rules.test.yml" || fail "$alert has no unit test group"
  for mutant in "vector(0) > 1" "vector(1)"; do
    replace_expr "$alert" "$mutant" >"$tmp/dattn.rules.yml"
    cmp -s "$tmp/dattn.rules.yml" dattn.rules.yml && fail "could not replace $alert's expression"
    "$promtool" check rules "$tmp/dattn.rules.yml" >/dev/null || fail "bad mutant of $alert"
    if (cd "$tmp" && "$promtool" test rules dattn.rules.test.yml >/dev/null 2>&1); then
      fail "$alert's unit tests pass with its expression replaced by '$mutant'"
    fi
  done
  # The groups alone pass with the real rules: a failure above is the mutant's doing.
  cp dattn.rules.yml "$tmp/dattn.rules.yml"
  (cd "$tmp" && "$promtool" test rules dattn.rules.test.yml >/dev/null 2>&1) ||
    fail "$alert's unit test groups fail on their own with the real rules"
done
echo "PASS: $(wc -w <<<"$alerts") alerts checked and tested both ways"
