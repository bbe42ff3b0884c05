#!/usr/bin/env bash
# Validates npualloc on a machine with an NVIDIA GPU and PyTorch (never needed by CI):
# installs a libnpualloc.so built beforehand with npualloc.install_cuda() in fresh
# processes, and compares it, with and without expandable segments, with PyTorch's
# native caching allocator (A/B/C/A/B/C): seed scenario with real CUDA streams (200
# runs), a four-stream record_stream stress, a transformer training step's losses to the
# last bit, statistics that do not depend on the caching policy (equal to PyTorch's to
# the byte), a torch.cuda.graph capture with a side stream (replays equal to eager,
# eager tensors intact), timing of torch.empty and of the step, and peak device memory
# used; then a negative control (record_stream ignored: the checks must see wrong data)
# and out-of-memory checks (memory fraction, past the device, recovery), and a late
# communication stream under a memory fraction beside PyTorch's (pressure-* modes).
# Results of the runs so far: README.md, "Run on an NVIDIA H200" and the two after it.
#
# npualloc.install_cuda() supports torch 2.14 (the CUDAAllocator interface changes between
# minor versions): pip install torch==2.14.0 there first; other versions fail every
# npualloc mode with that message. The compile-* modes (torch.compile, reduce-overhead)
# also need triton (it comes with torch's CUDA wheels) and a C compiler.
# The GPU machine has PyTorch but no Rust toolchain: build the library where Rust is
# (`cargo build --release -p npualloc-ffi`) and carry target/release/libnpualloc.so
# there with the repository (or point NPUALLOC_LIB at it). This script never builds.
# Usage: [NPUALLOC_LIB=/path/libnpualloc.so] bash scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
lib="${NPUALLOC_LIB:-$PWD/target/release/libnpualloc.so}"
if [ ! -f "$lib" ]; then
  echo "gpu-check: $lib not found. Build it on a machine with Rust" \
       "(cargo build --release -p npualloc-ffi) and carry target/release/libnpualloc.so" \
       "here, or set NPUALLOC_LIB to its path." >&2
  exit 2
fi
if ! nm -D --defined-only "$lib" 2>/dev/null | grep -q ' npualloc_malloc$'; then
  echo "gpu-check: $lib does not export npualloc_malloc: not a libnpualloc build" >&2
  exit 2
fi
export NPUALLOC_LIB="$lib" NPUALLOC_BACKEND=cuda
python3 scripts/gpu_check.py "$@"
