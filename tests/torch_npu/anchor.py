"""The real anchor: npualloc's shipped traces replayed through torch_npu's own caching
allocator on the stand-in, next to npualloc installed in torch_npu and to the replay
tool (docs/results.md, "torch_npu's own allocator").

Each trace event becomes a torch_npu call: `a` torch.empty (uint8, on a torch.npu.Stream
per stream id, stream 0 the default stream), `f` del, `r` Tensor.record_stream, `s` the
stand-in completes that stream's work. Reports peak requested (from the trace), torch_npu's
max_memory_reserved and the device mallocs the stand-in runtime counted.

Usage: bash scripts/test-torch-npu.sh --anchor [--conf SETTINGS] TRACE...   (prints a
Markdown table). With --conf, both torch_npu runs get SETTINGS as PYTORCH_NPU_ALLOC_CONF
(e.g. expandable_segments:True) and the replay tool `--conf SETTINGS`; the last column is
the replay tool with the `torch_npu` preset (plus SETTINGS), which models torch_npu's own
allocator.
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CAPACITY = 64 << 30


def replay_in_torch_npu(path, use_npualloc):
    sys.path.insert(0, HERE)
    import common

    ctx = common.start(install=use_npualloc)
    torch, si = ctx.torch, ctx.standin
    streams = {0: torch.npu.current_stream()}
    live, cur, peak = {}, 0, 0
    sizes = {}
    for line in open(path):
        f = line.split()
        if not f or f[0].startswith("#"):
            continue
        if f[0] == "a":
            sid = int(f[3])
            if sid not in streams:
                streams[sid] = torch.npu.Stream()
            n = int(f[2])
            with torch.npu.stream(streams[sid]):
                live[f[1]] = torch.empty(n, dtype=torch.uint8, device="npu")
            sizes[f[1]] = n
            cur += n
            peak = max(peak, cur)
        elif f[0] == "f":
            del live[f[1]]
            cur -= sizes.pop(f[1])
        elif f[0] == "r":
            sid = int(f[2])
            if sid not in streams:
                streams[sid] = torch.npu.Stream()
            live[f[1]].record_stream(streams[sid])
        elif f[0] == "s":
            sid = int(f[1])
            if sid in streams:
                si.complete(streams[sid])
    stats = torch.npu.memory_stats()
    return {"peak_requested": peak, "peak_reserved": torch.npu.max_memory_reserved(),
            "device_mallocs": si.counters().mallocs,
            "num_device_alloc": stats.get("num_device_alloc", -1)}


def main():
    if len(sys.argv) > 2 and sys.argv[1] in ("--child", "--child-npualloc"):
        print("RESULT " + json.dumps(replay_in_torch_npu(sys.argv[2], sys.argv[1] == "--child-npualloc")))
        return
    from run import scenario_env

    env = scenario_env()
    env["FAKE_ACL_CAPACITY"] = str(CAPACITY)
    env["PYTHONPATH"] = HERE
    args, conf = sys.argv[1:], ""
    if args[:1] == ["--conf"]:
        conf, args = args[1], args[2:]
        env["PYTORCH_NPU_ALLOC_CONF"] = conf
    preset = "torch_npu," + conf if conf else "torch_npu"
    tool_run = lambda trace, c: json.loads(subprocess.run(
        [os.environ["NPUALLOC_BIN"], "replay", trace, "--json", "--quiet", "--conf", c],
        capture_output=True, text=True, check=True).stdout)[0]
    rows = []
    for trace in args:
        got = {}
        for mode in ("--child", "--child-npualloc"):
            p = subprocess.run([sys.executable, os.path.abspath(__file__), mode, os.path.abspath(trace)],
                               env=env, capture_output=True, text=True)
            line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
            if p.returncode != 0 or not line:
                sys.exit("anchor: %s %s failed:\n%s" % (trace, mode, p.stderr[-3000:]))
            got[mode] = json.loads(line[0][7:])
        rows.append((trace, got["--child"], got["--child-npualloc"], tool_run(trace, conf),
                     tool_run(trace, preset)))
    mib = lambda b: "%.2f MiB" % (b / 2**20)
    print("| trace | peak requested | torch_npu's allocator: peak reserved (ratio), device mallocs "
          "| npualloc in torch_npu | npualloc replay tool | replay tool, `%s` |" % preset)
    print("|---|---:|---:|---:|---:|---:|")
    for trace, native, ours, tool, modelled in rows:
        req = native["peak_requested"]
        cell = lambda r: "%s (%.3f), %d" % (mib(r["peak_reserved"]), r["peak_reserved"] / req, r["device_mallocs"])
        tcell = lambda r: "%s (%.3f), %d" % (mib(r["peak_reserved"]), r["reserved_over_requested"],
                                            r["device_mallocs"])
        print("| %s | %s | %s | %s | %s | %s |" % (
            os.path.basename(trace).rsplit(".", 1)[0], mib(req), cell(native), cell(ours),
            tcell(tool), tcell(modelled)))


if __name__ == "__main__":
    main()
