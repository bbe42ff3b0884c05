"""npualloc from Python without torch: allocations on the simulated device, recorded as
a trace for `npualloc replay`.

Run with NPUALLOC_BACKEND=sim (the simulated device) and NPUALLOC_TRACE=FILE (record
every malloc, free and record_stream): docs/guides/comparing-allocators.md, section 2."""
import npualloc

for step in range(3):
    acts = [npualloc.malloc(n << 20) for n in (6, 3, 3, 1, 6, 2)]  # kept for backward
    grads = []
    for a in reversed(acts):
        grads.append(npualloc.malloc(4 << 20))
        npualloc.free(a)
    for g in grads:
        npualloc.free(g)
stats = npualloc.memory_stats()
print("peak allocated %.1f MiB, peak reserved %.1f MiB"
      % (stats["allocated_bytes.all.peak"] / 2**20, stats["reserved_bytes.all.peak"] / 2**20))
try:
    npualloc.malloc(1 << 40)
except npualloc.OutOfMemoryError as e:
    print("OutOfMemoryError:", ". ".join(str(e).split(". ")[:2]))
npualloc.empty_cache()  # also writes out the trace
