"""Step 1 of docs/guides/torch-npu.md: record what your workload allocates, with
torch_npu's own allocator, as a snapshot npualloc can replay.
Usage: python record.py OUT.pickle"""
import sys

import torch
import torch_npu  # noqa: F401

from workload import step

torch.npu.memory._record_memory_history(max_entries=100000)
comm = torch.npu.Stream()
for _ in range(3):
    step(comm)
    torch.npu.synchronize()
torch.npu.memory._dump_snapshot(sys.argv[1])
torch.npu.memory._record_memory_history(enabled=None)
print("torch_npu's allocator: peak reserved %.1f MiB for a peak of %.1f MiB allocated"
      % (torch.npu.max_memory_reserved() / 2**20, torch.npu.max_memory_allocated() / 2**20))
print("wrote", sys.argv[1])
