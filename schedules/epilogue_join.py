"""Joining an epilogue to a matmul / conv tile (`join_tile`): reverse_compute_at, tried on a copy
and kept only when the joined nest provably computes every point of the epilogue exactly once."""
from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import s_tir
from tvm.sym import Analyzer


def spatial_points(sch, block_rv):
    """The number of points a block computes: the product of its spatial iterators' extents (take
    it before pad_einsum pads the domain)."""
    return _product(iv.dom.extent for iv in sch.get(block_rv).iter_vars if int(iv.iter_type) == 0)


def join_tile(sch, block_rv, loop_rv, produced=None) -> bool:
    """reverse_compute_at(block, loop) when the tile's region maps to a rectangle of the block's
    own domain; False (nothing changed) otherwise. A reshape between the tile and the epilogue can
    make it a ragged staircase: a [16, 49] tile of columns read back as [16, 7, 7] covers parts
    of several rows. TVM then sizes the epilogue's loops by expressions of the outer loop and a
    predicate that misses points (measured: wrong results for a 1x1 conv on a flattened map). So
    the join is tried on a copy first, and kept only when every loop it made has a constant
    extent, the sign of an exact rectangle (a ragged tile's predicate on constant loops is fine).
    `produced` (spatial_points of the tile's block, unpadded) bounds what the join can cover: the
    loops of a padded or predicated tile visit more points than it writes, so an epilogue larger
    than the tile's real output (a concat with another tensor) must not pass on the loop count
    (found by fuzzing, seed 80358: a ragged N = 49 matmul + concat left two rows unwritten)."""
    trial = sch.copy()
    points = _product(iv.dom.extent for iv in sch.get(block_rv).iter_vars)  # the epilogue's own domain
    try:
        trial.reverse_compute_at(block_rv, loop_rv, preserve_unit_loops=True)
    except (tvm.s_tir.ScheduleError, tvm.error.InternalError, ValueError):  # e.g. a strided read of a
        return False  # transposed tile (TVM's inverse affine map checks that each iterator's scale is
        # 1), or a padding read through a reshape (ValueError: "TensorRegion pattern match failed";
        # MobileNetV2's 1x1 conv as a matmul, then the next depthwise conv's padding: cpu.Fallback)
    loops = trial.get_loops(block_rv)
    at = trial.get(loop_rv)
    k = next(i for i, lp in enumerate(loops) if trial.get(lp).same_as(at))
    if not all(isinstance(trial.get(lp).extent, tvm.tirx.IntImm) for lp in loops[k + 1:]):
        return False
    # the joined nest must still visit every point of the epilogue: a concat of the tile with
    # another tensor is larger than the tile, and the part the tile does not produce would never
    # be written (found by fuzzing: rows of a matmul+concat left uninitialised)
    visited = _product(trial.get(lp).extent for lp in loops)
    # unprovable: decline (a symbolic concat, 2n rows)
    if not _at_least(visited, points) or (produced is not None and not _at_least(produced, points)):
        return False
    # ... and visit each point once: more visits are fine only where a predicate masks them (a
    # ragged tile's). An epilogue reading one fixed batch of a batched matmul (a slice of batch 0)
    # joined under the batch loop was recomputed in every batch's tile, reading batches not yet
    # computed: wrong results (Winograd's output transform, 16 slices of one batched matmul)
    if not _at_least(points, visited) and not _predicated(trial, block_rv):
        return False
    if not _reads_every_outer_loop(trial, block_rv, loops[: k + 1]):
        return False
    # ... and, where the nest is small enough to enumerate, cover each point exactly once: a zero
    # padding joined to a ragged tile (a matmul's rows, then the next conv's padding) mapped the
    # tile's rows to rows 1..13 of 14 and left the border row unwritten (fuzzing, seed 150)
    if _covers_exactly(trial, block_rv) is False:
        return False
    sch.reverse_compute_at(block_rv, loop_rv, preserve_unit_loops=True)
    return True


_ENUMERATE_LIMIT = 1 << 20  # joined nests up to this many iterations are checked point by point


def _covers_exactly(sch, block_rv):
    """True when the block's iterations in its joined nest (predicate applied) hit every point of
    its domain exactly once; False when they do not; None when it cannot tell (symbolic extents, a
    nest over the enumeration limit, an expression it does not evaluate)."""
    loops = [sch.get(lp) for lp in sch.get_loops(block_rv)]
    if not all(isinstance(lp.extent, tvm.tirx.IntImm) and isinstance(lp.min, tvm.tirx.IntImm) for lp in loops):
        return None
    extents = [int(lp.extent) for lp in loops]
    total = int(np.prod(extents, dtype=np.int64)) if extents else 1
    if total > _ENUMERATE_LIMIT:
        return None
    name, found = sch.get(block_rv).name_hint, []
    tvm_ffi.structural_walk(sch.mod["main"].body, (s_tir.SBlockRealize, lambda r: found.append(r)
                                                   if r.block.name_hint == name else None), order="post")
    if len(found) != 1:
        return None
    realize = found[0]
    grid = np.indices(extents, dtype=np.int64).reshape(len(extents), -1) if extents else np.zeros((0, 1), np.int64)
    env = {lp.loop_var.name: grid[i] + int(lp.min) for i, lp in enumerate(loops)}
    try:
        keep = np.broadcast_to(np.asarray(_evaluate(realize.predicate, env), dtype=bool), (grid.shape[1],))
        values = [np.broadcast_to(_evaluate(v, env), (grid.shape[1],))[keep] for v in realize.iter_values]
    except _NotEvaluable:
        return None
    doms = [iv.dom for iv in realize.block.iter_vars]
    if not all(isinstance(d.extent, tvm.tirx.IntImm) and isinstance(d.min, tvm.tirx.IntImm) for d in doms):
        return None
    flat = np.zeros(int(keep.sum()), dtype=np.int64)
    size = 1
    for v, d in zip(values, doms):
        lo, n = int(d.min), int(d.extent)
        if v.size and (v.min() < lo or v.max() >= lo + n):
            return False
        flat = flat * n + (v - lo)
        size *= n
    if flat.size != size:
        return False
    seen = np.zeros(size, dtype=bool)
    seen[flat] = True
    return bool(seen.all())


class _NotEvaluable(Exception):
    pass


def _evaluate(e, env):
    """A TIR integer/boolean expression over loop variables, evaluated on numpy arrays."""
    t = tvm.tirx
    if isinstance(e, t.IntImm):
        return np.int64(int(e))
    if isinstance(e, t.Var):
        if e.name not in env:
            raise _NotEvaluable(e.name)
        return env[e.name]
    if isinstance(e, t.Cast):
        return _evaluate(e.value, env)
    binary = {t.Add: np.add, t.Sub: np.subtract, t.Mul: np.multiply, t.FloorDiv: np.floor_divide,
              t.FloorMod: np.mod, t.Min: np.minimum, t.Max: np.maximum, t.LT: np.less, t.LE: np.less_equal,
              t.GT: np.greater, t.GE: np.greater_equal, t.EQ: np.equal, t.NE: np.not_equal,
              t.And: np.logical_and, t.Or: np.logical_or}
    for cls, fn in binary.items():
        if isinstance(e, cls):
            return fn(_evaluate(e.a, env), _evaluate(e.b, env))
    if isinstance(e, t.Not):
        return np.logical_not(_evaluate(e.a, env))
    raise _NotEvaluable(type(e).__name__)


def _reads_every_outer_loop(sch, block_rv, outer) -> bool:
    """Whether the joined block's bindings use every loop it sits under (extent > 1): a loop it
    does not use repeats it, each time reading what that iteration of the tile has not written."""
    name, used = sch.get(block_rv).name_hint, set()

    def visit(realize):
        if realize.block.name_hint == name:
            for value in list(realize.iter_values) + [realize.predicate]:
                used.update(v.name for v in tvm.tirx.analysis.undefined_vars(value))

    tvm_ffi.structural_walk(sch.mod["main"].body, (s_tir.SBlockRealize, visit), order="post")
    for lp in outer:
        loop = sch.get(lp)
        if not (isinstance(loop.extent, tvm.tirx.IntImm) and int(loop.extent) == 1) and loop.loop_var.name not in used:
            return False
    return True


def _predicated(sch, block_rv) -> bool:
    """Whether the block's realize carries a predicate (T.where) other than true."""
    name, found = sch.get(block_rv).name_hint, []

    def visit(realize):
        if realize.block.name_hint == name:
            found.append(not (isinstance(realize.predicate, tvm.tirx.IntImm) and int(realize.predicate) == 1))

    tvm_ffi.structural_walk(sch.mod["main"].body, (s_tir.SBlockRealize, visit), order="post")
    return any(found)


def _at_least(a, b) -> bool:
    """a >= b provably, with every symbolic extent in them at least 1."""
    an = Analyzer()
    for v in tvm.tirx.analysis.undefined_vars(a - b):
        an.bind(v, tvm.ir.Range(tvm.tirx.const(1, str(v.ty)), tvm.tirx.const(2**31 - 1, str(v.ty))))
    return an.can_prove(a >= b)


def _product(extents):
    out = tvm.tirx.const(1, "int64")
    for e in extents:
        out = out * (tvm.tirx.const(int(e), "int64") if isinstance(e, (int, tvm.tirx.IntImm)) else tvm.tirx.Cast("int64", e))
    return out
