#!/usr/bin/env bash
# Runs every test of the project: Rust (unit, integration, doc), the README's and the
# guides' commands with the installed tool, C, the real torch_npu against npualloc
# (downloads the pinned wheels once, cached), Python.
# Usage: bash scripts/test-all.sh
#
# Each crate is compiled once per configuration (see "What the test command compiles" in
# docs/testing.md): `cargo test` (profile test = dev); the C library as users build it
# (`-p npualloc-ffi`: the core without the tools); the tool in release for the README's
# first command, which `cargo install` reuses; the library once more as setuptools-rust
# builds it (`--crate-type cdylib`), last, so nothing after it builds the library again.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== Rust tests (cargo test --workspace, opt-level 1) =="
# One invocation: unit, integration and doc tests, benches once in test mode (test = true
# in Cargo.toml), examples built. A separate `cargo test --doc` after it compiled
# npualloc-ffi again: the abi_steady_state test builds libnpualloc.so as users do
# (`cargo build -p npualloc-ffi`), replacing the workspace build's file of that name.
cargo test --workspace
echo "== cargo build of the tool reuses cargo test's build (nothing compiles) =="
# Same profile settings (Cargo.toml) and same features (serde_core in Cargo.toml):
# the dev build of the tool, which the Python and torch_npu suites run, is cargo test's.
log=$(cargo build --bin npualloc 2>&1) || { echo "$log"; exit 1; }
if grep -q Compiling <<<"$log"; then
  echo "$log"
  echo "test-all: 'cargo build --bin npualloc' compiled again after 'cargo test': its features or flags differ (see serde_core in Cargo.toml)" >&2
  exit 1
fi

echo "== the README's and the guides' commands (release build, cargo install) =="
bash scripts/test-docs.sh

if [ -x scripts/test-c.sh ]; then
  echo "== C tests =="
  bash scripts/test-c.sh
  echo "== C tests under AddressSanitizer + UBSan =="
  bash scripts/test-c.sh --sanitize
fi
if [ -x scripts/test-torch-npu.sh ]; then
  echo "== torch_npu tests (the real torch_npu 2.14 wheel on stand-in CANN libraries) =="
  bash scripts/test-torch-npu.sh
fi
if [ -x scripts/test-python.sh ]; then
  # Last: its `pip install ./python` builds the library as setuptools-rust asks
  # (`cargo rustc --crate-type cdylib`), which a later `cargo build` would redo.
  echo "== Python tests =="
  bash scripts/test-python.sh
fi
echo "== all tests passed =="
