#!/usr/bin/env bash
# scripts/install.sh into a temporary prefix, from the binaries this test depends on (--from, laid
# out like bazel-bin): all four installed and runnable from PATH, a second run changes nothing, a
# changed copy is replaced, bad arguments exit 2, a missing binary exits 1.
set -euo pipefail
root="$TEST_SRCDIR/dattn"
script="$root/scripts/install.sh"
prefix="$TEST_TMPDIR/prefix"
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$script" --from "$root" --prefix "$prefix")
echo "$out"
for name in dattn dattn-coordinator dattn-worker dattn-worker-gpu; do
  [ -x "$prefix/bin/$name" ] || fail "$name not installed executable"
done
cmp -s "$root/client/dattn" "$prefix/bin/dattn" || fail "dattn differs from its source"
cmp -s "$root/worker/dattn-worker-gpu" "$prefix/bin/dattn-worker-gpu" || fail "gpu worker differs"
echo "$out" | grep -q "4 binaries installed" || fail "first run: $out"
echo "$out" | grep -q "is not on your PATH" || fail "no PATH hint: $out"
version=$(PATH="$prefix/bin:$PATH" dattn --version)
[[ "$version" == dattn* ]] || fail "dattn --version from PATH said: $version"

out=$(PATH="$prefix/bin:$PATH" "$script" --from "$root" --prefix "$prefix")
echo "$out"
[ "$(echo "$out" | grep -c '(unchanged)')" = 4 ] || fail "second run changed something: $out"
echo "$out" | grep -q "0 binaries installed" || fail "second run: $out"
if echo "$out" | grep -q "not on your PATH"; then fail "PATH hint while on PATH: $out"; fi

echo "stale" > "$prefix/bin/dattn-worker"
out=$("$script" --from "$root" --prefix "$prefix")
cmp -s "$root/worker/dattn-worker" "$prefix/bin/dattn-worker" || fail "a changed copy was not replaced"
echo "$out" | grep -q "1 binaries installed" || fail "third run: $out"
[ -z "$(ls -A "$prefix/bin" | grep '^\.')" ] || fail "temporary files left: $(ls -A "$prefix/bin")"

rc=0; "$script" --prefix >/dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "--prefix without a directory exited $rc"
rc=0; "$script" --bogus >/dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "an unknown argument exited $rc"
mkdir -p "$TEST_TMPDIR/empty"
rc=0; err=$("$script" --from "$TEST_TMPDIR/empty" --prefix "$TEST_TMPDIR/p2" 2>&1) || rc=$?
[ "$rc" = 1 ] || fail "a missing binary exited $rc"
echo "$err" | grep -q "client/dattn is missing" || fail "missing binary message: $err"
echo "PASS"
