"""CPU row-reduction chains: one parallel sweep over the rows, each row kept in cache.

Contract: `RowReduction.apply(func, target)` takes a PrimFunc that `row_chain.analyze` accepts with
at least one row loop (stitched softmax, layer norm, RMS norm, and their prologues/epilogues) and
returns it scheduled, or None (decline). It never reorders the math across rows.

Schedule:
- the first stage's row loops are fused and run in parallel; every later stage is moved into that
  row loop in program order (reverse_compute_at), so a row is read from memory once and every
  intermediate of the row lives in a row-sized buffer allocated inside the loop (cache resident)
- spatial stages: inner loops fused and vectorized (lanes from the CPU table, a divisor of the row)
- reductions: the row is reduced in `lanes` x `row_accumulators` partial sums (rfactor: a
  few independent vector registers), then the partials are reduced; the same reassociation every
  vectorized BLAS/numpy reduction makes.
"""
from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx

from .. import channel_rows, row_chain
from ..common import (block_bits, extent, inline_injective, lanes, schedule_spatial_block,
                      store_views_in_producers)
from ..rule import ScheduleRule
from ..targets import CPU


class RowReduction(ScheduleRule):
    name = "cpu.RowReduction"

    def apply(self, func, target):
        sch = s_tir.Schedule(func)
        store_views_in_producers(sch)
        if inline_injective(sch) is None:
            return None
        chain = row_chain.analyze(sch)
        channels = (chain is None or chain.rows == 0) and channel_rows.lead_kept_axes(sch)
        if channels:  # a channel chain (train-mode BatchNorm): one row per channel
            chain = row_chain.analyze(sch)
        if chain is None or chain.rows == 0:
            return None
        if any(_strided(sch, b) for b in chain.reductions):
            return None  # a sum over rows (a bias gradient): each "row" a strided column; see _strided
        order, partials = [], {}
        for b in chain.blocks:  # rfactor first: it needs the reduction's loops to itself
            for rf in _split_partials(sch, b, chain.rows, channels) if b in chain.reductions else []:
                partials[len(order)] = rf
                order.append(rf)
            order.append(b)
        lead = sch.get_loops(order[0])[: chain.rows]
        row = sch.fuse(*lead) if len(lead) > 1 else lead[0]
        row = row_chain.join_row(sch, order, row, chain.rows)  # program order: each stage's producers in the row
        if row is None:
            return None
        sch.parallel(row)
        for k, b in enumerate(order):
            if k in partials:
                if not _vectorize_partials(sch, b, row, moved=k > 0):
                    return None
            elif b not in chain.reductions:
                _vectorize_inner(sch, b, row, channels)
        return sch.mod["main"]


def _strided(sch, block_rv) -> bool:
    """Whether a reduction reads some buffer with a spatial index innermost: it reduces across
    rows, not along them (sum(g, axis=0), a bias gradient). The row rule would take each column as
    a "row" and gather its elements a row apart: a (512, 1024) pair of column sums ran 5.2 ms,
    against 0.24 ms as Fallback's columns-as-vector-lanes (common.schedule_reduction)."""
    block = sch.get(block_rv)
    reduced = {iv.var.name for iv in block.iter_vars if int(iv.iter_type) == 2}
    # reads along a reduced axis, but not along the innermost one
    return any(used & reduced and last and not last & reduced for used, last in row_chain.read_indices(block))


def _loops_below(sch, block_rv, row):
    loops = sch.get_loops(block_rv)
    row_stmt = sch.get(row)
    k = next(i for i, lp in enumerate(loops) if sch.get(lp).same_as(row_stmt))
    return loops[k + 1:]


def _divisor_lanes(n, bits):
    """The widest vector (a power of two up to the register) that divides n, or 1."""
    v = lanes(bits)
    while v > 1 and n % v:
        v //= 2
    return v


def _vectorize_inner(sch, block_rv, row, innermost=False):
    """Vectorize the stage's loops below the row: all of them fused, or with `innermost` (a channel
    chain's row: N, H, W of one channel, whose elements are contiguous only along W) the last one
    alone, so no lane needs a division by a width the vector does not divide (a 56-wide map in
    vectors of 16 was a per-lane gather)."""
    inner = [lp for lp in _loops_below(sch, block_rv, row) if extent(sch, lp) != 1]
    if not inner:
        return
    inner = inner[-1:] if innermost else inner
    fused = sch.fuse(*inner) if len(inner) > 1 else inner[0]
    n = extent(sch, fused)
    v = _divisor_lanes(n, block_bits(sch, block_rv)) if n else 1
    if v > 1:
        sch.vectorize(sch.split(fused, [None, v])[1])


def _with_accumulators(n, v, acc):
    """The partials' width: `acc` vectors of v lanes where they divide the n elements at least
    twice (one vector of acc x v lanes, which LLVM splits into acc registers: independent adds, so
    their latency overlaps), else v."""
    return v * acc if n % (v * acc) == 0 and n // (v * acc) >= 2 else v


def _split_partials(sch, block_rv, rows, innermost=False):
    """Reduce the row into `lanes` partial results (rfactor), then those into `row_partials_tree`
    (a second rfactor, vectorized too) where they divide them, so the serial sum left at the end
    of each row is that short. Returns the partials' blocks in program order (none when the row is
    too short to split). Runs while the reduction still has its own loop nest. With `innermost` (a
    channel chain, see _vectorize_inner) the lanes split the last reduced loop only."""
    red = sch.get_loops(block_rv)[rows:]
    whole = not (innermost and len(red) > 1)  # the lanes split the whole row, fused
    loop = (sch.fuse(*red) if len(red) > 1 else red[0]) if whole else red[-1]
    n = extent(sch, loop)
    v = _divisor_lanes(n, block_bits(sch, block_rv)) if n else 1
    if v == 1 or whole and n == v:
        return []
    v = _with_accumulators(n, v, CPU["row_accumulators"])
    _, ki = sch.split(loop, [None, v])
    axis = len(sch.get(block_rv).writes[0].region)
    rf = sch.rfactor(ki, factor_axis=axis)
    tree = CPU["row_partials_tree"]
    if not 1 < tree < v or v % tree:
        return [rf]
    _, k1 = sch.split(sch.get_loops(block_rv)[-1], [None, tree])
    return [rf, sch.rfactor(k1, factor_axis=axis)]


def _vectorize_partials(sch, rf, row, moved) -> bool:
    """The partials' loops below the row are (ko, ki) where the block kept its loops and, after
    reverse_compute_at (loops rebuilt in iter-var order, the rfactor var first), (ki, ..., ko),
    ko being several loops in a channel chain's row (N, H: one per reduced iter var).
    Put ki innermost, hoist the init out of ko, vectorize both. ki is told by the block's binding
    (the loop its lane var is bound to), not by its extent: a 32 x 32 split has two loops of 32
    (BN statistics of a 4 x 16 x 16 input), and the wrong one vectorized is a schedule error.
    False (the rule declines) for any other loop nest.
    `moved` is kept for the callers; the binding decides."""
    inner = [lp for lp in _loops_below(sch, rf, row) if extent(sch, lp) != 1]
    if len(inner) < 2:
        return False
    lane_var = _binding_var(sch, rf, 0)  # the rfactor's spatial var: the partial's lane
    bound = [lp for lp in inner if lane_var is not None and sch.get(lp).loop_var.same_as(lane_var)]
    if len(bound) != 1:
        return False
    ki = bound[0]
    ko = [lp for lp in inner if not sch.get(lp).same_as(sch.get(ki))]  # one, or a channel row's N, H, ...
    sch.reorder(*ko, ki)
    sch.vectorize(ki)
    return True


def _binding_var(sch, block_rv, k):
    """The loop var block `block_rv`'s k-th iter var is bound to, or None (bound to an expression)."""
    block, found = sch.get(block_rv), []

    def visit(realize):
        if realize.block.same_as(block):  # by identity: an rfactor's blocks may share a name
            found.append(realize.iter_values[k])

    tvm_ffi.structural_walk(sch.mod["main"].body, (s_tir.SBlockRealize, visit), order="post")
    return found[0] if len(found) == 1 and isinstance(found[0], tirx.Var) else None


class FullReduction(ScheduleRule):
    """Reductions to a scalar (multi_reduce, a loss): the input is cut into `reduction_chunks`
    chunks reduced in parallel, each into `lanes` vector partials; the partials are then reduced.
    The chunk loops of sibling reductions are merged, so each chunk is read from memory once and
    re-read from cache by the other reductions."""

    name = "cpu.FullReduction"

    def apply(self, func, target):
        sch = s_tir.Schedule(func)
        if inline_injective(sch) is None:
            return None
        chain = row_chain.analyze(sch)
        if chain is None or chain.rows != 0:
            return None
        for b in chain.blocks:  # TVM's rfactor trips over sibling blocks that have no loop
            if not sch.get_loops(b):
                sch.add_unit_loop(b)
        # siblings (sum and max of one input) share one pass; a reduction that reads another's
        # result (a variance after its mean) needs that result whole first: its own pass after it
        # (found by fuzzing: merged, the variance read the mean before any chunk had been added)
        siblings = not any(_reaches(sch, later, earlier) for i, earlier in enumerate(chain.reductions)
                           for later in chain.reductions[i + 1:])
        chunks, blocks = [], []
        for b in chain.reductions:
            p = _parallel_partials(sch, b)
            if p is None:
                return None
            chunks.append(p[0])
            blocks.append(p[1])
        spatial = [b for b in chain.blocks if not any(sch.get(b).same_as(sch.get(r)) for r in chain.reductions)
                   and any(extent(sch, lp) != 1 for lp in sch.get_loops(b))]  # not a 0-d result (a mean's divide)
        if not siblings or spatial:
            # one parallel pass per reduction, in program order; a spatial stage that stayed a
            # block (an output of the group beside the scalar: a loss and its gradient) is a
            # parallel, vectorized pass of its own where it stands
            for c in chunks:
                sch.parallel(c)
            for b in spatial:
                schedule_spatial_block(sch, b)
            return sch.mod["main"]
        # merge puts the merged loop where its last argument stood: pass the first chunk loop last,
        # so every partial is computed before any block that reads it (checked, not assumed)
        merged = sch.merge(*reversed(chunks)) if len(chunks) > 1 else chunks[0]
        first = sch.get_child_blocks(sch.get_sblock("root"))[0]
        if not sch.get(sch.get_loops(first)[0]).same_as(sch.get(merged)):
            return None  # the merged chunk loop is not the first stage
        if len(blocks) > 1 and len({extent(sch, b) for b in blocks}) == 1:
            sch.merge(*reversed(blocks))  # within a chunk, block by block: the siblings re-read it from L1
        sch.parallel(merged)
        return sch.mod["main"]


def _reaches(sch, block_rv, target_rv) -> bool:
    """target is a (transitive) producer of block."""
    seen, todo = [], [block_rv]
    while todo:
        for p in sch.get_producers(todo.pop()):
            if sch.get(p).same_as(sch.get(target_rv)):
                return True
            if not any(sch.get(p).same_as(sch.get(q)) for q in seen):
                seen.append(p)
                todo.append(p)
    return False


def _parallel_partials(sch, block_rv):
    """rfactor twice: chunks (parallel) x blocks x vectors x lanes (vector), a block being
    `reduction_block` elements where they divide a chunk (else the whole chunk). Returns the chunk
    loop and the block loop, or None."""
    red = [lp for lp in sch.get_loops(block_rv) if extent(sch, lp) != 1]
    fused = sch.fuse(*red) if len(red) > 1 else red[0]
    n = extent(sch, fused)
    v = _divisor_lanes(n, block_bits(sch, block_rv)) if n else 1
    chunks = CPU["reduction_chunks"]
    if not n or n % (chunks * v) or n // (chunks * v) < 2:
        return None
    v = _with_accumulators(n // chunks, v, CPU["reduction_accumulators"])
    per_block = max(1, CPU["reduction_block"] // v)
    if (n // (chunks * v)) % per_block:
        per_block = n // (chunks * v)
    p, _, _, ki = sch.split(fused, [chunks, None, per_block, v])
    per_chunk = sch.rfactor(p, factor_axis=0)
    ki = sch.get_loops(per_chunk)[-1]
    vec = sch.rfactor(ki, factor_axis=1)
    sch.vectorize(sch.get_loops(vec)[-1])
    loops = sch.get_loops(vec)  # [unit loops of the 0-d output..., chunk, block, vector, lanes]
    k = next(i for i, lp in enumerate(loops) if extent(sch, lp) == chunks)
    chunk = sch.fuse(*loops[: k + 1]) if k else loops[0]  # the chunk loop outermost (it is parallel)
    return chunk, sch.get_loops(vec)[1]
