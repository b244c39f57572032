#!/usr/bin/env python
"""Fused attention against PyTorch's scaled_dot_product_attention (CPU), one run, same threads.

  ./dev python scripts/bench_attention.py [--seqs 128,512,2048] [--heads 12] [--head-dim 64]
        [--rounds 7] [--json PATH] [--markdown PATH]

Per sequence length, batch 1: the graph transformers write (q, k, v as [1, S, H*D], heads split,
scores scaled, softmax, times V, heads merged) built with
  tvmfuse            one flash-attention kernel (online softmax, cpu.Attention)
  tvmfuse-unfused    the same build with the attention knob off (today's path without it)
  tvm                TVM's stock fusion
and, on the same [1, S, H*D] tensors, torch.nn.functional.scaled_dot_product_attention on the head
views, heads merged back (torch's own flash kernel for CPU). Timing: interleaved rounds, each a
batch of calls lasting about 0.2 s; the median per call is reported. Ratios are from this run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np


def systems(s, heads, dh, threads):
    import torch
    import torch.nn.functional as F

    import tvmfuse
    from tvmfuse.zoo import workloads

    torch.set_num_threads(threads)
    w = workloads.attention_workload(1, s, heads, dh)
    ins = w.inputs()
    ref = w.reference(*ins)
    out = {}
    for name, fusion, knobs in (("tvmfuse", "tvmfuse", {}), ("tvmfuse-unfused", "tvmfuse", {"attention": False}),
                                ("tvm", "tvm", {})):
        c = tvmfuse.build(w.mod, "llvm", fusion, **knobs)
        vm, args = c.vm(), c.convert_inputs(ins)
        f = vm["main"]
        got = f(*args).numpy()
        out[name] = (lambda f=f, args=args: f(*args), bool(np.allclose(got, ref, rtol=1e-3, atol=1e-4)), c.launches)
    q, k, v = (torch.from_numpy(a) for a in ins)

    def sdpa():
        th = lambda t: t.view(1, s, heads, dh).transpose(1, 2)
        with torch.inference_mode():
            return F.scaled_dot_product_attention(th(q), th(k), th(v)).transpose(1, 2).reshape(1, s, heads * dh)

    out["torch sdpa"] = (sdpa, bool(np.allclose(sdpa().numpy(), ref, rtol=1e-3, atol=1e-4)), None)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--seqs", default="128,512,2048")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    from tvmfuse.bench.core import _time  # the benchmark's own timing loop
    from tvmfuse.runtime import machine
    from tvmfuse.target import cpu_name, host_cpu, runtime_threads

    threads = runtime_threads()
    cpu = f"{cpu_name()}, llvm mcpu={host_cpu()}"
    head = (f"attention, batch 1, {args.heads} heads x {args.head_dim}; {cpu}; {threads} threads for every "
            f"system; medians of {args.rounds} interleaved rounds")
    print(head, file=sys.stderr)
    rows = []
    for s in (int(x) for x in args.seqs.split(",")):
        sys_ = systems(s, args.heads, args.head_dim, threads)
        samples = {n: [] for n in sys_}
        order = list(sys_)
        for r in range(args.rounds):
            for n in order[r % len(order):] + order[: r % len(order)]:
                samples[n].append(_time(sys_[n][0], 0.2))
        ms = {n: statistics.median(v) * 1e3 for n, v in samples.items()}
        from tvmfuse.zoo import workloads

        flops = workloads.attention_workload(1, s, args.heads, args.head_dim).flops
        rows.append({"seq": s, "ms": ms, "ok": {n: x[1] for n, x in sys_.items()},
                     "launches": {n: x[2] for n, x in sys_.items() if x[2] is not None},
                     "gflops_tvmfuse": flops / ms["tvmfuse"] / 1e6,
                     "vs_sdpa": ms["torch sdpa"] / ms["tvmfuse"], "vs_unfused": ms["tvmfuse-unfused"] / ms["tvmfuse"]})
        print(f"seq {s}: " + ", ".join(f"{n} {v:.3f} ms" for n, v in ms.items()), file=sys.stderr)
    names = list(rows[0]["ms"])
    lines = [f"_{head}; command: `./dev python scripts/bench_attention.py --seqs {args.seqs}`_", "",
             "| seq | " + " | ".join(f"{n} ms" for n in names) + " | tvmfuse GFLOP/s | speedup vs sdpa | "
             "speedup vs unfused | launches tvmfuse / unfused / tvm | numerics |",
             "|" + "---|" * (len(names) + 5)]
    for r in rows:
        ms = r["ms"]
        lines.append(f"| {r['seq']} | " + " | ".join(f"{ms[n]:.3f}" for n in names)
                     + f" | {r['gflops_tvmfuse']:.0f} | {r['vs_sdpa']:.2f}x | {r['vs_unfused']:.2f}x | "
                     + " / ".join(str(r["launches"][n]) for n in ("tvmfuse", "tvmfuse-unfused", "tvm"))
                     + " | " + ("ok" if all(r["ok"].values()) else "MISMATCH") + " |")
    record = machine.record("llvm")
    text = "\n".join(lines + ["", f"_{machine.describe(record)}_"])
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"header": head, "machine": record, "rows": rows}, f, indent=1)
    return 0 if all(all(r["ok"].values()) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
