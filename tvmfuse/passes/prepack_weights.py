"""Pre-pack constant weights at build time: the packing stage a schedule rule put in front of a
matmul runs once, when the model is built, instead of on every call.

Two module passes around the default schedules (pipeline.py):

  MarkConstantParams   runs after the graph passes (every PrimFunc is called by call_tir from main),
                       before the schedules. Stamps each PrimFunc with `tvmfuse.constant_params`:
                       the indices of the parameters that are a Relax constant at every call site.
                       A parameter that is an activation at one site is not listed.
  PrepackWeights       runs after the schedules, on llvm. A rule that packs an operand listed there
                       (schedules.common.pack_at_build_time) marks the packing block
                       `meta_schedule.layout_rewrite_preproc` (and the root block
                       `tvmfuse.prepack`); TVM's SplitLayoutRewritePreproc moves
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
    """The rule that marked a packing block also marked the root block (schedules.common)."""
    root = getattr(func.body, "block", None) if isinstance(func, tvm.tirx.PrimFunc) else None
    return root is not None and "tvmfuse.prepack" in root.annotations


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
    from .fold_constants import fold_all  # every packing in one build, then TVM's pass for the rest

    mod = T.Normalize()(_keep_names(T.DeadCodeElimination()(fold_all()(mod))))
    # the split-off packing functions, folded away, and the unsplit originals are referenced by no one
    called = {gv for _gv, f in mod.functions_items() if isinstance(f, relax.Function)
              for gv in relax.analysis.all_global_vars(f)}
    return tvm.IRModule({gv: f for gv, f in mod.functions_items()
                         if isinstance(f, relax.Function) or gv in called}, attrs=mod.attrs)


def _keep_names(mod: tvm.IRModule) -> tvm.IRModule:
    """SplitLayoutRewritePreproc binds the kernel's output to a new var and the original one to it
    (`lv1 = call_tir(..); lv4 = lv1`): put the call back on the original var, so the profile and
    the report still name each kernel's output as the fusion plan does."""
    out = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        uses: dict = {}
        for blk in func.body.blocks:
            for bd in blk.bindings:
                for v in relax.analysis.free_vars(bd.value):
                    uses[v] = uses.get(v, 0) + 1
        for v in relax.analysis.free_vars(func.body.body):
            uses[v] = uses.get(v, 0) + 1
        blocks = []
        for blk in func.body.blocks:
            calls = {bd.var for bd in blk.bindings if isinstance(bd.value, relax.Call)}
            alias = {bd.value: bd.var for bd in blk.bindings
                     if isinstance(bd.value, relax.Var) and bd.value in calls and uses.get(bd.value) == 1}
            new = []
            for bd in blk.bindings:
                if bd.var in alias:
                    new.append(relax.VarBinding(alias[bd.var], bd.value))
                elif not (isinstance(bd.value, relax.Var) and bd.value in alias):
                    new.append(bd)
            blocks.append(type(blk)(new))
        out[gv] = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
                                 func.attrs, func.span)
    return tvm.IRModule({**dict(mod.functions_items()), **out}, attrs=mod.attrs)
