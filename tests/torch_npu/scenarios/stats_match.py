"""torch.empty of mixed sizes on npu is served by npualloc, and torch.npu's
memory_allocated / max_memory_allocated / memory_reserved / memory_stats equal npualloc's
own figures exactly, also with allocations on two streams (issue #13 item 5: every
statistic torch_npu reports comes from npualloc through the shim)."""
from common import check, passed, start

ctx = start()
torch, npualloc = ctx.torch, ctx.npualloc


def same_figures(where):
    ours = npualloc.memory_stats(0)
    theirs = torch.npu.memory_stats(0)
    check(torch.npu.memory_allocated(0) == ours["allocated_bytes.all.current"], where + ": allocated")
    check(torch.npu.max_memory_allocated(0) == ours["allocated_bytes.all.peak"], where + ": peak")
    check(torch.npu.memory_reserved(0) == ours["reserved_bytes.all.current"], where + ": reserved")
    check(torch.npu.max_memory_reserved(0) == ours["reserved_bytes.all.peak"], where + ": reserved peak")
    missing = [k for k in ours if k not in theirs]
    check(not missing, where + ": torch_npu lacks %s" % missing[:5])
    differ = {k: (ours[k], theirs[k]) for k in ours if theirs[k] != ours[k]}
    check(not differ, where + ": differ %s" % differ)
    check(theirs.get("num_oom_rejections", 0) == 0, where + ": num_oom_rejections")
    check(ours["allocation.all.current"] > 0 or where == "end", where + ": nothing allocated")


sizes = [1, 511, 512, 4096, 1 << 20, 3 << 20, (1 << 20) + 7, 25 << 20, 100]
keep = [torch.empty(n, dtype=torch.uint8, device="npu") for n in sizes]
for t in keep:
    check(ctx.lib.npualloc_base_alloc(t.data_ptr(), None) is not None, "not served by npualloc")
same_figures("one stream")
side = torch.npu.Stream()
with torch.npu.stream(side):
    more = [torch.empty(n, dtype=torch.uint8, device="npu") for n in sizes[::-1]]
same_figures("two streams")
check(npualloc.memory_stats(0)["allocation.all.current"] == 2 * len(sizes), "count")
del keep[::2]
del more[1::2]
same_figures("after frees")
torch.npu.reset_peak_memory_stats(0)
same_figures("after reset_peak")
check(npualloc.memory_stats(0)["allocated_bytes.all.peak"] == torch.npu.memory_allocated(0),
      "peak not reset")
check(ctx.lib.npualloc_check_invariants(0) == 0, npualloc.last_error())
passed("stats_match")
