#!/bin/sh
echo "bazel coverage is not available in the offline build (see docs/BUILD.md)" >&2
exit 1
