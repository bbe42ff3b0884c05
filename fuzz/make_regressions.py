#!/usr/bin/env python3
"""Writes fuzz/regressions/<target>/: the inputs that crashed or misbehaved before
(#13 item 8, #17 items 1-4). They seed the fuzz corpus and run in every test run
(tests/all/fuzz_props.rs). Run from the repository root: python3 fuzz/make_regressions.py"""
import os
import pickle
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "regressions")


def write(target, name, data):
    os.makedirs(os.path.join(root, target), exist_ok=True)
    with open(os.path.join(root, target, name), "wb") as f:
        f.write(data)


# #17 item 4: 2,000 nested lists overflowed the stack (debug; 7,000 in release).
sys.setrecursionlimit(10000)
x = []
for _ in range(2000):
    x = [x]
write("snapshot_pickle", "nested_lists_2000.pickle", pickle.dumps(x, 4))
# #13 item 8: events sharing frame lists and frame dicts ("recursive structure found").
frame = {"filename": "model.py", "line": 3, "name": "forward"}
frames = [frame, {"filename": "train.py", "line": 9, "name": "step"}]
ev = lambda a, addr: {"action": a, "addr": addr, "size": 512, "stream": 0, "frames": frames}
snap = {"segments": [], "device_traces": [[ev("alloc", 4096), ev("alloc", 8192), ev("free_requested", 4096)]]}
write("snapshot_pickle", "shared_frames.pickle", pickle.dumps(snap, 4))
# #17 item 1: 17 live allocations of 2^60 bytes overflowed the live total.
write("trace_parse", "huge_live_total.trace", "".join(f"a {i} {1 << 60} 0\n" for i in range(17)).encode())
# #17 item 2: an allocation id of u64::MAX overflowed the repetition's id shift.
write("trace_parse", "max_id.trace", f"a {2**64 - 1} 100 0\na 0 5 1\nf 0\n".encode())
# #17 item 3: roundup_power2_divisions of 2^55 overflowed the rounding (first byte: size offset).
write("config_parse", "divisions_2_55", b"\x07roundup_power2_divisions:36028797018963968")
write("config_parse", "divisions_list", b"\x01roundup_power2_divisions:[256:1,>:36028797018963968]")
