"""CPU matmul / batch-matmul + epilogue: the classic blocked schedule with a register micro-kernel.

Contract: `Matmul.apply(func, target)` takes a PrimFunc whose one reduction (after inlining the
injective stages) has a single reduction variable and at least two spatial ones, the last two
being the output rows i and columns j, and whose other stages are spatial (packed operand copies
before it, an elementwise epilogue after it). It returns the function scheduled, or None
(decline): N not a multiple of the micro-kernel width, M not a multiple of its height, or a stage
that cannot join the tile. Every primitive it uses keeps the math; only the loop order changes.

Schedule (constants in targets.CPU):
  for b, j0 in parallel:                 # a panel of B (K x NR) stays in L2 across all of i0
    for i0:                              # MR rows of A (MR x K) stream through L1
      tile[MR, NR] = 0                   # accumulators: MR x (NR / lanes) vector registers
      for k: for i1 (unrolled): for j1 (vectorized): tile[i1, j1] += A[i, k] * B[k, j]
      epilogue on the tile (bias, activation, residual), vectorized, written once
Packed copies of an operand (a transposed weight) stay separate stages, scheduled as injective.
"""
from __future__ import annotations

from tvm import s_tir

from .common import block_bits, extent, lanes, operands_of_reduction, schedule_spatial, single_reduction
from . import row_chain
from .row_chain import is_output
from .rule import ScheduleRule
from .targets import CPU


class Matmul(ScheduleRule):
    name = "cpu.Matmul"

    def apply(self, func, target):
        sch = s_tir.Schedule(func)
        found = single_reduction(sch)
        if found is None or not _is_matmul(sch, found[1]):
            return None
        infos, red = found
        mm = red.block_rv
        before, after = infos[: infos.index(red)], infos[infos.index(red) + 1:]
        tile = _tile(sch, mm)
        if tile is None:
            return None
        outer_rows, k = tile
        _pack_panels(sch, mm)
        if is_output(sch, mm):  # no epilogue stage: accumulate in a tile, then store it
            after = [None]
            sch.reverse_compute_at(sch.cache_write(mm, 0, "global"), outer_rows, preserve_unit_loops=True)
            _vectorize_tile(sch, sch.get_consumers(mm)[0], outer_rows)
        for info in after:  # the epilogue joins the tile, in program order
            if info is None:
                continue
            try:
                sch.reverse_compute_at(info.block_rv, outer_rows, preserve_unit_loops=True)
                _vectorize_tile(sch, info.block_rv, outer_rows)
            except s_tir.ScheduleError:  # it also reads a sibling output computed outside the tile
                schedule_spatial(sch, info)
        sch.decompose_reduction(mm, k)
        for info in before:  # packed operand copies: their own parallel, vectorized loops
            schedule_spatial(sch, info)
        return sch.mod["main"]


def _is_matmul(sch, info) -> bool:
    kinds = info.dom_kind()
    if kinds.count("R") != 1 or not kinds.endswith("R") or len(kinds) < 3:
        return False
    return operands_of_reduction(sch, info.block_rv) >= 2


def _tile(sch, mm):
    """Split and reorder the matmul loops into the micro-kernel nest. Returns (the loop the
    epilogue joins, the loop the accumulator init goes before). (Blocking K as well, 128 to 512,
    measured no faster on mlp_block here: the packed panel already streams from L2.)"""
    loops = sch.get_loops(mm)
    *batch, i, j, k = loops
    m, n = extent(sch, i), extent(sch, j)
    v = lanes(block_bits(sch, mm))
    nr, mr = v * CPU["mm_col_vectors"], CPU["mm_rows"]
    if not m or not n or n % nr or m % mr:
        return None
    i0, i1 = sch.split(i, [None, mr])
    j0, j1 = sch.split(j, [None, nr])
    sch.reorder(*batch, j0, i0, k, i1, j1)
    sch.unroll(i1)
    sch.vectorize(j1)
    outer = [*batch, j0]
    sch.parallel(sch.fuse(*outer) if len(outer) > 1 else j0)
    return i0, k


def _pack_panels(sch, mm):
    """Copy the [.., K, N] operand into [.., N / NR, K, NR] panels once per call: the micro-kernel
    then walks one contiguous panel instead of K rows N floats apart (a TLB miss per k)."""
    block = sch.get(mm)
    *_, j, k = [iv.var.name for iv in block.iter_vars]
    for idx, r in enumerate(block.reads):
        used = [row_chain.vars_in(rg.min) for rg in r.region]
        if len(used) >= 2 and used[-1] == {j} and used[-2] == {k}:
            break
    else:
        return  # no [K, N] operand (a transposed weight is packed by its own copy stage)
    nr = lanes(block_bits(sch, mm)) * CPU["mm_col_vectors"]
    if int(r.source.shape[-1]) % nr:
        return
    pack = sch.cache_read(mm, idx, "global")
    sch.transform_layout(pack, ("write", 0), lambda *ax: (*ax[:-2], ax[-1] // nr, ax[-2], ax[-1] % nr))
    loops = sch.get_loops(pack)
    sch.parallel(sch.fuse(*loops[:-1]))
    sch.vectorize(sch.split(loops[-1], [None, lanes(block_bits(sch, mm))])[1])


def _vectorize_tile(sch, block_rv, outer_rows):
    loops = sch.get_loops(block_rv)
    row = sch.get(outer_rows)
    k = next(n for n, lp in enumerate(loops) if sch.get(lp).same_as(row))
    inner = loops[k + 1:]
    if not inner:
        return
    v = lanes(block_bits(sch, block_rv))
    last = inner[-1]
    n = extent(sch, last)
    if n and n % v == 0:
        sch.vectorize(sch.split(last, [None, v])[1])
