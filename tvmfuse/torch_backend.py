"""`torch.compile(model, backend="tvmfuse")`: a TorchDynamo backend (static and dynamic shapes).

Registered through torch's `torch_dynamo_backends` entry point (setup.cfg), so the name works once
tvmfuse is installed. For each FX graph dynamo captures, `tvmfuse_backend(gm, example_inputs)`:
  - imports it with TVM's Relax FX frontend (`from_fx`) at the example inputs' shapes and dtypes,
  - builds it through the pipeline (tvmfuse.build: fusion "tvmfuse" unless options say otherwise),
  - returns a callable that runs the compiled module on the CPU tensors dynamo passes.
Options (`torch.compile(..., options={...})`): `fusion` ("none" / "tvm" / "tvmfuse"), `target`
("llvm"), `tuning_logs`, `buckets` (with dynamic=True: a list of sizes for every symbolic size of the
graph, or {dynamo symbol: sizes}; static versions for those sizes inside the one build, see
tvmfuse.build), and any fusion knob (tvmfuse/config.py).

A graph tvmfuse cannot take (an op the frontend does not convert, a build error, inputs on a GPU, a
size the graph computes with) runs in eager PyTorch: the reason is logged on `tvmfuse.torch` and
the model still runs. Recompiles on guard failures are dynamo's. `dynamic=True` graphs are built
once with symbolic sizes (docs/dynamic-shapes.md) and run at every size dynamo sends them: each
size symbol becomes a TIR var, the SymInt inputs dynamo adds are dropped, and a float dynamo lifts
to an input (LayerNorm's eps) is baked in (a call with another value runs eagerly). A graph that
computes with a size input (transformers' BERT slices by the sequence length) still runs eagerly:
import such models with tvmfuse.from_torch(..., dynamic_shapes=...).
"""
from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger("tvmfuse.torch")

_BUILD_OPTIONS = ("fusion", "target", "tuning_logs", "buckets")


def _input_info(gm, example_inputs):
    """([(shape, dtype)] for from_fx, the positions of the tensor inputs, the SymInt placeholders
    to drop), or (None, reason).

    Static graphs: the example inputs' shapes. `dynamic=True` graphs: dynamo passes each symbolic
    size as an extra SymInt input and records the tensors' symbolic shapes on the placeholders;
    each size symbol becomes one int64 TIR var (shared by every tensor that has it), so the build
    is one symbolic module, and the SymInt inputs are dropped (they are not read by the graph; a
    graph that computes with them runs eagerly)."""
    import torch
    import tvm

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        return None, f"{len(example_inputs)} example inputs for {len(placeholders)} graph inputs"
    symbols, info, keep, drop, scalars = {}, [], [], [], {}
    for i, (node, t) in enumerate(zip(placeholders, example_inputs)):
        meta = node.meta.get("example_value", t)
        if isinstance(t, (int, torch.SymInt)) or isinstance(meta, torch.SymInt):
            drop.append(node)  # a size input: dropped (a graph that computes with it runs eagerly)
            continue
        if not isinstance(t, torch.Tensor):
            return None, f"input {i} is a {type(t).__name__}, not a tensor"
        if t.dim() == 0 and node.users and all(u.op == "call_method" and u.target == "item" for u in node.users):
            scalars[i] = (node, t.item())  # a float dynamo lifted to an input (LayerNorm's eps)
            continue
        if t.device.type != "cpu":
            return None, f"input {i} is on {t.device}; the tvmfuse backend runs on the CPU"
        shape = []
        for d in getattr(meta, "shape", t.shape):
            if isinstance(d, int):
                shape.append(int(d))
                continue
            expr = d.node.expr if hasattr(d, "node") else d
            if getattr(expr, "is_number", False):  # a SymInt dynamo kept static
                shape.append(int(expr))
                continue
            if not getattr(expr, "is_Symbol", False):
                return None, f"input {i} has a size expression {expr} (only plain symbolic sizes are compiled)"
            shape.append(symbols.setdefault(str(expr), tvm.tirx.Var(str(expr), "int64")))
        info.append((tuple(shape), str(t.dtype).replace("torch.", "")))
        keep.append(i)
    return (info, keep, drop, scalars), None


def compile_graph(gm, example_inputs, options: dict | None = None):
    """The compiled callable for one FX graph; raises on anything tvmfuse cannot take."""
    import torch
    from tvm.relax.frontend.torch import from_fx

    from .build import build
    from .frontends.common import finish
    from .relax_utils import GRAPH_LOCK

    options = dict(options or {})
    build_kw = {k: options.pop(k) for k in _BUILD_OPTIONS if k in options}
    got, why = _input_info(gm, example_inputs)
    if got is None:
        raise NotImplementedError(why)
    info, keep, drop, scalars = got
    eager = gm.forward
    used = [n.name for n in drop if n.users]
    if used:  # torch.export inside a dynamo backend breaks dynamo's guards (measured): not yet
        raise NotImplementedError(f"the graph computes with its size input(s) {used} (a view or slice by a "
                                  "symbolic length, as transformers' BERT does); such dynamic graphs run eagerly "
                                  "for now: use tvmfuse.from_torch(..., dynamic_shapes=...) for them")
    if drop or scalars:
        gm = _without_size_inputs(gm, drop, scalars)
    with GRAPH_LOCK, torch.no_grad():
        mod = from_fx(gm, info, unwrap_unit_return_tuple=True)
    mod = finish(mod, "constants", True)
    compiled = build(mod, build_kw.get("target", "llvm"), build_kw.get("fusion", "tvmfuse"),
                     tuning_logs=build_kw.get("tuning_logs"), name="torch_graph",
                     buckets=_buckets(build_kw.get("buckets"), info), **options)

    def run(*args):
        if any(args[i].item() != v for i, (_n, v) in scalars.items()):  # a baked float changed
            log.warning("tvmfuse backend: a float input changed since the build; this call runs eagerly")
            return eager(*args)
        out = compiled(*[args[i].detach().numpy() for i in keep])
        outs = out if isinstance(out, tuple) else (out,)
        return tuple(torch.from_numpy(np.ascontiguousarray(o)) for o in outs)

    run.compiled = compiled
    return run


def _buckets(buckets, info):
    """The `buckets` option for this graph's build: {dynamo symbol: sizes} as given, or a list of
    sizes for every symbolic size of the graph (users rarely know dynamo's names, s0, s1, ...);
    None for a static graph (dynamo sends the sizes it saw: nothing to bucket)."""
    if buckets is None:
        return None
    import tvm

    symbols = sorted({d.name for shape, _dt in info for d in shape if isinstance(d, tvm.tirx.Var)})
    if not symbols:
        return None
    if isinstance(buckets, dict):
        return {k: v for k, v in buckets.items() if k in symbols} or None
    return {s: list(buckets) for s in symbols}


def _without_size_inputs(gm, drop, scalars):
    """A copy of the graph (dynamo still calls with every input) without the SymInt inputs it does
    not read, and with each lifted float baked in as the constant it is now."""
    import copy

    import torch

    graph = copy.deepcopy(gm.graph)
    placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    for node, v in scalars.values():
        node = placeholders[node.name]
        for item in list(node.users):
            for user in list(item.users):
                user.args = tuple(v if a is item else a for a in user.args)
                user.kwargs = {k: v if a is item else a for k, a in user.kwargs.items()}
            graph.erase_node(item)
        graph.erase_node(node)
    for dropped in drop:
        graph.erase_node(placeholders[dropped.name])
    return torch.fx.GraphModule(gm, graph)


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
