"""python/wandb_sidecar.py's logic against a stand-in `wandb` module that records every call
(test_wandb_offline.py runs the real package): each record logged once at its step, restarts
that continue the same W&B run, a resumed training line going into a new W&B run, --follow
during a training, the validation sets' losses as eval_loss/<name>, and the refusals (a metrics line
that is not JSON or not UTF-8 named by file and line)."""
import fcntl
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import unittest

from tracking_util import PYTHON_TOOLS, metrics, moe_metrics, train, train_command

SIDECAR = os.path.join(PYTHON_TOOLS, "wandb_sidecar.py")

FAKE_WANDB = '''
import json, os, time, uuid

def _write(entry):
    with open(os.environ["FAKE_WANDB_LOG"], "a") as f:
        f.write(json.dumps(entry) + "\\n")

class _Config(dict):
    def update(self, values, allow_val_change=False):
        dict.update(self, values)
        _write({"call": "config", "run": self.run_id, "keys": sorted(values)})

class _Run:
    def __init__(self, run_id, name):
        self.id, self.name, self.starting_step = run_id, name, 0
        self.config = _Config()
        self.config.run_id = run_id
    def log(self, data, step=None):
        _write({"call": "log", "run": self.id, "step": step, "data": data})
    def finish(self):
        _write({"call": "finish", "run": self.id})

def init(project=None, entity=None, name=None, id=None, resume=None, **kwargs):
    # Opening a W&B run takes seconds online: a test holds it until the file it names exists.
    hold = os.environ.get("FAKE_WANDB_INIT_WAITS_FOR")
    for _ in range(3000):
        if not hold or os.path.exists(hold):
            break
        time.sleep(0.01)
    run = _Run(id or uuid.uuid4().hex[:8], name)
    _write({"call": "init", "run": run.id, "requested_id": id, "name": name, "project": project, "resume": resume})
    return run
'''


def record(step, **values):
    r = {"step": step, "loss": 3.0 - 0.1 * step, "lm_loss": 2.9 - 0.1 * step, "lb_loss": 0.01, "z_loss": 0.002,
         "expert_load_max_over_mean_per_layer": [1.5, 1.25], "time": f"t{step}", "run_id": "r"}
    r.update(values)
    return r


def write_lines(path, records, mode="w", tail=""):
    with open(path, mode) as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.write(tail)


class WandbSidecar(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="moe-wandb-test-")
        self.run_dir = os.path.join(self.tmp.name, "run")
        os.makedirs(self.run_dir)
        fake_dir = os.path.join(self.tmp.name, "fake")
        os.makedirs(os.path.join(fake_dir, "wandb"))
        with open(os.path.join(fake_dir, "wandb", "__init__.py"), "w") as f:
            f.write(FAKE_WANDB)
        self.calls_path = os.path.join(self.tmp.name, "calls.jsonl")
        self.env = dict(os.environ, PYTHONPATH=fake_dir, FAKE_WANDB_LOG=self.calls_path)

    def tearDown(self):
        self.tmp.cleanup()

    def sidecar(self, *args, check=True):
        p = subprocess.run([sys.executable, SIDECAR, self.run_dir, *args], env=self.env, capture_output=True,
                           text=True, timeout=60)
        if check:
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        return p

    def calls(self, kind=None):
        if not os.path.exists(self.calls_path):
            return []
        with open(self.calls_path) as f:
            calls = [json.loads(line) for line in f]
        return [c for c in calls if kind is None or c["call"] == kind]

    def logged_steps(self, run=None):
        return [c["step"] for c in self.calls("log") if run is None or c["run"] == run]

    def assert_logged(self, records, run):
        """Every record logged to `run`, at its step, with exactly its scalars."""
        logs = [c for c in self.calls("log") if c["run"] == run]
        self.assertEqual([c["step"] for c in logs], [r["step"] for r in records])
        for c, r in zip(logs, records):
            want = moe_metrics.scalars(r)
            self.assertEqual(sorted(c["data"]), sorted(want), f"step {r['step']}")
            for tag, v in want.items():
                if math.isnan(v):
                    self.assertTrue(math.isnan(c["data"][tag]), f"{tag} at step {r['step']}")
                else:
                    self.assertEqual(c["data"][tag], v, f"{tag} at step {r['step']}")

    def test_each_record_is_logged_once_at_its_step_with_non_finite_strings_as_floats(self):
        records = [record(1), record(2, grad_norm="inf"), record(3, eval_loss="nan", skipped=True)]
        write_lines(os.path.join(self.run_dir, "metrics.jsonl"), records)
        out = self.sidecar("--project", "p", "--name", "tiny").stdout
        [init] = self.calls("init")
        self.assertEqual((init["project"], init["name"], init["requested_id"]), ("p", "tiny", None))
        self.assert_logged(records, init["run"])
        self.assertEqual(self.calls("log")[1]["data"]["grad_norm"], math.inf)
        self.assertEqual(self.calls("log")[2]["data"]["expert_load/layer_1"], 1.25)
        self.assertEqual(len(self.calls("finish")), 1)
        self.assertIn(f"logged 3 steps (up to step 3) to W&B run {init['run']}", out)

    def test_a_restarted_sidecar_continues_the_same_wandb_run_after_its_last_step(self):
        path = os.path.join(self.run_dir, "metrics.jsonl")
        write_lines(path, [record(1), record(2), record(3)])
        self.sidecar()
        first = self.calls("init")[0]["run"]
        # Two more records and one still being written (no newline yet).
        being_written = json.dumps(record(6))
        write_lines(path, [record(4), record(5)], mode="a", tail=being_written[:20])
        self.sidecar()
        second = self.calls("init")[1]
        self.assertEqual((second["requested_id"], second["resume"]), (first, "allow"))
        self.assertEqual(self.logged_steps(), [1, 2, 3, 4, 5])

        out = self.sidecar().stdout  # nothing new: no W&B run is even opened
        self.assertEqual(len(self.calls("init")), 2)
        self.assertIn("nothing new to log", out)

        with open(path, "a") as f:  # the line is finished
            f.write(being_written[20:] + "\n")
        self.sidecar()
        self.assertEqual(self.logged_steps(), [1, 2, 3, 4, 5, 6])
        self.assertEqual({c["run"] for c in self.calls("log")}, {first})

    def test_a_training_resumed_from_an_older_step_goes_into_a_new_wandb_run(self):
        train(self.run_dir, sets=["train.steps=6", "train.save_every=2", "train.eval_every=3"])
        self.sidecar()
        old_run = self.calls("init")[0]["run"]
        self.assert_logged(metrics(self.run_dir), old_run)

        train(self.run_dir, sets=["train.steps=4", "train.eval_every=0", "train.lr=0.001"],
              extra=["--resume", os.path.join(self.run_dir, "step-000002")])
        err = self.sidecar().stderr
        self.assertIn("no longer holds the step-6 record", err)
        new = self.calls("init")[1]
        self.assertIsNone(new["requested_id"])
        self.assertEqual(new["name"], "run-line2")
        self.assertNotEqual(new["run"], old_run)
        self.assert_logged(metrics(self.run_dir), new["run"])  # the whole current line: steps 1-4
        self.assertEqual(self.logged_steps(old_run), [1, 2, 3, 4, 5, 6])  # the old W&B run is left as it was

        self.sidecar()  # and the new line's W&B run continues from there on the next restart
        self.assertEqual(len(self.calls("log")), 10)

    def follow_a_training(self, steps, first_line):
        """Starts `--follow` before a training of `steps` steps into run_dir, checks its first line,
        runs the training, and waits for the sidecar to end on its own."""
        sidecar = self.start_following(0.02, first_line)
        training = subprocess.run(train_command(self.run_dir, [f"train.steps={steps}", "train.eval_every=0"]),
                                  capture_output=True, text=True, timeout=120)
        self.assertEqual(training.returncode, 0, training.stderr)
        out, err = sidecar.communicate(timeout=60)
        self.assertEqual(sidecar.returncode, 0, out + err)

    def test_follow_logs_while_the_training_writes_and_ends_when_the_job_ends(self):
        self.follow_a_training(40, "waiting for one")
        [init] = self.calls("init")
        self.assert_logged(metrics(self.run_dir), init["run"])
        self.assertEqual(self.logged_steps(), list(range(1, 41)))

    def test_follow_started_before_the_run_dir_exists_waits_for_it(self):
        os.rmdir(self.run_dir)
        self.follow_a_training(20, f"waiting for {self.run_dir} to be created")
        self.assertEqual(self.logged_steps(), list(range(1, 21)))

    def start_following(self, poll, first_line):
        sidecar = subprocess.Popen([sys.executable, SIDECAR, self.run_dir, "--follow", "--poll", str(poll)],
                                   env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(sidecar.kill)
        self.assertIn(first_line, sidecar.stdout.readline())
        return sidecar

    def job_starts(self):
        """A training job's lock, without the trainer: .lock with its content, under flock (as
        run_lock.cpp takes it). job_ends releases it as a job does: removes the file, then unlocks."""
        lock = os.path.join(self.run_dir, ".lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": "x"}).encode())
        return fd

    def job_ends(self, fd):
        os.unlink(os.path.join(self.run_dir, ".lock"))
        os.close(fd)

    def job_appends(self, records):
        """A whole job: holds the lock while it appends `records`."""
        fd = self.job_starts()
        try:
            write_lines(os.path.join(self.run_dir, "metrics.jsonl"), records, mode="a")
        finally:
            self.job_ends(fd)

    def test_a_job_seen_at_the_start_that_ends_while_the_first_records_are_logged_ends_the_sidecar(self):
        # Before, the first look at the lock only chose the start-up message: a job that ended
        # during the first poll (opening the W&B run) was never counted as seen, and the sidecar
        # waited for another for ever.
        write_lines(os.path.join(self.run_dir, "metrics.jsonl"), [record(1)])
        job = self.job_starts()
        opened = os.path.join(self.tmp.name, "open-the-wandb-run")
        self.env["FAKE_WANDB_INIT_WAITS_FOR"] = opened
        sidecar = self.start_following(0.02, "until the training job")
        self.job_ends(job)  # while the sidecar waits for W&B
        open(opened, "w").close()
        out, err = sidecar.communicate(timeout=30)
        self.assertEqual(sidecar.returncode, 0, out + err)
        self.assertEqual(self.logged_steps(), [1])

    def test_a_lock_file_naming_another_host_counts_as_held(self):
        # flock may not reach across hosts: only the job's host can tell its lock is stale.
        write_lines(os.path.join(self.run_dir, "metrics.jsonl"), [record(1)])
        lock = os.path.join(self.run_dir, ".lock")
        with open(lock, "w") as f:
            f.write('{"pid": 4242, "host": "another-host-of-the-cluster", "started": "20260101-000000"}\n')
        sidecar = self.start_following(0.02, "until the training job")
        with self.assertRaises(subprocess.TimeoutExpired):  # the job there may still be writing
            sidecar.wait(timeout=1)
        write_lines(os.path.join(self.run_dir, "metrics.jsonl"), [record(2)], mode="a")
        os.unlink(lock)  # that job ends
        out, err = sidecar.communicate(timeout=30)
        self.assertEqual(sidecar.returncode, 0, out + err)
        self.assertEqual(self.logged_steps(), [1, 2])

    def test_a_job_that_starts_and_ends_between_two_polls_is_seen_by_its_records(self):
        write_lines(os.path.join(self.run_dir, "metrics.jsonl"), [record(1)])
        sidecar = self.start_following(3, "waiting for one")  # it has read step 1 and sleeps
        self.job_appends([record(2), record(3)])  # the whole job, well inside one poll interval
        out, err = sidecar.communicate(timeout=30)
        self.assertEqual(sidecar.returncode, 0, out + err)
        self.assertEqual(self.logged_steps(), [1, 2, 3])

    def test_a_lock_file_left_by_a_killed_job_is_no_job_the_next_one_is_followed(self):
        write_lines(os.path.join(self.run_dir, "metrics.jsonl"), [record(1)])
        with open(os.path.join(self.run_dir, ".lock"), "w") as f:  # this host's job's, but nobody's flock
            f.write(json.dumps({"pid": 4242, "host": socket.gethostname(), "started": "20260101-000000"}))
        sidecar = self.start_following(0.02, "waiting for one")
        with self.assertRaises(subprocess.TimeoutExpired):  # it waits: no job has run since it started
            sidecar.wait(timeout=1)
        self.job_appends([record(2)])
        out, err = sidecar.communicate(timeout=30)
        self.assertEqual(sidecar.returncode, 0, out + err)
        self.assertEqual(self.logged_steps(), [1, 2])

    def test_a_poll_interval_that_is_not_a_positive_finite_number_is_refused_before_anything_is_logged(self):
        write_lines(os.path.join(self.run_dir, "metrics.jsonl"), [record(1)])
        for bad in ("-1", "0", "nan", "inf", "abc", "1e10"):  # 1e10: time.sleep's OverflowError after logging
            p = self.sidecar("--follow", "--poll", bad, check=False)
            self.assertEqual(p.returncode, 2, bad + ": " + p.stderr)
            self.assertIn("--poll", p.stderr)
            self.assertNotIn("Traceback", p.stderr)
        self.assertEqual(self.calls(), [])

    def test_an_unreadable_config_is_warned_of_and_the_records_still_logged(self):
        write_lines(os.path.join(self.run_dir, "metrics.jsonl"), [record(1)])
        with open(os.path.join(self.run_dir, "config.toml"), "w") as f:
            f.write("# moetrain: the resolved config of this run's latest start (every key)\n[model\n")
        p = self.sidecar()
        self.assertIn("warning: cannot read " + os.path.join(self.run_dir, "config.toml"), p.stderr)
        self.assertEqual([c["keys"] for c in self.calls("config")], [["run_dir"]])
        self.assertEqual(self.logged_steps(), [1])

    def test_an_empty_metrics_file_says_there_is_nothing_to_log(self):
        write_lines(os.path.join(self.run_dir, "metrics.jsonl"), [])
        p = self.sidecar()
        self.assertIn("holds no records yet", p.stdout)
        self.assertNotIn("None", p.stdout)

    def test_the_wandb_config_is_the_resolved_one_not_a_users_own_config_toml_in_the_run_dir(self):
        write_lines(os.path.join(self.run_dir, "metrics.jsonl"), [record(1)])
        with open(os.path.join(self.run_dir, "config.toml"), "w") as f:
            f.write("# my own settings\n[mine]\nx = 1\n")
        with open(os.path.join(self.run_dir, "config.resolved.toml"), "w") as f:
            f.write("# moetrain: the resolved config of this run's latest start (every key)\n[train]\nsteps = 5\n")
        self.sidecar()
        keys = [c["keys"] for c in self.calls("config")]
        self.assertEqual(keys, [["run_dir", "train"]])

    def test_the_wandb_config_is_config_toml_when_moetrain_wrote_it(self):
        write_lines(os.path.join(self.run_dir, "metrics.jsonl"), [record(1)])
        with open(os.path.join(self.run_dir, "config.toml"), "w") as f:
            f.write("# moetrain: the resolved config of this run's latest start (every key)\n"
                    "[model]\nhidden_size = 8\n")
        self.sidecar()
        self.assertEqual([c["keys"] for c in self.calls("config")], [["model", "run_dir"]])

    def test_a_second_sidecar_on_the_same_run_is_refused(self):
        write_lines(os.path.join(self.run_dir, "metrics.jsonl"), [record(1)])
        with open(os.path.join(self.run_dir, ".wandb_sidecar.lock"), "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            p = self.sidecar(check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("another wandb_sidecar.py is streaming", p.stderr)
        self.assertEqual(self.calls(), [])

    def test_a_run_dir_that_is_a_file_and_an_odd_state_file_are_one_error_line(self):
        # A file for RUN_DIR: a NotADirectoryError traceback before.
        a_file = os.path.join(self.run_dir, "config.toml")
        with open(a_file, "w") as f:
            f.write("")
        p = subprocess.run([sys.executable, SIDECAR, a_file], env=self.env, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertEqual(p.stderr, f"error: {a_file} is not a folder (a moetrain run.dir)\n")
        # A state file that is not UTF-8 (a traceback before), or whose last_step is no step (accepted
        # before, then reported as "the step-x record").
        write_lines(os.path.join(self.run_dir, "metrics.jsonl"), [record(1)])
        state = os.path.join(self.run_dir, "wandb_sidecar.json")
        for content in (b'{"line": 1, "x": "\xff"}', b'{"line": 1, "last_step": "x"}', b'{"line": true}'):
            with open(state, "wb") as f:
                f.write(content)
            p = self.sidecar(check=False)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertTrue(p.stderr.startswith("error: ") and p.stderr.count("\n") == 1, p.stderr)
            self.assertIn(state, p.stderr)
            self.assertIn("move it away", p.stderr)
        self.assertEqual(self.calls("log"), [])

    def test_a_run_without_metrics_is_an_error_naming_the_file(self):
        p = self.sidecar(check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(os.path.join(self.run_dir, "metrics.jsonl"), p.stderr)
        self.assertIn("--follow", p.stderr)

    def test_validation_set_losses_are_logged_as_eval_loss_slash_name(self):
        records = [record(1), record(2, eval_loss=2.5, eval_sets={"val": 2.25, "code": "inf"}),
                   record(3, eval_sets={"val": "nan", "code": None})]
        write_lines(os.path.join(self.run_dir, "metrics.jsonl"), records)
        self.sidecar()
        [init] = self.calls("init")
        self.assert_logged(records, init["run"])
        logs = self.calls("log")
        self.assertEqual((logs[1]["data"]["eval_loss/val"], logs[1]["data"]["eval_loss/code"]), (2.25, math.inf))
        self.assertTrue(math.isnan(logs[2]["data"]["eval_loss/val"]))
        self.assertNotIn("eval_loss/code", logs[2]["data"])  # null, as for any other scalar
        self.assertNotIn("eval_sets", logs[1]["data"])

    def test_a_line_that_is_not_utf8_is_an_error_naming_the_file_and_line(self):
        path = os.path.join(self.run_dir, "metrics.jsonl")
        write_lines(path, [record(1), record(2)])
        with open(path, "ab") as f:
            f.write(b'{"step": 3, "note": "caf\xe9"}\n')
        p = self.sidecar(check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertEqual(p.stderr, f"error: {path}:3: not UTF-8 text: byte 0xe9 at byte 25 of the line "
                                   f"(invalid continuation byte)\n")

    def test_a_malformed_line_is_an_error_naming_the_file_and_line(self):
        path = os.path.join(self.run_dir, "metrics.jsonl")
        write_lines(path, [record(1)], tail="{not json\n")
        p = self.sidecar(check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(f"{path}:2", p.stderr)


if __name__ == "__main__":
    unittest.main()
