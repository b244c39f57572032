"""CPU matmul / batch-matmul + epilogue: the classic blocked schedule with a register micro-kernel.

Contract: `Matmul.apply(func, target)` takes a PrimFunc whose one reduction (after inlining the
injective stages) has a single reduction variable k after the spatial ones, the last two being the
output rows i and columns j, reading A at [.., i, k] and B at [.., k, j] (or, M = 1, A at [.., k]:
a GEMV with a column panel for every core), and whose other stages are spatial (packed operand
copies before it, an elementwise epilogue after it). It returns the function scheduled, or None
(decline) for any other shape. Ragged M or N are padded to whole tiles (pad_einsum, zero-filled
operand copies; only the write-back is predicated); a symbolic M (a dynamic batch or sequence) is
padded the same way, at run time. A packing of a weight that is a constant at
every call is marked to run at build time (passes/prepack_weights.py). A function that mixes int32
and int64 indices (a TOPI stage that indexes in int32, fused with int64 ones) is narrowed to int32
first, or declined where that could change the math (common.uniform_index_dtype). Every primitive
it uses keeps the math; only the loop order and the padding (never read back) change.

Schedule (constants in targets.CPU):
  for b, j0 in parallel:                 # a panel of B (K x NR) stays in L2 across all of i0
    for i0:                              # MR rows of A (MR x K) stream through L1
      tile[MR, NR] = 0                   # accumulators: MR x (NR / lanes) vector registers
      for k: for i1 (unrolled): for j1 (vectorized): tile[i1, j1] += A[i, k] * B[k, j]
      epilogue on the tile (bias, activation, residual), vectorized, written once
Packed copies of an operand (a transposed weight) stay separate stages, scheduled as injective.
"""
from __future__ import annotations

import logging

import tvm
from tvm import s_tir
from tvm.s_tir import ScheduleError

from ..common import (block_bits, extent, lanes, pack_at_build_time, schedule_spatial_block, single_reduction,
                      tile_transpose,
                      uniform_index_dtype)
from ..epilogue_join import join_tile, spatial_points
from .. import row_chain
from ..row_chain import is_output
from ..rule import ScheduleRule
from ..targets import CPU, target_cores

log = logging.getLogger("tvmfuse.schedule")


class Matmul(ScheduleRule):
    name = "cpu.Matmul"

    def apply(self, func, target):
        func = uniform_index_dtype(func)  # one index dtype, before pad_einsum builds buffers from both
        if func is None:
            log.debug("%s declines: int32 and int64 indices that cannot be narrowed to int32", self.name)
            return None
        try:
            return self._schedule(func, inline_views=True)
        except ScheduleError as err:  # pad_einsum wants plain operand reads: a ragged M read through a
            # reshape ([4, 49, 384] -> [196, 384], Swin's windows) keeps the reshape as a copy stage
            log.debug("%s: %s; again with the operand views as copies", self.name, str(err).splitlines()[0])
            return self._schedule(func, inline_views=False)

    def _schedule(self, func, inline_views):
        sch = s_tir.Schedule(func)
        found = single_reduction(sch, inline_views)
        if found is None or not _is_matmul(sch, found[1]):
            return None
        infos, red = found
        mm = red.block_rv
        before = [i.block_rv for i in infos[: infos.index(red)]]
        after = [i.block_rv for i in infos[infos.index(red) + 1:]]
        was_output = is_output(sch, mm)
        producers = {sch.get(b).name_hint for b in sch.get_producers(mm)}
        produced = spatial_points(sch, mm)  # before _tile pads a ragged M or N
        tile = _tile(sch, mm)
        if tile is None:
            return None
        outer_rows, k = tile
        pads = [b for b in sch.get_producers(mm) if sch.get(b).name_hint not in producers]
        if pads:  # padded (ragged M or N): the un-pad copy is the tile's write-back ...
            unpad = sch.get_consumers(mm)
            if was_output:
                after = unpad
            else:
                sch.compute_inline(unpad[0])  # ... or the epilogue reads the padded tile directly
        elif was_output:  # no epilogue stage: accumulate in a tile, then store it
            after = [sch.cache_write(mm, 0, "global")]
        pack, packed = _pack_panels(sch, mm) or (None, None)
        for block in after:  # the epilogue joins the tile, in program order ...
            if join_tile(sch, block, outer_rows, produced):
                _vectorize_tile(sch, block, outer_rows)
            else:  # ... unless it also reads a sibling output computed outside the tile, or
                schedule_spatial_block(sch, block)  # reads the tile back through a reshape that cuts it
        sch.decompose_reduction(mm, k)
        for block in before + pads:  # operand copies: their own parallel, vectorized loops
            if packed is not None and sch.get(block).name_hint == packed:
                sch.compute_inline(block)  # the zero-padded B: padded while it is packed
            else:
                schedule_spatial_block(sch, block)
        if pack is not None:
            _schedule_pack(sch, pack, block_bits(sch, mm))
            pack_at_build_time(sch, pack)
        return sch.mod["main"]


def _is_matmul(sch, info) -> bool:
    """One reduction variable k after the spatial ones, and two operands: A read at [.., i, k] (no
    j) and B at [.., k, j] (no i), j the last spatial variable and i the one before it: a (batch)
    matmul, not a 1x1 conv (whose input is read at [.., k, i, j] and weight at [o, k]). A row
    vector times a matrix (M = 1: i is gone, A is read at [.., k]) is one too (_is_gemv)."""
    kinds = info.dom_kind()
    if kinds.count("R") != 1 or not kinds.endswith("R") or len(kinds) < 2:
        return False
    if _is_gemv(sch, info.block_rv):
        return True
    if len(kinds) < 3:
        return False
    i, j, k = _ijk(sch, info.block_rv)
    used = _vars_read(sch, info.block_rv)
    return any({i, k} <= u and j not in u for u in used) and any({k, j} <= u and i not in u for u in used)


def _ijk(sch, block_rv):
    names = [iv.var.name for iv in sch.get(block_rv).iter_vars]
    return (names[-3] if len(names) >= 3 else None), names[-2], names[-1]


def _vars_read(sch, block_rv):
    return [set().union(*[row_chain.vars_in(rg.min) for rg in r.region]) for r in sch.get(block_rv).reads]


def _is_gemv(sch, block_rv) -> bool:
    """M = 1: A read at [.., k] only (no spatial variable but the batch ones B shares), B at
    [.., k, j] in that order (B read [j, k] is a row reduction: each output a contiguous dot
    product), and a column panel for every core (a tall x^T @ g with a few columns is a column
    reduction: its rows are what to split)."""
    _i, j, k = _ijk(sch, block_rv)
    block = sch.get(block_rv)
    spatial = {iv.var.name for iv in block.iter_vars if int(iv.iter_type) == 0}
    used = _vars_read(sch, block_rv)
    b_ops = [r for r, u in zip(block.reads, used) if {k, j} <= u]
    a_ops = [u for u in used if k in u and j not in u]
    if len(b_ops) != 1 or len(a_ops) != 1 or len(b_ops[0].region) < 2:
        return False
    last, second = (row_chain.vars_in(rg.min) for rg in (b_ops[0].region[-1], b_ops[0].region[-2]))
    if last != {j} or second != {k}:
        return False
    if not isinstance(block.iter_vars[-2].dom.extent, tvm.tirx.IntImm):
        return False  # a symbolic N: the blocked path pads it
    n = int(block.iter_vars[-2].dom.extent)
    panels = -(-n // (lanes(block_bits(sch, block_rv)) * CPU["mm_col_vectors"]))
    if panels < target_cores():  # (77 columns are 3 panels of 32 on AVX-512: enough for 2 cores)
        return False
    b_vars = set().union(*[row_chain.vars_in(rg.min) for rg in b_ops[0].region])
    return not (a_ops[0] & spatial) - b_vars  # A's spatial variables are all batch ones


def _tile(sch, mm):
    """Split and reorder the matmul loops into the micro-kernel nest. Returns (the loop the
    epilogue joins, the loop the accumulator init goes before). Ragged extents (M not a multiple of
    MR, N not a multiple of NR: a vocabulary of 50257, 197 tokens) are padded first (pad_einsum):
    the micro-kernel runs on the padded domain with zero-filled operand copies, and only the
    write-back is predicated. (Blocking K as well, 128 to 512, measured no faster on mlp_block:
    the packed panel already streams from L2.)"""
    if _is_gemv(sch, mm):
        return _tile_gemv(sch, mm)
    *batch, i, j, k = sch.get_loops(mm)
    m, n = extent(sch, i), extent(sch, j)
    if m == 0 or n == 0 or any(extent(sch, b) is None for b in batch):
        return None
    v = lanes(block_bits(sch, mm))
    nr, mr = v * CPU["mm_col_vectors"], row_tile(m)
    if n is not None:
        nr = min(nr, -(-n // v) * v)  # a narrow N (10 classes) pads to whole vectors, not a whole tile
    # a symbolic M or N (batch x sequence rows, a sequence of keys) is padded the same way:
    # pad_einsum sizes the zero-filled copies ceil(M / MR) * MR at run time, and no predicate
    # enters the k loop (measured 3x faster than a predicated tail tile)
    pad_m, pad_n = m is None or m % mr, n is None or n % nr
    if pad_m or pad_n:
        sch.pad_einsum(mm, [1] * len(batch) + [mr if pad_m else 1, nr if pad_n else 1, 1])
        *batch, i, j, k = sch.get_loops(mm)
    i0, i1 = sch.split(i, [None, mr])
    j0, j1 = sch.split(j, [None, nr])
    sch.reorder(*batch, j0, i0, k, i1, j1)
    sch.unroll(i1)
    sch.vectorize(j1)
    outer = [*batch, j0]
    sch.parallel(sch.fuse(*outer) if len(outer) > 1 else j0)
    return i0, k


def row_tile(m: int | None) -> int:
    """The micro-kernel height MR for M rows: `mm_rows`, or a shorter one down to `mm_rows_min`
    that pads at least 5% of M fewer rows (fewest padded rows; ties to the taller). A padded M costs
    a zero-filled copy of A and MR-row tiles of which some rows are waste: Winograd's 7x7 tiles
    (49 rows) padded to 56 with MR = 8 took 1.14x the work; 7 rows pad none. M a multiple of
    `mm_rows`, or a symbolic M, keeps `mm_rows`."""
    full = CPU["mm_rows"]
    if not m:
        return full
    if m <= full:
        return m

    def padded(r):
        return -(-m // r) * r - m

    best = min(range(CPU["mm_rows_min"], full + 1), key=lambda r: (padded(r), -r))
    return best if padded(full) - padded(best) >= 0.05 * m else full


def _tile_gemv(sch, mm):
    """M = 1: panels of NR columns in parallel, each a k-loop of broadcast x vector FMAs into NR /
    lanes accumulators; bound by reading B once, which the packed panels stream."""
    *batch, j, k = sch.get_loops(mm)
    n = extent(sch, j)
    if not n:
        return None
    v = lanes(block_bits(sch, mm))
    nr = min(v * CPU["mm_col_vectors"], -(-n // v) * v)
    if n % nr:
        sch.pad_einsum(mm, [1] * len(batch) + [nr, 1])
        *batch, j, k = sch.get_loops(mm)
    j0, j1 = sch.split(j, [None, nr])
    sch.reorder(*batch, j0, k, j1)
    sch.vectorize(j1)
    outer = [*batch, j0]
    sch.parallel(sch.fuse(*outer) if len(outer) > 1 else j0)
    return j0, k


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
        return None  # no [K, N] operand (a transposed weight is packed by its own copy stage)
    nr = extent(sch, sch.get_loops(mm)[-1])  # the micro-kernel's width (the vectorized j1)
    cols = r.source.shape[-1]
    if isinstance(cols, tvm.tirx.IntImm) and int(cols) % nr:
        return None
    if not isinstance(cols, tvm.tirx.IntImm):  # a symbolic N: its padded copy, a provable multiple of NR
        from tvm.sym import Analyzer

        if not Analyzer().can_prove(tvm.tirx.floormod(cols, nr) == 0):
            return None
    source = r.source.name
    pack = sch.cache_read(mm, idx, "global")
    sch.transform_layout(pack, ("write", 0), lambda *ax: (*ax[:-2], ax[-1] // nr, ax[-2], ax[-1] % nr))
    return pack, source


def _schedule_pack(sch, pack, bits):
    """The panel copy's loops, once the operand copy it packs is inlined into it: a transposed
    weight (x @ W^T, every forward linear layer of a model in training) in square tiles, so its
    rows stay in L1 while the panel is written (row by row, each vector of the panel gathered 16
    rows of W from L2: 0.34 ms of a 512x1024x256 linear's 1.58); any other, k rows in parallel,
    each row vectorized."""
    loops = sch.get_loops(pack)
    if tile_transpose(sch, pack, loops):
        return
    sch.parallel(sch.fuse(*loops[:-1]))
    sch.vectorize(sch.split(loops[-1], [None, lanes(bits)])[1])


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
