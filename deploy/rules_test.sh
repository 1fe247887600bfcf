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

tmp="${TEST_TMPDIR:?}"
cp dattn.rules.test.yml "$tmp/"
alerts=$(sed -n 's/^ *- alert: //p' dattn.rules.yml)
[ "$(wc -w <<<"$alerts")" -ge 10 ] || fail "expected at least 10 alerts, found: $alerts"
for alert in $alerts; do
  for mutant in "vector(0) > 1" "vector(1)"; do
    replace_expr "$alert" "$mutant" >"$tmp/dattn.rules.yml"
    cmp -s "$tmp/dattn.rules.yml" dattn.rules.yml && fail "could not replace $alert's expression"
    "$promtool" check rules "$tmp/dattn.rules.yml" >/dev/null || fail "bad mutant of $alert"
    if (cd "$tmp" && "$promtool" test rules dattn.rules.test.yml >/dev/null 2>&1); then
      fail "$alert's unit tests pass with its expression replaced by '$mutant'"
    fi
  done
done
echo "PASS: $(wc -w <<<"$alerts") alerts checked and tested both ways"
