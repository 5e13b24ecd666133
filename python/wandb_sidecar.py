#!/usr/bin/env python3
"""Stream a moetrain run's metrics into Weights & Biases, beside the training (moetrain itself
has no W&B client).

  python3 python/wandb_sidecar.py RUN_DIR [--project P] [--entity E] [--name N] [--follow] [--poll S]

Logs every record of RUN_DIR/metrics.jsonl at its step, with the tags of moetrain's TensorBoard
events (loss, lm_loss, lb_loss, z_loss, grad_norm, lr, tokens_per_s, mfu, step_time_s,
dropped_fraction, expert_load_max_over_mean, expert_load/layer_<i>, eval_loss, eval_loss/<name> of
each [[eval.sets]], ...; "nan"/"inf" strings become non-finite floats), and the run's resolved
config (RUN_DIR/config.toml, or config.resolved.toml where config.toml is the user's own) as the
W&B run's config.

--follow keeps reading as the training appends records and ends after the last one, once the
job holding RUN_DIR (its .lock) has ended; started before the job, it waits for it. A job that
starts and ends between two polls is seen by the records it wrote (one that wrote none, failing at
start-up, is not: the sidecar waits on). A .lock left by a job killed on this host is no job; one
naming another host counts as held (its flock may not reach this host), so a sidecar following a
job killed on another host waits until the next job there ends, or Ctrl-C. Ctrl-C or SIGTERM ends
it cleanly at any time.

Restarts log no step twice: RUN_DIR/wandb_sidecar.json keeps the W&B run id, the last step
logged and a digest of that step's record, and a restarted sidecar continues the same W&B run
after that step. When metrics.jsonl no longer holds that record (a resume from an older step set
the rest of the line aside under RUN_DIR/abandoned/, or --overwrite started the run afresh), W&B
cannot take back the steps it has: the current line goes into a new W&B run named <name>-line<k>,
and the earlier W&B run keeps the abandoned line as it was.

Without network: WANDB_MODE=offline (the run is written under WANDB_DIR, default ./wandb), then
`wandb sync` that folder.
"""
import argparse
import fcntl
import hashlib
import json
import math
import os
import signal
import socket
import sys
import time
import tomllib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_metrics  # noqa: E402  (next to this script)

STATE_FILE = "wandb_sidecar.json"
LOCK_FILE = ".wandb_sidecar.lock"
CONFIG_HEADER = "# moetrain: the resolved config"  # the first line of the configs moetrain writes (run_dir.h)


def record_digest(record):
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


class MetricsFollower:
    """The whole records appended to a metrics file since the last poll. A file replaced since
    (a set-aside rewrites metrics.jsonl under a new inode) is read again from its start."""

    def __init__(self, path):
        self.path = path
        self.inode = None
        self.offset = 0
        self.lines_read = 0

    def poll(self):
        """(replaced, records): replaced is True when these records start a new read of the file."""
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return False, []
        with f:
            st = os.fstat(f.fileno())
            replaced = self.inode is not None and (st.st_ino != self.inode or st.st_size < self.offset)
            if replaced or self.inode is None:
                self.offset, self.lines_read = 0, 0
            self.inode = st.st_ino
            f.seek(self.offset)
            data = f.read()
        # A last line still being written waits for its newline.
        text = moe_metrics.whole_lines_text(data, self.path, first_line=self.lines_read + 1)
        records = moe_metrics.parse_lines(text, self.path, first_line=self.lines_read + 1)
        self.offset += data.rfind(b"\n") + 1
        self.lines_read += text.count("\n")
        return replaced, records


class Sidecar:
    def __init__(self, run_dir, args, wandb):
        self.run_dir = run_dir
        self.args = args
        self.wandb = wandb
        self.state_path = os.path.join(run_dir, STATE_FILE)
        self.state = self._load_state()
        self.follower = MetricsFollower(os.path.join(run_dir, "metrics.jsonl"))
        self.run = None
        self.checked = False  # whether the file's records were matched against the state yet
        self.skip_through = -1  # steps up to here are in the W&B run already

    def _load_state(self):
        try:
            with open(self.state_path) as f:
                state = json.load(f)
        except FileNotFoundError:
            return {"line": 1}
        except (OSError, ValueError, RecursionError) as e:  # ValueError: bad JSON or not UTF-8
            why = "nested too deeply" if isinstance(e, RecursionError) else e
            sys.exit(f"error: cannot read {self.state_path} ({why}); move it away to start a new W&B run")
        last = state.get("last_step") if isinstance(state, dict) else None
        if (not isinstance(state, dict) or type(state.get("line")) is not int or
                (last is not None and type(last) is not int)):
            sys.exit(f"error: {self.state_path} is not a wandb_sidecar.py state; move it away to start a new W&B run")
        return state

    def _save_state(self):
        tmp = f"{self.state_path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.state, f, indent=1)
            f.write("\n")
        os.replace(tmp, self.state_path)

    def _config(self):
        """The run's resolved config: config.toml, or config.resolved.toml where config.toml is the user's
        own (moetrain never overwrites that; its own files begin with CONFIG_HEADER)."""
        path = os.path.join(self.run_dir, "config.toml")
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                if not f.readline().startswith(CONFIG_HEADER):
                    path = os.path.join(self.run_dir, "config.resolved.toml")
        except OSError:
            pass
        try:
            with open(path, "rb") as f:
                config = tomllib.load(f)
        except FileNotFoundError:
            config = {}
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            print(f"wandb_sidecar: warning: cannot read {path} ({e}); the W&B run's config holds run_dir only",
                  file=sys.stderr, flush=True)
            config = {}
        config["run_dir"] = os.path.abspath(self.run_dir)
        return config

    def _match_state(self, records):
        """Where the file's records continue what the W&B run holds, or start a new line."""
        last = self.state.get("last_step")
        if last is None:
            return
        at_last = [r for r in records if r["step"] == last]
        if at_last and record_digest(at_last[-1]) == self.state.get("last_digest"):
            self.skip_through = last
            return
        print(f"wandb_sidecar: {self.follower.path} no longer holds the step-{last} record logged to W&B run "
              f"{self.state.get('wandb_run_id')} (the run was resumed from an older step or started afresh); "
              f"logging the current line into a new W&B run", file=sys.stderr)
        self._finish_run()
        self.state = {"line": self.state["line"] + 1}
        self.skip_through = -1
        self._save_state()

    def _open_run(self):
        name = self.args.name or os.path.basename(os.path.abspath(self.run_dir))
        if self.state["line"] > 1:
            name += f"-line{self.state['line']}"
        self.run = self.wandb.init(project=self.args.project, entity=self.args.entity, name=name,
                                   id=self.state.get("wandb_run_id"), resume="allow")
        self.run.config.update(self._config(), allow_val_change=True)
        self.state["wandb_run_id"] = self.run.id
        # A resumed online run knows its last step even if this process died before saving it.
        self.skip_through = max(self.skip_through, getattr(self.run, "starting_step", 0) - 1)
        self._save_state()

    def _finish_run(self):
        if self.run is not None:
            self.run.finish()
            self.run = None

    def poll(self):
        """Logs what metrics.jsonl gained since the last poll; returns the number of steps logged."""
        replaced, records = self.follower.poll()
        if replaced:
            self.checked = False
        if not records:
            return 0
        if not self.checked:
            self._match_state(records)
            self.checked = True
        logged = 0
        for record in records:
            step = record["step"]
            if step <= self.skip_through:
                continue
            if self.run is None:
                self._open_run()
            self.run.log(moe_metrics.scalars(record), step=step)
            self.skip_through = step
            self.state["last_step"] = step
            self.state["last_digest"] = record_digest(record)
            logged += 1
        if logged:
            self._save_state()
        return logged

    def close(self):
        self._finish_run()


def take_lock(run_dir):
    """One sidecar per run directory: two would log the same steps twice."""
    path = os.path.join(run_dir, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(f"error: another wandb_sidecar.py is streaming {run_dir} ({path} is locked)")
    return fd


def job_holds(lock_path):
    """Whether a training job holds RUN_DIR/.lock now. The kernel's flock is the lock: a file left by
    a job that was killed on this host is not held. Asking for a shared lock for an instant tells
    them apart (a job starting in that instant asks again, run_lock.cpp). A file naming another host
    counts as held: a flock may not reach across hosts (Lustre's localflock, NFS's local_lock), so
    only the job's own host can tell a killed job's file."""
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError as e:
        sys.exit(f"error: cannot read {lock_path} to see whether the training job runs: {e.strerror}")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        content = os.read(fd, 4096)  # {"pid": ..., "host": ..., "started": ...} (run_lock.cpp)
    finally:
        os.close(fd)  # releases the shared lock, if taken
    try:
        host = json.loads(content).get("host")
    except (ValueError, AttributeError):
        return False  # empty (a job between creating and locking it) or not moetrain's
    return isinstance(host, str) and host != socket.gethostname()


def file_state(path):
    """What changes when a job writes `path` (None when there is no file)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # also a RUN_DIR that is a file: said by the caller
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


MAX_POLL_S = 86400.0  # a day; time.sleep fails mid-run past the platform's time_t (1e10 did)


def poll_seconds(text):
    """--poll: a finite number of seconds above zero (time.sleep refuses a negative one, mid-run)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds")
    if not math.isfinite(value) or value <= 0 or value > MAX_POLL_S:
        raise argparse.ArgumentTypeError(f"{text} must be a number of seconds above 0 and at most {MAX_POLL_S:g}")
    return value


def main(argv=None, wandb=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", metavar="RUN_DIR", help="moetrain run folder (run.dir) holding metrics.jsonl")
    ap.add_argument("--project", default="moetrain", help="W&B project (default: moetrain)")
    ap.add_argument("--entity", default=None, help="W&B entity (default: yours)")
    ap.add_argument("--name", default=None, help="W&B run name (default: the run folder's name)")
    ap.add_argument("--follow", action="store_true", help="keep logging while the training runs")
    ap.add_argument("--poll", type=poll_seconds, default=5.0, help="seconds between reads with --follow (default 5)")
    args = ap.parse_args(argv)
    metrics = os.path.join(args.run_dir, "metrics.jsonl")
    job_lock = os.path.join(args.run_dir, ".lock")
    # Before anything slow (importing wandb takes seconds, opening a W&B run more): a job holding the
    # run's lock now, or metrics.jsonl changing after this, means a job ran since the sidecar
    # started, even one that began and ended between two polls (only a job holding the lock writes
    # metrics.jsonl).
    start_state = file_state(metrics)
    seen_job = args.follow and job_holds(job_lock)
    if not args.follow and not os.path.isdir(args.run_dir):
        sys.exit(f"error: {args.run_dir} is not a folder (a moetrain run.dir)")
    if not args.follow and not os.path.exists(metrics):
        sys.exit(f"error: {metrics} does not exist (no step logged yet?); use --follow to wait for it")
    if wandb is None:
        try:
            import wandb
        except ImportError:
            sys.exit("error: wandb_sidecar.py needs the wandb package: pip install wandb")
    # From here a stop signal ends the sidecar at its next poll, after what it read was logged.
    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.append(True))
    if args.follow and not os.path.exists(args.run_dir):
        # Started before the job: moetrain creates run.dir when the training starts.
        print(f"wandb_sidecar: waiting for {args.run_dir} to be created by the training job; Ctrl-C stops",
              flush=True)
        while not os.path.exists(args.run_dir) and not stop:
            time.sleep(args.poll)
        if stop:
            return
    if not os.path.isdir(args.run_dir):
        sys.exit(f"error: {args.run_dir} is not a folder (a moetrain run.dir)")
    lock_fd = take_lock(args.run_dir)
    sidecar = Sidecar(args.run_dir, args, wandb)
    if args.follow:
        seen_job = seen_job or job_holds(job_lock)
        held = "" if seen_job else " (no job holds it yet: waiting for one)"
        print(f"wandb_sidecar: following {metrics} until the training job in {args.run_dir} ends{held}; "
              f"Ctrl-C stops", flush=True)
    total = 0
    try:
        while True:
            total += sidecar.poll()
            if not args.follow or stop:
                break
            # Asked after the poll: a job that does not hold the lock now has written all it will.
            if job_holds(job_lock):
                seen_job = True
            elif seen_job or file_state(metrics) != start_state:
                # The job ended (seen running, or seen only by what it wrote): take the rest, then stop.
                total += sidecar.poll()
                break
            time.sleep(args.poll)
    except moe_metrics.MetricsError as e:
        sys.exit(f"error: {e}")
    finally:
        sidecar.close()
        os.close(lock_fd)
    state = sidecar.state
    if total:
        print(f"wandb_sidecar: logged {total} steps (up to step {state['last_step']}) to W&B run "
              f"{state['wandb_run_id']}")
    elif state.get("wandb_run_id") is None:
        print(f"wandb_sidecar: nothing to log: {metrics} holds no records yet")
    else:
        print(f"wandb_sidecar: nothing new to log (W&B run {state['wandb_run_id']} has up to step "
              f"{state.get('last_step')})")


if __name__ == "__main__":
    main()
