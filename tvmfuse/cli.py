"""The `tvmfuse` command. One subcommand per job; add new ones in `_subcommands`.

  tvmfuse report --model NAME|all --size small|bench --target llvm --out report.html [--logs DIR]
  tvmfuse graph  --model NAME --out graph.svg [--kernels]
  tvmfuse bench  [--workloads ...] [--systems ...] [--quick] [--logs DIR]   (= scripts/bench.py)
"""
from __future__ import annotations

import argparse
import sys


def _report(args) -> int:
    from .report import html as report
    from .zoo import workloads

    names = workloads.names() if args.model == "all" else [n.strip() for n in args.model.split(",") if n.strip()]
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    path = report.run(names, args.size, args.target, args.out, logs=args.logs, variants=variants,
                      repeat=args.repeat, progress=lambda n: print(f"[report] {n}", file=sys.stderr))
    print(f"wrote {path}")
    return 0


def _graph(args) -> int:
    from .report import html as report, viz

    from .loader import load

    w = load(args.model, args.size)
    fg = viz.fusion_graph(w.mod)
    title = f"{w.name} [{args.size}]"
    (viz.draw_kernels if args.kernels else viz.draw)(fg, args.out, title=title)
    print(f"wrote {args.out}: {len(fg.ops())} ops, {len(fg.groups)} kernels planned, "
          f"{len(fg.refused)} refused merges")
    return 0


def _subcommands(sub):
    from .zoo import workloads

    r = sub.add_parser("report", help="measure workloads and write one self-contained HTML report")
    r.add_argument("--model", default="all", help="zoo workloads, real models or model files, comma-separated, "
                                                   f"or 'all' zoo workloads (default). Zoo: {', '.join(workloads.names())}")
    r.add_argument("--size", default="small", choices=workloads.SIZES, help="shape set (default: small)")
    r.add_argument("--target", default="llvm", help="llvm (default) or cuda (compile-only without a GPU)")
    r.add_argument("--variants", default="none,tvm,tvmfuse", help="comma-separated fusion variants")
    r.add_argument("--repeat", type=int, default=5, help="time_evaluator repeats (median reported)")
    r.add_argument("--logs", metavar="DIR", help="tuning logs: adds the tuning curves")
    r.add_argument("--out", default="report.html", help="HTML file to write (default: report.html)")
    r.set_defaults(func=_report)
    g = sub.add_parser("graph", help="draw a zoo workload's op graph with its fused groups (SVG, or PNG)")
    g.add_argument("--model", required=True, help="zoo workload, real model or model file")
    g.add_argument("--size", default="small", choices=workloads.SIZES)
    g.add_argument("--kernels", action="store_true", help="draw the kernel graph after fusion instead")
    g.add_argument("--out", default="graph.svg", help="output file, .svg or .png (default: graph.svg)")
    g.set_defaults(func=_graph)
    from .bench import cli as bench_cli

    b = sub.add_parser("bench", help="the zoo across none/tvm/tvmfuse and the peers, with the roofline")
    bench_cli.add_arguments(b)
    b.set_defaults(func=bench_cli.run)


def main(argv=None) -> int:
    from .errors import TvmfuseError

    ap = argparse.ArgumentParser(prog="tvmfuse", description="operator fusion on TVM Relax: see and measure it")
    sub = ap.add_subparsers(dest="command", required=True)
    _subcommands(sub)
    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except TvmfuseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
