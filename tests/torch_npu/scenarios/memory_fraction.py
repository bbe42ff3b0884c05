"""torch.npu.set_per_process_memory_fraction reaches npualloc: with a quarter of the
stand-in's 1 GiB, 200 MiB fits and 300 MiB more is out of memory."""
from common import check, passed, start

ctx = start()
torch = ctx.torch
torch.npu.set_per_process_memory_fraction(0.25, 0)
a = torch.empty(200 << 20, dtype=torch.uint8, device="npu")
try:
    b = torch.empty(300 << 20, dtype=torch.uint8, device="npu")
    raise AssertionError("300 MiB more allowed under a 256 MiB cap")
except torch.OutOfMemoryError as e:
    check("npualloc" in str(e) and "out of memory" in str(e), "message: %s" % e)
check(torch.npu.memory_reserved(0) <= 256 << 20, "reserved past the cap")
del a
passed("memory_fraction")
