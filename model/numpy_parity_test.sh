#!/usr/bin/env bash
# The CPU model's logits and loss (fp64) against the independent numpy re-implementation of the
# architecture (model/testing/longnet_reference.py), within 1e-10 relative, on configs that cover
# both attention modes, blocked head offsets, XPOS, tied and untied heads, several heads per group
# and H % G != 0, rates that divide no segment, partial last segments and a segment longer than the
# sequence. Fails (never skips) when /usr/bin/python3 or numpy is missing.
set -euo pipefail

fail() { echo "numpy_parity_test: FAILED: $*" >&2; exit 1; }

python=/usr/bin/python3
[ -x "$python" ] || fail "$python not found (Debian package python3; scripts/setup.sh installs it)"
"$python" -c "import numpy" 2>/dev/null ||
  fail "numpy is not importable by $python (Debian package python3-numpy; run scripts/setup.sh)"

runfiles="${TEST_SRCDIR:-$PWD}/${TEST_WORKSPACE:-__main__}"
dump="$runfiles/model/testing/numpy_parity_dump"
reference="$runfiles/model/testing/longnet_reference.py"
[ -x "$dump" ] || fail "$dump not found"
[ -f "$reference" ] || fail "$reference not found"
work="${TEST_TMPDIR:-$(mktemp -d)}/numpy_parity"
rm -rf "$work"
mkdir -p "$work"

# case NAME BATCH SEQ_LEN SEED CONFIG_JSON
dirs=()
case_() {
  local name="$1" batch="$2" seq_len="$3" seed="$4" config="$5"
  mkdir -p "$work/$name"
  printf '%s\n' "$config" >"$work/$name.json"
  "$dump" "$work/$name.json" "$work/$name" "$batch" "$seq_len" "$seed" ||
    fail "numpy_parity_dump failed on case $name"
  dirs+=("$work/$name")
}

# 3 heads in 2 groups (H % G != 0); rate 3 divides no segment; N = 10 cuts both patterns' last
# segments short; tied head.
case_ grouped_rope_tied 2 10 11 '{
  "vocab_size": 9, "d_model": 12, "num_layers": 2, "num_heads": 3, "ffn_dim": 20,
  "attention": {"mode": "grouped", "segment_lengths": [3, 8], "dilation_rates": [1, 3]},
  "rotary": {"theta": 100}
}'
# Mixture with the paper's head offsets, XPOS with a short scale base (strong decay), untied head,
# a segment (16) longer than the sequence (12).
case_ mixture_xpos_untied 2 12 12 '{
  "vocab_size": 11, "d_model": 16, "num_layers": 2, "num_heads": 4, "ffn_dim": 24,
  "tie_embeddings": false,
  "attention": {"mode": "mixture", "segment_lengths": [4, 6, 16], "dilation_rates": [1, 2, 3]},
  "rotary": {"theta": 1000, "xpos": true, "xpos_scale_base": 8}
}'
# Mixture with torchscale's blocked head offsets and XPOS; one sequence of 13.
case_ mixture_blocked_xpos 1 13 13 '{
  "vocab_size": 7, "d_model": 24, "num_layers": 3, "num_heads": 4, "ffn_dim": 16,
  "layer_norm_eps": 1e-6,
  "attention": {"mode": "mixture", "head_offsets": "blocked", "segment_lengths": [5, 10],
                "dilation_rates": [2, 3]},
  "rotary": {"xpos": true, "xpos_scale_base": 16}
}'
# Grouped with 2 heads per group, XPOS, one layer.
case_ grouped_xpos_one_layer 3 8 14 '{
  "vocab_size": 5, "d_model": 16, "num_layers": 1, "num_heads": 4, "ffn_dim": 8,
  "attention": {"mode": "grouped", "segment_lengths": [4, 8], "dilation_rates": [1, 2]},
  "rotary": {"xpos": true, "xpos_scale_base": 4}
}'

"$python" "$reference" "${dirs[@]}"
