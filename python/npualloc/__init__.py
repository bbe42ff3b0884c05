"""npualloc: a caching NPU memory allocator, installable into torch_npu.

Use with torch_npu (before the first NPU allocation)::

    import npualloc
    npualloc.install()
    ...
    print(npualloc.memory_summary())   # torch.npu.memory_summary()'s table, plus fragmentation

The device backend is ACL (a CANN runtime: libascendcl.so on the loader path or under
ASCEND_HOME_PATH) unless asked otherwise; without an NPU, ask for the simulated device
with NPUALLOC_BACKEND=sim or ``npualloc.use_backend("sim")`` before the first call.

Without torch, ``npualloc.malloc(size)``, ``free(ptr)`` and ``record_stream(ptr,
stream)`` drive the allocator directly: experiments on the simulated device, or a trace
of your own allocation pattern recorded with NPUALLOC_TRACE=run.trace for
``npualloc replay``.

Verified with the real torch_npu 2.14.0 / torch 2.14.0 wheels on stand-in CANN
libraries (tests/torch_npu); not on an NPU (none was available).
"""

import ctypes
import difflib
import hashlib
import json
import os
import pickle
import re
import sys
import tempfile

from ._lib import STAT_ARRAYS, DeviceStats, PrivatePoolStats, address, library_path, load  # noqa: F401

__all__ = ["install", "install_cuda", "memory_stats", "memory_summary", "empty_cache",
           "dump_snapshot", "use_backend", "last_error", "library_path", "load",
           "malloc", "free", "record_stream", "sim_stream",
           "NpuallocError", "OutOfMemoryError"]

BACKENDS = ("acl", "sim", "cuda")

_SWAP_TOO_LATE = "Can't swap an already initialized allocator"

# The shim module install() / install_cuda() loaded (tests read its counters).
_shim = None


class NpuallocError(RuntimeError):
    """An npualloc call failed; the message is the library's last error."""


class OutOfMemoryError(NpuallocError, MemoryError):
    """npualloc.malloc() found no room on the device, even after releasing its cache."""


# The C function a message of the library starts with ("npualloc_malloc: ..."): a detail
# of the C ABI, left out of what Python users read.
_C_FUNCTION = re.compile(r"^npualloc_\w+: ")


def last_error(lib=None):
    """This thread's last error message from the library (without the name of the C
    function that failed), or None."""
    msg = (lib or load()).npualloc_last_error()
    return _C_FUNCTION.sub("", msg.decode("utf-8", "replace")) if msg else None


def _check(rc, lib):
    if rc != 0:
        raise NpuallocError("npualloc: %s" % last_error(lib))


def _did_you_mean(word, choices):
    close = difflib.get_close_matches(str(word), choices, n=1)
    return "; did you mean %r?" % close[0] if close else ""


def use_backend(name):
    """Chooses the device backend of this process: "acl" (the default: a CANN runtime),
    "sim" (the simulated device, for machines without an NPU) or "cuda". Sets
    NPUALLOC_BACKEND, which the library reads once, at its first device call: call this
    before anything else of npualloc's touches a device."""
    if name not in BACKENDS:
        raise ValueError("backend %r is not one of %s%s"
                         % (name, ", ".join(BACKENDS), _did_you_mean(name, BACKENDS)))
    os.environ["NPUALLOC_BACKEND"] = name


def _backend():
    return os.environ.get("NPUALLOC_BACKEND") or "acl"


def _start(lib):
    """Starts the library (backend, settings) if it has not yet; a failure is one
    NpuallocError saying what to do, e.g. that no CANN runtime was found."""
    if lib.npualloc_device_count() >= 0:
        return
    msg = last_error(lib)
    if _backend() == "acl" and msg and "cannot load the runtime library" in msg:
        raise NpuallocError(
            "npualloc found no CANN runtime (libascendcl.so), so it cannot use an NPU: %s. "
            "Set up CANN first (source its set_env.sh, which sets ASCEND_HOME_PATH and the "
            "loader path) or point NPUALLOC_ACL_LIB at libascendcl.so. To run without an "
            "NPU, ask for the simulated device: NPUALLOC_BACKEND=sim, or "
            "npualloc.use_backend(\"sim\") before the first call." % msg)
    raise NpuallocError("npualloc cannot start (backend %s): %s" % (_backend(), msg))


def _swap(change_current_allocator, allocator):
    try:
        change_current_allocator(allocator)
    except RuntimeError as e:
        if _SWAP_TOO_LATE in str(e):
            raise NpuallocError(
                "npualloc.install() ran too late: the device allocator is already initialized "
                "(%s). Call it right after `import torch_npu`, before anything allocates on "
                "the device." % _SWAP_TOO_LATE) from e
        raise


def _torch_npu_dir():
    import torch_npu

    return os.path.dirname(os.path.abspath(torch_npu.__file__))


def _include_dir():
    """The folder holding npualloc.h: the repository's include/, else the package's."""
    here = os.path.dirname(os.path.abspath(__file__))
    include = os.path.join(os.path.dirname(os.path.dirname(here)), "include")
    if not os.path.isfile(os.path.join(include, "npualloc.h")):
        include = os.path.join(here, "include")
    return include


# The (major, minor) versions whose allocator interfaces the shims are written for:
# torch_npu's NPUAllocator and torch's CUDAAllocator change between minor versions
# (methods added, arguments changed), so a shim is built for each; others are refused.
SUPPORTED_TORCH_NPU = ((2, 14),)
SUPPORTED_TORCH = ((2, 14),)


def _minor(version):
    """(major, minor) of a version string such as "2.14.0", "2.14.0.post1" or
    "2.14.0+cu130"; None if it does not start with two numbers."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def _check_version(package, version, supported, why):
    if _minor(version) in supported:
        return
    names = ", ".join("%d.%d" % v for v in supported)
    raise NpuallocError(
        "%s supports %s %s only (the allocator interface npualloc's shim implements changes "
        "between minor versions); this is %s %s" % (why, package, names, package, version))


def _shim_name(base, sources, lib_path, versions):
    """The extension's name: `base` and a hash of everything the build depends on (the
    shim's sources, npualloc.h, the library it links, the torch versions and where they
    are installed), so that
    builds for different checkouts or versions sit side by side in torch's extension
    cache instead of rebuilding one another."""
    h = hashlib.sha256()
    for path in sources + [os.path.join(_include_dir(), "npualloc.h")]:
        with open(path, "rb") as f:
            h.update(f.read())
    h.update(os.path.realpath(lib_path).encode())
    h.update(repr(versions).encode())
    return "%s_%s" % (base, h.hexdigest()[:12])


def _compile(name, source, lib_path, includes, ldflags, why, versions):
    """Compiles (once, cached by torch under TORCH_EXTENSIONS_DIR) a C++ shim over
    libnpualloc at `lib_path` with torch.utils.cpp_extension; returns the module."""
    from torch.utils import cpp_extension

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        cpp_extension.verify_ninja_availability()
    except RuntimeError as e:
        raise NpuallocError("%s builds a small C++ shim with torch.utils.cpp_extension, "
                            "which needs ninja: pip install ninja" % why) from e
    csrc = os.path.join(here, "csrc")
    sources = [os.path.join(csrc, source)]
    headers = [os.path.join(csrc, "complete_allocator.h")]
    ldflags = [lib_path, "-Wl,-rpath," + os.path.dirname(os.path.abspath(lib_path))] + ldflags
    return cpp_extension.load(
        name=_shim_name(name, sources + headers, lib_path, versions),
        sources=sources,
        extra_include_paths=[_include_dir()] + includes,
        extra_cflags=["-std=c++20"],
        extra_ldflags=ldflags,
        verbose=os.environ.get("NPUALLOC_VERBOSE_BUILD") == "1",
    )


def _build_shim(lib_path):
    """The C++ shim: npualloc as a subclass of torch_npu's NPUAllocator (csrc/
    torch_npu_shim.cpp). Needs a C++20 compiler and ninja (a dependency of this
    package)."""
    import torch
    import torch_npu

    tnpu = _torch_npu_dir()
    # torch_npu's own extension helper (torch_npu.utils.cpp_extension.NpuExtension) uses
    # these two folders; the first also holds the CANN headers (acl/acl_rt.h).
    includes = [os.path.join(tnpu, "include"),
                os.path.join(tnpu, "include", "third_party", "hccl", "inc")]
    tnpu_lib = os.path.join(tnpu, "lib")
    ldflags = ["-L" + tnpu_lib, "-ltorch_npu", "-Wl,-rpath," + tnpu_lib]
    ascend = os.environ.get("ASCEND_HOME_PATH")
    if ascend and os.path.isfile(os.path.join(ascend, "lib64", "libascendcl.so")):
        ldflags += ["-L" + os.path.join(ascend, "lib64"), "-lascendcl"]
    # Otherwise the ACL functions resolve through libtorch_npu's own libascendcl.
    return _compile("npualloc_torch_npu_shim", "torch_npu_shim.cpp", lib_path, includes,
                    ldflags, "npualloc.install()",
                    (torch.__version__, torch.__file__, torch_npu.__version__, tnpu))


_CUDA_HEADERS = ("cuda_runtime_api.h", os.path.join("crt", "host_config.h"))


def _cuda_include_dirs():
    """Folders holding the CUDA runtime headers torch's CUDAAllocator header includes
    (cuda_runtime_api.h, and crt/host_config.h, which cuda_runtime.h includes): those
    named by NPUALLOC_CUDA_INCLUDE (os.pathsep-separated), those of the nvidia-* wheels
    torch depends on (nvidia-cuda-runtime; crt/ comes with nvidia-cuda-crt or
    nvidia-cuda-nvcc), then CUDA_HOME's. Empty if some header is in none of them."""
    from torch.utils import cpp_extension

    candidates = [p for p in os.environ.get("NPUALLOC_CUDA_INCLUDE", "").split(os.pathsep) if p]
    for base in sys.path:
        nvidia = os.path.join(base or ".", "nvidia")
        if os.path.isdir(nvidia):
            candidates += [os.path.join(nvidia, sub, "include") for sub in sorted(os.listdir(nvidia))]
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or cpp_extension.CUDA_HOME
    if home:
        candidates.append(os.path.join(home, "include"))
    found = []
    for inc in candidates:
        if inc not in found and any(os.path.isfile(os.path.join(inc, h)) for h in _CUDA_HEADERS):
            found.append(inc)
    if not all(any(os.path.isfile(os.path.join(inc, h)) for inc in found) for h in _CUDA_HEADERS):
        return []
    return found


def _build_cuda_shim(lib_path):
    """The C++ shim: npualloc as a subclass of torch's CUDAAllocator (csrc/
    cuda_shim.cpp), built against torch's headers and the CUDA runtime headers."""
    import torch

    includes = _cuda_include_dirs()
    if not includes:
        raise NpuallocError(
            "npualloc.install_cuda() builds a C++ shim against the CUDA runtime headers "
            "(%s), not all found in NPUALLOC_CUDA_INCLUDE, the nvidia-* wheels or CUDA_HOME: "
            "pip install nvidia-cuda-runtime nvidia-cuda-crt (for CUDA %s), or set CUDA_HOME "
            "to a CUDA toolkit" % (" and ".join(_CUDA_HEADERS), torch.version.cuda))
    torch_lib = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "lib")
    ldflags = ["-L" + torch_lib, "-lc10_cuda", "-Wl,-rpath," + torch_lib]
    return _compile("npualloc_cuda_shim", "cuda_shim.cpp", lib_path, includes, ldflags,
                    "npualloc.install_cuda()", (torch.__version__, torch.__file__, includes))


def _set_env(backend, conf):
    """NPUALLOC_BACKEND unless the environment already sets it; NPUALLOC_CONF if given."""
    os.environ.setdefault("NPUALLOC_BACKEND", backend)
    if conf is not None:
        os.environ["NPUALLOC_CONF"] = conf


def install(backend="acl", conf=None):
    """Makes npualloc torch_npu's NPU allocator: its complete allocator (a subclass of
    torch_npu's NPUAllocator), so graph capture, torch_npu's graph trees, torchair's
    reduce-overhead mode, checkpoints, memory snapshots and history work with it.

    Must run right after `import torch_npu`, before the first NPU allocation. Supports
    torch_npu 2.14 (with torch 2.14); other versions raise NpuallocError. `backend` sets
    NPUALLOC_BACKEND unless the environment already does; `conf` sets NPUALLOC_CONF
    (PyTorch syntax). Settings come from NPUALLOC_CONF, else from PYTORCH_NPU_ALLOC_CONF
    (keys npualloc does not have are ignored with one warning); a bad setting raises
    NpuallocError here. Returns the installed allocator (torch_npu's _NPUAllocator
    wrapper, as torch_npu.npu.memory.change_current_allocator takes it).
    """
    _set_env(backend, conf)
    import torch
    import torch_npu
    from torch_npu.npu import memory as npu_memory

    _check_version("torch_npu", torch_npu.__version__, SUPPORTED_TORCH_NPU, "npualloc.install()")
    _check_version("torch", torch.__version__, SUPPORTED_TORCH, "npualloc.install()")
    path = library_path()
    lib = load(path)
    shim = _build_shim(path)
    _check(shim.install_runtime_hooks(), lib)
    # Starts npualloc now: a bad setting or a missing runtime is one error here, rather
    # than a failed allocation later.
    _start(lib)
    allocator = npu_memory._NPUAllocator(shim.allocator())
    _swap(npu_memory.change_current_allocator, allocator)
    if not shim.set_device_allocator():
        raise NpuallocError("npualloc.install(): c10::GetAllocator(PrivateUse1) did not take "
                            "npualloc's allocator")
    global _shim
    _shim = shim
    return allocator


def install_cuda(conf=None):
    """Makes npualloc torch's CUDA allocator (a subclass of torch's CUDAAllocator, on
    npualloc's CUDA backend), so CUDA graphs and torch.compile(mode="reduce-overhead")
    work with it. Must run before CUDA is initialised. Supports torch 2.14; other
    versions raise NpuallocError. Builds a C++ shim once (needs the CUDA runtime headers:
    see _cuda_include_dirs). Returns the installed allocator (torch's _CUDAAllocator
    wrapper)."""
    _set_env("cuda", conf)
    import torch
    from torch.cuda import memory as cuda_memory

    _check_version("torch", torch.__version__, SUPPORTED_TORCH, "npualloc.install_cuda()")
    path = library_path()
    load(path)
    shim = _build_cuda_shim(path)
    allocator = cuda_memory._CUDAAllocator(shim.allocator())
    _swap(cuda_memory.change_current_allocator, allocator)
    if not shim.set_device_allocator():
        raise NpuallocError("npualloc.install_cuda(): c10::GetAllocator(CUDA) did not take "
                            "npualloc's allocator")
    global _shim
    _shim = shim
    return allocator


def _private_pools(lib, device):
    """npualloc_get_private_pool_stats: every entry (read again if pools were added)."""
    n = ctypes.c_size_t(0)
    pools = (PrivatePoolStats * 0)()
    while True:
        _check(lib.npualloc_get_private_pool_stats(device, pools, len(pools), ctypes.byref(n)), lib)
        if n.value <= len(pools):
            return pools[:n.value]
        pools = (PrivatePoolStats * n.value)()


def memory_stats(device=0, lib=None):
    """Statistics of `device` with torch 2.14's flat key names, as
    `torch.cuda.memory_stats()` gives them (`allocated_bytes.all.current`, ...,
    `num_alloc_retries`, `num_oom_rejections`, and per graph-private pool
    `reserved_bytes_by_private_pools.<id0>_<id1>.all.current` ...; torch_npu 2.14's
    `torch.npu.memory_stats()` has every key but the per-pool ones)."""
    lib = lib or load()
    _start(lib)
    s = DeviceStats()
    _check(lib.npualloc_get_device_stats(device, ctypes.byref(s)), lib)
    out = {}
    for name in STAT_ARRAYS:
        arr = getattr(s, name)
        for i, pool in enumerate(("all", "small_pool", "large_pool")):
            for field in ("current", "peak", "allocated", "freed"):
                out["%s.%s.%s" % (name, pool, field)] = getattr(arr[i], field)
    for name in ("oversize_allocations", "oversize_segments"):
        stat = getattr(s, name)
        for field in ("current", "peak", "allocated", "freed"):
            out["%s.%s" % (name, field)] = getattr(stat, field)
    for name in ("num_alloc_retries", "num_ooms", "num_sync_all_streams",
                 "num_device_alloc", "num_device_free", "max_split_size"):
        out[name] = getattr(s, name)
    out["num_oom_rejections"] = 0  # npualloc has no OOM preemption policy
    for p in _private_pools(lib, device):
        for i, pool in enumerate(("all", "small_pool", "large_pool")):
            for field in ("current", "peak", "allocated", "freed"):
                key = "reserved_bytes_by_private_pools.%d_%d.%s.%s" % (p.id_hi, p.id_lo, pool, field)
                out[key] = getattr(p.reserved_bytes[i], field)
    return out


def memory_summary(device=0, abbreviated=False, lib=None):
    """The memory summary of `device` as text: the table of torch_npu's
    `torch.npu.memory_summary()` (same layout, character for character; only the "all"
    rows when `abbreviated`), then one line on where reserved memory goes (reserved vs
    allocated, cached free inside partly used segments, whole empty segments)."""
    lib = lib or load()
    _start(lib)
    text = lib.npualloc_memory_summary(device, bool(abbreviated))
    if text is None:
        raise NpuallocError("npualloc.memory_summary(device=%d): %s" % (device, last_error(lib)))
    return text.decode("utf-8", "replace")


def empty_cache(lib=None):
    """Releases every cached, unused segment on every device."""
    lib = lib or load()
    lib.npualloc_empty_cache(True)


def dump_snapshot(path, lib=None):
    """Writes a memory snapshot of every device, in the shape of PyTorch's
    `torch.cuda.memory._snapshot()`, to `path`: a pickle when the name ends in .pickle or
    .pkl (what torch's `_memory_viz` reads), JSON otherwise. It holds the segments and
    blocks now, not an allocation history: `npualloc replay` needs a trace for that
    (NPUALLOC_TRACE)."""
    lib = lib or load()
    if not str(path).endswith((".pickle", ".pkl")):
        _check(lib.npualloc_dump_snapshot(os.fsencode(path)), lib)
        return
    fd, tmp = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        _check(lib.npualloc_dump_snapshot(os.fsencode(tmp)), lib)
        with open(tmp, encoding="utf-8") as f:
            snapshot = json.load(f)
    finally:
        os.unlink(tmp)
    with open(path, "wb") as f:
        pickle.dump(snapshot, f)


# malloc / free / record_stream without torch. The C functions return nothing on a
# failure (free, record_stream) or NULL (malloc) and store the message as this thread's
# last error; the library replaces that message on every failure, so a last-error
# pointer that changed across a call means the call failed.

_last_error_addresses = {}


def _last_error_address(lib):
    fn = _last_error_addresses.get(id(lib))
    if fn is None:
        fn = lib["npualloc_last_error"]  # a function object of its own: its own result type
        fn.restype = ctypes.c_void_p
        fn.argtypes = []
        _last_error_addresses[id(lib)] = fn
    return fn()


def _stream_handle(stream):
    if stream is None:
        return None
    if isinstance(stream, ctypes.c_void_p):
        return stream.value
    if isinstance(stream, int) and not isinstance(stream, bool) and stream >= 0:
        return stream
    raise TypeError("stream must be None (the default stream), a handle (int) or a "
                    "ctypes.c_void_p, not %r" % (stream,))


def _pointer(ptr):
    if isinstance(ptr, int) and not isinstance(ptr, bool) and ptr > 0:
        return ptr
    raise TypeError("ptr must be an address that npualloc.malloc() returned, not %r" % (ptr,))


def _call(lib, fn, *args):
    before = _last_error_address(lib)
    fn(*args)
    if _last_error_address(lib) != before:
        raise NpuallocError("npualloc: %s" % last_error(lib))


def malloc(size, device=0, stream=None, lib=None):
    """Allocates `size` bytes on `device` for use on `stream` (None: the default stream;
    else a stream handle, e.g. from `sim_stream()`); returns the address (an int), to
    pass to `free()`. Out of memory raises npualloc.OutOfMemoryError (also a MemoryError)
    with the allocator's message; other failures (unknown device or stream) raise
    NpuallocError. Recorded in the NPUALLOC_TRACE trace, if one is set."""
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ValueError("size must be a positive number of bytes, not %r" % (size,))
    lib = lib or load()
    _start(lib)
    p = lib.npualloc_malloc(size, device, _stream_handle(stream))
    if not p:
        msg = last_error(lib) or "unknown error"
        cls = OutOfMemoryError if "out of memory" in msg else NpuallocError
        raise cls("npualloc: %s" % msg)
    return p


def free(ptr, lib=None):
    """Frees an address `malloc()` returned; if it was recorded on other streams, its
    memory is reused only after the work queued on them so far. An unknown or already
    freed address raises NpuallocError and changes nothing."""
    lib = lib or load()
    _call(lib, lib.npualloc_free, _pointer(ptr), 0, 0, None)


def record_stream(ptr, stream, lib=None):
    """Marks the live allocation `ptr` as used on `stream` too (torch's
    `Tensor.record_stream`): after `free()`, its memory waits for that stream's work.
    An unknown address or stream raises NpuallocError."""
    lib = lib or load()
    _call(lib, lib.npualloc_record_stream, _pointer(ptr), _stream_handle(stream))


def sim_stream(device=0, lib=None):
    """A new stream on the simulated device (backend "sim"), as a handle for `malloc()`
    and `record_stream()`. With a real backend, use its streams' handles (e.g. torch_npu's
    `torch.npu.Stream().npu_stream`)."""
    lib = lib or load()
    _start(lib)
    s = ctypes.c_void_p()
    _check(lib.npualloc_sim_create_stream(device, ctypes.byref(s)), lib)
    return s.value
