#!/usr/bin/env bash
# Installs every Debian package dattn needs to build, test and run on this machine.
# Idempotent: packages already present are skipped. Quiet unless something fails.
# The CUDA toolkit (/usr/local/cuda) comes with the machine image, not from apt.
set -euo pipefail

packages=(
  bazel-bootstrap bazel-rules-java
  build-essential pkg-config git ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libgloo-dev libsqlite3-dev sqlite3 nlohmann-json3-dev libcli11-dev libyaml-cpp-dev
  libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev
  prometheus-cpp-dev prometheus
  curl python3 procps iproute2 clang-format
  clang-14  # the sanitized build with clang's thread-safety analysis (.bazelrc, --config=sanitize)
  lld-14  # its linker (.bazelrc)
  libclang-rt-14-dev  # clang's sanitizer runtimes and libFuzzer (.bazelrc's sanitize and fuzz)
  libssl-dev python3-numpy bible-kjv bible-kjv-text
  python3-grpcio python3-protobuf  # the Python client (python/, docs/PYTHON.md)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# Commands that other packages may provide (a kubectl or a Node.js from elsewhere is fine): Debian's
# packages only when the command is missing, so as not to fight what is installed.
# kubectl renders the Kubernetes overlays (deploy/); node and npm validate them (deploy/validate).
command -v kubectl >/dev/null 2>&1 || missing+=(kubernetes-client)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

# The validator's npm packages (deploy/validate/package-lock.json), installed once per lock file
# into ~/.cache/dattn/npm/HASH, where deploy:kustomize_test looks for them: npm is the one registry
# besides Debian's that this machine reaches, and a cache keeps them out of the repository.
install_npm_packages() {
  local root lock hash dir
  root="$(cd "$(dirname "$0")/.." && pwd)"
  lock="$root/deploy/validate/package-lock.json"
  hash="$(sha256sum "$lock" | cut -c1-16)"
  dir="${HOME:?}/.cache/dattn/npm/$hash"
  [ -f "$dir/complete" ] && return 0
  echo "setup: installing the manifest validator's npm packages into $dir" >&2
  rm -rf "$dir" && mkdir -p "$dir"
  cp "$root/deploy/validate/package.json" "$lock" "$dir/"
  local log
  log=$(mktemp)
  if ! (cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund) >"$log" 2>&1; then
    cat "$log" >&2; echo "setup: npm ci failed in $dir" >&2; exit 1
  fi
  rm -f "$log"
  touch "$dir/complete"
}

if [ ${#missing[@]} -eq 0 ]; then
  install_npm_packages
  exit 0
fi

echo "setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
sudo_cmd=""
if [ "$(id -u)" != 0 ]; then sudo_cmd="sudo"; fi
log=$(mktemp)
if ! $sudo_cmd apt-get update -qq >"$log" 2>&1; then
  cat "$log" >&2; echo "setup: apt-get update failed" >&2; exit 1
fi
# prometheus (the server) pulls in a service we never start; promtool is what the tests use.
if ! $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$log" 2>&1; then
  cat "$log" >&2; echo "setup: apt-get install failed for: ${missing[*]}" >&2; exit 1
fi
rm -f "$log"
install_npm_packages
echo "setup: done" >&2
