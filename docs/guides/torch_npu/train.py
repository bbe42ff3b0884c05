"""Step 3 of docs/guides/torch-npu.md: the same workload with npualloc installed.
Usage: python train.py [SETTINGS]   (npualloc.install(conf=SETTINGS); default: none)"""
import sys

import torch
import torch_npu  # noqa: F401

import npualloc

npualloc.install(conf=sys.argv[1] if len(sys.argv) > 1 else None)  # before any NPU tensor

from workload import step  # noqa: E402

comm = torch.npu.Stream()
for _ in range(3):
    step(comm)
    torch.npu.synchronize()
ours = npualloc.memory_stats()
print("torch.npu.max_memory_reserved() == npualloc's:",
      torch.npu.max_memory_reserved() == ours["reserved_bytes.all.peak"])
print("npualloc: peak reserved %.1f MiB for a peak of %.1f MiB allocated"
      % (torch.npu.max_memory_reserved() / 2**20, torch.npu.max_memory_allocated() / 2**20))
print(npualloc.memory_summary(abbreviated=True).splitlines()[-1])
try:
    torch.empty(1 << 40, dtype=torch.uint8, device="npu")
except torch.OutOfMemoryError as e:
    print("OutOfMemoryError:", ". ".join(str(e).split(". ")[:2]))
