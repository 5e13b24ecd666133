"""python/hf_check.py refuses, before anything is written or imported, a --workdir that is not empty
(it wrote its corpus.txt over a user's file there), a --workdir that is a file, and a --moetrain that
is not an executable, each in one error line; without torch it says so in one line (a traceback
before). The round trip itself needs torch and transformers (the H200 machine's image)."""
import os
import subprocess
import sys
import tempfile
import unittest

from moe_test_util import MOETRAIN, SOURCE_DIR

HF_CHECK = os.path.join(SOURCE_DIR, "python", "hf_check.py")


class HfCheckArguments(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="moe-hf-check-")

    def tearDown(self):
        self.tmp.cleanup()

    def run_tool(self, *args):
        return subprocess.run([sys.executable, HF_CHECK, *args], capture_output=True, text=True, timeout=60)

    def assert_one_line_error(self, r, *parts):
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertTrue(r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr)
        for part in parts:
            self.assertIn(part, r.stderr)

    def test_a_workdir_holding_files_is_refused_and_left_as_it_was(self):
        work = os.path.join(self.tmp.name, "mine")
        os.mkdir(work)
        with open(os.path.join(work, "corpus.txt"), "w") as f:
            f.write("the user's corpus\n")
        self.assert_one_line_error(self.run_tool("--moetrain", MOETRAIN, "--workdir", work),
                                   f"--workdir {work} is not empty", "new or empty folder")
        self.assertEqual(os.listdir(work), ["corpus.txt"])
        with open(os.path.join(work, "corpus.txt")) as f:
            self.assertEqual(f.read(), "the user's corpus\n")
        a_file = os.path.join(work, "corpus.txt")
        self.assert_one_line_error(self.run_tool("--moetrain", MOETRAIN, "--workdir", a_file), "is not a folder")

    def test_a_moetrain_that_is_not_an_executable_is_refused(self):
        missing = os.path.join(self.tmp.name, "no-moetrain")
        self.assert_one_line_error(self.run_tool("--moetrain", missing, "--workdir", os.path.join(self.tmp.name, "w")),
                                   f"--moetrain {missing} is not an executable file")
        self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "w")))

    def test_without_torch_one_line_says_what_is_needed(self):
        try:
            import torch  # noqa: F401
            self.skipTest("torch is installed: the round trip would run")
        except ImportError:
            pass
        work = os.path.join(self.tmp.name, "w")
        self.assert_one_line_error(self.run_tool("--moetrain", MOETRAIN, "--workdir", work),
                                   "needs numpy, torch and transformers")
        self.assertFalse(os.path.exists(work))


if __name__ == "__main__":
    unittest.main()
