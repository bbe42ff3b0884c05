"""Runs every scenario of tests/torch_npu/scenarios, each in a fresh Python process with
the stand-in CANN libraries on the library path and the CUDA-key interposer preloaded
(see README.md). Called by scripts/test-torch-npu.sh, which sets the environment.

A scenario passes when it exits 0. One listed in EXPECTED_FAILURES must fail (with the
reason printed); if it passes, the run fails so the list is kept honest.
Usage: run.py [name-filter]
       run.py --script FILE [ARG...]   (one script of yours, in the current folder, with
       the same environment and npualloc importable from python/; exits with its status)
"""

import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# run name -> why it is expected to fail (issue and item)
EXPECTED_FAILURES = {}

# Scenarios run again under other settings: torch_npu's task queue off (0) and in its
# second mode (2; the default is 1), and with one task queue per stream
# (PER_STREAM_QUEUE=1, torch_npu's name for it: by default every stream shares one).
# "argv" holds arguments for the scenario (torchair_seed --npualloc: with npualloc
# installed, compared with the base run's record).
VARIANTS = {
    "record_stream": [{"TASK_QUEUE_ENABLE": "0"}, {"TASK_QUEUE_ENABLE": "2"}, {"PER_STREAM_QUEUE": "1"}],
    "events": [{"TASK_QUEUE_ENABLE": "0"}, {"TASK_QUEUE_ENABLE": "2"}],
    "graph_capture": [{"PER_STREAM_QUEUE": "1"}],
    "torchair_seed": [{"argv": ["--npualloc"]}],
}


def variant_name(name, variant):
    parts = ["%s=%s" % kv for kv in variant.items() if kv[0] != "argv"] + variant.get("argv", [])
    return "%s[%s]" % (name, ",".join(parts))


def scenario_env():
    """The environment of a scenario process (set by scripts/test-torch-npu.sh first)."""
    standin = os.environ["TORCH_NPU_STANDIN"]
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = standin + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env["LD_PRELOAD"] = os.path.join(standin, "libcuda_keys_interposer.so")
    env["PYTHONPATH"] = HERE
    env.setdefault("FAKE_ACL_CAPACITY", str(1 << 30))
    env.pop("NPUALLOC_CONF", None)
    env.pop("PYTORCH_NPU_ALLOC_CONF", None)
    env.pop("TASK_QUEUE_ENABLE", None)  # torch_npu's default (1) unless a variant sets it
    env.pop("PER_STREAM_QUEUE", None)
    return env


def run_script(path, args):
    """Runs a user's script (docs/guides/torch_npu/) on the stand-in, where it is."""
    env = scenario_env()
    env["PYTHONPATH"] = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
    sys.exit(subprocess.run([sys.executable, path] + args, env=env, timeout=600).returncode)


def main():
    if sys.argv[1:2] == ["--script"]:
        run_script(sys.argv[2], sys.argv[3:])
    flt = sys.argv[1] if len(sys.argv) > 1 else ""
    names = sorted(f[:-3] for f in os.listdir(os.path.join(HERE, "scenarios"))
                   if f.endswith(".py") and flt in f)
    if not names:
        sys.exit("run.py: no scenario matches %r" % flt)
    base_env = scenario_env()
    # Where a scenario leaves a record a later run of it compares with (its variants run
    # after every base run).
    shared = tempfile.TemporaryDirectory()
    base_env["SCENARIO_SHARED_DIR"] = shared.name
    failed = []
    runs = [(n, n, {}) for n in names]
    runs += [(variant_name(n, v), n, v) for n in names for v in VARIANTS.get(n, [])]
    for name, script, variant in runs:
        extra = {k: v for k, v in variant.items() if k != "argv"}
        env = dict(base_env, **extra)
        t0 = time.time()
        with tempfile.TemporaryDirectory() as cwd:  # torch_npu may write files there
            p = subprocess.run([sys.executable, os.path.join(HERE, "scenarios", script + ".py")]
                               + variant.get("argv", []),
                               env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
        took = time.time() - t0
        ok = p.returncode == 0
        if name in EXPECTED_FAILURES:
            if ok:
                print("UNEXPECTED PASS %s (%.1fs): remove it from EXPECTED_FAILURES" % (name, took))
                failed.append(name)
            else:
                print("XFAIL %s (%.1fs): %s" % (name, took, EXPECTED_FAILURES[name]))
                print("    last line: %s" % (p.stderr.strip().splitlines() or ["?"])[-1])
            continue
        if ok:
            print("ok   %s (%.1fs)" % (name, took))
        else:
            failed.append(name)
            print("FAIL %s (%.1fs), exit %d" % (name, took, p.returncode))
            sys.stdout.write(p.stdout[-4000:])
            sys.stdout.write(p.stderr[-6000:])
    if failed:
        sys.exit("torch_npu scenarios failed: %s" % ", ".join(failed))
    print("all %d torch_npu scenario runs passed" % len(runs))


if __name__ == "__main__":
    main()
