"""python/plot_figure4.py tables and plots `moetrain bench --json` reports of the Figure-4 runs: the
ratio column and the EP design's share are computed from the reports (a ratio of 0 is printed, a
zero baseline gives '-'); reports of several DDP designs are refused, naming them (the table took
whichever design's name sorted first, and labelled ep=1 DDP "DDP + EP"); an odd field is one error
line naming the file and field; --out is checked before the work, written under a temporary name,
and an existing image is replaced only with --overwrite (it was replaced without a word, and a full
disk left a truncated one)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

from tracking_util import PYTHON_TOOLS, require

require("matplotlib", "plot_figure4.py --out")

PLOT = os.path.join(PYTHON_TOOLS, "plot_figure4.py")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class PlotFigure4(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="moe-fig4-test-")

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.tmp.name, name)

    def report(self, name, mode="ddp", ep=4, n=8, moe_layers=2, tps=1000.0, mfu=0.25, **extra):
        r = {"parallel_mode": mode, "ep": ep, "num_experts": n, "moe_layers": moe_layers,
             "tokens_per_s_per_gpu": tps, "mfu": mfu, **extra}
        with open(self.path(name), "w") as f:
            json.dump(r, f)
        return self.path(name)

    def run_tool(self, *args):
        return subprocess.run([sys.executable, PLOT, *args], capture_output=True, text=True)

    def assert_one_line_error(self, r, *parts):
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertTrue(lines[0].startswith("error: "), r.stderr)
        for part in parts:
            self.assertIn(part, lines[0])

    def test_the_table_computes_ratios_and_the_share_from_the_reports(self):
        reports = [self.report("ep-n8.json", n=8, tps=3000.0), self.report("ep-n64.json", n=64, tps=2400.0),
                   self.report("fsdp-n8.json", mode="fsdp", ep=1, n=8, tps=1200.0),
                   self.report("fsdp-n64.json", mode="fsdp", ep=1, n=64, tps=0.0),
                   self.report("dense.json", moe_layers=0, ep=1, tps=5000.0)]
        r = self.run_tool(*reports)
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line.split()[0].isdigit()}
        self.assertEqual(rows["8"][-1], f"{3000.0 / 1200.0:.2f}x")
        self.assertEqual(rows["64"][-1], "-")  # a zero baseline: no ratio, no ZeroDivisionError
        self.assertIn(f"ep4 at N=64: {100 * 2400.0 / 3000.0:.1f}% of its N=8 throughput", r.stdout)
        # A ratio of exactly 0 is a number, not '-'.
        zero = self.run_tool(self.report("ep-zero.json", n=16, tps=0.0),
                             self.report("fsdp-16.json", mode="fsdp", ep=1, n=16, tps=10.0))
        self.assertIn("0.00x", zero.stdout, zero.stderr)

    def test_reports_of_several_ddp_designs_are_refused_naming_them(self):
        a = self.report("ep2.json", ep=2)
        b = self.report("ddp.json", ep=1)
        c = self.report("fsdp.json", mode="fsdp", ep=1)
        r = self.run_tool(a, b, c, "--out", self.path("x.png"))
        self.assert_one_line_error(r, "several DDP designs", "DDP + EP (rowwise, ep=2): " + a, "DDP (ep=1): " + b)
        self.assertFalse(os.path.exists(self.path("x.png")))

    def test_an_odd_field_is_one_error_naming_the_file_and_field(self):
        cases = [("ep", "2", "ep must be an integer >= 1"), ("ep", True, "ep must be an integer >= 1"),
                 ("tokens_per_s_per_gpu", None, "tokens_per_s_per_gpu must be a finite number >= 0"),
                 ("mfu", "nan", "mfu must be a finite number >= 0"),
                 ("num_experts", 0, "num_experts must be an integer >= 1")]
        for key, value, message in cases:
            path = self.report(f"{key}.json", **{key: value})
            self.assert_one_line_error(self.run_tool(path), path, message)
        with open(self.path("latin1.json"), "wb") as f:
            f.write(b'{"parallel_mode": "d\xe9"}')
        self.assert_one_line_error(self.run_tool(self.path("latin1.json")), "not UTF-8")
        with open(self.path("deep.json"), "w") as f:
            f.write("[" * 100000 + "]" * 100000)
        self.assert_one_line_error(self.run_tool(self.path("deep.json")), "nested too deeply")
        with open(self.path("list.json"), "w") as f:
            f.write("[1, 2]")
        self.assert_one_line_error(self.run_tool(self.path("list.json")), "not a JSON object")

    def test_an_existing_image_is_replaced_only_with_overwrite_and_bad_outs_are_refused_first(self):
        reports = [self.report("ep.json"), self.report("fsdp.json", mode="fsdp", ep=1)]
        out = self.path("fig.png")
        with open(out, "wb") as f:
            f.write(b"the user's image")
        r = self.run_tool(*reports, "--out", out)
        self.assert_one_line_error(r, f"--out {out} exists", "--overwrite")
        self.assertEqual(r.stdout, "")  # refused before the table
        with open(out, "rb") as f:
            self.assertEqual(f.read(), b"the user's image")
        r = self.run_tool(*reports, "--out", out, "--overwrite")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"wrote {out}", r.stdout)
        with open(out, "rb") as f:
            self.assertEqual(f.read(8), PNG_SIGNATURE)
        # A folder (it wrote <folder>.png and said it wrote the folder), no extension (it wrote
        # <name>.png), a missing folder or an unknown format (tracebacks): refused, nothing written.
        os.mkdir(self.path("folder"))
        for bad, message in ((self.path("folder"), "is a folder"), (self.path("noext"), "without an extension"),
                             (self.path("missing/f.png"), "does not exist"), (self.path("f.xyz"), "'.xyz' files")):
            self.assert_one_line_error(self.run_tool(*reports, "--out", bad), message)
        self.assertEqual(sorted(os.listdir(self.tmp.name)), ["ep.json", "fig.png", "folder", "fsdp.json"])
        self.assertEqual(os.listdir(self.path("folder")), [])


if __name__ == "__main__":
    unittest.main()
