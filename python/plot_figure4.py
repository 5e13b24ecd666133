#!/usr/bin/env python3
"""Table and plot of the Figure-4 experiment (issue 7): throughput against n_experts for the
resident-weight design (DDP + expert parallelism) and the FSDP baseline.

Reads `moetrain bench --json` reports (bench/figure4.sh writes one per run). A report with
moe_layers == 0 is the dense model of the same active size; the others are grouped by design
(parallel_mode "fsdp", or "ddp" with ep > 1) and by num_experts. Prints, per N: tokens/s per GPU
and MFU of both designs and their ratio, then the EP design's throughput at the largest N as a
share of the smallest N. With --out, also draws tokens/s per GPU against n_experts (log2 axis),
one line per design, the dense runs as horizontal lines (needs matplotlib).

  python/plot_figure4.py runs/fig4/*.json --out figure4.png
"""
import argparse
import json
import sys


def load(paths):
    reports = []
    for path in paths:
        try:
            with open(path) as f:
                r = json.load(f)
        except OSError as e:
            sys.exit(f"error: cannot read {path}: {e.strerror}")
        except json.JSONDecodeError as e:
            sys.exit(f"error: {path}: not a moetrain bench report: {e}")
        missing = [k for k in ("parallel_mode", "ep", "num_experts", "moe_layers", "tokens_per_s_per_gpu", "mfu")
                   if k not in r]
        if missing:
            sys.exit(f"error: {path}: not a moetrain bench report (missing {', '.join(missing)})")
        r["path"] = path
        reports.append(r)
    return reports


def design(r):
    if r["parallel_mode"] == "fsdp":
        return "fsdp"
    return f"ep{r['ep']}" if r["ep"] > 1 else "ddp"


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
    return moe, dense


def print_table(moe, dense):
    ep_designs = sorted(d for d in moe if d != "fsdp")
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
        ratio = a["tokens_per_s_per_gpu"] / b["tokens_per_s_per_gpu"] if a and b else None
        cells.append(f"{ratio:>6.2f}x" if ratio else f"{'-':>7}")
        print(" ".join(cells))
    if len(ep) >= 2:
        lo, hi = min(ep), max(ep)
        share = ep[hi]["tokens_per_s_per_gpu"] / ep[lo]["tokens_per_s_per_gpu"]
        print(f"{label} at N={hi}: {100 * share:.1f}% of its N={lo} throughput")
    for d, r in dense:
        print(f"dense ({d}): {r['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, MFU {100 * r['mfu']:.1f}%")


def plot(moe, dense, out):
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("error: --out needs matplotlib: pip install matplotlib")
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for d in sorted(moe):
        ns = sorted(moe[d])
        ax.plot(ns, [moe[d][n]["tokens_per_s_per_gpu"] for n in ns], marker="o",
                label="DDP + EP (rowwise)" if d != "fsdp" else "FSDP baseline")
    for d, r in dense:
        ax.axhline(r["tokens_per_s_per_gpu"], linestyle="--", linewidth=1, color="gray" if d == "fsdp" else "black",
                   label=f"dense, same active size ({d})")
    ax.set_xscale("log", base=2)
    all_ns = sorted({n for d in moe for n in moe[d]})
    ax.set_xticks(all_ns)
    ax.set_xticklabels([str(n) for n in all_ns])
    ax.set_xlabel("n_experts")
    ax.set_ylabel("tokens/s per GPU")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    print(f"wrote {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+", help="moetrain bench --json files")
    ap.add_argument("--out", help="image file to write (.png, .pdf, .svg)")
    args = ap.parse_args()
    moe, dense = tabulate(load(args.reports))
    if not moe and not dense:
        sys.exit("error: no reports")
    print_table(moe, dense)
    if args.out:
        plot(moe, dense, args.out)


if __name__ == "__main__":
    main()
