"""BERT or GPT-2 with a symbolic sequence, built once, against the static build at each length and
torch.compile(dynamic=True); one run, same threads (also `scripts/bench.py --dynamic`).

  ./dev python scripts/bench.py --dynamic [--workloads bert-base|bert-tiny] [--rounds 5]
        [--json PATH] [--markdown PATH]
  ./dev python scripts/bench_dynamic.py [--model bert-base|bert-tiny|gpt2-small|gpt2-tiny]
        [--seqs 16,64,128,384] ...

Systems, at each sequence length (batch 1, random ids, the configs' random weights):
  tvmfuse dynamic     ONE tvmfuse build of the model imported with Dim("seq", 2, max positions)
  tvmfuse static      a tvmfuse build of the model imported at that length (flash attention on)
  torch.compile dyn   torch.compile(model, dynamic=True) (Inductor), compiled once
  tvmfuse backend dyn torch.compile(model, backend="tvmfuse", dynamic=True), compiled once
  torch eager
  tvmfuse bucketed    with --buckets: ONE build of the dynamic model with static versions at those
                      lengths (tvmfuse.build(buckets=...)); other lengths take its generic version
Timing: interleaved rounds, each a batch of calls lasting about 0.2 s; the median per call. The
ratios are from this run. Launch counts are the builds' static kernel counts.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np


def _module(name):
    from ..zoo import models

    if name == "bert-tiny":
        return models._bert_module(), 256
    if name == "gpt2-tiny":
        return models._gpt2_module(), 256
    if name == "gpt2-small":  # with its LM head, as in the models benchmark
        from transformers import GPT2Config

        cfg = GPT2Config(use_cache=False, attn_implementation="eager")
        return models._gpt2_module(cfg), cfg.n_positions
    from transformers import BertConfig

    cfg = BertConfig(attn_implementation="eager")
    return models._bert_module(cfg), cfg.max_position_embeddings


def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bert-base", choices=("bert-base", "bert-tiny", "gpt2-small", "gpt2-tiny"))
    ap.add_argument("--seqs", default="16,64,128,384")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--buckets", default="",
                    help="also time a bucketed dynamic build with static versions at these lengths, e.g. 32,64,128,256,512")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    return ap.parse_args(argv)


def _builds(model, ids, seqs, max_pos, bucket_sizes):
    """The compiled systems every length shares: {"dyn", "bucketed" (or None), "compiled", "backend"}
    and the seconds each build (or first call) took."""
    import torch
    from torch.export import Dim

    import tvmfuse

    out, secs = {}, {}
    t0 = time.perf_counter()
    dyn_mod = tvmfuse.from_torch(model, (ids[seqs[0]],),
                                 dynamic_shapes={"input_ids": {1: Dim("seq", min=2, max=max_pos)}})
    out["dyn"] = tvmfuse.build(dyn_mod, "llvm", "tvmfuse")
    secs["dyn"] = time.perf_counter() - t0
    out["bucketed"] = None
    if bucket_sizes:
        seq = next(iter(dict(dyn_mod["main"].attrs["tvmfuse.ranges"])))  # the importer's name for the dim
        t0 = time.perf_counter()
        out["bucketed"] = tvmfuse.build(dyn_mod, "llvm", "tvmfuse", buckets={str(seq): bucket_sizes})
        secs["bucketed"] = time.perf_counter() - t0
    out["compiled"] = torch.compile(model, dynamic=True)
    out["backend"] = torch.compile(model, backend="tvmfuse", dynamic=True)  # tvmfuse as a torch.compile backend
    t0 = time.perf_counter()
    with torch.no_grad():
        out["backend"](ids[seqs[0]])  # the one compile (dynamo capture, import, build)
    secs["backend"] = time.perf_counter() - t0
    return out, secs


def _no_grad(fn):
    import torch

    def call(*a):
        with torch.no_grad():
            return fn(*a)

    return call


def _row(model, x, s, b, rounds, bucket_sizes):
    """One sequence length: the static build, numerics of every system, interleaved timing rounds."""
    import tvmfuse
    from .core import _time

    static = tvmfuse.build(tvmfuse.from_torch(model, (x,)), "llvm", "tvmfuse")
    ref = _no_grad(model)(x).numpy()
    close = lambda out: bool(np.allclose(out.numpy(), ref, rtol=1e-3, atol=1e-3))
    builds = {"tvmfuse dynamic": b["dyn"], "tvmfuse static": static}
    if b["bucketed"]:
        builds["tvmfuse bucketed"] = b["bucketed"]
    calls, ok = {}, {}
    for name, c in builds.items():
        f, args = c.vm()["main"], c.convert_inputs([x.numpy()])
        ok[name], calls[name] = close(f(*args)), (lambda f=f, args=args: f(*args))
    ok["tvmfuse backend dyn"] = close(_no_grad(b["backend"])(x))
    _no_grad(b["compiled"])(x)  # compiles (once for every length with dynamic=True)
    calls.update({"torch.compile dyn": lambda: _no_grad(b["compiled"])(x),
                  "tvmfuse backend dyn": lambda: _no_grad(b["backend"])(x), "torch eager": lambda: _no_grad(model)(x)})
    order = ["tvmfuse dynamic", "tvmfuse static", "torch.compile dyn", "tvmfuse backend dyn", "torch eager"]
    order += ["tvmfuse bucketed"] if b["bucketed"] else []
    samples = {n: [] for n in order}
    for r in range(rounds):
        for n in order[r % len(order):] + order[: r % len(order)]:
            samples[n].append(_time(calls[n], 0.2))
    ms = {n: statistics.median(v) * 1e3 for n, v in samples.items()}
    row = {"seq": s, "ms": ms, "ok": ok, "launches": {"dynamic": b["dyn"].launches, "static": static.launches},
           "dyn_vs_static": ms["tvmfuse dynamic"] / ms["tvmfuse static"],
           "dyn_vs_compile": ms["tvmfuse dynamic"] / ms["torch.compile dyn"]}
    if b["bucketed"]:
        row["bucketed_vs_static"] = ms["tvmfuse bucketed"] / ms["tvmfuse static"]
        row["bucket"] = "static version" if s in bucket_sizes else "generic"
    return row


def _table(args, head, rows, bucketed) -> str:
    names = list(rows[0]["ms"])
    cmd = f"./dev python scripts/bench_dynamic.py --model {args.model} --seqs {args.seqs}"
    cmd += f" --buckets {args.buckets}" if bucketed else ""
    extra = " bucketed / static (path) |" if bucketed else ""
    lines = [f"_{head}; command: `{cmd}`_",
             "", "| seq | " + " | ".join(f"{n} ms" for n in names)
             + " | dynamic / static | dynamic / torch.compile dyn |" + extra + " launches dynamic / static | numerics |",
             "|" + "---|" * (len(names) + 5 + bool(bucketed))]
    for r in rows:
        bucket_cell = f" {r['bucketed_vs_static']:.2f}x ({r['bucket']}) |" if bucketed else ""
        lines.append(f"| {r['seq']} | " + " | ".join(f"{r['ms'][n]:.2f}" for n in names)
                     + f" | {r['dyn_vs_static']:.2f}x | {r['dyn_vs_compile']:.2f}x |" + bucket_cell + " "
                     + f"{r['launches']['dynamic']} / {r['launches']['static']} | "
                     + ("ok" if all(r["ok"].values()) else "MISMATCH") + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = _parse(argv)
    import torch

    from ..runtime import machine
    from ..target import cpu_name, host_cpu, runtime_threads

    threads = runtime_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model, max_pos = _module(args.model)
    seqs = [int(s) for s in args.seqs.split(",")]
    vocab = min(1000, next(m.num_embeddings for m in model.modules() if isinstance(m, torch.nn.Embedding)))
    ids = {s: torch.randint(0, vocab, (1, s)) for s in seqs}
    bucket_sizes = [int(b) for b in args.buckets.split(",") if b.strip()]
    b, secs = _builds(model, ids, seqs, max_pos, bucket_sizes)
    record = machine.record("llvm")
    head = (f"{args.model}, batch 1; {cpu_name()}, llvm mcpu={host_cpu()}; {threads} threads for every system; "
            f"medians of {args.rounds} interleaved rounds; dynamic build (import + build) {secs['dyn']:.1f} s; "
            f"torch.compile(backend='tvmfuse', dynamic=True) first call {secs['backend']:.1f} s"
            + (f"; bucketed build ({args.buckets}) {secs['bucketed']:.1f} s" if b["bucketed"] else ""))
    print(head, file=sys.stderr)
    rows = []
    for s in seqs:
        rows.append(_row(model, ids[s], s, b, args.rounds, bucket_sizes))
        print(f"seq {s}: " + ", ".join(f"{n} {v:.2f} ms" for n, v in rows[-1]["ms"].items()), file=sys.stderr)
    text = _table(args, head, rows, b["bucketed"]) + "\n\n_" + machine.describe(record) + "_"
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"header": head, "machine": record, "rows": rows}, f, indent=1)
    return 0 if all(all(r["ok"].values()) for r in rows) else 1
