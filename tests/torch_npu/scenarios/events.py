"""torch.npu.Event record / wait / query with npualloc installed: an event recorded on a
stream with unrun work is not complete, becomes complete when the stream runs, and a
wait on it reaches the runtime."""
from common import check, passed, start

ctx = start()
torch, si = ctx.torch, ctx.standin
side = torch.npu.Stream()
x = torch.empty(1 << 20, device="npu")
si.launch(side, 2)
e = torch.npu.Event()
e.record(side)
check(not e.query(), "event complete while its stream has work queued")
waits = si.counters().stream_waits
torch.npu.current_stream().wait_event(e)
torch.npu.current_stream().query()  # drains torch_npu's task queue
check(si.counters().stream_waits > waits, "wait_event did not reach the runtime")
si.complete(side)
check(e.query(), "event not complete after its stream ran")
e.synchronize()
check(ctx.npualloc.last_error() is None, ctx.npualloc.last_error())
del x
passed("events")
