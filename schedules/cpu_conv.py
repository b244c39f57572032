"""CPU direct conv2d (NCHW) + epilogue: a register tile of output channels x rows x a vector of
output columns, the epilogue (relu, batch norm, residual) applied to the tile.

Contract: `Conv2D.apply(func, target)` takes a PrimFunc whose one reduction (after inlining the
injective stages; the padded input stays its own stage) has up to three reduction variables (in
channels, kernel rows, kernel columns; a 1x1 kernel leaves one) after its spatial ones and reads
two operands with them, the last three spatial being output
channel, row and column; the other stages are spatial. It returns the function scheduled, or None
(decline) when no tile fits. A ragged output width (197, 23) keeps full tiles of columns, the
last one predicated (the predicate is per unrolled column: the vector, over output channels, stays
whole). Only the loop order changes, never the math.

Schedule (constants in targets.CPU):
  for (n, oc0, oh0) in parallel:
    for ow0:
      tile[OCB, OHB, VW] = 0
      for rc, ry, rx: for oc1 (unrolled): for oh1 (unrolled): for ow1 (vector):
        tile += pad[rc, oh + ry, ow + rx] * w[oc, rc, ry, rx]   # one vector load, a broadcast
      epilogue on the tile, vectorized, written once
"""
from __future__ import annotations

from tvm import s_tir

from .common import (block_bits, extent, join_tile, lanes, operands_of_reduction, pack_at_build_time,
                     schedule_spatial, schedule_spatial_block, single_reduction, spatial_points)
from .row_chain import is_output
from .rule import ScheduleRule
from .targets import CPU


class Conv2D(ScheduleRule):
    name = "cpu.Conv2D"

    def apply(self, func, target):
        sch = s_tir.Schedule(func)
        found = single_reduction(sch)
        if found is None:
            return None
        infos, conv = found
        kinds = conv.dom_kind()
        n_red = kinds.count("R")
        if not 1 <= n_red <= 3 or kinds != "S" * (len(kinds) - n_red) + "R" * n_red or len(kinds) - n_red < 3:
            return None
        if operands_of_reduction(sch, conv.block_rv) < 2:  # a row sum over 3-d rows, not a conv
            return None
        epilogue = [i.block_rv for i in infos[infos.index(conv) + 1:]]
        if is_output(sch, conv.block_rv):  # a bare conv: accumulate on chip, the store is the epilogue
            epilogue = [sch.cache_write(conv.block_rv, 0, "global")]
        produced = spatial_points(sch, conv.block_rv)
        v = lanes(block_bits(sch, conv.block_rv))
        by_channel = extent(sch, sch.get_loops(conv.block_rv)[-n_red - 3]) % v == 0
        tile = _channel_tile(sch, conv.block_rv, n_red) if by_channel else None
        tile = tile or _tile(sch, conv.block_rv, n_red)
        if tile is None:
            return None
        at, rc = tile
        for b in epilogue:  # the epilogue joins the tile (unless a reshape cuts the tile: join_tile)
            if join_tile(sch, b, at, produced):
                _vectorize_last(sch, b)
            else:
                schedule_spatial_block(sch, b)
        sch.decompose_reduction(conv.block_rv, rc)
        for info in infos[: infos.index(conv)]:  # the padded input: its own parallel loops ...
            if not _inline_copy(sch, info.block_rv):  # ... unless nothing is padded (a 1x1 conv)
                schedule_spatial(sch, info)
        return sch.mod["main"]


def _inline_copy(sch, block_rv) -> bool:
    """Inline a stage that only copies (a padding of 0): the conv reads its input directly."""
    import tvm

    body = sch.get(block_rv).body
    if not (isinstance(body, tvm.tirx.BufferStore) and isinstance(body.value, tvm.ir.TensorLoad)):
        return False
    try:
        sch.compute_inline(block_rv)
        return True
    except s_tir.ScheduleError:
        return False


def _widest_dividing(n, v):
    while v > 1 and n % v:
        v //= 2
    return v


def _channel_tile(sch, conv, n_red):
    """Output channels in the vector: `conv_oc_vectors` registers of channels (when they divide
    the channel count, else one) x `conv_columns` output columns, one accumulator register each;
    the weights, packed [oc / width, rc, ry, rx, width], are whole-vector loads, each input element
    a broadcast."""
    loops = sch.get_loops(conv)
    *lead, oc, oh, ow = loops[:-n_red]
    reds = loops[-n_red:]
    v = lanes(block_bits(sch, conv))
    width = v * CPU["conv_oc_vectors"] if extent(sch, oc) % (v * CPU["conv_oc_vectors"]) == 0 else v
    n_ow = extent(sch, ow)
    cap = min(n_ow, CPU["conv_columns"] * CPU["conv_oc_vectors"] * v // width)
    owb = _widest_divisor(n_ow, cap)
    if 2 * owb <= cap:  # a ragged width (7 of 6, 197): balanced tiles, the last one predicated
        owb = -(-n_ow // -(-n_ow // cap))
    if owb < 2:
        return None
    if len(sch.get(conv).writes[0].source.shape) != 4:
        return None  # the channel-last accumulator layout below is for NCHW
    _pack_channels(sch, conv, width, n_red)
    # the accumulator tile channel-last, so one output column of channels is whole vectors
    sch.transform_layout(conv, ("write", 0), lambda n, o, h, w_: (n, o // width, h, w_, o % width))
    oc0, oc1 = sch.split(oc, [None, width])
    ow0, ow1 = sch.split(ow, [None, owb])
    sch.reorder(*lead, oc0, oh, ow0, *reds, ow1, oc1)
    sch.unroll(ow1)
    sch.vectorize(oc1)
    sch.parallel(sch.fuse(*lead, oc0, oh))
    return ow0, reds[0]


def _widest_divisor(n, cap):
    """The largest divisor of n not above cap."""
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def _pack_channels(sch, conv, v, n_red):
    block = sch.get(conv)
    oc = block.iter_vars[-(n_red + 3)].var  # (.., oc, oh, ow, rc[, ry, rx])
    for idx, r in enumerate(block.reads):  # the weight: its first index is the output channel
        if len(r.region) >= 2 and r.region[0].min.same_as(oc):
            break
    else:
        return
    pack = sch.cache_read(conv, idx, "global")
    sch.transform_layout(pack, ("write", 0), lambda o, *rest: (o // v, *rest, o % v))
    loops = sch.get_loops(pack)
    sch.parallel(loops[0])
    pack_at_build_time(sch, pack)


def _tile(sch, conv, n_red):
    """(n_red is 1 for a 1x1 conv, whose unit kernel loops normalisation dropped.)"""
    loops = sch.get_loops(conv)
    *lead, oc, oh, ow = loops[:-n_red]
    reds = loops[-n_red:]
    n_oc, n_oh, n_ow = extent(sch, oc), extent(sch, oh), extent(sch, ow)
    if not (n_oc and n_oh and n_ow):
        return None
    vw = _widest_dividing(n_ow, lanes(block_bits(sch, conv)))
    ocb = _widest_dividing(n_oc, CPU["conv_out_channels"])
    ohb = _widest_dividing(n_oh, CPU["conv_rows"])
    if vw < CPU["conv_min_vector"] or ocb < 2:
        return None
    oc0, oc1 = sch.split(oc, [None, ocb])
    oh0, oh1 = sch.split(oh, [None, ohb])
    ow0, ow1 = sch.split(ow, [None, vw])
    sch.reorder(*lead, oc0, oh0, ow0, *reds, oc1, oh1, ow1)
    sch.unroll(oc1)
    sch.unroll(oh1)
    sch.vectorize(ow1)
    sch.parallel(sch.fuse(*lead, oc0, oh0))
    return ow0, reds[0]


def _vectorize_last(sch, block_rv):
    """The innermost loop as one vector when it fits a register (the tile's 14 columns: LLVM
    covers an odd width with a few vector ops), else split by the widest dividing power of two."""
    last = sch.get_loops(block_rv)[-1]
    n = extent(sch, last)
    width = lanes(block_bits(sch, block_rv))
    if n and 1 < n <= width:
        sch.vectorize(last)
        return
    v = _widest_dividing(n, width) if n else 1
    if v > 1:
        sch.vectorize(sch.split(last, [None, v])[1])
