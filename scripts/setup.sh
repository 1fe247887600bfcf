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
  clang-14  # the clang thread-safety build (.bazelrc, --config=clang-tsa)
  libssl-dev python3-numpy bible-kjv bible-kjv-text
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
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
echo "setup: done" >&2
