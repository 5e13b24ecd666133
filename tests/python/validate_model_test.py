"""bench/validate_model.py record: `run`'s bench reports become the cases' recorded numbers.

The reports named after a case replace its measured step time and GPU high-water (rounded as the
file keeps them) and drop its stale mark; every other case, the calibration cases (unless
--calibration) and the file's other keys stay as they were, and the file keeps its layout; a folder
with no report of any case, a missing folder, a corrupt report and a CPU or wrong-size run's
report are refused with the file named, changing nothing and leaving no temporary file.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SOURCE_DIR = os.environ.get("MOE_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(SOURCE_DIR, "bench", "validate_model.py")


class CasesFileTest(unittest.TestCase):
    """A missing, corrupt or wrongly shaped --cases file, and a --measured-dir that does not exist, are
    one error naming the path and a non-zero exit, for every subcommand (no traceback; `table` used
    to show the recorded numbers in place of a mistyped folder's)."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def script(self, *args):
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)

    def test_bad_cases_files_and_a_missing_measured_dir_are_named(self):
        path = os.path.join(self.tmp.name, "cases.json")
        for text, needle in ((None, "No such file"), ("{", "is not valid JSON"), ('{"x": 1}', 'a "cases" list'),
                             ('{"cases": [{"config": "c"}]}', 'each with a "name"')):
            if text is not None:
                with open(path, "w") as f:
                    f.write(text)
            for sub in (["table"], ["run", "--out", self.tmp.name], ["record", "--measured-dir", self.tmp.name,
                                                                     "--source", "s"]):
                r = self.script("--cases", path, *sub)
                self.assertEqual(r.returncode, 1, f"{text} {sub}: {r.stderr}")
                self.assertIn("--cases " + path, r.stderr)
                self.assertIn(needle, r.stderr)
                self.assertNotIn("Traceback", r.stderr)
        missing = os.path.join(self.tmp.name, "typo")
        r = self.script("table", "--measured-dir", missing)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn(f"--measured-dir {missing}: no such folder", r.stderr)


class RecordTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.cases = os.path.join(self.dir, "cases.json")
        self.doc = {"note": "kept", "cases": [
            {"name": "top-4 sweep N=16", "config": "configs/bench-olmoe-4l.toml", "set": [], "gpus": 1,
             "measured": {"step_s": 0.126, "gpu_high_water_gib": 29.7, "source": "old", "stale": "old kernel"},
             "role": "validation"},
            {"name": "top-4 sweep N=8", "config": "configs/bench-olmoe-4l.toml", "set": [], "gpus": 1,
             "measured": {"step_s": 0.12214, "gpu_high_water_gib": 26.3, "source": "fit"}, "role": "calibration"},
            {"name": "fig4 N=8", "config": "configs/fig4.toml", "set": [], "gpus": 1,
             "measured": {"step_s": 3.9477, "gpu_high_water_gib": 108.61, "source": "kept"}, "role": "validation"}]}
        with open(self.cases, "w") as f:
            json.dump(self.doc, f, indent=2)
            f.write("\n")
        self.measured = os.path.join(self.dir, "measured")
        os.makedirs(self.measured)

    def tearDown(self):
        self.tmp.cleanup()

    def report(self, name, **fields):
        with open(os.path.join(self.measured, name + ".json"), "w") as f:
            json.dump(fields, f)

    def record(self, *extra, measured=None):
        return subprocess.run([sys.executable, SCRIPT, "--cases", self.cases, "record", "--measured-dir",
                               measured or self.measured, "--source", "RESULTS.md test — call 2", *extra],
                              capture_output=True, text=True)

    def cases_text(self):
        with open(self.cases, encoding="utf-8") as f:
            return f.read()

    def test_a_report_replaces_the_measured_numbers_and_the_stale_mark(self):
        self.report("top-4-sweep-n-16", step_s=0.1234567, gpu_peak_bytes=31.8234 * 2**30, world_size=1)
        self.report("top-4-sweep-n-8", step_s=0.1166, gpu_peak_bytes=26.3 * 2**30, world_size=1)
        r = self.record()
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("left as recorded (calibration cases", r.stdout)
        text = self.cases_text()
        doc = json.loads(text)
        self.assertEqual(text, json.dumps(doc, indent=2, ensure_ascii=False) + "\n")  # the file's layout
        self.assertEqual(doc["note"], "kept")
        self.assertEqual(doc["cases"][0]["measured"],
                         {"step_s": 0.12346, "gpu_high_water_gib": 31.82, "source": "RESULTS.md test — call 2"})
        self.assertEqual(doc["cases"][1], self.doc["cases"][1])  # calibration: kept
        self.assertEqual(doc["cases"][2], self.doc["cases"][2])
        self.assertEqual(sorted(os.listdir(self.dir)), ["cases.json", "measured"])  # no temporary file left
        r = self.record("--calibration")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(self.cases_text())["cases"][1]["measured"]["step_s"], 0.1166)

    def assert_refused(self, needle, measured=None):
        before = self.cases_text()
        r = self.record(measured=measured)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(needle, r.stderr)
        self.assertEqual(self.cases_text(), before)
        self.assertEqual(sorted(os.listdir(self.dir)), ["cases.json", "measured"])

    def test_a_folder_without_a_case_report_is_refused(self):
        self.report("other", step_s=1.0, gpu_peak_bytes=1, world_size=1)
        self.assert_refused("no report in")

    def test_a_missing_folder_is_refused(self):
        self.assert_refused("no such folder", measured=os.path.join(self.dir, "absent"))

    def test_a_corrupt_report_is_refused_naming_it(self):
        with open(os.path.join(self.measured, "fig4-n-8.json"), "w") as f:
            f.write('{"step_s": 3.9')
        self.assert_refused("fig4-n-8.json: not a readable bench --json report")

    def test_a_cpu_run_or_another_size_is_refused(self):
        self.report("fig4-n-8", step_s=3.9, gpu_peak_bytes=0, world_size=1)
        self.assert_refused("gpu_peak_bytes is 0: not a GPU run's report")
        self.report("fig4-n-8", step_s=3.9, gpu_peak_bytes=2**30, world_size=2)
        self.assert_refused("ran on 2 rank(s), case 'fig4 N=8' is for 1 GPU(s)")


if __name__ == "__main__":
    unittest.main()
