"""A snapshot written by `npualloc replay --snapshot x.pickle` opens in torch's own
memory viewer code, torch.cuda._memory_viz: segment_plot, trace_plot and segsum run on
it and show the replay's segments (issue #19 item 4)."""
import os
import pickle
import subprocess
import tempfile

from common import REPO, check, passed, start

ctx = start(install=False)
from torch.cuda import _memory_viz as viz  # noqa: E402

out = os.path.join(tempfile.mkdtemp(), "gpt2.pickle")
trace = os.path.join(REPO, "traces", "gpt2_infer.trace")
r = subprocess.run([os.environ["NPUALLOC_BIN"], "replay", trace, "--quiet", "--snapshot", out],
                   capture_output=True, text=True)
check(r.returncode == 0, "replay failed (%d): %s" % (r.returncode, r.stderr.strip()))
with open(out, "rb") as f:
    snap = pickle.load(f)
segments = snap["segments"]
check(segments, "no segments in the snapshot")
reserved = sum(s["total_size"] for s in segments)

page = viz.segment_plot(snap)
check(isinstance(page, str) and len(page) > 1000, "segment_plot gave %r" % (page[:200],))
# trace_plot draws the snapshot's device_traces (the replay's allocation history).
check(any(snap.get("device_traces", [])), "no device_traces in the snapshot")
page = viz.trace_plot(snap)
check(isinstance(page, str) and len(page) > 1000, "trace_plot gave %r" % (page[:200],))
summary = viz.segsum(snap)
check(isinstance(summary, str) and "Summary of segments" in summary, "segsum: %r" % summary[:300])
# segsum also checks its own accounting (allocated + free = reserved, per segment).
check("total_reserved: %r" % viz.Bytes(reserved) in summary,
      "segsum does not show the %d bytes reserved:\n%s" % (reserved, summary[-600:]))
check("segments: %d" % len(segments) in summary, "segsum's segment count")
print(summary.splitlines()[0])
passed("memory_viz")
