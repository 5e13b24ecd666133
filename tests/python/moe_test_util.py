"""Shared helpers of the Python tests (CTest runs them with MOE_BINARY_DIR, MOE_SOURCE_DIR, MPIEXEC and
PYTHONPATH=<source>/.deps/python:<source>/python set; see CMakeLists.txt)."""
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE_DIR = os.environ.get("MOE_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BINARY_DIR = os.environ.get("MOE_BINARY_DIR", os.path.join(SOURCE_DIR, "build-cpu"))
MOETRAIN = os.path.join(BINARY_DIR, "moetrain")
MPIEXEC = os.environ.get("MPIEXEC", "mpirun")
MPI_FLAGS = ["--oversubscribe", "--allow-run-as-root", "--mca", "btl_vader_single_copy_mechanism", "none"]

# The overrides that make a run tiny and fast on the CPU (as tests/cli/cli_test_util.h's tiny_sets).
TINY_SETS = ["model.hidden_size=16", "model.intermediate_size=32", "train.seq_len=16", "train.micro_batch_size=2",
             "train.global_batch_size=4", "train.warmup_steps=1", "data.synthetic_tokens=20000",
             "data.synthetic_eval_tokens=2000", "train.eval_batches=2", "run.device=cpu"]


def run(cmd, env=None, check=True, file_size_limit=None):
    """Runs cmd and returns the CompletedProcess (text output); with check, a failure fails the test.

    file_size_limit: RLIMIT_FSIZE of the command, in bytes, a full disk that needs no privileges (Python
    and moetrain ignore SIGXFSZ, so a write past it fails with EFBIG)."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    limit = None if file_size_limit is None else \
        (lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, resource.RLIM_INFINITY)))
    r = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=300, preexec_fn=limit)
    if check and r.returncode != 0:
        raise AssertionError(f"command failed ({r.returncode}): {' '.join(cmd)}\nstdout:\n{r.stdout}\n"
                             f"stderr:\n{r.stderr}")
    return r


def moetrain_train(run_dir, sets=(), ranks=1, extra=()):
    """`moetrain train` of the tiny model into run_dir, under mpirun when ranks > 1."""
    cmd = [MOETRAIN, "train", "--set", f"run.dir={run_dir}"]
    for s in list(TINY_SETS) + list(sets):
        cmd += ["--set", s]
    cmd += list(extra)
    if ranks > 1:
        cmd = [MPIEXEC, "-np", str(ranks)] + MPI_FLAGS + cmd
    return run(cmd)


def python_tool(name, *args, check=True, file_size_limit=None):
    """Runs python/<name> with this interpreter."""
    return run([sys.executable, os.path.join(SOURCE_DIR, "python", name)] + [str(a) for a in args], check=check,
               file_size_limit=file_size_limit)


class TempDirTest(unittest.TestCase):
    """A fresh temporary folder per test, removed afterwards."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="moe-py-test-")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def path(self, *parts):
        return os.path.join(self.tmp, *parts)

    def assert_one_line_error(self, r, *needles, code=1):
        self.assertEqual(r.returncode, code, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}")
        self.assertTrue(r.stderr.startswith("error: "), r.stderr)
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
        for n in needles:
            self.assertIn(n, r.stderr)
