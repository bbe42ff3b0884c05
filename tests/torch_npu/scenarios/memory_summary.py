"""With npualloc installed, npualloc.memory_summary() begins with exactly the text of
torch_npu's own torch.npu.memory_summary() (which reads npualloc's statistics through
the shim), full and abbreviated, and adds one fragmentation line (issue #19 item 2)."""
from common import check, passed, start

ctx = start()
torch, npualloc = ctx.torch, ctx.npualloc


def same_text(where):
    for abbreviated in (False, True):
        theirs = torch.npu.memory_summary(0, abbreviated=abbreviated)
        ours = npualloc.memory_summary(0, abbreviated=abbreviated)
        check(ours.startswith(theirs),
              "%s (abbreviated=%s): npualloc's summary does not begin with torch_npu's\n"
              "torch_npu:\n%s\nnpualloc:\n%s" % (where, abbreviated, theirs, ours))
        rest = ours[len(theirs):]
        # After torch_npu's text (which ends with the closing rule and a newline): the
        # fragmentation line, and nothing else.
        check(rest.startswith("reserved ") and rest.count("\n") == 1,
              "%s: after the table: %r" % (where, rest))


# torch_npu's memory_summary() needs the device initialised (before that its stats
# are empty and it raises KeyError): one allocation, freed, does it.
first = torch.empty(4096, dtype=torch.uint8, device="npu")
del first
same_text("one allocation, freed")
sizes = [1, 511, 512, 4096, 1 << 20, 3 << 20, (1 << 20) + 7, 25 << 20, 100, 300 << 20]
keep = [torch.empty(n, dtype=torch.uint8, device="npu") for n in sizes]
side = torch.npu.Stream()
with torch.npu.stream(side):
    more = [torch.empty(n, dtype=torch.uint8, device="npu") for n in sizes[:-1]]
same_text("two streams")
del keep[::2]
del more[1::2]
same_text("after frees")
torch.npu.reset_peak_memory_stats(0)
same_text("after reset_peak")
del keep, more
torch.npu.empty_cache()
same_text("after empty_cache")
print(npualloc.memory_summary(0, abbreviated=True))
passed("memory_summary")
