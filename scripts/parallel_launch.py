"""What a parallel launch costs on this host, against running the same small kernel serially:
the measurement behind the CPU table's `min_parallel_work` (schedules/cpu/constants.py).

    python scripts/parallel_launch.py [--out results/cpu/parallel-launch-<cpu>.md]

For n floats, y = 2x + 1 built twice with tvmfuse's CPU schedules, once with every parallel loop
kept (min_parallel_work 0) and once serial; each timed as the median of single calls, back to back
(the pool's workers awake) and after 2 ms idle (asleep). Prints a markdown table with the machine.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SIZES = (512, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)


def _module(n):
    import tvm
    from tvm import te

    a = te.placeholder((n // 64, 64), name="a")
    b = te.compute((n // 64, 64), lambda i, j: a[i, j] * 2.0 + 1.0, name="b")
    return tvm.IRModule({"main": te.create_prim_func([a, b]).with_attr("global_symbol", "main")})


def _median_us(f, args, gap_s, calls):
    times = []
    for _ in range(calls):
        if gap_s:
            time.sleep(gap_s)
        t0 = time.perf_counter()
        f(*args)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def measure(sizes=SIZES) -> list[dict]:
    import numpy as np
    import tvm

    from schedules import apply_default_schedules
    from tvmfuse import config
    from tvmfuse.install import install_once
    from tvmfuse.target import resolve

    install_once()
    target = resolve("llvm")
    rows = []
    for n in sizes:
        row = {"n": n}
        for mode, work in (("parallel", 0), ("serial", 1 << 60)):
            with config.override(cpu={"min_parallel_work": work}):
                ex = tvm.compile(apply_default_schedules(_module(n), target), target=target)
            x = tvm.runtime.tensor(np.ones((n // 64, 64), "float32"))
            y = tvm.runtime.empty((n // 64, 64), "float32", tvm.cpu())
            f = ex["main"]
            f(x, y)
            row[f"{mode} us"] = round(_median_us(f, (x, y), 0.0, 300), 2)
            row[f"{mode} after idle us"] = round(_median_us(f, (x, y), 0.002, 60), 2)
        rows.append(row)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="also write the table (markdown) here")
    a = ap.parse_args(argv)
    from tvmfuse.runtime.machine import describe, record
    from tvmfuse.target import runtime_threads

    rows = measure()
    head = list(rows[0])
    lines = [f"`python scripts/parallel_launch.py{' --out ' + a.out if a.out else ''}`", "",
             describe(record("llvm")) + f"; {runtime_threads()} threads", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r[k]) for k in head) + " |" for r in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
