"""CastToHalf(dtype): a float32 model computed in float16 or bfloat16, decided at build time.

Contract. Takes a Relax module of high-level ops (before LegalizeOps) whose floating-point values
are float32; `dtype` is "float16" or "bfloat16". In every Relax function that is not a
Primitive one:
  - every float32 constant becomes a `dtype` constant, converted here, once, at build time (its
    finite values clipped to the half type's range: float32's lowest, the attention-mask fill of
    PyTorch models, is float16's lowest, not -inf);
  - every other float32 value is computed in `dtype` (activations are half), except where the
    numerics need float32:
      * matmul and conv (1d/2d/3d, transposed) read half operands and accumulate in float32
        (out_dtype float32); their result is cast to `dtype`;
      * softmax, log_softmax, layer/group/rms/instance/batch norm, the sum-like reductions
        (sum, mean, variance, std, prod, cumsum, cumprod), average pools and power read float32
        (half values cast up, float32 constants and parameters such as a norm's gamma and beta
        read as they are) and compute in float32; their result is cast to `dtype`;
  - ops that make a float32 tensor from a dtype attribute (astype, full, zeros, ones, arange ...)
    make a `dtype` one; a match_cast of a value now in `dtype` matches `dtype`;
  - a function's float32 parameters and results stay float32: a parameter is cast to `dtype` at
    each use (one cast per consumer, so each fuses into its consumer: the tvmfuse planner reads a
    cast in front of a matmul as a prologue, fusion/profitability.py), a result is cast back to
    float32 where it leaves its dataflow block. Main's signature is unchanged: callers pass and
    get float32 arrays;
  - a call this pass does not model (call_tir, a packed function, an op with fixed dtypes) gets
    its operands in the dtypes it was written for; a float32 result is cast to `dtype`.
Integer and boolean values (token ids, masks) are untouched. Every cast is an `astype`, an
elementwise op: fusion joins it to its producer or consumer (the matmul's epilogue, the norm's
prologue), so no cast is a kernel of its own in a fused build.

Runs in the "precision" phase (pipeline.py), after fold_constants: BatchNorm and the other
constant folds happen in float32, then each folded constant is rounded once. Half builds leave the
llvm conv rewrites (Winograd, 1x1 conv as matmul) out: they are float32 transforms. Does nothing
to a module without float32 values.

Why not TVM's ToMixedPrecision: it knows float16 only, and its "follow" policy keeps an op in
float32 as soon as one operand is float32 (a bias input, a float32 parameter), so on the zoo's MLP
the bias adds and GELU stayed float32 between float16 -> float32 round trips.

Numerics: float16 keeps 11 significant bits (relative rounding 4.9e-4), bfloat16 8 (3.9e-3) with
float32's range. Accumulating in float32 keeps the error of a K-term dot product at the rounding of
its operands instead of growing with K.
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_utils import rewrite_relax_functions

HALF_DTYPES = ("float16", "bfloat16")
F32 = "float32"
# What a half build is held to against its float32 model, on |out - ref| <= atol * max|ref| +
# rtol * |ref| with rtol = atol = this (tests/test_half_precision.py says where the margins come
# from: float16 roundoff 4.9e-4, bfloat16 3.9e-3, a few roundoffs through a model's ops).
HALF_TOLERANCE = {"float16": 1e-2, "bfloat16": 4e-2}

# read half operands, accumulate in float32 (out_dtype), result cast to the half type
ACCUMULATE = frozenset(f"relax.{n}" for n in (
    "matmul", "nn.conv1d", "nn.conv2d", "nn.conv3d", "nn.conv1d_transpose", "nn.conv2d_transpose",
    "nn.conv3d_transpose"))
# computed in float32 throughout: row statistics and averages whose sums lose bits in a half type,
# and power (x³ of GELU's tanh form triples the relative error; TVM's pow refuses bfloat16)
FLOAT32 = frozenset(f"relax.{n}" for n in (
    "nn.softmax", "nn.log_softmax", "nn.layer_norm", "nn.group_norm", "nn.rms_norm", "nn.instance_norm",
    "nn.batch_norm", "sum", "mean", "variance", "std", "prod", "cumsum", "cumprod", "power",
    "nn.avg_pool1d", "nn.avg_pool2d", "nn.avg_pool3d", "nn.adaptive_avg_pool1d", "nn.adaptive_avg_pool2d",
    "nn.adaptive_avg_pool3d"))
# calls whose callee fixes its operand and result dtypes
_FIXED = frozenset(("relax.call_tir", "relax.call_dps_packed", "relax.call_pure_packed",
                    "relax.call_tir_with_grad", "relax.call_tir_inplace"))


def _is_f32_tensor(ty) -> bool:
    return isinstance(ty, relax.TensorType) and str(ty.dtype) == F32


def _is_half_tensor(ty, dtype) -> bool:
    return isinstance(ty, relax.TensorType) and str(ty.dtype) == dtype


def half_constant(const: tvm.ir.expr.Constant, dtype: str) -> tvm.ir.expr.Constant:
    """A float32 constant as a `dtype` one; finite values clipped to the half type's range."""
    value = const.value.numpy()
    top = float(_finfo(dtype).max)
    value = np.where(np.isfinite(value), np.clip(value, -top, top), value)
    return relax.const(np.ascontiguousarray(value.astype(_numpy_dtype(dtype))), dtype)


def _numpy_dtype(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def _finfo(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.finfo(ml_dtypes.bfloat16)
    return np.finfo(dtype)


def with_attr(attrs, **changes):
    """A copy of an op's attrs node with some fields changed."""
    info = type(attrs).__tvm_ffi_type_info__
    fields = {f.name: getattr(attrs, f.name) for f in info.fields}
    return tvm.ir.make_node(info.type_key, **{**fields, **changes})


def _attr_fields(attrs) -> set:
    info = getattr(type(attrs), "__tvm_ffi_type_info__", None)
    return {f.name for f in info.fields} if info is not None and attrs is not None else set()


@relax.expr_functor.mutator
class _CastToHalf(relax.PyExprMutator):
    def __init__(self, mod, dtype):
        super().__init__(mod)
        self.dtype, self.changed = dtype, 0

    # ---------------------------------------------------------------- operands
    def _half(self, expr):
        """An operand, visited, as the half type where it is float32."""
        if isinstance(expr, tvm.ir.expr.Constant):
            return self._const(expr)
        new = self.visit_expr(expr)
        if isinstance(new, relax.Tuple):
            return relax.Tuple([self._half(f) for f in new.fields])
        if not _is_f32_tensor(new.ty):
            return new
        return self.builder_.emit(relax.op.astype(new, self.dtype))

    def _f32(self, expr):
        """An operand as float32: a float32 constant or parameter kept, a half value cast up."""
        if isinstance(expr, tvm.ir.expr.Constant):
            return expr
        if isinstance(expr, relax.Tuple):
            return relax.Tuple([self._f32(f) for f in expr.fields])
        new = self.visit_expr(expr)
        if _is_half_tensor(new.ty, self.dtype):
            return self.builder_.emit(relax.op.astype(new, F32))
        return new

    def _as_written(self, expr, ty):
        """An operand in the dtype the original expression had (`ty`)."""
        new = self._half(expr)
        if _is_f32_tensor(ty) and _is_half_tensor(new.ty, self.dtype):
            return self.builder_.emit(relax.op.astype(new, F32))
        return new

    def _const(self, const):
        if _is_f32_tensor(const.ty):
            self.changed += 1
            return half_constant(const, self.dtype)
        return const

    def _to_half(self, call):
        """`call` emitted, its float32 tensor result cast to the half type."""
        if not _is_f32_tensor(self.builder_.normalize(call).ty):
            return call
        return relax.op.astype(self.builder_.emit(call), self.dtype)

    # ---------------------------------------------------------------- calls
    def visit_constant_(self, const):
        return self._const(const)

    def visit_call_(self, call):
        op = call.op.name if isinstance(call.op, tvm.ir.Op) else None
        if op is None or op in _FIXED:
            return self._fixed(call)
        self.changed += 1
        if op in ACCUMULATE:
            args = [self._half(a) for a in call.args]
            fields = _attr_fields(call.attrs)
            attrs = with_attr(call.attrs, out_dtype=F32) if "out_dtype" in fields else call.attrs
            return self._to_half(relax.Call(call.op, args, attrs, call.ty_args))
        if op in FLOAT32:
            args = [self._f32(a) for a in call.args]
            return self._to_half(relax.Call(call.op, args, call.attrs, call.ty_args))
        args = [self._half(a) for a in call.args]
        changes = {k: self.dtype for k in _attr_fields(call.attrs) & {"dtype", "out_dtype"}
                   if str(getattr(call.attrs, k)) == F32}
        attrs = with_attr(call.attrs, **changes) if changes else call.attrs
        return self._to_half(relax.Call(call.op, args, attrs, call.ty_args))

    def _fixed(self, call):
        """A call whose callee fixes the dtypes: operands as written, a float32 result cast."""
        args = [self._as_written(a, a.ty) if isinstance(a.ty, relax.TensorType) else
                relax.Tuple([self._as_written(f, f.ty) for f in a.fields]) if isinstance(a, relax.Tuple) else
                self.visit_expr(a) for a in call.args]
        op = self.visit_expr(call.op) if isinstance(call.op, relax.Var) else call.op
        new = relax.Call(op, args, call.attrs, call.ty_args)
        return self._to_half(new) if isinstance(call.op, tvm.ir.Op) and call.op.name in _FIXED else new

    # ---------------------------------------------------------------- blocks and results
    def visit_var_binding_(self, binding):
        value = self.visit_expr(binding.value)
        leaves = not isinstance(binding.var, relax.DataflowVar)
        if leaves:  # a block's result: float32 where the original was
            value = self._restore(value, binding.var.ty)
        if self.builder_.current_block_is_dataflow() and leaves:
            new = self.builder_.emit_output(value, binding.var.name)
        else:
            new = self.builder_.emit(value, binding.var.name)
        self.set_var_remap(binding.var, new)

    def visit_match_cast_(self, binding):
        """A match_cast of a value now in the half type matches the half type."""
        value, ty = self.visit_expr(binding.value), binding.ty
        if _is_f32_tensor(ty) and _is_half_tensor(self.builder_.normalize(value).ty, self.dtype):
            ty = relax.TensorType(ty.shape, self.dtype) if ty.shape is not None else \
                relax.TensorType(dtype=self.dtype, ndim=ty.ndim)
        new = self.builder_.match_cast(value, ty, binding.var.name)
        self.set_var_remap(binding.var, new)

    def _restore(self, value, ty):
        """`value` (a half-typed expression) in the dtypes of `ty`, the original type."""
        if isinstance(ty, relax.TupleType):
            value = value if isinstance(value, relax.Tuple) else self.builder_.emit(value)
            fields = value.fields if isinstance(value, relax.Tuple) else \
                [relax.TupleGetItem(value, i) for i in range(len(ty.fields))]
            return relax.Tuple([self._restore(f, t) for f, t in zip(fields, ty.fields)])
        if _is_f32_tensor(ty) and _is_half_tensor(self.builder_.normalize(value).ty, self.dtype):
            if not isinstance(value, (relax.Var, relax.Tuple, relax.TupleGetItem)):
                value = self.builder_.emit(value)
            return relax.op.astype(value, F32)
        return value


def cast_to_half(mod: tvm.IRModule, dtype: str) -> tvm.IRModule:
    """The module computed in `dtype` (the contract above)."""
    if dtype not in HALF_DTYPES:
        raise ValueError(f"cast_to_half: dtype {dtype!r}, expected one of {HALF_DTYPES}")
    funcs = {gv: f for gv, f in mod.functions_items()
             if isinstance(f, relax.Function) and (f.attrs is None or "Primitive" not in f.attrs)}
    if not funcs:
        return mod
    mutator = _CastToHalf(mod, dtype)
    out = rewrite_relax_functions(tvm.IRModule(funcs), mutator, lambda: mutator.changed)
    if out is None:
        return mod
    new = {**dict(mod.functions_items()), **dict(out.functions_items())}
    return relax.transform.Normalize()(tvm.IRModule(new, attrs=mod.attrs))


def CastToHalf(dtype: str) -> tvm.transform.Pass:  # noqa: N802 (a pass, named like TVM's)
    """The module pass of `cast_to_half`."""
    return tvm.transform.module_pass(lambda mod, _ctx: cast_to_half(mod, dtype), opt_level=0,
                                     name="tvmfuse.CastToHalf")
