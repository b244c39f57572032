"""The tuning part of `scripts/tune.py`: flags, the `merge` subcommand, the tuning step and the
tuned-vs-untuned summary. Kept here so the script itself only gains a few lines.

Contract
- `add_arguments(ap)`: --trials, --time-budget, --logs, --resume, --rpc-tracker, --rpc-key.
- `requested(args)`: whether tuning or tuned variants are wanted; `tuned_variants(variants)` adds
  tvm+tuned / tvmfuse+tuned for each tunable base variant in the list.
- `run(names, size, target, variants, args)`: tunes every base of a `+tuned` variant for every
  workload with the same trial budget (so tvm+tuned and tvmfuse+tuned are compared fairly), within
  one shared time budget; fails fast (TvmfuseError) for CUDA without GPU or RPC.
- `merge_main(argv)`: `tune.py merge A B ... -o C`.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

DEFAULT_LOGS = "tuning_logs"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("tuning (MetaSchedule + XGBoost)")
    g.add_argument("--trials", type=int, default=None,
                   help="MetaSchedule trials per workload and fusion variant, split over its kernels by weight")
    g.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="wall-time budget for all tuning of this run (split over workloads and kernels)")
    g.add_argument("--logs", default=None, metavar="DIR",
                   help=f"tuning records folder (default {DEFAULT_LOGS}/ when tuning); adds the +tuned variants")
    g.add_argument("--resume", action="store_true",
                   help="top every kernel up to --trials in total (finished kernels cost nothing); "
                        "without it each run adds --trials more")
    g.add_argument("--recheck", action="store_true",
                   help="measure tuned vs default again for finished kernels (after a machine or code change)")
    g.add_argument("--rpc-tracker", metavar="HOST:PORT", help="measure on TVM RPC servers through this tracker")
    g.add_argument("--rpc-key", metavar="KEY", help="device key the RPC servers registered under")


def requested(args) -> bool:
    return bool(args.trials or args.time_budget or args.logs or args.recheck)


def tuned_variants(variants: tuple[str, ...]) -> tuple[str, ...]:
    out = list(variants)
    for base in ("tvmfuse", "tvm"):
        if base in variants and f"{base}+tuned" not in out:
            out.append(f"{base}+tuned")
    return tuple(out)


def rpc_of(args):
    if bool(args.rpc_tracker) != bool(args.rpc_key):
        from ..errors import TvmfuseError

        raise TvmfuseError("--rpc-tracker HOST:PORT and --rpc-key KEY go together")
    return (args.rpc_tracker, args.rpc_key) if args.rpc_tracker else None


def run(workloads_, size, target, variants, args) -> dict:
    """Tune what the +tuned variants need. Returns {(workload, base): TuneResult}."""
    from tqdm import tqdm

    from .autotune import _check_device, tune

    rpc = rpc_of(args)
    _check_device(target, rpc)
    args.logs = args.logs or DEFAULT_LOGS
    bases = [v.split("+")[0] for v in variants if v.endswith("+tuned")]
    if not (args.trials or args.time_budget or getattr(args, "recheck", False)):
        return {}
    jobs = [(n, b) for n in workloads_ for b in bases]
    t0, out = time.time(), {}
    for k, (name, base) in enumerate(jobs):
        budget = None
        if args.time_budget:
            budget = (args.time_budget - (time.time() - t0)) / (len(jobs) - k)
            if budget <= 0:
                tqdm.write(f"time budget spent: {name} [{base}] not tuned", file=sys.stderr)
                continue
        from ..loader import load

        w = load(name, size)
        res = tune(w.mod, target, base, trials=args.trials or 0, time_budget=budget, logs=args.logs,
                   resume=args.resume or not args.trials, rpc=rpc, name=f"{name} [{base}]",
                   recheck=getattr(args, "recheck", False))
        tqdm.write(str(res), file=sys.stderr)
        out[(name, base)] = res
    return out


def summary(results) -> str:
    """tvmfuse+tuned vs tvm+tuned per workload, tuned vs untuned, and the geometric means."""
    rows = ["| workload | tvm ms | tvm+tuned ms | tvmfuse ms | tvmfuse+tuned ms | tvm tuned/untuned | "
            "tvmfuse tuned/untuned | tvmfuse+tuned vs tvm+tuned |", "|---|---|---|---|---|---|---|---|"]
    logs = []
    for c in results:
        lat = {r.variant: r.latency_ms.get("median") for r in c.rows}
        if not lat.get("tvmfuse+tuned") or not lat.get("tvm+tuned"):
            continue
        sp = lat["tvm+tuned"] / lat["tvmfuse+tuned"]
        logs.append(math.log(sp))
        f = lambda v: f"{v:.3f}" if v else "-"
        r = lambda a, b: f"{lat[a] / lat[b]:.2f}x" if lat.get(a) and lat.get(b) else "-"
        rows.append(f"| {c.name} | {f(lat.get('tvm'))} | {f(lat['tvm+tuned'])} | {f(lat.get('tvmfuse'))} | "
                    f"{f(lat['tvmfuse+tuned'])} | {r('tvm', 'tvm+tuned')} | {r('tvmfuse', 'tvmfuse+tuned')} | "
                    f"{sp:.2f}x |")
    if not logs:
        return ""
    rows.append(f"\ngeometric mean speedup tvmfuse+tuned vs tvm+tuned: {math.exp(sum(logs) / len(logs)):.2f}x "
                f"over {len(logs)} workloads")
    return "\n".join(rows)


def merge_main(argv) -> int:
    from .merge import merge

    ap = argparse.ArgumentParser(prog="tune.py merge",
                                 description="Merge tuning-log folders, keeping the best record per workload.")
    ap.add_argument("inputs", nargs="+", help="logs roots (tuning_logs/) or target folders (tuning_logs/llvm-x/)")
    ap.add_argument("-o", "--output", required=True, help="output folder (created; may already hold records)")
    args = ap.parse_args(argv)
    for folder, n in merge(args.inputs, args.output).items():
        print(f"{folder}: {n} best record(s) written")
    return 0
