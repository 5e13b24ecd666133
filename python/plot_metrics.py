#!/usr/bin/env python3
"""Plot moetrain runs against step, one colour per run.

Reads <run>/metrics.jsonl (one JSON object per logged step, written by the trainer) and draws six
panels: loss (lm_loss solid, eval_loss dashed with markers, the loss of each named validation set
of [[eval.sets]], eval_loss/<name>, dash-dotted with its own marker), throughput (tokens_per_s),
expert load max/mean per MoE layer (one line per layer: 1 is perfectly balanced), dropped fraction
(routes past the expert-buffer capacity), load-balancing loss (lb_loss) and router z-loss
(z_loss). Lines are labelled with the run folder's name.

Resumed runs: a resume from an older step moves the records after it into
<run>/abandoned/<when>-after-step-<k>/metrics.jsonl; those lines are left out unless
--abandoned is given (then drawn dotted, thinner). A step written twice (files of older
versions) counts once, with its last record. Non-finite values, which moetrain writes as the
strings "nan" and "inf", leave a gap in their line and are listed on stdout.

The image's format is its extension (.png, .pdf, .svg, ...). An existing --out file is replaced
only with --overwrite; the image is written under a temporary name and then moved into place.

  python3 python/plot_metrics.py runs/tiny runs/tiny-sigmoid --out curves.png [--abandoned] [--overwrite]
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import figure_output  # noqa: E402  (next to this script)
import moe_metrics  # noqa: E402

# (panel title, y label, metric tags drawn in it); "expert_load/layer_*" stands for every layer,
# "eval_loss/*" for every named validation set.
PANELS = [
    ("loss", "nats/token", ["lm_loss", "eval_loss", "eval_loss/*"]),
    ("throughput", "tokens/s", ["tokens_per_s"]),
    ("expert load (max / mean), per MoE layer", "max / mean routes per expert", ["expert_load/layer_*"]),
    ("dropped fraction", "routes dropped / routes", ["dropped_fraction"]),
    ("load-balancing loss", "lb_loss", ["lb_loss"]),
    ("router z-loss", "z_loss", ["z_loss"]),
]


def series(records, tag):
    """(steps, values) of the records carrying `tag`; non-finite values become NaN (a gap)."""
    steps, values = [], []
    for r in records:
        s = moe_metrics.scalars(r)
        if tag in s:
            steps.append(r["step"])
            values.append(s[tag] if math.isfinite(s[tag]) else math.nan)
    return steps, values


def layer_tags(records):
    tags = set()
    for r in records:
        tags.update(t for t in moe_metrics.scalars(r) if t.startswith("expert_load/layer_"))
    return sorted(tags, key=lambda t: int(t.rsplit("_", 1)[1]))


def eval_set_tags(records):
    """The eval_loss/<name> tags of the records, in the order they first appear."""
    tags = {}
    for r in records:
        tags.update((t, None) for t in moe_metrics.scalars(r) if t.startswith("eval_loss/"))
    return list(tags)


def non_finite(records):
    """{tag: [steps]} of the values that are not finite."""
    found = {}
    for r in records:
        for tag, v in moe_metrics.scalars(r).items():
            if not math.isfinite(v):
                found.setdefault(tag, []).append(r["step"])
    return found


def label_text(name):
    """A folder name as legend text: bytes that are not UTF-8 (os gives them as surrogate escapes,
    which matplotlib cannot draw) shown as U+FFFD."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def load_run(run_dir, with_abandoned):
    """(current line, [(label, abandoned line)]) of a run folder; exits with the reason when unreadable."""
    path = os.path.join(run_dir, "metrics.jsonl")
    try:
        current = moe_metrics.last_per_step(moe_metrics.read_records(path))
        abandoned = moe_metrics.abandoned_lines(run_dir) if with_abandoned else []
    except moe_metrics.MetricsError as e:
        sys.exit(f"error: {e}")
    return current, [(os.path.basename(d), recs) for d, recs in abandoned]


def draw(ax, records, tags, color, label, style):
    """Draws `tags` of one line; returns whether anything was drawn."""
    drawn = False
    for tag in tags:
        if tag == "expert_load/layer_*":
            layers = layer_tags(records)
            for i, layer_tag in enumerate(layers):
                steps, values = series(records, layer_tag)
                ax.plot(steps, values, color=color, linestyle=style["linestyle"], linewidth=style["linewidth"],
                        alpha=1.0 - 0.6 * i / max(1, len(layers) - 1),
                        label=f"{label} layer {layer_tag.rsplit('_', 1)[1]}")
                drawn = True
            continue
        if tag == "eval_loss/*":
            dashdot = "-." if style["linestyle"] == "-" else style["linestyle"]
            for i, set_tag in enumerate(eval_set_tags(records)):
                steps, values = series(records, set_tag)
                ax.plot(steps, values, marker="sDv^<>ph"[i % 8], linestyle=dashdot, color=color,
                        linewidth=style["linewidth"], label=f"{label} {set_tag}")
                drawn = True
            continue
        steps, values = series(records, tag)
        if not steps:
            continue
        if tag == "eval_loss":
            ax.plot(steps, values, marker="o", linestyle="--" if style["linestyle"] == "-" else style["linestyle"],
                    color=color, linewidth=style["linewidth"], label=f"{label} eval_loss")
        else:
            ax.plot(steps, values, color=color, linestyle=style["linestyle"], linewidth=style["linewidth"],
                    label=f"{label} {tag}" if len(tags) > 1 else label)
        drawn = True
    return drawn


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders holding metrics.jsonl")
    ap.add_argument("--out", required=True, help="image file to write (.png, .pdf, .svg, ...; must not exist)")
    ap.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    ap.add_argument("--abandoned", action="store_true",
                    help="also draw the lines a resume set aside under <run>/abandoned/ (dotted)")
    args = ap.parse_args(argv)
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        sys.exit("error: plot_metrics.py needs matplotlib: pip install matplotlib "
                 "(scripts/setup.sh installs it into .deps/python-tracking: PYTHONPATH=.deps/python-tracking)")
    extension = figure_output.check_out(args.out, args.overwrite, FigureCanvasAgg.get_supported_filetypes())
    runs = [(run, *load_run(run, args.abandoned)) for run in args.runs]
    empty = [run for run, current, abandoned in runs if not current and not any(r for _, r in abandoned)]
    if len(empty) == len(runs):  # an image of empty panels would pass for a plot
        set_aside = not args.abandoned and any(os.path.isdir(os.path.join(r, "abandoned")) for r in empty)
        sys.exit(f"error: no records to plot: {', '.join(os.path.join(r, 'metrics.jsonl') for r in empty)} "
                 f"{'holds' if len(empty) == 1 else 'hold'} none yet; {args.out} not written"
                 + ("; lines a resume set aside are under <run>/abandoned/: --abandoned draws them" if set_aside
                    else ""))
    for run in empty:
        print(f"{run}: {os.path.join(run, 'metrics.jsonl')} holds no records yet; drawn without it")

    fig, axes = plt.subplots(2, 3, figsize=(17, 9))
    current_style = {"linestyle": "-", "linewidth": 1.5}
    abandoned_style = {"linestyle": ":", "linewidth": 1.0}
    for ax, (title, ylabel, tags) in zip(axes.flat, PANELS):
        drawn = False
        for i, (run, current, abandoned) in enumerate(runs):
            color = f"C{i % 10}"
            name = label_text(os.path.basename(os.path.normpath(run)))
            drawn |= draw(ax, current, tags, color, name, current_style)
            for label, records in abandoned:
                drawn |= draw(ax, records, tags, color, f"{name} ({label})", abandoned_style)
        ax.set(xlabel="step", ylabel=ylabel, title=title)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize="x-small")
        else:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="gray")
    fig.tight_layout()
    try:
        figure_output.save_figure(fig, args.out, extension, args.overwrite)
    finally:
        plt.close(fig)
    for run, current, abandoned in runs:
        drawn = [(run, current)] + ([(f"{run} ({label})", records) for label, records in abandoned])
        for where, records in drawn:
            for tag, steps in sorted(non_finite(records).items()):
                print(f"{where}: {tag} not finite at step{'s' if len(steps) > 1 else ''} "
                      f"{', '.join(map(str, steps))}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
