"""`moetrain train --set run.tensorboard=true` writes event files that TensorBoard's own reader
loads, holding every scalar of metrics.jsonl at its step; after a resume from an older step the
run's TensorBoard folder holds the current line only and the abandoned line sits beside its
metrics under abandoned/. Orphan purging is off in the reader, so it cannot hide stale events."""
import glob
import math
import os
import struct
import tempfile
import unittest

from tracking_util import metrics, moe_metrics, require, train

event_accumulator = require("tensorboard.backend.event_processing.event_accumulator", "reading TensorBoard events")
event_file_loader = require("tensorboard.backend.event_processing.event_file_loader", "reading TensorBoard events")


def as_float32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def expected_scalars(records):
    """{tag: [(step, float32 value)]} of metrics records, as the events should hold them."""
    out = {}
    for r in moe_metrics.last_per_step(records):
        for tag, v in moe_metrics.scalars(r).items():
            out.setdefault(tag, []).append((r["step"], as_float32(v)))
    return out


def tensorboard_scalars(logdir):
    """{tag: [(step, value)]} as TensorBoard's EventAccumulator loads a folder of event files."""
    acc = event_accumulator.EventAccumulator(logdir, size_guidance={event_accumulator.SCALARS: 0},
                                             purge_orphaned_data=False)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


class TensorBoardEvents(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="moe-tb-test-")
        self.run_dir = os.path.join(self.tmp.name, "run")

    def tearDown(self):
        self.tmp.cleanup()

    def assert_same_scalars(self, got, want):
        self.assertEqual(sorted(got), sorted(want))
        for tag in want:
            self.assertEqual([s for s, _ in got[tag]], [s for s, _ in want[tag]], tag)
            for (step, g), (_, w) in zip(got[tag], want[tag]):
                if math.isnan(w):
                    self.assertTrue(math.isnan(g), f"{tag} at step {step}: {g}, expected nan")
                else:
                    self.assertEqual(g, w, f"{tag} at step {step}")

    def test_tensorboard_reads_every_metrics_scalar_at_its_step(self):
        train(self.run_dir, sets=["train.steps=6", "train.eval_every=3", "run.tensorboard=true"])
        files = glob.glob(os.path.join(self.run_dir, "tensorboard", "events.out.tfevents.*"))
        self.assertEqual(len(files), 1, files)
        host_pid = os.path.basename(files[0]).split(".", 4)[4]
        self.assertRegex(host_pid, r".+\.\d+$")  # <unix time>.<host>.<pid>

        events = list(event_file_loader.EventFileLoader(files[0]).Load())
        self.assertEqual(events[0].file_version, "brain.Event:2")
        self.assertEqual([e.step for e in events[1:]], [1, 2, 3, 4, 5, 6])

        got = tensorboard_scalars(os.path.join(self.run_dir, "tensorboard"))
        want = expected_scalars(metrics(self.run_dir))
        for tag in ["loss", "lm_loss", "lb_loss", "z_loss", "grad_norm", "lr", "tokens_per_s", "mfu", "step_time_s",
                    "dropped_fraction", "expert_load_max_over_mean", "eval_loss", "expert_load/layer_0",
                    "expert_load/layer_1"]:
            self.assertIn(tag, got)
        self.assertEqual([s for s, _ in got["eval_loss"]], [3, 6])
        self.assert_same_scalars(got, want)

    def test_after_a_resume_from_an_older_step_tensorboard_shows_the_current_line_only(self):
        train(self.run_dir, sets=["train.steps=6", "train.save_every=2", "train.eval_every=0", "run.tensorboard=true"])
        # A lower learning rate after the resume: the new line's steps 3 and 4 differ from the old ones.
        train(self.run_dir, sets=["train.steps=4", "train.eval_every=0", "train.lr=0.001", "run.tensorboard=true"],
              extra=["--resume", os.path.join(self.run_dir, "step-000002")])
        current = metrics(self.run_dir)
        self.assertEqual([r["step"] for r in current], [1, 2, 3, 4])
        self.assert_same_scalars(tensorboard_scalars(os.path.join(self.run_dir, "tensorboard")),
                                 expected_scalars(current))

        [aside] = glob.glob(os.path.join(self.run_dir, "abandoned", "*"))
        abandoned = metrics(aside)
        self.assertEqual([r["step"] for r in abandoned], [3, 4, 5, 6])
        self.assert_same_scalars(tensorboard_scalars(os.path.join(aside, "tensorboard")), expected_scalars(abandoned))
        self.assertNotEqual(current[2]["lr"], abandoned[0]["lr"])


if __name__ == "__main__":
    unittest.main()
