#!/usr/bin/env bash
# Runs the Python (ctypes) tests of libnpualloc on the simulated backend.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -p npualloc-ffi
export NPUALLOC_LIB="$PWD/target/debug/libnpualloc.so"
export NPUALLOC_BACKEND=sim NPUALLOC_SIM_MODE=manual NPUALLOC_SIM_CAPACITY=4G
python3 python/tests/test_abi.py
