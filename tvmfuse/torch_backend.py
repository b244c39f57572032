"""`torch.compile(model, backend="tvmfuse")`: a TorchDynamo backend (static shapes).

Registered through torch's `torch_dynamo_backends` entry point (setup.cfg), so the name works once
tvmfuse is installed. For each FX graph dynamo captures, `tvmfuse_backend(gm, example_inputs)`:
  - imports it with TVM's Relax FX frontend (`from_fx`) at the example inputs' shapes and dtypes,
  - builds it through the pipeline (tvmfuse.build: fusion "tvmfuse" unless options say otherwise),
  - returns a callable that runs the compiled module on the CPU tensors dynamo passes.
Options (`torch.compile(..., options={...})`): `fusion` ("none" / "tvm" / "tvmfuse"), `target`
("llvm"), `tuning_logs`, and any fusion knob (tvmfuse/config.py).

A graph tvmfuse cannot take (an op the frontend does not convert, a build error, inputs on a GPU or
with symbolic shapes) runs in eager PyTorch: the reason is logged on `tvmfuse.torch` and the model
still runs. Recompiles on guard failures are dynamo's. `dynamic=True` graphs (symbolic sizes) are
not compiled yet (issue 18): they fall back to eager with that reason.
"""
from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger("tvmfuse.torch")

_BUILD_OPTIONS = ("fusion", "target", "tuning_logs")


def _static_input_info(example_inputs):
    """[(shape, dtype)] for from_fx, or a reason why the inputs cannot be compiled here."""
    import torch

    info = []
    for i, t in enumerate(example_inputs):
        if not isinstance(t, torch.Tensor):
            return None, f"input {i} is a {type(t).__name__}, not a tensor"
        if t.device.type != "cpu":
            return None, f"input {i} is on {t.device}; the tvmfuse backend runs on the CPU"
        if any(not isinstance(d, int) for d in t.shape):
            return None, f"input {i} has symbolic sizes {list(t.shape)} (dynamic shapes are not compiled yet)"
        info.append((tuple(int(d) for d in t.shape), str(t.dtype).replace("torch.", "")))
    return info, None


def compile_graph(gm, example_inputs, options: dict | None = None):
    """The compiled callable for one FX graph; raises on anything tvmfuse cannot take."""
    import torch
    from tvm.relax.frontend.torch import from_fx

    from .build import build
    from .frontends.common import finish
    from .relax_utils import GRAPH_LOCK

    options = dict(options or {})
    build_kw = {k: options.pop(k) for k in _BUILD_OPTIONS if k in options}
    info, why = _static_input_info(example_inputs)
    if info is None:
        raise NotImplementedError(why)
    with GRAPH_LOCK, torch.no_grad():
        mod = from_fx(gm, info, unwrap_unit_return_tuple=True)
    mod = finish(mod, "constants", True)
    compiled = build(mod, build_kw.get("target", "llvm"), build_kw.get("fusion", "tvmfuse"),
                     tuning_logs=build_kw.get("tuning_logs"), name="torch_graph", **options)

    def run(*args):
        out = compiled(*[a.detach().numpy() for a in args])
        outs = out if isinstance(out, tuple) else (out,)
        return tuple(torch.from_numpy(np.ascontiguousarray(o)) for o in outs)

    run.compiled = compiled
    return run


def tvmfuse_backend(gm, example_inputs, options: dict | None = None, **kwargs):
    """The dynamo backend: the compiled graph, or `gm.forward` (eager) with a logged reason."""
    try:
        fn = compile_graph(gm, example_inputs, {**(options or {}), **kwargs})
    except Exception as err:  # noqa: BLE001 - any failure runs the graph eagerly, never breaks the model
        log.warning("tvmfuse backend: graph left to eager PyTorch: %s: %s", type(err).__name__, err)
        return gm.forward
    single = _returns_single(gm)

    def call(*args):
        outs = fn(*args)
        return outs[0] if single else outs

    call.compiled = fn.compiled
    return call


def _returns_single(gm) -> bool:
    """Whether the FX graph returns one tensor (dynamo graphs usually return a tuple)."""
    out = [n for n in gm.graph.nodes if n.op == "output"][0]
    return not isinstance(out.args[0], (tuple, list))
