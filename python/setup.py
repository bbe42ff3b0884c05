"""Builds libnpualloc (the C ABI crate, allocator-ffi) with cargo and puts it inside the
package, so `pip install ./python` is the whole install (a Rust toolchain is needed).

setuptools-rust (from PyPI, see pyproject.toml) runs `cargo rustc` on
`../allocator-ffi/Cargo.toml`: the build happens in this repository's cargo target
folder (or `CARGO_TARGET_DIR`), so a second install reuses what the first compiled.
The profile is `release` unless `SETUPTOOLS_RUST_CARGO_PROFILE` names another (the
test scripts use `dev`, which shares its compiled dependencies with `cargo test`).
The header `include/npualloc.h` is copied into the package for the torch_npu shim.
"""

import os
import shutil

from setuptools import setup
from setuptools_rust import Binding, RustExtension

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
FFI_MANIFEST = os.path.join("..", "allocator-ffi", "Cargo.toml")


def _copy_header():
    """include/npualloc.h -> npualloc/include/ (the shim compiles against it)."""
    src = os.path.join(REPO, "include", "npualloc.h")
    if not os.path.isfile(src):
        raise SystemExit(
            "npualloc: %s is missing. Install from a checkout of the whole repository "
            "(pip install ./python at its root): the package builds the Rust library "
            "from ../allocator-ffi." % src)
    dst = os.path.join(HERE, "npualloc", "include")
    os.makedirs(dst, exist_ok=True)
    shutil.copyfile(src, os.path.join(dst, "npualloc.h"))


_copy_header()

setup(
    rust_extensions=[
        RustExtension(
            # Lands as npualloc/libnpualloc.<python ext suffix>.so; _lib.py finds it.
            "npualloc.libnpualloc",
            path=FFI_MANIFEST,
            binding=Binding.NoBinding,
            py_limited_api=False,
        )
    ],
    zip_safe=False,
)
