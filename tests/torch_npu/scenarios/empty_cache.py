"""torch.npu.empty_cache releases npualloc's cached segments to the device."""
from common import check, passed, start

ctx = start()
torch, si = ctx.torch, ctx.standin
xs = [torch.empty(n << 20, dtype=torch.uint8, device="npu") for n in (1, 5, 30)]
held = torch.npu.memory_reserved(0)
check(held > 0 and si.live_bytes(0) >= held, "nothing reserved")
del xs
check(torch.npu.memory_reserved(0) == held, "freed blocks stay cached")
torch.npu.empty_cache()
check(torch.npu.memory_reserved(0) == 0, "reserved after empty_cache: %d" % torch.npu.memory_reserved(0))
check(si.live_bytes(0) == 0, "device memory still held: %d" % si.live_bytes(0))
check(ctx.npualloc.memory_stats(0)["num_device_free"] >= 1, "no device free counted")
passed("empty_cache")
