#!/usr/bin/env python3
"""The performance model against measured runs: predicted (`moetrain plan --json`) vs measured
step time and GPU high-water for the cases of bench/model_cases.json.

  validate_model.py run --out DIR [--np N] [--steps S]    # on the GPU machine: `moetrain bench --json`
                                                         # for every case that fits on N GPUs
  validate_model.py record --measured-dir DIR --source TEXT [--calibration]
                                                         # those reports become the cases' recorded
                                                         # numbers (in place; the stale mark goes;
                                                         # calibration cases only with --calibration)
  validate_model.py table [--measured-dir DIR] [--hardware H] [--markdown]
                                                         # the table; measured numbers from DIR's bench
                                                         # reports where present, else the case's
                                                         # recorded numbers (bench/RESULTS.md)

Bars (the issue's): one GPU, step time within 10% and memory within 3%; several GPUs, step time
within 15%. Exit status 1 when a case with role "validation" misses its bar; a case whose recorded
measurement is marked `stale` (taken with kernels since changed) is shown, its step time not held
to the bar (its memory still is).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def slug(name):
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def default_moetrain():
    for path in (".devrun/bin/moetrain", "build/moetrain"):
        if os.path.exists(os.path.join(ROOT, path)):
            return os.path.join(ROOT, path)
    return "moetrain"


def set_flags(case):
    flags = []
    for s in case["set"]:
        flags += ["--set", s]
    return flags


def predict(moetrain, case, hardware):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "plan.json")
        cmd = [moetrain, "plan", "--config", os.path.join(ROOT, case["config"]), *set_flags(case), "--gpus",
               str(case["gpus"]), "--nodes", str(case.get("nodes", 1)), "--json", out]
        if hardware:
            cmd += ["--hardware", hardware]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"error: {' '.join(cmd)} failed:\n{r.stderr}")
        with open(out) as f:
            return json.load(f)["candidates"][0]


def measured(case, measured_dir):
    m = dict(case["measured"])
    path = os.path.join(measured_dir, slug(case["name"]) + ".json") if measured_dir else None
    if path and os.path.exists(path):
        step, gib = report_numbers(path, case)
        m = {"step_s": step, "gpu_high_water_gib": gib, "source": os.path.relpath(path)}
    return m


def pct(pred, meas):
    return None if meas in (None, 0) or pred is None else 100.0 * (pred - meas) / meas


def load_cases(path):
    """The cases file as a dict with a "cases" list, or one error naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise SystemExit(f"error: --cases {path}: {e.strerror}")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SystemExit(f"error: --cases {path} is not valid JSON ({e})")
    cases = doc.get("cases") if isinstance(doc, dict) else None
    if not isinstance(cases, list) or not all(isinstance(c, dict) and "name" in c for c in cases):
        raise SystemExit(f"error: --cases {path}: expected an object with a \"cases\" list of cases, each with a "
                         "\"name\" (as bench/model_cases.json)")
    return doc


def table(args):
    if args.measured_dir and not os.path.isdir(args.measured_dir):
        raise SystemExit(f"error: --measured-dir {args.measured_dir}: no such folder")
    cases = load_cases(args.cases)["cases"]
    rows, failed, stale = [], [], []
    for case in cases:
        p = predict(args.moetrain, case, args.hardware)
        m = measured(case, args.measured_dir)
        t_err = pct(p.get("step_s"), m.get("step_s"))
        m_err = pct(p.get("gpu_memory_gib"), m.get("gpu_high_water_gib"))
        t_bar = 10.0 if case["gpus"] == 1 else 15.0
        m_bar = 3.0 if case["gpus"] == 1 else None
        memory_ok = m_bar is None or m_err is None or abs(m_err) <= m_bar
        ok = t_err is not None and abs(t_err) <= t_bar and memory_ok
        if m.get("stale"):
            # Measured with kernels since changed: its step is shown, not held to the bar; its memory
            # (which those kernels do not change) still is.
            stale.append(case["name"])
            if case.get("role") == "validation" and not memory_ok:
                failed.append(case["name"])
        elif case.get("role") == "validation" and not ok:
            failed.append(case["name"])
        rows.append((case, p, m, t_err, m_err, t_bar, m_bar, ok))
    fmt = lambda x, spec: "" if x is None else format(x, spec)
    header = ["case", "GPUs", "role", "predicted step", "measured step", "error", "predicted memory", "measured memory",
              "error", "bar", "within"]
    lines = []
    if args.markdown:
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
    else:
        lines.append(f"{'case':<44} {'GPUs':>4} {'predicted':>10} {'measured':>10} {'error':>7} "
                     f"{'pred. mem.':>11} {'meas. mem.':>12} {'error':>6}  within")
    for case, p, m, t_err, m_err, t_bar, m_bar, ok in rows:
        cells = [case["name"], str(case["gpus"]), case.get("role", ""), fmt(p.get("step_s"), ".4f") + " s",
                 fmt(m.get("step_s"), ".4f") + " s", fmt(t_err, "+.1f") + "%",
                 fmt(p.get("gpu_memory_gib"), ".2f") + " GiB",
                 (fmt(m.get("gpu_high_water_gib"), ".2f") + " GiB") if m.get("gpu_high_water_gib") else "not recorded",
                 (fmt(m_err, "+.1f") + "%") if m_err is not None else "",
                 f"{t_bar:.0f}%" + (f" / {m_bar:.0f}%" if m_bar else ""),
                 "stale" if m.get("stale") else "yes" if ok else "NO"]
        if args.markdown:
            lines.append("| " + " | ".join(cells) + " |")
        else:
            lines.append(f"{cells[0]:<44} {cells[1]:>4} {cells[3]:>10} {cells[4]:>10} {cells[5]:>7} "
                         f"{cells[6]:>11} {cells[7]:>12} {cells[8]:>6}  {cells[10]}")
    print("\n".join(lines))
    if stale:
        print(f"\n{len(stale)} case(s) marked stale: their recorded step was measured with kernels since changed "
              "(the case's measured.stale says which); they are not held to the bar until measured again")
    if failed:
        print(f"\n{len(failed)} validation case(s) outside the bar: " + ", ".join(failed))
        return 1
    return 0


def run(args):
    cases = load_cases(args.cases)["cases"]
    os.makedirs(args.out, exist_ok=True)
    status = 0
    for case in cases:
        if case["gpus"] > args.np:
            print(f"skip {case['name']}: needs {case['gpus']} GPUs")
            continue
        report = os.path.join(args.out, slug(case["name"]) + ".json")
        if os.path.exists(report):
            print(f"skip {case['name']}: {report} exists")
            continue
        mpi = args.mpi.split() + ["-np", str(case["gpus"])] if case["gpus"] > 1 else []
        cmd = mpi + [args.moetrain, "bench", "--config", os.path.join(ROOT, case["config"]), *set_flags(case),
                     "--steps", str(args.steps), "--json", report]
        with open(os.path.join(args.out, slug(case["name"]) + ".log"), "w") as log:
            r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
        print(f"{case['name']}: {'ok' if r.returncode == 0 else 'FAILED (exit %d)' % r.returncode}")
        status = status or r.returncode
    return 1 if status else 0


def report_numbers(path, case):
    """(step_s, GPU high-water GiB) of one `bench --json` report for `case`, or SystemExit naming the file."""
    try:
        with open(path) as f:
            report = json.load(f)
        step, peak, ranks = report["step_s"], report["gpu_peak_bytes"], report.get("world_size", case["gpus"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"error: {path}: not a readable bench --json report ({type(e).__name__}: {e})")
    if not isinstance(step, (int, float)) or step <= 0:
        raise SystemExit(f"error: {path}: step_s is {step!r}, not a positive number")
    if not isinstance(peak, (int, float)) or peak <= 0:
        raise SystemExit(f"error: {path}: gpu_peak_bytes is {peak!r}: not a GPU run's report")
    if ranks != case["gpus"]:
        raise SystemExit(f"error: {path}: ran on {ranks} rank(s), case '{case['name']}' is for {case['gpus']} GPU(s)")
    return step, peak / 2**30


def record(args):
    """Writes the reports of `run` into the cases file as each case's measured numbers (a stale mark
    goes with the old numbers); cases without a report are left as they are, and so are calibration
    cases unless --calibration is given (their numbers are the run the shipped profile was fitted to)."""
    if not os.path.isdir(args.measured_dir):
        raise SystemExit(f"error: {args.measured_dir}: no such folder")
    doc = load_cases(args.cases)
    updated, skipped = [], []
    for case in doc["cases"]:
        path = os.path.join(args.measured_dir, slug(case["name"]) + ".json")
        if not os.path.exists(path):
            continue
        if case.get("role") == "calibration" and not args.calibration:
            skipped.append(case["name"])
            continue
        step, gib = report_numbers(path, case)
        case["measured"] = {"step_s": round(step, 5), "gpu_high_water_gib": round(gib, 2), "source": args.source}
        updated.append(case["name"])
    if skipped:
        print("left as recorded (calibration cases; --calibration replaces them): " + ", ".join(skipped))
    if not updated:
        print(f"error: no report in {args.measured_dir} is named after a case of {args.cases} to record",
              file=sys.stderr)
        return 1
    target = os.path.realpath(args.cases)  # through a symlink: the file it names is what changes
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=os.path.basename(target) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2, ensure_ascii=False)
            f.write("\n")
        shutil.copymode(target, tmp)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise
    print(f"recorded {len(updated)} case(s) in {args.cases}: " + ", ".join(updated))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=os.path.join(ROOT, "bench/model_cases.json"))
    ap.add_argument("--moetrain", default=default_moetrain())
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table")
    t.add_argument("--measured-dir", help="bench --json reports named <case slug>.json (from `run`)")
    t.add_argument("--hardware", help="profile for plan --hardware (built-in name or file); default plan's")
    t.add_argument("--markdown", action="store_true")
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--np", type=int, default=1, help="GPUs on this machine: cases needing more are skipped")
    r.add_argument("--steps", type=int, default=6)
    r.add_argument("--mpi", default="mpirun --allow-run-as-root --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE "
                   "-x NVSHMEM_DISABLE_NVLS", help="launcher prefix for cases on several GPUs (-np is added)")
    w = sub.add_parser("record", help="write run's reports into the cases file as the measured numbers")
    w.add_argument("--measured-dir", required=True)
    w.add_argument("--source", required=True, help="where the numbers come from (RESULTS.md section, machine)")
    w.add_argument("--calibration", action="store_true",
                   help="also replace calibration cases' numbers (after a new profile was fitted to these runs)")
    args = ap.parse_args()
    return {"table": table, "run": run, "record": record}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
