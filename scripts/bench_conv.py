#!/usr/bin/env python
"""Convolutions one by one: where the conv schedule stands, shape by shape, next to PyTorch.

  ./dev python scripts/bench_conv.py [--set resnet50|grouped|pointwise] [--only 19,20,21] [--budget 0.3]
                                     [--json PATH]

--set resnet50 (default): each distinct conv of transformers' ResNet-50 at 224x224 (stride on the
3x3, strided 1x1 projections). --set grouped: the grouped and depthwise convs of ResNeXt-50
32x4d, MobileNetV2 and ConvNeXt-T at 224x224. --set pointwise: MobileNetV2's 1x1 convs. Each is built alone with its bias + relu epilogue
under tvmfuse (the `cpu.Conv2D` rule, the way a model builds it) and timed as the median of 5
batches of back-to-back calls, interleaved with PyTorch eager's conv2d + bias + relu on the same
threads. Printed per shape: ms, GFLOP/s, PyTorch's ms, and its count in the model, so
`count x ms` shows where the model's conv time goes; the last line is the count-weighted total.
The rule's constants come from the target table (schedules/targets.py); TVMFUSE_CPU_<KEY>=N
overrides one for an experiment.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

# (in channels, out channels, input size, kernel, stride, count in ResNet-50[, groups])
SHAPES = [
    (3, 64, 224, 7, 2, 1),  # stem
    (64, 64, 56, 1, 1, 1), (64, 64, 56, 3, 1, 3), (64, 256, 56, 1, 1, 4), (256, 64, 56, 1, 1, 2),  # layer1
    (256, 128, 56, 1, 1, 1), (128, 128, 56, 3, 2, 1), (128, 512, 28, 1, 1, 4), (256, 512, 56, 1, 2, 1),
    (512, 128, 28, 1, 1, 3), (128, 128, 28, 3, 1, 3),  # layer2
    (512, 256, 28, 1, 1, 1), (256, 256, 28, 3, 2, 1), (256, 1024, 14, 1, 1, 6), (512, 1024, 28, 1, 2, 1),
    (1024, 256, 14, 1, 1, 5), (256, 256, 14, 3, 1, 5),  # layer3
    (1024, 512, 14, 1, 1, 1), (512, 512, 14, 3, 2, 1), (512, 2048, 7, 1, 1, 3), (1024, 2048, 14, 1, 2, 1),
    (2048, 512, 7, 1, 1, 2), (512, 512, 7, 3, 1, 2),  # layer4
]
# (in, out, input size, kernel, stride, count in its model, groups)
GROUPED = [
    (128, 128, 56, 3, 1, 3, 32), (256, 256, 56, 3, 2, 1, 32), (256, 256, 28, 3, 1, 3, 32),  # ResNeXt-50 32x4d
    (512, 512, 28, 3, 2, 1, 32), (512, 512, 14, 3, 1, 5, 32), (1024, 1024, 14, 3, 2, 1, 32),
    (1024, 1024, 7, 3, 1, 2, 32),
    (32, 32, 112, 3, 1, 1, 32), (96, 96, 112, 3, 2, 1, 96), (144, 144, 56, 3, 1, 1, 144),  # MobileNetV2
    (144, 144, 56, 3, 2, 1, 144), (192, 192, 28, 3, 1, 2, 192), (192, 192, 28, 3, 2, 1, 192),
    (384, 384, 14, 3, 1, 3, 384), (576, 576, 14, 3, 1, 2, 576), (576, 576, 14, 3, 2, 1, 576),
    (960, 960, 7, 3, 1, 3, 960),
    (96, 96, 56, 7, 1, 3, 96), (192, 192, 28, 7, 1, 3, 192), (384, 384, 14, 7, 1, 9, 384),  # ConvNeXt-T
    (768, 768, 7, 7, 1, 3, 768),
]
# (in, out, input size, kernel, stride, count in MobileNetV2): its 1x1 expansions and projections,
# whose few input channels (16-64) leave little reduction to hide the tile's store
POINTWISE = [
    (32, 16, 112, 1, 1, 1), (16, 96, 112, 1, 1, 1), (96, 24, 56, 1, 1, 1), (24, 144, 56, 1, 1, 2),
    (144, 24, 56, 1, 1, 1), (144, 32, 28, 1, 1, 1), (32, 192, 28, 1, 1, 3), (192, 32, 28, 1, 1, 2),
    (192, 64, 14, 1, 1, 1), (64, 384, 14, 1, 1, 4), (384, 64, 14, 1, 1, 3), (384, 96, 14, 1, 1, 1),
    (96, 576, 14, 1, 1, 3), (576, 96, 14, 1, 1, 2), (576, 160, 7, 1, 1, 1), (160, 960, 7, 1, 1, 3),
    (960, 160, 7, 1, 1, 2), (960, 320, 7, 1, 1, 1), (320, 1280, 7, 1, 1, 1),
]
SETS = {"resnet50": SHAPES, "grouped": GROUPED, "pointwise": POINTWISE}


def conv_weights(c, oc, k, groups=1):
    rng = np.random.default_rng(0)
    return ((rng.standard_normal((oc, c // groups, k, k)) * 0.05).astype("float32"),
            rng.standard_normal((1, oc, 1, 1)).astype("float32"))


def conv_module(c, oc, h, k, s, groups=1):
    from tvm import relax

    wv, bv = conv_weights(c, oc, k, groups)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, h, h), "float32"))
    w, b = relax.const(wv), relax.const(bv)
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, strides=s, padding=k // 2, groups=groups))
            out = bb.emit_output(relax.op.nn.relu(relax.op.add(y, b)))
        bb.emit_func_output(out)
    return bb.get()


def median_ms(call, budget):
    call()
    t0 = time.perf_counter()
    call()
    n = max(3, int(budget / max(time.perf_counter() - t0, 1e-6)))
    batches = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        batches.append((time.perf_counter() - t0) / n)
    return float(np.median(batches)) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="resnet50", choices=sorted(SETS), help="which convs")
    ap.add_argument("--only", default="", help="comma-separated row indices (default: every shape)")
    ap.add_argument("--budget", type=float, default=0.3, help="seconds per timed batch")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from tvmfuse.target import cpu_name, num_cores, resolve

    os.environ.setdefault("TVM_NUM_THREADS", str(num_cores()))
    import tvmfuse
    from tvmfuse import config

    import torch

    target = resolve("llvm")
    threads = int(os.environ["TVM_NUM_THREADS"])
    torch.set_num_threads(threads)
    shapes = SETS[args.set]
    rows = [int(i) for i in args.only.split(",") if i.strip()] or range(len(shapes))
    overrides = config.cpu_overrides()  # TVMFUSE_CPU_<KEY>, checked
    print(f"CPU: {cpu_name()}; target {target}; threads {os.environ['TVM_NUM_THREADS']}; "
          f"overrides {overrides or 'none'}")
    print("| # | conv | out | count | rule | ms | GFLOP/s | torch ms | vs torch | count x ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    out, total_ms, total_gf, total_torch = [], 0.0, 0.0, 0.0
    rng = np.random.default_rng(1)
    for i in rows:
        c, oc, h, k, s, count, *rest = shapes[i]
        g = rest[0] if rest else 1
        compiled = tvmfuse.build(conv_module(c, oc, h, k, s, g), target, "tvmfuse")
        rules = sorted({str(f.attrs["tvmfuse.rule"]) for _gv, f in compiled.mod.functions_items()
                        if getattr(f, "attrs", None) is not None and "tvmfuse.rule" in f.attrs})
        x = rng.standard_normal((1, c, h, h)).astype("float32")
        f, xs = compiled.vm()["main"], compiled.convert_inputs([x])
        wv, bv = (torch.from_numpy(a) for a in conv_weights(c, oc, k, g))
        tx = torch.from_numpy(x)

        def peer():
            with torch.no_grad():
                return torch.relu(torch.nn.functional.conv2d(tx, wv, stride=s, padding=k // 2, groups=g) + bv)

        np.testing.assert_allclose(f(*xs).numpy(), peer().numpy(), rtol=1e-3, atol=1e-3)
        ms, tms = [], []
        for _ in range(3):  # interleaved: drift hits both
            ms.append(median_ms(lambda: f(*xs), args.budget))
            tms.append(median_ms(peer, args.budget))
        ms, tms = float(np.median(ms)), float(np.median(tms))
        ho = (h + 2 * (k // 2) - k) // s + 1
        gflop = 2 * c * oc * k * k * ho * ho / g / 1e9
        total_ms += count * ms
        total_torch += count * tms
        total_gf += count * gflop
        row = {"index": i, "in": c, "out": oc, "size": h, "kernel": k, "stride": s, "groups": g, "count": count,
               "rule": ",".join(rules), "ms": ms, "gflops": gflop / ms * 1e3, "torch_ms": tms}
        out.append(row)
        name = f"{c}->{oc} {k}x{k}/{s}" + (f" g{g}" if g > 1 else "")
        print(f"| {i} | {name} on {h}x{h} | {oc}x{ho}x{ho} | {count} | {row['rule']} | {ms:.3f} "
              f"| {row['gflops']:.1f} | {tms:.3f} | {tms / ms:.2f}x | {count * ms:.2f} |", flush=True)
    print(f"\ncount-weighted: {total_ms:.2f} ms for {total_gf:.2f} GFLOP = {total_gf / total_ms * 1e3:.1f} GFLOP/s; "
          f"PyTorch eager {total_torch:.2f} ms ({total_torch / total_ms:.2f}x)")
    if args.json:
        from tvmfuse.runtime import machine

        with open(args.json, "w") as fh:
            json.dump({"command": " ".join(sys.argv), "cpu": cpu_name(), "machine": machine.record(target),
                       "target": str(target), "set": args.set,
                       "threads": threads, "overrides": overrides, "rows": out, "total_ms": total_ms,
                       "torch_total_ms": total_torch}, fh, indent=1)
    return 0

if __name__ == "__main__":
    sys.exit(main())
