"""`tvmfuse.classify(mod)`: every op of main -> one op class, with the reason.

Classes, the way the field names them:
  elementwise    same shape in and out, one output element from the same input elements
  broadcast      elementwise with an operand broadcast to a larger shape (bias add)
  injective      layout / data movement only: reshape, transpose, slice, concat (index remapping)
  reduction      sum / mean / max, and ops built on reductions: softmax, layer_norm, rms_norm
  compute-heavy  matmul, conv: reductions whose inputs are re-read many times (the anchors)
  opaque         everything that cannot be composed into TE (external calls, no legalizer)

Built on TVM's AnnotateTIROpPattern over each op's own PrimFunc, refined where it is coarse: it puts
every op with a broadcast operand in kElemWise and calls softmax/layer_norm "out-elementwise-fusable".
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax

from ..relax_utils import dims
from .te_compose import NotComposable, single_op_primfunc

ELEMENTWISE, BROADCAST, INJECTIVE, REDUCTION, COMPUTE, OPAQUE = (
    "elementwise", "broadcast", "injective", "reduction", "compute-heavy", "opaque")
CLASSES = (ELEMENTWISE, BROADCAST, INJECTIVE, REDUCTION, COMPUTE, OPAQUE)

# Ops whose reduction re-reads each input element many times: the compute-heavy anchors.
COMPUTE_OPS = frozenset(
    f"relax.{n}" for n in ("matmul", "nn.conv1d", "nn.conv2d", "nn.conv3d", "nn.conv1d_transpose",
                           "nn.conv2d_transpose", "nn.conv3d_transpose", "nn.attention",
                           "nn.attention_bias", "einsum", "linear"))
# Pure data movement by definition (gathers included: each output element reads one input element).
# TVM's pattern analysis calls a reshape (or take) with a symbolic shape
# opaque (its index arithmetic divides by a symbolic extent); by its op it is injective.
LAYOUT_OPS = frozenset(f"relax.{n}" for n in ("reshape", "permute_dims", "expand_dims", "squeeze", "flatten",
                                               "broadcast_to", "strided_slice", "concat", "split", "take",
                                               "gather_elements", "gather_nd"))
# gathers: one input element per output element at a data-dependent index; TVM calls them opaque
# for their index load (take with mode="fast" or not; gather_elements, BERT's token-type ids)
GATHERS = frozenset(("relax.take", "relax.gather_elements", "relax.gather_nd"))
_PATTERN = {0: "kElemWise", 1: "kBroadcast", 2: "kInjective", 3: "kCommReduce", 4: "kOutEWiseFusable",
            7: "kTuple", 8: "kOpaque"}


@dataclass
class OpInfo:
    var: str
    op: str
    cls: str
    reason: str
    shape: tuple | None
    op_pattern: int | None = None


def op_pattern(call: relax.Call) -> int:
    pf = single_op_primfunc(call)
    mod = relax.transform.AnnotateTIROpPattern()(tvm.IRModule({"f": pf}))
    return int(mod["f"].attrs["op_pattern"])


def classify_call(call: relax.Call) -> tuple[str, str, int | None]:
    """(class, reason, op_pattern) of one op call."""
    try:
        pat = op_pattern(call)
    except NotComposable as err:
        return OPAQUE, str(err), None
    name, tvm_says = call.op.name, _PATTERN.get(pat, str(pat))
    out_shape = dims(call.ty) if isinstance(call.ty, relax.TensorType) else None
    if name in COMPUTE_OPS:
        return COMPUTE, f"{name} re-reads its inputs along a reduction axis (TVM: {tvm_says})", pat
    if pat == 0:
        in_shapes = [dims(a.ty) for a in call.args if isinstance(a.ty, relax.TensorType)]
        bcast = [s for s in in_shapes if s is not None and s != out_shape]
        if bcast:
            return BROADCAST, f"operand of shape {list(bcast[0])} broadcast to {list(out_shape or [])} (TVM: {tvm_says})", pat
        return ELEMENTWISE, f"one output element per input element (TVM: {tvm_says})", pat
    if pat == 1:
        return BROADCAST, f"TVM: {tvm_says}", pat
    if pat == 2 and isinstance(call.ty, relax.TupleType) and call.args and \
            dims(call.ty.fields[0]) == dims(call.args[0].ty):
        return BROADCAST, f"per-channel affine with broadcast operands (TVM: {tvm_says})", pat
    if pat == 2:
        return INJECTIVE, f"data movement only, index remapping (TVM: {tvm_says})", pat
    if pat == 8 and name in GATHERS:
        return INJECTIVE, (f"a gather: one input element per output element at a data-dependent index; "
                           f"TVM says {tvm_says} over its index load"), 2
    if pat == 8 and name in LAYOUT_OPS and out_shape is not None and any(not isinstance(d, int) for d in out_shape):
        return INJECTIVE, (f"data movement only; TVM says {tvm_says} over its symbolic index arithmetic, "
                           "the op is a layout op"), 2
    if pat == 3:
        return REDUCTION, f"commutative reduction (TVM: {tvm_says})", pat
    if pat == 4:
        return REDUCTION, f"built on row reductions; TVM calls it {tvm_says}", pat
    return OPAQUE, f"TVM: {tvm_says}", pat


class Classification:
    def __init__(self, ops):
        self.ops = ops

    def __iter__(self):
        return iter(self.ops)

    def __len__(self):
        return len(self.ops)

    def by_var(self):
        return {o.var: o for o in self.ops}

    def counts(self):
        out = {c: 0 for c in CLASSES}
        for o in self.ops:
            out[o.cls] += 1
        return out

    def __str__(self):
        rows = [("var", "op", "class", "shape", "reason")]
        rows += [(o.var, o.op, o.cls, str(list(o.shape)) if o.shape is not None else "-", o.reason)
                 for o in self.ops]
        w = [max(len(r[i]) for r in rows) for i in range(4)]
        return "\n".join("  ".join(c.ljust(n) for c, n in zip(r[:4], w)) + "  " + r[4] for r in rows)


def op_bindings(func: relax.Function):
    for block in func.body.blocks:
        for bd in block.bindings:
            if isinstance(bd.value, relax.Call) and isinstance(bd.value.op, tvm.ir.Op):
                yield bd


def classify(mod, func_name: str = "main") -> Classification:
    func = mod[func_name] if isinstance(mod, tvm.IRModule) else mod
    ops = []
    for bd in op_bindings(func):
        cls, reason, pat = classify_call(bd.value)
        ops.append(OpInfo(bd.var.name, bd.value.op.name, cls, reason,
                          dims(bd.var.ty) if isinstance(bd.var.ty, relax.TensorType) else None, pat))
    return Classification(ops)
