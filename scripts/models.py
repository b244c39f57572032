#!/usr/bin/env python
"""Real models through the whole pipeline, measured in one run: import (torch.export / ONNX), classify,
fuse (none / tvm / tvmfuse), build, check against the framework, measure launches, bytes moved and
latency, and time PyTorch eager on the same inputs in the same process.

    ./dev python scripts/models.py                       # all real models, bench size
    ./dev python scripts/models.py --models bert-tiny,resnet-tiny --size small --markdown out.md

A variant that fails to build is reported in the table (with the error) instead of stopping the run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VARIANTS = ("none", "tvm", "tvmfuse")


def parse(argv=None):
    from tvmfuse.zoo import models

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(models.names()), help="comma-separated (default: all)")
    ap.add_argument("--size", default="bench", choices=("small", "bench"))
    ap.add_argument("--repeat", type=int, default=15, help="latency repeats (median reported)")
    ap.add_argument("--threads", type=int, default=1,
                    help="threads for BOTH runtimes (TVM_NUM_THREADS and torch.set_num_threads; default 1: on a "
                         "shared box torch's 2-thread OpenMP timings swing from 1 to 500 ms)")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--markdown", metavar="PATH")
    return ap.parse_args(argv)


def eager_ms(fn, inputs, repeat, budget_s=3.0):
    """Median ms of fn(*inputs) over `repeat` timings (each the mean of `number` calls)."""
    t_end = time.perf_counter() + 0.3  # warm-up: oneDNN primitive creation, allocator
    for i in range(100):
        fn(*inputs)
        if i >= 3 and time.perf_counter() > t_end:
            break
    t0 = time.perf_counter()
    fn(*inputs)
    one = max(time.perf_counter() - t0, 1e-6)
    number = max(1, min(100, int(0.01 / one)))
    repeat = max(3, min(repeat, int(budget_s / (one * number))))
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn(*inputs)
        times.append((time.perf_counter() - t0) / number * 1e3)
    return statistics.median(times)


def measure_model(name, size, repeat):
    import numpy as np

    import tvmfuse
    from tvmfuse.zoo import models

    t0 = time.perf_counter()
    w = tvmfuse.load(name, size)
    row = {"model": name, "size": size, "source": w.source, "import_s": round(time.perf_counter() - t0, 2),
           "inputs": [f"{list(a.shape)}:{a.dtype}" for a in w.inputs()], "variants": {}}
    row["op_classes"] = {k: n for k, n in tvmfuse.classify(w.mod).counts().items() if n}
    ref = w.reference(*w.inputs())
    for v in VARIANTS:
        try:
            c = tvmfuse.build(w.mod, "llvm", v)
            m = tvmfuse.measure(c, w.inputs(), repeat=repeat)
            out = c(*w.inputs())
            ok = bool(np.allclose(out, ref, rtol=w.rtol, atol=w.atol))
            row["variants"][v] = {"launches": m.launches, "bytes": m.bytes_moved, "ms": m.latency_ms["median"],
                                  "ok": ok, "max_err": float(np.abs(out - ref).max())}
        except Exception as err:  # report, keep measuring the others
            msg = str(err).strip().splitlines()[-1] if str(err).strip() else ""
            row["variants"][v] = {"error": f"{type(err).__name__}: {msg}"[:160]}
    row["eager_ms"] = eager_ms(w.eager, w.inputs(), repeat)
    return row


def markdown(rows):
    head = ("| model | ops (compute-heavy / reduction) | launches none / tvm / tvmfuse | MB moved none / tvm / tvmfuse | "
            "median ms none / tvm / tvmfuse | PyTorch eager ms | matches reference |")
    lines = [head, "|---|---|---|---|---|---|---|"]
    for r in rows:
        vs = [r["variants"][v] for v in VARIANTS]
        cell = lambda key, fmt: " / ".join("FAILED" if "error" in x else fmt(x[key]) for x in vs)
        ok = " / ".join("-" if "error" in x else ("yes" if x["ok"] else "NO") for x in vs)
        oc = r["op_classes"]
        ops = f"{sum(oc.values())} ({oc.get('compute-heavy', 0)} / {oc.get('reduction', 0)})"
        lines.append(f"| {r['model']} [{r['size']}] | {ops} | {cell('launches', str)} | "
                     f"{cell('bytes', lambda b: f'{b / 1e6:.2f}')} | {cell('ms', lambda t: f'{t:.3f}')} | "
                     f"{r['eager_ms']:.3f} | {ok} |")
    errors = [f"- {r['model']} {v}: {x['error']}" for r in rows for v, x in r["variants"].items() if "error" in x]
    return "\n".join(lines + ([""] + errors if errors else []))


def main(argv=None):
    args = parse(argv)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)  # read when TVM's thread pool starts (first run)
    import torch

    torch.set_num_threads(args.threads)
    from tvmfuse.runtime import machine
    from tvmfuse.errors import TvmfuseError

    record = machine.record("llvm")
    rows = []
    for name in [n.strip() for n in args.models.split(",") if n.strip()]:
        try:
            row = measure_model(name, args.size, args.repeat)
        except TvmfuseError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        row["threads"] = args.threads
        print(json.dumps(row), file=sys.stderr)
        row["machine"] = record  # the JSON stays a list of rows: each carries the machine record
        rows.append(row)
    table = markdown(rows) + f"\n\n_{machine.describe(record)}_"
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    bad = [r["model"] for r in rows if any(x.get("ok") is False for x in r["variants"].values())]
    if bad:
        print(f"error: numerics differ from the reference on {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
