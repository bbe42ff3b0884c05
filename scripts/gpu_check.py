"""Validation of npualloc on an NVIDIA GPU with PyTorch (CUDAPluggableAllocator).

Run through scripts/gpu-check.sh. Each measurement runs in a fresh process, because an
allocator can only be swapped before CUDA initialises:
  python scripts/gpu_check.py --mode native|npualloc   -> one JSON line of results
  python scripts/gpu_check.py                            -> runs A/B/A/B and prints a table
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))


def seed_scenario(torch, runs=200):
    """A zeroed on main; side stream: long matmul chain then B = A + 1; A recorded on
    side, deleted; C = ones on main. B must be all ones in every run."""
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    x = torch.randn(2048, 2048, device="cuda")
    wrong = 0
    for _ in range(runs):
        a = torch.zeros(1 << 20, device="cuda")
        side.wait_stream(main)
        with torch.cuda.stream(side):
            y = x
            for _ in range(20):
                y = y @ x
            b = a + 1
        a.record_stream(side)
        del a
        c = torch.ones(1 << 20, device="cuda")
        torch.cuda.synchronize()
        wrong += int(not bool((b == 1).all()))
        del b, c, y
    return wrong


def train_steps(torch, steps=20):
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(d_model=256, nhead=8, dim_feedforward=1024,
                                         dropout=0.0, batch_first=True),
        num_layers=4).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randn(32, 128, 256, device="cuda", generator=None)
    losses, times, peak_used = [], [], 0
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(data).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        free, total = torch.cuda.mem_get_info()
        peak_used = max(peak_used, total - free)
    return losses, times, peak_used


def empty_timing(torch, n=20000):
    sizes = [512 << (i % 15) for i in range(64)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        t = torch.empty(sizes[i % 64], dtype=torch.uint8, device="cuda")
        del t
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


def one(mode):
    if mode == "npualloc-expandable":
        # Virtual-memory segments through the CUDA driver API (cuMemCreate/cuMemMap).
        os.environ["NPUALLOC_CONF"] = "expandable_segments:True"
    if mode.startswith("npualloc"):
        import npualloc
        npualloc.install_cuda()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    torch.use_deterministic_algorithms(True)
    wrong = seed_scenario(torch)
    empty_s = empty_timing(torch)
    losses, times, peak = train_steps(torch)
    times.sort()
    print(json.dumps({"mode": mode, "seed_wrong_runs": wrong, "empty_ns": empty_s * 1e9,
                      "step_ms_median": times[len(times) // 2] * 1e3, "losses": losses,
                      "peak_used_bytes": peak}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["native", "npualloc", "npualloc-expandable"])
    args = p.parse_args()
    if args.mode:
        return one(args.mode)
    results = []
    modes = ["native", "npualloc", "npualloc-expandable"]
    for mode in modes + modes:
        out = subprocess.run([sys.executable, __file__, "--mode", mode], check=True,
                             capture_output=True, text=True).stdout.strip().splitlines()[-1]
        results.append(json.loads(out))
    print("%-20s %12s %14s %14s %16s" % ("mode", "seed wrong", "empty() ns", "step ms (med)", "peak used MiB"))
    for r in results:
        print("%-20s %12d %14.0f %14.2f %16.1f" % (r["mode"], r["seed_wrong_runs"], r["empty_ns"],
                                                  r["step_ms_median"], r["peak_used_bytes"] / 2**20))
    native = [r for r in results if r["mode"] == "native"][0]["losses"]
    same = all(r["losses"] == native for r in results)
    print("losses identical to the bit in every run:", same)
    ok = same and all(r["seed_wrong_runs"] == 0 for r in results if r["mode"] != "native")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
