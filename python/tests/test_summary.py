"""Tests of npualloc.memory_summary() and of how the package chooses its backend.

Run on the simulated backend (NPUALLOC_BACKEND=sim NPUALLOC_LIB=<path>; the
scripts/test-python.sh wrapper sets them). The comparison with the real
torch.npu.memory_summary() is tests/torch_npu/scenarios/memory_summary.py.
"""

import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

import npualloc  # noqa: E402

MIB = 1 << 20


def torch_format_size(sz, pref_sz):
    """torch_npu 2.14's _format_size (torch_npu/npu/memory.py), the reference the table
    follows: the unit is chosen by the row's first column."""
    prefixes = ["B ", "KB", "MB", "GB", "TB", "PB"]
    prefix = prefixes[0]
    for new_prefix in prefixes[1:]:
        if pref_sz < 768 * 1024:
            break
        prefix = new_prefix
        sz //= 1024
        pref_sz /= 1024
    return "%7d %s" % (sz, prefix)


def table_row(text, name):
    """The cells of the table row whose label is `name`."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells and cells[0] == name:
            return cells[1:]
    raise AssertionError("no row %r in:\n%s" % (name, text))


def run_clean(code, **env):
    """Runs `code` in a fresh interpreter whose environment names no backend, library
    search folder or CANN installation, plus `env`."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("NPUALLOC_BACKEND", "NPUALLOC_ACL", "ASCEND"))
            and k != "LD_LIBRARY_PATH"}
    base["PYTHONPATH"] = os.path.join(HERE, "..")
    base.update(env)
    return subprocess.run([sys.executable, "-c", code], env=base, capture_output=True,
                          text=True, timeout=120)


class MemorySummary(unittest.TestCase):
    def setUp(self):
        self.lib = npualloc.load()
        self.ptrs = []

    def tearDown(self):
        for p in self.ptrs:
            self.lib.npualloc_free(p, 0, 0, None)
        npualloc.empty_cache()

    def alloc(self, n):
        p = self.lib.npualloc_malloc(n, 0, None)
        self.assertIsNotNone(p, npualloc.last_error())
        self.ptrs.append(p)
        return p

    def test_table_is_framed_and_titled_like_torch_npu(self):
        text = npualloc.memory_summary()
        lines = text.splitlines()
        table = lines[:-1]
        self.assertEqual(table[0], "|" + "=" * 75 + "|")
        self.assertIn("PyTorch NPU memory summary, device ID 0", table[1])
        self.assertEqual(table[-1], "|" + "=" * 75 + "|")
        for line in table:
            self.assertEqual(len(line), 77, line)
        self.assertTrue(lines[-1].startswith("reserved "), lines[-1])

    def test_rows_follow_the_statistics(self):
        self.alloc(3 * MIB)
        self.alloc(4096)
        stats = npualloc.memory_stats()
        text = npualloc.memory_summary()
        for row, key in (("Allocated memory", "allocated_bytes"),
                         ("NPU reserved memory", "reserved_bytes")):
            cur = stats[key + ".all.current"]
            peak = stats[key + ".all.peak"]
            cells = table_row(text, row)
            self.assertEqual(cells[0], torch_format_size(cur, cur).strip(), row)
            self.assertEqual(cells[1], torch_format_size(peak, cur).strip(), row)
        # Pool rows take their unit from the "all" row (the third "from large pool" row
        # is the reserved memory's).
        large = stats["reserved_bytes.large_pool.current"]
        self.assertGreater(large, 0)
        large_rows = [line for line in text.splitlines() if "from large pool" in line]
        self.assertEqual(large_rows[2].split("|")[2].strip(),
                         torch_format_size(large, stats["reserved_bytes.all.current"]).strip())
        self.assertEqual(table_row(text, "Allocations")[0], str(stats["allocation.all.current"]))
        # The fragmentation line accounts for the same reserve.
        frag = text.splitlines()[-1]
        self.assertIn("in %d segments" % stats["segment.all.current"], frag)
        self.assertIn("reserved / allocated", frag)

    def test_abbreviated_keeps_only_the_all_rows(self):
        self.alloc(MIB)
        full = npualloc.memory_summary()
        short = npualloc.memory_summary(abbreviated=True)
        self.assertIn("from large pool", full)
        self.assertNotIn("from large pool", short)
        self.assertNotIn("from small pool", short)
        # 8 metrics lose their two pool rows each.
        self.assertEqual(len(full.splitlines()) - len(short.splitlines()), 16)
        self.assertEqual(table_row(full, "Allocated memory"), table_row(short, "Allocated memory"))

    def test_empty_cache_shows_no_reserve(self):
        p = self.alloc(3 * MIB)
        self.lib.npualloc_free(p, 0, 0, None)
        self.ptrs.remove(p)
        npualloc.empty_cache()
        frag = npualloc.memory_summary().splitlines()[-1]
        self.assertTrue(frag.startswith("reserved 0 bytes in 0 segments"), frag)

    def test_invalid_device_raises_with_the_library_message(self):
        with self.assertRaises(npualloc.NpuallocError) as e:
            npualloc.memory_summary(device=7)
        self.assertIn("device", str(e.exception))


class BackendChoice(unittest.TestCase):
    def test_no_cann_runtime_is_one_clear_error(self):
        p = run_clean("import npualloc\n"
                      "try:\n    npualloc.memory_summary()\n"
                      "except npualloc.NpuallocError as e:\n    print('ERR', e)\n",
                      ASCEND_HOME_PATH="/nonexistent-cann")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("ERR npualloc found no CANN runtime", p.stdout)
        self.assertIn("NPUALLOC_BACKEND=sim", p.stdout)
        self.assertIn("/nonexistent-cann", p.stdout)  # every place tried is named

    def test_simulated_device_when_asked_for_by_argument(self):
        p = run_clean("import npualloc\nnpualloc.use_backend('sim')\n"
                      "print(npualloc.memory_summary(abbreviated=True))\n")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("PyTorch NPU memory summary, device ID 0", p.stdout)

    def test_simulated_device_when_asked_for_by_variable(self):
        p = run_clean("import npualloc\nprint(npualloc.memory_summary())\n",
                      NPUALLOC_BACKEND="sim")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(p.stdout.startswith("|" + "=" * 75 + "|"), p.stdout)

    def test_unknown_backend_is_refused(self):
        with self.assertRaises(ValueError):
            npualloc.use_backend("npu")


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=1).result
    failed = len(result.failures) + len(result.errors)
    print("python-summary: %d passed, %d failed" % (result.testsRun - failed, failed))
    sys.exit(1 if failed or not result.wasSuccessful() else 0)
