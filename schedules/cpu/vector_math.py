"""Vectorizable float32 exp and erf for CPU kernels.

Contract: `vectorizable_math(func)` returns `func` with
- every float32 `T.exp(x)` replaced by TVM's own `topi.fast_exp` expression of x (range reduction
  plus a degree-7 polynomial; relative error at most 1.2e-6 measured over [-87, 88.7], far less
  near 0), NaN and +inf passed through as `expf` does; where x is `v - m[row]` with m a row max
  of v (a softmax's or log-softmax's shift, found through the max reduction's blocks, rfactor
  stages included), x is never above 0 and the edge near overflow is left out (NaN still passed
  through): 20-30% of a softmax kernel on znver4. Only with 32 vector registers
  (`exp_row_max_shortcut`): on AVX2 LLVM unrolls the shorter loop 4x and spills;
- every float32 `T.erf(x)` replaced by `topi.fast_erf` (a rational approximation; absolute error at
  most 2.4e-7 measured over [-6, 6]), NaN passed through;
- every float32 `T.tanh(x)` replaced by (1 - t) / (1 + t), t the expansion above of exp(-2|x|),
  the sign restored (absolute error at most 2e-7 over [-12, 12]; GPT-2's GELU), NaN passed
  through, +-inf to +-1;
- every float32 `T.sigmoid(x)` (SiLU, GLU gates) replaced by 1 / (1 + e), e the expansion above of
  exp(-x) (an overflowing e gives 0, as it should), NaN passed through;
- every `T.pow(x, n)` with a constant whole n in 1..4 replaced by multiplications (libm's powf
  is a call per lane: 7 ns an element).
The llvm backend lowers `T.exp`/`T.erf` on vectors to one libm call per lane; these are plain
arithmetic, so vectorized loops stay vectorized. Other dtypes are left alone.

`lower_math(mod, target)` is the lowering step: it rewrites every PrimFunc of `mod` when `target`
is llvm and targets.CPU["vector_math"] is on, whoever scheduled it (the default rules, a tuned
MetaSchedule record, or a MetaSchedule trial being measured), so a tuned kernel and the default it
is compared with run the same math. tvmfuse.build runs it after the schedules; the tuning builders
(tvmfuse.tuning.rpc) run it before they compile a candidate. It runs after the schedule rules,
which judge recompute cost by the T.exp calls they see.
"""
from __future__ import annotations

import math
from functools import lru_cache

import tvm
import tvm_ffi
from tvm import te, topi

_EXP = tvm.ir.Op.get("tirx.exp")
_ERF = tvm.ir.Op.get("tirx.erf")
_TANH = tvm.ir.Op.get("tirx.tanh")
_POW = tvm.ir.Op.get("tirx.pow")
_SIGMOID = tvm.ir.Op.get("tirx.sigmoid")
_LOAD = "te.tensor_load"
_HI = 88.3762626647950  # topi.fast_exp clamps its argument to +-this
_OVERFLOW = 88.72283935546875  # expf(x) is +inf above this


@lru_cache(maxsize=None)
def _template(fn):
    """topi's fast_<fn> body for a one-element placeholder; its loads get replaced by the argument."""
    with tvm.transform.PassContext():  # topi may consult the current context
        return getattr(topi, fn)(te.placeholder((1,), "float32", name="x")).op.body[0]


def _instantiate(fn, x):
    return _bound(x, lambda v: tvm_ffi.structural_map(_template(fn), (tvm.ir.Call, lambda c: v if c.op.name == _LOAD else c)))


def _bound(x, body):
    """body(v) with v bound to x by a Let, so an argument used many times is computed once
    (structural substitution would copy the whole expression into every use). An argument that
    computes in bfloat16 is substituted instead: TVM's BF16ComputeLegalize leaves the bfloat16
    casts inside a Let's value unlowered (LLVM codegen then refuses them)."""
    if isinstance(x, (tvm.tirx.Var, tvm.tirx.FloatImm)) or _has_bfloat16(x):
        return body(x)
    v = tvm.tirx.Var("x", x.ty if hasattr(x, "ty") else "float32")
    return tvm.tirx.Let(v, x, body(v))


def _expand(x):
    return _bound(x, _expand_var)


def _has_bfloat16(x) -> bool:
    found = []

    def seen(node):
        if str(node.ty) == "bfloat16":
            found.append(node)
        return node

    tvm_ffi.structural_map(x, [(t, seen) for t in (tvm.tirx.Cast, tvm.ir.expr.TensorLoad, tvm.tirx.FloatImm)])
    return bool(found)


def _expand_var(x):
    f32 = lambda v: tvm.tirx.const(v, "float32")
    # fast_exp clamps at _HI; the last stretch below float32 overflow is exp(x - ln 2) * 2
    top = x > f32(_HI)
    shifted = x - tvm.tirx.Select(top, f32(math.log(2.0)), f32(0.0))
    fast = _instantiate("fast_exp", shifted) * tvm.tirx.Select(top, f32(2.0), f32(1.0))
    edge = tvm.tirx.Select(x > f32(_OVERFLOW), f32(float("inf")), fast)
    return tvm.tirx.Select(tvm.tirx.isnan(x), x, edge)  # NaN in, NaN out


def exp_nonpositive(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """`func` with every float32 T.exp(x) replaced by topi.fast_exp(x) alone, NaN passed through:
    for kernels whose exp arguments are never above 0 (the online softmax's x - max), where the
    overflow edge of `_expand` cannot happen and its selects are work on the hot path."""
    def on_call(call):
        if str(call.ty) == "float32" and call.op.same_as(_EXP):
            return _bound(call.args[0], lambda v: tvm.tirx.Select(tvm.tirx.isnan(v), v, _instantiate("fast_exp", v)))
        return call

    return tvm_ffi.structural_map(func, (tvm.ir.Call, on_call))


def _expand_erf(x):
    return _bound(x, _expand_erf_var)


def _expand_erf_var(x):
    return tvm.tirx.Select(tvm.tirx.isnan(x), x, _instantiate("fast_erf", x))  # NaN in, NaN out


def _expand_tanh(x):
    return _bound(x, _expand_tanh_var)


def _expand_tanh_var(x):
    """tanh(|x|) = (1 - t) / (1 + t) with t = exp(-2|x|) in (0, 1] (no overflow), the sign put back."""
    f32 = lambda v: tvm.tirx.const(v, "float32")
    t = _instantiate("fast_exp", f32(-2.0) * tvm.tirx.abs(x))  # argument <= 0: no overflow edge
    mag = (f32(1.0) - t) / (f32(1.0) + t)
    return tvm.tirx.Select(x < f32(0.0), -mag, tvm.tirx.Select(tvm.tirx.isnan(x), x, mag))


def _expand_pow(x, y):
    """x ** n for a constant whole n in 1..4 as multiplications (GPT-2's GELU cubes); else None."""
    n = getattr(y, "value", None)
    if n is None or n != int(n) or not 1 <= n <= 4:
        return None
    def power(v):
        out = v
        for _ in range(int(n) - 1):
            out = out * v
        return out

    return _bound(x, power)


def lower_math(mod: tvm.IRModule, target) -> tvm.IRModule:
    from ..targets import CPU

    if target.kind.name != "llvm" or not CPU["vector_math"]:
        return mod
    from ..targets import for_target

    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    with for_target(target):  # the constants of the CPU compiled for (exp_row_max_shortcut)
        for gv, func in mod.functions_items():
            if isinstance(func, tvm.tirx.PrimFunc):
                out[gv] = vectorizable_math(func)
    return out


def _max_reductions(func) -> list:
    """[(buffer, value)] for every block that updates `buffer[idx] = max(buffer[idx], value)`: a
    max-reduction (or one stage of it after rfactor, whose value is a load of the stage before)."""
    found = []

    def block(b):
        st = b.body
        if isinstance(st, tvm.tirx.BufferStore) and isinstance(st.value, tvm.tirx.Max):
            for own, other in ((st.value.a, st.value.b), (st.value.b, st.value.a)):
                if isinstance(own, tvm.ir.expr.TensorLoad) and own.source.same_as(st.buffer):
                    found.append((st.buffer, other))
                    break
        return b

    tvm_ffi.structural_map(func.body, [(tvm.s_tir.SBlock, block)], order="post")
    return found


def _row_pattern(expr):
    """`expr` with the last index of every load replaced by 0: what a value is along its row."""
    def load(t):
        idx = list(t.indices)
        return tvm.tirx.BufferLoad(t.source, idx[:-1] + [tvm.tirx.const(0, idx[-1].ty.dtype)]) if idx else t

    return tvm_ffi.structural_map(expr, [(tvm.ir.expr.TensorLoad, load)], order="post")


def _is_row_max_of(buf, value, reductions, depth=0) -> bool:
    """Whether `buf` holds the max over a row of `value` (through the rfactor stages of a max
    reduction): then value - buf[row] <= 0 along that row."""
    if depth > 4:
        return False
    for b, v in reductions:
        if not b.same_as(buf):
            continue
        if isinstance(v, tvm.ir.expr.TensorLoad) and any(v.source.same_as(r) for r, _ in reductions):
            if _is_row_max_of(v.source, value, reductions, depth + 1):
                return True
        elif tvm_ffi.structural_equal(_row_pattern(v), _row_pattern(value), map_free_vars=True):
            return True
    return False


def _nonpositive(arg, reductions) -> bool:
    """`arg` is `value - m[row]` with m the row max of value (softmax, log-softmax): never above 0."""
    return (isinstance(arg, tvm.tirx.Sub) and isinstance(arg.b, tvm.ir.expr.TensorLoad)
            and _is_row_max_of(arg.b.source, arg.a, reductions))


def vectorizable_math(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    from ..targets import CPU

    shortcut = isinstance(func, tvm.tirx.PrimFunc) and CPU.get("exp_row_max_shortcut", 0)
    found = []  # the function's max reductions, looked for at its first exp only

    def reductions():
        if not found:
            found.append(_max_reductions(func))
        return found[0]

    def on_call(call):
        if str(call.ty) == "float32" and call.op.same_as(_EXP):
            if shortcut and _nonpositive(call.args[0], reductions()):  # x - rowmax(x): no overflow edge
                return _bound(call.args[0], lambda v: tvm.tirx.Select(tvm.tirx.isnan(v), v, _instantiate("fast_exp", v)))
            return _expand(call.args[0])
        if str(call.ty) == "float32" and call.op.same_as(_ERF):
            return _expand_erf(call.args[0])
        if str(call.ty) == "float32" and call.op.same_as(_TANH):
            return _expand_tanh(call.args[0])
        if str(call.ty) == "float32" and call.op.same_as(_SIGMOID):
            one = tvm.tirx.const(1.0, "float32")
            return one / (one + _expand(-call.args[0]))
        if call.op.same_as(_POW):
            expanded = _expand_pow(*call.args)
            return call if expanded is None else expanded
        return call

    return tvm_ffi.structural_map(func, (tvm.ir.Call, on_call))
