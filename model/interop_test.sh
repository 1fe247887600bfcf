#!/usr/bin/env bash
# C++ and an independent Python reading of the same formats agree (see interop_check.py): safetensors
# both ways, token files both ways, and a checkpoint folder (manifest checksums, tensors, JSON).
# Debian's python3 (with python3-numpy from scripts/setup.sh), not whatever python3 is first on PATH.
set -euo pipefail
fixture=model/interop_fixture
check=model/interop_check.py
python=/usr/bin/python3
tmp="${TEST_TMPDIR:-$(mktemp -d)}"

"$python" -c 'import numpy' || { echo "python3-numpy is missing: run scripts/setup.sh"; exit 1; }

"$fixture" write-safetensors "$tmp/cpp.safetensors"
"$python" "$check" check-safetensors "$tmp/cpp.safetensors"

"$python" "$check" write-safetensors "$tmp/py.safetensors"
"$fixture" read-safetensors "$tmp/py.safetensors"

"$fixture" write-token-file "$tmp/cpp.tok"
"$python" "$check" check-token-file "$tmp/cpp.tok"

"$python" "$check" write-token-file "$tmp/py.tok"
"$fixture" read-token-file "$tmp/py.tok"

dir=$("$fixture" write-checkpoint "$tmp/checkpoints")
"$python" "$check" check-checkpoint "$dir"

# The checks can fail: a flipped weight is caught by the Python manifest check too.
size=$(stat -c %s "$dir/weights.safetensors")
printf "\x01" | dd of="$dir/weights.safetensors" bs=1 seek=$((size - 10)) conv=notrunc status=none
if "$python" "$check" check-checkpoint "$dir" 2>/dev/null; then
  echo "a corrupted checkpoint passed the Python check"
  exit 1
fi
# A sharded (version 2) checkpoint of two ranks: plain safetensors files and an index.
dir=$("$fixture" write-sharded-checkpoint "$tmp/sharded")
"$python" "$check" check-sharded-checkpoint "$dir"
shard="$dir/optimizer-00001-of-00002.safetensors"
size=$(stat -c %s "$shard")
printf "\x01" | dd of="$shard" bs=1 seek=$((size - 10)) conv=notrunc status=none
if "$python" "$check" check-sharded-checkpoint "$dir" 2>/dev/null; then
  echo "a corrupted sharded checkpoint passed the Python check"
  exit 1
fi
echo "interop: all checks passed"
