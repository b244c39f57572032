"""Small helpers over Relax functions shared by the build, the measuring runtime and the passes."""
from __future__ import annotations

import threading

import numpy as np
import tvm
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


def call_tir_sites(func: relax.Function):
    """Yield (binding var, callee GlobalVar, tensor args, out type) for each call_tir in order."""
    for block in func.body.blocks:
        for bd in block.bindings:
            v = bd.value
            if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name == "relax.call_tir":
                args = list(v.args[1].fields) if isinstance(v.args[1], relax.Tuple) else [v.args[1]]
                yield bd.var, v.args[0], args, bd.var.ty

