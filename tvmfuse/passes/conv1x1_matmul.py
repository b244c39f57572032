"""Conv1x1AsMatmul: a 1x1 conv2d on a small feature map becomes a matmul with pixels as rows.

Contract. In every Relax function, a binding `y = conv2d(x, W)` is rewritten when it is legal
(`_legal`: NCHW / OIHW / NCHW, a 1x1 kernel, groups 1, no padding, static C, H, W and O, a float
dtype and no out_dtype change) and profitable on the target (`_profitable`), into

  xs = x[:, :, ::sh, ::sw]                        (only when strided)
  a  = permute_dims(reshape(xs, [N, C, Ho*Wo]), [0, 2, 1])     # [N, P, C]: a pixel per row
  m  = matmul(a, Wt)                                           # Wt = W as [C, O]
  y  = reshape(permute_dims(m, [0, 2, 1]), [N, O, Ho, Wo])

which is the same sum over C, term for term (no reassociation). A constant W is transposed here,
at build time, so the matmul's weight is a constant [K, N] that PrepackWeights packs into the
micro-kernel's panels; a non-constant W gets a permute_dims that the fusion planner takes like any
layout op. Everything after the conv (bias, relu, a residual) reads `y` as before.

Why: the direct conv (schedules/cpu/conv.py) tiles each output row by `conv_columns` pixels, so a
7-wide row (ResNet-50's layer 4) fills 7 of 12 slots on AVX2 (7 of 8 on AVX-512: it stays); the matmul
tiles all Ho*Wo pixels of a map by `mm_rows` and vectorizes over output channels, which are a
multiple of the vector in these models. Profitability compares the two tiles' fill: the rewrite
happens when the conv's fill is under `conv1x1_matmul_fill` (targets.py) and below the matmul's.
Measured on an AMD EPYC (AVX2), 1x1 convs of ResNet-50 at 7x7: 71-107 GFLOP/s as convs, 111-147
as matmuls; at 14x14 (fill 0.78) the conv was as fast or faster, so it stays.

Must not fire: a padded, grouped or non-NCHW conv, a kernel larger than 1x1, a symbolic C/H/W/O,
an int or mixed dtype, and any conv whose row fill is good enough. Each rewrite and each
profitable-shape refusal is logged on `tvmfuse.fusion`. llvm targets only (pipeline.py).
"""
from __future__ import annotations

import logging
import math

import numpy as np
import tvm
from tvm import relax

from ..relax_utils import dense_nchw_conv_reason, float_conv_operands, rewrite_op_calls

log = logging.getLogger("tvmfuse.fusion")


def _legal(call):
    """(N expr, C, H, W, O, stride) when `call` is a 1x1 conv this pass can rewrite, else a reason."""
    a = call.attrs
    why = dense_nchw_conv_reason(call)
    if why:
        return why
    if any(int(p) != 0 for p in a.padding):
        return f"padding {[int(p) for p in a.padding]}"
    operands = float_conv_operands(call, 4)
    if isinstance(operands, str):
        return operands
    xs, ws, chw = operands
    if ws[2:] != [1, 1]:
        return f"a {ws[2]}x{ws[3]} kernel"
    c, h, wd = chw
    return xs[0], c, h, wd, ws[0], (int(a.strides[0]), int(a.strides[1]))


def fill(extent: int, tile: int) -> float:
    """The share of a tile loop's slots that hold real points: extent / (tile x tiles)."""
    return extent / (tile * math.ceil(extent / tile))


def _profitable(ho: int, wo: int, table) -> str | None:
    """None when the matmul form wins on this target, else why the conv stays."""
    conv = fill(wo, table["conv_columns"])
    mm = fill(ho * wo, table["mm_rows"])
    if conv >= table["conv1x1_matmul_fill"] / 100:
        return f"the conv tile fills {conv:.2f} of its {table['conv_columns']} columns at width {wo}"
    if mm <= conv:
        return f"the matmul's rows fill {mm:.2f} <= the conv's {conv:.2f}"
    return None


def _rewrite(table):
    """rewrite(call, builder) for relax_utils.rewrite_op_calls: the matmul form, or None."""

    def rewrite(call, builder):
        legal = _legal(call)
        if isinstance(legal, str):
            return None
        n, c, h, w, o, (sh, sw) = legal
        ho, wo = (h - 1) // sh + 1, (w - 1) // sw + 1
        why = _profitable(ho, wo, table)
        if why:
            log.info("conv2d %dx%dx%d -> %d (1x1/%d) stays a conv: %s", c, h, w, o, sh, why)
            return None
        x, wt = call.args
        emit = builder.emit
        if (sh, sw) != (1, 1):
            x = emit(relax.op.strided_slice(x, axes=[2, 3], begin=[0, 0], end=[h, w], strides=[sh, sw]))
        a = emit(relax.op.permute_dims(relax.op.reshape(x, relax.ShapeExpr([n, c, ho * wo])), [0, 2, 1]))
        if isinstance(wt, tvm.ir.expr.Constant):
            w2 = relax.const(np.ascontiguousarray(wt.value.numpy().reshape(o, c).T))
        else:
            w2 = emit(relax.op.permute_dims(relax.op.reshape(wt, (o, c)), [1, 0]))
        m = emit(relax.op.matmul(a, w2))
        log.info("conv2d %dx%dx%d -> %d (1x1/%d) as a matmul: %d pixels x %d channels", c, h, w, o, sh,
                 ho * wo, o)
        return relax.op.reshape(relax.op.permute_dims(m, [0, 2, 1]), relax.ShapeExpr([n, o, ho, wo]))

    return rewrite


def conv1x1_as_matmul(table):
    """The pass for a CPU constants table (schedules/targets.cpu_table of the build's target)."""

    @tvm.transform.module_pass(opt_level=0, name="tvmfuse.Conv1x1AsMatmul")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return rewrite_op_calls(mod, "relax.nn.conv2d", _rewrite(table))

    return _pass
