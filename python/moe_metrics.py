"""Reading moetrain's <run>/metrics.jsonl (shared by plot_metrics.py and wandb_sidecar.py).

One JSON object per logged step, written by rank 0 (src/moe/train/metrics.h). What a reader must
know about the file:
  - a non-finite number (a diverged loss, an eval on NaN weights) is the string "nan", "inf" or
    "-inf", since JSON has none;
  - the losses of the named validation sets ([[eval.sets]]) are an object, "eval_sets": {name: loss},
    read here as the scalars eval_loss/<name>;
  - the file is UTF-8; a line that is not is an error naming it;
  - while a run is writing, the last line may not have its newline yet: only whole lines count;
  - a resume from an older step moves the records after that step into
    <run>/abandoned/<when>-after-step-<k>/metrics.jsonl, so the steps of metrics.jsonl never go
    backwards; files written by older versions may still repeat a step, and then the last record
    of that step is the one that counts.
"""
import glob
import json
import math
import os

NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
# Keys of a record that are not measurements.
NOT_SCALARS = {"step", "time", "run_id"}


class MetricsError(Exception):
    """A metrics file that cannot be read; the message names the file."""


def number(value):
    """The float a record's value stands for (numbers, the non-finite strings, booleans as 0/1), or None."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:  # an integer past a double's range: as a double, ±inf
            return math.inf if value > 0 else -math.inf
    if isinstance(value, str):
        return NON_FINITE.get(value)
    return None


def scalars(record):
    """{tag: float} of one record, with the tags of moetrain's TensorBoard events: every number,
    a list as one scalar per element (expert_load_max_over_mean_per_layer as expert_load/layer_<i>),
    an object as one scalar per member (eval_sets as eval_loss/<name>)."""
    out = {}
    for key, value in record.items():
        if key in NOT_SCALARS:
            continue
        if isinstance(value, (list, dict)):
            if isinstance(value, list):
                prefix = "expert_load/layer_" if key == "expert_load_max_over_mean_per_layer" else key + "/"
                members = enumerate(value)
            else:
                prefix = "eval_loss/" if key == "eval_sets" else key + "/"
                members = value.items()
            for name, v in members:
                x = number(v)
                if x is not None:
                    out[f"{prefix}{name}"] = x
            continue
        x = number(value)
        if x is not None:
            out[key] = x
    return out


def whole_lines_text(data, path, first_line=1):
    """The whole lines of `data` (bytes; a last line without its newline, perhaps cut inside a character,
    is left out) as text; a line that is not UTF-8 is a MetricsError naming the file and line."""
    whole = data[: data.rfind(b"\n") + 1]
    try:
        return whole.decode("utf-8")
    except UnicodeDecodeError as e:
        line = first_line + whole.count(b"\n", 0, e.start)
        column = e.start - (whole.rfind(b"\n", 0, e.start) + 1) + 1
        raise MetricsError(f"{path}:{line}: not UTF-8 text: byte 0x{whole[e.start]:02x} at byte {column} of the line "
                           f"({e.reason})") from None


def parse_lines(text, path, first_line=1):
    """The records of the whole lines of `text` (a last line without its newline is left out)."""
    records = []
    lines = text.split("\n")
    for n, line in enumerate(lines[:-1], start=first_line):  # lines[-1] has no newline after it
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise MetricsError(f"{path}:{n}: not a JSON record: {e}") from None
        except RecursionError:
            raise MetricsError(f"{path}:{n}: not a JSON record: nested too deeply") from None
        step = record.get("step") if isinstance(record, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):  # true is an int in Python, and == 1
            raise MetricsError(f"{path}:{n}: a record without an integer 'step'")
        records.append(record)
    return records


def read_records(path):
    """Every whole record of a metrics file, in file order."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise MetricsError(f"cannot read {path}: {e.strerror}") from None
    return parse_lines(whole_lines_text(data, path), path)


def last_per_step(records):
    """The records ordered by step, keeping the last record written for a repeated step."""
    by_step = {}
    for r in records:
        by_step[r["step"]] = r
    return [by_step[s] for s in sorted(by_step)]


def abandoned_lines(run_dir):
    """(folder, records) of each line a resume set aside under <run>/abandoned/, oldest first."""
    lines = []
    for path in sorted(glob.glob(os.path.join(run_dir, "abandoned", "*", "metrics.jsonl"))):
        lines.append((os.path.dirname(path), last_per_step(read_records(path))))
    return lines
