#!/usr/bin/env python
"""tvmfuse main job: build zoo workloads (or one model) under each fusion variant and print what
fusion bought: launches, bytes moved, peak memory, latency, side by side in one run.

With no arguments: every zoo workload, bench shapes, on llvm (the host CPU).
With tuning flags (--trials, --time-budget, --logs, --rpc-tracker, ...) it tunes with MetaSchedule and
adds the tvm+tuned and tvmfuse+tuned variants. `tune.py merge A B -o C` merges tuning-log folders.
With --train: one training step (forward, relax.transform.Gradient, MSE loss, the --optimizer's
update) of each workload that has trainable parameters, measured the same way.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse(argv=None):
    from tvmfuse.zoo import workloads

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="all",
                    help=f"zoo workload name, or 'all' (default). Known: {', '.join(workloads.names())}. Also a real "
                         "model (bert-tiny, gpt2-tiny, resnet-tiny, bert-tiny-onnx) or a model file: .onnx, Relay "
                         "text .txt/.relay, or .py defining `model` + `example_inputs` (torch) or a Relax `mod`")
    ap.add_argument("--size", default="bench", choices=workloads.SIZES, help="shape set (default: bench)")
    ap.add_argument("--target", default="llvm", help="llvm (default, host CPU) or cuda (compile-only without a GPU)")
    ap.add_argument("--arch", default="sm_90", help="CUDA arch (default sm_90)")
    ap.add_argument("--variants", default="none,tvm,tvmfuse", help="comma-separated fusion variants")
    ap.add_argument("--repeat", type=int, default=15, help="time_evaluator repeats (median reported)")
    ap.add_argument("--json", metavar="PATH", help="write all tables as JSON")
    ap.add_argument("--markdown", metavar="PATH", help="write all tables as markdown")
    ap.add_argument("--report", metavar="PATH", help="write the HTML report (graphs, charts, per-kernel profiles)")
    ap.add_argument("--train", action="store_true",
                    help="measure a training step (forward, backward, update) instead of inference: the zoo "
                         "workloads with trainable parameters (mlp_block, layernorm_decomposed), or --model")
    ap.add_argument("--optimizer", default="sgd", choices=("sgd", "momentum", "adam"), help="with --train")
    ap.add_argument("--train-params", type=int, default=None, metavar="N",
                    help="with --train: main's last N inputs are the trained parameters (default: the workload's own)")
    from tvmfuse.tuning import cli as tuning_cli

    tuning_cli.add_arguments(ap)
    return ap.parse_args(argv)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["merge"]:
        from tvmfuse.tuning.cli import merge_main

        return merge_main(argv[1:])
    args = parse(argv)
    import tvm
    from tqdm import tqdm

    import tvmfuse
    from tvmfuse.zoo import workloads
    from tvmfuse.errors import TvmfuseError
    from tvmfuse.target import resolve

    try:
        target = resolve(args.target, arch=args.arch)
        from tvmfuse import load  # zoo name, real model, .onnx/.txt/.relay/.py file

        loaded = {} if args.model == "all" else {args.model: load(args.model, args.size)}
        names = workloads.names() if args.model == "all" else [args.model]
        if args.train:
            loaded, names = _training(args, loaded, names)
    except TvmfuseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    run = target.kind.name != "cuda" or tvm.cuda(0).exist
    if not run:
        print("note: no CUDA device here; building and counting kernels only (no latency)", file=sys.stderr)
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    from tvmfuse.tuning import cli as tuning_cli

    if args.train and (tuning_cli.requested(args) or any(v.endswith("+tuned") for v in variants)):
        print("error: --train measures default schedules only; tune the inference workload first, or drop "
              "the tuning flags and +tuned variants", file=sys.stderr)
        return 2
    if tuning_cli.requested(args) or any(v.endswith("+tuned") for v in variants):
        variants = tuning_cli.tuned_variants(variants)
        try:
            tuning_cli.run(names, args.size, target, variants, args)
        except TvmfuseError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    results = []
    for name in tqdm(names, desc="workloads", unit="wl", file=sys.stderr):
        w = loaded[name] if name in loaded else load(name, args.size)
        cmp = tvmfuse.compare(w.mod, w.inputs(), target, variants, reference=w.reference(*w.inputs()) if run else None,
                              name=f"{name} [{args.size}]", rtol=w.rtol, atol=w.atol, run=run, repeat=args.repeat,
                              tuning_logs=args.logs)
        cmp.target = args.target
        tqdm.write(str(cmp) + "\n", file=sys.stdout)
        results.append(cmp)
    summary = _summary(results, variants)
    tuned_summary = tuning_cli.summary(results)
    summary += "\n\n" + tuned_summary if tuned_summary else ""
    print(summary)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"target": str(target), "size": args.size, "results": [c.as_dict() for c in results]}, f, indent=2)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n\n".join(c.to_markdown() for c in results) + "\n\n" + summary + "\n")
    if args.report:
        from tvmfuse.report import html as report

        report.from_comparisons(args.report, names, args.size, results, target, getattr(args, "logs", None), run)
        print(f"wrote {args.report}", file=sys.stderr)
    bad = [c.name for c in results if any(v is False for v in c.checks.values())]
    if bad:
        print(f"error: numerics differ from the reference on {bad}", file=sys.stderr)
        return 1
    return 0


def _training(args, loaded, names):
    """--train: the training-step workloads of `names` ({name: Workload}, [names]); with --model all
    only those with trainable parameters, each named "<workload> train[<optimizer>]"."""
    from tvmfuse import load
    from tvmfuse.training.workload import trainable, training_workload

    out = {}
    for name in names:
        w = loaded[name] if name in loaded else load(name, args.size)
        if args.model == "all" and not trainable(w):
            continue
        t = training_workload(w, args.optimizer, args.train_params)
        out[t.name] = t
    return out, list(out)


def _summary(results, variants):
    import math

    lines = ["| workload | " + " | ".join(f"{v} launches" for v in variants) + " | "
             + " | ".join(f"{v} ms" for v in variants) + " | tvmfuse vs tvm |",
             "|---|" + "---|" * (2 * len(variants) + 1)]
    logs = []
    for c in results:
        by = {r.variant: r for r in c.rows}
        launches = [str(by[v].launches) for v in variants]
        lat = [by[v].latency_ms.get("median") for v in variants]
        sp = c.ratios("tvm").get("tvmfuse", {}).get("speedup")
        if sp:
            logs.append(math.log(sp))
        cells = launches + [f"{x:.3f}" if x else "-" for x in lat] + [f"{sp:.2f}x" if sp else "-"]
        lines.append(f"| {c.name} | " + " | ".join(cells) + " |")
    if logs:
        lines.append(f"\ngeometric mean speedup tvmfuse vs tvm: {math.exp(sum(logs) / len(logs)):.2f}x "
                     f"over {len(logs)} workloads")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
