#!/usr/bin/env bash
# Runs every test of the project: Rust (unit, integration, doc), C, Python, and the
# real torch_npu against npualloc (downloads the pinned wheels once, cached).
# Usage: bash scripts/test-all.sh
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== Rust tests (cargo test --workspace, opt-level 1) =="
cargo test --workspace --all-targets
cargo test --workspace --doc

if [ -x scripts/test-c.sh ]; then
  echo "== C tests =="
  bash scripts/test-c.sh
  echo "== C tests under AddressSanitizer + UBSan =="
  bash scripts/test-c.sh --sanitize
fi
if [ -x scripts/test-python.sh ]; then
  echo "== Python tests =="
  bash scripts/test-python.sh
fi
if [ -x scripts/test-torch-npu.sh ]; then
  echo "== torch_npu tests (the real torch_npu 2.14 wheel on stand-in CANN libraries) =="
  bash scripts/test-torch-npu.sh
fi
echo "== all tests passed =="
