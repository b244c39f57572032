"""FuseGroupsTE: each planned group becomes ONE PrimFunc built from one TE compute definition.

Runs on high-level Relax (before LegalizeOps). For every dataflow block of every Relax function it
plans groups (plan_fusion.py), composes each group's ops' own TE computes (fusion/te_compose.py) into one
`te.create_prim_func`, and replaces the group's bindings by one call_tir (a tuple of outputs plus
TupleGetItem's for multi-output groups). Variables keep their identity, so nothing else is rewritten.
Singleton groups are left as they are (LegalizeOps gives them their own kernel). Guarantees: the
result is well formed and computes the same values; bindings are re-ordered topologically.

The decisions come out as a value (tvmfuse/fusion/plan.py): the module gets `tvmfuse.plan` (the whole
`Plan`, JSON; `Plan.of(mod)` reads it) and each fused PrimFunc `tvmfuse.group` (its ops, classes,
kind and rule). Kernel names are the group's ops plus `_2`, `_3`, ... where a name is taken.
Groups whose PrimFuncs are structurally equal (a transformer's layers: the weights are arguments)
share one PrimFunc, as TVM's FuseTIR shares its fused functions: it carries the first such
group's `tvmfuse.group`, and every such group's `kernel` names it (SmolLM-135M's 30 layers: 363
PrimFuncs to schedule and compile became 23). The pass keeps no state between runs (it is safe to
run from several threads at once).
"""
from __future__ import annotations

import logging

import tvm
import tvm_ffi
from tvm import relax, te

from .. import config
from .plan import FUNC_ATTR, MODULE_ATTR, Group, Plan, group_kind
from ..relax_utils import dims
from .te_compose import NotComposable, OpToTE
from . import match_attention
from .plan_fusion import plan

log = logging.getLogger("tvmfuse.fusion")


def _group_name(g, members, attention=False):
    if attention:
        return "fused_attention"
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
    extra = _unbound_vars(env.inputs + te_outs)
    pf = te.create_prim_func(env.inputs + extra + te_outs)  # scalars after the tensor inputs, as legalization does
    return pf, list(env.sources) + extra, outs


def _unbound_vars(tensors) -> list:
    """Symbolic vars the group's shapes or computations use that no buffer binds (no dim is the
    bare var: only `2 * n` after a concat, say, or a value computed from a size, as shape_to_tensor
    does). The PrimFunc takes them as scalar parameters and the call passes them (after its tensor
    arguments), as TVM's legalization does; without them the kernel cannot be compiled ("variables
    (n,) are used, but are not passed in as API arguments": found by fuzzing; "Invalid use of
    undefined variable": GPT-2 under torch.compile(dynamic=True))."""
    bare, used = [], []

    def use(v):
        if not any(v.same_as(u) for u in used):
            used.append(v)

    for t in tensors:
        for d in t.shape:
            if isinstance(d, tvm.tirx.Var) and not any(d.same_as(b) for b in bare):
                bare.append(d)
            for v in tvm.tirx.analysis.undefined_vars(d):
                use(v)
    for v in _compute_vars(tensors):
        use(v)
    return [v for v in used if not any(v.same_as(b) for b in bare)]


def _compute_vars(tensors) -> list:
    """The free vars of the TE computations behind `tensors`, beyond their own loop variables."""
    out, seen, stack = [], [], [t.op for t in tensors]
    while stack:
        op = stack.pop()
        if any(op.same_as(o) for o in seen):
            continue
        seen.append(op)
        if not isinstance(op, te.ComputeOp):
            continue
        loops = [iv.var for iv in list(op.axis) + list(op.reduce_axis)]
        for e in op.body:
            if isinstance(e, tvm.tirx.Reduce):  # its combiner's own x and y
                loops = loops + list(e.combiner.lhs) + list(e.combiner.rhs)
            for v in tvm.tirx.analysis.undefined_vars(e):
                if "int" in str(v.ty) and not any(v.same_as(x) for x in loops + out):  # sizes are integers
                    out.append(v)
        stack += [t.op for t in op.input_tensors]
    return out


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


def _plan_groups(p, b: int) -> list[Group]:
    """The block plan's groups as plan.Group values (kernel names are filled in when emitted)."""
    g = p.graph
    out = []
    for j, members in enumerate(p.groups):
        ops = tuple((g.by_idx[i].name, g.by_idx[i].op, g.by_idx[i].cls) for i in members)
        merges = tuple(p.merges.get(members[0], ()))
        kind = "flash attention" if members[0] in p.attention else group_kind(c for _, _, c in ops)
        if "horizontal" in merges:  # fuse_horizontal.py: independent nests side by side
            kind = f"horizontal ({merges.count('horizontal') + 1} independent nests)"
        out.append(Group(f"b{b}g{j}", b, j, ops, kind, merges))
    return out


def _kernel(bb, kernels: dict, taken: set, pf, base: str, grp: Group):
    """The GlobalVar that computes `pf`: one emitted before that is structurally equal to it (its
    attrs included, before `tvmfuse.group` names the group), else `pf` added under a name not yet
    taken (`base`, `base_2`, ... never a _1_1_1 chain), stamped with `grp`."""
    h = tvm_ffi.structural_hash(pf)
    for gv, other in kernels.get(h, ()):
        if tvm_ffi.structural_equal(pf, other):
            return gv
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    gv = bb.add_func(pf.with_attr(FUNC_ATTR, grp.attr()), name)  # typed GlobalVar
    kernels.setdefault(h, []).append((gv, pf))
    return gv


def _rewrite_block(bb, block, outputs, knobs, result: Plan, taken: set, kernels: dict):
    b = len(result.blocks)
    p = plan(block, outputs, knobs, block_index=b)
    g = p.graph
    groups = _plan_groups(p, b)
    result.blocks.append(len(g.nodes))
    result.groups += groups
    result.refused += p.refused
    fused = {}
    for members, grp in zip(p.groups, groups):
        if len(members) < 2:
            continue
        try:
            pf, inputs, outs = _lower_group(g, members)
        except NotComposable as err:  # planner said yes, TE said no: keep the ops unfused
            grp.te_refused = str(err)
            log.info("group %s left unfused: %s", grp.names, err)
            continue
        if members[0] in p.attention:  # the schedule rules write its online-softmax kernel from this
            try:
                pf = pf.with_attr(match_attention.SPEC_ATTR, match_attention.spec(
                    p.attention[members[0]], inputs, dims(outs[0].ty)))
            except ValueError as err:
                grp.te_refused = f"attention spec: {err}"
                log.info("group %s left unfused: %s", grp.names, grp.te_refused)
                continue
        fused[members[0]] = (members, pf, inputs, outs, grp)
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
            members, pf, inputs, outs, grp = fused[key]
            gv = _kernel(bb, kernels, taken, pf, _group_name(g, members, members[0] in p.attention), grp)
            grp.kernel = gv.name_hint
            if len(outs) == 1:
                bindings.append(relax.VarBinding(outs[0], relax.call_tir(gv, inputs, out_ty=outs[0].ty)))
            else:
                tup_ty = relax.TupleType([o.ty for o in outs])
                tv = relax.DataflowVar(gv.name_hint, tup_ty)
                bindings.append(relax.VarBinding(tv, relax.call_tir(gv, inputs, out_ty=[o.ty for o in outs])))
                bindings += [relax.VarBinding(o, relax.TupleGetItem(tv, k)) for k, o in enumerate(outs)]
        else:
            bindings += [g.bindings[pos] for pos in positions]
    return relax.DataflowBlock(bindings)


def fuse_function(func, bb, knobs, result: Plan, taken: set, kernels: dict):
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
        _rewrite_block(bb, b, outputs | later_uses, knobs, result, taken, kernels)
        if isinstance(b, relax.DataflowBlock)
        else b
        for b in blocks
    ]
    return relax.Function(func.params, relax.SeqExpr(new_blocks, body.body), func.ret_ty, func.is_pure,
                          func.attrs, func.span)


@tvm.transform.module_pass(opt_level=0, name="tvmfuse.FuseGroupsTE")
class FuseGroupsTE:
    """`FuseGroupsTE(**knobs)` or `FuseGroupsTE(knobs=config.Knobs(...))`; unknown knobs raise."""

    def __init__(self, knobs: config.Knobs | None = None, **overrides):
        self.knobs = knobs if knobs is not None else config.knobs(**overrides)

    def transform_module(self, mod, ctx):
        bb = relax.BlockBuilder()  # holds only the new PrimFuncs (unique names, typed GlobalVars)
        taken = {gv.name_hint for gv in mod.get_global_vars()}  # names in use, this run only
        result = Plan()
        new, kernels = {}, {}  # kernels: structural hash -> [(GlobalVar, PrimFunc)] emitted
        for gv, f in list(mod.functions_items()):
            if isinstance(f, relax.Function) and not (f.attrs and "Primitive" in f.attrs):
                new[gv] = fuse_function(f, bb, self.knobs, result, taken, kernels)
        out = dict(mod.functions_items())
        out.update(dict(bb.get().functions_items()))
        out.update(new)
        fused = relax.transform.Normalize()(tvm.IRModule(out, attrs=mod.attrs))
        return fused.with_attr(MODULE_ATTR, result.to_json())
