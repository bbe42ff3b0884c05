#!/usr/bin/env python3
"""Record one zoo workload as a memory snapshot *with frames*, in the shape of PyTorch's
``torch.cuda.memory._snapshot()`` pickle, so ``npualloc replay --blame`` has call sites.

PyTorch's own ``_record_memory_history()`` records device allocators only, not the CPU
one, so this uses the profiler instead: ``torch.profiler.profile(profile_memory=True,
with_stack=True)`` around the workload's steps, as ``capture.py`` does, and each
allocation record's stack is the chain of Python calls above it in the profiler's event
tree (innermost first, ``{'filename', 'line', 'name'}`` as torch writes frames). Stacks
that are equal share one list object, as torch's snapshots share them. A free of memory
allocated before the profiled region is kept (``free_requested`` then
``free_completed``, with the frames of the code that freed it), as a snapshot of a run
recorded mid-way has them; ``segments`` is empty (the CPU allocator has none).

    nice -n 10 zoo-venv/bin/python scripts/zoo/snapshot_frames.py vit_infer out.pickle

(zoo-venv: the virtual environment of capture.py's docstring.)
"""

import os
import pickle
import re
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(__file__))
import capture  # noqa: E402  (the workloads)

PYCALL = re.compile(r"^(.*)\((\d+)\): (.*)$")


def records(prof):
    """(time, order, ptr, bytes, frames) of every allocation record, in time order."""
    out = []
    stacks = {}

    def frames_of(node):
        chain = []
        n = node.parent
        while n is not None:
            m = PYCALL.match(n.name)
            if m and not n.name.startswith("<built-in"):
                chain.append((m.group(1), int(m.group(2)), m.group(3)))
            n = n.parent
        key = tuple(chain)
        if key not in stacks:
            stacks[key] = [{"filename": f, "line": l, "name": nm} for f, l, nm in chain]
        return stacks[key]

    def walk(nodes):
        for n in nodes:
            ef = n.extra_fields
            if type(ef).__name__ == "_ExtraFields_Allocation":
                out.append((n.start_time_ns, len(out), ef.ptr, ef.alloc_size, frames_of(n)))
            walk(n.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())
    out.sort(key=lambda r: (r[0], r[1]))
    return out


def main():
    name, path = sys.argv[1], sys.argv[2]
    capture.seed()
    torch.set_num_threads(1)
    run = capture.WORKLOADS[name][1]()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True) as prof:
        run()
    trace, live = [], {}
    for t, _, ptr, size, frames in records(prof):
        ev = lambda a, s, fr: {"action": a, "addr": ptr, "size": s, "stream": 0,
                               "frames": fr, "time_us": t // 1000}
        if size > 0:
            live[ptr] = (size, frames)
            trace.append(ev("alloc", size, frames))
        elif size < 0:
            n, fr = live.pop(ptr, (-size, frames))
            trace.append(ev("free_requested", n, fr))
            trace.append(ev("free_completed", n, fr))
    with open(path, "wb") as f:
        pickle.dump({"segments": [], "device_traces": [trace]}, f, protocol=4)
    print(f"{path}: {len(trace)} events", file=sys.stderr)


if __name__ == "__main__":
    main()
