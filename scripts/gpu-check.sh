#!/usr/bin/env bash
# Validates npualloc on a machine with an NVIDIA GPU and PyTorch (never needed by CI):
# builds libnpualloc, installs it with npualloc.install_cuda() in fresh processes, and
# compares it, with and without expandable segments, with PyTorch's native caching
# allocator (A/B/C/A/B/C): seed scenario with real
# CUDA streams (200 runs), a transformer training step's losses to the last bit, timing
# of torch.empty and of the step, and peak device memory used.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p npualloc-ffi
export NPUALLOC_LIB="$PWD/target/release/libnpualloc.so" NPUALLOC_BACKEND=cuda
python3 scripts/gpu_check.py
