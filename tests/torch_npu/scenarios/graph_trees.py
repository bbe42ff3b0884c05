"""torch_npu's graph trees with npualloc installed: torch.compile(f, backend="npugraphs")
over several shapes, with torch's default slow_path_cudagraph_asserts (which calls
checkPoolLiveAllocations on every run of a recorded graph). Graph trees warm up in the
tree's pool (_npu_beginAllocateCurrentThreadToPool), record each shape into that pool,
take a checkpoint after every recording (getCheckpointState) and restore one when they
switch branches (setCheckpointPoolState); their generation checks compare every
output's deleter with the allocator's raw_deleter().

Seen to fail with setCheckpointPoolState's DataPtrs carrying another deleter than
raw_deleter(): graph trees' own check (_has_Standard_Deleter) raises. (A
checkPoolLiveAllocations that answers false is not caught here: graph trees then check
the pool through memory_snapshot(), which agrees, and go on.)"""
from common import check, passed, start

ctx = start()
torch, npualloc = ctx.torch, ctx.npualloc
from torch._inductor import config as inductor_config  # noqa: E402

check(inductor_config.triton.slow_path_cudagraph_asserts, "graph trees' slow-path asserts are off by default")


# `h` is an intermediate freed inside each recording (the stand-in's aclnn operators
# are accepted and do nothing: shapes, not values, are checked).
def f(x, w):
    h = torch.matmul(x, w)
    return torch.relu(h) + 1, x.clone()


compiled = torch.compile(f, backend="npugraphs", dynamic=False)
w = torch.ones(64, 64, device="npu")
outs = []
for rows in (8, 32, 8, 128, 32, 8):
    x = torch.ones(rows, 64, device="npu")
    for _ in range(3):  # warm-up, recording, replay
        y, z = compiled(x, w)
        check(tuple(y.shape) == (rows, 64) and tuple(z.shape) == (rows, 64),
              "output shapes %r, %r for %d rows" % (tuple(y.shape), tuple(z.shape), rows))
    outs.append((y, z))
torch.npu.synchronize()

calls = npualloc._shim.method_calls()
print("graph-mode calls:", calls)
for method in ("beginAllocateToPool", "getCheckpointState", "setCheckpointPoolState", "checkPoolLiveAllocations"):
    check(calls[method] > 0, "graph trees never called %s: %r" % (method, calls))
pools = {tuple(s["segment_pool_id"]) for s in torch.npu.memory_snapshot()} - {(0, 0)}
check(len(pools) >= 1, "no segment of the graph trees' pool in the snapshot")
check(npualloc.last_error() is None, "npualloc error: %s" % npualloc.last_error())
del outs, y, z, x
torch._dynamo.reset()
torch.npu.synchronize()
check(ctx.lib.npualloc_check_invariants(0) == 0, npualloc.last_error())
passed("graph_trees")
