"""CPU column reductions: sums over the outer axes of an operand (a bias or norm gradient).

Contract: `ColumnReduction.apply(func, target)` takes a PrimFunc whose reductions (after inlining
every injective stage: a transpose or reshape goes away) each have their reduction variables last,
read an operand whose last index moves with a spatial variable and an earlier one with the
reduction (x^T @ g: out[i] = sum_k x[k, i] * g[k]; a bias gradient: out[i] = sum_k g[k, i]), and
share one domain (sibling sums: a norm's dgamma and dbeta). Several reduction variables (a sum
over batch and sequence) are fused into one k. It returns the function scheduled, or None (decline)
when the output columns do not fill whole vectors or a reduction reads the reduced axis last.

Schedule, per reduction (rows are read whole, contiguous, once):
- wide (the columns give every core a stripe of `column_stripe_min` vectors or more) and held by
  the cores' L2: the columns are cut into stripes run in parallel; each stripe sweeps every row,
  accumulating its columns in place. No partial buffer, no second pass; the rows' order per column
  is the serial order.
- narrow, or larger than the cores' L2: the rows are cut into `target cores x column_row_chunks` parallel chunks (rfactor), each
  accumulating a partial row; the partial rows are then summed column-vectorized. Rows that do not
  divide evenly leave the last chunk short (a predicate on the row loop, never on the vector).
Numerics: sums reassociated by chunk (narrow) or not at all (wide), as any vectorized BLAS sum.
"""
from __future__ import annotations

from functools import lru_cache

from tvm import s_tir, tirx

from .. import row_chain
from ..common import block_bits, extent, inline_injective, is_reduction, lanes, schedule_spatial
from ..rule import ScheduleRule
from ..targets import CPU, target_cores


class ColumnReduction(ScheduleRule):
    name = "cpu.ColumnReduction"

    def apply(self, func, target):
        sch = s_tir.Schedule(func)
        infos = inline_injective(sch, keep=lambda sch, info: False)  # the transpose goes away
        reds = [i for i in infos or [] if i.block_rv is not None and is_reduction(sch, i.block_rv)]
        if not reds or len({i.dom_kind() for i in reds}) != 1:
            return None
        kinds = reds[0].dom_kind()
        n_red = kinds.count("R")
        if not n_red or not kinds.endswith("R" * n_red) or "S" not in kinds:
            return None
        if not all(_reduces_outer_axis(sch, i.block_rv) for i in reds):
            return None
        plans = [_columns_and_rows(sch, i.block_rv, n_red) for i in reds]
        if any(p is None for p in plans):
            return None
        for info in infos:  # first: the loops of the injective stages (an output copy, an epilogue)
            if info.is_injective():  # are the ones analysed before the reductions were split
                schedule_spatial(sch, info)
        for block, (i, k) in zip([i.block_rv for i in reds], plans):
            _schedule_one(sch, block, i, k)
        return sch.mod["main"]


def _columns_and_rows(sch, block, n_red):
    """Fuse the block's spatial loops into i and its reduction loops into k: (i, k), or None when
    the columns do not fill whole vectors (a ragged last vector: the other rules' case)."""
    loops = sch.get_loops(block)
    spatial, red = loops[: len(loops) - n_red], loops[len(loops) - n_red:]
    spatial = [lp for lp in spatial if extent(sch, lp) != 1]
    if not spatial or any(extent(sch, lp) is None for lp in spatial + red):
        return None
    i = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    k = sch.fuse(*red) if len(red) > 1 else red[0]
    if extent(sch, i) % lanes(block_bits(sch, block)):
        return None
    return i, k


def _schedule_one(sch, block, i, k):
    n_i, n_k = extent(sch, i), extent(sch, k)
    bits = block_bits(sch, block)
    v = lanes(bits)
    cores = target_cores()
    vectors = n_i // v
    fits = n_i * n_k * bits // 8 <= cores * _l2_bytes()
    if vectors >= cores * CPU["column_stripe_min"] and fits:
        _stripes(sch, block, i, k, v, vectors, cores)
    else:
        _row_chunks(sch, block, i, k, v, n_k, cores)


@lru_cache(maxsize=1)
def _l2_bytes() -> int:
    """The host's L2 per core (1 MiB where sysfs does not say). Stripes re-read each row in parts,
    which pays while the operand sits in the cores' L2; from L3 or memory, whole rows streamed by
    row chunks win (znver4, 2 threads, 1 MiB L2: 2048 x 256 stripes 0.015 against 0.032 ms, 4096 x 256
    even, 8192 x 256 0.070 against 0.052 ms)."""
    from tvmfuse.runtime.machine import cache_sizes  # tvmfuse sits above schedules: read at call time

    return cache_sizes().get("L2") or (1 << 20)


def _stripes(sch, block, i, k, v, vectors, cores):
    """Columns in parallel stripes, each a whole-vector divisor of the columns near vectors/cores
    (capped at `column_stripe_max` vectors: the stripe's accumulators stay in L1)."""
    want = min(CPU["column_stripe_max"], -(-vectors // cores))
    per = max(d for d in range(1, want + 1) if vectors % d == 0)
    i_o, i_m, i_v = sch.split(i, [None, per, v])
    sch.reorder(i_o, k, i_m, i_v)
    sch.vectorize(i_v)  # before the init is split off: the update alone is no "local reduction block"
    sch.parallel(i_o)
    _vectorize_init(sch, sch.decompose_reduction(block, k))


def _row_chunks(sch, block, i, k, v, n_k, cores):
    """Rows in parallel chunks (rfactor), partial rows summed column-vectorized afterwards."""
    chunks = max(1, min(n_k, cores * CPU["column_row_chunks"]))
    per = -(-n_k // chunks)  # rows per chunk; then no chunk is empty (5 rows in 4 chunks of 2 left
    chunks = -(-n_k // per)  # the last one all predicated away, its init too: an uninitialized partial)
    kp, _kr = sch.split(k, [chunks, per])
    rf = sch.rfactor(kp, factor_axis=0)
    i_rf, kp_rf, kr_rf = sch.get_loops(rf)[-3:]
    sch.reorder(kp_rf, kr_rf, i_rf)
    sch.parallel(kp_rf)
    sch.vectorize(sch.split(i_rf, [None, v])[1])
    wb_i, wb_k = sch.get_loops(block)[-2:]  # the write-back: out[i] = sum over chunks of rf[chunk, i]
    w_o, w_v = sch.split(wb_i, [None, v])
    sch.reorder(w_o, wb_k, w_v)
    sch.vectorize(w_v)
    _vectorize_init(sch, sch.decompose_reduction(block, wb_k))


def _vectorize_init(sch, init):
    last = sch.get_loops(init)[-1]
    if sch.get(last).kind != tirx.ForKind.VECTORIZED:
        sch.vectorize(last)


def _reduces_outer_axis(sch, block_rv) -> bool:
    """True when an operand's last index moves with a spatial variable while an earlier one moves
    with a reduction variable, and no operand has a reduction variable last (that would be a
    matmul's x[i, k]: a row reduction for that operand)."""
    block = sch.get(block_rv)
    red = {iv.var.name for iv in block.iter_vars if int(iv.iter_type) != 0}
    spatial = {iv.var.name for iv in block.iter_vars if int(iv.iter_type) == 0}
    found = False
    for r in block.reads:
        idx = [row_chain.vars_in(rg.min) for rg in r.region]
        if idx and idx[-1] & red:
            return False
        if len(idx) >= 2 and idx[-1] & spatial and any(s & red for s in idx[:-1]):
            found = True
    return found
