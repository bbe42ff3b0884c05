"""torch's own memory tools with npualloc installed (torch.npu.*, through torch_npu's
bindings into npualloc's complete allocator):

- _record_memory_history() + _snapshot() / _dump_snapshot(): segments and blocks with
  their state and the Python frames of the allocations; device_traces, one list per
  device, with alloc / free_requested / free_completed / segment_alloc / segment_free /
  oom entries and their frames; the dump is read by `npualloc replay` and by torch's
  _memory_viz; history off again;
- memory_snapshot() accounts for memory_allocated() and memory_reserved() exactly;
- memory_stats(), reset_accumulated_memory_stats() (counters to 0, current kept),
  memory_summary();
- an OOM observer attached through torch_npu is called with the device and the size
  asked for, and the allocation raises torch.OutOfMemoryError.

Seen to fail with snapshot() leaving device_traces empty (no alloc entry), with the
trace callback attaching no gathered context (an alloc entry without this script's
frame), and with the OOM observer not registered in npualloc (called 0 times)."""
import os
import pickle
import subprocess
import tempfile

from common import check, passed, start

ctx = start()
torch, torch_npu, npualloc = ctx.torch, ctx.torch_npu, ctx.npualloc
C = torch_npu._C
HERE = os.path.basename(__file__)

torch.npu.memory._record_memory_history(max_entries=100000, stacks="python")
check(C._npu_isHistoryEnabled(), "history is not enabled")


def layer(n):
    return torch.empty(n, dtype=torch.uint8, device="npu")


oom_calls = []
C._npu_attach_out_of_memory_observer(lambda *args: oom_calls.append(args))

side = torch.npu.Stream()
live = []
for i in range(40):
    live.append(layer((i % 7 + 1) << 18))
    if i % 3 == 0:
        live.pop(0)
with torch.npu.stream(side):
    s = layer(1 << 20)
live[0].record_stream(side)
del live[:5], s
huge = 4 << 30  # past the stand-in's 1 GiB device
try:
    layer(huge)
    raise AssertionError("no out-of-memory error")
except torch.OutOfMemoryError as e:
    check("npualloc" in str(e), "the OOM error does not carry npualloc's message: %s" % e)
check(len(oom_calls) == 1, "the OOM observer was called %d times" % len(oom_calls))
check(oom_calls[0][0] == 0 and oom_calls[0][1] >= huge, "OOM observer arguments: %r" % (oom_calls[0],))

snap = torch.npu.memory._snapshot()
traces = snap["device_traces"]
check(len(traces) == torch.npu.device_count(), "%d trace lists for %d devices" % (len(traces), torch.npu.device_count()))
events = traces[0]
actions = {e["action"] for e in events}
for a in ("alloc", "free_requested", "free_completed", "segment_alloc", "oom"):
    check(a in actions, "no %s entry in the trace (actions: %s)" % (a, sorted(actions)))
allocs = [e for e in events if e["action"] == "alloc"]
check(len(allocs) == 41, "%d alloc entries for 41 allocations" % len(allocs))
check(all(any(f["filename"].endswith(HERE) for f in e.get("frames", [])) for e in allocs),
      "an alloc entry without this script's frame")
blocks = [b for seg in snap["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"]
check(len(blocks) == len(live), "%d allocated blocks for %d live tensors" % (len(blocks), len(live)))
check(all(any(f["filename"].endswith(HERE) for f in b.get("frames", [])) for b in blocks),
      "an allocated block without this script's frame")
check(sum(b["size"] for b in blocks) == torch.npu.memory_allocated(),
      "the snapshot's allocated blocks do not add up to memory_allocated()")
check(sum(seg["total_size"] for seg in snap["segments"]) == torch.npu.memory_reserved(),
      "the snapshot's segments do not add up to memory_reserved()")

del live
torch.npu.empty_cache()
out = os.path.join(tempfile.mkdtemp(), "npualloc.pickle")
torch.npu.memory._dump_snapshot(out)
dumped = pickle.load(open(out, "rb"))
check(any(e["action"] == "segment_free" for e in dumped["device_traces"][0]), "no segment_free after empty_cache")
r = subprocess.run([os.environ["NPUALLOC_BIN"], "replay", out, "--quiet", "--json"], capture_output=True, text=True)
check(r.returncode == 0, "npualloc replay of the dump failed (%d): %s" % (r.returncode, r.stderr.strip()))
from torch.cuda import _memory_viz  # noqa: E402

check(len(_memory_viz.trace_plot(dumped)) > 0, "trace_plot produced nothing")
check(len(_memory_viz.segment_plot(dumped)) > 0, "segment_plot produced nothing")
torch.npu.memory._record_memory_history(enabled=None)
check(not C._npu_isHistoryEnabled(), "history still enabled")
check(torch.npu.memory._snapshot()["device_traces"][0] == [], "the trace was kept after recording stopped")

# Statistics.
keep = [layer(1 << 20) for _ in range(3)]
stats = torch.npu.memory_stats()
check(stats["allocation.all.allocated"] >= 3 and stats["num_ooms"] == 1, "stats: %r" % {
    k: stats[k] for k in ("allocation.all.allocated", "num_ooms")})
current = stats["allocated_bytes.all.current"]
torch.npu.reset_accumulated_memory_stats()
stats = torch.npu.memory_stats()
for k in ("allocation.all.allocated", "allocation.all.freed", "allocated_bytes.all.allocated", "num_ooms",
          "segment.all.allocated"):
    check(stats[k] == 0, "%s = %d after reset_accumulated_memory_stats" % (k, stats[k]))
check(stats["allocated_bytes.all.current"] == current, "reset_accumulated_memory_stats changed current")
own = npualloc.memory_stats(0, ctx.lib)
check(all(stats[k] == own[k] for k in stats if k in own), "torch.npu.memory_stats() differs from npualloc's")
summary = torch.npu.memory_summary()
check("Allocated memory" in summary and "Non-releasable memory" in summary, "memory_summary: %s" % summary[:300])
del keep
check(ctx.lib.npualloc_check_invariants(0) == 0, npualloc.last_error())
passed("memory_tools")
