"""The torch.compile backend's second import route: a dynamo graph TVM's FX importer cannot take
(a Python builtin on a size such as `int(x)`, `full_like`, `repeat_interleave`, `group_norm`,
weight norm, in-place `setitem`, ...) is traced to core ATen by torch.export and imported by TVM's
ExportedProgram importer, the route `tvmfuse.from_torch` takes (and the one that covers the model
suite's architectures).

Contract: `import_aten(gm, inputs, info, ranges)` -> normalized Relax IRModule whose main takes
the graph's tensor inputs in order (the frozen parameters are attributes of `gm`, embedded as
constants). A graph that updates a buffer or an input in place (train-mode
BatchNorm's running statistics) is refused: the compiled module returns values only. Symbolic sizes (`info` holds tirx Vars) become torch.export Dims with dynamo's ranges,
so the module is symbolic like the FX route's. Raises FrontendError (with torch.export's or TVM's
first line) when neither can take the graph.
"""
from __future__ import annotations

import copy

import torch

from ..errors import FrontendError
from .from_torch import from_exported


def _dynamic_shapes(info, ranges):
    """torch.export's dynamic_shapes for the graph's inputs: one Dim per dynamo size symbol, shared by
    every input dim that has it, bounded by dynamo's range; None for a static graph."""
    dims, spec, any_dynamic = {}, [], False
    for shape, _dtype in info:
        entry = {}
        for axis, d in enumerate(shape):
            if isinstance(d, int):
                continue
            lo, hi = ranges.get(d.name, (2, None))
            if d.name not in dims:
                dims[d.name] = torch.export.Dim(f"tvmfuse_{d.name}", min=max(int(lo), 2),
                                                max=None if hi is None else int(hi))
            entry[axis] = dims[d.name]
            any_dynamic = True
        spec.append(entry or None)
    return tuple(spec) if any_dynamic else None


def _detached(gm):
    """A copy of the graph without dynamo's node metadata: its fake tensors belong to dynamo's shape
    environment, and torch.export would add its guards there (dynamo then fails its own frame)."""
    graph = copy.deepcopy(gm.graph)
    for node in graph.nodes:
        node.meta = {}
    out = torch.fx.GraphModule(gm, graph)
    for node in graph.nodes:  # plain tensor attributes (the frozen parameters) as buffers: export then
        if node.op == "get_attr" and "." not in node.target:  # reports an in-place update of one
            t = getattr(out, node.target)
            if isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter):
                delattr(out, node.target)
                out.register_buffer(node.target, t)
    return out


def import_aten(gm, inputs, info, ranges, custom_convert_map=None):
    """The graph through torch.export (non-strict: dynamo already made it traceable) and
    from_exported (with `custom_convert_map`'s converters besides tvmfuse's); see the module docstring."""
    dynamic = _dynamic_shapes(info, ranges)
    try:
        with torch._guards.tracing(None):  # export's own fake mode and shape env, not dynamo's
            ep = torch.export.export(_detached(gm), tuple(inputs), dynamic_shapes=dynamic, strict=False)
    except Exception as err:  # torch raises many types; the caller logs this and runs the graph eagerly
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise FrontendError(f"torch.export could not trace the graph to ATen: {type(err).__name__}: {first}") from err
    return from_exported(ep, "torch_graph", params="constants", dynamic=dynamic is not None, pure=True,
                         custom_convert_map=custom_convert_map)
