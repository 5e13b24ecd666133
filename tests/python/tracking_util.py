"""Shared by the tracking tests: the built moetrain (MOETRAIN, set by CTest), tiny CPU runs, the
python/ tools, and skipping (exit 77, what CTest's SKIP_RETURN_CODE expects) when a package that
scripts/setup.sh installs into .deps/python-tracking cannot be imported."""
import importlib
import os
import subprocess
import sys

SKIP = 77
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PYTHON_TOOLS = os.path.join(REPO, "python")
sys.path.insert(0, PYTHON_TOOLS)

import moe_metrics  # noqa: E402


def require(module, needed_for):
    """Imports `module`, or prints why the test is skipped and exits 77."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        print(f"SKIPPED: {needed_for} needs the Python package '{module.split('.')[0]}' ({e}); "
              f"scripts/setup.sh installs it into .deps/python-tracking (python/requirements-tracking.txt)")
        sys.exit(SKIP)


def moetrain_binary():
    return os.environ.get("MOETRAIN", os.path.join(REPO, "build", "moetrain"))


# The overrides that make a run take about a second on one core (as tests/cli's tiny runs).
TINY = ["model.hidden_size=16", "model.intermediate_size=32", "train.seq_len=16", "train.micro_batch_size=2",
        "train.global_batch_size=2", "train.warmup_steps=1", "data.synthetic_tokens=20000",
        "data.synthetic_eval_tokens=2000", "train.eval_batches=2", "train.log_every=1", "run.device=cpu"]


def train_command(run_dir, sets=(), extra=()):
    args = [moetrain_binary(), "train", "--set", f"run.dir={run_dir}"]
    for s in TINY + list(sets):
        args += ["--set", s]
    return args + list(extra)


def train(run_dir, sets=(), extra=()):
    """Runs a tiny training into run_dir; raises with its output when it fails."""
    p = subprocess.run(train_command(run_dir, sets, extra), capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise AssertionError(f"moetrain train failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def metrics(path):
    """The records of a metrics.jsonl file (or of <path>/metrics.jsonl for a folder)."""
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    return moe_metrics.read_records(path)
