"""The inputs of a graph dynamo captured, made into what TVM's FX importer takes (the torch.compile
backend, frontends/torch_backend.py): each tensor input's shape and dtype, every size symbol of a
`dynamic=True` graph an int64 TIR var with the range dynamo's guards give it, the SymInt inputs
dropped (one the graph computes with read from a tensor input's shape: `tvmfuse_size`), a float
dynamo lifted to an input baked in, and the parameters and buffers frozen into constants.
"""
from __future__ import annotations

import copy

import torch
import tvm
from tvm.sym import Analyzer


def input_info(gm, example_inputs):
    """([(shape, dtype)] for from_fx, the positions of the tensor inputs, the SymInt placeholders
    to drop), or (None, reason).

    Static graphs: the example inputs' shapes. `dynamic=True` graphs: dynamo passes each symbolic
    size as an extra SymInt input and records the tensors' symbolic shapes on the placeholders;
    each size symbol becomes one int64 TIR var (shared by every tensor that has it), so the build
    is one symbolic module, and the SymInt inputs are dropped (they are not read by the graph; a
    graph that computes with them runs eagerly)."""
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


def is_module_state(placeholder, t) -> bool:
    """A parameter, or a buffer of the module (BatchNorm's running statistics: dynamo passes them
    as inputs like the parameters; left as inputs they kept BatchNorm from folding into the conv,
    ResNet-50 41 vs 37 ms on znver4)."""
    if isinstance(t, torch.nn.Parameter):
        return True
    arg = placeholder.meta.get("grapharg")
    source = getattr(getattr(arg, "source", None), "name", None)
    return isinstance(source, str) and "._buffers[" in source


def buckets_for(buckets, info):
    """The `buckets` option for this graph's build: {dynamo symbol: sizes} as given, or a list of
    sizes for every symbolic size of the graph (users rarely know dynamo's names, s0, s1, ...);
    None for a static graph (dynamo sends the sizes it saw: nothing to bucket)."""
    if buckets is None:
        return None
    symbols = sorted({d.name for shape, _dt in info for d in shape if isinstance(d, tvm.tirx.Var)})
    if not symbols:
        return None
    if isinstance(buckets, dict):
        return {k: v for k, v in buckets.items() if k in symbols} or None
    return {s: list(buckets) for s in symbols}


def bound_analyzer(info, ranges):
    """An analyzer with each symbolic size of the graph bound to its range (None: nothing to bind)."""
    a, bound = Analyzer(), set()
    for shape, _dt in info:
        for d in shape:
            if isinstance(d, tvm.tirx.Var) and d.name in ranges and d.name not in bound:
                lo, hi = ranges[d.name]
                a.bind(d, tvm.ir.Range(tvm.tirx.const(lo, "int64"), tvm.tirx.const(hi + 1, "int64")))
                bound.add(d.name)
    return a if bound else None


def tvmfuse_size(x, dim: int):
    """`x.size(dim)` as a function: the node a size input the graph reads becomes (size_sources)."""
    return x.size(dim)


def size_sources(gm, drop) -> dict:
    """{SymInt placeholder name: (tensor placeholder name, dim)} for each size input the graph
    computes with (transformers' BERT views and slices by the sequence length): a tensor input whose
    shape has that symbol gives it (`x.size(dim)`, which the frontend turns into the same TIR var).
    NotImplementedError (the graph runs eagerly) for a size no tensor input carries."""
    out = {}
    tensors = [n for n in gm.graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("example_value"), torch.Tensor)]
    for node in drop:
        if not node.users:
            continue
        sym = str(node.meta["example_value"].node.expr) if isinstance(node.meta.get("example_value"), torch.SymInt) else None
        src = next(((t.name, d) for t in tensors for d, size in enumerate(t.meta["example_value"].shape)
                    if sym is not None and isinstance(size, torch.SymInt) and str(size.node.expr) == sym), None)
        if src is None:
            raise NotImplementedError(f"the graph computes with its size input {node.name} ({sym}), which no tensor "
                                      "input's shape carries")
        out[node.name] = src
    return out


def symbol_ranges(example_inputs, info) -> dict:
    """{symbol: (min, max)} of the graph's symbolic sizes, from dynamo's shape environment (its
    guards bound them: BERT's sequence to its position table); finite bounds only."""
    env = next((d.node.shape_env for t in example_inputs if isinstance(t, torch.Tensor) for d in t.shape
                if isinstance(d, torch.SymInt)), None)
    env = env or next((t.node.shape_env for t in example_inputs if isinstance(t, torch.SymInt)), None)
    if env is None:
        return {}
    out = {}
    for sym, vr in env.var_to_range.items():
        try:
            out[str(sym)] = (int(vr.lower), int(vr.upper))
        except (TypeError, ValueError, OverflowError, AttributeError):  # an unbounded side (int_oo)
            continue
    names = {d.name for shape, _dt in info for d in shape if not isinstance(d, int)}
    return {k: v for k, v in out.items() if k in names}


def without_size_inputs(gm, drop, scalars, sizes=None, frozen=None):
    """A copy of the graph (dynamo still calls with every input) without its SymInt inputs (each one
    the graph reads is replaced by `x.size(dim)` of a tensor input with that size: `sizes`, from
    size_sources), with each lifted float baked in as the constant it is now, and each parameter in
    `frozen` ({placeholder name: tensor}) an attribute of the copy, which the importer makes a
    constant (folded and pre-packed at build instead of copied in on every call)."""
    graph = copy.deepcopy(gm.graph)
    placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    for name in frozen or {}:
        with graph.inserting_before(placeholders[name]):
            attr = graph.get_attr(f"_tvmfuse_frozen_{name}")
        placeholders[name].replace_all_uses_with(attr)
        graph.erase_node(placeholders.pop(name))
    last = [n for n in graph.nodes if n.op == "placeholder"][-1]
    for name, (tensor, dim) in (sizes or {}).items():
        with graph.inserting_after(last):
            size = graph.call_function(tvmfuse_size, (placeholders[tensor], dim))
        placeholders[name].replace_all_uses_with(size)
        last = size
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
    if not frozen:
        return torch.fx.GraphModule(gm, graph)
    root = {}  # what the graph's get_attr / call_module nodes name, from gm, and the frozen parameters
    for n in graph.nodes:
        if n.op in ("get_attr", "call_module") and not n.target.startswith("_tvmfuse_frozen_"):
            obj = gm
            for part in n.target.split("."):
                obj = getattr(obj, part)
            root[n.target] = obj
    root.update({f"_tvmfuse_frozen_{name}": t for name, t in frozen.items()})
    return torch.fx.GraphModule(root, graph)
