#!/usr/bin/env bash
# dattn-train as a process: SIGINT stops it after the current step with a checkpoint and exit 5,
# and --resume continues from that checkpoint.
set -uo pipefail
bin="$TEST_SRCDIR/$TEST_WORKSPACE/trainer/dattn-train"
kjv="$TEST_SRCDIR/$TEST_WORKSPACE/model/kjv.txt"
dir="$TEST_TMPDIR/signal"
rm -rf "$dir"
mkdir -p "$dir"
cat > "$dir/model.json" <<'JSON'
{"d_model": 32, "num_layers": 1, "num_heads": 2, "ffn_dim": 64,
 "attention": {"segment_lengths": [64], "dilation_rates": [1]}}
JSON
common=(--data "$kjv" --model-config "$dir/model.json" --out "$dir/run" --seq-len 64
        --batch-size 2 --threads 1 --peak-flops 1e11 --eval-every 0 --log-every 1)
"$bin" "${common[@]}" --steps 1000000 --warmup 1 > "$dir/out.txt" 2> "$dir/err.txt" &
pid=$!
# Wait for the first progress line (up to 60 s), then interrupt.
for _ in $(seq 600); do
  grep -q '^step ' "$dir/out.txt" 2>/dev/null && break
  sleep 0.1
done
kill -INT "$pid"
wait "$pid"
code=$?
cat "$dir/err.txt"
if [ "$code" -ne 5 ]; then echo "FAIL: exit $code after SIGINT, want 5"; cat "$dir/out.txt"; exit 1; fi
grep -q 'continue with --resume' "$dir/err.txt" || { echo "FAIL: no resume hint"; exit 1; }
ckpt=$(ls "$dir/run/checkpoints")
[ -n "$ckpt" ] && [ -f "$dir/run/checkpoints/$ckpt/MANIFEST.json" ] ||
  { echo "FAIL: no complete checkpoint"; ls -R "$dir/run"; exit 1; }
step=$((10#${ckpt#step-}))
grep -q '<svg' "$dir/run/loss.svg" || { echo "FAIL: no loss curve"; exit 1; }
# Resume with two more steps than the checkpoint holds.
"$bin" --out "$dir/run" --resume --steps $((step + 2)) --peak-flops 1e11 > "$dir/out2.txt" 2>&1
code=$?
cat "$dir/out2.txt"
[ "$code" -eq 0 ] || { echo "FAIL: resume exit $code"; exit 1; }
grep -q "resumed from .*$ckpt at step $step" "$dir/out2.txt" || { echo "FAIL: not resumed"; exit 1; }
grep -q "^step $((step + 2))/$((step + 2)) " "$dir/out2.txt" || { echo "FAIL: no last step"; exit 1; }
echo PASS
