"""The converters that bridge gaps of TVM's FX importer (`CONVERTERS`, its custom_convert_map),
for the graphs dynamo captures from real models (the torch.compile backend, frontends/torch_backend.py):
F.embedding as a function, torch.gather with keyword arguments, slices bounded by a symbolic size,
F.batch_norm as a function (ResNet, MobileNet), F.hardtanh with positional bounds (ReLU6: the
importer took them as -1 and 1, a wrong answer), torch.zeros, torch.diff, torch.where with a
scalar, x.new_ones with a dtype, cumsum of a bool and indexing by several tensors (GPT-2), and
add / sub / rsub with alpha (torch_fixes.py: the importer dropped it).
Each converter takes (node, importer) and returns the Relax expression of the node; one that
raises NotImplementedError leaves the graph to eager PyTorch.
"""
from __future__ import annotations

import contextlib
import math

import torch
import tvm
from torch import fx
from tvm import relax

from .tighten_shapes import _tightened
from .torch_fixes import FIXES as ALPHA_FIXES


# the import in progress (under GRAPH_LOCK): its symbols' ranges, and the importer (TVM's FX importer
# calls a converter of a method, x.new_ones(...), without the importer it passes to functions)
_IMPORT = {"analyzer": None, "importer": None}


@contextlib.contextmanager
def importing(importer, analyzer):
    """The import in progress (call under GRAPH_LOCK: the state is this import's alone): `importer`
    for the method converters, `analyzer` (symbolic sizes bound to their ranges, or None) for
    _getitem."""
    _IMPORT["importer"], _IMPORT["analyzer"] = importer, analyzer
    try:
        yield
    finally:
        _IMPORT["analyzer"] = _IMPORT["importer"] = None


def _embedding(node, importer):
    """F.embedding(ids, weight, ...) as dynamo captures it (a call_function; TVM's FX importer has
    only the nn.Embedding module form): a take of the weight rows, as that form lowers. Also
    torch.embedding(weight, ids), the same name with the operands the other way round."""
    if node.target is torch.nn.functional.embedding:
        ids, weight = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs["weight"]
        max_norm = node.args[3] if len(node.args) > 3 else node.kwargs.get("max_norm")
        if max_norm is not None:  # renormalizes the weight rows in place: not a pure lookup
            raise NotImplementedError("F.embedding with max_norm (it rewrites the weights in place)")
    else:
        weight, ids = node.args[0], node.args[1]
    return importer._embedding_impl(importer.env[ids], importer.env[weight])


def _size(node, importer):
    """The size as the TIR expression of the tensor's shape (a symbolic var for a dynamic dim;
    TVM's FX importer's own `size` takes only constant sizes)."""
    return importer.shape_of(importer.env[node.args[0]])[node.args[1]]


def _getitem(node, importer):
    """x[..., a:b] whose bounds are sizes (BERT's position_ids[:, :seq]): TVM's FX importer reads a
    slice's bounds as constants, so the size nodes inside slices are resolved to their TIR
    expressions first; x[i0, i1] by several index tensors goes to _gather_nd; everything else is
    the importer's own getitem."""

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

    return importer.block_builder.emit(relax.op.reshape(out, relax.ShapeExpr(list(tight.shape.values))))


def _gather_nd(importer, x, indices):
    """x[i0, i1, ...] with index tensors (PyTorch's advanced indexing; the importer takes one):
    the indices broadcast against each other, negative ones count from the end, and the result is
    their broadcast shape followed by x's remaining dims. As one take from x with its indexed dims
    flattened, at the row-major linear index. (transformers' mask functions index position ids by
    batch and query/key aranges this way: GPT-2 ran eagerly.) A tensor whose shape the importer
    lost (an expand by -1 under dynamic=True) is match_cast to fresh symbolic sizes first."""
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
    importer = importer or _IMPORT["importer"]
    lo, hi = float(_arg(node, 1, "min_val", -1.0)), float(_arg(node, 2, "max_val", 1.0))
    return importer.block_builder.emit(relax.op.clip(importer.env[node.args[0]], lo, hi))


def _cumsum(node, importer=None):
    """x.cumsum(dim, dtype=) / torch.cumsum: an integer or bool x sums in int64, as in PyTorch (the
    importer keeps bool, which LLVM cannot add: GPT-2's packed-sequence mask)."""
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
    dims = node.args[0] if node.args else []
    return [importer.env[d] if isinstance(d, fx.Node) else d for d in dims]


def _sym_sqrt(node, importer):
    """math.sqrt of a number dynamo traced symbolically (GPT-2's GELU: sqrt(2 / pi), with pi lifted
    to an input that the backend bakes back in): the number's square root, or relax sqrt of a
    scalar tensor."""
    x = importer.env[node.args[0]] if not isinstance(node.args[0], (int, float)) else node.args[0]
    if isinstance(x, (int, float)):
        return math.sqrt(x)
    return importer.block_builder.emit(relax.op.sqrt(x))


def _no_op(node, importer):
    """A call made only for its side effect on PyTorch's side (torch._C._log_api_usage_once, which
    transformers' Llama calls while it builds the mask): nothing to compute."""
    return None


def _fx_fix(fix):
    """A torch_fixes converter for the FX importer, which calls a method's converter (x.add(y,
    alpha=2)) without the importer."""
    def convert(node, importer=None):
        return fix(node, importer or _IMPORT["importer"])

    return convert


CONVERTERS = {"embedding": _embedding, "_log_api_usage_once": _no_op, "tvmfuse_size": _size, "getitem": _getitem,
              "gather": _gather, "batch_norm": _batch_norm,
              "zeros": _filled(0), "ones": _filled(1), "new_ones": _filled(1, method=True),
              "cumsum": _cumsum, "hardtanh": _hardtanh, "Size": _size_list, "_sym_sqrt": _sym_sqrt, "diff": _diff,
              "where": _where,
              # alpha of add / sub / rsub, dropped by TVM's FX importer as by its ATen one (torch_fixes.py)
              "add": _fx_fix(ALPHA_FIXES["add.Tensor"]), "sub": _fx_fix(ALPHA_FIXES["sub.Tensor"]),
              "rsub": _fx_fix(ALPHA_FIXES["rsub.Tensor"])}
