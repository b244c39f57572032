#!/usr/bin/env python
"""The prepared CUDA run, for a machine with a GPU (the device tool's H200): every zoo workload
built with fusion="tvm" and fusion="tvmfuse" for CUDA and measured by the benchmark's own code
(tvmfuse.bench.measure_workload with target="cuda"): outputs checked against numpy (rtol 1e-3,
atol 1e-4 at least), kernel launches counted while running and from the source, latency as the
median of single calls, each after an L2 flush. Writes the results as data,
results/gpu/<arch>-<date>.json (with the exact command line) and .md (the table), and prints
the table. The defaults fit in a few minutes on one GPU (bench shapes, 5 rounds x 0.1 s).

    ./dev python scripts/gpu_check.py [--arch sm_90] [--size bench] [--out DIR]

On a machine without a GPU it stops at once with exit code 3 and says so.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--size", default="bench")
    ap.add_argument("--systems", default="tvm,tvmfuse", help="comma-separated (peers run where they have CUDA)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    ap.add_argument("--budget", type=float, default=0.1, help="seconds of flushed calls per system per round")
    ap.add_argument("--out", default=os.path.join("results", "gpu"))
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    from tvmfuse import bench_cli

    bench_cli.quiet_runtimes()
    from tvmfuse.bench_gpu import NO_GPU_EXIT, describe_timing, no_gpu_reason

    reason = no_gpu_reason()
    if reason:
        print(f"error: {reason}; run this script on a machine with a GPU", file=sys.stderr)
        return NO_GPU_EXIT
    import tvm

    from tvmfuse import bench, workloads
    from tvmfuse.target import resolve

    systems, t0 = [s.strip() for s in args.systems.split(",") if s.strip()], time.time()
    rows = []
    for name in workloads.names():
        rows.append(bench.measure_workload(name, args.size, systems, args.rounds, args.budget, "cuda", arch=args.arch))
        print(f"{name}: ms {rows[-1].ms} launches {rows[-1].launches} ran {rows[-1].ran} ok {rows[-1].ok}",
              flush=True)
    header = (f"target {resolve('cuda', arch=args.arch)}, {describe_timing(args.arch)}, {args.size} shapes, "
              f"{args.rounds} rounds x {args.budget}s per system, {time.time() - t0:.0f}s in all")
    table = bench.summary(rows, systems)
    command = " ".join(["./dev python scripts/gpu_check.py", shlex.join(argv)]).strip()
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"{args.arch}-{datetime.date.today().isoformat()}")
    with open(stem + ".json", "w") as f:
        json.dump({"command": command, "device": str(tvm.cuda(0).device_name), "timing": header,
                   "size": args.size, "rows": [r.as_dict() for r in rows]}, f, indent=2)
    with open(stem + ".md", "w") as f:
        f.write(f"`{command}`\n\n{header}\n\n{table}\n")
    print(f"{header}\n\n{table}\n\nwrote {stem}.json and {stem}.md")
    bad = [r.workload for r in rows if not all(r.ok.values())]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
