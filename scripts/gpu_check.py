"""Validation of npualloc on an NVIDIA GPU with PyTorch 2.14 (npualloc.install_cuda():
npualloc as torch's complete CUDAAllocator).

Run through scripts/gpu-check.sh. Each measurement runs in a fresh process, because an
allocator can only be swapped before CUDA initialises:
  python scripts/gpu_check.py --mode MODE        -> one JSON line of results
  python scripts/gpu_check.py [--json FILE]      -> runs every mode, prints a table
Modes: native (PyTorch's own caching allocator), npualloc, npualloc-expandable (the
CUDA driver's virtual memory), npualloc-norecord (negative control: npualloc with
record_stream ignored, so the stream checks must see wrong results), and oom-<mode>
(the memory fraction and the device's own out-of-memory, then recovery), and
pressure-<mode> (a late communication stream under a memory fraction just above the
peak allocated: wrong reads, out-of-memory errors and host synchronisations beside
PyTorch's allocator; npualloc-nowait is npualloc without device-side waits), and
compile-<mode> (torch.compile(mode="reduce-overhead") of a small transformer, CUDA graph
trees: inference at two sequence lengths and training steps; outputs compared with
PyTorch's allocator's, torch.cuda.memory_stats() / memory_snapshot() with npualloc).
  python scripts/gpu_check.py --traces [TRACE ...] -> replays allocation traces
(default: the shipped single-stream ones, traces/*.trace and traces/zoo/*.trace) on the
GPU, one fresh process per trace and allocator (trace-native, trace-npualloc,
trace-npualloc-expandable: torch.empty per allocation, dropped per free), and prints
each peak reserved beside `npualloc replay`'s prediction for the same policy
(`--conf pytorch` with its spread over address orders, the defaults, expandable
segments); the prediction needs the npualloc binary (NPUALLOC_BIN, default
target/release/npualloc, built where Rust is and carried here).
"""

import argparse
import json
import os
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

# Statistics whose meaning does not depend on the caching policy: with the same
# sequence of requests they must equal PyTorch's own, to the byte. (Requested and
# active bytes also count blocks whose recorded streams have not yet been seen done, so
# their peaks vary from run to run with PyTorch's own allocator: not compared.)
POLICY_FREE_STATS = [
    "allocated_bytes.all.current", "allocated_bytes.all.peak",
    "allocated_bytes.all.allocated", "allocated_bytes.all.freed",
    "requested_bytes.all.allocated", "allocation.all.allocated", "allocation.all.peak",
    "allocated_bytes.small_pool.peak", "allocated_bytes.large_pool.peak",
]


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


def late_read(torch, t, producer, reader, x, chain):
    """Stream `reader` waits for `producer`, runs `chain` matmuls of x, then sums t's
    first 128 values (t recorded on reader): the sum, a tensor, read after a
    synchronisation."""
    reader.wait_stream(producer)
    with torch.cuda.stream(reader):
        y = x
        for _ in range(chain):
            y = y @ x
        got = t[:128].sum() + 0 * y[0, 0]
    t.record_stream(reader)
    return got


def stream_stress(torch, steps=600, seed=1):
    """Four streams, random sizes (512 B to 24 MiB): a tensor filled with a stamp on
    its stream s is read by another stream u after a slow matmul chain (record_stream
    on u), then freed at once, and a tensor of the same size is taken on s and filled
    with -1 (where an allocator that forgot u would hand out the same memory). Every
    read must see its own stamp: returns the number of wrong reads and of reads."""
    rng = random.Random(seed)
    streams = [torch.cuda.Stream() for _ in range(4)]
    x = torch.randn(2048, 2048, device="cuda") / 64
    checks = []
    live = []
    for step in range(steps):
        s = rng.choice(streams)
        n = rng.choice([128, 1000, 4096, 65536, 1 << 20, 3 << 20, 6 << 20])
        stamp = float(step % 1000 + 1)
        with torch.cuda.stream(s):
            t = torch.full((n,), stamp, device="cuda")
        if rng.random() < 0.4:
            u = rng.choice([o for o in streams if o is not s])
            checks.append((stamp * 128, late_read(torch, t, s, u, x, rng.choice([2, 6, 12]))))
            del t
            with torch.cuda.stream(s):
                live.append(torch.full((n,), -1.0, device="cuda"))
        else:
            live.append(t)
        if len(live) > 24:
            live.pop(rng.randrange(len(live)))
    torch.cuda.synchronize()
    wrong = sum(int(float(got) != want) for want, got in checks)
    return wrong, len(checks)


def pressure_scenario(torch, comm, x, steps=300, seed=7, live_max=20):
    """A late communication stream under memory pressure (issue #16's `comm` cases on
    real streams): each step fills a tensor with a stamp on the main stream; half of
    them are read by the communication stream after a 4-16 matmul chain (record_stream
    there), freed at once, and a tensor of the same size is taken on the main stream and
    filled with -1, so that memory freed but still read is what a tight cap pushes the
    allocator to hand out (it must wait on the device, or synchronise, first). The host
    runs ahead of the device, so the frees stay pending. Returns (wrong reads, reads,
    the step of an out-of-memory error or None)."""
    rng = random.Random(seed)
    checks, live, oom_at = [], [], None
    try:
        for step in range(steps):
            n = rng.choice([1, 2, 4, 6, 8, 12, 16, 24, 32, 48]) << 18  # MiB of float32
            stamp = float(step % 1000 + 1)
            t = torch.full((n,), stamp, device="cuda")
            if rng.random() < 0.5:
                main = torch.cuda.current_stream()
                chain = rng.choice([4, 8, 16])
                checks.append((stamp * 128, late_read(torch, t, main, comm, x, chain)))
                del t
                live.append(torch.full((n,), -1.0, device="cuda"))
            else:
                live.append(t)
            while len(live) > live_max:
                live.pop(rng.randrange(len(live)))
    except torch.OutOfMemoryError:
        oom_at = step
    del live
    torch.cuda.synchronize()
    wrong = sum(int(float(got) != want) for want, got in checks)
    return wrong, len(checks), oom_at


PRESSURE_FACTORS = [1.5, 1.25, 1.15, 1.10, 1.05]


def pressure_check(torch, mode, lib):
    """pressure_scenario uncapped (its peak allocated bytes P, a figure that does not
    depend on the allocator), then under a memory fraction of f x P for each f of
    PRESSURE_FACTORS, from an emptied cache: wrong reads, out-of-memory errors, host
    synchronisations of pending frees, cache-release retries, device mallocs, peak
    reserved and wall time of each run."""
    def stats():
        s = torch.cuda.memory_stats() if lib is None else __import__("npualloc").memory_stats(0, lib)
        return {k: s.get(k) or 0 for k in ("num_sync_all_streams", "num_alloc_retries",
                                           "num_ooms", "num_device_alloc",
                                           "reserved_bytes.all.peak",
                                           "allocated_bytes.all.peak")}

    def reset():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        if lib is None:
            torch.cuda.reset_peak_memory_stats()
        else:
            lib.npualloc_reset_peak_stats(0)

    total = torch.cuda.mem_get_info()[1]
    comm = torch.cuda.Stream()
    x = torch.randn(2048, 2048, device="cuda") / 64
    out = {"mode": mode, "device": torch.cuda.get_device_name(), "runs": []}
    for f in [None] + PRESSURE_FACTORS:
        reset()
        if f is not None:
            torch.cuda.set_per_process_memory_fraction(min(1.0, f * peak / total))
        before = stats()
        t0 = time.perf_counter()
        wrong, reads, oom_at = pressure_scenario(torch, comm, x)
        ms = (time.perf_counter() - t0) * 1e3
        after = stats()
        if f is None:
            peak = after["allocated_bytes.all.peak"]
            out["peak_allocated"] = peak
        run = {"factor": f, "wrong": wrong, "reads": reads, "oom_at": oom_at, "ms": ms,
               "reserved_peak": after["reserved_bytes.all.peak"]}
        for k in ("num_sync_all_streams", "num_alloc_retries", "num_ooms", "num_device_alloc"):
            run[k] = after[k] - before[k]
        out["runs"].append(run)
    torch.cuda.set_per_process_memory_fraction(1.0)
    return out


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


def step(what):
    if os.environ.get("GPU_CHECK_VERBOSE"):
        print("gpu-check:", what, file=sys.stderr, flush=True)


def graph_check(torch, replays=20):
    """torch.cuda.graph over a small MLP whose capture forks a side stream (it allocates
    there, record_stream, join): each replay with a new input must equal the eager
    result, and eager tensors made between replays, of the captured intermediates' size,
    must keep their contents (the graph's memory stays private to it). Returns (wrong
    replays, corrupted eager tensors, error text or None)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                                torch.nn.Linear(2048, 512)).cuda()
    static_in = torch.randn(64, 512, device="cuda")
    side = torch.cuda.Stream()
    try:
        with torch.no_grad():
            warm = torch.cuda.Stream()
            warm.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(warm):
                for _ in range(3):
                    model(static_in)
            torch.cuda.current_stream().wait_stream(warm)
            g = torch.cuda.CUDAGraph()
            step("capture begins")
            with torch.cuda.graph(g):
                h = model[0](static_in)
                cur = torch.cuda.current_stream()
                side.wait_stream(cur)
                with torch.cuda.stream(side):
                    extra = (h * 2).sum(dim=1)
                cur.wait_stream(side)
                h.record_stream(side)
                out = model[2](model[1](h)) + extra[:, None]
            step("capture ended")
            wrong, keep = 0, []
            for i in range(replays):
                x = torch.randn(64, 512, device="cuda")
                static_in.copy_(x)
                g.replay()
                keep.append(torch.full((64, 2048), float(i), device="cuda"))
                h2 = model[0](x)
                ref = model[2](model[1](h2)) + (h2 * 2).sum(dim=1)[:, None]
                torch.cuda.synchronize()
                wrong += int(not torch.allclose(out, ref, rtol=1e-4, atol=1e-4))
            step("replays done")
            corrupted = sum(int(not bool((t == float(i)).all())) for i, t in enumerate(keep))
            del g, out, h, extra
        return wrong, corrupted, None
    except Exception as e:  # noqa: BLE001 - reported as a failure, with its text
        return -1, -1, "%s: %s" % (type(e).__name__, str(e)[:400])


def empty_timing(torch, n=20000):
    sizes = [512 << (i % 15) for i in range(64)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        t = torch.empty(sizes[i % 64], dtype=torch.uint8, device="cuda")
        del t
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


PLAIN_ALLOCATOR = r"""
#include <stddef.h>
typedef struct CUstream_st *cudaStream_t;
int cudaMalloc(void **p, size_t n);
int cudaFree(void *p);
void *plain_malloc(size_t n, int device, cudaStream_t s) {
  void *p = 0;
  return cudaMalloc(&p, n) == 0 ? p : 0;
}
void plain_free(void *p, size_t n, int device, cudaStream_t s) { cudaFree(p); }
"""


def plain_allocator():
    """Compiles PLAIN_ALLOCATOR against torch's CUDA runtime; returns the library path."""
    import glob
    import tempfile
    import torch
    base = os.path.dirname(os.path.dirname(torch.__file__))
    libs = glob.glob(os.path.join(base, "nvidia", "cu*", "lib", "libcudart.so*")) + \
        glob.glob("/usr/local/cuda/lib64/libcudart.so*")
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "plain.c"), "w") as f:
        f.write(PLAIN_ALLOCATOR)
    out = os.path.join(d, "libplain.so")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", out, os.path.join(d, "plain.c"), libs[0]],
                   check=True)
    return out


def install(mode):
    """Sets up the allocator of `mode` before torch touches CUDA; returns the npualloc
    library handle (None for PyTorch's own allocator)."""
    if mode.endswith("-nowait"):
        # npualloc without the pressure ladder's device-side waits (issue #16).
        os.environ["NPUALLOC_CONF"] = "wait_before_growth:False"
    if "expandable" in mode:
        # Virtual-memory segments through the CUDA driver API (cuMemCreate/cuMemMap).
        os.environ["NPUALLOC_CONF"] = "expandable_segments:True"
        if mode.endswith("-fixedpages"):
            # Diagnosis: PyTorch's fixed 20 MiB pages instead of the adaptive ones.
            os.environ["NPUALLOC_CONF"] += ",adaptive_pages:False"
    if mode == "plain-pluggable":
        # Diagnosis: torch's pluggable-allocator path with plain cudaMalloc/cudaFree,
        # to tell a failure of that path from one of npualloc's.
        from torch.cuda import memory as cuda_memory
        cuda_memory.change_current_allocator(cuda_memory.CUDAPluggableAllocator(
            plain_allocator(), "plain_malloc", "plain_free"))
        return None
    if "npualloc" not in mode:
        return None
    import npualloc
    npualloc.install_cuda()
    if "norecord" in mode:
        # Negative control: the allocator's recordStream does nothing.
        npualloc._shim.ignore_record_stream(True)
    return npualloc.load()


def stats_of(torch, lib):
    if lib is None:
        s = torch.cuda.memory_stats()
    else:
        import npualloc
        s = npualloc.memory_stats(0, lib)
    keys = POLICY_FREE_STATS + ["reserved_bytes.all.peak", "num_device_alloc",
                                "num_alloc_retries", "num_ooms"]
    return {k: s.get(k) for k in keys}


# The trace of a trace-* mode (its --trace).
TRACE_PATH = None


def one(mode):
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    lib = install(mode[len("compile-"):] if mode.startswith("compile-") else mode)
    import torch
    torch.use_deterministic_algorithms(True)
    if mode.startswith("oom-"):
        return print(json.dumps(oom_check(torch, mode, lib)))
    if mode.startswith("pressure-"):
        return print(json.dumps(pressure_check(torch, mode, lib)))
    if mode.startswith("trace-"):
        return print(json.dumps(trace_check(torch, mode, lib, TRACE_PATH)))
    if mode.startswith("compile-"):
        return print(json.dumps(compile_check(torch, mode, lib)))
    out = {"mode": mode, "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    if os.environ.get("GPU_CHECK_ONLY") == "graph":
        out["graph_wrong"], out["graph_corrupted"], out["graph_error"] = graph_check(torch)
        return print(json.dumps(out))
    out["seed_wrong_runs"] = seed_scenario(torch)
    out["stress_wrong"], out["stress_reads"] = stream_stress(torch)
    if "norecord" in mode:
        return print(json.dumps(out))
    out["empty_ns"] = empty_timing(torch) * 1e9
    losses, times, peak = train_steps(torch)
    times.sort()
    out.update({"step_ms_median": times[len(times) // 2] * 1e3, "losses": losses,
                "peak_used_bytes": peak, "stats": stats_of(torch, lib)})
    out["graph_wrong"], out["graph_corrupted"], out["graph_error"] = graph_check(torch)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    out["used_after_empty_cache"] = total - free
    print(json.dumps(out))


def read_trace(path):
    """The (op, id, bytes) of a single-stream trace's allocations and frees."""
    ops = []
    with open(path) as f:
        for line in f:
            w = line.split()
            if not w or w[0].startswith("#"):
                continue
            if w[0] == "a":
                if w[3] != "0":
                    raise ValueError("%s: single-stream traces only (stream %s)" % (path, w[3]))
                ops.append(("a", int(w[1]), int(w[2])))
            elif w[0] == "f":
                ops.append(("f", int(w[1]), 0))
            else:
                raise ValueError("%s: single-stream traces only (a '%s' line)" % (path, w[0]))
    return ops


def trace_check(torch, mode, lib, path):
    """Replays trace `path` through the allocator of this process: a torch.empty of the
    trace's bytes per allocation (none for 0 bytes, as the replay skips them), the
    tensor dropped at its free; then the allocator's peak reserved and device calls."""
    live = {}
    torch.cuda.synchronize()
    for op, ident, size in read_trace(path):
        if op == "a":
            if size > 0:
                live[ident] = torch.empty(size, dtype=torch.uint8, device="cuda")
        else:
            live.pop(ident, None)
    live.clear()
    torch.cuda.synchronize()
    if lib is None:
        s = torch.cuda.memory_stats()
    else:
        import npualloc
        s = npualloc.memory_stats(0, lib)
    return {"mode": mode, "trace": path, "peak_reserved": s.get("reserved_bytes.all.peak"),
            "device_mallocs": s.get("num_device_alloc"), "device": torch.cuda.get_device_name()}


TRACE_MODES = ["trace-native", "trace-npualloc", "trace-npualloc-expandable"]
# The `npualloc replay` setting that predicts each trace mode.
TRACE_CONF = {"trace-native": "pytorch", "trace-npualloc": "",
              "trace-npualloc-expandable": "expandable_segments:True"}


def predictions(paths):
    """`npualloc replay --json` of every trace under the three settings of TRACE_CONF:
    {(trace, mode): report}; empty when the binary is not here."""
    binary = os.environ.get("NPUALLOC_BIN", os.path.join(HERE, "..", "target", "release",
                                                         "npualloc"))
    if not os.path.exists(binary):
        print("no npualloc binary at %s: GPU figures without predictions" % binary)
        return {}
    cmd = [binary, "replay", "-q", "--json", *paths]
    for m in TRACE_MODES:
        cmd += ["--conf", TRACE_CONF[m]]
    runs = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return {(paths[i // len(TRACE_MODES)], TRACE_MODES[i % len(TRACE_MODES)]): r
            for i, r in enumerate(runs)}


def traces_main(paths):
    """Every trace through each allocator on the GPU beside the replay's prediction;
    true when npualloc's defaults on the GPU equal their prediction to the byte."""
    if not paths:
        import glob
        root = os.path.join(HERE, "..", "traces")
        paths = sorted(glob.glob(os.path.join(root, "*.trace"))) + \
            sorted(glob.glob(os.path.join(root, "zoo", "*.trace")))
    predicted = predictions(paths)
    mib = lambda b: "-" if b is None else "%.0f" % (b / 2**20)
    print("peak reserved MiB, GPU vs `npualloc replay` (PyTorch's policy: its spread over "
          "address orders in brackets)")
    print("%-26s %-26s %-26s %-26s" % ("trace", "PyTorch's allocator", "npualloc",
                                       "npualloc expandable"))
    equal = []
    for path in paths:
        cells = []
        for m in TRACE_MODES:
            p = subprocess.run([sys.executable, __file__, "--mode", m, "--trace", path],
                               capture_output=True, text=True, timeout=600)
            lines = p.stdout.strip().splitlines()
            gpu = json.loads(lines[-1])["peak_reserved"] if p.returncode == 0 and lines else None
            r = predicted.get((path, m))
            pred = None if r is None else r["peak_reserved"]
            cell = "%s vs %s" % (mib(gpu), mib(pred))
            if r is not None and "address_orders" in r:
                lo, hi = r["address_orders"]["peak_reserved"]
                cell += " [%s-%s]" % (mib(lo), mib(hi))
            if p.returncode != 0:
                cell = "failed (%d)" % p.returncode
            if m == "trace-npualloc":
                equal.append(gpu is not None and gpu == pred)
            cells.append(cell)
        name = os.path.basename(path).removesuffix(".trace")
        print("%-26s " % name + " ".join("%-26s" % c for c in cells))
    print("npualloc's defaults equal to their prediction to the byte: %d of %d"
          % (sum(equal), len(equal)))
    return bool(equal) and all(equal)


def compile_check(torch, mode, lib):
    """torch.compile(model, mode="reduce-overhead") of a small transformer: CUDA graph
    trees record and replay in their private pool (checkpoints after each recording,
    the live-allocation check on each replay). Inference at two sequence lengths and
    back (each call three times: warm-up, recording, replay), then training steps.
    Returns the output sums and losses (compared across modes by main) and what
    torch.cuda.memory_stats() / memory_snapshot() said; an exception is reported in
    "error" with the step it happened in."""
    r = {"mode": mode, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
         "infer": {}, "losses": [], "error": None}
    where = "setup"
    try:
        # Inductor's kernels under graph trees: warn rather than stop where one has no
        # deterministic variant (both allocators run the same kernels).
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=256,
                                                 dropout=0.0, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).cuda()
        gen = torch.Generator(device="cuda")
        infer = torch.compile(model, mode="reduce-overhead")
        model.eval()
        with torch.no_grad():
            for seq in (32, 64, 32):
                where = "inference, sequence length %d" % seq
                gen.manual_seed(seq)
                x = torch.randn(8, seq, 128, device="cuda", generator=gen)
                sums = []
                for _ in range(3):
                    y = infer(x)
                    sums.append(float(y.double().pow(2).sum()))  # LayerNorm's output sums to ~0
                r["infer"]["%d" % seq] = sums
        where = "training"
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        train = torch.compile(model, mode="reduce-overhead")  # forward and backward graphs
        for i in range(4):
            torch.compiler.cudagraph_mark_step_begin()
            gen.manual_seed(100 + i)
            x = torch.randn(8, 32, 128, device="cuda", generator=gen)
            opt.zero_grad(set_to_none=True)
            loss = train(x).pow(2).mean()
            loss.backward()
            r["losses"].append(float(loss.detach()))
            opt.step()
        torch.cuda.synchronize()
        where = "memory_stats / memory_snapshot"
        stats = torch.cuda.memory_stats()
        snap = torch.cuda.memory_snapshot()
        r["allocations"] = stats.get("allocation.all.allocated", 0)
        r["reserved_peak"] = stats.get("reserved_bytes.all.peak", 0)
        r["segments"] = len(snap)
        r["pool_segments"] = sum(1 for s in snap if tuple(s.get("segment_pool_id", (0, 0))) != (0, 0))
        r["allocated_matches"] = sum(b["size"] for s in snap for b in s["blocks"]
                                     if b["state"] == "active_allocated") == torch.cuda.memory_allocated()
        if lib is not None:
            import npualloc
            r["npualloc_error"] = npualloc.last_error()
    except Exception as e:  # noqa: BLE001 - reported with the step, not hidden
        r["error"] = "%s: %s: %s" % (where, type(e).__name__, str(e)[:600])
    return r


def compile_summary(results):
    """Prints the compile-* runs; true when both ran, npualloc's outputs and losses equal
    PyTorch's allocator's (relative 1e-5; bit-equality is reported), the memory tools
    answered and the graph trees' pool held segments."""
    by = {r["mode"]: r for r in results}
    if not any(m in by for m in COMPILE):
        return True
    ok = True
    for m in COMPILE:
        r = by.get(m)
        if r is None:
            print("%s: did not run" % m)
            ok = False
            continue
        print("%s: %s" % (m, "error " + r["error"] if r["error"] else
                          "ran; %d allocations, %d segments (%d in graph pools), peak reserved "
                          "%.1f MiB, snapshot's allocated blocks = memory_allocated(): %s" % (
                              r["allocations"], r["segments"], r["pool_segments"],
                              r["reserved_peak"] / 2**20, r["allocated_matches"])))
        ok &= r["error"] is None and r["allocated_matches"] and r["pool_segments"] > 0
    native, ours = by.get("compile-native"), by.get("compile-npualloc")
    if native and ours and not native["error"] and not ours["error"]:
        a = [v for k in sorted(native["infer"]) for v in native["infer"][k]] + native["losses"]
        b = [v for k in sorted(ours["infer"]) for v in ours["infer"][k]] + ours["losses"]
        close = len(a) == len(b) and all(abs(x - y) <= 1e-5 * max(1.0, abs(x)) for x, y in zip(a, b))
        print("compile: outputs and losses equal PyTorch's allocator's: %s (to the bit: %s)"
              % (close, a == b))
        ok &= close
    return ok


def oom_check(torch, mode, lib):
    """A memory fraction that a request passes must raise OutOfMemoryError; so must a
    request larger than the device; afterwards allocation works again."""
    r = {"mode": mode}
    total = torch.cuda.mem_get_info()[1]
    torch.cuda.set_per_process_memory_fraction(0.02)
    keep = torch.empty(int(total * 0.01), dtype=torch.uint8, device="cuda")
    try:
        torch.empty(int(total * 0.02), dtype=torch.uint8, device="cuda")
        r["fraction"] = "no error"
    except torch.OutOfMemoryError as e:
        r["fraction"] = "OutOfMemoryError: " + str(e).splitlines()[0][:240]
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        r["fraction"] = "%s: %s" % (type(e).__name__, str(e)[:240])
    torch.cuda.set_per_process_memory_fraction(1.0)
    try:
        torch.empty(total * 2, dtype=torch.uint8, device="cuda")
        r["device"] = "no error"
    except torch.OutOfMemoryError as e:
        r["device"] = "OutOfMemoryError: " + str(e).splitlines()[0][:240]
    except Exception as e:  # noqa: BLE001
        r["device"] = "%s: %s" % (type(e).__name__, str(e)[:240])
    big = torch.ones(int(total * 0.2), dtype=torch.uint8, device="cuda")
    r["after"] = bool(int(big[-1]) == 1 and int(keep.numel()) > 0)
    del big, keep
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    r["used_after_empty_cache"] = total - free
    if lib is not None:
        r["stats"] = stats_of(torch, lib)
    return r


MODES = ["native", "npualloc", "npualloc-expandable"]
DIAGNOSIS = ["plain-pluggable", "npualloc-expandable-fixedpages"]
COMPILE = ["compile-native", "compile-npualloc"]
CONTROLS = ["npualloc-norecord", "oom-native", "oom-npualloc", "oom-npualloc-expandable"]
PRESSURE = ["pressure-native", "pressure-npualloc", "pressure-npualloc-nowait",
            "pressure-npualloc-norecord"]


def run_mode(mode):
    p = subprocess.run([sys.executable, __file__, "--mode", mode], capture_output=True,
                       text=True, timeout=900 if mode in COMPILE else 300)
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        return {"mode": mode, "failed": p.returncode, "stderr": p.stderr[-2000:]}
    return json.loads(lines[-1])


def pressure_summary(runs):
    """Prints the pressure runs side by side; true when npualloc read no wrong data,
    ran out of memory at no cap where PyTorch's allocator fitted, and the negative
    control (record_stream ignored) saw wrong data."""
    if not runs:
        return True
    print("late communication stream under a memory fraction of f x peak allocated "
          "(%.1f MiB):" % (runs[0]["peak_allocated"] / 2**20))
    print("%-28s %6s %9s %8s %10s %8s %8s %12s %9s" % (
        "mode", "f", "wrong", "OOM at", "host syncs", "retries", "mallocs", "reserved pk",
        "wall ms"))
    for r in runs:
        for x in r["runs"]:
            print("%-28s %6s %4d/%-4d %8s %10d %8d %8d %8.1f MiB %9.1f" % (
                r["mode"], "none" if x["factor"] is None else "%.2f" % x["factor"], x["wrong"],
                x["reads"], "-" if x["oom_at"] is None else x["oom_at"],
                x["num_sync_all_streams"], x["num_alloc_retries"], x["num_device_alloc"],
                x["reserved_peak"] / 2**20, x["ms"]))
    by = {r["mode"]: r["runs"] for r in runs}
    ok = True
    for m in ("pressure-npualloc", "pressure-npualloc-nowait"):
        ok &= all(x["wrong"] == 0 for x in by.get(m, []))
    native = {x["factor"]: x["oom_at"] for x in by.get("pressure-native", [])}
    misses = [x["factor"] for x in by.get("pressure-npualloc", [])
              if x["oom_at"] is not None and native.get(x["factor"], 0) is None]
    print("npualloc out of memory where PyTorch's allocator fits: %s" % (misses or "none"))
    ok &= not misses
    if "pressure-npualloc-norecord" in by:
        ok &= any(x["wrong"] > 0 for x in by["pressure-npualloc-norecord"])
    return ok


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=MODES + CONTROLS + PRESSURE + DIAGNOSIS + COMPILE
                   + TRACE_MODES)
    p.add_argument("--json", help="also write every result to this file")
    p.add_argument("--trace", help="the trace of a trace-* mode")
    p.add_argument("--traces", nargs="*", help="replay these traces (default: the shipped "
                   "ones) on the GPU beside npualloc replay's predictions, and stop")
    args = p.parse_args()
    if args.mode:
        global TRACE_PATH
        TRACE_PATH = args.trace
        return one(args.mode)
    if args.traces is not None:
        ok = traces_main(args.traces)
        print("gpu-check traces:", "PASS" if ok else "FAIL")
        sys.exit(0 if ok else 1)
    results = [run_mode(m) for m in MODES + MODES + CONTROLS + PRESSURE + COMPILE]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    failed = [r for r in results if "failed" in r]
    for r in failed:
        print("mode %s failed (exit %s):\n%s" % (r["mode"], r["failed"], r["stderr"]))
    runs = [r for r in results if "failed" not in r and r["mode"] in MODES]
    print("%-20s %6s %8s %11s %9s %12s %12s" % ("mode", "seed", "stress", "empty() ns",
                                                "step ms", "peak used", "reserved pk"))
    for r in runs:
        print("%-20s %6d %4d/%-3d %11.0f %9.2f %9.1f MiB %8.1f MiB" % (
            r["mode"], r["seed_wrong_runs"], r["stress_wrong"], r["stress_reads"],
            r["empty_ns"], r["step_ms_median"], r["peak_used_bytes"] / 2**20,
            (r["stats"]["reserved_bytes.all.peak"] or 0) / 2**20))
    ok = not failed
    native = [r for r in runs if r["mode"] == "native"]
    if native:
        same = all(r["losses"] == native[0]["losses"] for r in runs)
        print("losses identical to the bit in every run:", same)
        ok &= same
        want = {k: native[0]["stats"][k] for k in POLICY_FREE_STATS}
        for r in runs:
            diff = {k: (r["stats"][k], v) for k, v in want.items() if r["stats"][k] != v}
            print("%s: policy-free statistics %s" % (
                r["mode"], "equal PyTorch's" if not diff else "differ: %s" % diff))
            ok &= not diff
    ok &= all(r["seed_wrong_runs"] == 0 and r["stress_wrong"] == 0 for r in runs)
    for r in runs:
        print("%s: CUDA graph with a side stream: %d/20 replays wrong, %d eager tensors "
              "corrupted%s" % (r["mode"], r["graph_wrong"], r["graph_corrupted"],
                               "" if r["graph_error"] is None else ", error " + r["graph_error"]))
        ok &= r["graph_wrong"] == 0 and r["graph_corrupted"] == 0
    for r in results:
        if r["mode"] == "npualloc-norecord" and "failed" not in r:
            print("negative control (record_stream ignored): seed wrong %d/200, stress wrong %d/%d"
                  % (r["seed_wrong_runs"], r["stress_wrong"], r["stress_reads"]))
            ok &= r["seed_wrong_runs"] > 0 and r["stress_wrong"] > 0
        if r["mode"].startswith("oom-") and "failed" not in r:
            print("%s: fraction -> %s | larger than device -> %s | allocates after: %s | "
                  "used after empty_cache %.1f MiB" % (r["mode"], r["fraction"], r["device"],
                                                       r["after"], r["used_after_empty_cache"] / 2**20))
            ok &= r["fraction"].startswith("OutOfMemoryError") and r["after"]
    ok &= pressure_summary([r for r in results if r["mode"] in PRESSURE and "failed" not in r])
    ok &= compile_summary([r for r in results if r["mode"] in COMPILE and "failed" not in r])
    print("gpu-check:", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
