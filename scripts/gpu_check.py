#!/usr/bin/env python
"""The prepared CUDA check, for a machine with a GPU (the device tool's H200): every zoo workload
built with fusion="tvm" and fusion="tvmfuse" for CUDA, run, checked against numpy, its kernels
counted while running (vm.set_instrument) and from the source, and timed (time_evaluator medians).
Writes the results as data: results/gpu/<arch>-<date>.json, and prints the table.

    ./dev python scripts/gpu_check.py [--arch sm_90] [--size bench] [--out DIR]

On a machine without a GPU it stops at once with exit code 3 and says so.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--size", default="bench")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--out", default=os.path.join("results", "gpu"))
    args = ap.parse_args(argv)
    import tvm

    import tvmfuse
    from tvmfuse import workloads
    from tvmfuse.target import resolve

    if not tvm.cuda(0).exist:
        print("error: no CUDA device here; run this on a GPU machine (see README, GPU checks)", file=sys.stderr)
        return 3
    target = resolve("cuda", arch=args.arch)
    rows = []
    for name in workloads.names():
        w = workloads.get(name, args.size)
        x = w.inputs()
        cmp = tvmfuse.compare(w.mod, x, target, ("tvm", "tvmfuse"), reference=w.reference(*x),
                              name=name, rtol=max(w.rtol, 1e-3), atol=max(w.atol, 1e-4), repeat=args.repeat)
        print(cmp, flush=True)
        rows.append(cmp.as_dict())
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{args.arch}-{datetime.date.today().isoformat()}.json")
    with open(path, "w") as f:
        json.dump({"command": "./dev python " + " ".join(sys.argv), "device": str(tvm.cuda(0).device_name),
                   "target": str(target), "size": args.size, "rows": rows}, f, indent=2)
    print(f"wrote {path}")
    bad = [r["workload"] for r in rows if not all(v for v in r["numerics_ok"].values())]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
