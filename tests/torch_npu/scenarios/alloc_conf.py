"""PYTORCH_NPU_ALLOC_CONF as torch_npu 2.14 accepts it (issue #13 item 7).

Each case runs in its own process: (1) torch_npu's own allocator accepts the whole key
list (so the stand-in's CUDA-key interposer kept torch_npu's key set intact); (2) with
npualloc installed, torch_npu's documented `expandable_segments:True,
base_addr_aligned_kb:16` and the whole list work, the ignored keys named once on
stderr, `segment_size_mb` and `per_process_memory_fraction` honoured; (3) an invalid
setting is one clear error from npualloc.install(), not a NULL from every malloc."""
import os
import subprocess
import sys

from common import check, passed

EVERY_KEY = ("expandable_segments:True,base_addr_aligned_kb:16,segment_size_mb:40,"
             "per_process_memory_fraction:0.5,pinned_use_background_threads:True,"
             "pinned_max_round_threshold_mb:4,pinned_max_cached_size_mb:64,"
             "pin_memory_expandable_segments:False,pinned_mem_register:False,"
             "pinned_reserve_segment_size_mb:8,multi_stream_lazy_reclaim:True,"
             "release_lock_on_npumalloc:True,throw_on_npumalloc_oom:False,"
             "large_segment_size_mb:40,roundup_power2_divisions:4")

NATIVE = """
import torch, torch_npu
x = torch.empty(1 << 20, device="npu")
print("native ok", torch.npu.memory_reserved())
"""

WITH_NPUALLOC = """
import common
ctx = common.start()
torch, npualloc = ctx.torch, ctx.npualloc
x = torch.empty(300 << 20, dtype=torch.uint8, device="npu")
y = torch.empty(1 << 20, dtype=torch.uint8, device="npu")
common.check(npualloc.last_error() is None, npualloc.last_error())
s = npualloc.memory_stats()
common.check(s["allocation.all.current"] == 2, "allocations")
print("reserved", torch.npu.memory_reserved(), "maps", ctx.standin.counters().maps)
if "fraction" in __import__("sys").argv:
    try:
        torch.empty(300 << 20, dtype=torch.uint8, device="npu")
        raise AssertionError("per_process_memory_fraction:0.5 of 1 GiB not honoured")
    except torch.OutOfMemoryError:
        pass
print("npualloc ok")
"""


def run(code, conf, *args):
    env = dict(os.environ, PYTORCH_NPU_ALLOC_CONF=conf)
    return subprocess.run([sys.executable, "-c", code] + list(args), env=env,
                          capture_output=True, text=True)


r = run(NATIVE, EVERY_KEY)
check(r.returncode == 0 and "native ok" in r.stdout,
      "torch_npu itself refuses the key list (key set not intact?): %s" % r.stderr[-1500:])

r = run(WITH_NPUALLOC, "expandable_segments:True,base_addr_aligned_kb:16")
check(r.returncode == 0 and "npualloc ok" in r.stdout, "documented setting: %s" % r.stderr[-2000:])
check(r.stderr.count("ignoring base_addr_aligned_kb") == 1, "no single warning: %s" % r.stderr[-1000:])
maps = int(r.stdout.split("maps ")[1].split()[0])
check(maps > 0, "expandable_segments:True not honoured (no page maps)")

r = run(WITH_NPUALLOC, EVERY_KEY, "fraction")
check(r.returncode == 0 and "npualloc ok" in r.stdout, "every key: %s" % r.stderr[-2000:])
check(r.stderr.count("npualloc: PYTORCH_NPU_ALLOC_CONF: ignoring") == 1, "warned more than once")

r = run(WITH_NPUALLOC, "expandable_segments:True,base_addr_aligned_kb:99")
check(r.returncode != 0, "an invalid setting was accepted")
check("NpuallocError" in r.stderr and "base_addr_aligned_kb" in r.stderr,
      "not one clear error from install: %s" % r.stderr[-1500:])
check("npualloc.install" in r.stderr or "install()" in r.stderr or "in start" in r.stderr,
      "the error did not come from install")
passed("alloc_conf")
