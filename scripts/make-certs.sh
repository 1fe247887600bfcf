#!/usr/bin/env bash
# Makes a cluster CA and the certificates of a dattn cluster with openssl (docs/SECURITY.md):
#
#   scripts/make-certs.sh DIR [--hosts H1,H2,...] [--days N] [--worker NAME[:PATTERN]]... [--force]
#
#   DIR         where the files go (created, mode 0700); existing files are kept unless --force
#   --hosts     names and IPs the coordinator is reached at (its certificate's subjectAltName);
#               default: localhost,127.0.0.1,dattn-coordinator,dattn-coordinator.dattn.svc,
#               dattn-coordinator.dattn.svc.cluster.local
#   --days      validity of the certificates (default 365; the CA gets 10 times that)
#   --worker NAME[:PATTERN]
#               a worker certificate NAME.pem per option (default: one named "worker"), binding the
#               worker names it may register as (--name of dattn-worker): PATTERN is one name, or a
#               prefix and '*' ("gpu-*": every name starting with "gpu-"; "*": any name, for a fleet
#               sharing one certificate, which then can act as any worker). Default PATTERN: NAME.
#
# Writes ca.pem and ca-key.pem (keep ca-key.pem offline: whoever has it can mint workers),
# coordinator.pem + coordinator-key.pem (server and client use: the API, the rendezvous stores),
# and NAME.pem + NAME-key.pem per worker (client and server use: registry calls, ring stores, its
# health port; subject CN "dattn-worker PATTERN", which the coordinator checks on every registry
# call). Keys are EC P-256, unencrypted, mode 0600. Rotation: rerun with --force into a new DIR, put
# the new files where the old were (a Kubernetes Secret update); the daemons re-read them within a
# minute. A new CA needs every certificate re-made, and the old CA bundled with the new
# one (cat old-ca.pem new-ca.pem > ca.pem) while they change over.
set -euo pipefail

dir=""
hosts="localhost,127.0.0.1,dattn-coordinator,dattn-coordinator.dattn.svc,dattn-coordinator.dattn.svc.cluster.local"
days=365
force=0
workers=()
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts="$2"; shift 2 ;;
    --days) days="$2"; shift 2 ;;
    --worker) workers+=("$2"); shift 2 ;;
    --force) force=1; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    -*) echo "make-certs.sh: unknown option $1" >&2; exit 2 ;;
    *) [ -n "$dir" ] && { echo "make-certs.sh: one DIR only" >&2; exit 2; }; dir="$1"; shift ;;
  esac
done
[ -z "$dir" ] && { echo "usage: make-certs.sh DIR [--hosts H1,H2] [--days N] [--worker NAME]" >&2; exit 2; }
[[ "$days" =~ ^[0-9]+$ ]] && [ "$days" -ge 1 ] || { echo "make-certs.sh: --days takes a positive integer, got '$days'" >&2; exit 2; }
[ ${#workers[@]} -eq 0 ] && workers=(worker)
command -v openssl >/dev/null || { echo "make-certs.sh: openssl is not installed (apt-get install openssl)" >&2; exit 1; }
umask 077
mkdir -p "$dir"
chmod 700 "$dir"

san=""
IFS=',' read -ra names <<< "$hosts"
for h in "${names[@]}"; do
  [ -z "$h" ] && continue
  if [[ "$h" =~ ^[0-9.]+$ || "$h" == *:* ]]; then san+="IP:$h,"; else san+="DNS:$h,"; fi
done
san="${san%,}"

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

if [ ! -f "$dir/ca.pem" ] || [ "$force" = 1 ]; then
  key "$dir/ca-key.pem"
  openssl req -x509 -new -key "$dir/ca-key.pem" -subj "/CN=dattn cluster CA" -days $((days * 10)) \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$dir/ca.pem"
fi

# sign NAME CN SAN: NAME.pem and NAME-key.pem, signed by the CA, for server and client use.
sign() {
  local name="$1" cn="$2" alt="$3"
  if [ -f "$dir/$name.pem" ] && [ "$force" = 0 ]; then return; fi
  key "$dir/$name-key.pem"
  local ext
  ext=$(mktemp)
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    echo "subjectAltName=$alt"
  } > "$ext"
  openssl req -new -key "$dir/$name-key.pem" -subj "/CN=$cn" -out "$dir/$name.csr"
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca-key.pem" \
    -CAcreateserial -days "$days" -extfile "$ext" -out "$dir/$name.pem" 2>/dev/null
  rm -f "$dir/$name.csr" "$ext"
}

sign coordinator "dattn-coordinator" "$san"
for spec in "${workers[@]}"; do
  w="${spec%%:*}"
  pattern="$w"
  [[ "$spec" == *:* ]] && pattern="${spec#*:}"
  [[ "$w" =~ ^[A-Za-z0-9._-]+$ ]] || { echo "make-certs.sh: worker name '$w' must be [A-Za-z0-9._-]" >&2; exit 2; }
  [[ "$pattern" =~ ^[A-Za-z0-9._-]*\*?$ && -n "$pattern" ]] ||
    { echo "make-certs.sh: worker pattern '$pattern' must be a name or a prefix and '*' ([A-Za-z0-9._-])" >&2; exit 2; }
  # Workers are dialled by IP on their health ports: localhost and 127.0.0.1 plus their name.
  sign "$w" "dattn-worker $pattern" "DNS:$w,DNS:localhost,IP:127.0.0.1"
done
rm -f "$dir/ca.srl"
chmod 600 "$dir"/*.pem
names=()
for spec in "${workers[@]}"; do names+=("${spec%%:*}.pem"); done
echo "certificates in $dir: ca.pem, coordinator.pem, ${names[*]} (and their -key.pem)"
