#!/usr/bin/env bash
# Runs the Python (ctypes) tests of libnpualloc: on the simulated backend, then on the
# fake ACL runtime (the real ACL loading code path).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -p npualloc-ffi
cargo build --bin npualloc
export NPUALLOC_BIN="$PWD/target/debug/npualloc"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -shared -fPIC -O1 -fvisibility=hidden -Wall -Wextra -Werror tests/fake_acl/fake_acl.c -lpthread -o "$out/libascendcl.so"
export NPUALLOC_LIB="$PWD/target/debug/libnpualloc.so"
echo "-- sim backend --"
(export NPUALLOC_BACKEND=sim NPUALLOC_SIM_MODE=manual NPUALLOC_SIM_CAPACITY=4G; python3 python/tests/test_abi.py)
echo "-- fake ACL backend --"
(export NPUALLOC_BACKEND=acl NPUALLOC_ACL_LIB="$out/libascendcl.so" FAKE_ACL_CAPACITY=4294967296; python3 python/tests/test_abi.py)
