"""The injective stages of a CUDA kernel function inlined before a matmul rule tiles it."""
from __future__ import annotations

from tvm import s_tir

from ..common import inline_injective


def inlined(func, keep=None):
    """`func` with its injective stages inlined where they can be. A tvmfuse group composed from
    several TE computes mixes int64 and int32 indices (a conv's padding over an int64 shape, its
    loops in int32), which compute_inline refuses ("mismatched types"); the indices are narrowed to
    int32 first where ForceNarrowIndexToInt32 can (_narrowable: it fails on a constant past int32
    or an int64 buffer; such a function keeps its int64 indices), as CUDA kernels index anyway. `keep(sch, info)` holds a stage back (default: none)."""
    import tvm

    if _narrowable(func):
        func = tvm.tirx.transform.ForceNarrowIndexToInt32()(tvm.IRModule({"main": func}))["main"]
    sch = s_tir.Schedule(func)
    return sch.mod["main"] if inline_injective(sch, keep=keep or (lambda sch, info: False)) is not None else func


def _narrowable(func) -> bool:
    """Whether ForceNarrowIndexToInt32 accepts `func`: no integer constant past int32 and no
    integer buffer wider than 32 bits, a parameter (gather's int64 indices) or a stage."""
    import tvm
    import tvm_ffi

    found = []

    def constant(imm):
        if int(imm.value) > 2**31 - 1:
            found.append(imm)

    def buffer(var):
        if isinstance(var.ty, tvm.tirx.BufferType):
            t = tvm.DataType(str(var.dtype))
            if t.type_code == tvm.DataTypeCode.INT and t.bits > 32:
                found.append(var)

    tvm_ffi.structural_walk(func, [(tvm.tirx.IntImm, constant), (tvm.tirx.Var, buffer)])
    return not found
