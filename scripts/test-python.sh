#!/usr/bin/env bash
# Runs the Python tests of libnpualloc: the ctypes ABI suite on the simulated backend,
# then on the fake ACL runtime (the real ACL loading code path); the memory-summary and
# backend-choice suite; and the install a user does: `pip install ./python` into a
# fresh virtual environment (setuptools-rust builds the library into the package), then
# `import npualloc; npualloc.memory_summary()` on the simulated device asked for
# explicitly.
set -euo pipefail
cd "$(dirname "$0")/.."
# Same profile as `cargo test` (see [profile.dev] in Cargo.toml): nothing is rebuilt.
cargo build -p npualloc-ffi
cargo build --bin npualloc
target="${CARGO_TARGET_DIR:-$PWD/target}"
export NPUALLOC_BIN="$target/debug/npualloc"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -shared -fPIC -O1 -fvisibility=hidden -Wall -Wextra -Werror tests/fake_acl/fake_acl.c -lpthread -o "$out/libascendcl.so"
export NPUALLOC_LIB="$target/debug/libnpualloc.so"
echo "-- sim backend --"
(export NPUALLOC_BACKEND=sim NPUALLOC_SIM_MODE=manual NPUALLOC_SIM_CAPACITY=4G; python3 python/tests/test_abi.py)
echo "-- fake ACL backend --"
(export NPUALLOC_BACKEND=acl NPUALLOC_ACL_LIB="$out/libascendcl.so" FAKE_ACL_CAPACITY=4294967296; python3 python/tests/test_abi.py)
echo "-- memory_summary and backend choice (sim backend) --"
(export NPUALLOC_BACKEND=sim NPUALLOC_SIM_MODE=manual; python3 python/tests/test_summary.py)

echo "-- pip install ./python into a fresh venv, then memory_summary() on the sim backend --"
python3 -m venv "$out/venv"
# setuptools and setuptools-rust come from the package index into pip's isolated build
# environment (cached by pip); cargo builds in this repository's target folder (or
# CARGO_TARGET_DIR) in the dev profile, which reuses what `cargo test` compiled. A user's
# `pip install ./python` builds the release profile.
SETUPTOOLS_RUST_CARGO_PROFILE=dev "$out/venv/bin/pip" install -q --disable-pip-version-check ./python
(
  cd "$out"  # not the repository: the installed package, with its own library
  unset NPUALLOC_LIB
  VENV="$out/venv" NPUALLOC_BACKEND=sim "$out/venv/bin/python" -c '
import os, npualloc
lib = npualloc.library_path()
assert lib.startswith(os.path.realpath(os.environ["VENV"])), lib
print(npualloc.memory_summary())
print("installed package loads", os.path.basename(lib))
'
)
