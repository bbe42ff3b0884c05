"""The stand-in runtime follows CANN's rules for calls made while a stream is captured
(standin_extra.c, "what CANN refuses during a capture"; tests/torch_npu/README.md):
the calls the scenarios rely on being refused are refused with the runtime's error code,
and the calls CANN allows (aclrtMalloc, aclrtFree, work on streams outside the capture)
are allowed, in each capture mode and from the capturing and another thread.

Drives the stand-in's libascendcl.so directly (no torch), on device 0."""
import ctypes
import threading

from common import check, passed, Standin

si = Standin()
acl = si.lib
vp = ctypes.c_void_p
for name in ("aclrtCreateStream", "aclrtCreateEvent"):
    getattr(acl, name).argtypes = [ctypes.POINTER(vp)]
acl.aclmdlRICaptureBegin.argtypes = [vp, ctypes.c_int]
acl.aclmdlRICaptureEnd.argtypes = [vp, ctypes.POINTER(vp)]
acl.aclmdlRICaptureThreadExchangeMode.argtypes = [ctypes.POINTER(ctypes.c_int)]
acl.aclrtMalloc.argtypes = acl.aclrtMallocAlign32.argtypes = [ctypes.POINTER(vp), ctypes.c_size_t, ctypes.c_int]
acl.aclrtMallocHost.argtypes = [ctypes.POINTER(vp), ctypes.c_size_t]
acl.aclrtFree.argtypes = acl.aclrtFreeHost.argtypes = [vp]
acl.aclrtMemset.argtypes = [vp, ctypes.c_size_t, ctypes.c_int, ctypes.c_size_t]
acl.aclrtMemcpy.argtypes = [vp, ctypes.c_size_t, vp, ctypes.c_size_t, ctypes.c_int]
acl.aclrtMemcpyAsync.argtypes = [vp, ctypes.c_size_t, vp, ctypes.c_size_t, ctypes.c_int, vp]
acl.aclrtRecordEvent.argtypes = acl.aclrtStreamWaitEvent.argtypes = [vp, vp]
acl.aclrtQueryEventStatus.argtypes = [vp, ctypes.POINTER(ctypes.c_int)]
acl.aclrtStreamQuery.argtypes = [vp, ctypes.POINTER(ctypes.c_int)]
acl.aclrtSynchronizeEvent.argtypes = acl.aclrtSynchronizeStream.argtypes = [vp]
acl.aclrtDestroyStream.argtypes = [vp]
acl.standin_capture_refusals.restype = ctypes.c_uint64

OK = 0
STREAM_CAPTURED, EVENT_CAPTURED, MODE_NOT_SUPPORT = 107027, 107028, 107030
NOT_CAPTURED, UNMATCHED, WRONG_THREAD, BLOCK_ASYNC = 107029, 107036, 107038, 107041
GLOBAL, THREAD_LOCAL, RELAXED = 0, 1, 2
H2D = 1

check(acl.aclrtSetDevice(0) == OK, "aclrtSetDevice")


def new(fn):
    h = vp()
    check(fn(ctypes.byref(h)) == OK, fn.__name__)
    return h


def exchange(mode):
    m = ctypes.c_int(mode)
    check(acl.aclmdlRICaptureThreadExchangeMode(ctypes.byref(m)) == OK, "exchange mode")
    return m.value


dev = vp()
check(acl.aclrtMalloc(ctypes.byref(dev), 4096, 0) == OK, "aclrtMalloc")
pinned, pageable = vp(), ctypes.create_string_buffer(4096)
check(acl.aclrtMallocHost(ctypes.byref(pinned), 4096) == OK, "aclrtMallocHost")


def memset():
    return acl.aclrtMemset(dev, 4096, 0, 4096)


def in_thread(fn, mode=None):
    """fn() on a new thread (with device 0 and, if given, its own capture mode)."""
    out = []

    def body():
        acl.aclrtSetDevice(0)
        if mode is not None:
            exchange(mode)
        out.append(fn())

    t = threading.Thread(target=body)
    t.start()
    t.join()
    return out[0]


capture, side, other = new(acl.aclrtCreateStream), new(acl.aclrtCreateStream), new(acl.aclrtCreateStream)
fork, outside = new(acl.aclrtCreateEvent), new(acl.aclrtCreateEvent)
status = ctypes.c_int()

# ---- a global-mode capture, begun on this thread -------------------------------------
check(acl.aclmdlRICaptureBegin(capture, GLOBAL) == OK, "capture begin")
check(acl.aclmdlRICaptureBegin(capture, GLOBAL) == STREAM_CAPTURED, "a stream captured twice")
check(acl.aclrtRecordEvent(fork, capture) == OK, "record in the capture")
check(acl.aclrtStreamWaitEvent(side, fork) == OK, "side stream joins")
check(acl.aclrtRecordEvent(outside, other) == OK, "record outside the capture")
# Allocation and free are not restricted by a capture, in any mode (torch_npu's own
# allocator calls aclrtMallocAlign32 inside torchair's global-mode captures).
p = vp()
check(acl.aclrtMalloc(ctypes.byref(p), 1 << 20, 0) == OK, "aclrtMalloc refused during a global capture")
check(acl.aclrtFree(p) == OK, "aclrtFree refused during a global capture")
check(acl.aclrtMallocAlign32(ctypes.byref(p), 1 << 20, 0) == OK, "aclrtMallocAlign32 refused (global capture)")
check(acl.aclrtFree(p) == OK, "aclrtFree refused during a global capture")
check(in_thread(lambda: acl.aclrtMalloc(ctypes.byref(vp()), 4096, 0)) == OK,
      "aclrtMalloc on another thread refused during a global capture")
# Synchronous memory calls are unsafe functions: refused in global mode, on every thread
# whose own mode is global; a thread in relaxed (or, not capturing, thread-local) mode may.
check(memset() == MODE_NOT_SUPPORT, "aclrtMemset allowed during a global capture")
check(acl.aclrtMemcpy(dev, 4096, pageable, 4096, H2D) == MODE_NOT_SUPPORT, "aclrtMemcpy allowed")
check(acl.aclrtMemcpyAsync(dev, 4096, pageable, 4096, H2D, side) == BLOCK_ASYNC,
      "an asynchronous copy from pageable memory allowed during a global capture")
check(acl.aclrtMemcpyAsync(dev, 4096, pinned, 4096, H2D, side) == OK,
      "an asynchronous copy from aclrtMallocHost memory refused")
check(in_thread(memset) == MODE_NOT_SUPPORT, "aclrtMemset on another global-mode thread allowed")
check(in_thread(memset, THREAD_LOCAL) == OK, "aclrtMemset on another thread-local-mode thread refused")
check(in_thread(memset, RELAXED) == OK, "aclrtMemset on another relaxed thread refused")
check(exchange(THREAD_LOCAL) == GLOBAL, "the default mode is global")
check(memset() == MODE_NOT_SUPPORT, "thread-local mode on the thread that began a global capture")
exchange(RELAXED)
check(memset() == OK, "aclrtMemset refused in relaxed mode")
# Queries and synchronisations of what the capture holds: refused in every mode.
check(acl.aclrtSynchronizeStream(capture) == STREAM_CAPTURED, "capture stream synchronised")
check(acl.aclrtStreamQuery(side, ctypes.byref(status)) == STREAM_CAPTURED, "joined stream queried")
check(acl.aclrtQueryEventStatus(fork, ctypes.byref(status)) == EVENT_CAPTURED, "captured event queried")
check(acl.aclrtSynchronizeEvent(fork) == EVENT_CAPTURED, "captured event synchronised")
check(acl.aclrtSynchronizeDevice() == STREAM_CAPTURED, "device synchronised during a capture")
check(acl.aclrtDestroyStream(side) == STREAM_CAPTURED, "a captured stream destroyed")
# ... but not what it does not hold.
check(acl.aclrtQueryEventStatus(outside, ctypes.byref(status)) == OK, "an event outside the capture")
check(acl.aclrtSynchronizeStream(other) == OK, "a stream outside the capture")
exchange(GLOBAL)
# The capture ends on its own stream, from its own thread.
model = vp()
check(acl.aclmdlRICaptureEnd(side, ctypes.byref(model)) == UNMATCHED, "ended on a joined stream")
check(in_thread(lambda: acl.aclmdlRICaptureEnd(capture, ctypes.byref(vp()))) == WRONG_THREAD,
      "a global capture ended from another thread")
check(acl.aclmdlRICaptureEnd(capture, ctypes.byref(model)) == OK, "capture end")
check(acl.aclmdlRICaptureEnd(capture, ctypes.byref(model)) == NOT_CAPTURED, "ended twice")
check(memset() == OK and acl.aclrtSynchronizeStream(side) == OK, "refused after the capture")

# ---- thread-local and relaxed captures ---------------------------------------------
check(acl.aclmdlRICaptureBegin(capture, THREAD_LOCAL) == OK, "thread-local capture")
check(memset() == MODE_NOT_SUPPORT, "aclrtMemset on the thread of a thread-local capture")
check(in_thread(memset) == OK, "aclrtMemset on another thread during a thread-local capture")
check(acl.aclrtSynchronizeStream(capture) == STREAM_CAPTURED, "stream synchronised (thread-local)")
check(acl.aclmdlRICaptureEnd(capture, ctypes.byref(model)) == OK, "thread-local end")
check(acl.aclmdlRICaptureBegin(capture, RELAXED) == OK, "relaxed capture")
check(memset() == OK, "aclrtMemset refused during a relaxed capture")
check(acl.aclrtSynchronizeStream(capture) == STREAM_CAPTURED, "stream synchronised (relaxed)")
check(in_thread(lambda: acl.aclmdlRICaptureEnd(capture, ctypes.byref(vp()))) == OK,
      "a relaxed capture ended from another thread")

check(acl.standin_capture_refusals() == 14, "refusals counted: %d" % acl.standin_capture_refusals())
check(acl.aclrtFree(dev) == OK and acl.aclrtFreeHost(pinned) == OK, "cleanup")
check(si.counters().violations == 0, "the stand-in saw misuse")
passed("standin_capture_rules")
