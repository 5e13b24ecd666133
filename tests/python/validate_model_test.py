"""bench/validate_model.py record: `run`'s bench reports become the cases' recorded numbers.

The reports named after a case replace its measured step time and GPU high-water (rounded as the
file keeps them) and drop its stale mark; every other case, and the file's other keys, stay as
they were; a folder with no report of any case is refused.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SOURCE_DIR = os.environ.get("MOE_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(SOURCE_DIR, "bench", "validate_model.py")


class RecordTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.cases = os.path.join(self.dir, "cases.json")
        self.doc = {"note": "kept", "cases": [
            {"name": "top-4 sweep N=16", "config": "configs/bench-olmoe-4l.toml", "set": [], "gpus": 1,
             "measured": {"step_s": 0.126, "gpu_high_water_gib": 29.7, "source": "old", "stale": "old kernel"},
             "role": "validation"},
            {"name": "fig4 N=8", "config": "configs/fig4.toml", "set": [], "gpus": 1,
             "measured": {"step_s": 3.9477, "gpu_high_water_gib": 108.61, "source": "kept"}, "role": "validation"}]}
        with open(self.cases, "w") as f:
            json.dump(self.doc, f, indent=2)
        self.measured = os.path.join(self.dir, "measured")
        os.makedirs(self.measured)

    def tearDown(self):
        self.tmp.cleanup()

    def record(self, *extra):
        return subprocess.run([sys.executable, SCRIPT, "--cases", self.cases, "record", "--measured-dir", self.measured,
                               "--source", "RESULTS.md test", *extra], capture_output=True, text=True)

    def test_a_report_replaces_the_measured_numbers_and_the_stale_mark(self):
        with open(os.path.join(self.measured, "top-4-sweep-n-16.json"), "w") as f:
            json.dump({"step_s": 0.1234567, "gpu_peak_bytes": 31.8 * 2**30}, f)
        r = self.record()
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(self.cases) as f:
            doc = json.load(f)
        self.assertEqual(doc["note"], "kept")
        self.assertEqual(doc["cases"][0]["measured"],
                         {"step_s": 0.12346, "gpu_high_water_gib": 31.8, "source": "RESULTS.md test"})
        self.assertEqual(doc["cases"][1], self.doc["cases"][1])
        self.assertEqual(sorted(os.listdir(self.dir)), ["cases.json", "measured"])  # no temporary file left

    def test_a_folder_without_a_case_report_is_refused_and_changes_nothing(self):
        with open(os.path.join(self.measured, "other.json"), "w") as f:
            json.dump({"step_s": 1.0, "gpu_peak_bytes": 1}, f)
        with open(self.cases) as f:
            before = f.read()
        r = self.record()
        self.assertEqual(r.returncode, 1)
        self.assertIn("no report in", r.stderr)
        with open(self.cases) as f:
            self.assertEqual(f.read(), before)


if __name__ == "__main__":
    unittest.main()
