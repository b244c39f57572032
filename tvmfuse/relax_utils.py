"""Small helpers over Relax functions shared by the build, the measuring runtime and the passes."""
from __future__ import annotations

import threading

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

# Two pieces of TVM's Python-side graph construction are process-global, shared by every thread:
#  - BlockBuilder keeps the builders of open functions on a class-level list (`BlockBuilder._stack`):
#    two threads inside `with bb.function(...)` corrupt it (AssertionError in _exit_function_scope);
#  - TE's operator tags (`te.tag.TagScope._current`): two threads inside topi computes at once raise
#    "nested op_tag is not allowed" (every legalizer and every fused group's TE goes through them).
# So every tvmfuse path that opens a function scope (the zoo, the frontends, the fuzzer's graphs) or
# builds TE from Relax ops (the pipeline's phases through "fuse", classify) holds this lock. The
# schedules and code generation, most of a build's time, run in parallel.
GRAPH_LOCK = threading.RLock()


def static_shape(ty) -> tuple[int, ...] | None:
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    try:
        return tuple(int(v) for v in ty.shape.values)
    except (TypeError, AttributeError):
        return None


def tensor_bytes(ty) -> int:
    """Bytes of a tensor type (sum over the fields of a tuple type). 0 when unknown."""
    if isinstance(ty, relax.TupleType):
        return sum(tensor_bytes(f) for f in ty.fields)
    shape = static_shape(ty)
    if shape is None:
        return 0
    return int(np.prod(shape, dtype=np.int64)) * tvm.runtime.DataType(ty.dtype).bits // 8


_KERNEL_CALLS = ("relax.call_tir", "relax.call_tir_inplace")


def call_tir_sites(func: relax.Function):
    """Yield (binding var, callee GlobalVar, tensor args, out type) for each call_tir (or
    call_tir_inplace: passes/update_in_place.py) in order."""
    for block in func.body.blocks:
        for bd in block.bindings:
            v = bd.value
            if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name in _KERNEL_CALLS:
                args = list(v.args[1].fields) if isinstance(v.args[1], relax.Tuple) else [v.args[1]]
                yield bd.var, v.args[0], args, bd.var.ty



# ------------------------------------------------------------------ symbolic dimensions
NOMINAL_EXTENT = 256  # a symbolic dim's stand-in when the planner estimates bytes (an order, not a value)


class SymDim:
    """A symbolic extent (`n`, `n * 4`), equal to another only when TVM's analyzer proves it.

    Fusion compares iteration spaces dim by dim; with symbolic batch or sequence the question is
    not "same int" but "provably the same extent". Hashed by its simplified text, so equal dims
    built the same way share a hash (n * 4 and n + n + n + n simplify alike)."""

    __slots__ = ("expr", "_key")

    def __init__(self, expr):
        from tvm.sym import Analyzer

        self.expr = Analyzer().simplify(expr)
        self._key = str(self.expr)

    def __eq__(self, other):
        if not isinstance(other, SymDim):
            return False  # an int: a symbolic extent is not provably equal to any constant
        if self._key == other._key and tvm_ffi.structural_equal(self.expr, other.expr):
            return True
        from tvm.sym import Analyzer

        return bool(Analyzer().can_prove_equal(self.expr, other.expr))

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        return self._key


def dims(ty) -> tuple | None:
    """The shape of a tensor type as ints and SymDims; None when the rank or shape is unknown."""
    if not isinstance(ty, relax.TensorType) or ty.shape is None or not hasattr(ty.shape, "values"):
        return None
    return tuple(int(v) if isinstance(v, tvm.tirx.IntImm) else SymDim(v) for v in ty.shape.values)


def _nominal(dim) -> int:
    if isinstance(dim, int):
        return dim
    from tvm.sym import Analyzer

    a = Analyzer()  # each free var bound to the single value NOMINAL_EXTENT: the dim simplifies to an int
    for v in tvm.tirx.analysis.undefined_vars(dim.expr):
        t = str(v.ty)
        a.bind(v, tvm.ir.Range(tvm.tirx.const(NOMINAL_EXTENT, t), tvm.tirx.const(NOMINAL_EXTENT + 1, t)))
    val = a.simplify(dim.expr)
    return int(val) if isinstance(val, tvm.tirx.IntImm) else NOMINAL_EXTENT


def planning_bytes(ty) -> int:
    """tensor_bytes, with each symbolic dim at NOMINAL_EXTENT: what the fusion planner weighs (a
    static shape gives exactly tensor_bytes)."""
    if isinstance(ty, relax.TupleType):
        return sum(planning_bytes(f) for f in ty.fields)
    d = dims(ty)
    if d is None:
        return 0
    return int(np.prod([_nominal(x) for x in d], dtype=np.int64)) * tvm.runtime.DataType(ty.dtype).bits // 8


def rewrite_relax_functions(mod: tvm.IRModule, mutator, changes) -> tvm.IRModule | None:
    """Visit every Relax function of `mod` with `mutator` (a PyExprMutator); `changes()` reads the
    count of rewrites the mutator keeps. The module with the changed functions replaced, or None
    when nothing changed (what a rewriting module pass returns as `mod` itself)."""
    out = {}
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            before = changes()
            new = mutator.visit_expr(func)
            if changes() != before:
                out[gv] = new
    if not out:
        return None
    return tvm.IRModule({**dict(mod.functions_items()), **out}, attrs=mod.attrs)


@relax.expr_functor.mutator
class _CallRewrite(relax.PyExprMutator):
    """Each call of one Relax op, its arguments rewritten first, through `rewrite`."""

    def __init__(self, mod, op_name, rewrite):
        super().__init__(mod)
        self.op_name, self.rewrite, self.rewritten = op_name, rewrite, 0

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == self.op_name):
            return call
        new = self.rewrite(call, self.builder_)
        if new is None:
            return call
        self.rewritten += 1
        return new


def rewrite_op_calls(mod: tvm.IRModule, op_name: str, rewrite) -> tvm.IRModule:
    """Every call of `op_name` (e.g. "relax.nn.conv2d") in every Relax function of `mod` through
    `rewrite(call, builder)`: the expression that replaces it (bindings it needs emitted with
    `builder.emit`, PrimFuncs added with `builder.add_func`), or None to keep the call. Returns
    `mod` itself when nothing changed, else the module with the functions the builder added,
    normalized."""
    rw = _CallRewrite(mod, op_name, rewrite)
    out = rewrite_relax_functions(mod, rw, lambda: rw.rewritten)
    if out is None:
        return mod
    added = {gv: f for gv, f in rw.builder_.get().functions_items() if gv not in out.functions}
    if added:
        out = tvm.IRModule({**dict(added), **dict(out.functions_items())}, attrs=out.attrs)
    return relax.transform.Normalize()(out)


def static_ints(values) -> list[int] | None:
    """The ints of a sequence of dims or attribute values; None when any is symbolic."""
    try:
        return [int(d) for d in values]
    except (TypeError, AttributeError):
        return None


def float_conv_operands(call, ndim: int):
    """(input shape values, weight shape ints, input's non-batch dims as ints) of a conv call whose
    operands are float tensors of rank `ndim`, static but for the batch, of one dtype with no
    out_dtype change; else why not (str). What the conv rewrites (Conv1dAsMatmul,
    Conv1x1AsMatmul) ask before they look at the conv's own attributes."""
    x, w = call.args
    if not isinstance(x.ty, relax.TensorType) or not isinstance(w.ty, relax.TensorType):
        return "operand without a tensor type"
    if x.ty.ndim != ndim or w.ty.ndim != ndim or x.ty.shape is None or w.ty.shape is None:
        return "operand of unknown rank or shape"
    xs = list(x.ty.shape.values)
    ws, rest = static_ints(w.ty.shape.values), static_ints(xs[1:])
    if ws is None or rest is None:
        return "a symbolic channel count, map size or kernel"
    out = str(call.attrs.out_dtype)
    if not str(x.ty.dtype).startswith("float") or w.ty.dtype != x.ty.dtype or \
            (out not in ("", "void", "None") and out != x.ty.dtype):
        return f"dtypes {x.ty.dtype} x {w.ty.dtype} -> {call.attrs.out_dtype}"
    return xs, ws, rest


def dense_nchw_conv_reason(call) -> str | None:
    """Why a conv2d call is not a dense (groups 1) NCHW / OIHW conv, or None when it is: the form
    the conv rewrites (Conv1x1AsMatmul, Winograd3x3) take."""
    a = call.attrs
    if (a.data_layout, a.kernel_layout, a.out_layout) != ("NCHW", "OIHW", "NCHW"):
        return f"layout {a.data_layout}/{a.kernel_layout}/{a.out_layout}, not NCHW/OIHW/NCHW"
    if int(a.groups) != 1:
        return f"groups={int(a.groups)}"
    return None
