#!/usr/bin/env bash
# Builds libnpualloc and runs the C tests against include/npualloc.h: once on the
# simulated backend, once on the fake ACL runtime (the real ACL loading code path).
# Usage: bash scripts/test-c.sh [--sanitize]
#   --sanitize: the C tests and the fake libraries built with AddressSanitizer and
#   UndefinedBehaviorSanitizer (any report fails the run; leaks are reported too).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -p npualloc-ffi
lib=target/debug
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
san=()
if [ "${1:-}" = "--sanitize" ]; then
  san=(-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g)
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  echo "-- with AddressSanitizer + UndefinedBehaviorSanitizer --"
elif [ -n "${1:-}" ]; then
  echo "unknown option '$1' (expected --sanitize)" >&2
  exit 2
fi
flags=(-Iinclude -Itests/c -Wall -Wextra -Werror ${san[@]+"${san[@]}"})

# The header compiles cleanly as C11 and as C++ (compile only).
cc -std=c11 "${flags[@]}" -c tests/c/test_header.c -o "$out/header_c.o"
c++ -std=c++17 "${flags[@]}" -x c++ -c tests/c/test_header.c -o "$out/header_cpp.o"
echo "c-header: 2 passed, 0 failed"

link=(-L"$lib" -lnpualloc -Wl,-rpath,"$PWD/$lib" -ldl)
cc -std=c11 "${flags[@]}" tests/c/test_abi.c "${link[@]}" -o "$out/abi"
cc -std=c11 "${flags[@]}" -pthread tests/c/test_threads.c "${link[@]}" -o "$out/threads"
cc -std=c11 "${flags[@]}" tests/c/test_hooks.c "${link[@]}" -o "$out/hooks"
cc -std=c11 "${flags[@]}" tests/c/test_mstx.c "${link[@]}" -o "$out/mstx"
cc -std=c11 "${flags[@]}" tests/c/test_expandable.c "${link[@]}" -o "$out/expandable"
cc -std=c11 "${flags[@]}" tests/c/test_no_vm.c "${link[@]}" -o "$out/no_vm"
cc -std=c11 "${flags[@]}" tests/c/test_summary.c "${link[@]}" -o "$out/summary"
cc -std=c11 "${flags[@]}" tests/c/test_pools.c "${link[@]}" -o "$out/pools"
cc -shared -fPIC -O1 -fvisibility=hidden -Wall -Wextra -Werror ${san[@]+"${san[@]}"} tests/fake_mstx/fake_mstx.c -lpthread -o "$out/libms_tools_ext.so"
# The static library links too.
cc -std=c11 "${flags[@]}" tests/c/test_abi.c "$lib/libnpualloc.a" -lpthread -ldl -lm -o "$out/abi_static"
# The fake ACL runtime, and a variant without the virtual-memory functions.
cc -shared -fPIC -O1 -fvisibility=hidden -Wall -Wextra -Werror ${san[@]+"${san[@]}"} tests/fake_acl/fake_acl.c -lpthread -o "$out/libascendcl.so"
mkdir -p "$out/novm"
cc -shared -fPIC -O1 -fvisibility=hidden -Wall -Wextra -Werror ${san[@]+"${san[@]}"} -DFAKE_NO_VMM tests/fake_acl/fake_acl.c -lpthread -o "$out/novm/libascendcl.so"

run_suite() {
  "$out/abi" "$out/snapshot.json"
  "$out/abi_static" "$out/snapshot2.json"
  "$out/threads"
  "$out/hooks"
  NPUALLOC_MSTX_LIB="$out/libms_tools_ext.so" "$out/mstx"
  "$out/expandable" "$out/expandable.json"
  "$out/summary"
  "$out/pools"
}

echo "-- sim backend --"
(export NPUALLOC_BACKEND=sim NPUALLOC_SIM_MODE=manual NPUALLOC_SIM_CAPACITY=1G NPUALLOC_SIM_DEVICES=2; run_suite)
echo "-- fake ACL backend --"
(export NPUALLOC_BACKEND=acl NPUALLOC_ACL_LIB="$out/libascendcl.so" FAKE_ACL_CAPACITY=1073741824 FAKE_ACL_DEVICES=2; run_suite)
echo "-- fake ACL backend without virtual memory --"
(export NPUALLOC_BACKEND=acl NPUALLOC_ACL_LIB="$out/novm/libascendcl.so" FAKE_ACL_DEVICES=2; "$out/no_vm")
