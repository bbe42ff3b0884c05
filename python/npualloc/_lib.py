"""Loading libnpualloc with ctypes and declaring the C ABI (include/npualloc.h)."""

import ctypes
import os
from pathlib import Path

_HERE = Path(__file__).resolve().parent


class Stat(ctypes.Structure):
    """npualloc_stat: one statistic."""

    _fields_ = [("current", ctypes.c_int64), ("peak", ctypes.c_int64),
                ("allocated", ctypes.c_int64), ("freed", ctypes.c_int64)]


StatArray = Stat * 3

STAT_ARRAYS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
               "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes")


class DeviceStats(ctypes.Structure):
    """npualloc_device_stats: PyTorch's DeviceStats less reserved_bytes_by_private_pools
    (PrivatePoolStats) and num_oom_rejections (always 0; see include/npualloc.h)."""

    _fields_ = [(name, StatArray) for name in STAT_ARRAYS] + [
        ("num_alloc_retries", ctypes.c_int64),
        ("num_ooms", ctypes.c_int64),
        ("oversize_allocations", Stat),
        ("oversize_segments", Stat),
        ("num_sync_all_streams", ctypes.c_int64),
        ("num_device_alloc", ctypes.c_int64),
        ("num_device_free", ctypes.c_int64),
        ("max_split_size", ctypes.c_int64),
    ]


class PrivatePoolStats(ctypes.Structure):
    """npualloc_private_pool_stats: one entry of reserved_bytes_by_private_pools."""

    _fields_ = [("id_hi", ctypes.c_uint64), ("id_lo", ctypes.c_uint64),
                ("reserved_bytes", StatArray)]


class SimCounters(ctypes.Structure):
    """npualloc_sim_counters (test-only controls of the simulated backend)."""

    _fields_ = [(n, ctypes.c_uint64) for n in (
        "mallocs", "frees", "live_bytes", "peak_bytes", "events_created",
        "events_destroyed", "event_records", "violations")]


def _bundled():
    """The library built into the package by `pip install` (setuptools-rust names it
    libnpualloc.<python extension suffix>), or the copy scripts/package-python.sh puts in
    lib/."""
    built = sorted(_HERE.glob("libnpualloc*.so"))
    return built + [_HERE / "lib" / "libnpualloc.so"]


def library_path():
    """Path of libnpualloc.so: $NPUALLOC_LIB, the library inside the installed package,
    or the repository's target/release (then target/debug) build."""
    env = os.environ.get("NPUALLOC_LIB")
    if env:
        return env
    candidates = _bundled()
    root = _HERE.parent.parent
    candidates += [root / "target" / "release" / "libnpualloc.so",
                   root / "target" / "debug" / "libnpualloc.so"]
    for c in candidates:
        if c.is_file():
            return str(c)
    raise FileNotFoundError(
        "libnpualloc.so not found: install the package with `pip install ./python` from a "
        "checkout of the repository (it builds the library; needs cargo), or set "
        "NPUALLOC_LIB to its path (looked in: %s)" % ", ".join(map(str, candidates)))


_SIGNATURES = {
    "npualloc_malloc": (ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]),
    "npualloc_free": (None, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]),
    "npualloc_init": (None, [ctypes.c_int]),  # the device count
    "npualloc_empty_cache": (None, [ctypes.c_bool]),
    "npualloc_empty_cache_all": (None, []),
    "npualloc_set_memory_fraction": (None, [ctypes.c_double, ctypes.c_int]),
    "npualloc_base_alloc": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]),
    "npualloc_record_stream": (None, [ctypes.c_void_p, ctypes.c_void_p]),
    "npualloc_erase_stream": (None, [ctypes.c_void_p, ctypes.c_void_p]),
    "npualloc_reset_peak_stats": (None, [ctypes.c_int]),
    "npualloc_get_device_stats": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(DeviceStats)]),
    "npualloc_get_private_pool_stats": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(PrivatePoolStats),
                                                       ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    "npualloc_last_error": (ctypes.c_char_p, []),
    "npualloc_memory_summary": (ctypes.c_char_p, [ctypes.c_int, ctypes.c_bool]),
    "npualloc_configure": (ctypes.c_int, [ctypes.c_char_p]),
    "npualloc_empty_cache_device": (ctypes.c_int, [ctypes.c_int]),
    "npualloc_dump_snapshot": (ctypes.c_int, [ctypes.c_char_p]),
    "npualloc_check_invariants": (ctypes.c_int, [ctypes.c_int]),
    "npualloc_begin_allocate_to_pool": (ctypes.c_int, [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64,
                                                       ctypes.c_void_p]),
    "npualloc_end_allocate_to_pool": (ctypes.c_int, [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]),
    "npualloc_release_pool": (ctypes.c_int, [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]),
    "npualloc_device_count": (ctypes.c_int, []),
    "npualloc_tag_stream": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_void_p]),
    "npualloc_record_tagged_stream": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p]),
    "npualloc_tagged_event_create": (ctypes.c_int, [ctypes.c_char_p]),
    "npualloc_tagged_event_record": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_void_p]),
    "npualloc_tagged_event_wait": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_void_p]),
    "npualloc_sim_create_stream": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]),
    "npualloc_sim_launch": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32]),
    "npualloc_sim_complete_stream": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p]),
    "npualloc_sim_get_counters": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(SimCounters)]),
}

_cached = {}


def load(path=None):
    """The loaded library (one per path), with every function's signature declared."""
    path = path or library_path()
    lib = _cached.get(path)
    if lib is None:
        lib = ctypes.CDLL(path)
        for name, (res, args) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype = res
            fn.argtypes = args
        _cached[path] = lib
    return lib


def address(lib, name):
    """The address of an exported function, as torch's pluggable allocators take it."""
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
