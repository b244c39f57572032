"""Bar chart of a benchmark run: each system's latency relative to tvmfuse, per workload.

    python scripts/plot_results.py results/cpu/models-znver4-2026-12-05-s30-last.json -o docs/img/models-znver4.png

Reads the JSON that `scripts/bench.py --json` writes (`rows[i]["ms"][system]`, `rows[i]["ok"]`).
A bar above 1.0 is a system slower than tvmfuse on that workload (tvmfuse is that many times
faster); below 1.0, faster than tvmfuse. Systems missing from a run, or missing or wrong on one
workload, are left out of that workload's group; a system no row has is left out of the legend.
"""
import argparse
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
import matplotlib.ticker  # noqa: E402

BASE = "tvmfuse"
# Peers in the order they are drawn; any other system found in the file follows them.
PEERS = ("tvm", "vanilla tvm", "onnxruntime", "torch", "torch.compile",
         "torch.compile+freezing", "torch.compile[tvmfuse]")
LABELS = {"tvm": "stock FuseOps (tvmfuse schedules)", "vanilla tvm": "vanilla TVM (dlight)",
          "onnxruntime": "ONNX Runtime", "torch": "PyTorch eager",
          "torch.compile": "torch.compile (Inductor)",
          "torch.compile+freezing": "torch.compile (Inductor, freezing)",
          "torch.compile[tvmfuse]": "torch.compile[tvmfuse]"}
SKIPPED = {"none", "numpy", BASE}


def _usable(row, system):
    ms = row.get("ms", {}).get(system)
    ok = row.get("ok", {}).get(system, True)
    return ms is not None and ok and ms > 0 and math.isfinite(ms)


def relative_latencies(data, systems=None):
    """{system: [latency / tvmfuse latency, or None, per row]} and the row names.

    `systems` (a list) picks and orders the systems; by default every system in the file except
    tvmfuse, the unfused build and numpy, known peers first."""
    rows = [r for r in data["rows"] if _usable(r, BASE)]
    if systems is None:
        found = []
        for r in rows:
            found += [s for s in r.get("ms", {}) if s not in SKIPPED and s not in found]
        systems = [s for s in PEERS if s in found] + [s for s in found if s not in PEERS]
    out = {}
    for s in systems:
        vals = [r["ms"][s] / r["ms"][BASE] if _usable(r, s) else None for r in rows]
        if any(v is not None for v in vals):
            out[s] = vals
    return out, [r["workload"] for r in rows]


def plot(data, path, systems=None, title=None):
    """Draw the chart to `path` (PNG); returns the systems drawn."""
    rel, names = relative_latencies(data, systems)
    if not names or not rel:
        raise ValueError("nothing to plot: no row has tvmfuse and at least one other system")
    width = 0.8 / len(rel)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(names) + 2), 4.5))
    for i, (s, vals) in enumerate(rel.items()):
        xs = [k + (i - (len(rel) - 1) / 2) * width for k, v in enumerate(vals) if v is not None]
        ys = [v for v in vals if v is not None]
        ax.bar(xs, ys, width, label=LABELS.get(s, s))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    label = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:.3g}x")
    ax.yaxis.set_major_formatter(label)
    ax.yaxis.set_minor_formatter(label)
    ax.set_ylabel("latency relative to tvmfuse (>1: tvmfuse faster)")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=20, ha="right")
    ax.set_title(title or _default_title(data))
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return list(rel)


def _default_title(data):
    target = data.get("target", "")
    try:
        mcpu = json.loads(target).get("mcpu", "") if isinstance(target, str) else target.get("mcpu", "")
    except ValueError:
        mcpu = ""
    threads = data.get("timing", "")
    return ", ".join(x for x in ("tvmfuse against its peers", mcpu, threads) if x)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result", help="a bench JSON file (scripts/bench.py --json)")
    ap.add_argument("-o", "--output", required=True, help="the PNG to write")
    ap.add_argument("--systems", default=None, help="comma-separated systems to draw (default: all peers)")
    ap.add_argument("--title", default=None)
    args = ap.parse_args(argv)
    with open(args.result) as f:
        data = json.load(f)
    systems = args.systems.split(",") if args.systems else None
    drawn = plot(data, args.output, systems, args.title)
    print(f"wrote {args.output}: {', '.join(drawn)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
