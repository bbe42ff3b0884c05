"""Tensor.record_stream on a torch.npu.Stream: the block is not reused before that
stream's work has run (the stand-in's streams complete only when the test says so);
once it has run, the block is reused. Runs through torch_npu's task queue, so the
shim's event hook must drain it before recording."""
from common import check, passed, start

ctx = start()
torch, si = ctx.torch, ctx.standin
side = torch.npu.Stream()
n = 3 << 20
x = torch.empty(n, dtype=torch.uint8, device="npu")
ptr = x.data_ptr()
si.launch(side, 4)  # work the side stream has not run
x.record_stream(side)
del x
y = torch.empty(n, dtype=torch.uint8, device="npu")
check(y.data_ptr() != ptr, "block reused while the recorded stream still had work queued")
check(si.pending(side) > 0, "the side stream ran by itself")
del y
si.complete(side)
z = torch.empty(n, dtype=torch.uint8, device="npu")
check(z.data_ptr() == ptr, "block not reused after the stream's work ran (got %#x, want %#x)"
      % (z.data_ptr(), ptr))
check(si.counters().violations == 0, "stand-in saw misuse")
check(ctx.npualloc.last_error() is None, ctx.npualloc.last_error())
passed("record_stream")
