"""MarkNoAlias: every PrimFunc with at most one buffer parameter gets `tirx.noalias`.

Contract: runs last in the codegen phase (after Relax's VMShapeLower made `shape_func`, the host
function that computes a symbolic build's shapes). A PrimFunc with zero or one buffer parameter
cannot alias itself, so the attribute states a fact and changes no result; PrimFuncs with more
buffers are left as they are.

Why: TVM 0.27's LLVM codegen gives every buffer of every function in the LLVM module one shared
TBAA tag once a function without `tirx.noalias` is in the module (its alias set is not reset per
function). Every symbolic build has such a function, `shape_func`; with it, the loop vectorizer
adds runtime alias checks and stores register accumulators back on every iteration, and the fused
attention of BERT-base at 384 tokens ran 2.2x slower than the same kernel compiled alone.
"""
from __future__ import annotations

import tvm

ATTR = "tirx.noalias"


@tvm.transform.module_pass(opt_level=0, name="tvmfuse.MarkNoAlias")
def MarkNoAlias(mod, _ctx):
    out = {}
    for gv, f in mod.functions_items():
        if isinstance(f, tvm.tirx.PrimFunc) and not (f.attrs and f.attrs.get(ATTR)):
            buffers = [p for p in f.params if hasattr(p, "shape")]  # TVM 0.27: a buffer parameter is its buffer
            if len(buffers) <= 1:
                out[gv] = f.with_attr(ATTR, True)
    if not out:
        return mod
    mod = mod.shallow_copy() if hasattr(mod, "shallow_copy") else tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    for gv, f in out.items():
        mod[gv] = f
    return mod
