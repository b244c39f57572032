"""FoldConstantsOnce: evaluate every binding whose inputs are all constants, with ONE build.

Contract. In each binding block at the top of each Relax function, a binding `v = op(args)` is
foldable when:
  - op is a TVM operator that is pure and has a legalization (FLegalize), or a call_tir of a
    PrimFunc of the module (PrepackWeights' split-off packing of a constant weight); not a packed
    function or a call of a Relax function;
  - every argument is a Constant, a foldable var, or a non-tensor literal (shape, PrimValue)
    without symbolic variables;
  - its result is a tensor of static shape of at most `SMALL` elements, or at most `GROWTH` times
    the elements of its tensor inputs (a broadcast of a scalar to a large tensor is not made a
    large constant). A creation op (arange, full) with no tensor input folds under the first rule
    only: transformers builds BERT's attention mask from an arange, and folded, an all-zero mask
    can go (passes/shrink_constant_operands.py).
The foldable vars that anything else uses (a later binding that is not foldable, a later block,
the function's result) are computed by one Relax function, built once with relax.build for the
host and run once; each of those bindings becomes its Constant, every use reads the Constant
directly, and the other foldable bindings (dead from then on) are dropped. The values are TVM's
own (each op's LegalizeOps lowering), the ones relax.transform.FoldConstant would compute.

Why. relax.transform.FoldConstant builds and runs one LLVM module per folded call: ResNet-50's 53
decomposed BatchNorms are about 320 builds, about 17 s on a 2-core EPYC, most of import time, and
BERT-base's 74 weight packings 5 s of its build. One module for all of them takes about a second. FoldConstant still runs after this pass, for anything
declined here.

Must not fire: an impure op, an op without legalization, an argument that is a function input or
any other non-constant var, a symbolic shape, a result that grows past the guard, a block with
nothing foldable.
"""
from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relax

from .. import config
from ..errors import fall_back_or_raise
from ..relax_utils import static_shape

log = logging.getLogger("tvmfuse.passes")

GROWTH = 1  # a folded result may have as many elements as its tensor inputs together ...
SMALL = 1 << 14  # ... or this many elements, whatever it grows from


def _static_numel(ty):
    shape = static_shape(ty)
    return None if shape is None else int(np.prod(shape, dtype=np.int64))


def _foldable(bd, known, prim_funcs) -> bool:
    val = bd.value
    if not isinstance(bd, relax.VarBinding) or not isinstance(val, relax.Call) or not isinstance(val.op, tvm.ir.Op):
        return False
    op = val.op
    args = list(val.args)
    if op.name == "relax.call_tir":  # a PrimFunc of this module on constants (a weight's packing)
        if len(args) != 2 or not isinstance(prim_funcs.get(args[0]), tvm.tirx.PrimFunc) \
                or not isinstance(args[1], relax.Tuple):
            return False
        args = list(args[1].fields)
    elif op.get_attr("FLegalize") is None or not op.get_attr("FPurity") or op.name.startswith("relax.call_"):
        return False
    out = _static_numel(bd.var.ty)
    if out is None:
        return False
    tensors_in = 0
    for a in args:
        if isinstance(a.ty, relax.TensorType) and (isinstance(a, tvm.ir.expr.Constant) or a in known):
            n = _static_numel(a.ty)
            if n is None:
                return False
            tensors_in += n
        elif isinstance(a, relax.Var) or isinstance(a.ty, relax.TensorType):
            return False
        elif relax.analysis.free_vars(a) or relax.analysis.free_symbolic_vars(a):
            return False
    return out <= SMALL or (tensors_in > 0 and out <= GROWTH * tensors_in)


def _plan(func, prim_funcs):
    """(foldable bindings in order, the ones needed outside the foldable set)."""
    blocks = list(func.body.blocks)
    known, order = set(), []
    for blk in blocks:
        for bd in blk.bindings:
            if _foldable(bd, known, prim_funcs):
                known.add(bd.var)
                order.append(bd)
    if not order:
        return [], []
    used_outside = set(relax.analysis.free_vars(func.body.body))
    for blk in blocks:
        for bd in blk.bindings:
            if bd.var not in known:
                used_outside.update(relax.analysis.free_vars(bd.value))
    frontier = [bd.var for bd in order if bd.var in used_outside]
    return order, frontier


def _evaluate(order, frontier, prim_funcs):
    """Build one function computing the frontier vars from the foldable bindings; run it once."""
    remap = {bd.var: relax.DataflowVar(bd.var.name, bd.var.ty) for bd in order}
    bind = _Bind(remap)
    bindings = [relax.VarBinding(remap[bd.var], bind.visit_expr(bd.value)) for bd in order]
    out = relax.Var("folded", relax.TupleType([v.ty for v in frontier]))
    bindings.append(relax.VarBinding(out, relax.Tuple([remap[v] for v in frontier])))
    func = relax.Function([], relax.SeqExpr([relax.DataflowBlock(bindings)], out), out.ty)
    called = {gv for bd in order for gv in relax.analysis.all_global_vars(bd.value)}
    # each PrimFunc exported under its GlobalVar's (unique) name: a kernel from te.create_prim_func
    # or TVMScript names itself "main", so SplitLayoutRewritePreproc names the packings of two such
    # kernels both "main_weight_prepack", a duplicate relax.build rejects (resnet-tiny, bert-tiny)
    mod = tvm.IRModule({"main": func, **{gv: prim_funcs[gv].with_attr("global_symbol", gv.name_hint)
                                         for gv in called}})
    ex = relax.build(mod, target=tvm.target.Target({"kind": "llvm"}))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    res = vm["main"]()
    return [np.asarray(r.numpy()) for r in res]


@relax.expr_functor.mutator
class _Bind(relax.PyExprMutator):
    def __init__(self, remap):
        super().__init__()
        self.remap = remap

    def visit_var_(self, var):
        return self.remap.get(var, var)

    def visit_dataflow_var_(self, var):
        return self.remap.get(var, var)


def _rewrite(func, values, folded=()):
    """Each frontier binding becomes its constant, and every use of it reads the constant directly
    (as FoldConstant does: later passes such as FoldBatchNorm look for Constant arguments). The other
    `folded` bindings (foldable, used only by foldable ones) are dead once the frontier is constant:
    they are dropped here, else FoldConstant, which runs next, builds one module per dead binding
    (MobileNetV2's 104 BatchNorm pieces, 10 s) before DeadCodeElimination drops them."""
    consts = {v: relax.const(a, str(v.ty.dtype)) for v, a in values.items()}
    dead = set(folded) - set(consts)
    bind = _Bind(consts)
    blocks = []
    for blk in func.body.blocks:
        new = [relax.VarBinding(bd.var, consts[bd.var]) if bd.var in consts
               else relax.VarBinding(bd.var, bind.visit_expr(bd.value)) if isinstance(bd, relax.VarBinding)
               else bd for bd in blk.bindings if bd.var not in dead]
        blocks.append(relax.DataflowBlock(new) if isinstance(blk, relax.DataflowBlock) else relax.BindingBlock(new))
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
                          func.attrs, func.span)


@tvm.transform.module_pass(opt_level=0, name="tvmfuse.FoldConstantsOnce")
def FoldConstantsOnce(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    out = {}
    prim_funcs = {gv: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        order, frontier = _plan(func, prim_funcs)
        if not frontier:
            continue
        try:
            arrays = _evaluate(order, frontier, prim_funcs)
        except Exception as err:  # noqa: BLE001  every binding passed _foldable: a failure is a bug, surfaced;
            # without the strict knob FoldConstant, which runs next, folds the bindings instead
            fall_back_or_raise(log, err, f"FoldConstantsOnce on {gv.name_hint}", config.knobs().strict)
            continue
        out[gv] = _rewrite(func, dict(zip(frontier, arrays)), [bd.var for bd in order])
    if not out:
        return mod
    return tvm.IRModule({**dict(mod.functions_items()), **out}, attrs=mod.attrs)


def fold_all() -> tvm.transform.Pass:
    """Every constant folded: FoldConstantsOnce (one build), then TVM's FoldConstant for what it
    declined. The one composition the importers, the pipeline and PrepackWeights use."""
    return tvm.transform.Sequential([FoldConstantsOnce, relax.transform.FoldConstant()], name="tvmfuse.FoldAll")
