"""FuseGroupsTE: each planned group becomes ONE PrimFunc built from one TE compute definition.

Runs on high-level Relax (before LegalizeOps). For every dataflow block of every Relax function it
plans groups (plan_fusion.py), composes each group's ops' own TE computes (te_compose.py) into one
`te.create_prim_func`, and replaces the group's bindings by one call_tir (a tuple of outputs plus
TupleGetItem's for multi-output groups). Variables keep their identity, so nothing else is rewritten.
Singleton groups are left as they are (LegalizeOps gives them their own kernel). Guarantees: the
result is well formed and computes the same values; bindings are re-ordered topologically.
"""
from __future__ import annotations

import logging

import tvm
from tvm import relax, te

from ..te_compose import NotComposable, OpToTE
from .plan_fusion import plan

log = logging.getLogger("tvmfuse.fusion")
_TAKEN: list = []  # function names already used in the module being transformed


def _group_name(g, members):
    ops = []
    for i in members:
        op = g.by_idx[i].op.split(".")[-1]
        if op not in ops:
            ops.append(op)
    return "fused_" + "_".join(ops)[:60]


def _lower_group(g, members):
    """-> (PrimFunc, input exprs, output vars) for one group."""
    env = OpToTE()
    mset = set(members)
    for i in members:
        n = g.by_idx[i]
        env.bind(n.var, n.call)
        for a in n.aliases:
            env.bind(a.var, a.value)
    outs = []
    for i in members:
        n = g.by_idx[i]
        for v in [n.var] + [a.var for a in n.aliases]:
            if isinstance(v.ty, relax.TupleType):
                continue
            used_out = v in g.external_uses[i] or any(
                v in relax.analysis.free_vars(g.bindings[c].value) for c in g.users[i] - mset)
            if used_out:
                outs.append(v)
    te_outs = [env.values[v] for v in outs]
    pf = te.create_prim_func(env.inputs + te_outs)
    return pf, list(env.sources), outs


def _topo_units(g, units):
    """units: list of lists of binding positions; returns them in a dependency-respecting order."""
    unit_of = {pos: u for u, positions in enumerate(units) for pos in positions}
    var_unit = {g.bindings[pos].var: unit_of[pos] for pos in unit_of}
    deps = {u: set() for u in range(len(units))}
    for u, positions in enumerate(units):
        for pos in positions:
            for fv in relax.analysis.free_vars(g.bindings[pos].value):
                d = var_unit.get(fv)
                if d is not None and d != u:
                    deps[u].add(d)
    order, done = [], set()
    pending = sorted(range(len(units)), key=lambda u: min(units[u]))
    while pending:
        for u in pending:
            if deps[u] <= done:
                order.append(u)
                done.add(u)
                pending.remove(u)
                break
        else:  # pragma: no cover - legality forbids cycles
            raise RuntimeError("fusion plan has a cycle")
    return order


def _rewrite_block(bb, block, outputs, knobs, report):
    p = plan(block, outputs, knobs)
    g = p.graph
    report.append(p)
    fused = {}
    for members in p.groups:
        if len(members) < 2:
            continue
        try:
            pf, inputs, outs = _lower_group(g, members)
        except NotComposable as err:  # planner said yes, TE said no: keep the ops unfused
            log.info("group %s left unfused: %s", [g.by_idx[i].name for i in members], err)
            continue
        fused[members[0]] = (members, pf, inputs, outs)
    if not fused:
        return block
    group_positions = {key: [q for i in m for q in g.by_idx[i].positions()] for key, (m, *_r) in fused.items()}
    grouped = {q for qs in group_positions.values() for q in qs}
    units = [group_positions[pos] if pos in group_positions else [pos]
             for pos in range(len(g.bindings)) if pos in group_positions or pos not in grouped]
    bindings = []
    for u in _topo_units(g, units):
        positions = units[u]
        key = positions[0]
        if key in fused:
            members, pf, inputs, outs = fused[key]
            base = name = _group_name(g, members)
            k = 1
            while name in _TAKEN[-1]:  # fused_conv2d_add_relu, _2, _3, ... (never a _1_1_1 chain)
                k += 1
                name = f"{base}_{k}"
            _TAKEN[-1].add(name)
            gv = bb.add_func(pf, name)  # typed GlobalVar
            if len(outs) == 1:
                bindings.append(relax.VarBinding(outs[0], relax.call_tir(gv, inputs, out_ty=outs[0].ty)))
            else:
                tup_ty = relax.TupleType([o.ty for o in outs])
                tv = relax.DataflowVar(name, tup_ty)
                bindings.append(relax.VarBinding(tv, relax.call_tir(gv, inputs, out_ty=[o.ty for o in outs])))
                bindings += [relax.VarBinding(o, relax.TupleGetItem(tv, k)) for k, o in enumerate(outs)]
        else:
            bindings += [g.bindings[pos] for pos in positions]
    return relax.DataflowBlock(bindings)


def fuse_function(func, bb, knobs, report):
    body = func.body
    outputs = set(relax.analysis.free_vars(body.body))
    later_uses = set()
    blocks = list(body.blocks)
    for i, blk in enumerate(blocks):
        if isinstance(blk, relax.DataflowBlock):
            for other in blocks[i + 1:]:
                for bd in other.bindings:
                    later_uses |= set(relax.analysis.free_vars(bd.value))
    new_blocks = [
        _rewrite_block(bb, b, outputs | later_uses, knobs, report) if isinstance(b, relax.DataflowBlock) else b
        for b in blocks
    ]
    return relax.Function(func.params, relax.SeqExpr(new_blocks, body.body), func.ret_ty, func.is_pure,
                          func.attrs, func.span)


@tvm.transform.module_pass(opt_level=0, name="tvmfuse.FuseGroupsTE")
class FuseGroupsTE:
    def __init__(self, **knobs):
        self.knobs = knobs
        self.report = []

    def transform_module(self, mod, ctx):
        bb = relax.BlockBuilder()  # holds only the new PrimFuncs (unique names, typed GlobalVars)
        _TAKEN.append({gv.name_hint for gv in mod.get_global_vars()})
        new = {}
        for gv, f in list(mod.functions_items()):
            if isinstance(f, relax.Function) and not (f.attrs and "Primitive" in f.attrs):
                new[gv] = fuse_function(f, bb, self.knobs, self.report)
        _TAKEN.pop()
        out = dict(mod.functions_items())
        out.update(dict(bb.get().functions_items()))
        out.update(new)
        return relax.transform.Normalize()(tvm.IRModule(out, attrs=mod.attrs))
