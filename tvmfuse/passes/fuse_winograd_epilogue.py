"""FuseWinogradEpilogue: Winograd's output transform, its layout change back to NCHW and the
elementwise chain after it (bias, activation, residual) become one kernel (the tvmfuse variant).

Contract. In every dataflow block of every Relax function, a chain

  Y  = call_tir(winograd_output, [M])     # a PrimFunc with `tvmfuse.winograd` (passes/winograd.py)
  r  = reshape(Y, [1, m*th, m*tw, O]);  t = permute_dims(r, [0, 3, 1, 2]);  [s = strided_slice(t)]
  e1 = op1(s, ...);  e2 = op2(e1, ...);  ...  ek = opk(e(k-1), ...)

becomes  ek = call_tir(fused, [M, operands...]), one PrimFunc built from one TE compute: the
transform's own TE (winograd.output_compute) read through the NCHW index, then each e_i's own TE
(te_compose.OpToTE). The chain takes ops while the value so far has exactly one use, is not a
block output, and its user is elementwise or broadcast (fusion/classify.py) to the same [1, O, H, W]
shape, or an inference batch_norm over channels whose tuple only gives its output (statistics
that are inputs, so FoldBatchNorm left it; one link with its TupleGetItem); where it stops, the
reason is logged. The layout change alone is fused too (no e_i). Each
link must be the winograd pass's own: a reshape, permute or slice of any other form refuses the
whole chain (logged) and the block is left as it was. Values and variables keep their identity:
ek is the same Var, bound at the last link's position (every operand is bound before it).

Why: stock FuseOps sees the transform as an opaque call_tir and fuses only the layout change with
the epilogue: a second kernel that re-reads and transposes the whole output. Here the transform's
channel vectors are stored straight to NCHW (strided stores), the epilogue applied in registers.

Numerics: the same expressions in the same order; only where they are stored changes.
Must not fire: a call_tir of any other PrimFunc; a chain whose links are not the winograd pass's
reshape / permute / slice. Runs in the tvmfuse variant only (passes/__init__.py), before
FuseGroupsTE (so the epilogue is not planned into another group), on llvm builds (the only
ones the winograd pass rewrites).
"""
from __future__ import annotations

import logging
from collections import defaultdict

import tvm
from tvm import relax, s_tir, te

from ..fusion.classify import BROADCAST, ELEMENTWISE, classify_call
from ..relax_utils import dims, static_ints
from ..fusion.te_compose import NotComposable, OpToTE
from .winograd import WINOGRAD_ATTR, _mark, output_compute, schedule_tiles

log = logging.getLogger("tvmfuse.fusion")


def _sizes(func):
    """The sizes (o, h, w, m, lanes) of a Winograd output transform PrimFunc, else None."""
    if not isinstance(func, tvm.tirx.PrimFunc) or not func.attrs or WINOGRAD_ATTR not in func.attrs:
        return None
    return {k: int(v) for k, v in func.attrs[WINOGRAD_ATTR].items()}


def _winograd_output(mod, value):
    """The sizes when `value` is call_tir of a Winograd output transform, else None."""
    if not (isinstance(value, relax.Call) and value.op.same_as(tvm.ir.Op.get("relax.call_tir"))):
        return None
    gv = value.args[0]
    return _sizes(mod[gv]) if isinstance(gv, tvm.ir.GlobalVar) and gv in mod.get_global_vars() else None


def _op(value, name):
    return isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == name


def _layout_links(bindings, users, start, sz):
    """Positions of the reshape, permute and optional slice after Y (bound at `start`), or a reason."""
    o, h, w, m = sz["o"], sz["h"], sz["w"], sz["m"]
    th, tw = -(-h // m), -(-w // m)
    chain, pos = [], start
    expect = [("relax.reshape", lambda v: static_ints(v.args[1].values) == [1, m * th, m * tw, o]),
              ("relax.permute_dims", lambda v: static_ints(v.attrs.axes) == [0, 3, 1, 2])]
    if (m * th, m * tw) != (h, w):
        expect.append(("relax.strided_slice", lambda v: dims(v.ty) == (1, o, h, w)))
    for name, ok in expect:
        us = users[bindings[pos].var]
        if len(us) != 1 or not _op(bindings[us[0]].value, name) or not ok(bindings[us[0]].value):
            return f"the link after {bindings[pos].var.name} is not the winograd pass's {name.split('.')[-1]}"
        pos = us[0]
        chain.append(pos)
    return chain


def _epilogue(bindings, users, live, pos, shape):
    """Positions of the elementwise chain after `pos`, and why it stops."""
    chain = []
    while True:
        var = bindings[pos].var
        if var in live:
            return chain, f"{var.name} is used after the block"
        us = users[var]
        if len(us) != 1:
            return chain, f"{var.name} has {len(us)} uses"
        value = bindings[us[0]].value
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return chain, f"{bindings[us[0]].var.name} is not an op call"
        if _op(value, "relax.nn.batch_norm"):  # with its TupleGetItem(., 0): one per-channel link
            item = _batch_norm_output(bindings, users, live, us[0], shape)
            if isinstance(item, str):
                return chain, item
            pos = item
            chain += [us[0], item]
            continue
        cls, why, _ = classify_call(value)
        if cls not in (ELEMENTWISE, BROADCAST):
            return chain, f"{value.op.name} is {cls}: {why}"
        if dims(value.ty) != shape:
            return chain, f"{value.op.name} makes shape {dims(value.ty)}, not {shape}"
        pos = us[0]
        chain.append(pos)


def _batch_norm_output(bindings, users, live, pos, shape):
    """The position of `TupleGetItem(bn, 0)` when the batch_norm bound at `pos` is an inference
    one over channels (axis 1) whose tuple is read only there, with the chain's shape; else why not."""
    bn = bindings[pos]
    if bool(bn.value.attrs.training) or int(bn.value.attrs.axis) != 1:
        return f"{bn.var.name} is a batch_norm in training mode or over axis {int(bn.value.attrs.axis)}"
    us = users[bn.var]
    item = bindings[us[0]] if len(us) == 1 else None
    if bn.var in live or item is None or not isinstance(item.value, relax.TupleGetItem) or item.value.index != 0:
        return f"{bn.var.name}'s statistics outputs are read"
    if dims(item.var.ty) != shape:
        return f"batch_norm makes shape {dims(item.var.ty)}, not {shape}"
    return us[0]


def _kernel(mod, bindings, y_pos, links, sz):
    """(PrimFunc, call_tir arguments) of the chain; NotComposable when an op's TE cannot join."""
    o, h, w, m = sz["o"], sz["h"], sz["w"], sz["m"]
    m_var = bindings[y_pos].value.args[1].fields[0]
    env = OpToTE()
    mph = te.placeholder(list(m_var.ty.shape.values), "float32", name="M")  # int64, as Relax ops' TE
    env.inputs.append(mph)
    env.sources.append(m_var)
    y = output_compute(mph, o, h, w, m, "int64")
    layout_end, epilogue = links
    env.values[bindings[layout_end[-1]].var] = te.compute(
        tuple(tvm.tirx.IntImm("int64", d) for d in (1, o, h, w)),
        lambda _, k, i, j: y[i // m, i % m, j // m, j % m, k], name="nchw")
    for pos in epilogue:
        env.bind(bindings[pos].var, bindings[pos].value)
    out = env.values[bindings[(epilogue or layout_end)[-1]].var]
    return _schedule(te.create_prim_func(env.inputs + [out]), sz), list(env.sources)


def _schedule(func, sz):
    """Every stage but S (the transform's first pass) inlined into the NCHW output, whose loops are
    the transform's own (winograd.schedule_tiles): each channel vector stored to its NCHW rows."""
    from schedules.common import inline_injective

    m = sz["m"]
    sch = s_tir.Schedule(func)
    infos = inline_injective(sch, keep=lambda s, info: s.get(info.block_rv).name_hint == "S")
    if infos is None or len(infos) != 2:
        raise NotComposable(f"the fused chain did not inline to S and one block ({infos and len(infos)} left)")
    k, i, j = sch.get_loops(infos[-1].block_rv)[-3:]  # (the batch loop of extent 1 may be gone)
    ty, u = sch.split(i, [None, m])
    tx, v = sch.split(j, [None, m])
    schedule_tiles(sch, ty, u, tx, v, k, sz["o"], sz["lanes"])
    return _mark(sch.mod["main"], "winograd.OutputTransform")


def _rewrite_block(mod, bb, block, live):
    bindings = list(block.bindings)
    users = defaultdict(list)
    for pos, b in enumerate(bindings):
        for v in relax.analysis.free_vars(b.value):
            users[v].append(pos)
    replace, drop = {}, set()
    for pos, b in enumerate(bindings):
        sz = _winograd_output(mod, b.value)
        if sz is None or b.var in live:
            continue
        layout = _layout_links(bindings, users, pos, sz)
        if isinstance(layout, str):
            log.info("winograd output %s stays a kernel of its own: %s", b.var.name, layout)
            continue
        epilogue, stop = _epilogue(bindings, users, live, layout[-1], (1, sz["o"], sz["h"], sz["w"]))
        try:
            func, args = _kernel(mod, bindings, pos, (layout, epilogue), sz)
        except NotComposable as err:
            log.info("winograd output %s stays a kernel of its own: %s", b.var.name, err)
            continue
        last = (epilogue or layout)[-1]
        names = [bindings[q].value.op.name.split(".")[-1] for q in epilogue
                 if isinstance(bindings[q].value, relax.Call)]
        log.info("winograd output %s fused with its layout change and %s (the chain stops: %s)",
                 b.var.name, ", ".join(names) or "no epilogue", stop)
        gv = bb.add_func(func, "fused_winograd_output_" + "_".join(names) if names else "winograd_output_nchw")
        out = bindings[last].var
        replace[last] = relax.VarBinding(out, relax.call_tir(gv, args, out_ty=out.ty))
        drop |= {pos, *layout, *epilogue} - {last}
    if not replace:
        return block
    return relax.DataflowBlock([replace.get(q, b) for q, b in enumerate(bindings) if q not in drop])


def _live(func):
    """Vars each dataflow block must keep: the function's outputs and what later blocks read."""
    live = set(relax.analysis.free_vars(func.body.body))
    for blk in func.body.blocks:
        if not isinstance(blk, relax.DataflowBlock):
            for b in blk.bindings:
                live |= set(relax.analysis.free_vars(b.value))
    return live


@tvm.transform.module_pass(opt_level=0, name="tvmfuse.FuseWinogradEpilogue")
def FuseWinogradEpilogue(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    new = {}
    for gv, f in list(mod.functions_items()):
        if not isinstance(f, relax.Function) or not isinstance(f.body, relax.SeqExpr):
            continue
        live = _live(f)
        later = set()
        blocks = list(f.body.blocks)
        out_blocks = []
        for i, blk in enumerate(blocks):
            later = set()
            for other in blocks[i + 1:]:
                for b in other.bindings:
                    later |= set(relax.analysis.free_vars(b.value))
            out_blocks.append(_rewrite_block(mod, bb, blk, live | later)
                              if isinstance(blk, relax.DataflowBlock) else blk)
        if any(not a.same_as(b) for a, b in zip(out_blocks, blocks)):
            new[gv] = relax.Function(f.params, relax.SeqExpr(out_blocks, f.body.body), f.ret_ty, f.is_pure,
                                     f.attrs, f.span)
    if not new:
        return mod
    out = dict(mod.functions_items())
    out.update(dict(bb.get().functions_items()))
    out.update(new)
    called = {gv for f in out.values() if isinstance(f, relax.Function) for gv in relax.analysis.all_global_vars(f)}
    for gv in [gv for gv, f in out.items() if _sizes(f) and gv not in called]:  # now inside a fused kernel
        del out[gv]
    return relax.transform.Normalize()(tvm.IRModule(out, attrs=mod.attrs))
