"""A stand-in training step for docs/guides/torch-npu.md: layers of activations kept for
the backward pass, a gradient all-reduced on a side ("communication") stream, then
freed. Replace it with your model; nothing here is specific to npualloc."""
import torch
import torch_npu  # noqa: F401  (registers the npu device)


def step(comm):
    acts = []
    for i in range(24):  # forward: activations of different sizes, kept
        acts.append(torch.empty((i % 6 + 1) << 20, dtype=torch.uint8, device="npu"))
    grads = []
    while acts:  # backward: each activation freed, a gradient made
        a = acts.pop()
        g = torch.empty(a.numel() // 2, dtype=torch.uint8, device="npu")
        with torch.npu.stream(comm):  # the all-reduce reads the gradient on `comm`
            g.record_stream(comm)
        grads.append(g)
        del a
        if len(grads) > 4:
            grads.pop(0)  # freed on the host; reused only once `comm` ran past it
    del grads
