#!/usr/bin/env bash
# Builds libnpualloc and runs the C tests against include/npualloc.h on the sim backend.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -p npualloc-ffi
lib=target/debug
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags=(-Iinclude -Itests/c -Wall -Wextra -Werror)

# The header compiles cleanly as C11 and as C++ (compile only).
cc -std=c11 "${flags[@]}" -c tests/c/test_header.c -o "$out/header_c.o"
c++ -std=c++17 "${flags[@]}" -x c++ -c tests/c/test_header.c -o "$out/header_cpp.o"

echo "c-header: 2 passed, 0 failed"

cc -std=c11 "${flags[@]}" tests/c/test_abi.c -L"$lib" -lnpualloc -Wl,-rpath,"$PWD/$lib" -o "$out/abi"
cc -std=c11 "${flags[@]}" -pthread tests/c/test_threads.c -L"$lib" -lnpualloc -Wl,-rpath,"$PWD/$lib" -o "$out/threads"
# The static library links too.
cc -std=c11 "${flags[@]}" tests/c/test_abi.c "$lib/libnpualloc.a" -lpthread -ldl -lm -o "$out/abi_static"

export NPUALLOC_BACKEND=sim NPUALLOC_SIM_MODE=manual NPUALLOC_SIM_CAPACITY=1G
NPUALLOC_SIM_DEVICES=2 "$out/abi" "$out/snapshot.json"
NPUALLOC_SIM_DEVICES=2 "$out/abi_static" "$out/snapshot2.json"
NPUALLOC_SIM_MODE=threaded "$out/threads"
