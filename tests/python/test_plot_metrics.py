"""python/plot_metrics.py renders a PNG of a tiny run's metrics (MoE panels included) and of several
runs at once; it keeps the last record of a repeated step, draws non-finite values ("nan"/"inf"
strings) as gaps and lists them, leaves a resume's abandoned line out unless asked, and draws the
loss of each named validation set. It replaces an existing image only with --overwrite, refuses an
image it cannot write before the work, and names the file and line of a metrics line that is not
UTF-8."""
import contextlib
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

from tracking_util import PYTHON_TOOLS, metrics, require, train

require("matplotlib", "plot_metrics.py")
import moe_metrics  # noqa: E402  (python/, on the path through tracking_util)
import plot_metrics  # noqa: E402

PLOT = os.path.join(PYTHON_TOOLS, "plot_metrics.py")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class PlotMetrics(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="moe-plot-test-")

    def tearDown(self):
        self.tmp.cleanup()

    def plot(self, *args):
        """plot_metrics.main in this process (matplotlib is imported once); returns what it printed."""
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            plot_metrics.main(list(args))
        return out.getvalue()

    def assert_png(self, path):
        with open(path, "rb") as f:
            data = f.read()
        self.assertEqual(data[:8], PNG_SIGNATURE)
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        self.assertGreater(width, 1000)
        self.assertGreater(height, 500)

    def test_renders_a_png_of_two_runs_one_resumed_with_its_abandoned_line_on_request(self):
        a, b = os.path.join(self.tmp.name, "a"), os.path.join(self.tmp.name, "b")
        train(a, sets=["train.steps=4", "train.eval_every=2"])
        train(b, sets=["train.steps=4", "train.save_every=2", "train.eval_every=0"])
        train(b, sets=["train.steps=3", "train.eval_every=0"], extra=["--resume", os.path.join(b, "step-000002")])
        out_png = os.path.join(self.tmp.name, "curves.png")
        self.assertIn(f"wrote {out_png}", self.plot(a, b, "--abandoned", "--out", out_png))
        self.assert_png(out_png)

        current, abandoned = plot_metrics.load_run(b, with_abandoned=False)
        self.assertEqual([r["step"] for r in current], [1, 2, 3])
        self.assertEqual(abandoned, [])
        current, abandoned = plot_metrics.load_run(b, with_abandoned=True)
        [(label, records)] = abandoned
        self.assertIn("after-step-000002", label)
        self.assertEqual([r["step"] for r in records], [3, 4])
        # The MoE panels have data: one expert-load line per MoE layer of the tiny model.
        self.assertEqual(plot_metrics.layer_tags(current), ["expert_load/layer_0", "expert_load/layer_1"])
        self.assertEqual(len(plot_metrics.series(current, "dropped_fraction")[0]), 3)
        self.assertEqual(len(plot_metrics.series(current, "z_loss")[0]), 3)

    def test_a_repeated_step_counts_once_with_its_last_record_and_non_finite_values_are_gaps(self):
        run = os.path.join(self.tmp.name, "run")
        train(run, sets=["train.steps=3", "train.eval_every=0"])
        records = metrics(run)
        # As an older version could leave it: step 2 written twice, and a diverged eval at step 3.
        rewritten = records[:2] + [dict(records[1], lm_loss=9.5)] + [dict(records[2], eval_loss="nan", lb_loss="inf")]
        with open(os.path.join(run, "metrics.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rewritten)
        current, _ = plot_metrics.load_run(run, with_abandoned=False)
        self.assertEqual([r["step"] for r in current], [1, 2, 3])
        steps, lm = plot_metrics.series(current, "lm_loss")
        self.assertEqual(lm[1], 9.5)
        steps, ev = plot_metrics.series(current, "eval_loss")
        self.assertEqual(steps, [3])
        self.assertTrue(math.isnan(ev[0]))

        out_png = os.path.join(self.tmp.name, "run.png")
        out = self.plot(run, "--out", out_png)
        self.assert_png(out_png)
        self.assertIn(f"{run}: eval_loss not finite at step 3", out)
        self.assertIn(f"{run}: lb_loss not finite at step 3", out)

    def write_run(self, name, records, tail=b""):
        """A run folder whose metrics.jsonl holds `records` (then the bytes `tail`)."""
        run = os.path.join(self.tmp.name, name)
        os.makedirs(run)
        with open(os.path.join(run, "metrics.jsonl"), "wb") as f:
            f.writelines(json.dumps(r).encode() + b"\n" for r in records)
            f.write(tail)
        return run

    def run_tool(self, *args):
        return subprocess.run([sys.executable, PLOT, *args], capture_output=True, text=True, timeout=60)

    def assert_one_line_error(self, p, *needles):
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertTrue(p.stderr.startswith("error: "), p.stderr)
        self.assertEqual(p.stderr.count("\n"), 1, p.stderr)
        for needle in needles:
            self.assertIn(needle, p.stderr)

    def test_validation_sets_are_drawn_in_the_loss_panel_beside_eval_loss(self):
        import matplotlib.pyplot as plt

        records = [{"step": 1, "lm_loss": 7.0},
                   {"step": 2, "lm_loss": 6.5, "eval_loss": 6.6, "eval_sets": {"val": 6.25, "code": "nan"}},
                   {"step": 3, "lm_loss": 6.0},
                   {"step": 4, "lm_loss": 5.5, "eval_loss": 5.7, "eval_sets": {"val": 5.5, "code": None}}]
        run = self.write_run("sets", records)
        current, _ = plot_metrics.load_run(run, with_abandoned=False)
        self.assertEqual(plot_metrics.eval_set_tags(current), ["eval_loss/val", "eval_loss/code"])
        self.assertEqual(plot_metrics.series(current, "eval_loss/val"), ([2, 4], [6.25, 5.5]))
        steps, code = plot_metrics.series(current, "eval_loss/code")  # "nan" a gap, null left out as elsewhere
        self.assertEqual(steps, [2])
        self.assertTrue(math.isnan(code[0]))
        fig, ax = plt.subplots()
        plot_metrics.draw(ax, current, plot_metrics.PANELS[0][2], "C0", "sets", {"linestyle": "-", "linewidth": 1})
        self.assertEqual([line.get_label() for line in ax.get_lines()],
                         ["sets lm_loss", "sets eval_loss", "sets eval_loss/val", "sets eval_loss/code"])
        plt.close(fig)
        out_png = os.path.join(self.tmp.name, "sets.png")
        self.assertIn("sets: eval_loss/code not finite at step 2", self.plot(run, "--out", out_png))
        self.assert_png(out_png)

    def test_an_existing_image_is_replaced_only_with_overwrite(self):
        run = self.write_run("run", [{"step": 1, "lm_loss": 7.0}, {"step": 2, "lm_loss": 6.0}])
        out_png = os.path.join(self.tmp.name, "mine.png")
        with open(out_png, "wb") as f:
            f.write(b"the user's own file")
        self.assert_one_line_error(self.run_tool(run, "--out", out_png), f"--out {out_png} exists", "--overwrite")
        with open(out_png, "rb") as f:
            self.assertEqual(f.read(), b"the user's own file")
        self.assertIn(f"wrote {out_png}", self.plot(run, "--out", out_png, "--overwrite"))
        self.assert_png(out_png)
        self.assertEqual(sorted(os.listdir(self.tmp.name)), ["mine.png", "run"])  # no temporary file left

    def test_an_image_that_cannot_be_written_is_refused_before_the_work(self):
        run = self.write_run("run", [{"step": 1, "lm_loss": 7.0}])
        missing = os.path.join(self.tmp.name, "missing_dir")
        self.assert_one_line_error(self.run_tool(run, "--out", os.path.join(missing, "x.png")),
                                   f"its folder {missing} does not exist")
        self.assert_one_line_error(self.run_tool(run, "--out", os.path.join(self.tmp.name, "x.xyz")),
                                   "cannot write '.xyz' files", ".png")
        self.assert_one_line_error(self.run_tool(run, "--out", os.path.join(self.tmp.name, "x")),
                                   "without an extension")
        self.assertEqual(os.listdir(self.tmp.name), ["run"])

    def test_a_metrics_line_that_is_not_utf8_is_an_error_naming_the_file_and_line(self):
        latin1 = b'{"step": 2, "note": "caf\xe9"}\n'
        run = self.write_run("run", [{"step": 1, "lm_loss": 7.0}], tail=latin1)
        path = os.path.join(run, "metrics.jsonl")
        self.assert_one_line_error(self.run_tool(run, "--out", os.path.join(self.tmp.name, "x.png")),
                                   f"{path}:2: not UTF-8 text: byte 0xe9")
        # A last line still being written may end inside a character: it waits, as any unfinished line.
        run = self.write_run("writing", [{"step": 1, "lm_loss": 7.0}], tail='{"step": 2, "note": "é'.encode()[:-1])
        self.assertEqual([r["step"] for r in plot_metrics.load_run(run, with_abandoned=False)[0]], [1])

    def test_odd_lines_are_errors_or_values_never_tracebacks(self):
        out_png = os.path.join(self.tmp.name, "x.png")
        # Nested too deeply for Python's JSON parser (a RecursionError traceback before).
        run = self.write_run("deep", [{"step": 1, "lm_loss": 7.0}], tail=b"[" * 100000 + b"]" * 100000 + b"\n")
        self.assert_one_line_error(self.run_tool(run, "--out", out_png),
                                   f"{os.path.join(run, 'metrics.jsonl')}:2: not a JSON record: nested too deeply")
        # "step": true is no integer step (it replaced step 1's record: True == 1 in Python).
        run = self.write_run("bool", [{"step": 1, "lm_loss": 7.0}, {"step": True, "lm_loss": 1.0}])
        self.assert_one_line_error(self.run_tool(run, "--out", out_png),
                                   f"{os.path.join(run, 'metrics.jsonl')}:2: a record without an integer 'step'")
        # An integer past a double's range is inf (an OverflowError traceback before), listed as not finite.
        run = self.write_run("huge", [{"step": 1, "lm_loss": 7.0}, {"step": 2, "lm_loss": 10**400}])
        self.assertEqual(moe_metrics.scalars({"step": 2, "lm_loss": 10**400})["lm_loss"], math.inf)
        self.assertEqual(moe_metrics.number(-10**400), -math.inf)
        self.assertIn(f"{run}: lm_loss not finite at step 2", self.plot(run, "--out", out_png))
        os.remove(out_png)
        # A run folder whose name is not UTF-8 is drawn (matplotlib refused its label: a traceback).
        odd = os.fsencode(self.tmp.name) + b"/r\xffun"
        os.rename(self.write_run("odd", [{"step": 1, "lm_loss": 7.0}]), odd)
        p = subprocess.run([sys.executable, os.fsencode(PLOT), odd, b"--out", os.fsencode(out_png)],
                           capture_output=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assert_png(out_png)

    def test_non_finite_values_of_an_abandoned_line_are_listed_too(self):
        run = self.write_run("run", [{"step": 1, "lm_loss": 7.0}, {"step": 2, "lm_loss": 6.0}])
        line = os.path.join(run, "abandoned", "20261207T000000-after-step-1")
        os.makedirs(line)
        with open(os.path.join(line, "metrics.jsonl"), "w") as f:
            f.write(json.dumps({"step": 2, "lm_loss": "nan"}) + "\n")
        out = self.plot(run, "--abandoned", "--out", os.path.join(self.tmp.name, "x.png"))
        self.assertIn(f"{run} ({os.path.basename(line)}): lm_loss not finite at step 2", out)

    def test_runs_without_records_are_an_error_and_one_empty_run_beside_others_is_said(self):
        # Before, no records at all gave an image of six "no data" panels and exit 0.
        empty = self.write_run("empty", [], tail=b"\n\n")
        out_png = os.path.join(self.tmp.name, "x.png")
        self.assert_one_line_error(self.run_tool(empty, "--out", out_png),
                                   "no records to plot", os.path.join(empty, "metrics.jsonl"), "x.png not written")
        self.assertFalse(os.path.exists(out_png))
        os.makedirs(os.path.join(empty, "abandoned"))  # a resume set its only line aside
        self.assert_one_line_error(self.run_tool(empty, "--out", out_png), "--abandoned draws them")
        run = self.write_run("run", [{"step": 1, "lm_loss": 7.0}])
        out = self.plot(run, empty, "--out", out_png)
        self.assertIn(f"{empty}: {os.path.join(empty, 'metrics.jsonl')} holds no records yet", out)
        self.assert_png(out_png)

    def test_an_unreadable_run_is_an_error_naming_the_file(self):
        p = subprocess.run([sys.executable, PLOT, os.path.join(self.tmp.name, "missing"), "--out",
                            os.path.join(self.tmp.name, "x.png")], capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(os.path.join(self.tmp.name, "missing", "metrics.jsonl"), p.stderr)


if __name__ == "__main__":
    unittest.main()
