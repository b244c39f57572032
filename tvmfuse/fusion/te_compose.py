"""Compose Relax ops into TE: each op's own legalizer (FLegalize) run against a recording builder.

TVM's legalizers are written as `bb.call_te(topi_fn, *relax_args, **kw)`. `OpToTE` hands them a
builder whose `call_te` maps the Relax arguments to TE tensors already built for the group (or to
new placeholders for the group's inputs) and records the TE result instead of emitting a PrimFunc.
Which builders record is kept per thread (see `_call_te`), so compositions may run in several
threads at once; every other use of BlockBuilder.call_te is TVM's own. The recording call_te is
on BlockBuilder only while a legalizer composes TE for tvmfuse (`recording_call_te`), never after.
So a fused group is ONE TE compute definition made of the ops' own computes. A legalizer that does
anything else (emits several calls, returns a Relax expression) is refused: NotComposable.
"""
from __future__ import annotations

import contextlib
import threading

import tvm
import tvm_ffi
from tvm import relax, te

from ..relax_utils import GRAPH_LOCK


class NotComposable(Exception):
    """The op cannot be expressed as one TE compute through its legalizer; the reason is the message."""


class _Recorded:
    def __init__(self, tensors):
        self.tensors = tensors


_LOCAL = threading.local()  # per thread: [(OpToTE, BlockBuilder)] of the legalizer calls in flight
_ORIG_CALL_TE = relax.BlockBuilder.call_te  # read, not replaced: recording_call_te installs _call_te
_PATCH_LOCK = threading.Lock()
_PATCH_USERS = 0  # legalizer calls (all threads) inside recording_call_te


def _recording(bb):
    """The OpToTE recording for this builder in this thread, or None."""
    for env, b in reversed(getattr(_LOCAL, "stack", ())):
        if bb.same_as(b):
            return env
    return None


def _call_te(self, func, *args, **kwargs):
    """BlockBuilder.call_te: unchanged, except for a builder this thread handed to a legalizer for
    OpToTE, where the TE is recorded instead of emitted. A real BlockBuilder is needed because the
    legalizers reach it through FFI (which makes a new Python wrapper of the same object, so neither a
    Python subclass nor an instance attribute survives); hence this one method, installed on the
    class while tvmfuse composes (`recording_call_te`), that looks the builder up in a per-thread
    stack. Other builders and other threads see TVM's call_te."""
    env = _recording(self)
    if env is None:
        return _ORIG_CALL_TE(self, func, *args, **kwargs)
    kwargs.pop("primfunc_name_hint", None)
    kwargs.pop("primfunc_attrs", None)
    te_args = [env.convert(a) for a in args]
    te_kwargs = {k: env.convert(v) for k, v in kwargs.items()}
    out = func(*te_args, **te_kwargs)
    return _Recorded(list(out) if isinstance(out, (list, tuple, tvm_ffi.Array)) else [out])


@contextlib.contextmanager
def recording_call_te():
    """Install `_call_te` as relax.BlockBuilder.call_te for the duration, and TVM's own back after.

    Scoped rather than installed on import: `import tvmfuse` patches nothing, and outside
    tvmfuse's compositions BlockBuilder is TVM's. A subclass or a per-builder method cannot do it
    (see `_call_te`: the legalizer gets a fresh wrapper of the builder through FFI), so the class
    attribute is swapped, counted across threads: the first entry installs it, the last exit
    restores TVM's (while any thread composes, the other threads' builders still get TVM's
    call_te through `_call_te`, which records only for a builder this thread registered)."""
    global _PATCH_USERS
    with _PATCH_LOCK:
        if _PATCH_USERS == 0:
            relax.BlockBuilder.call_te = _call_te
        _PATCH_USERS += 1
    try:
        yield
    finally:
        with _PATCH_LOCK:
            _PATCH_USERS -= 1
            if _PATCH_USERS == 0 and relax.BlockBuilder.__dict__.get("call_te") is _call_te:
                relax.BlockBuilder.call_te = _ORIG_CALL_TE


class OpToTE:
    """Build TE tensors for a sequence of Relax bindings. `inputs` lists the placeholders created for
    the group's external tensors (in first-use order), `source` the Relax exprs they stand for."""

    def __init__(self):
        self.values = {}  # relax Var -> te.Tensor or list of te.Tensor (tuple-valued ops)
        self.inputs, self.sources = [], []

    def convert(self, arg):
        if isinstance(arg, (list, tuple, tvm_ffi.Array)):
            return [self.convert(a) for a in arg]
        if tvm.ir.is_prim_expr(arg):  # scalars the legalizer already turned into TIR constants
            return arg
        if isinstance(arg, relax.ShapeExpr):
            return list(arg.values)
        if isinstance(arg, relax.Tuple):
            return [self.convert(a) for a in arg.fields]
        if isinstance(arg, relax.Expr) and not isinstance(arg, (relax.Var, tvm.ir.expr.Constant)):
            raise NotComposable(f"argument {type(arg).__name__} is not a tensor variable")
        if isinstance(arg, (relax.Var, tvm.ir.expr.Constant)):
            if isinstance(arg, relax.Var) and arg in self.values:
                return self.values[arg]
            for src, ph in zip(self.sources, self.inputs):
                if src.same_as(arg):
                    return ph
            if isinstance(arg, tvm.ir.expr.Constant) and arg.ty.ndim == 0:  # a scalar: part of the compute
                value = arg.value.numpy().item()
                return te.compute((), lambda: tvm.tirx.const(value, arg.ty.dtype), name="scalar")
            ty = arg.ty
            if not isinstance(ty, relax.TensorType) or (ty.shape is None and ty.ndim != 0):
                raise NotComposable(f"argument of type {ty} is not a tensor of known shape")
            shape = list(ty.shape.values) if ty.shape is not None else []  # symbolic dims stay TIR vars
            name = arg.name if isinstance(arg, relax.Var) else f"const{len(self.inputs)}"
            ph = te.placeholder(shape, ty.dtype, name=name)
            self.inputs.append(ph)
            self.sources.append(arg)
            return ph
        return arg

    def bind(self, var: relax.Var, value: relax.Expr):
        """Record the TE for `var = value` (an op call or a TupleGetItem of a recorded tuple)."""
        if isinstance(value, relax.TupleGetItem):
            tup = self.values.get(value.tuple_value)
            if not isinstance(tup, list):
                raise NotComposable("TupleGetItem of a tuple produced outside the group")
            self.values[var] = tup[value.index]
            return
        self.values[var] = op_to_te(value, self)


def legalizer(call: relax.Call):
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
        raise NotComposable("not a call of a Relax operator")
    name = call.op.name
    if name in ("relax.call_tir", "relax.call_dps_packed", "relax.call_packed"):
        raise NotComposable(f"{name} is an external kernel (opaque)")
    fl = call.op.get_attr("FLegalize")
    if fl is None:
        raise NotComposable(f"{name} has no TE legalization")
    return fl


def op_to_te(call: relax.Call, env: OpToTE):
    fl = legalizer(call)
    bb = relax.BlockBuilder()
    stack = _LOCAL.__dict__.setdefault("stack", [])
    stack.append((env, bb))
    try:
        with GRAPH_LOCK, recording_call_te():  # topi's op tags are process-global (relax_utils.GRAPH_LOCK)
            res = fl(bb, call)
    except NotComposable:
        raise
    except Exception as err:  # a fallback by contract: a legalizer that cannot take TE inputs leaves
        # the op out of the group (the planner logs the refusal with this reason), it never fails a build
        raise NotComposable(f"{call.op.name}: legalizer failed on TE inputs ({type(err).__name__}: {err})") from err
    finally:
        stack.pop()
    if not isinstance(res, _Recorded):
        raise NotComposable(f"{call.op.name}: legalizer does not produce a single TE compute")
    out = res.tensors
    return out if isinstance(call.ty, relax.TupleType) else out[0]


def single_op_primfunc(call: relax.Call) -> tvm.tirx.PrimFunc:
    """The PrimFunc of one op alone, built through the same path (used by classification)."""
    env = OpToTE()
    out = op_to_te(call, env)
    outs = out if isinstance(out, list) else [out]
    return te.create_prim_func(env.inputs + outs)
