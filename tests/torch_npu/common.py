"""Shared set-up of the torch_npu scenarios: each scenario is one fresh process.

`start()` imports the real torch and torch_npu (on the stand-in CANN libraries),
installs npualloc the documented way (`npualloc.install()` right after
`import torch_npu`) and returns a `Ctx` with torch, torch_npu, npualloc, the loaded
libnpualloc and the stand-in runtime's test controls (streams complete only when a
scenario says so).
"""

import ctypes
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))


class Counters(ctypes.Structure):
    """fake_acl_counters (tests/fake_acl/fake_acl.c)."""

    _fields_ = [(n, ctypes.c_uint64) for n in (
        "mallocs", "frees", "live_bytes", "events_created", "events_destroyed",
        "event_records", "violations", "set_device_calls", "synchronize_calls",
        "stream_waits", "init_calls", "maps", "unmaps", "live_reservations",
        "live_physical")]


class Standin:
    """The stand-in runtime's controls (the process's libascendcl.so)."""

    def __init__(self):
        self.lib = ctypes.CDLL("libascendcl.so")
        self.lib.fake_acl_launch.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint]
        self.lib.fake_acl_complete.argtypes = [ctypes.c_int, ctypes.c_void_p]
        self.lib.fake_acl_pending.argtypes = [ctypes.c_int, ctypes.c_void_p]
        self.lib.fake_acl_pending.restype = ctypes.c_uint64
        self.lib.fake_acl_live_bytes.restype = ctypes.c_uint64

    def launch(self, stream, n=1):
        """Queues `n` operations that do not run until `complete`."""
        assert self.lib.fake_acl_launch(stream.device.index or 0, stream.npu_stream, n) == 0

    def complete(self, stream):
        assert self.lib.fake_acl_complete(stream.device.index or 0, stream.npu_stream) == 0

    def pending(self, stream):
        return self.lib.fake_acl_pending(stream.device.index or 0, stream.npu_stream)

    def live_bytes(self, device=0):
        return self.lib.fake_acl_live_bytes(device)

    def counters(self):
        c = Counters()
        self.lib.fake_acl_get_counters(ctypes.byref(c))
        return c


class Ctx:
    pass


def start(install=True, **install_kwargs):
    import torch
    import torch_npu

    ctx = Ctx()
    ctx.torch, ctx.torch_npu = torch, torch_npu
    if install:
        import npualloc

        ctx.npualloc = npualloc
        ctx.allocator = npualloc.install(**install_kwargs)
        ctx.lib = npualloc.load()
    ctx.standin = Standin()
    return ctx


def check(cond, what):
    """Asserts with a message (scenarios run without pytest)."""
    if not cond:
        raise AssertionError(what)


def passed(name):
    print("PASS", name)
