"""Every NPUAllocator method (and inherited DeviceAllocator / Allocator method) that
torch_npu's Python API reaches, with npualloc installed: each works with torch_npu's
meaning or raises npualloc's one clear error naming the method; never torch_npu's
"does not yet support" (the header's defaults) and never an abort. The methods only
C++ reaches (and how npualloc answers each) are listed in docs/guides/torch-npu.md.

Seen to fail with setUseOnOOM refusing False too (deleting a MemPool terminates the
process: its destructor calls setUseOnOOM(False)), with c10::SetAllocator left out
(torch.accelerator.memory_stats() is torch_npu's own allocator's), and with raw_delete
not seeing npualloc_free's failure (a double caching_allocator_delete raises nothing)."""
from common import check, passed, start

ctx = start()
torch, torch_npu, npualloc = ctx.torch, ctx.torch_npu, ctx.npualloc
C = torch_npu._C
MIB = 1 << 20
dev = torch.npu.current_device()
results = {}


def works(method, fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - reported with the method's name
        raise AssertionError("%s: %s: %s" % (method, type(e).__name__, e)) from e
    results[method] = "works"


def refused(method, fn):
    try:
        fn()
    except RuntimeError as e:
        msg = str(e)
        check("npualloc does not support %s" % method in msg, "%s: not npualloc's error: %s" % (method, msg))
        check("does not yet support" not in msg, "%s: torch_npu's default answered: %s" % (method, msg))
        results[method] = "refused"
        return
    raise AssertionError("%s: no error" % method)


side = torch.npu.Stream()
t = torch.empty(MIB, dtype=torch.uint8, device="npu")


def allocate():
    check(t.data_ptr() != 0 and ctx.lib.npualloc_base_alloc(t.data_ptr(), None) is not None,
          "torch.empty's memory is not npualloc's")


def raw_deleter():
    check(C._has_Standard_Deleter(t.untyped_storage()._cdata), "the storage's deleter is not raw_deleter()")
    check(npualloc._shim.deleter_is_npualloc(), "torch_npu's allocator's raw_deleter() is not npualloc's")


def initialized():
    try:
        torch_npu.npu.memory.change_current_allocator(torch_npu.npu.memory._NPUAllocator(npualloc._shim.allocator()))
    except RuntimeError as e:
        check("already initialized" in str(e), str(e))
        return
    raise AssertionError("the allocator could be swapped after it was initialized")


def accelerator():
    stats = torch.accelerator.memory_stats()
    check(stats.get("allocated_bytes.all.current") == torch.npu.memory_allocated(),
          "torch.accelerator.memory_stats() is not npualloc's: %r" % stats.get("allocated_bytes.all.current"))
    torch.accelerator.empty_cache()  # DeviceAllocator::emptyCache(MempoolId_t {0, 0})
    free, total = torch.accelerator.get_memory_info()  # getMemoryInfo
    check(0 < free <= total, "get_memory_info: %r" % ((free, total),))


def aligned():
    x = torch_npu.empty_with_format((4096,), dtype=torch.uint8, device="npu", base_addr_aligned_kb=16)
    check(x.data_ptr() % (16 << 10) == 0, "allocate_with_aligned: %#x is not 16 KiB aligned" % x.data_ptr())


def raw_alloc():
    p = torch.npu.caching_allocator_alloc(MIB)
    q = torch.npu.caching_allocator_alloc(MIB, stream=side)  # raw_alloc_with_stream
    check(p != q and p and q, "raw_alloc")
    torch.npu.caching_allocator_delete(p)
    torch.npu.caching_allocator_delete(q)


def double_free():
    q = torch.npu.caching_allocator_alloc(MIB)
    torch.npu.caching_allocator_delete(q)
    try:
        torch.npu.caching_allocator_delete(q)  # a double free: npualloc's error
    except RuntimeError as e:
        check("npualloc" in str(e), "double raw_delete: %s" % e)
    else:
        raise AssertionError("a double raw_delete raised nothing")


def fraction():
    torch.npu.set_per_process_memory_fraction(0.5)
    check(abs(torch.npu.get_per_process_memory_fraction() - 0.5) < 1e-9, "getMemoryFraction")
    torch.npu.set_per_process_memory_fraction(1.0)


def streams():
    u = torch.empty(MIB, dtype=torch.uint8, device="npu")
    u.record_stream(side)  # recordStream
    torch_npu.npu.utils._erase_stream(u, side)  # eraseStream
    e = torch.npu.Event()
    e.record()
    side.wait_event(e)  # NPUEvent::block asks hasCapturesUnderway


def hccl():
    # ProcessGroupHCCL's erase-record-stream optimisation: the HCCL stream's use of a
    # block whose tensor died is erased for the work that recorded it, so the block is
    # reused before the HCCL stream ran (torch_npu's meaning); another work's erase does not.
    ctx.standin.launch(side)  # the "collective" has not run
    work = 0x5EED
    for erase_work, reused in ((work + 1, False), (work, True)):
        u = torch.empty(4 * MIB, dtype=torch.uint8, device="npu")
        ptr = u.data_ptr()
        block = npualloc._shim.test_hccl_record(u, side.stream_id, side.device_index, side.device_type, work)
        check(block == ptr, "getBlockPtr: %#x for %#x" % (block, ptr))
        del u
        npualloc._shim.test_hccl_erase(block, side.stream_id, side.device_index, side.device_type, erase_work)
        v = torch.empty(4 * MIB, dtype=torch.uint8, device="npu")
        check((v.data_ptr() == ptr) == reused, "after erasing for work %#x the block was%s reused"
              % (erase_work, "" if v.data_ptr() == ptr else " not"))
        del v
    ctx.standin.complete(side)


def pools():
    pool = torch_npu.npu.MemPool()  # createOrIncrefPool
    check(pool.use_count() == 1, "getPoolUseCount: %d" % pool.use_count())
    with torch_npu.npu.use_mem_pool(pool):  # beginAllocateToPool / endAllocateToPool / releasePool
        x = torch.empty(MIB, dtype=torch.uint8, device="npu")
    check(pool.use_count() == 1, "use_mem_pool left the use count at %d" % pool.use_count())
    check(any(tuple(s["segment_pool_id"]) == pool.id for s in pool.snapshot()), "snapshot(pool)")
    check(C._npu_checkPoolLiveAllocations(dev, pool.id, {x.untyped_storage().data_ptr()}), "checkPoolLiveAllocations")
    C._npu_getCheckpointState(dev, pool.id)
    del x
    del pool  # releasePool, setUseOnOOM(False), emptyCache(pool)


def history():
    torch.npu.memory._record_memory_history(max_entries=10, stacks="python")
    check(C._npu_isHistoryEnabled(), "isHistoryEnabled")
    torch.npu.memory._record_memory_history(enabled=None)


def capture():
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):  # markCaptureBegin / markCaptureEnd
        y = torch.empty(MIB, dtype=torch.uint8, device="npu")
    del y
    g.reset()


def stats():
    torch.npu.memory_stats()
    torch.npu.reset_accumulated_memory_stats()
    torch.npu.reset_peak_memory_stats()
    torch.npu.empty_cache()
    torch.npu.memory_snapshot()
    C._npu_attach_out_of_memory_observer(lambda *a: None)


works("allocate", allocate)
works("raw_deleter", raw_deleter)
works("initialized", initialized)
works("getDeviceStats, emptyCache(MempoolId_t), getMemoryInfo", accelerator)
works("allocate_with_aligned", aligned)
works("raw_alloc, raw_alloc_with_stream, raw_delete", raw_alloc)
works("getMemoryFraction, setMemoryFraction", fraction)
works("recordStream, eraseStream, hasCapturesUnderway", streams)
works("getBlockPtr, recordHcclWorkForBlock, eraseStreamWithBlockPtr", hccl)
works("createOrIncrefPool, getPoolUseCount, begin/endAllocateToPool, releasePool, snapshot, "
      "checkPoolLiveAllocations, getCheckpointState, setUseOnOOM(False)", pools)
works("recordHistory, isHistoryEnabled", history)
works("markCaptureBegin, markCaptureEnd", capture)
works("getDeviceStats, resetAccumulatedStats, resetPeakStats, emptyCache, snapshot, attachOutOfMemoryObserver", stats)
check(torch.npu.memory.get_allocator_backend() == "npualloc", "name(): %r" % torch.npu.memory.get_allocator_backend())

refused("emptyVirtAddrCache", torch.npu.empty_virt_addr_cache)
refused("setUseOnOOM", lambda: torch_npu.npu.MemPool(use_on_oom=True))
refused("setNoSplit", lambda: torch_npu.npu.MemPool(no_split=True))
refused("shareIpcHandle", lambda: t.untyped_storage()._share_npu_())
refused("checkBlockIsSafe", lambda: torch_npu.npu._recovery.check_npu_tensor_is_safe(t))
refused("markAllBlockUnsafe", lambda: torch_npu.npu._recovery.mark_all_npu_tensor_unsafe(dev))
refused("updateBlockToSafe", lambda: torch_npu.npu._recovery.update_npu_tensor_to_safe(t))

works("raw_delete of a pointer already freed", double_free)
for method, how in results.items():
    print("%-8s %s" % (how, method))
check(ctx.lib.npualloc_check_invariants(0) == 0, npualloc.last_error())
# After all the errors, allocation still works.
check(torch.empty(MIB, device="npu").data_ptr() != 0, "allocation after the errors")
passed("every_method")
