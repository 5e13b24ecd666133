#!/usr/bin/env python3
"""Plot moetrain runs: loss and throughput against step, one line per run.

Reads <run>/metrics.jsonl (one JSON object per logged step, written by the trainer) and draws
two panels: lm_loss (solid) and eval_loss where present (dashed, markers) vs step, and
tokens_per_s vs step. Lines are labelled with the run folder's name.

  python/plot_metrics.py runs/tiny runs/tiny-sigmoid --out loss.png
"""
import argparse
import json
import os
import sys


def read_metrics(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except OSError as e:
        sys.exit(f"error: cannot read {path}: {e.strerror}")
    except json.JSONDecodeError as e:
        sys.exit(f"error: {path}: malformed JSON line: {e}")


def column(records, key):
    """(steps, values) of the records that carry `key`."""
    rows = [(r["step"], r[key]) for r in records if key in r and "step" in r]
    return [s for s, _ in rows], [v for _, v in rows]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders holding metrics.jsonl")
    ap.add_argument("--out", required=True, help="image file to write (.png, .pdf, .svg)")
    args = ap.parse_args(argv)
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("error: plot_metrics.py needs matplotlib: pip install matplotlib")

    fig, (ax_loss, ax_speed) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, run in enumerate(args.runs):
        records = read_metrics(run)
        name = os.path.basename(os.path.normpath(run))
        color = f"C{i % 10}"
        ax_loss.plot(*column(records, "lm_loss"), color=color, label=f"{name} lm_loss")
        eval_steps, eval_loss = column(records, "eval_loss")
        if eval_steps:
            ax_loss.plot(eval_steps, eval_loss, "o--", color=color, label=f"{name} eval_loss")
        ax_speed.plot(*column(records, "tokens_per_s"), color=color, label=name)
    ax_loss.set(xlabel="step", ylabel="loss (nats/token)", title="loss")
    ax_speed.set(xlabel="step", ylabel="tokens/s", title="throughput")
    for ax in (ax_loss, ax_speed):
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
