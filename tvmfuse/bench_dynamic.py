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
    from tvmfuse import models

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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bert-base", choices=("bert-base", "bert-tiny", "gpt2-small", "gpt2-tiny"))
    ap.add_argument("--seqs", default="16,64,128,384")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--buckets", default="",
                    help="also time a bucketed dynamic build with static versions at these lengths, e.g. 32,64,128,256,512")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    import torch
    from torch.export import Dim

    import tvmfuse
    from tvmfuse.bench import _time
    from tvmfuse.target import cpu_name, host_cpu, runtime_threads

    threads = runtime_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model, max_pos = _module(args.model)
    seqs = [int(s) for s in args.seqs.split(",")]
    vocab = min(1000, next(m.num_embeddings for m in model.modules() if isinstance(m, torch.nn.Embedding)))
    ids = {s: torch.randint(0, vocab, (1, s)) for s in seqs}
    t0 = time.perf_counter()
    dyn_mod = tvmfuse.from_torch(model, (ids[seqs[0]],),
                                 dynamic_shapes={"input_ids": {1: Dim("seq", min=2, max=max_pos)}})
    dyn = tvmfuse.build(dyn_mod, "llvm", "tvmfuse")
    dyn_s = time.perf_counter() - t0
    bucket_sizes = [int(b) for b in args.buckets.split(",") if b.strip()]
    bucketed, bucket_s = None, 0.0
    if bucket_sizes:
        seq = next(iter(dict(dyn_mod["main"].attrs["tvmfuse.ranges"])))  # the importer's name for the dim
        t0 = time.perf_counter()
        bucketed = tvmfuse.build(dyn_mod, "llvm", "tvmfuse", buckets={str(seq): bucket_sizes})
        bucket_s = time.perf_counter() - t0
    compiled = torch.compile(model, dynamic=True)
    backend = torch.compile(model, backend="tvmfuse", dynamic=True)  # tvmfuse as a torch.compile backend
    t0 = time.perf_counter()
    with torch.no_grad():
        backend(ids[seqs[0]])  # the one compile (dynamo capture, import, build)
    backend_s = time.perf_counter() - t0
    head = (f"{args.model}, batch 1; {cpu_name()}, llvm mcpu={host_cpu()}; {threads} threads for every system; "
            f"medians of {args.rounds} interleaved rounds; dynamic build (import + build) {dyn_s:.1f} s; "
            f"torch.compile(backend='tvmfuse', dynamic=True) first call {backend_s:.1f} s"
            + (f"; bucketed build ({args.buckets}) {bucket_s:.1f} s" if bucketed else ""))
    print(head, file=sys.stderr)
    rows = []
    for s in seqs:
        x = ids[s]
        static = tvmfuse.build(tvmfuse.from_torch(model, (x,)), "llvm", "tvmfuse")
        with torch.no_grad():
            ref = model(x).numpy()
        dargs, sargs = dyn.convert_inputs([x.numpy()]), static.convert_inputs([x.numpy()])
        fd, fs = dyn.vm()["main"], static.vm()["main"]
        ok = {"tvmfuse dynamic": np.allclose(fd(*dargs).numpy(), ref, rtol=1e-3, atol=1e-3),
              "tvmfuse static": np.allclose(fs(*sargs).numpy(), ref, rtol=1e-3, atol=1e-3)}
        if bucketed:
            fb, bargs = bucketed.vm()["main"], bucketed.convert_inputs([x.numpy()])
            ok["tvmfuse bucketed"] = np.allclose(fb(*bargs).numpy(), ref, rtol=1e-3, atol=1e-3)

        def run_compiled(x=x):
            with torch.no_grad():
                return compiled(x)

        def run_eager(x=x):
            with torch.no_grad():
                return model(x)

        def run_backend(x=x):
            with torch.no_grad():
                return backend(x)

        with torch.no_grad():
            ok["tvmfuse backend dyn"] = np.allclose(run_backend().numpy(), ref, rtol=1e-3, atol=1e-3)

        run_compiled()  # compiles (once for every length with dynamic=True)
        calls = {"tvmfuse dynamic": lambda: fd(*dargs), "tvmfuse static": lambda: fs(*sargs),
                 "torch.compile dyn": run_compiled, "tvmfuse backend dyn": run_backend, "torch eager": run_eager}
        if bucketed:
            calls["tvmfuse bucketed"] = lambda: fb(*bargs)
        samples = {n: [] for n in calls}
        order = list(calls)
        for r in range(args.rounds):
            for n in order[r % len(order):] + order[: r % len(order)]:
                samples[n].append(_time(calls[n], 0.2))
        ms = {n: statistics.median(v) * 1e3 for n, v in samples.items()}
        rows.append({"seq": s, "ms": ms, "ok": ok, "launches": {"dynamic": dyn.launches, "static": static.launches},
                     "dyn_vs_static": ms["tvmfuse dynamic"] / ms["tvmfuse static"],
                     "dyn_vs_compile": ms["tvmfuse dynamic"] / ms["torch.compile dyn"]})
        if bucketed:
            rows[-1]["bucketed_vs_static"] = ms["tvmfuse bucketed"] / ms["tvmfuse static"]
            rows[-1]["bucket"] = "static version" if s in bucket_sizes else "generic"
        print(f"seq {s}: " + ", ".join(f"{n} {v:.2f} ms" for n, v in ms.items()), file=sys.stderr)
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
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"header": head, "rows": rows}, f, indent=1)
    return 0 if all(all(r["ok"].values()) for r in rows) else 1


