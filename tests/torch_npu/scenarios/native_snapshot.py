"""A snapshot of torch_npu's own allocator (no npualloc), taken on the stand-in with
frames kept (_record_memory_history + _dump_snapshot), is read by `npualloc replay` and
`npualloc convert` (issue #13 item 8: torch's pickles share frame lists and dicts
between events through pickle memo references)."""
import os
import pickle
import subprocess
import tempfile

from common import check, passed, start

ctx = start(install=False)
torch = ctx.torch
torch.npu.memory._record_memory_history(max_entries=100000)  # stacks kept (default)


def layer(n):
    return torch.empty(n, dtype=torch.uint8, device="npu")


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
out = os.path.join(tempfile.mkdtemp(), "native.pickle")
torch.npu.memory._dump_snapshot(out)
torch.npu.memory._record_memory_history(enabled=None)

snap = pickle.load(open(out, "rb"))
events = [e for t in snap["device_traces"] for e in t]
check(len(events) >= 50, "few trace events: %d" % len(events))
check(any(e.get("frames") for e in events), "no frames in the snapshot")
ids = [id(e["frames"]) for e in events if e.get("frames")]
shared = len(ids) - len(set(ids))
print("events %d, frame lists shared between events: %d" % (len(events), shared))

npualloc_bin = os.environ["NPUALLOC_BIN"]
r = subprocess.run([npualloc_bin, "replay", out, "--quiet", "--json"], capture_output=True, text=True)
check(r.returncode == 0, "replay failed (%d): %s" % (r.returncode, r.stderr.strip()))
trace = out + ".trace"
r = subprocess.run([npualloc_bin, "convert", out, "-o", trace], capture_output=True, text=True)
check(r.returncode == 0, "convert failed (%d): %s" % (r.returncode, r.stderr.strip()))
lines = [l for l in open(trace) if l[:1] in "afrs"]
allocs = sum(1 for l in lines if l.startswith("a "))
check(allocs >= 40, "converted trace has %d allocations" % allocs)
streams = {l.split()[3] for l in lines if l.startswith("a ")}
check(len(streams) == 2, "allocations on %d stream(s) in the trace, not 2" % len(streams))
r = subprocess.run([npualloc_bin, "replay", trace, "--quiet", "--json"], capture_output=True, text=True)
check(r.returncode == 0, "the converted trace does not replay: %s" % r.stderr.strip())
passed("native_snapshot")
