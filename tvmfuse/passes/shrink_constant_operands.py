"""ShrinkConstantOperands: a constant operand of an elementwise op is kept no larger than it has to be.

Contract. In every Relax function, for `y = op(x, c)` or `y = op(c, x)` with op add, subtract,
multiply or divide, `c` a float tensor Constant and `x` any other expression with y's shape and
dtype (so `c` only broadcasts into `x`, it never widens the result):
  - an identity constant is dropped: `x + 0`, `0 + x`, `x - 0`, `x * 1`, `1 * x` and `x / 1` are
    `x` (only `-0.0 + 0.0` changes, to `+0.0`; NaN and infinities pass through unchanged);
  - otherwise every axis along which `c` holds the same value throughout is cut to extent 1 (the
    rank is kept): the op broadcasts it back, so every element of y is the same product or sum as
    before, and the kernel reads the smaller constant as a broadcast.
Nothing else changes.

Why: transformers materializes BERT's attention mask as a [1, 1, Sq, Sk] tensor. Without an
attention_mask input it folds to a constant of zeros. The flash-attention kernel keeps the query rows
in its vector lanes, so a [Sq, Sk] mask is a gather per score vector: 0.061 of BERT-base's 0.369
ms per attention layer (znver4). A row-invariant mask (one padding mask for every query row)
becomes [.., 1, Sk], read as one broadcast per key.

Must not fire: a non-constant operand on both sides, a constant that widens the result (`x` of
[1, 4] plus a [3, 4] constant), a non-float constant, a constant with no uniform axis, `0 - x`
or `1 / x`. Runs for every variant and target alike (pipeline.constant_passes).
"""
from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relax

from ..relax_utils import rewrite_relax_functions, static_shape

log = logging.getLogger("tvmfuse.passes")

_OPS = {"relax.add", "relax.subtract", "relax.multiply", "relax.divide"}
# which side may be an identity constant, and its value: add 0 either side, x - 0, mul 1 either side, x / 1
_IDENTITY = {"relax.add": (0.0, (0, 1)), "relax.subtract": (0.0, (1,)), "relax.multiply": (1.0, (0, 1)),
             "relax.divide": (1.0, (1,))}


def _shrunk(value: np.ndarray) -> np.ndarray:
    """`value` with each axis along which it is uniform cut to extent 1."""
    for axis in range(value.ndim):
        if value.shape[axis] > 1:
            first = np.take(value, [0], axis=axis)
            if np.array_equal(value, np.broadcast_to(first, value.shape)):
                value = first
    return value


@relax.expr_functor.mutator
class _Shrink(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.changed = 0

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name in _OPS and len(call.args) == 2):
            return call
        sides = [i for i, a in enumerate(call.args) if isinstance(a, tvm.ir.expr.Constant)]
        if len(sides) != 1:
            return call
        ci = sides[0]
        const, other = call.args[ci], call.args[1 - ci]
        out_shape, other_shape = static_shape(call.ty), static_shape(other.ty)
        if out_shape is None or other_shape != out_shape or str(other.ty.dtype) != str(call.ty.dtype):
            return call  # the constant widens the result, or a symbolic / non-tensor operand
        value = const.value.numpy()
        if value.dtype.kind != "f":
            return call
        ident, allowed = _IDENTITY[call.op.name]
        if ci in allowed and value.size and np.all(value == ident):
            self.changed += 1
            log.debug("ShrinkConstantOperands: %s with a constant of %s dropped", call.op.name, ident)
            return other
        small = _shrunk(value)
        if small.shape == value.shape:
            return call
        self.changed += 1
        log.debug("ShrinkConstantOperands: %s constant %s -> %s", call.op.name, value.shape, small.shape)
        c = relax.const(np.ascontiguousarray(small), str(value.dtype))
        args = [c, other] if ci == 0 else [other, c]
        return relax.Call(call.op, args, call.attrs)


@tvm.transform.module_pass(opt_level=0, name="tvmfuse.ShrinkConstantOperands")
def ShrinkConstantOperands(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 (a pass, named like TVM's)
    shrink = _Shrink(mod)
    out = rewrite_relax_functions(mod, shrink, lambda: shrink.changed)
    return mod if out is None else relax.transform.CanonicalizeBindings()(relax.transform.Normalize()(out))
