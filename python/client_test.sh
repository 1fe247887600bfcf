#!/usr/bin/env bash
# The Python client's tests (python/tests/test_client.py) with Debian's /usr/bin/python3,
# python3-grpcio, python3-protobuf and python3-numpy (scripts/setup.sh): the stubs generated from
# proto/ at build time (//python:dattn_v1_py), the package, and the real coordinator and CPU worker
# for the end-to-end cases. Fails (never skips) when python or a module is missing.
set -euo pipefail

fail() { echo "python client_test: FAILED: $*" >&2; exit 1; }
python=/usr/bin/python3
[ -x "$python" ] || fail "$python not found (Debian package python3)"
for module in grpc google.protobuf numpy; do
  "$python" -c "import $module" 2>/dev/null ||
    fail "$module is not importable by $python (run scripts/setup.sh)"
done

runfiles="${TEST_SRCDIR:-$PWD}/${TEST_WORKSPACE:-__main__}"
export PYTHONPATH="$runfiles/python/gen:$runfiles/python"
export DATTN_COORDINATOR_BIN="$runfiles/server/dattn-coordinator"
export DATTN_WORKER_BIN="$runfiles/worker/dattn-worker"
export DATTN_REFERENCE_PY="$runfiles/model/testing/longnet_reference.py"
# No proxy for loopback gRPC, whatever the environment says.
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY grpc_proxy
cd "$runfiles/python/tests"
exec "$python" -m unittest -v test_client
