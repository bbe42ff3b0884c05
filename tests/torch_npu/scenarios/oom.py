"""An allocation past the device's memory raises torch's out-of-memory error, carrying
npualloc's message."""
from common import check, passed, start

ctx = start()
torch = ctx.torch
keep = torch.empty(600 << 20, dtype=torch.uint8, device="npu")
try:
    torch.empty(700 << 20, dtype=torch.uint8, device="npu")
    raise AssertionError("700 MiB more fitted in the 1 GiB stand-in")
except torch.OutOfMemoryError as e:
    msg = str(e)
    ours = ctx.npualloc.last_error() or ""
    check("out of memory" in ours.lower(), "npualloc's error: %r" % ours)
    check(ours in msg and "Tried to allocate" in msg, "torch's message lacks npualloc's: %r" % msg)
check(ctx.npualloc.memory_stats(0)["num_ooms"] == 1, "num_ooms")
check(torch.npu.memory_stats(0)["num_ooms"] == 1, "torch_npu's num_ooms")
after = torch.empty(100 << 20, dtype=torch.uint8, device="npu")  # still usable
del keep, after
passed("oom")
