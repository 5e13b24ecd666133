"""python/plot_metrics.py renders a PNG of a tiny run's metrics (MoE panels included) and of several
runs at once; it keeps the last record of a repeated step, draws non-finite values ("nan"/"inf"
strings) as gaps and lists them, and leaves a resume's abandoned line out unless asked."""
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
import plot_metrics  # noqa: E402  (python/, on the path through tracking_util)

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

    def test_an_unreadable_run_is_an_error_naming_the_file(self):
        p = subprocess.run([sys.executable, PLOT, os.path.join(self.tmp.name, "missing"), "--out",
                            os.path.join(self.tmp.name, "x.png")], capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(os.path.join(self.tmp.name, "missing", "metrics.jsonl"), p.stderr)


if __name__ == "__main__":
    unittest.main()
