#!/usr/bin/env bash
# dattn on several "hosts" of one machine: a coordinator and two CPU workers, each in a network
# namespace of its own with its own address on a private LAN (a bridge), started with the flags a
# multi-host deployment uses (docs/DEPLOY.md, "Several hosts without Kubernetes"):
#
#   coordinator  10.77.0.1   dattn-coordinator --listen=10.77.0.1:7070 --metrics-listen=10.77.0.1:7071
#                            --rendezvous-listen=0.0.0.0 --rendezvous-advertise=10.77.0.1
#   host-a       10.77.0.2   dattn-worker --coordinator=10.77.0.1:7070 --name=host-a
#                            --listen-address=10.77.0.2 --ring-address=10.77.0.2 --health-port=7080
#                            --metrics-listen=10.77.0.2:7081
#   host-b       10.77.0.3   (the same with 10.77.0.3)
#   client       10.77.0.10  dattn with DATTN_COORDINATOR=10.77.0.1:7070
#
# Each namespace has only its own loopback: nothing reaches another "host" but over the LAN, so a
# ring that forms proves the addresses (rendezvous store, Gloo's listeners) work across hosts.
# Everything lives inside a user and network namespace this script creates (unshare): no root
# needed, nothing on the machine's own network changes, and it all goes when the script ends.
#
# Usage: deploy/multihost/netns-cluster.sh run BIN_DIR    the e2e check: a 2-rank Gloo ring job
#                                                          across host-a and host-b, then checks;
#                                                          exit 0 when all pass
#        deploy/multihost/netns-cluster.sh demo BIN_DIR   the same cluster, kept until Ctrl-C
# BIN_DIR holds dattn-coordinator, dattn-worker and dattn (e.g. bazel-bin's, or ~/.local/bin).
set -uo pipefail

mode="${1:-}"
bin="${2:-}"
if [ "$mode" != run ] && [ "$mode" != demo ] || [ -z "$bin" ]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
bin="$(cd "$bin" && pwd)"
for b in dattn-coordinator dattn-worker dattn; do
  [ -x "$bin/$b" ] || { echo "netns-cluster: $bin/$b is missing" >&2; exit 2; }
done

# Step 1: into a user namespace (root inside it) with a network namespace of our own: the LAN's
# bridge lives there, and every host's namespace hangs off it.
if [ -z "${DATTN_NETNS_INNER:-}" ]; then
  command -v unshare >/dev/null && command -v nsenter >/dev/null && command -v ip >/dev/null || {
    echo "netns-cluster: needs unshare, nsenter (util-linux) and ip (iproute2)" >&2
    exit 2
  }
  exec env DATTN_NETNS_INNER=1 unshare --user --map-root-user --net --mount --fork \
    --kill-child "$0" "$@"
fi

work="${TEST_TMPDIR:-$(mktemp -d)}/netns-cluster"
rm -rf "$work" && mkdir -p "$work"
pids=()
cleanup() {
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[$i]}" 2>/dev/null; done
  wait 2>/dev/null
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for log in "$work"/*.log; do echo "--- $(basename "$log")"; tail -20 "$log"; done
  exit 1
}

ip link set lo up
ip link add dattn-lan type bridge || fail "cannot create a bridge (is the bridge module there?)"
ip link set dattn-lan up

declare -A host_pid
# host NAME ADDRESS: a network namespace (held by a sleeping process) with eth0 on the LAN.
host() {
  local name="$1" address="$2"
  unshare --net sleep infinity &
  local pid=$!
  pids+=("$pid")
  for _ in $(seq 50); do
    [ "$(readlink /proc/$pid/ns/net)" != "$(readlink /proc/self/ns/net)" ] && break
    sleep 0.02
  done
  ip link add "v-$name" type veth peer name eth0 netns "$pid" || fail "veth for $name"
  ip link set "v-$name" master dattn-lan up
  nsenter --net=/proc/$pid/ns/net sh -c "ip link set lo up && ip link set eth0 up &&
    ip addr add $address/24 dev eth0" || fail "addressing $name"
  host_pid[$name]=$pid
}
# on NAME CMD...: runs CMD in host NAME's namespace.
on() {
  local name="$1"
  shift
  nsenter --net=/proc/${host_pid[$name]}/ns/net "$@"
}
# start NAME LOG CMD...: runs CMD in host NAME in the background.
start() {
  local name="$1" log="$2"
  shift 2
  on "$name" "$@" >"$work/$log.log" 2>&1 &
  pids+=($!)
}
# wait_log LOG PATTERN: until the log has the pattern (30 s at most).
wait_log() {
  for _ in $(seq 300); do
    grep -q "$2" "$work/$1.log" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "$1 never said '$2'"
}

host coordinator 10.77.0.1
host host-a 10.77.0.2
host host-b 10.77.0.3
host client 10.77.0.10

# TLS across the hosts, as a real cluster (docs/SECURITY.md): a CA, the coordinator's certificate for
# 10.77.0.1, one per worker, and an admin token for the client.
bash "$(dirname "$0")/../../scripts/make-certs.sh" "$work/certs" --hosts 10.77.0.1 \
  --worker host-a --worker host-b >/dev/null
"$bin/dattn" token new --tenant ops --role admin --name netns > "$work/token-new.txt"
token=$(sed -n 2p "$work/token-new.txt")
sed -n 5p "$work/token-new.txt" > "$work/tokens"
start coordinator coordinator "$bin/dattn-coordinator" --listen=10.77.0.1:7070 \
  --metrics-listen=10.77.0.1:7071 --data-dir="$work/data" \
  --rendezvous-listen=0.0.0.0 --rendezvous-advertise=10.77.0.1 --heartbeat-ms=500 \
  --tls-ca="$work/certs/ca.pem" --tls-cert="$work/certs/coordinator.pem" \
  --tls-key="$work/certs/coordinator-key.pem" --token-file="$work/tokens"
wait_log coordinator "listening on 10.77.0.1:7070, metrics on 10.77.0.1:7071"
for h in a:10.77.0.2 b:10.77.0.3; do
  name="host-${h%%:*}"
  address="${h#*:}"
  start "$name" "$name" "$bin/dattn-worker" --coordinator=10.77.0.1:7070 --name="$name" \
    --listen-address="$address" --ring-address="$address" --health-port=7080 \
    --metrics-listen="$address:7081" --threads=1 --slots=1 --tls-ca="$work/certs/ca.pem" \
    --tls-cert="$work/certs/$name.pem" --tls-key="$work/certs/$name-key.pem"
done
wait_log host-a "ready: registered"
wait_log host-b "ready: registered"
echo "coordinator 10.77.0.1, workers host-a 10.77.0.2 and host-b 10.77.0.3: ready"

client() {
  on client env DATTN_COORDINATOR=10.77.0.1:7070 DATTN_TLS_CA="$work/certs/ca.pem" \
    DATTN_TOKEN="$token" "$bin/dattn" "$@"
}

if [ "$mode" = demo ]; then
  echo "Ctrl-C stops everything. From another shell, enter the client's namespace with:"
  echo "  nsenter --preserve-credentials -U -n -t ${host_pid[client]}  (then DATTN_COORDINATOR=10.77.0.1:7070"
  echo "  DATTN_TLS_CA=$work/certs/ca.pem DATTN_TOKEN=$token dattn ...)"
  wait
  exit 0
fi

# The checks.
# 1. The hosts are apart: the coordinator is not on the client's loopback.
on client env DATTN_COORDINATOR=127.0.0.1:7070 "$bin/dattn" --timeout 2 health >/dev/null 2>&1
[ $? -eq 5 ] || fail "the client's own loopback answers (or dattn failed otherwise): the hosts are not apart"
client --timeout 5 health >/dev/null || fail "the client cannot reach the coordinator at 10.77.0.1:7070"
# 2. The workers registered under their own addresses.
workers="$(client workers --json)" || fail "dattn workers"
python3 - "$workers" <<'PY' || fail "workers' addresses"
import json, sys
got = sorted((w["name"], w["address"]) for w in json.loads(sys.argv[1])["workers"])
want = [("host-a", "10.77.0.2:7080"), ("host-b", "10.77.0.3:7080")]
sys.exit(0 if got == want else f"workers registered as {got}, want {want}")
PY
# 3. A 2-rank Gloo ring across host-a and host-b.
out="$(timeout 120 env DATTN_COORDINATOR=10.77.0.1:7070 DATTN_TLS_CA="$work/certs/ca.pem" \
  DATTN_TOKEN="$token" nsenter --net=/proc/${host_pid[client]}/ns/net \
  "$bin/dattn" submit --batch=1 --seq-len=256 --heads=2 --head-dim=16 --segments=64,128 --rates=1,2 \
  --dtype=fp32 --pass=fwd-bwd --iterations=2 --device=cpu --ranks=2 --wait)" ||
  fail "the ring job did not succeed within 2 minutes: $out"
job="$(grep -o 'j-[0-9a-f]*' <<<"$out" | head -1)"
status="$(client status "$job" --json)" || fail "dattn status $job"
python3 - "$status" <<'PY' || fail "the ring's result"
import json, sys
job = json.loads(sys.argv[1])
ranks = job["result"]["attention"]["ranks"]
problems = []
if job["state"] != "JOB_STATE_SUCCEEDED": problems.append(f"state {job['state']}")
if len(ranks) != 2: problems.append(f"{len(ranks)} ranks")
if len(set(job["worker_ids"])) != 2: problems.append(f"workers {job['worker_ids']}")
if any(r["ring_formation_seconds"] <= 0 for r in ranks): problems.append("a rank never formed")
sys.exit("; ".join(problems) or 0)
PY
# 4. Each worker's metrics, read over the LAN, counted the formed ring.
for address in 10.77.0.2 10.77.0.3; do
  metrics="$(on client curl -sf --max-time 10 "http://$address:7081/metrics")" || fail "no metrics at $address:7081"
  grep -q '^dattn_worker_ring_formations_total{backend="gloo",outcome="formed"} 1$' <<<"$metrics" ||
    fail "$address's metrics do not count the formed ring"
done
echo "PASS: a 2-rank Gloo ring ran across host-a (10.77.0.2) and host-b (10.77.0.3), coordinated from 10.77.0.1 ($job)"
