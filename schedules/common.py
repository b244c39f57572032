"""Helpers shared by the schedule rules: vector lanes, inlining, loop scheduling, stage shapes."""
from __future__ import annotations

import tvm
from tvm.s_tir.dlight.analysis import normalize_prim_func

from .row_chain import is_output, vars_in
from .targets import CPU


def lanes(dtype_bits: int) -> int:
    return max(1, min(CPU["max_vector_lanes"], CPU["vector_bytes"] * 8 // dtype_bits))


def extent(sch, loop):
    ext = sch.get(loop).extent
    return int(ext) if isinstance(ext, tvm.tirx.IntImm) else None


def inline_injective(sch, keep=None):
    """compute_inline every non-output spatial block that allows it and that `keep(sch, info)`
    (default: the CPU's `_costly_to_recompute`) does not hold back; repeat until none changes.
    Returns the block infos left, or None when the function cannot be normalised."""
    keep = _costly_to_recompute if keep is None else keep
    changed = True
    while changed:
        changed = False
        infos = normalize_prim_func(sch)
        if infos is None:
            return None
        for info in infos:
            if info.is_injective() and not is_output(sch, info.block_rv) and not keep(sch, info):
                try:
                    sch.compute_inline(info.block_rv)
                    changed = True
                    break
                except tvm.s_tir.ScheduleError:  # compute_inline refused this block: keep it a stage
                    continue
    return normalize_prim_func(sch)


def single_reduction(sch):
    """Inline the injective stages; (block infos, the one reduction's info) or None when the
    function does not have exactly one reduction (the shape of a matmul or conv group)."""
    infos = inline_injective(sch)
    reductions = [i for i in infos or [] if is_reduction(sch, i.block_rv)]
    return (infos, reductions[0]) if len(reductions) == 1 else None


_IF_THEN_ELSE = tvm.ir.Op.get("prim.if_then_else")


def _costly_to_recompute(sch, info):
    """Stages kept as in-kernel buffers instead of inlined:
    - a pure copy (transpose, reshape) or a padding read by a reduction: inlined, the matmul
      would read its operand with strides and the conv would test the border on every multiply;
      materialised, it is a packed operand
    - a stage read by several consumers that calls a transcendental (exp in softmax): inlining
      would evaluate it once per consumer"""
    consumers = sch.get_consumers(info.block_rv)
    body = sch.get(info.block_rv).body
    value = body.value if isinstance(body, tvm.tirx.BufferStore) else None
    is_copy = isinstance(value, tvm.ir.TensorLoad)  # what tirx.BufferLoad builds in 0.27
    is_pad = isinstance(value, tvm.ir.Call) and value.op.same_as(_IF_THEN_ELSE)
    if (is_copy or is_pad) and any(is_reduction(sch, c) for c in consumers):
        return True
    if len(consumers) < 2:
        return False
    return any(f"T.{name}(" in str(body) for name in CPU["costly_intrinsics"])


def operands_of_reduction(sch, block_rv) -> int:
    """How many buffers the block reads at an index that moves with a reduction variable: 2 for a
    matmul or conv (input and weight), 1 for a row sum."""
    block = sch.get(block_rv)
    red = {iv.var.name for iv in block.iter_vars if int(iv.iter_type) == 2}
    return sum(any(vars_in(rg.min) & red for rg in r.region) for r in block.reads)


def is_reduction(sch, block_rv):
    return any(int(iv.iter_type) == 2 for iv in sch.get(block_rv).iter_vars)  # 2 = CommReduce


def block_bits(sch, block_rv):
    writes = sch.get(block_rv).writes
    return tvm.runtime.DataType(str(writes[0].source.dtype)).bits if writes else 32


def schedule_spatial(sch, info):
    schedule_spatial_block(sch, info.block_rv)


def schedule_spatial_block(sch, block_rv):
    """A spatial block: a transposing copy in tiles, else every loop fused, parallel outer and
    vectorized inner where the extent allows."""
    loops = sch.get_loops(block_rv)
    if not loops:  # a 0-d output (the divide of a full mean): nothing to parallelise
        return
    if _tile_transpose(sch, block_rv, loops):
        return
    n = lanes(block_bits(sch, block_rv))
    ivs = sch.get(block_rv).iter_vars
    row = int(ivs[-1].dom.extent) if ivs and isinstance(ivs[-1].dom.extent, tvm.tirx.IntImm) else None
    if len(loops) == 1 and row and row % n and (extent(sch, loops[0]) or 1) % row == 0 and row < extent(sch, loops[0]):
        loops = list(sch.split(loops[0], [None, row]))  # normalisation fused the rows: split them again
    last = extent(sch, loops[-1])
    if len(loops) > 1 and last and last % n and n <= last <= 32 * n:
        # the innermost extent is no multiple of the vector (a padded row of 114): fusing every loop
        # would split rows mid-vector, an int64 division per lane (a 64x114x114 padding took 3 ms)
        outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        if (extent(sch, outer) or CPU["min_parallel_extent"]) >= CPU["min_parallel_extent"]:
            sch.parallel(outer)
        sch.vectorize(loops[-1])
        return
    if len(loops) > 1 and last and last >= n and any(extent(sch, lp) is None for lp in loops[:-1]):
        # a symbolic outer extent (the rows of a padded operand copy, a dynamic batch or sequence):
        # fused with the static row it could only run as scalars, an index division per element;
        # rows in parallel, each row vectorized
        outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        sch.parallel(outer)
        if last % n == 0:
            sch.vectorize(sch.split(loops[-1], [None, n])[1])
        return
    # loop_partition's wrapper blocks declare no reads or writes, so a block that is partitioned
    # hides its writes from later schedule steps: only a block nothing else in the kernel reads
    # (an output) is partitioned; a ragged intermediate keeps the plain parallel loop
    tail_ok = not sch.get_consumers(block_rv)
    if tail_ok and len(loops) > 1 and last and last % n and last > 32 * n:
        # a wide row that is no multiple of the vector (771 columns, a vocabulary of 50257): fused,
        # every element would be a scalar with an index division; rows in parallel, each row whole
        # vectors and then a scalar tail of last % n
        outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        if (extent(sch, outer) or CPU["min_parallel_extent"]) >= CPU["min_parallel_extent"]:
            sch.parallel(outer)
        _vector_body_scalar_tail(sch, loops[-1], last, n)
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    ext = extent(sch, fused)
    if ext is not None and ext >= n * CPU["min_parallel_extent"] and (ext % n == 0 or tail_ok):
        if ext % n:  # a ragged total (a 1-d tensor of 1001): whole vectors in parallel, a scalar tail
            fused = sch.loop_partition(fused, [ext - ext % n, None], preserve_unit_iters=False)[0]
        outer, inner = sch.split(fused, [None, n])
        sch.parallel(outer)
        sch.vectorize(inner)
    elif ext is None or ext >= CPU["min_parallel_extent"]:
        sch.parallel(fused)


def _vector_body_scalar_tail(sch, loop, ext, n):
    """`loop` (extent `ext`, no multiple of `n`) as whole vectors of n lanes, then ext % n scalars."""
    body = sch.loop_partition(loop, [ext - ext % n, None], preserve_unit_iters=False)[0]
    sch.vectorize(sch.split(body, [None, n])[1])


def _tile_transpose(sch, block_rv, loops) -> bool:
    """A copy whose innermost output index is not the input's innermost one (a transpose) is done
    in square tiles: the tile's input lines stay in L1 while its output rows are written whole,
    vectorized. Row by row, every load would touch a new cache line. Returns whether it applied."""
    block = sch.get(block_rv)
    body = block.body
    if not (isinstance(body, tvm.tirx.BufferStore) and isinstance(body.value, tvm.ir.TensorLoad)):
        return False
    if len(loops) < 2 or len(block.reads) != 1:
        return False
    src = [rg.min for rg in block.reads[0].region]
    inner = block.iter_vars[-1].var
    last_src = src[-1] if src else None
    if last_src is None or last_src.same_as(inner) or not any(i.same_as(inner) for i in src):
        return False
    t = CPU["transpose_tile"]
    a, b = loops[-2], loops[-1]
    if (extent(sch, a) or 0) % t or (extent(sch, b) or 0) % t:
        return False
    a0, a1 = sch.split(a, [None, t])
    b0, b1 = sch.split(b, [None, t])
    sch.reorder(a0, b0, a1, b1)
    outer = [*loops[:-2], a0, b0]
    sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    sch.vectorize(b1)
    return True


def schedule_reduction(sch, info):
    """A reduction no specific rule took (pooling windows): its leading spatial loops fused and
    parallel; when its reduction loops all follow them and the innermost spatial extent allows, that
    spatial loop moves inside the reduction loops as a vector (every output keeps its own
    reduction order: only which outputs advance together changes)."""
    kinds = info.dom_kind()
    loops = info.get_loops()
    lead = [lp for lp, k in zip(loops, kinds) if k == "S"]
    if kinds[: len(lead)] != "S" * len(lead) or not lead:
        return  # spatial loops not leading: leave it serial rather than reorder the math
    reds = loops[len(lead):]
    inner = lead[-1] if len(lead) >= 2 and reds else None
    n = extent(sch, inner) if inner is not None else None
    bits = block_bits(sch, info.block_rv)
    v = lanes(bits)
    w = v
    while n and w > 1 and n % w:  # the widest power of two dividing the row, up to a vector
        w //= 2
    if n and w < v and w >= max(4, v // 2):  # 56 on AVX-512: vectors of 8, not one of 56
        v = w
    # else a row that is no multiple of half a vector is one vector only up to 4 ymm registers:
    # wider (56 lanes of 16) made LLVM spill 100 vectors (max pool on AVX-512)
    if n and n >= v and (n % v == 0 or n * bits <= 4 * 256):
        outer = lead[:-1]
        if n % v == 0 and n > v:
            outer_w, inner = sch.split(inner, [None, v])
            outer = outer + [outer_w]
        sch.reorder(*outer, *reds, inner)
        fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    else:
        fused, inner = (sch.fuse(*lead) if len(lead) > 1 else lead[0]), None
    ext = extent(sch, fused)
    if ext is None or ext >= CPU["min_parallel_extent"]:
        sch.parallel(fused)  # (before the init is split off: parallel checks the whole reduction)
    if inner is not None:
        sch.vectorize(inner)
        sch.decompose_reduction(info.block_rv, reds[0])


def pack_at_build_time(sch, block_rv) -> bool:
    """Mark a packing copy of a parameter that is a constant at every call (the function's
    `tvmfuse.constant_params`, from passes/prepack_weights.MarkConstantParams) as a layout-rewrite
    preprocess: PrepackWeights splits it out and folds it at build time. Returns whether it did."""
    func = sch.mod["main"]
    marked = func.attrs.get("tvmfuse.constant_params") if func.attrs else None
    if not marked:
        return False
    params = [func.params[int(i)] for i in marked]  # 0.27: the params are the buffers
    if not any(r.source.same_as(p) for r in sch.get(block_rv).reads for p in params):
        return False
    sch.annotate(block_rv, "meta_schedule.layout_rewrite_preproc", True)
    sch.annotate(sch.get_sblock("root"), "tvmfuse.prepack", True)  # what PrepackWeights looks for
    return True


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
    import numpy as np
    import tvm_ffi
    from tvm import s_tir

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
    import numpy as np

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
    import tvm_ffi
    from tvm import s_tir

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
    import tvm_ffi
    from tvm import s_tir

    name, found = sch.get(block_rv).name_hint, []

    def visit(realize):
        if realize.block.name_hint == name:
            found.append(not (isinstance(realize.predicate, tvm.tirx.IntImm) and int(realize.predicate) == 1))

    tvm_ffi.structural_walk(sch.mod["main"].body, (s_tir.SBlockRealize, visit), order="post")
    return any(found)


def _at_least(a, b) -> bool:
    """a >= b provably, with every symbolic extent in them at least 1."""
    from tvm.sym import Analyzer

    an = Analyzer()
    for v in tvm.tirx.analysis.undefined_vars(a - b):
        an.bind(v, tvm.ir.Range(tvm.tirx.const(1, str(v.ty)), tvm.tirx.const(2**31 - 1, str(v.ty))))
    return an.can_prove(a >= b)


def _product(extents):
    out = tvm.tirx.const(1, "int64")
    for e in extents:
        out = out * (tvm.tirx.const(int(e), "int64") if isinstance(e, (int, tvm.tirx.IntImm)) else tvm.tirx.Cast("int64", e))
    return out
