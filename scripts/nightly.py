#!/usr/bin/env python
"""Nightly tuning job: tune a list of models a bit more (within a time budget), measure every
variant, write a dated result under <logs>/history/, compare it with the last run.

Exit status: 0 when nothing regressed; 1 on a latency regression beyond --threshold or any increase
in launch count (the regressions are printed); 2 on bad arguments.

  ./dev python scripts/nightly.py                                 # the zoo, bench shapes, 1 h budget
  ./dev python scripts/nightly.py --models softmax_chain,attention --trials 8 --time-budget 600
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VARIANTS = ("none", "tvm", "tvmfuse", "tvm+tuned", "tvmfuse+tuned")


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="all", help="comma-separated zoo workloads, or 'all' (default)")
    ap.add_argument("--size", default="bench", choices=("small", "bench"))
    ap.add_argument("--target", default="llvm")
    ap.add_argument("--trials", type=int, default=16,
                    help="trials added per model and variant this run (0: measure only). Default 16")
    ap.add_argument("--time-budget", type=float, default=3600, metavar="SECONDS",
                    help="wall time for tuning in this run (default 3600); measuring comes on top")
    ap.add_argument("--logs", default="tuning_logs", help="tuning records (default tuning_logs/)")
    ap.add_argument("--history", default=None, help="results folder (default <logs>/history)")
    ap.add_argument("--threshold", type=float, default=0.15,
                    help="latency regression that fails the job, as a fraction (default 0.15 = 15%% slower)")
    ap.add_argument("--absolute", action="store_true",
                    help="compare raw latencies (default: divide by the run's median slowdown, the machine factor)")
    ap.add_argument("--repeat", type=int, default=15, help="time_evaluator repeats (median kept)")
    ap.add_argument("--rpc-tracker", metavar="HOST:PORT")
    ap.add_argument("--rpc-key", metavar="KEY")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    from tqdm import tqdm

    from tvmfuse.zoo import workloads
    from tvmfuse.errors import TvmfuseError
    from tvmfuse.target import resolve
    from tvmfuse.tuning import cli as tuning_cli, history

    try:
        target = resolve(args.target)
        names = workloads.names() if args.models == "all" else [workloads.get(n.strip()).name
                                                                 for n in args.models.split(",") if n.strip()]
        args.resume = False  # nightly: every run adds --trials on top of what is logged
        t0 = time.time()
        if args.trials > 0 and args.time_budget > 0:
            tuning_cli.run(names, args.size, target, VARIANTS, args)
    except TvmfuseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    tuning_s = time.time() - t0
    result = {"date": history.stamp(), "target": args.target, "target_str": str(target), "size": args.size,
              "tuning": {"trials_added": args.trials, "time_budget_s": args.time_budget, "tuning_s": tuning_s},
              "models": {}}
    for name in tqdm(names, desc="measuring", unit="model", file=sys.stderr):
        result["models"][name] = _measure(name, args, target)
    folder = args.history or os.path.join(args.logs, "history")
    prev = history.previous(folder, result)
    if prev is not None:  # a slowdown must show twice: re-measure those models, keep the better median
        for name in sorted({ln.split(" [")[0] for ln in history.diff(prev, result, args.threshold,
                                                                      not args.absolute).regressed}):
            again = _measure(name, args, target)
            for v, r in result["models"][name].items():
                lat = [x for x in (r["latency_ms"], again[v]["latency_ms"]) if x]
                r["latency_ms"] = min(lat) if lat else None
    path = history.save(folder, result)
    print(f"wrote {path} (tuning {tuning_s:.0f}s)")
    status = 0
    if prev is None:
        print("no earlier run to compare with")
    else:
        d = history.diff(prev, result, args.threshold, not args.absolute)
        print(f"compared with {os.path.basename(prev['_path'])}: {len(d.improved)} improved, "
              f"{len(d.regressed)} regressed, {d.unchanged} within ±{args.threshold:.0%} "
              f"(machine factor {d.factor:.2f}: this run's median new/old latency)")
        for line in d.improved:
            print(f"  improved   {line}")
        for line in d.regressed:
            print(f"  REGRESSED  {line}")
        status = 1 if d.failed else 0
    print("\nhistory (last 10 runs)\n" + history.table(folder, args.target, args.size))
    bad = [f"{m} [{v}]" for m, vs in result["models"].items() for v, r in vs.items() if r["numerics_ok"] is False]
    if bad:
        print(f"error: numerics differ from the reference on {bad}", file=sys.stderr)
        status = 1
    return status


def _measure(name, args, target) -> dict:
    import tvmfuse
    from tvmfuse.zoo import workloads

    w = tvmfuse.load(name, args.size)
    cmp = tvmfuse.compare(w.mod, w.inputs(), target, VARIANTS, reference=w.reference(*w.inputs()), name=name,
                          rtol=w.rtol, atol=w.atol, repeat=args.repeat, tuning_logs=args.logs)
    return {r.variant: {"launches": r.launches, "bytes": r.bytes_moved, "latency_ms": r.latency_ms.get("median"),
                        "numerics_ok": cmp.checks.get(r.variant)} for r in cmp.rows}


if __name__ == "__main__":
    sys.exit(main())
