#!/usr/bin/env bash
# Builds libnpualloc in release mode and copies it and the header into the Python
# package, so `pip install ./python` ships a working library.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p npualloc-ffi
mkdir -p python/npualloc/lib python/npualloc/include
cp target/release/libnpualloc.so python/npualloc/lib/
cp include/npualloc.h python/npualloc/include/
echo "now: pip install ./python"
