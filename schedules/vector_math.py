"""Vectorizable float32 exp and erf for CPU kernels.

Contract: `vectorizable_math(func)` returns `func` with
- every float32 `T.exp(x)` replaced by TVM's own `topi.fast_exp` expression of x (range reduction
  plus a degree-7 polynomial; relative error at most 1.2e-6 measured over [-87, 88.7], far less
  near 0), NaN and +inf passed through as `expf` does;
- every float32 `T.erf(x)` replaced by `topi.fast_erf` (a rational approximation; absolute error at
  most 2.4e-7 measured over [-6, 6]), NaN passed through.
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
_LOAD = "te.tensor_load"
_HI = 88.3762626647950  # topi.fast_exp clamps its argument to +-this
_OVERFLOW = 88.72283935546875  # expf(x) is +inf above this


@lru_cache(maxsize=None)
def _template(fn):
    """topi's fast_<fn> body for a one-element placeholder; its loads get replaced by the argument."""
    with tvm.transform.PassContext():  # topi may consult the current context
        return getattr(topi, fn)(te.placeholder((1,), "float32", name="x")).op.body[0]


def _instantiate(fn, x):
    return tvm_ffi.structural_map(_template(fn), (tvm.ir.Call, lambda c: x if c.op.name == _LOAD else c))


def _expand(x):
    f32 = lambda v: tvm.tirx.const(v, "float32")
    # fast_exp clamps at _HI; the last stretch below float32 overflow is exp(x - ln 2) * 2
    top = x > f32(_HI)
    shifted = x - tvm.tirx.Select(top, f32(math.log(2.0)), f32(0.0))
    fast = _instantiate("fast_exp", shifted) * tvm.tirx.Select(top, f32(2.0), f32(1.0))
    edge = tvm.tirx.Select(x > f32(_OVERFLOW), f32(float("inf")), fast)
    return tvm.tirx.Select(tvm.tirx.isnan(x), x, edge)  # NaN in, NaN out


def _expand_erf(x):
    return tvm.tirx.Select(tvm.tirx.isnan(x), x, _instantiate("fast_erf", x))  # NaN in, NaN out


def lower_math(mod: tvm.IRModule, target) -> tvm.IRModule:
    from .targets import CPU

    if target.kind.name != "llvm" or not CPU["vector_math"]:
        return mod
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    for gv, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            out[gv] = vectorizable_math(func)
    return out


def vectorizable_math(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    def on_call(call):
        if str(call.ty) == "float32" and call.op.same_as(_EXP):
            return _expand(call.args[0])
        if str(call.ty) == "float32" and call.op.same_as(_ERF):
            return _expand_erf(call.args[0])
        return call

    return tvm_ffi.structural_map(func, (tvm.ir.Call, on_call))
