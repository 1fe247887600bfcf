#!/usr/bin/env bash
# Starts a coordinator on a fresh data dir (no workers: jobs stay queued, so only the durable submit
# path is measured) and runs the submit benchmark against it. Usage: bench/submit/run.sh [--clients=8]
# [--seconds=10]
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/setup.sh
bazel build //server:dattn-coordinator //bench/submit:submit_bench >/dev/null 2>&1 ||
  { echo "build failed; run: bazel build //server:dattn-coordinator //bench/submit:submit_bench"; exit 1; }
dir=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
bazel-bin/server/dattn-coordinator --listen=127.0.0.1:0 --metrics-listen=127.0.0.1:0 \
  --data-dir="$dir/data" 2>"$dir/coordinator.log" &
pid=$!
for _ in $(seq 100); do
  addr=$(sed -n 's/.*listening on \([0-9.]*:[0-9]*\),.*/\1/p' "$dir/coordinator.log")
  [ -n "$addr" ] && break
  sleep 0.1
done
[ -n "$addr" ] || { cat "$dir/coordinator.log"; exit 1; }
echo "coordinator on $addr, store $dir/data ($(df -h "$dir" | awk 'NR==2 {print $1}'))"
bazel-bin/bench/submit/submit_bench --coordinator="$addr" "$@"
