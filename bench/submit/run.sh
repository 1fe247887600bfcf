#!/usr/bin/env bash
# Durable submits/s and latency, plaintext against TLS with tokens, in one run on one machine: for
# each transport a coordinator on a fresh data dir (no workers: jobs stay queued, so only the
# durable submit path is measured), then submit_bench against it. Prints one table and the ratio.
# Usage: bench/submit/run.sh [--clients=8] [--seconds=10]
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/setup.sh >/dev/null
bazel build //server:dattn-coordinator //bench/submit:submit_bench //client:dattn >/dev/null 2>&1 ||
  { echo "build failed; run: bazel build //server:dattn-coordinator //bench/submit:submit_bench //client:dattn"; exit 1; }
dir=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT

scripts/make-certs.sh "$dir/certs" --hosts 127.0.0.1,localhost >/dev/null
bazel-bin/client/dattn token new --tenant bench --role admin --name bench > "$dir/token-new.txt"
token=$(sed -n 2p "$dir/token-new.txt")
sed -n 5p "$dir/token-new.txt" > "$dir/tokens"

# run LABEL [coordinator flags...] -- [bench flags...]
run() {
  local label="$1"; shift
  local flags=()
  while [ "$1" != "--" ]; do flags+=("$1"); shift; done
  shift
  bazel-bin/server/dattn-coordinator --listen=127.0.0.1:0 --metrics-listen=127.0.0.1:0 \
    --data-dir="$dir/data-$label" "${flags[@]}" 2>"$dir/coordinator-$label.log" &
  pid=$!
  local addr=""
  for _ in $(seq 100); do
    addr=$(sed -n 's/.*listening on \([0-9.]*:[0-9]*\),.*/\1/p' "$dir/coordinator-$label.log")
    [ -n "$addr" ] && break
    sleep 0.1
  done
  [ -n "$addr" ] || { cat "$dir/coordinator-$label.log"; exit 1; }
  bazel-bin/bench/submit/submit_bench --coordinator="$addr" --label="$label" "$@" |
    tee -a "$dir/rows"
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
}

echo "store on $(df -h "$dir" | awk 'NR==2 {print $1}'); $(nproc) cores"
echo "| transport | clients | seconds | acknowledged | errors | submits/s | p50 ms | p99 ms | max ms |"
echo "|---|---|---|---|---|---|---|---|---|"
run plaintext --insecure -- "$@"
run tls+token --tls-ca="$dir/certs/ca.pem" --tls-cert="$dir/certs/coordinator.pem" \
  --tls-key="$dir/certs/coordinator-key.pem" --token-file="$dir/tokens" -- \
  --tls-ca="$dir/certs/ca.pem" --token="$token" "$@"
awk -F'|' '{gsub(/ /, "", $7); rate[NR] = $7; p99[NR] = $9}
  END {printf "tls+token / plaintext: %.2f of the submits/s (target >= 0.90), p99 %s ms vs %s ms\n",
       rate[2] / rate[1], p99[2], p99[1]}' "$dir/rows"
