"""flat_views(func, want): elementwise loop nests over whole buffers, rewritten over flat views.

Contract. Takes a PrimFunc before scheduling (s_tir blocks as TE lowers them, injective stages
already inlined); returns it with each eligible top-level loop nest of its root block rewritten as
one loop over the flattened iteration space, whose block reads and writes 1-D views of the buffers
(DeclBuffer on the same data), or the function itself (the same object) when no nest is eligible.
A nest is eligible when `want(extents)` holds for its static iteration space and its block is
spatial, bound one to one to its loops, without init, allocations or matched buffers, and its one
store and each of its loads index a buffer of exactly that shape with the block's iteration
variables in order (a load may also read a scalar: a 0-d buffer or constant indices), and its value
holds only arithmetic, comparisons, casts, selects, lets and calls. Such a nest touches element k of
every buffer it indexes at iteration k, so the rewrite keeps the math element for element; only the
index arithmetic goes.

Why: a nest whose last axes are shorter than a vector (a 3x3 conv weight, [32, 32, 3, 3], in an
optimizer step) is fused into one loop and vectorized, and each lane then computes its four indices
with divisions by 288, 9 and 3 that TVM's simplifier does not fold back into the flat offset: about
ten times slower than the same nest over flat views (tests/test_flat_views.py checks the rewrite's
numerics; scripts/bench.py --train measures the optimizer steps).
"""
from __future__ import annotations

import tvm
import tvm.ir.prim.expr as prim
from tvm import ir, s_tir, tirx


class _Declined(Exception):
    """The nest holds something the rewrite does not take: it stays as it is."""


def flat_views(func, want):
    """`func` with its eligible nests over flat views (module docstring); `func` itself if none."""
    realize = func.body
    if not isinstance(realize, s_tir.SBlockRealize):
        return func
    root = realize.block
    nests = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    out, changed = [], False
    for nest in nests:
        try:
            new = _flatten(nest, want)
        except _Declined:
            new = None
        changed |= new is not None
        out.extend(new if new is not None else [nest])
    if not changed:
        return func
    body = tirx.SeqStmt(out) if len(out) > 1 else out[0]
    block = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, body, root.init,
                         root.alloc_buffers, root.match_buffers, root.annotations)
    return func.with_body(s_tir.SBlockRealize(realize.iter_values, realize.predicate, block))


def _flatten(nest, want):
    """[DeclBuffer ..., the flat loop] for an eligible nest, else None (or _Declined)."""
    loops, stmt = [], nest
    while isinstance(stmt, tirx.For):
        if stmt.kind != tirx.ForKind.SERIAL or not _is_int(stmt.min, 0) or not isinstance(stmt.extent, prim.IntImm):
            return None
        loops.append(stmt)
        stmt = stmt.body
    if not loops or not isinstance(stmt, s_tir.SBlockRealize):
        return None
    block = stmt.block
    extents = [int(lp.extent) for lp in loops]
    if not want(extents) or not _bound_one_to_one(stmt, loops):
        return None
    if block.init is not None or list(block.alloc_buffers) or list(block.match_buffers):
        return None
    store = block.body
    ivars = [iv.var for iv in block.iter_vars]
    if not isinstance(store, tirx.BufferStore) or not _identity(store.buffer, store.indices, ivars, extents):
        return None
    total = 1
    for e in extents:
        total *= e
    dtype = str(ivars[0].ty.dtype)
    v = tirx.Var("v_flat", dtype)
    views = []  # [(buffer, its flat view)]

    def view(buf, make=True):
        for b, flat in views:
            if b.same_as(buf):
                return flat
        if not make:
            return None
        flat = tirx.decl_buffer((tvm.tirx.IntImm(dtype, total),), buf.dtype, f"{buf.name}_flat", data=buf.data)
        views.append((buf, flat))
        return flat

    def swap(load):
        buf, idx = load.source, list(load.indices)
        if _identity(buf, idx, ivars, extents):
            return tirx.BufferLoad(view(buf), [v])
        if all(isinstance(i, prim.IntImm) for i in idx):  # a scalar: read as it is
            return load
        raise _Declined

    value = _rewrite(store.value, swap)
    new_store = tirx.BufferStore(view(store.buffer), value, [v])
    point = ir.Range.from_min_extent(v, tvm.tirx.IntImm(dtype, 1))
    reads = [tirx.BufferRegion(view(r.source, False), [point]) if view(r.source, False) is not None else r
             for r in block.reads]
    iv = tirx.IterVar(ir.Range.from_min_extent(tvm.tirx.IntImm(dtype, 0), tvm.tirx.IntImm(dtype, total)), v,
                      tirx.IterVar.DataPar)
    new_block = s_tir.SBlock([iv], reads, [tirx.BufferRegion(view(store.buffer), [point])], block.name_hint,
                             new_store, annotations=block.annotations)
    x = tirx.Var(loops[0].loop_var.name, dtype)
    loop = tirx.For(x, tvm.tirx.IntImm(dtype, 0), tvm.tirx.IntImm(dtype, total), tirx.ForKind.SERIAL,
                    s_tir.SBlockRealize([x], True, new_block))
    return [tirx.DeclBuffer(flat, data=buf.data) for buf, flat in views] + [loop]


def _is_int(e, value) -> bool:
    return isinstance(e, prim.IntImm) and int(e) == value


def _bound_one_to_one(realize, loops) -> bool:
    block = realize.block
    if len(block.iter_vars) != len(loops) or not _is_int(realize.predicate, 1) and realize.predicate is not True:
        return False
    for iv, val, lp in zip(block.iter_vars, realize.iter_values, loops):
        if iv.iter_type != tirx.IterVar.DataPar or not val.same_as(lp.loop_var):
            return False
        if not _is_int(iv.dom.min, 0) or not _is_int(iv.dom.extent, int(lp.extent)):
            return False
    return True


def _identity(buf, indices, ivars, extents) -> bool:
    """Whether `buf[indices]` is element k of a buffer of the iteration space's shape at iteration k."""
    shape = list(buf.shape)
    return (len(indices) == len(ivars) and all(i.same_as(v) for i, v in zip(indices, ivars))
            and len(shape) == len(extents) and all(_is_int(s, e) for s, e in zip(shape, extents)))


def _rewrite(e, swap):
    """`e` with each load replaced by swap(load); _Declined at a node it does not know."""
    if isinstance(e, ir.TensorLoad):
        return swap(e)
    if isinstance(e, (prim.IntImm, prim.FloatImm, ir.Var)) or type(e).__name__ == "StringImm":
        return e
    if isinstance(e, (prim.BinaryOpExpr, prim.CmpExpr)) or isinstance(e, (prim.And, prim.Or)):
        a, b = _rewrite(e.a, swap), _rewrite(e.b, swap)
        return e if a.same_as(e.a) and b.same_as(e.b) else type(e)(a, b)
    if isinstance(e, prim.Not):
        a = _rewrite(e.a, swap)
        return e if a.same_as(e.a) else prim.Not(a)
    if isinstance(e, prim.Cast):
        a = _rewrite(e.value, swap)
        return e if a.same_as(e.value) else prim.Cast(e.ty, a)
    if isinstance(e, prim.Select):
        parts = [_rewrite(x, swap) for x in (e.condition, e.true_value, e.false_value)]
        same = all(p.same_as(x) for p, x in zip(parts, (e.condition, e.true_value, e.false_value)))
        return e if same else prim.Select(*parts)
    if isinstance(e, prim.Let):
        value, body = _rewrite(e.value, swap), _rewrite(e.body, swap)
        return e if value.same_as(e.value) and body.same_as(e.body) else prim.Let(e.var, value, body)
    if isinstance(e, ir.Call) and isinstance(e.op, ir.Op):
        args = [_rewrite(a, swap) for a in e.args]
        if all(a.same_as(b) for a, b in zip(args, e.args)):
            return e
        return ir.Call(e.op, args, e.attrs, e.ty_args, ret_ty=e.ty)
    raise _Declined
