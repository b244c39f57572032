"""FoldBatchNorm: fold inference BatchNorm (and any per-channel affine chain) into the weights and
bias of the conv2d or matmul before it, at build time.

Runs on high-level Relax (after the importers' DecomposeOpsForInference, before fusion), for every
fusion variant alike. In a dataflow block it follows, from `y = conv2d(x, W)` (NCHW / OIHW) or
`y = matmul(x, W)` (W of shape [K, N]) with a constant W, the chain of bindings
`y' = op(y, c)` where op is add, subtract, multiply or divide and c is a constant that varies only
along the output channel (axis 1 of the conv, the last axis of the matmul). Each link is absorbed:

  multiply / divide by s   W <- W * s (W / s) per output channel, bias <- bias * s (bias / s)
  add / subtract c         bias <- bias + c (bias - c)

and the chain becomes `conv2d(x, W') + bias'` (or just `conv2d(x, W')`). This is exact algebra;
only the rounding of the products changes, as with any reassociation.

Must not fire (each link is checked): a non-constant operand (training statistics, a residual), a
constant that varies along another axis, an intermediate that has another use (a graph output or a
second consumer: folding would need the unfolded value too), a divide by a zero or non-finite
value, a result whose shape or dtype differs from the conv's (a broadcast that grows it).
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

_AFFINE = {"relax.add", "relax.subtract", "relax.multiply", "relax.divide"}


def _const(expr):
    return expr.value.numpy() if isinstance(expr, tvm.ir.expr.Constant) and hasattr(expr.value, "numpy") else None


def _anchor(call):
    """(channel axis of the output, weight array) when `call` is a conv2d / matmul with a constant
    weight in a layout this pass knows; else None."""
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op) or len(call.args) != 2:
        return None
    w = _const(call.args[1])
    if w is None or not np.issubdtype(w.dtype, np.floating):
        return None
    if call.op.name == "relax.nn.conv2d":
        a = call.attrs
        if a.data_layout != "NCHW" or a.kernel_layout != "OIHW" or a.out_layout != "NCHW":
            return None
        return 1, w
    if call.op.name == "relax.matmul" and w.ndim == 2:
        return -1, w
    return None


def _per_channel(c, out_shape, axis):
    """The constant as a vector over the output channels, or None when it varies elsewhere."""
    if c is None or c.ndim > len(out_shape):
        return None
    full = (1,) * (len(out_shape) - c.ndim) + c.shape
    ax = axis % len(out_shape)
    if any(d != 1 for i, d in enumerate(full) if i != ax) or full[ax] not in (1, out_shape[ax]):
        return None
    return np.broadcast_to(c.reshape(-1), (out_shape[ax],)).astype(c.dtype)


class _Chain:
    def __init__(self, pos, call, axis, w):
        self.first, self.last, self.call, self.axis = pos, pos, call, axis
        self.positions = [pos]  # the anchor's and the absorbed links' bindings (others in between stay)
        self.w, self.bias = w.astype(w.dtype, copy=True), None
        self.links, self.scaled = 0, False

    def absorb(self, op, c):
        if not self._absorb(op, c):
            return False
        self.links += 1
        self.scaled |= op in ("relax.multiply", "relax.divide")
        return True

    def _absorb(self, op, c):
        if op in ("relax.multiply", "relax.divide"):
            if op == "relax.divide" and not (np.all(np.isfinite(c)) and np.all(c != 0)):
                return False
            s = c if op == "relax.multiply" else (1 / c).astype(c.dtype)
            shape = (-1,) + (1,) * (self.w.ndim - 1) if self.axis == 1 else (1, -1)
            self.w = (self.w * s.reshape(shape)).astype(self.w.dtype)
            self.bias = None if self.bias is None else (self.bias * s).astype(self.w.dtype)
        else:
            b = self.bias if self.bias is not None else np.zeros_like(c)
            self.bias = (b + c if op == "relax.add" else b - c).astype(self.w.dtype)
        return True


def _uses(block, outputs):
    n = {}
    for bd in block.bindings:
        for v in relax.analysis.free_vars(bd.value):
            n[v] = n.get(v, 0) + 1
    for v in outputs:
        n[v] = n.get(v, 0) + 1
    return n


def _fold_block(block, outputs):
    uses = _uses(block, outputs)
    chains, at = [], {}  # at: var -> the chain whose current end it is
    for pos, bd in enumerate(block.bindings):
        val = bd.value
        anchor = _anchor(val)
        if anchor is not None and isinstance(bd.var.ty, relax.TensorType):
            at[bd.var] = _Chain(pos, val, *anchor)
            chains.append(at[bd.var])
            continue
        if not (isinstance(val, relax.Call) and isinstance(val.op, tvm.ir.Op) and val.op.name in _AFFINE):
            continue
        lhs, rhs = val.args
        chain = at.get(lhs)
        if chain is None or uses.get(lhs, 0) != 1 or chain.last != _pos_of(block, lhs):
            continue
        out_ty, anchor_ty = bd.var.ty, block.bindings[chain.first].var.ty
        if not _same_type(out_ty, anchor_ty):
            continue
        c = _per_channel(_const(rhs), [int(d) for d in anchor_ty.shape.values], chain.axis)
        if c is None or c.dtype != chain.w.dtype or not chain.absorb(val.op.name, c):
            continue
        del at[lhs]
        chain.last = pos
        chain.positions.append(pos)
        at[bd.var] = chain
    # a lone bias add is what the rewrite would emit again: only chains that save an op change
    folded = [ch for ch in chains if ch.links >= 2 or ch.scaled]
    if not folded:
        return block
    return relax.DataflowBlock(_rewrite(block, folded))


def _pos_of(block, var):
    for pos, bd in enumerate(block.bindings):
        if bd.var.same_as(var):
            return pos
    return -1


def _same_type(a, b):
    if not (isinstance(a, relax.TensorType) and isinstance(b, relax.TensorType)) or a.dtype != b.dtype:
        return False
    try:
        return [int(d) for d in a.shape.values] == [int(d) for d in b.shape.values]
    except (TypeError, AttributeError):
        return False


def _rewrite(block, folded):
    drop = {p for ch in folded for p in ch.positions}
    at_end = {ch.last: ch for ch in folded}
    out = []
    for pos, bd in enumerate(block.bindings):
        if pos not in drop:
            out.append(bd)
            continue
        ch = at_end.get(pos)
        if ch is None:
            continue  # an absorbed link (or the anchor, re-emitted at the chain's end)
        anchor_var = block.bindings[ch.first].var
        call = relax.Call(ch.call.op, [ch.call.args[0], relax.const(ch.w)], ch.call.attrs)
        if ch.bias is None:
            out.append(relax.VarBinding(bd.var, call))
            continue
        tmp = relax.DataflowVar(anchor_var.name, anchor_var.ty)
        shape = (1, -1) + (1,) * (len(anchor_var.ty.shape.values) - 2) if ch.axis == 1 else (-1,)
        out.append(relax.VarBinding(tmp, call))
        out.append(relax.VarBinding(bd.var, relax.op.add(tmp, relax.const(ch.bias.reshape(shape)))))
    return out


@tvm.transform.module_pass(opt_level=0, name="tvmfuse.FoldBatchNorm")
def FoldBatchNorm(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    out = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        body = func.body
        outputs = set(relax.analysis.free_vars(body.body))
        blocks = list(body.blocks)
        new = []
        for i, blk in enumerate(blocks):
            if isinstance(blk, relax.DataflowBlock):
                later = {v for other in blocks[i + 1:] for bd in other.bindings
                         for v in relax.analysis.free_vars(bd.value)}
                blk = _fold_block(blk, outputs | later)
            new.append(blk)
        out[gv] = relax.Function(func.params, relax.SeqExpr(new, body.body), func.ret_ty, func.is_pure,
                                 func.attrs, func.span)
    if not out:
        return mod
    mod = tvm.IRModule({**dict(mod.functions_items()), **out}, attrs=mod.attrs)
    return relax.transform.Normalize()(mod)
