#!/usr/bin/env bash
# Runs tests/torch_npu: the real torch_npu 2.14.0 and torch 2.14.0 wheels (PyPI) with
# npualloc installed the documented way, on stand-in CANN libraries generated from the
# wheel (tests/torch_npu/README.md).
#
# The wheels go into a private virtual environment cached under
# $NPUALLOC_CACHE (default ~/.cache/npualloc), keyed by the pinned versions; never into
# the system site-packages. If they cannot be fetched this fails, with a message.
# Usage: bash scripts/test-torch-npu.sh [--install-only | --anchor TRACE... | scenario-name-filter]
#        bash scripts/test-torch-npu.sh --script FILE [ARG...]
#          runs a script of yours (e.g. docs/guides/torch_npu/*.py) with that torch_npu, on
#          the stand-in, in the current folder, with npualloc importable from python/
#          and the debug libnpualloc.so (PYTHONPATH, NPUALLOC_LIB): the way the guide's
#          commands were run here
set -euo pipefail
caller=$PWD
cd "$(dirname "$(readlink -f "$0")")/.."  # the checkout, also when called through a link
repo=$PWD

TORCH_VERSION=2.14.0
TORCH_NPU_VERSION=2.14.0
# What the venv holds besides the two wheels: ninja for torch.utils.cpp_extension, numpy
# and pyyaml for torch, protobuf (torchair checks its version at import) and packaging
# (torchair's version checks). The venv's folder is keyed by this list, so a change to it
# installs a fresh venv beside an older one instead of altering it.
EXTRA_PACKAGES=(ninja numpy pyyaml protobuf packaging)
cache="${NPUALLOC_CACHE:-$HOME/.cache/npualloc}"
key=$(printf '%s\n' "${EXTRA_PACKAGES[@]}" | sha256sum | cut -c1-8)
venv="$cache/torch_npu-$TORCH_NPU_VERSION-torch-$TORCH_VERSION-cp311-$key"

py311=$(command -v python3.11 || true)
if [ -z "$py311" ] && python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
  py311=$(command -v python3)
fi
if [ -z "$py311" ]; then
  echo "test-torch-npu: Python 3.11 is needed (the torch_npu $TORCH_NPU_VERSION wheels are cp311)" >&2
  exit 1
fi

if [ ! -f "$venv/.complete" ]; then
  echo "-- installing torch $TORCH_VERSION + torch_npu $TORCH_NPU_VERSION into $venv (cached) --"
  rm -rf "$venv"
  mkdir -p "$cache"
  "$py311" -m venv "$venv"
  # torch's own requirements (its CUDA libraries included: torch from PyPI is the CUDA
  # build and does not import without them) and EXTRA_PACKAGES.
  if ! "$venv/bin/pip" install -q --disable-pip-version-check \
      "torch==$TORCH_VERSION" "torch_npu==$TORCH_NPU_VERSION" "${EXTRA_PACKAGES[@]}"; then
    echo "test-torch-npu: FAILED to fetch torch==$TORCH_VERSION / torch_npu==$TORCH_NPU_VERSION" \
         "from the package index; these tests need them (about 6 GB installed)" >&2
    rm -rf "$venv"
    exit 1
  fi
  touch "$venv/.complete"
fi
# The CUDA runtime's crt/ headers (cuda_runtime.h includes crt/host_config.h): torch's
# CUDA wheels bring cuda_runtime_api.h (nvidia-cuda-runtime) but not crt/, which
# npualloc.install_cuda()'s shim needs to compile against torch's CUDAAllocator header
# (the cuda_shim scenario). A small wheel, in its own cached folder beside the venv.
CUDA_CRT_VERSION=13.0.88
crt="$cache/nvidia-cuda-crt-$CUDA_CRT_VERSION"
if [ ! -f "$crt/.complete" ]; then
  rm -rf "$crt"
  if ! "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --target "$crt" \
      "nvidia-cuda-crt==$CUDA_CRT_VERSION"; then
    echo "test-torch-npu: FAILED to fetch nvidia-cuda-crt==$CUDA_CRT_VERSION from the package index" >&2
    rm -rf "$crt"
    exit 1
  fi
  touch "$crt/.complete"
fi
export NPUALLOC_CUDA_INCLUDE="$crt/nvidia/cu13/include"
if [ "${1:-}" = "--install-only" ]; then
  echo "torch $TORCH_VERSION + torch_npu $TORCH_NPU_VERSION ready in $venv"
  exit 0
fi

cargo build -q -p npualloc-ffi
cargo build -q --bin npualloc

standin=$(mktemp -d)
trap 'rm -rf "$standin"' EXIT
tnpu=$("$venv/bin/python" -c 'import importlib.util as u; print(u.find_spec("torch_npu").submodule_search_locations[0])')
"$venv/bin/python" tests/torch_npu/standin/gen_standin.py "$tnpu" "$standin"

export PATH="$venv/bin:$PATH"
export NPUALLOC_LIB="$repo/target/debug/libnpualloc.so"
export NPUALLOC_BIN="$repo/target/debug/npualloc"
export TORCH_NPU_STANDIN="$standin"
# The shim is compiled once per source/flags and kept here between runs, one folder per
# checkout: checkouts with different shim sources would otherwise rebuild each other's.
checkout_key=$(printf '%s' "$repo" | sha256sum | cut -c1-8)
export TORCH_EXTENSIONS_DIR="$cache/torch_extensions-$TORCH_NPU_VERSION-$checkout_key"
export MAX_JOBS=1
if [ "${1:-}" = "--anchor" ]; then
  shift
  "$venv/bin/python" tests/torch_npu/anchor.py "$@"
  exit
fi
if [ "${1:-}" = "--script" ]; then
  shift
  script=$(cd "$caller" && realpath "$1")
  shift
  cd "$caller"
  "$venv/bin/python" "$repo/tests/torch_npu/run.py" --script "$script" "$@"
  exit
fi
"$venv/bin/python" tests/torch_npu/run.py "$@"
