"""Pre-pack constant weights at build time: the packing stage a schedule rule put in front of a
matmul runs once, when the model is built, instead of on every call.

Two module passes around the default schedules (pipeline.py):

  MarkConstantParams   runs after the graph passes (every PrimFunc is called by call_tir from main),
                       before the schedules. Stamps each PrimFunc with `tvmfuse.constant_params`:
                       the indices of the parameters that are a Relax constant at every call site.
                       A parameter that is an activation at one site is not listed.
  PrepackWeights       runs after the schedules, on llvm. A rule that packs an operand listed there
                       (cpu_matmul._pack_panels) marks the packing block
                       `meta_schedule.layout_rewrite_preproc`; TVM's SplitLayoutRewritePreproc moves
                       each such block into a PrimFunc of its own, called on the constant, and
                       FoldConstant evaluates that call at build time. The compute kernel then reads
                       the packed constant. Without marked blocks the module is unchanged.

Contract: the values computed do not change (the packed constant holds the same numbers); the
kernel count does not change for any call whose packed operand is constant (the split-off call is
folded away), and no split happens for a non-constant operand (it is never marked).
"""
from __future__ import annotations

import tvm
from tvm import relax

from ..relax_utils import call_tir_sites

CONSTANT_PARAMS = "tvmfuse.constant_params"
PREPROC = "meta_schedule.layout_rewrite_preproc"


@tvm.transform.module_pass(opt_level=0, name="MarkConstantParams")
def MarkConstantParams(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    constant: dict = {}
    for _gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        for _var, callee, args, _ty in call_tir_sites(func):
            here = {i for i, a in enumerate(args) if isinstance(a, tvm.ir.expr.Constant)}
            name = callee.name_hint
            constant[name] = constant[name] & here if name in constant else here
    out = mod.clone() if hasattr(mod, "clone") else mod
    for gv, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc) and constant.get(gv.name_hint):
            out[gv] = func.with_attr(CONSTANT_PARAMS, sorted(constant[gv.name_hint]))
    return out


def _has_preproc(func) -> bool:
    return isinstance(func, tvm.tirx.PrimFunc) and PREPROC in func.script()


@tvm.transform.module_pass(opt_level=0, name="PrepackWeights")
def PrepackWeights(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    marked = {gv for gv, f in mod.functions_items() if _has_preproc(f)}
    if not marked:
        return mod
    T = relax.transform
    # SplitLayoutRewritePreproc fails on a PrimFunc without blocks (GPT-2's cumsum): give it the
    # Relax functions and the marked PrimFuncs only
    part = tvm.IRModule({gv: f for gv, f in mod.functions_items()
                         if gv in marked or isinstance(f, relax.Function)}, attrs=mod.attrs)
    part = T.SplitLayoutRewritePreproc()(part)
    rest = {gv: f for gv, f in mod.functions_items() if gv not in marked and not isinstance(f, relax.Function)}
    mod = tvm.IRModule({**rest, **dict(part.functions_items())}, attrs=mod.attrs)
    mod = T.DeadCodeElimination()(T.FoldConstant()(mod))
    # the split-off packing functions, folded away, and the unsplit originals are called by no one
    called = {callee for _gv, f in mod.functions_items() if isinstance(f, relax.Function)
              for _v, callee, _a, _t in call_tir_sites(f)}
    return tvm.IRModule({gv: f for gv, f in mod.functions_items()
                         if isinstance(f, relax.Function) or gv in called}, attrs=mod.attrs)
