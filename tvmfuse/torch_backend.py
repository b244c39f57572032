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
(LayerNorm's eps) is baked in (a call with another value runs eagerly). Gaps of TVM's FX
importer are bridged here (`_CONVERTERS`): F.embedding as a function, torch.gather with keyword
arguments, slices bounded by a symbolic size, F.batch_norm as a function (ResNet, MobileNet),
F.hardtanh with positional bounds (ReLU6: the importer took them as -1 and 1, a wrong answer),
torch.zeros, torch.diff, torch.where with a scalar, x.new_ones with a dtype, cumsum of a bool and
indexing by several tensors (GPT-2).
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
    from tvm.relax.frontend.torch.fx_translator import TorchFXImporter

    from .build import build
    from .frontends.common import finish
    from .relax_utils import GRAPH_LOCK

    options = dict(options or {})
    build_kw = {k: options.pop(k) for k in _BUILD_OPTIONS if k in options}
    freeze = bool(options.pop("freeze", True))
    got, why = _input_info(gm, example_inputs)
    if got is None:
        raise NotImplementedError(why)
    info, keep, drop, scalars = got
    eager = gm.forward
    frozen = {}  # input position -> (parameter, its version at build)
    if freeze:
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for k, i in enumerate(list(keep)):
            t = example_inputs[i]
            if _is_module_state(placeholders[i], t) and not any(not isinstance(d, int) for d in info[keep.index(i)][0]):
                frozen[i] = (placeholders[i].name, t, (t._version, t.data_ptr()))
        info = [inf for i, inf in zip(keep, info) if i not in frozen]
        keep = [i for i in keep if i not in frozen]
    if drop or scalars or frozen:
        gm = _without_size_inputs(gm, drop, scalars, _size_sources(gm, drop),
                                  {name: t.detach() for name, t, _v in frozen.values()})
    with GRAPH_LOCK, torch.no_grad():
        ranges = _ranges(example_inputs, info)
        _IMPORT["analyzer"] = _analyzer(info, ranges)  # for _getitem; GRAPH_LOCK makes it this import's
        importer = _IMPORT["importer"] = TorchFXImporter()  # (a method converter reads it from here)
        try:
            mod = importer.from_fx(gm, info, False, True, False, custom_convert_map=_CONVERTERS)
        finally:
            _IMPORT["analyzer"] = _IMPORT["importer"] = None
    mod = finish(mod, "constants", True, ranges=ranges)
    compiled = build(mod, build_kw.get("target", "llvm"), build_kw.get("fusion", "tvmfuse"),
                     tuning_logs=build_kw.get("tuning_logs"), name="torch_graph",
                     buckets=_buckets(build_kw.get("buckets"), info), **options)

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


def _is_module_state(placeholder, t) -> bool:
    """A parameter, or a buffer of the module (BatchNorm's running statistics: dynamo passes them
    as inputs like the parameters; left as inputs they kept BatchNorm from folding into the conv,
    ResNet-50 41 vs 37 ms on znver4)."""
    import torch

    if isinstance(t, torch.nn.Parameter):
        return True
    arg = placeholder.meta.get("grapharg")
    source = getattr(getattr(arg, "source", None), "name", None)
    return isinstance(source, str) and "._buffers[" in source


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


def _embedding(node, importer):
    """F.embedding(ids, weight, ...) as dynamo captures it (a call_function; TVM's FX importer has
    only the nn.Embedding module form): a take of the weight rows, as that form lowers. Also
    torch.embedding(weight, ids), the same name with the operands the other way round."""
    import torch

    if node.target is torch.nn.functional.embedding:
        ids, weight = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs["weight"]
        max_norm = node.args[3] if len(node.args) > 3 else node.kwargs.get("max_norm")
        if max_norm is not None:  # renormalizes the weight rows in place: not a pure lookup
            raise NotImplementedError("F.embedding with max_norm (it rewrites the weights in place)")
    else:
        weight, ids = node.args[0], node.args[1]
    return importer._embedding_impl(importer.env[ids], importer.env[weight])


def tvmfuse_size(x, dim: int):
    """`x.size(dim)` as a function: the node a size input the graph reads becomes (_size_sources)."""
    return x.size(dim)


def _size(node, importer):
    """The size as the TIR expression of the tensor's shape (a symbolic var for a dynamic dim;
    TVM's FX importer's own `size` takes only constant sizes)."""
    return importer.shape_of(importer.env[node.args[0]])[node.args[1]]


# the import in progress (under GRAPH_LOCK): its symbols' ranges, and the importer (TVM's FX importer
# calls a converter of a method, x.new_ones(...), without the importer it passes to functions)
_IMPORT = {"analyzer": None, "importer": None}


def _analyzer(info, ranges):
    """An analyzer with each symbolic size of the graph bound to its range (None: nothing to bind)."""
    import tvm
    from tvm.sym import Analyzer

    a, bound = Analyzer(), set()
    for shape, _dt in info:
        for d in shape:
            if isinstance(d, tvm.tirx.Var) and d.name in ranges and d.name not in bound:
                lo, hi = ranges[d.name]
                a.bind(d, tvm.ir.Range(tvm.tirx.const(lo, "int64"), tvm.tirx.const(hi + 1, "int64")))
                bound.add(d.name)
    return a if bound else None


def _tightened(ty, analyzer):
    from .frontends.tighten_shapes import _tightened as tightened

    return tightened(ty, analyzer)


def _getitem(node, importer):
    """x[..., a:b] whose bounds are sizes (BERT's position_ids[:, :seq]): TVM's FX importer reads a
    slice's bounds as constants, so the size nodes inside slices are resolved to their TIR
    expressions first; x[i0, i1] by several index tensors goes to _gather_nd; everything else is
    the importer's own getitem."""
    import tvm
    from torch import fx

    def resolve(a):
        if isinstance(a, slice):
            return slice(*(importer.env[x] if isinstance(x, fx.Node) else x for x in (a.start, a.stop, a.step)))
        return tuple(resolve(x) for x in a) if isinstance(a, tuple) else a

    args = node.args
    index = args[1] if len(args) > 1 else None
    if isinstance(index, tuple) and len(index) >= 2 and all(isinstance(i, fx.Node) for i in index):
        return _gather_nd(importer, importer.env[args[0]], [importer.env[i] for i in index])
    if not any(isinstance(x, fx.Node) for a in args[1:] for sl in (a if isinstance(a, tuple) else (a,))
               if isinstance(sl, slice) for x in (sl.start, sl.stop, sl.step)):
        return importer._getitem(node)
    node.args = (args[0],) + tuple(resolve(a) for a in args[1:])
    base = importer.env[args[0]]
    if isinstance(base, tvm.ir.expr.Constant):  # a baked buffer (BERT's position ids): the importer
        importer.env[args[0]] = importer.block_builder.emit(base)  # slices constants in numpy, by ints only
    try:
        out = importer._getitem(node)
    finally:
        node.args = args
        importer.env[args[0]] = base
    analyzer = _IMPORT["analyzer"]
    tight = _tightened(out.ty, analyzer) if analyzer is not None else None
    if tight is None:  # e.g. [1, min(s, 256)] of a slice by s: under dynamo's bound s <= 256, [1, s]
        return out
    from tvm import relax

    return importer.block_builder.emit(relax.op.reshape(out, relax.ShapeExpr(list(tight.shape.values))))


def _gather_nd(importer, x, indices):
    """x[i0, i1, ...] with index tensors (PyTorch's advanced indexing; the importer takes one):
    the indices broadcast against each other, negative ones count from the end, and the result is
    their broadcast shape followed by x's remaining dims. As one take from x with its indexed dims
    flattened, at the row-major linear index. (transformers' mask functions index position ids by
    batch and query/key aranges this way: GPT-2 ran eagerly.) A tensor whose shape the importer
    lost (an expand by -1 under dynamic=True) is match_cast to fresh symbolic sizes first."""
    import tvm
    from tvm import relax

    bb, k = importer.block_builder, len(indices)
    if not isinstance(x.ty, relax.TensorType) or x.ty.ndim < 0 or k > x.ty.ndim:
        raise NotImplementedError(f"advanced indexing of a tensor of rank {x.ty.ndim} (shape {x.ty.shape}) "
                                  f"by {k} index tensors")
    if x.ty.shape is None:  # its sizes bound at run time to fresh symbolic vars
        x = bb.match_cast(x, relax.TensorType([tvm.tirx.Var(f"indexed_dim{d}", "int64") for d in range(x.ty.ndim)],
                                              x.ty.dtype))
    shape = list(x.ty.shape.values)

    def size(d):  # dim d as an int64 scalar tensor
        if isinstance(shape[d], tvm.tirx.IntImm):
            return relax.const(int(shape[d]), "int64")
        return bb.emit(relax.op.reshape(relax.op.shape_to_tensor(relax.ShapeExpr([shape[d]])), ()))

    linear = None
    for d, idx in enumerate(indices):
        if not str(idx.ty.dtype).startswith("int"):
            raise NotImplementedError(f"advanced indexing by a {idx.ty.dtype} tensor (a mask)")
        idx, n = relax.op.astype(idx, "int64"), size(d)
        idx = bb.emit(relax.op.where(relax.op.less(idx, relax.const(0, "int64")), relax.op.add(idx, n), idx))
        linear = idx if linear is None else bb.emit(relax.op.add(relax.op.multiply(linear, n), idx))
    flat = 1
    for d in shape[:k]:
        flat = flat * d
    rows = bb.emit(relax.op.reshape(x, relax.ShapeExpr([flat] + shape[k:])))
    return bb.emit(relax.op.take(rows, linear, axis=0))


def _gather(node, importer):
    """torch.gather(x, dim=, index=) with keyword arguments (TVM's FX importer reads them by position)."""
    from tvm import relax

    args, kw = node.args, node.kwargs
    dim = args[1] if len(args) > 1 else kw.get("dim", 0)
    index = args[2] if len(args) > 2 else kw["index"]
    return importer.block_builder.emit(relax.op.gather_elements(importer.env[args[0]], importer.env[index], axis=dim))


def _arg(node, i, name, default=None):
    """Argument `name` of a call_function node, by position `i` or keyword."""
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def _batch_norm(node, importer):
    """F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps) in
    inference (TVM's FX importer has only the nn.BatchNorm2d module form; dynamo captures the
    function, so ResNet and MobileNet ran eagerly): nn.batch_norm on the running statistics, which
    FoldBatchNorm then folds into the conv before it. Training-mode batch norm (batch statistics,
    running stats updated in place) is not a pure function: NotImplementedError, the graph runs
    eagerly."""
    from tvm import relax

    if _arg(node, 5, "training", False):
        raise NotImplementedError("F.batch_norm with training=True (batch statistics; call model.eval() "
                                  "for inference)")
    x = importer.env[node.args[0]]
    mean, var = (importer.env[_arg(node, i, k)] for i, k in ((1, "running_mean"), (2, "running_var")))
    if mean is None or var is None:
        raise NotImplementedError("F.batch_norm without running statistics")
    channels, dtype = x.ty.shape.values[1], x.ty.dtype
    weight, bias = _arg(node, 3, "weight"), _arg(node, 4, "bias")
    gamma = importer.env[weight] if weight is not None else relax.op.ones(relax.ShapeExpr([channels]), dtype)
    beta = importer.env[bias] if bias is not None else relax.op.zeros(relax.ShapeExpr([channels]), dtype)
    out = importer.block_builder.emit(relax.op.nn.batch_norm(x, gamma, beta, mean, var, axis=1,
                                                            epsilon=float(_arg(node, 7, "eps", 1e-5))))
    return importer.block_builder.emit(relax.TupleGetItem(out, 0))


def _filled(value, method=False):
    """torch.zeros / torch.ones(*size, dtype=) as functions (TVM's FX importer has zeros_like and
    new_zeros only; GPT-2 makes a scalar zero this way) and x.new_ones(size, dtype=) (the importer's
    ignores dtype: transformers' bool masks came out int64)."""

    def convert(node, importer=None):
        import torch
        from torch import fx
        from tvm import relax

        importer = importer or _IMPORT["importer"]
        args = node.args[1:] if method else node.args
        size = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)) else args
        dims = [importer.env[d] if isinstance(d, fx.Node) else int(d) for d in size]  # a size node: its PrimExpr
        dtype = node.kwargs.get("dtype")
        if dtype is None:
            dtype = importer.env[node.args[0]].ty.dtype if method else str(torch.get_default_dtype())
        dtype = str(dtype).replace("torch.", "")
        return importer.block_builder.emit(relax.op.full(relax.ShapeExpr(dims), relax.const(value, dtype), dtype))

    return convert


def _diff(node, importer):
    """torch.diff(x, n=1, dim=-1, prepend=, append=): x[1:] - x[:-1] along dim, after concatenating
    prepend and append (GPT-2 finds where position ids restart this way). n > 1 runs eagerly.
    With one prepended element (GPT-2's form) it is x - concat(p, x[:-1]): no slice of a tensor
    whose length is an expression (s + 1), which a dynamic build's kernels could not bind."""
    import tvm
    from tvm import relax

    if _arg(node, 1, "n", 1) != 1:
        raise NotImplementedError("torch.diff with n > 1")
    bb = importer.block_builder
    x = importer.env[node.args[0]]
    dim = _arg(node, 2, "dim", -1) % x.ty.ndim
    prepend, append = (_arg(node, i, k) for i, k in ((3, "prepend"), (4, "append")))
    prepend, append = (importer.env[a] if a is not None else None for a in (prepend, append))

    def cut(t, begin, end):  # in bounds by construction: assume_inbound keeps a symbolic length
        return bb.emit(relax.op.strided_slice(t, axes=[dim], begin=[begin], end=[end], assume_inbound=True))

    n = x.ty.shape.values[dim]
    if prepend is not None and append is None and prepend.ty.shape is not None and \
            isinstance(prepend.ty.shape.values[dim], tvm.tirx.IntImm) and int(prepend.ty.shape.values[dim]) == 1:
        return bb.emit(relax.op.subtract(x, bb.emit(relax.op.concat([prepend, cut(x, 0, n - 1)], axis=dim))))
    parts = [t for t in (prepend, x, append) if t is not None]
    if len(parts) > 1:
        x = bb.emit(relax.op.concat(parts, axis=dim))
        n = x.ty.shape.values[dim]
    return bb.emit(relax.op.subtract(cut(x, 1, n), cut(x, 0, n - 1)))


def _where(node, importer):
    """torch.where(cond, x, y) with a Python scalar for x or y (transformers' masks fill with the
    dtype's minimum this way; the importer looks every operand up as a node). A scalar takes the
    dtype of the tensor operand. The one-argument form (nonzero) stays the importer's."""
    from torch import fx
    from tvm import relax

    if len(node.args) != 3 or all(isinstance(a, fx.Node) for a in node.args[1:]):
        return importer._where(node)
    cond = importer.env[node.args[0]]
    tensors = [importer.env[a] for a in node.args[1:] if isinstance(a, fx.Node)]
    dtype = tensors[0].ty.dtype if tensors else "float32"
    x, y = (importer.env[a] if isinstance(a, fx.Node) else relax.const(a, dtype) for a in node.args[1:])
    return importer.block_builder.emit(relax.op.where(cond, x, y))


def _hardtanh(node, importer=None):
    """F.hardtanh(x, min_val, max_val) and nn.ReLU6 as dynamo captures them (hardtanh(x, 0, 6)).
    TVM 0.27's importer reads the bounds from keywords only, so positional bounds became -1 and 1:
    a silently wrong MobileNetV2 (max error 0.19 on its logits)."""
    from tvm import relax

    importer = importer or _IMPORT["importer"]
    lo, hi = float(_arg(node, 1, "min_val", -1.0)), float(_arg(node, 2, "max_val", 1.0))
    return importer.block_builder.emit(relax.op.clip(importer.env[node.args[0]], lo, hi))


def _cumsum(node, importer=None):
    """x.cumsum(dim, dtype=) / torch.cumsum: an integer or bool x sums in int64, as in PyTorch (the
    importer keeps bool, which LLVM cannot add: GPT-2's packed-sequence mask)."""
    from tvm import relax

    importer = importer or _IMPORT["importer"]
    x = importer.env[node.args[0]]
    dim = _arg(node, 1, "dim")
    dtype = node.kwargs.get("dtype")
    if dtype is not None:
        dtype = str(dtype).replace("torch.", "")
    elif not str(x.ty.dtype).startswith(("float", "bfloat")):
        dtype = "int64"
    if dtype is not None and dtype != str(x.ty.dtype):
        x = importer.block_builder.emit(relax.op.astype(x, dtype))
    return importer.block_builder.emit(relax.op.cumsum(x, axis=dim))


def _size_list(node, importer):
    """torch.Size([1, s, 768]) as dynamo writes a view's shape under dynamic=True: the list of its
    sizes (ints and the TIR expressions of size nodes), which the importer's view reads."""
    from torch import fx

    dims = node.args[0] if node.args else []
    return [importer.env[d] if isinstance(d, fx.Node) else d for d in dims]


def _sym_sqrt(node, importer):
    """math.sqrt of a number dynamo traced symbolically (GPT-2's GELU: sqrt(2 / pi), with pi lifted
    to an input that the backend bakes back in): the number's square root, or relax sqrt of a
    scalar tensor."""
    import math

    from tvm import relax

    x = importer.env[node.args[0]] if not isinstance(node.args[0], (int, float)) else node.args[0]
    if isinstance(x, (int, float)):
        return math.sqrt(x)
    return importer.block_builder.emit(relax.op.sqrt(x))


def _no_op(node, importer):
    """A call made only for its side effect on PyTorch's side (torch._C._log_api_usage_once, which
    transformers' Llama calls while it builds the mask): nothing to compute."""
    return None


_CONVERTERS = {"embedding": _embedding, "_log_api_usage_once": _no_op, "tvmfuse_size": _size, "getitem": _getitem, "gather": _gather,
               "batch_norm": _batch_norm,
               "zeros": _filled(0), "ones": _filled(1), "new_ones": _filled(1, method=True),
               "cumsum": _cumsum, "hardtanh": _hardtanh, "Size": _size_list, "_sym_sqrt": _sym_sqrt, "diff": _diff, "where": _where}


def _size_sources(gm, drop) -> dict:
    """{SymInt placeholder name: (tensor placeholder name, dim)} for each size input the graph
    computes with (transformers' BERT views and slices by the sequence length): a tensor input whose
    shape has that symbol gives it (`x.size(dim)`, which the frontend turns into the same TIR var).
    NotImplementedError (the graph runs eagerly) for a size no tensor input carries."""
    import torch

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


def _ranges(example_inputs, info) -> dict:
    """{symbol: (min, max)} of the graph's symbolic sizes, from dynamo's shape environment (its
    guards bound them: BERT's sequence to its position table); finite bounds only."""
    import torch

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


def _without_size_inputs(gm, drop, scalars, sizes=None, frozen=None):
    """A copy of the graph (dynamo still calls with every input) without its SymInt inputs (each one
    the graph reads is replaced by `x.size(dim)` of a tensor input with that size: `sizes`, from
    _size_sources), with each lifted float baked in as the constant it is now, and each parameter in
    `frozen` ({placeholder name: tensor}) an attribute of the copy, which the importer makes a
    constant (folded and pre-packed at build instead of copied in on every call)."""
    import copy

    import torch

    graph = copy.deepcopy(gm.graph)
    placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    for k, name in enumerate(frozen or {}):
        with graph.inserting_before(placeholders[name]):
            attr = graph.get_attr(f"_tvmfuse_frozen_{k}")
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
    root.update({f"_tvmfuse_frozen_{k}": t for k, t in enumerate(frozen.values())})
    return torch.fx.GraphModule(root, graph)


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
