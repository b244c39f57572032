"""`torch.compile(model, backend="tvmfuse")`: a TorchDynamo backend (static and dynamic shapes).

Registered through torch's `torch_dynamo_backends` entry point (setup.cfg), so the name works once
tvmfuse is installed. For each FX graph dynamo captures, `tvmfuse_backend(gm, example_inputs)`:
  - imports it with TVM's Relax FX frontend (`from_fx`) at the example inputs' shapes and dtypes,
  - builds it through the pipeline (tvmfuse.build: fusion "tvmfuse" unless options say otherwise),
  - returns a callable that runs the compiled module on the CPU tensors dynamo passes.
Options (`torch.compile(..., options={...})`): `fusion` ("none" / "tvm" / "tvmfuse"), `target`
("llvm"), `tuning_logs`, `freeze` (default True: parameters and buffers dynamo passes as inputs are baked in as
constants, folded and pre-packed at build; a call after one was changed in place, an optimizer
step, or rebound with `.data =`, runs eagerly with a warning), `buckets` (with dynamic=True: a list of sizes for every symbolic size of the
graph, or {dynamo symbol: sizes}; static versions for those sizes inside the one build, see
tvmfuse.build), and any fusion knob (tvmfuse/config.py).

A graph tvmfuse cannot take (an op the frontend does not convert, a build error, inputs on a GPU, a
size the graph computes with) runs in eager PyTorch: the reason is logged on `tvmfuse.torch` and
the model still runs. Recompiles on guard failures are dynamo's. `dynamic=True` graphs are built
once with symbolic sizes (docs/dynamic-shapes.md) and run at every size dynamo sends them: each
size symbol becomes a TIR var with the range dynamo's guards give it, the SymInt inputs dynamo adds
are dropped (one the graph computes with, as transformers' BERT views and slices by the sequence
length, is read from a tensor input's shape instead), and a float dynamo lifts to an input
(LayerNorm's eps) is baked in (a call with another value runs eagerly).

This module is the backend's entry; the graph's inputs are prepared in frontends/torch_inputs.py and the
gaps of TVM's FX importer are bridged in frontends/torch_converters.py (`CONVERTERS`).
"""
from __future__ import annotations

import logging

import numpy as np
import torch
from tvm.relax.frontend.torch.fx_translator import TorchFXImporter

from ..build import build
from .common import finish
from ..relax_utils import GRAPH_LOCK
from .torch_converters import CONVERTERS, importing
from .torch_inputs import bound_analyzer, buckets_for, input_info, is_module_state, size_sources, symbol_ranges, without_size_inputs

log = logging.getLogger("tvmfuse.torch")

_BUILD_OPTIONS = ("fusion", "target", "tuning_logs", "buckets")


def compile_graph(gm, example_inputs, options: dict | None = None):
    """The compiled callable for one FX graph; raises on anything tvmfuse cannot take."""
    options = dict(options or {})
    build_kw = {k: options.pop(k) for k in _BUILD_OPTIONS if k in options}
    freeze = bool(options.pop("freeze", True))
    got, why = input_info(gm, example_inputs)
    if got is None:
        raise NotImplementedError(why)
    info, keep, drop, scalars = got
    eager = gm.forward
    frozen = {}  # input position -> (parameter, its version at build)
    if freeze:
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for k, i in enumerate(list(keep)):
            t = example_inputs[i]
            if is_module_state(placeholders[i], t) and not any(not isinstance(d, int) for d in info[keep.index(i)][0]):
                frozen[i] = (placeholders[i].name, t, (t._version, t.data_ptr()))
        info = [inf for i, inf in zip(keep, info) if i not in frozen]
        keep = [i for i in keep if i not in frozen]
    if drop or scalars or frozen:
        gm = without_size_inputs(gm, drop, scalars, size_sources(gm, drop),
                                 {name: t.detach() for name, t, _v in frozen.values()})
    with GRAPH_LOCK, torch.no_grad():
        ranges = symbol_ranges(example_inputs, info)
        importer = TorchFXImporter()
        with importing(importer, bound_analyzer(info, ranges)):  # the converters' state, this import's alone
            mod = importer.from_fx(gm, info, False, True, False, custom_convert_map=CONVERTERS)
    mod = finish(mod, "constants", True, ranges=ranges)
    compiled = build(mod, build_kw.get("target", "llvm"), build_kw.get("fusion", "tvmfuse"),
                     tuning_logs=build_kw.get("tuning_logs"), name="torch_graph",
                     buckets=buckets_for(build_kw.get("buckets"), info), **options)

    def run(*args):
        if any(args[i].item() != v for i, (_n, v) in scalars.items()):  # a baked float changed
            log.warning("tvmfuse backend: a float input changed since the build; this call runs eagerly")
            return eager(*args)
        if any(args[i] is not t or (t._version, t.data_ptr()) != v for i, (_n, t, v) in frozen.items()):
            log.warning("tvmfuse backend: a parameter changed since the build (it was baked in as a constant; "
                        "options={'freeze': False} keeps parameters as inputs); this call runs eagerly")
            return eager(*args)
        out = compiled(*[args[i].detach().numpy() for i in keep])
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
        log.debug("the failure", exc_info=True)
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
