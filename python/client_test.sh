#!/usr/bin/env bash
# The Python client's tests with Debian's /usr/bin/python3, python3-grpcio, python3-protobuf and
# python3-numpy (scripts/setup.sh): runs the unittest module $1 of python/tests (test_client: the
# fake JobService; test_cluster: the real coordinator and CPU workers) with the stubs generated from
# proto/ at build time (//python:dattn_v1_py, //python:health_v1_py) and the package on PYTHONPATH.
# Fails (never skips) when python or a module is missing.
set -euo pipefail

fail() { echo "python client_test: FAILED: $*" >&2; exit 1; }
module="${1:?usage: client_test.sh MODULE}"
python=/usr/bin/python3
[ -x "$python" ] || fail "$python not found (Debian package python3)"
for m in grpc google.protobuf numpy; do
  "$python" -c "import $m" 2>/dev/null ||
    fail "$m is not importable by $python (run scripts/setup.sh)"
done

runfiles="${TEST_SRCDIR:-$PWD}/${TEST_WORKSPACE:-__main__}"
export PYTHONPATH="$runfiles/python/gen:$runfiles/python:$runfiles/python/tests"
export DATTN_COORDINATOR_BIN="$runfiles/server/dattn-coordinator"
export DATTN_WORKER_BIN="$runfiles/worker/dattn-worker"
export DATTN_TRAIN_BIN="$runfiles/trainer/dattn-train"
export DATTN_MAKE_CERTS="$runfiles/scripts/make-certs.sh"
export DATTN_REFERENCE_PY="$runfiles/model/testing/longnet_reference.py"
# No proxy for loopback gRPC, and no connection settings from the environment, whatever it says.
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY grpc_proxy no_proxy NO_PROXY
unset DATTN_COORDINATOR DATTN_TLS_CA DATTN_TOKEN
cd "$runfiles/python/tests"
exec "$python" -m unittest -v "$module"
