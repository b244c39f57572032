"""Vectorizable float32 exp for CPU kernels.

Contract: `vectorizable_exp(func)` returns `func` with every float32 `T.exp(x)` replaced by TVM's
own `topi.fast_exp` expression of x (Cephes-style range reduction plus a degree-7 polynomial,
relative error at most 1.2e-6 measured over [-87, 88.7], far less near 0), with NaN and +inf passed through as `expf`
does. The llvm backend lowers `T.exp` on vectors to one libm `expf` call per lane; the polynomial
is plain arithmetic, so the vectorized loops the schedules build stay vectorized. Applied by
`apply_default_schedules` to every llvm PrimFunc of every fusion variant alike (targets.CPU
"vector_exp"), so comparisons between variants stay fair. Other dtypes are left alone.
"""
from __future__ import annotations

import math
from functools import lru_cache

import tvm
import tvm_ffi
from tvm import te, topi

_EXP = tvm.ir.Op.get("tirx.exp")
_LOAD = "te.tensor_load"
_HI = 88.3762626647950  # topi.fast_exp clamps its argument to +-this
_OVERFLOW = 88.72283935546875  # expf(x) is +inf above this


@lru_cache(maxsize=1)
def _template():
    """fast_exp's body for a one-element placeholder; its loads get replaced by the argument."""
    with tvm.transform.PassContext():  # topi may consult the current context
        return topi.fast_exp(te.placeholder((1,), "float32", name="x")).op.body[0]


def _expand(x):
    f32 = lambda v: tvm.tirx.const(v, "float32")
    # fast_exp clamps at _HI; the last stretch below float32 overflow is exp(x - ln 2) * 2
    top = x > f32(_HI)
    shifted = x - tvm.tirx.Select(top, f32(math.log(2.0)), f32(0.0))
    fast = tvm_ffi.structural_map(
        _template(), (tvm.ir.Call, lambda c: shifted if c.op.name == _LOAD else c))
    fast = fast * tvm.tirx.Select(top, f32(2.0), f32(1.0))
    edge = tvm.tirx.Select(x > f32(_OVERFLOW), f32(float("inf")), fast)
    return tvm.tirx.Select(x != x, x, edge)  # NaN in, NaN out


def vectorizable_exp(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    def on_call(call):
        if call.op.same_as(_EXP) and str(call.ty) == "float32":
            return _expand(call.args[0])
        return call

    return tvm_ffi.structural_map(func, (tvm.ir.Call, on_call))
