#!/usr/bin/env python3
"""Table and plot of the Figure-4 experiment (issue 7): throughput against n_experts for the
resident-weight design (DDP + expert parallelism) and the FSDP baseline.

Reads `moetrain bench --json` reports (bench/figure4.sh writes one per run). A report with
moe_layers == 0 is the dense model of the same active size; the others are grouped by design
(parallel_mode "fsdp", or "ddp" with ep > 1) and by num_experts. Prints, per N: tokens/s per GPU
and MFU of both designs and their ratio, then the EP design's throughput at the largest N as a
share of the smallest N. With --out, also draws tokens/s per GPU against n_experts (log2 axis),
one line per design, the dense runs as horizontal lines (needs matplotlib). The MoE reports are
of one EP design (one parallel.ep, as bench/figure4.sh runs them) and the FSDP baseline: reports
of several DDP designs are refused, naming them. An existing --out is replaced only with
--overwrite; the image is written under a temporary name and then moved into place.

  python/plot_figure4.py runs/fig4/*.json --out figure4.png [--overwrite]
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import figure_output  # noqa: E402  (next to this script)

# The fields read from a report and what each must be.
INTEGER_FIELDS = {"ep": 1, "num_experts": 1, "moe_layers": 0}  # field: smallest value
NUMBER_FIELDS = ("tokens_per_s_per_gpu", "mfu")


def load(paths):
    reports = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                r = json.loads(f.read().decode("utf-8"))
        except OSError as e:
            sys.exit(f"error: cannot read {path}: {e.strerror}")
        except UnicodeDecodeError as e:
            sys.exit(f"error: {path}: not a moetrain bench report: not UTF-8 ({e.reason} at byte {e.start})")
        except (json.JSONDecodeError, RecursionError) as e:
            why = e if isinstance(e, json.JSONDecodeError) else "nested too deeply"
            sys.exit(f"error: {path}: not a moetrain bench report: {why}")
        if not isinstance(r, dict):
            sys.exit(f"error: {path}: not a moetrain bench report (not a JSON object)")
        missing = [k for k in ("parallel_mode", *INTEGER_FIELDS, *NUMBER_FIELDS) if k not in r]
        if missing:
            sys.exit(f"error: {path}: not a moetrain bench report (missing {', '.join(missing)})")
        if not isinstance(r["parallel_mode"], str):
            sys.exit(f"error: {path}: parallel_mode must be a string, got {json.dumps(r['parallel_mode'])}")
        for key, least in INTEGER_FIELDS.items():
            if isinstance(r[key], bool) or not isinstance(r[key], int) or r[key] < least:
                sys.exit(f"error: {path}: {key} must be an integer >= {least}, got {json.dumps(r[key])}")
        for key in NUMBER_FIELDS:
            v = r[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                sys.exit(f"error: {path}: {key} must be a finite number >= 0, got {json.dumps(v)}")
        r["path"] = path
        reports.append(r)
    return reports


def design(r):
    if r["parallel_mode"] == "fsdp":
        return "fsdp"
    return f"ep{r['ep']}" if r["ep"] > 1 else "ddp"


def design_label(d):
    if d == "fsdp":
        return "FSDP baseline"
    return f"DDP + EP (rowwise, ep={d[2:]})" if d.startswith("ep") else "DDP (ep=1)"


def tabulate(reports):
    """{design: {N: report}} for the MoE runs, [(design, report)] for the dense ones."""
    moe, dense = {}, []
    for r in reports:
        if r["moe_layers"] == 0:
            dense.append((design(r), r))
            continue
        by_n = moe.setdefault(design(r), {})
        if r["num_experts"] in by_n:
            sys.exit(f"error: two {design(r)} reports for N={r['num_experts']}: "
                     f"{by_n[r['num_experts']]['path']} and {r['path']}")
        by_n[r["num_experts"]] = r
    # One EP design against the baseline: with several, the table's column and ratio would be one
    # of them picked by name.
    ddp = sorted(d for d in moe if d != "fsdp")
    if len(ddp) > 1:
        sys.exit("error: MoE reports of several DDP designs (" +
                 "; ".join(f"{design_label(d)}: {', '.join(r['path'] for r in moe[d].values())}" for d in ddp) +
                 "); give the reports of one parallel.ep and the FSDP baseline")
    return moe, dense


def ratio(a, b):
    """a / b of two reports' tokens/s per GPU, or None when either is missing or b is 0."""
    if not a or not b or b["tokens_per_s_per_gpu"] == 0:
        return None
    return a["tokens_per_s_per_gpu"] / b["tokens_per_s_per_gpu"]


def print_table(moe, dense):
    ep_designs = [d for d in moe if d != "fsdp"]  # at most one (tabulate)
    ep = moe[ep_designs[0]] if ep_designs else {}
    fsdp = moe.get("fsdp", {})
    ns = sorted(set(ep) | set(fsdp))
    label = ep_designs[0] if ep_designs else "ep"
    print(f"{'N':>5} {label + ' tok/s/GPU':>16} {'MFU':>7} {'fsdp tok/s/GPU':>16} {'MFU':>7} {'ratio':>7}")
    for n in ns:
        a, b = ep.get(n), fsdp.get(n)
        cells = [f"{n:>5}"]
        for r in (a, b):
            cells += [f"{r['tokens_per_s_per_gpu']:>16,.0f}", f"{100 * r['mfu']:>6.1f}%"] if r else [f"{'-':>16}",
                                                                                                     f"{'-':>7}"]
        x = ratio(a, b)
        cells.append(f"{x:>6.2f}x" if x is not None else f"{'-':>7}")
        print(" ".join(cells))
    if len(ep) >= 2:
        lo, hi = min(ep), max(ep)
        share = ratio(ep[hi], ep[lo])
        if share is not None:
            print(f"{label} at N={hi}: {100 * share:.1f}% of its N={lo} throughput")
    for d, r in dense:
        print(f"dense ({d}): {r['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, MFU {100 * r['mfu']:.1f}%")


def matplotlib_pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        sys.exit("error: --out needs matplotlib: pip install matplotlib "
                 "(scripts/setup.sh installs it into .deps/python-tracking: PYTHONPATH=.deps/python-tracking)")
    return plt, FigureCanvasAgg.get_supported_filetypes()


def plot(plt, moe, dense, out, extension, overwrite):
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for d in sorted(moe):
        ns = sorted(moe[d])
        ax.plot(ns, [moe[d][n]["tokens_per_s_per_gpu"] for n in ns], marker="o", label=design_label(d))
    for d, r in dense:
        ax.axhline(r["tokens_per_s_per_gpu"], linestyle="--", linewidth=1, color="gray" if d == "fsdp" else "black",
                   label=f"dense, same active size ({d})")
    ax.set_xscale("log", base=2)
    all_ns = sorted({n for d in moe for n in moe[d]})
    if all_ns:
        ax.set_xticks(all_ns)
        ax.set_xticklabels([str(n) for n in all_ns])
    ax.set_xlabel("n_experts")
    ax.set_ylabel("tokens/s per GPU")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        figure_output.save_figure(fig, out, extension, overwrite)
    finally:
        plt.close(fig)
    print(f"wrote {out}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+", help="moetrain bench --json files")
    ap.add_argument("--out", help="image file to write (.png, .pdf, .svg, ...; must not exist)")
    ap.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    args = ap.parse_args(argv)
    if args.out:  # before any work: an image that cannot be written is said first
        plt, formats = matplotlib_pyplot()
        extension = figure_output.check_out(args.out, args.overwrite, formats)
    moe, dense = tabulate(load(args.reports))
    print_table(moe, dense)
    if args.out:
        plot(plt, moe, dense, args.out, extension, args.overwrite)


if __name__ == "__main__":
    main()
