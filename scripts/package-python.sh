#!/usr/bin/env bash
# Builds a wheel of the Python package with libnpualloc (release profile) inside, for
# installing on a machine without a Rust toolchain (an NPU host): `pip install` the
# .whl it prints. Where cargo is, `pip install ./python` alone does the same in one step.
# Usage: bash scripts/package-python.sh [out-dir (default: dist)]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-dist}"
python3 -m pip wheel --no-deps --disable-pip-version-check -w "$out" ./python
ls -1 "$out"/npualloc-*.whl
