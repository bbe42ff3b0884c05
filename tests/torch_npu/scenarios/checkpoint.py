"""torch_npu's checkpoint entry points with npualloc installed, straight through
torch_npu._C as graph trees and torchair call them, on a capture whose pool holds
blocks of two streams (the capture stream and a side stream that joined it):

- _npu_checkPoolLiveAllocations(device, pool, set): true iff the pool's allocated
  blocks are exactly the set;
- _npu_getCheckpointState(device, pool) after the capture; then the pool changes (an
  output dies, a warm-up allocation is made into the pool);
- _npu_setCheckpointPoolState(device, state, stale storages, storages to add deleters
  to): the blocks allocated now are freed, the checkpoint's allocated blocks come back
  at their addresses (one into a storage made without a deleter, which then carries
  npualloc's raw_deleter: _has_Standard_Deleter), the stale storages' deleters are
  swapped out by torch_npu (which needs them to be npualloc's raw_deleter);
- errors for an unknown pool and for a state of another device, with npualloc's
  message.

Seen to fail with setCheckpointPoolState's DataPtrs carrying another deleter than
raw_deleter(): _has_Standard_Deleter of the restored storage is false."""
from common import check, passed, start

ctx = start()
torch, torch_npu, npualloc = ctx.torch, ctx.torch_npu, ctx.npualloc
C = torch_npu._C
MIB = 1 << 20
dev = torch.npu.current_device()


def raises_npualloc(fn, what):
    try:
        fn()
    except RuntimeError as e:
        check("npualloc" in str(e), "%s: the error does not name npualloc: %s" % (what, e))
        return str(e)
    raise AssertionError("%s: no error" % what)


def pool_blocks(pool):
    """(address, size, state) of every block of the pool's segments."""
    out = []
    for s in torch.npu.memory_snapshot():
        if tuple(s["segment_pool_id"]) != tuple(pool):
            continue
        addr = s["address"]
        for b in s["blocks"]:
            out.append((addr, b["size"], b["state"]))
            addr += b["size"]
    return sorted(out)


def live(pool, *ptrs):
    return C._npu_checkPoolLiveAllocations(dev, pool, set(ptrs))


pool = torch.npu.graph_pool_handle()
capture, side = torch.npu.Stream(), torch.npu.Stream()
g = torch.npu.NPUGraph()
with torch.npu.graph(g, stream=capture, pool=pool):
    fork = torch.npu.Event()
    fork.record()
    side.wait_event(fork)
    with torch.npu.stream(side):
        b = torch.empty(3 * MIB, dtype=torch.uint8, device="npu")  # an output of the side stream
        tmp = torch.empty(5 * MIB, dtype=torch.uint8, device="npu")
        joined = torch.npu.Event()
        joined.record(side)
    torch.npu.current_stream().wait_event(joined)
    a = torch.empty(2 * MIB, dtype=torch.uint8, device="npu")  # an output of the capture stream
    del tmp
a_ptr, b_ptr = a.untyped_storage().data_ptr(), b.untyped_storage().data_ptr()
streams = {s["stream"] for s in torch.npu.memory_snapshot() if tuple(s["segment_pool_id"]) == tuple(pool)}
check(len(streams) == 2, "the pool's segments are on %d stream(s), not the capture's 2" % len(streams))

check(live(pool, a_ptr, b_ptr), "the pool's allocated blocks are a and b")
check(not live(pool, a_ptr), "a alone is not the pool's allocated set")
check(not live(pool, a_ptr, b_ptr, a_ptr + 512), "a set with one more pointer is not")
state = C._npu_getCheckpointState(dev, pool)
before = pool_blocks(pool)

# The pool changes: b dies, a warm-up allocation goes into the pool.
del b
check(live(pool, a_ptr), "after b died the pool's allocated set is {a}")
C._npu_beginAllocateCurrentThreadToPool(dev, pool)
z = torch.empty(MIB, dtype=torch.uint8, device="npu")
C._npu_endAllocateToPool(dev, pool)
C._npu_releasePool(dev, pool)
z_ptr = z.untyped_storage().data_ptr()
check(live(pool, a_ptr, z_ptr), "the warm-up allocation is the pool's")

# Restore: a's and z's blocks are freed (their storages are stale), b's block comes back
# into a storage made without a deleter; a's comes back too (allocated in the checkpoint).
new_b = C._construct_storage_from_data_pointer(b_ptr, a.device, 3 * MIB)
check(not C._has_Standard_Deleter(new_b._cdata), "a storage made from a pointer has no deleter yet")
C._npu_setCheckpointPoolState(dev, state, [a.untyped_storage()._cdata, z.untyped_storage()._cdata], [new_b._cdata])
check(C._has_Standard_Deleter(new_b._cdata), "the restored block's DataPtr does not carry npualloc's raw_deleter")
check(not C._has_Standard_Deleter(z.untyped_storage()._cdata), "the stale storage kept its deleter")
check(live(pool, a_ptr, b_ptr), "after the restore the pool's allocated set is the checkpoint's {a, b}")
# The checkpointed segments hold exactly the checkpointed blocks again; the segment the
# warm-up allocation took (on another stream, after the checkpoint) stays in the pool,
# wholly free, as PyTorch leaves it.
after = pool_blocks(pool)
starts = {addr for addr, _, _ in before}
check([blk for blk in after if blk[0] in starts] == before, "the pool's blocks differ from the checkpoint's:\n%r\n%r"
      % (after, before))
check(all(state == "inactive" for addr, _, state in after if addr not in starts),
      "a block outside the checkpointed segments is still in use: %r" % after)

# Bad input: one clear error each, nothing lost.
raises_npualloc(lambda: C._npu_getCheckpointState(dev, (12345, 678)), "checkpoint of an unknown pool")
raises_npualloc(lambda: C._npu_checkPoolLiveAllocations(dev, (12345, 678), set()), "live check of an unknown pool")
check(live(pool, a_ptr, b_ptr), "the pool changed after the errors")

# The restored blocks are freed as graph trees free them: the storage's deleter, and
# raw_delete for the one no storage owns.
del new_b
torch.npu.caching_allocator_delete(a_ptr)
check(live(pool), "the pool still has allocated blocks")
del a, z
g.reset()
torch.npu.empty_cache()
check(pool_blocks(pool) == [], "the pool's segments stayed after its graph was reset")
check(ctx.lib.npualloc_check_invariants(0) == 0, npualloc.last_error())
passed("checkpoint")
