"""ctypes tests of libnpualloc on the simulated backend.

Run with NPUALLOC_BACKEND=sim NPUALLOC_SIM_MODE=manual NPUALLOC_LIB=<path> (the
scripts/test-python.sh wrapper sets them).
"""

import ctypes
import os
import sys
import tempfile
import threading
import unittest
import json

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import npualloc  # noqa: E402
from npualloc import _lib  # noqa: E402
import standin  # noqa: E402
from standin import install_standins, remove_standins  # noqa: E402

SIZE_MAX = 2**64 - 1


def lib():
    return npualloc.load()


ACL = os.environ.get("NPUALLOC_BACKEND") == "acl"
PAD = 32 if ACL else 0  # torch_npu's request padding on Ascend


def block(n):
    """The block size a request of n bytes gets."""
    return (n + PAD + 511) // 512 * 512


class FakeAclCounters(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "mallocs", "frees", "live_bytes", "events_created", "events_destroyed",
        "event_records", "violations", "set_device_calls", "synchronize_calls",
        "stream_waits", "init_calls", "maps", "unmaps", "live_reservations",
        "live_physical")]


def fake():
    """The fake ACL runtime (the instance npualloc loaded: same path)."""
    lib().npualloc_init(0)
    return ctypes.CDLL(os.environ["NPUALLOC_ACL_LIB"])


def new_stream():
    s = ctypes.c_void_p()
    if ACL:
        assert fake().fake_acl_create_stream(0, ctypes.byref(s)) == 0
    else:
        assert lib().npualloc_sim_create_stream(0, ctypes.byref(s)) == 0, npualloc.last_error()
    return s


def launch(stream, n):
    if ACL:
        return fake().fake_acl_launch(0, stream, n)
    return lib().npualloc_sim_launch(0, stream, n)


def complete(stream):
    if ACL:
        return fake().fake_acl_complete(0, stream)
    return lib().npualloc_sim_complete_stream(0, stream)


def counters():
    if ACL:
        c = FakeAclCounters()
        fake().fake_acl_get_counters(ctypes.byref(c))
        return c
    c = _lib.SimCounters()
    assert lib().npualloc_sim_get_counters(0, ctypes.byref(c)) == 0
    return c


def consistent():
    return lib().npualloc_check_invariants(0) == 0


class PluggableLoadPath(unittest.TestCase):
    def test_loads_like_npu_pluggable_allocator(self):
        path = npualloc.library_path()
        raw = ctypes.CDLL(path)
        alloc_fn = ctypes.cast(getattr(raw, "npualloc_malloc"), ctypes.c_void_p).value
        free_fn = ctypes.cast(getattr(raw, "npualloc_free"), ctypes.c_void_p).value
        self.assertTrue(alloc_fn and free_fn)
        self.assertNotEqual(alloc_fn, free_fn)
        # Call through the raw addresses with torch's exact types.
        alloc_t = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
        free_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
        p = alloc_t(alloc_fn)(4096, 0, None)
        self.assertIsNotNone(p)
        self.assertEqual(p % 512, 0)
        free_t(free_fn)(p, 4096, 0, None)
        self.assertTrue(consistent())


class CrossStream(unittest.TestCase):
    def test_reuse_only_after_completion(self):
        side = new_stream()
        p = lib().npualloc_malloc(8192, 0, None)
        lib().npualloc_record_stream(p, side)
        self.assertEqual(launch(side, 2), 0)
        before = counters().event_records
        lib().npualloc_free(p, 8192, 0, None)
        self.assertEqual(counters().event_records, before + 1)
        q = lib().npualloc_malloc(8192, 0, None)
        self.assertNotEqual(q, p)
        self.assertEqual(complete(side), 0)
        r = lib().npualloc_malloc(8192, 0, None)
        self.assertEqual(r, p)
        for x in (q, r):
            lib().npualloc_free(x, 0, 0, None)
        self.assertTrue(consistent())


class BadInput(unittest.TestCase):
    def test_unknown_and_double_free(self):
        lib().npualloc_free(0xdeadbeef, 16, 0, None)
        self.assertIn("unknown pointer 0xdeadbeef", npualloc.last_error())
        p = lib().npualloc_malloc(100, 0, None)
        lib().npualloc_free(p, 100, 0, None)
        stats = npualloc.memory_stats(0)
        lib().npualloc_free(p, 100, 0, None)
        # The C ABI's message names the function; npualloc.last_error() leaves it out.
        self.assertIn(b"npualloc_free: unknown pointer", lib().npualloc_last_error())
        self.assertTrue(npualloc.last_error().startswith("unknown pointer"), npualloc.last_error())
        self.assertEqual(npualloc.memory_stats(0), stats, "a double free changed the stats")
        self.assertTrue(consistent())

    def test_sizes_and_devices(self):
        self.assertIsNone(lib().npualloc_malloc(0, 0, None))
        self.assertIsNone(lib().npualloc_malloc(SIZE_MAX, 0, None))
        self.assertIn("too large", npualloc.last_error())
        self.assertIsNone(lib().npualloc_malloc(64, -1, None))
        self.assertIn("invalid device -1", npualloc.last_error())
        if not ACL:  # ACL cannot tell a stream handle is bogus; the sim can
            self.assertIsNone(lib().npualloc_malloc(64, 0, 0x4242))
            self.assertIn("unknown stream", npualloc.last_error())
        with self.assertRaises(npualloc.NpuallocError) as cm:
            npualloc.memory_stats(99)
        self.assertIn("invalid device 99", str(cm.exception))
        self.assertEqual(lib().npualloc_configure(b"max_split_size_mb:x"), 1)
        self.assertIn("max_split_size_mb", npualloc.last_error())
        self.assertTrue(consistent())

    def test_init_takes_the_device_count(self):
        # torch_npu's and torch.cuda's pluggable allocators call init_fn(device_count).
        seen = []

        def run():  # a fresh thread: its last error starts empty
            n = lib().npualloc_device_count()
            lib().npualloc_init(n)
            seen.append((n, lib().npualloc_last_error()))
            lib().npualloc_init(n + 1)
            seen.append((n, lib().npualloc_last_error()))
        t = threading.Thread(target=run)
        t.start()
        t.join()
        (n, after_count), (_, after_more) = seen
        self.assertGreaterEqual(n, 1)
        self.assertIsNone(after_count, "init(device count) recorded an error")
        self.assertIn(b"torch sees %d device(s)" % (n + 1), after_more)

    def test_last_error_is_per_thread(self):
        seen = []
        t = threading.Thread(target=lambda: seen.append(lib().npualloc_last_error()))
        t.start()
        t.join()
        self.assertEqual(seen, [None])


class Stats(unittest.TestCase):
    def test_struct_layout_and_values(self):
        # 9 arrays of 3 stats, 2 counters, 2 stats, 4 counters; all int64.
        self.assertEqual(ctypes.sizeof(_lib.DeviceStats), (9 * 3 * 4 + 2 + 2 * 4 + 4) * 8)
        npualloc.empty_cache()
        base = npualloc.memory_stats(0)
        p = lib().npualloc_malloc(3 << 20, 0, None)
        q = lib().npualloc_malloc(1000, 0, None)
        s = npualloc.memory_stats(0)
        self.assertEqual(s["allocation.all.current"], base["allocation.all.current"] + 2)
        self.assertEqual(s["allocated_bytes.large_pool.current"], block(3 << 20))
        self.assertEqual(s["allocated_bytes.small_pool.current"], block(1000))
        self.assertEqual(s["requested_bytes.all.current"], (3 << 20) + 1000)
        self.assertEqual(s["reserved_bytes.all.current"], (20 << 20) + (2 << 20))
        self.assertEqual(s["segment.all.current"], 2)
        self.assertEqual(s["num_device_alloc"] - base["num_device_alloc"], 2)
        self.assertEqual(s["max_split_size"], 2**63 - 1)
        for x in (p, q):
            lib().npualloc_free(x, 0, 0, None)
        s = npualloc.memory_stats(0)
        self.assertEqual(s["allocated_bytes.all.current"], 0)
        self.assertEqual(s["allocated_bytes.all.peak"], block(3 << 20) + block(1000))
        self.assertEqual(len([k for k in s if k.endswith(".current")]), 9 * 3 + 2)
        self.private_pool_keys()

    def private_pool_keys(self):
        """torch.cuda.memory_stats()'s keys of reserved_bytes_by_private_pools: the pool
        id (3, 4) flattened as "3_4"; the entry stays, current 0, after the pool's memory
        went back (run after the key count above: the entry never goes)."""
        key = "reserved_bytes_by_private_pools.3_4."
        self.assertFalse([k for k in npualloc.memory_stats(0) if k.startswith(key)])
        self.assertEqual(lib().npualloc_begin_allocate_to_pool(0, 3, 4, None), 0)
        p = lib().npualloc_malloc(3 << 20, 0, None)
        s = npualloc.memory_stats(0)
        self.assertEqual(len([k for k in s if k.startswith(key)]), 12)
        self.assertEqual(s[key + "all.current"], 20 << 20)
        self.assertEqual(s[key + "large_pool.current"], 20 << 20)
        self.assertEqual(s[key + "small_pool.current"], 0)
        self.assertEqual(s["num_oom_rejections"], 0)
        self.assertEqual(lib().npualloc_end_allocate_to_pool(0, 3, 4), 0)
        lib().npualloc_free(p, 0, 0, None)
        self.assertEqual(lib().npualloc_release_pool(0, 3, 4), 0)
        npualloc.empty_cache()
        s = npualloc.memory_stats(0)
        self.assertEqual((s[key + "all.current"], s[key + "all.peak"], s[key + "all.freed"]),
                         (0, 20 << 20, 20 << 20))
        self.assertEqual(len([k for k in s if k.endswith(".current")]), 9 * 3 + 2 + 3)

    def test_snapshot_file(self):
        p = lib().npualloc_malloc(5000, 0, None)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "snap.json")
            npualloc.dump_snapshot(path)
            with open(path) as f:
                snap = json.load(f)
        blocks = [b for seg in snap["segments"] for b in seg["blocks"]]
        self.assertIn({"address": p, "size": block(5000), "requested_size": 5000,
                       "state": "active_allocated", "frames": []}, blocks)
        lib().npualloc_free(p, 0, 0, None)


class Threads(unittest.TestCase):
    def test_many_threads_stay_consistent(self):
        streams = [None] + [new_stream() for _ in range(3)]
        errors = []

        def work(seed):
            import random
            rnd = random.Random(seed)
            live = []
            for _ in range(1500):
                if len(live) < 12 and rnd.random() < 0.6:
                    p = lib().npualloc_malloc(rnd.randint(1, 3 << 20), 0, streams[seed % 4])
                    if not p:
                        errors.append(npualloc.last_error())
                        continue
                    if rnd.random() < 0.2:
                        lib().npualloc_record_stream(p, rnd.choice(streams[1:]))
                    live.append(p)
                elif live:
                    lib().npualloc_free(live.pop(rnd.randrange(len(live))), 0, 0, None)
            for p in live:
                lib().npualloc_free(p, 0, 0, None)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertTrue(consistent(), npualloc.last_error())
        for s in streams[1:]:
            complete(s)
        npualloc.empty_cache()
        s = npualloc.memory_stats(0)
        self.assertEqual(s["allocation.all.current"], 0)
        self.assertEqual(s["reserved_bytes.all.current"], 0)
        self.assertEqual(counters().violations, 0)


NPUALLOC_BIN = os.environ.get("NPUALLOC_BIN")

WORKLOAD = r"""
import ctypes, random, sys
sys.path.insert(0, sys.argv[1])
import npualloc
lib = npualloc.load()
rnd = random.Random(7)
live, cur, peak = [], 0, 0
for _ in range(3000):
    if len(live) < 40 and rnd.random() < 0.55:
        n = rnd.choice([rnd.randint(1, 4096), rnd.randint(1, 3 << 20), rnd.randint(1, 40 << 20)])
        p = lib.npualloc_malloc(n, 0, None)
        assert p, npualloc.last_error()
        if rnd.random() < 0.1:
            lib.npualloc_record_stream(p, None)
        live.append((p, n)); cur += n; peak = max(peak, cur)
    elif live:
        p, n = live.pop(rnd.randrange(len(live)))
        lib.npualloc_free(p, n, 0, None); cur -= n
lib.npualloc_free(12345, 0, 0, None)  # a bad free is not recorded
npualloc.empty_cache()                 # flushes the trace
print(peak)
"""


@unittest.skipUnless(NPUALLOC_BIN, "NPUALLOC_BIN (the npualloc command) not set")
class TraceTools(unittest.TestCase):
    def test_recorded_trace_replays_to_the_same_peak(self):
        import subprocess
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "rec.trace")
            env = dict(os.environ, NPUALLOC_TRACE=path)
            here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
            peak = int(subprocess.run([sys.executable, "-c", WORKLOAD, here], env=env, check=True,
                                      capture_output=True, text=True).stdout.strip())
            with open(path) as f:
                text = f.read()
            self.assertTrue(text.startswith("# npualloc-trace v1"))
            self.assertGreater(text.count("\na "), 1000)
            out = subprocess.run([NPUALLOC_BIN, "replay", path, "--json"], check=True,
                                 capture_output=True, text=True).stdout
            report = json.loads(out)[0]
            self.assertEqual(report["peak_requested"], peak)
            self.assertEqual(report["reserved_after_drain"], 0)

    def test_pickle_snapshot_converts(self):
        import pickle
        import subprocess
        entries = [
            {"action": "segment_alloc", "addr": 0x7000, "size": 2 << 20, "stream": 0, "frames": [], "time_us": 0},
            {"action": "alloc", "addr": 0x7000, "size": 100, "stream": 0, "frames": [], "time_us": 1},
            {"action": "alloc", "addr": 0x9000, "size": 300, "stream": 0xBEEF, "frames": [], "time_us": 2},
            {"action": "free_requested", "addr": 0x7000, "size": 100, "stream": 0, "frames": [], "time_us": 3},
            {"action": "free_completed", "addr": 0x7000, "size": 100, "stream": 0, "frames": [], "time_us": 4},
            {"action": "alloc", "addr": 0x7000, "size": 50, "stream": 0, "frames": [], "time_us": 5},
            {"action": "free_completed", "addr": 0x9000, "size": 300, "stream": 0xBEEF, "frames": [], "time_us": 6},
        ]
        snap = {"segments": [], "device_traces": [entries]}
        with tempfile.TemporaryDirectory() as d:
            src, dst = os.path.join(d, "s.pickle"), os.path.join(d, "s.trace")
            with open(src, "wb") as f:
                pickle.dump(snap, f)
            subprocess.run([NPUALLOC_BIN, "convert", src, "-o", dst], check=True, capture_output=True)
            with open(dst) as f:
                lines = [l for l in f.read().splitlines() if not l.startswith("#")]
        self.assertEqual(lines, ["a 0 100 0", "a 1 300 1", "f 0", "a 2 50 0", "f 1"])


DIRECT_WORKLOAD = r"""
import random, sys
sys.path.insert(0, sys.argv[1])
import npualloc
rnd = random.Random(11)
side = npualloc.sim_stream()
live, cur, peak = [], 0, 0
for _ in range(2000):
    if len(live) < 30 and rnd.random() < 0.55:
        n = rnd.choice([rnd.randint(1, 4096), rnd.randint(1, 3 << 20), rnd.randint(1, 30 << 20)])
        p = npualloc.malloc(n, stream=side if rnd.random() < 0.2 else None)
        if rnd.random() < 0.1:
            npualloc.record_stream(p, side)
        live.append((p, n)); cur += n; peak = max(peak, cur)
    elif live:
        p, n = live.pop(rnd.randrange(len(live)))
        npualloc.free(p); cur -= n
npualloc.empty_cache()                 # flushes the trace
print(peak)
"""


class WithoutTorch(unittest.TestCase):
    """npualloc.malloc / free / record_stream: the allocator driven from Python."""

    def test_malloc_record_stream_free(self):
        base = npualloc.memory_stats(0)["allocated_bytes.all.current"]
        side = new_stream()
        p = npualloc.malloc(5000)
        q = npualloc.malloc(3 << 20, device=0, stream=side)
        self.assertEqual(p % 512, 0)
        self.assertEqual(npualloc.memory_stats(0)["allocated_bytes.all.current"],
                         base + block(5000) + block(3 << 20))
        npualloc.record_stream(p, side)
        self.assertEqual(launch(side, 1), 0)
        npualloc.free(p)
        # Recorded on a busy stream: its block waits for that stream's work.
        r = npualloc.malloc(5000)
        self.assertNotEqual(r, p)
        self.assertEqual(complete(side), 0)
        npualloc.free(r)
        npualloc.free(q)
        self.assertEqual(npualloc.memory_stats(0)["allocated_bytes.all.current"], base)
        self.assertTrue(consistent())

    def test_bad_input_is_a_clear_error_without_c_names(self):
        stats = npualloc.memory_stats(0)
        for size in (0, -1, 1.5, True, "1"):
            with self.assertRaises(ValueError):
                npualloc.malloc(size)
        with self.assertRaises(npualloc.OutOfMemoryError) as cm:
            npualloc.malloc(8 << 30)  # the test device holds 4 GiB
        self.assertIsInstance(cm.exception, MemoryError)
        self.assertIsInstance(cm.exception, npualloc.NpuallocError)
        self.assertIn("out of memory. Tried to allocate 8.00 GiB", str(cm.exception))
        with self.assertRaises(npualloc.NpuallocError) as too_large:
            npualloc.malloc(SIZE_MAX)
        self.assertNotIsInstance(too_large.exception, npualloc.OutOfMemoryError)
        with self.assertRaises(npualloc.NpuallocError) as bad_device:
            npualloc.malloc(64, device=-1)
        self.assertIn("invalid device -1", str(bad_device.exception))
        with self.assertRaises(npualloc.NpuallocError) as unknown:
            npualloc.free(0xdeadbeef)
        self.assertIn("unknown pointer 0xdeadbeef", str(unknown.exception))
        p = npualloc.malloc(100)
        npualloc.free(p)
        with self.assertRaises(npualloc.NpuallocError) as double:
            npualloc.free(p)  # the same message twice is still seen as a failure
        with self.assertRaises(npualloc.NpuallocError):
            npualloc.free(p)
        with self.assertRaises(npualloc.NpuallocError):
            npualloc.record_stream(p, None)
        with self.assertRaises(TypeError):
            npualloc.free(None)
        with self.assertRaises(TypeError):
            npualloc.record_stream(0x1000, "s1")
        errors = [cm.exception, too_large.exception, bad_device.exception, unknown.exception,
                  double.exception]
        if not ACL:  # ACL cannot tell a stream handle is bogus; the sim can
            with self.assertRaises(npualloc.NpuallocError) as stream:
                npualloc.malloc(64, stream=0x4242)
            self.assertIn("unknown stream", str(stream.exception))
            errors.append(stream.exception)
        for e in errors:
            self.assertNotRegex(str(e), r"npualloc_\w+", "a C function's name leaked")
        now = npualloc.memory_stats(0)
        current = [k for k in stats if k.endswith(".current") and k.startswith(
            ("allocation.", "allocated_bytes.", "active", "requested_bytes."))]
        self.assertGreater(len(current), 10)
        self.assertEqual([now[k] for k in current], [stats[k] for k in current],
                         "a failed call left something allocated")
        self.assertTrue(consistent())

    def test_snapshot_pickle_for_a_pickle_name(self):
        p = npualloc.malloc(5000)
        with tempfile.TemporaryDirectory() as d:
            for name in ("snap.json", "snap.pickle"):
                npualloc.dump_snapshot(os.path.join(d, name))
            with open(os.path.join(d, "snap.json")) as f:
                as_json = json.load(f)
            with open(os.path.join(d, "snap.pickle"), "rb") as f:
                raw = f.read()
        npualloc.free(p)
        self.assertEqual(raw[:1], b"\x80", "not a pickle")
        import pickle
        self.assertEqual(pickle.loads(raw), as_json)
        self.assertTrue(any(b["address"] == p for s in as_json["segments"] for b in s["blocks"]))

    @unittest.skipIf(ACL, "sim_stream: the simulated device's streams")
    @unittest.skipUnless(NPUALLOC_BIN, "NPUALLOC_BIN (the npualloc command) not set")
    def test_recorded_python_workload_replays_to_its_peak(self):
        import subprocess
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "py.trace")
            env = dict(os.environ, NPUALLOC_TRACE=path, NPUALLOC_SIM_MODE="threaded")
            here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
            run = subprocess.run([sys.executable, "-c", DIRECT_WORKLOAD, here], env=env,
                                 capture_output=True, text=True)
            self.assertEqual(run.returncode, 0, run.stderr)
            with open(path) as f:
                text = f.read()
            self.assertGreater(text.count("\na "), 500)
            self.assertIn("\nr ", text, "record_stream was not recorded")
            out = subprocess.run([NPUALLOC_BIN, "replay", path, "--json"], check=True,
                                 capture_output=True, text=True).stdout
        self.assertEqual(json.loads(out)[0]["peak_requested"], int(run.stdout))

    def test_did_you_mean_for_settings_and_backends(self):
        import subprocess
        here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        code = ("import sys; sys.path.insert(0, sys.argv[1]); import npualloc\n"
                "try:\n    npualloc.malloc(64)\n"
                "except npualloc.NpuallocError as e:\n    print(e)\n")
        env = dict(os.environ, NPUALLOC_CONF="max_split_size_md:128")
        out = subprocess.run([sys.executable, "-c", code, here], env=env, check=True,
                             capture_output=True, text=True).stdout
        self.assertIn("unrecognized key 'max_split_size_md' in allocator config; "
                      "did you mean 'max_split_size_mb'?", out)
        self.assertTrue(out.startswith("npualloc cannot start (backend "), out)
        self.assertNotIn("npualloc_", out)
        with self.assertRaises(ValueError) as cm:
            npualloc.use_backend("simm")
        self.assertIn("did you mean 'sim'?", str(cm.exception))


class Installer(unittest.TestCase):
    def tearDown(self):
        remove_standins()

    def test_install_swaps_in_the_complete_allocator(self):
        log = []
        install_standins(log)
        installed = npualloc.install(backend="sim")
        names = [e[0] for e in log]
        loads = [e for e in log if e[0] == "cpp_extension.load"]
        self.assertEqual(len(loads), 1)
        self.assertTrue(loads[0][1].startswith("npualloc_torch_npu_shim_"), loads[0][1])
        self.assertTrue(loads[0][2][0].endswith("torch_npu_shim.cpp"))
        self.assertIn("-ltorch_npu", loads[0][3]["extra_ldflags"])
        # torch_npu's own swap, with the shim's NPUAllocator; then c10's device allocator.
        swaps = [e for e in log if e[0] == "change_current_allocator"]
        self.assertEqual(len(swaps), 1)
        self.assertIs(swaps[0][1], installed)
        self.assertEqual(installed.allocator().flavour, "npu")
        self.assertLess(names.index("install_runtime_hooks"), names.index("change_current_allocator"))
        self.assertEqual(names[-1], "set_device_allocator", "c10::SetAllocator after the swap")

    def test_install_refuses_other_versions(self):
        for torch_npu_version, torch_version in (("2.13.0", "2.13.0"), ("2.15.0", "2.15.0"),
                                                 ("2.14.0", "2.13.1"), ("nightly", "2.14.0")):
            log = []
            install_standins(log, torch_version=torch_version, torch_npu_version=torch_npu_version)
            with self.assertRaises(npualloc.NpuallocError) as cm:
                npualloc.install(backend="sim")
            msg = str(cm.exception)
            self.assertIn("supports", msg)
            self.assertIn("2.14", msg)
            self.assertTrue(torch_npu_version in msg or torch_version in msg, msg)
            self.assertEqual(log, [], "nothing built or swapped for an unsupported version")
            remove_standins()

    def test_shim_builds_are_named_by_what_they_depend_on(self):
        lib = npualloc.library_path()
        src = [os.path.join(os.path.dirname(npualloc.__file__), "csrc", "torch_npu_shim.cpp")]
        a = npualloc._shim_name("x", src, lib, ("2.14.0",))
        self.assertEqual(a, npualloc._shim_name("x", src, lib, ("2.14.0",)))
        self.assertNotEqual(a, npualloc._shim_name("x", src, lib, ("2.14.1",)))
        self.assertNotEqual(a, npualloc._shim_name("x", src, lib + ".other", ("2.14.0",)))
        cuda = [os.path.join(os.path.dirname(npualloc.__file__), "csrc", "cuda_shim.cpp")]
        self.assertNotEqual(a, npualloc._shim_name("x", cuda, lib, ("2.14.0",)))

    def test_install_too_late_says_so(self):
        install_standins([], already_initialized=True)
        with self.assertRaises(npualloc.NpuallocError) as cm:
            npualloc.install(backend="sim")
        self.assertIn("before anything allocates", str(cm.exception))
        self.assertIn("Can't swap an already initialized allocator", str(cm.exception))

    def test_install_fails_if_c10_keeps_another_device_allocator(self):
        install_standins([], takes_device_allocator=False)
        with self.assertRaises(npualloc.NpuallocError) as cm:
            npualloc.install(backend="sim")
        self.assertIn("c10::GetAllocator(PrivateUse1)", str(cm.exception))

    def test_install_cuda_swaps_in_its_complete_allocator(self):
        log = []
        with tempfile.TemporaryDirectory() as home:
            os.makedirs(os.path.join(home, "include", "crt"))
            for h in ("cuda_runtime_api.h", os.path.join("crt", "host_config.h")):
                open(os.path.join(home, "include", h), "w").close()
            install_standins(log, cuda_home=home)
            saved = {k: os.environ.pop(k, None) for k in ("CUDA_HOME", "CUDA_PATH", "NPUALLOC_CUDA_INCLUDE")}
            try:
                installed = npualloc.install_cuda()
            finally:
                os.environ.update({k: v for k, v in saved.items() if v is not None})
            loads = [e for e in log if e[0] == "cpp_extension.load"]
            self.assertEqual(len(loads), 1)
            self.assertTrue(loads[0][1].startswith("npualloc_cuda_shim_"), loads[0][1])
            self.assertTrue(loads[0][2][0].endswith("cuda_shim.cpp"))
            self.assertIn(os.path.join(home, "include"), loads[0][3]["extra_include_paths"])
            self.assertIn("-lc10_cuda", loads[0][3]["extra_ldflags"])
        self.assertEqual(installed.allocator().flavour, "cuda")
        self.assertEqual([e[0] for e in log][-2:], ["change_current_allocator", "set_device_allocator"])

    def test_install_cuda_without_the_cuda_headers_says_which(self):
        with tempfile.TemporaryDirectory() as home:
            os.makedirs(os.path.join(home, "include"))
            open(os.path.join(home, "include", "cuda_runtime_api.h"), "w").close()  # no crt/
            install_standins([], cuda_home=home)
            saved = {k: os.environ.pop(k, None) for k in ("CUDA_HOME", "CUDA_PATH", "NPUALLOC_CUDA_INCLUDE")}
            try:
                with self.assertRaises(npualloc.NpuallocError) as cm:
                    npualloc.install_cuda()
            finally:
                os.environ.update({k: v for k, v in saved.items() if v is not None})
        self.assertIn("host_config.h", str(cm.exception))
        self.assertIn("nvidia-cuda-crt", str(cm.exception))

    def test_install_cuda_refuses_other_versions(self):
        log = []
        install_standins(log, torch_version="2.11.0+cu130")
        with self.assertRaises(npualloc.NpuallocError) as cm:
            npualloc.install_cuda()
        self.assertIn("2.11.0+cu130", str(cm.exception))
        self.assertIn("2.14", str(cm.exception))
        self.assertEqual(log, [])


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=1).result
    failed = len(result.failures) + len(result.errors)
    print("python-abi: %d passed, %d failed" % (result.testsRun - failed, failed))
    sys.exit(1 if failed or not result.wasSuccessful() else 0)
