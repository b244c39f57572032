"""Conv1dAsMatmul: a conv1d becomes an im2col kernel and a (batch) matmul.

Contract. In every Relax function, a binding `y = conv1d(x, W)` is rewritten when it is legal
(`_legal`: NCW / OIW / NCW, static C, L, O and kernel width, a float dtype and no out_dtype
change) and profitable (`_profitable`), into

  col = call_tir(im2col, [x])        # [N, Lo, C*K] (groups 1) or [N, G, Lo, Cg*K]: one TE kernel,
                                     # col[.., lo, c*K + k] = x[.., c, lo*s + k*d - pad] (0 outside)
  m   = matmul(col, Wt)              # Wt = W as [C*K, O] (or [G, Cg*K, Og]): a constant is
                                     # rearranged here, at build time
  y   = permute_dims(m, ..) (+ reshape for groups)                     # [N, O, Lo] again

which is the same sum over (c, k), term for term; the padding is zeros the
im2col kernel writes, as the conv's padded input held. Everything after the conv (bias, GELU,
a group norm) reads `y` as before, so the matmul's epilogue takes it.

Why: no CPU schedule rule reads a conv1d (schedules/cpu/conv.py wants three spatial axes), so it
ran cpu.Fallback's loop nest at 3-4 GFLOP/s; wav2vec2's and HuBERT's feature encoders
(512 channels over 16000 samples) took 1.6 s of a 1.7 s inference. As a matmul it runs the register
micro-kernel on a prepacked weight; the im2col copy costs K/stride times the input's bytes.

Must not fire: a non-NCW layout, a symbolic channel count, length or kernel, an int or mixed
dtype, a conv with too little to multiply (`_profitable`: a depthwise conv, one output or one
input per group, stays a conv) and one whose im2col would pass MAX_IM2COL_BYTES per sample. The
matmul sums each output's C*K products in its own order (float reassociation only). Each rewrite and each refusal is logged on `tvmfuse.fusion`.
llvm targets only (pipeline.py).
"""
from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relax, te

from ..relax_utils import float_conv_operands, rewrite_op_calls

log = logging.getLogger("tvmfuse.fusion")

MIN_GROUP_WIDTH = 4  # output channels per group (matmul columns) and Cg*K (its reduction) below this stay a conv
MAX_IM2COL_BYTES = 1 << 30  # per sample: a wider im2col (an hour of audio through a 128-wide kernel) stays a conv


def _legal(call):
    """(C, L, O, K, G, stride, dilation, (pad_left, pad_right)) when `call` is a conv1d this pass
    can rewrite, else a reason (str)."""
    a = call.attrs
    if (a.data_layout, a.kernel_layout, a.out_layout) != ("NCW", "OIW", "NCW"):
        return f"layout {a.data_layout}/{a.kernel_layout}/{a.out_layout}, not NCW/OIW/NCW"
    operands = float_conv_operands(call, 3)
    if isinstance(operands, str):
        return operands
    _xs, ws, cl = operands
    g = int(a.groups)
    pad = [int(p) for p in a.padding]
    pad = pad * 2 if len(pad) == 1 else pad
    return cl[0], cl[1], ws[0], ws[2], g, int(a.strides[0]), int(a.dilation[0]), (pad[0], pad[1])


def _profitable(c, o, k, g, lo=0, itemsize=4) -> str | None:
    """None when the matmul form has something to multiply and its im2col fits, else why the conv stays."""
    if lo * c * k * itemsize > MAX_IM2COL_BYTES:
        return f"its im2col would take {lo * c * k * itemsize / 2**30:.1f} GiB per sample"
    if o // g < MIN_GROUP_WIDTH:
        return f"{o // g} output channel(s) per group: a matmul of so few columns is no faster"
    if (c // g) * k < MIN_GROUP_WIDTH:
        return f"a reduction of {(c // g) * k} per output: nothing to multiply"
    return None


def _im2col(x, c, k, g, stride, dilation, pad_left, length, lo):
    """The TE of the im2col kernel: [N, Lo, C*K], or [N, G, Lo, Cg*K] for groups."""
    cg = c // g

    def value(n, grp, l_out, r):
        ch, kk = grp * cg + r // k, r % k
        pos = l_out * stride + kk * dilation - pad_left
        inside = tvm.tirx.all(pos >= 0, pos < length)
        return tvm.tirx.if_then_else(inside, x[n, ch, tvm.te.max(tvm.te.min(pos, length - 1), 0)],
                                     tvm.tirx.const(0, x.dtype))

    n = x.shape[0]
    if g == 1:
        return te.compute((n, lo, cg * k), lambda b, l_out, r: value(b, 0, l_out, r), name="im2col")
    return te.compute((n, g, lo, cg * k), value, name="im2col")


def _weight(wt, o, c, k, g, builder):
    """W [O, Cg, K] as the matmul's right operand: [C*K, O] (groups 1) or [G, Cg*K, Og]."""
    cg, og = c // g, o // g
    if isinstance(wt, tvm.ir.expr.Constant):
        w = wt.value.numpy().reshape(g, og, cg * k).transpose(0, 2, 1)
        return relax.const(np.ascontiguousarray(w[0] if g == 1 else w))
    w = builder.emit(relax.op.reshape(wt, (g, og, cg * k)))
    w = builder.emit(relax.op.permute_dims(w, [0, 2, 1]))
    return builder.emit(relax.op.reshape(w, (cg * k, o))) if g == 1 else w


def _rewrite(call, builder):
    """rewrite(call, builder) for relax_utils.rewrite_op_calls: the matmul form, or None."""
    legal = _legal(call)
    if isinstance(legal, str):
        log.info("conv1d stays a conv: %s", legal)
        return None
    c, length, o, k, g, stride, dilation, (pl, pr) = legal
    lo = (length + pl + pr - dilation * (k - 1) - 1) // stride + 1
    why = _profitable(c, o, k, g, lo, tvm.runtime.DataType(str(call.args[0].ty.dtype)).bits // 8)
    if why:
        log.info("conv1d %dx%d -> %d (k %d, groups %d) stays a conv: %s", c, length, o, k, g, why)
        return None
    if lo < 1:
        log.info("conv1d %dx%d -> %d (k %d) stays a conv: no output column", c, length, o, k)
        return None
    x, wt = call.args
    col = builder.emit_te(_im2col, x, c, k, g, stride, dilation, pl, length, lo, primfunc_name_hint="im2col")
    m = builder.emit(relax.op.matmul(col, _weight(wt, o, c, k, g, builder)))
    log.info("conv1d %dx%d -> %d (k %d, stride %d, groups %d) as an im2col and a matmul: %d x %d x %d",
             c, length, o, k, stride, g, lo, (c // g) * k, o // g)
    if g == 1:
        return relax.op.permute_dims(m, [0, 2, 1])
    n = x.ty.shape.values[0]
    return relax.op.reshape(relax.op.permute_dims(m, [0, 1, 3, 2]), relax.ShapeExpr([n, o, lo]))


@tvm.transform.module_pass(opt_level=0, name="tvmfuse.Conv1dAsMatmul")
def Conv1dAsMatmul(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    return rewrite_op_calls(mod, "relax.nn.conv1d", _rewrite)
