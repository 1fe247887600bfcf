#!/usr/bin/env bash
# dump_logits on the CPU: the logits it writes (from a seed with --save-weights, and from a
# checkpoint dattn-train wrote) equal the float64 numpy reference of the architecture on the same
# weights and tokens (model/tools/dump_logits_check.py, 1e-5 relative); bad flags and --device cuda
# (which needs dump_logits_gpu) are refused with exit 2, naming what is wrong. Fails (never skips)
# without /usr/bin/python3 and numpy.
set -uo pipefail
fail() { echo "dump_logits_test: FAILED: $*" >&2; exit 1; }
python=/usr/bin/python3
"$python" -c "import numpy" 2>/dev/null || fail "numpy is not importable by $python"
root="$TEST_SRCDIR/$TEST_WORKSPACE"
dump="$root/model/tools/dump_logits"
train="$root/trainer/dattn-train"
check="$root/model/tools/dump_logits_check.py"
kjv="$root/model/kjv.txt"
dir="$TEST_TMPDIR/dump_logits"
rm -rf "$dir"
mkdir -p "$dir"

# From a seed: grouped attention with H % G != 0, XPOS, an untied head.
cat > "$dir/model.json" <<'JSON'
{"d_model": 24, "num_layers": 2, "num_heads": 3, "ffn_dim": 40, "tie_embeddings": false,
 "attention": {"segment_lengths": [8, 16], "dilation_rates": [1, 2]},
 "rotary": {"xpos": true, "xpos_scale_base": 64}}
JSON
"$dump" --model-config "$dir/model.json" --init-seed 5 --save-weights "$dir/seeded" \
  --data "$kjv" --begin 1000 --batch 2 --seq-len 32 --threads 1 --out "$dir/seeded.npy" ||
  fail "dump_logits from a seed"
[ -f "$dir/seeded/weights.safetensors" ] && [ -f "$dir/seeded/config.json" ] ||
  fail "--save-weights wrote $(ls "$dir/seeded")"
"$python" "$check" "$dir/seeded" "$dir/seeded.npy" "$kjv" 1000 2 32 || fail "seeded logits"

# From a checkpoint of a short dattn-train run.
"$train" --data "$kjv" --model-config "$dir/model.json" --out "$dir/run" --seq-len 32 \
  --batch-size 2 --steps 2 --warmup 1 --threads 1 --peak-flops 1e11 --eval-every 0 \
  > "$dir/train.txt" 2>&1 || fail "dattn-train: $(cat "$dir/train.txt")"
step="$dir/run/checkpoints/step-00000002"
"$dump" --checkpoint "$step" --data "$kjv" --begin 5000 --batch 1 --seq-len 48 --threads 1 \
  --out "$dir/trained.npy" || fail "dump_logits from a checkpoint"
"$python" "$check" "$step" "$dir/trained.npy" "$kjv" 5000 1 48 || fail "checkpoint logits"
# The check can fail: the seeded model's logits are not the trained model's.
"$python" "$check" "$step" "$dir/seeded.npy" "$kjv" 1000 2 32 > /dev/null &&
  fail "the check passed logits of other weights"

# Refusals: exit 2 and a message naming the problem; nothing written.
expect_usage() {
  local what="$1"
  shift
  "$dump" "$@" > "$dir/out.txt" 2> "$dir/err.txt"
  local code=$?
  [ "$code" -eq 2 ] || fail "$*: exit $code, want 2: $(cat "$dir/err.txt")"
  grep -q -- "$what" "$dir/err.txt" || fail "$*: said $(cat "$dir/err.txt"), want $what"
}
expect_usage "dump_logits_gpu" --checkpoint "$step" --data "$kjv" --batch 1 --seq-len 8 \
  --device cuda --out "$dir/x.npy"
expect_usage "run past the end" --checkpoint "$step" --data "$kjv" --begin 4298230 --batch 1 \
  --seq-len 16 --out "$dir/x.npy"
expect_usage "either --checkpoint" --data "$kjv" --batch 1 --seq-len 8 --out "$dir/x.npy"
expect_usage "--init-seed" --model-config "$dir/model.json" --data "$kjv" --batch 1 --seq-len 8 \
  --out "$dir/x.npy"
expect_usage "--out" --checkpoint "$step" --data "$kjv" --batch 1 --seq-len 8
[ ! -e "$dir/x.npy" ] || fail "a refused call wrote $dir/x.npy"
echo "PASS"
