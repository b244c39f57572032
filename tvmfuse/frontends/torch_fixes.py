"""Converters for ATen ops TVM 0.27's ExportedProgram importer gets wrong (found by the model suite,
tvmfuse.suite); from_torch.FIXES registers them over TVM's own (signature: fn(node, importer)).

- `div.Tensor` / `div.Scalar` of integer operands: torch's true division promotes to float32 (the
  default dtype); TVM's converter divided in int64 and the next op failed (DeBERTa-v2's log-bucket
  relative positions: `torch.log(abs_pos / mid)` -> "relax.log requires float dtype").
- `index.Tensor` with sliced (None) dimensions and several index tensors: TVM's general case indexes
  the sliced dims with aranges that broadcast against the index tensors (a wrong shape, or "cannot
  broadcast index shapes", ConvBERT's unfold). Here: the indexed dims are moved first
  (permute_dims), `relax.op.index_tensor` indexes them with the index tensors broadcast to one
  shape (right-aligned, as torch does), and the result dims are put where torch puts them: at the
  first indexed dim when the indexed dims are adjacent, else in front.
- `add.Tensor` / `add.Scalar` / `sub.Tensor` / `sub.Scalar` / `rsub.Tensor` / `rsub.Scalar` with
  `alpha` (x + alpha*y, x - alpha*y, y - alpha*x): TVM's converters read the two operands only and
  dropped alpha (`torch.add(x, y, alpha=0.5)` imported as x + y; SGD's weight decay is
  `add(grad, param, alpha=wd)`, AdamW's and SGD's steps `add(param, update, alpha=-lr)`). TVM's
  rsub also made an untyped constant of a Python scalar.
- `copy.default` (functional: the values of `src`, cast to `self`'s dtype and broadcast to its
  shape): TVM's converter is copy_'s, which rebinds `self` in the importer's environment (a later
  reader of `self` got `src`) and failed on a dtype change.
"""
from __future__ import annotations

import operator

_INTEGRAL = ("bool", "int8", "int16", "int32", "int64", "uint8")


def _integral(x) -> bool:
    from tvm import relax

    if isinstance(x, relax.Expr):
        return isinstance(x.ty, relax.TensorType) and x.ty.dtype in _INTEGRAL
    return isinstance(x, (bool, int))


def true_divide(node, importer):
    """aten.div.Tensor / div.Scalar (no rounding mode): integer operands become float32 first."""
    from tvm import relax

    args = importer.retrieve_args(node)
    lhs, rhs = args[0], args[1]
    if not (_integral(lhs) and _integral(rhs)):
        return importer._binary_op(relax.op.divide, operator.truediv)(node)

    def as_float(x):
        if isinstance(x, relax.Expr):
            return importer.block_builder.emit(relax.op.astype(x, "float32"))
        return relax.const(float(x), "float32")

    if not isinstance(lhs, relax.Expr) and not isinstance(rhs, relax.Expr):
        return operator.truediv(lhs, rhs)
    return importer.block_builder.emit(relax.op.divide(as_float(lhs), as_float(rhs)))


def _broadcast(importer, indices):
    """The index tensors reshaped and broadcast to their common (right-aligned) shape."""
    from tvm import relax

    shapes = [list(importer.shape_of(i)) for i in indices]
    nd = max(len(s) for s in shapes)
    shapes = [[1] * (nd - len(s)) + s for s in shapes]
    out = []
    for axis in range(nd):
        dims = [s[axis] for s in shapes]
        big = [d for d in dims if not (hasattr(d, "value") and d.value == 1) and d != 1]
        out.append(big[0] if big else dims[0])
    emit = importer.block_builder.emit
    return [emit(relax.op.broadcast_to(emit(relax.op.reshape(i, s)), out)) for i, s in zip(indices, shapes)]


def index_tensor(node, importer):
    """aten.index.Tensor with torch's semantics (see the module docstring)."""
    from tvm import relax

    args = importer.retrieve_args(node)
    data, indices = args[0], list(args[1])
    picked = [(i, x) for i, x in enumerate(indices) if x is not None]
    if len(picked) < 2 or len(picked) == len(indices):  # TVM's take / index_tensor paths are right
        return importer._index_tensor(node)
    emit = importer.block_builder.emit
    rank = len(importer.shape_of(data))
    axes = [i for i, _ in picked]
    rest = [i for i in range(rank) if i not in axes]
    moved = emit(relax.op.permute_dims(data, axes + rest))
    idx = _broadcast(importer, [x for _, x in picked])
    out = emit(relax.op.index_tensor(moved, idx))
    adjacent = axes == list(range(axes[0], axes[-1] + 1))
    before = sum(1 for i in rest if i < axes[0])
    if not adjacent or before == 0:
        return out
    b = len(importer.shape_of(idx[0]))
    perm = [b + i for i in range(before)] + list(range(b)) + [b + before + j for j in range(len(rest) - before)]
    return emit(relax.op.permute_dims(out, perm))


def _binary(importer, op, pyop, lhs, rhs):
    """op(lhs, rhs) as TVM's _binary_op promotes it: two tensors to their common dtype, a Python
    scalar to the tensor's dtype; two Python scalars computed here."""
    from tvm import relax

    emit = importer.block_builder.emit
    if isinstance(lhs, relax.Expr) and isinstance(rhs, relax.Expr):
        want = importer._promote_common_dtype(lhs.ty.dtype, rhs.ty.dtype)
        if want is not None:
            lhs = lhs if lhs.ty.dtype == want else emit(relax.op.astype(lhs, want))
            rhs = rhs if rhs.ty.dtype == want else emit(relax.op.astype(rhs, want))
        return emit(op(lhs, rhs))
    if isinstance(lhs, relax.Expr):
        return emit(op(lhs, relax.const(rhs, lhs.ty.dtype)))
    if isinstance(rhs, relax.Expr):
        return emit(op(relax.const(lhs, rhs.ty.dtype), rhs))
    return pyop(lhs, rhs)


def _scaled(importer, x, alpha):
    """alpha * x (a tensor or a Python scalar); x itself when alpha is 1."""
    from tvm import relax

    if alpha == 1:
        return x
    if isinstance(x, relax.Expr):
        return importer.block_builder.emit(relax.op.multiply(x, relax.const(alpha, x.ty.dtype)))
    return x * alpha


def _with_alpha(op_name: str, reverse: bool = False):
    """aten.add / sub (x op alpha*y) or rsub (y - alpha*x, `reverse`) with torch's alpha."""
    def convert(node, importer):
        from tvm import relax

        op, pyop = (relax.op.add, operator.add) if op_name == "add" else (relax.op.subtract, operator.sub)
        alpha = node.kwargs.get("alpha", node.args[2] if len(node.args) > 2 else 1)
        if alpha == 1 and not reverse:  # TVM's own (it also takes sizes, SymInt arithmetic)
            return importer._binary_op(op, pyop)(node)
        args = importer.retrieve_args(node)
        x, y = args[0], args[1]
        if reverse:
            return _binary(importer, op, pyop, y, _scaled(importer, x, alpha))
        return _binary(importer, op, pyop, x, _scaled(importer, y, alpha))

    return convert


def functional_copy(node, importer):
    """aten.copy.default(self, src): src's values in self's dtype and shape; self is not rebound."""
    from tvm import relax

    args = importer.retrieve_args(node)
    dest, src = args[0], args[1]
    emit = importer.block_builder.emit
    if not isinstance(src, relax.Expr):
        return emit(relax.op.full(importer.shape_of(dest), relax.const(src, dest.ty.dtype), dest.ty.dtype))
    if src.ty.dtype != dest.ty.dtype:
        src = emit(relax.op.astype(src, dest.ty.dtype))
    if list(importer.shape_of(dest)) != list(importer.shape_of(src)):
        src = emit(relax.op.broadcast_to(src, importer.shape_of(dest)))
    return src


FIXES = {"div.Tensor": true_divide, "div.Scalar": true_divide, "index.Tensor": index_tensor,
         "add.Tensor": _with_alpha("add"), "add.Scalar": _with_alpha("add"),
         "sub.Tensor": _with_alpha("sub"), "sub.Scalar": _with_alpha("sub"),
         "rsub.Tensor": _with_alpha("sub", reverse=True), "rsub.Scalar": _with_alpha("sub", reverse=True),
         "copy.default": functional_copy}
