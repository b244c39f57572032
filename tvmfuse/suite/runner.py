"""One model of the suite, every stage, one row: `run_model(name, size, batch, stages)`.

Stages (each its own entry in row["stages"]: ok, seconds, and on failure "ErrorClass: first line"):
  import    "import[torch.export]" (tvmfuse.from_torch).
  onnx      "import[onnx]" (torch.onnx.export through tvmfuse.bench.baselines._export_onnx, then
            tvmfuse.from_onnx), and with build "build[tvmfuse,onnx]" of it (numerics too when asked).
  build     "build[tvm]" and "build[tvmfuse]" of the torch.export import (of the ONNX import when
            torch.export failed), through tvmfuse.bench._tvm_system (launches static and counted
            while running).
  numerics  each build against PyTorch eager: np.testing.assert_allclose with rtol 1e-3 and atol
            ATOL[size] (1e-4 tiny, 1e-3 full) times the output's scale, max(1, max|ref|): float32's
            reassociation error grows with the magnitude of what is summed, and one model's random
            weights give logits of order 1000 (ResNet-50, max|ref| 980), where an absolute 1e-3 is a
            relative 1e-6 and orderings alone miss it.
  latency   full size only: medians of tvmfuse, tvm, onnxruntime, torch eager, torch.compile and
            torch.compile with Inductor's freezing, timed in ROUNDS interleaved rounds (order rotated)
            of tvmfuse.bench.core._time; the peers are tvmfuse.bench.baselines.model_peer's.
            row["latency_rounds_ms"] keeps every round; row["tvmfuse_over_tvm"] is the median, lower
            and upper quartile of the per-round ratio tvmfuse/tvm (the two timed next to each other
            in each round), so "slower than stock" is judged against the run's own noise.
  backend   torch.compile(module, backend="tvmfuse"): torch._dynamo.explain's graphs and graph
            breaks (with reasons), then one compiled call: the backend's record of each graph
            (frontends/torch_records.py: eager ones with their reasons, and how many took the
            ATen route) and the numerics.

Weights: the model's own `_init_weights` (AutoModel.from_config: normal(0, initializer_range)),
then tvmfuse.suite.archs._spread (constant parameters spread by 2%, BatchNorm statistics
randomised). row["init"] checks it: the denormal floats (0 < |x| < 1.18e-38) found in every
module's output over one eager forward, and the output's largest magnitude.

`python -m tvmfuse.suite.runner NAME --size tiny --batch 1 --stages ... --out ROW.json` writes the row
after every stage, so a process that dies mid-way leaves what it had (scripts/suite.py).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time

import numpy as np

from . import archs
from ..frontends import torch_records

STAGES = ("import", "onnx", "build", "numerics", "latency", "backend")
ATOL = {"tiny": 1e-4, "full": 1e-3}
RTOL = 1e-3
ROUNDS = 9
BUDGET_S = 0.3
TINY = 1.1754943508222875e-38  # float32's smallest normal


def error_line(err: BaseException) -> str:
    text = str(err).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(err).__name__}: {first[:300]}".rstrip(": ")


class _Stage:
    """`with _Stage(row, key):` records ok/seconds/error of one stage; the exception is swallowed."""

    def __init__(self, row, key, emit):
        self.row, self.key, self.emit = row, key, emit

    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, kind, err, tb):
        entry = {"ok": err is None, "s": round(time.perf_counter() - self.t0, 2)}
        if err is not None:
            entry["error"] = error_line(err)
        self.row["stages"][self.key] = entry
        self.emit(self.row)
        return isinstance(err, Exception)


def check_init(module, tensors) -> dict:
    """Denormal floats in every module's output over one eager forward, and the output's max |x|."""
    import torch

    count = [0]

    def hook(_m, _i, out):
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                a = t.detach().abs()
                count[0] += int(((a > 0) & (a < TINY)).sum())

    handles = [m.register_forward_hook(hook) for m in module.modules()]
    try:
        with torch.no_grad():
            out = module(*tensors)
    finally:
        for h in handles:
            h.remove()
    return {"denormals": count[0], "max_abs": float(out.abs().max())}


def compare(out, ref, size) -> float:
    """Max abs error; raises AssertionError (np.testing, its message with the max error and the
    tolerance) when out is not within rtol RTOL and atol ATOL[size] x max(1, max|ref|) of ref."""
    out = out[0] if isinstance(out, (tuple, list)) else out
    scale = max(1.0, float(np.max(np.abs(ref)))) if ref.size else 1.0
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL[size] * scale,
                               err_msg=f"atol {ATOL[size]} x output scale {scale:.4g}")
    return float(np.max(np.abs(out - ref))) if out.size else 0.0


def _import_onnx(module, arrays):
    from ..bench.baselines import _export_onnx, load_exported
    from ..frontends.from_onnx import from_onnx

    blob, why = _export_onnx(module, arrays)
    if blob is None:
        raise RuntimeError(why)
    return from_onnx(load_exported(blob))


def _loaded(name, mod, arrays, module, ref):
    from ..zoo.workload import Workload

    return Workload.imported(name, mod, arrays, lambda *x: ref, rtol=RTOL, module=module, source="tvmfuse.suite")


def run_model(name, size="tiny", batch=1, stages=STAGES, emit=lambda row: None) -> dict:
    """The row of model `name` (tvmfuse.suite.archs) at `size` and `batch`."""
    import torch

    from ..frontends.from_torch import from_torch

    arch = archs.BY_NAME[name]
    row = {"model": name, "family": arch.family, "size": size, "batch": batch, "note": arch.note, "stages": {},
           "max_err": {}, "launches": {}, "ran": {}, "latency_ms": {}}
    module = archs.build_module(arch, size)
    arrays = archs.make_inputs(arch, size, batch)
    tensors = tuple(torch.from_numpy(a) for a in arrays)
    row["init"] = check_init(module, tensors)
    with torch.no_grad():
        ref = module(*tensors).numpy()
    ready = {}
    torch_mod = onnx_mod = None
    if "import" in stages:
        with _Stage(row, "import[torch.export]", emit):
            torch_mod = from_torch(module, tensors)
    # one imported module at a time: each holds the weights (and a build its folded and prepacked
    # copies), so the torch.export import is built and dropped before the ONNX one is made
    timed = "latency" in stages and size == "full"
    if "build" in stages and torch_mod is not None:
        row["build_source"] = "torch.export"
        for fusion in ("tvm", "tvmfuse"):
            _build_stage(row, name, fusion, fusion, torch_mod, arrays, module, ref, size, stages, ready, timed, emit)
    torch_mod = None
    gc.collect()
    if "onnx" in stages:
        with _Stage(row, "import[onnx]", emit):
            onnx_mod = _import_onnx(module, arrays)
    if "build" in stages and onnx_mod is not None:
        if "build_source" not in row:  # torch.export failed: the ONNX import stands in
            row["build_source"] = "onnx"
            for fusion in ("tvm", "tvmfuse"):
                _build_stage(row, name, fusion, fusion, onnx_mod, arrays, module, ref, size, stages, ready, timed,
                             emit)
        else:
            _build_stage(row, name, "tvmfuse,onnx", "tvmfuse", onnx_mod, arrays, module, ref, size, stages, ready,
                         False, emit)
    onnx_mod = None
    gc.collect()
    if "latency" in stages and size == "full" and ready:
        with _Stage(row, "latency", emit):
            rounds, row["latency_skipped"] = latency(name, module, arrays, ready, ref)
            row["latency_rounds_ms"] = rounds
            row["latency_ms"] = {s: round(statistics.median(v), 4) for s, v in rounds.items()}
            if "tvmfuse" in rounds and "tvm" in rounds:
                row["tvmfuse_over_tvm"] = quartiles([a / b for a, b in zip(rounds["tvmfuse"], rounds["tvm"])])
    ready.clear()
    gc.collect()
    if "backend" in stages:
        with _Stage(row, "backend", emit):
            row["backend"] = backend(module, tensors, ref, size)
            if not row["backend"]["compiled"]:
                raise RuntimeError(f"fell back to eager: {'; '.join(row['backend']['eager_reasons'])[:300]}")
    emit(row)
    return row


def _build_stage(row, name, key, fusion, mod, arrays, module, ref, size, stages, ready, keep, emit):
    """build[key] of `mod` under `fusion` (and numerics[key]); the build stays in `ready` only when
    `keep` (it is timed): a build holds the weights and their prepacked copies."""
    from ..bench.core import _tvm_system

    with _Stage(row, f"build[{key}]", emit):
        r = _tvm_system(_loaded(name, mod, arrays, module, ref), fusion, "llvm", arrays, None)
        row["launches"][key], row["ran"][key] = r.launches, r.ran
        ready[key] = r
    if key in ready and "numerics" in stages:
        with _Stage(row, f"numerics[{key}]", emit):
            row["max_err"][key] = compare(ready[key].out, ref, size)
    if key in ready and not keep:
        del ready[key]
    r = None
    gc.collect()


def latency(name, module, arrays, ready, ref):
    """{system: [ms of each round]}, {system: why it has no number}; TVM builds from `ready`."""
    from ..bench.baselines import model_peer
    from ..bench.core import _time
    from ..target import runtime_threads

    threads = runtime_threads()
    calls = {s: ready[s].call for s in ("tvmfuse", "tvm") if s in ready}
    skipped = {}
    from ..zoo.workload import Workload

    specs = [(f"x{i}", tuple(a.shape), str(a.dtype)) for i, a in enumerate(arrays)]
    m = Workload(name, None, specs, lambda *x: ref, arrays=list(arrays), module=module, source="tvmfuse.suite")
    for system in ("onnxruntime", "torch", "torch.compile", "torch.compile+freezing"):
        try:
            got = model_peer(m, system, threads)  # the bench's peers, set up as the bench sets them
        except Exception as err:  # a peer that cannot run this model: the row says why
            got = error_line(err)
        if isinstance(got, str):
            skipped[system] = got
        else:
            calls[system] = got[0]
    samples = {s: [] for s in calls}
    order = list(calls)
    for i in range(ROUNDS):
        for s in order[i % len(order):] + order[:i % len(order)]:
            samples[s].append(_time(calls[s], BUDGET_S))
    return {s: [round(t * 1e3, 4) for t in v] for s, v in samples.items()}, skipped


def quartiles(values) -> dict:
    """{"median", "q1", "q3"} of `values` (statistics' inclusive quantiles), rounded."""
    q1, med, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return {"median": round(med, 4), "q1": round(q1, 4), "q3": round(q3, 4)}


def backend(module, tensors, ref, size) -> dict:
    """torch.compile(backend="tvmfuse") on the module: graphs, graph breaks, eager subgraphs and why."""
    import torch

    torch._dynamo.reset()
    with torch.no_grad():
        exp = torch._dynamo.explain(module)(*tensors)
    out = {"graphs": exp.graph_count, "graph_breaks": exp.graph_break_count,
           "break_reasons": sorted({str(b.reason).splitlines()[0][:200] for b in exp.break_reasons})}
    torch._dynamo.reset()
    fn = torch.compile(module, backend="tvmfuse")
    with torch.inference_mode():
        got = fn(*tensors).numpy()
    records = torch_records.of_model(module)
    eager = [r.reason for r in records if r.eager]
    out.update(eager_subgraphs=len(eager), eager_reasons=eager, compiled=bool(records) and not eager,
               aten_route=sum(r.route == "aten" for r in records))
    try:
        out["max_err"] = compare(got, ref, size)
    except AssertionError as err:
        out["numerics"] = error_line(err)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", choices=archs.names())
    p.add_argument("--size", choices=("tiny", "full"), default="tiny")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--stages", default=",".join(STAGES))
    p.add_argument("--out", required=True, help="the row as JSON (rewritten after every stage)")
    a = p.parse_args(argv)

    def emit(row):  # whole rows only: a kill mid-write leaves the last complete one
        with open(a.out + ".tmp", "w") as f:
            json.dump(row, f, indent=1, default=str)
        os.replace(a.out + ".tmp", a.out)

    run_model(a.model, a.size, a.batch, tuple(a.stages.split(",")), emit)


if __name__ == "__main__":
    main()
