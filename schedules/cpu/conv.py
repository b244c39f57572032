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

Grouped convs (`_grouping`: each output channel reads the k input channels of its group of m
output channels). When m is a multiple of a vector of at least `conv_min_vector` lanes, the
channel tile keeps each vector inside one group, so its input is still a broadcast (ResNeXt).
A depthwise conv (m = k = 1: each lane reads its own input channel) packs its padded input
channel-last, [N, C / v, H, W, v], in the kernel, so every input read is one whole vector
(MobileNet, ConvNeXt's 7x7). Other groupings (2 outputs per group) keep the plain channel tile,
whose lanes then load their inputs one by one, or the column tile (`_tile`). Without this, the
channel tile read a different input channel per lane: a gather per multiply (9 GFLOP/s for
ResNeXt's 3x3 at g = 32, 2-5x behind PyTorch on depthwise convs, on znver4).

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

from ..common import block_bits, extent, lanes, operands_of_reduction, pack_at_build_time, schedule_spatial, schedule_spatial_block, single_reduction
from ..epilogue_join import join_tile, spatial_points
from ..row_chain import is_output
from ..rule import ScheduleRule
from ..targets import CPU


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
        group = _grouping(sch, conv.block_rv, n_red)
        inlined = set()
        tile = None if group is None else _grouped_tile(sch, conv.block_rv, n_red, *group, v, inlined)
        if tile is None and group is None and _prefer_columns(sch, conv.block_rv, n_red, v):
            tile = _tile(sch, conv.block_rv, n_red)
        n_oc = extent(sch, sch.get_loops(conv.block_rv)[-n_red - 3])
        if tile is None and n_oc % v == 0:
            # (a grouping _grouped_tile declines, 2 outputs per group: each lane loads its own input)
            tile = _channel_tile(sch, conv.block_rv, n_red)
        elif tile is None and group is None and (n_oc & -n_oc) >= CPU["conv_min_vector"]:
            tile = _channel_tile(sch, conv.block_rv, n_red, width=n_oc & -n_oc)  # 24 channels: 8 lanes
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
            if info.name in inlined:  # (a depthwise conv's padding went into its input packing)
                continue
            if not _inline_copy(sch, info.block_rv):  # ... unless nothing is padded (a 1x1 conv)
                schedule_spatial(sch, info)
        return sch.mod["main"]


def _prefer_columns(sch, conv, n_red, v) -> bool:
    """Profitability: the column tile (`_tile`: output columns in the vector, NCHW rows written as
    they are) over the channel tile, whose accumulators are channel-last and whose epilogue
    transposes them back. The column tile needs unit-stride columns (a strided conv would gather
    its input) and a vector of at least half the register dividing the width (112, 56 wide; not 28
    on AVX-512). It pays when the reduction is too short to hide the transposing store
    (`conv_column_max_reduction`: MobileNetV2's 16->96 and 24->144 expansions) or when the output
    channels do not fill the channel vector (24 channels on 16 lanes)."""
    loops = sch.get_loops(conv)
    n_oc, n_ow = extent(sch, loops[-n_red - 3]), extent(sch, loops[-n_red - 1])
    if not (n_oc and n_ow) or _widest_dividing(n_ow, v) < max(CPU["conv_min_vector"], v // 2):
        return False
    if _column_stride(sch, conv, n_red) != 1:
        return False
    reduction = 1
    for loop in loops[-n_red:]:
        reduction *= extent(sch, loop) or 0
    return 0 < reduction <= CPU["conv_column_max_reduction"] or n_oc % v != 0


def _column_stride(sch, conv, n_red):
    """How far the input's column index moves per output column (the conv's width stride), or None
    when the input read is not of the form this reads."""
    block = sch.get(conv)
    ivs = block.iter_vars
    read = _input_read(block, ivs[-(n_red + 3)].var)
    if read is None:
        return None
    ow, col = ivs[-(n_red + 1)].var, read.region[3].min
    a, b = _index_at(col, ow, 0), _index_at(col, ow, 1)
    return None if a is None or b is None else b - a


def _input_read(block, oc):
    """The conv's one 4-d input read (not the weight, whose first index is `oc`), or None."""
    weight = _weight_read(block, oc)
    inputs = [r for i, r in enumerate(block.reads) if i != weight and len(r.region) == 4]
    return inputs[0] if weight is not None and len(inputs) == 1 else None


def _index_at(expr, var, x, ana=None):
    """`expr` with `var` = x and every other variable 0, as an int (None: not a constant then)."""
    import tvm
    import tvm_ffi
    from tvm.sym import Analyzer

    value = lambda v: tvm.tirx.const(x if v.same_as(var) else 0, str(v.ty))
    e = (ana or Analyzer()).simplify(tvm_ffi.structural_map(expr, (tvm.tirx.Var, value)))
    return int(e) if isinstance(e, tvm.tirx.IntImm) else None


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


def _grouping(sch, conv, n_red):
    """(m, k) for a grouped conv: output channel f reads input channels (f // m) * k + rc, rc < k;
    None for an ordinary conv (every output channel reads every input channel) and for any index
    this does not describe (then the conv is scheduled as before)."""
    import tvm

    block = sch.get(conv)
    ivs = block.iter_vars
    oc = ivs[-(n_red + 3)].var
    reds = [iv for iv in ivs if int(iv.iter_type) == 2]
    read = _input_read(block, oc)
    if read is None:
        return None
    ch = read.region[1].min
    if not any(v.same_as(oc) for v in tvm.tirx.analysis.undefined_vars(ch)):
        return None
    n_oc = int(ivs[-(n_red + 3)].dom.extent)
    rc = reds[0] if len(reds) == 3 or (len(reds) == 1 and n_red == 1) else None
    k = int(rc.dom.extent) if rc is not None else 1
    from tvm.sym import Analyzer

    ana = Analyzer()
    firsts = [_index_at(ch, oc, f, ana) for f in range(n_oc)]
    if any(c is None for c in firsts):
        return None
    m = next((f for f in range(1, n_oc) if firsts[f] != firsts[0]), n_oc)
    if any(firsts[f] != (f // m) * k for f in range(n_oc)):
        return None
    return m, k


def _weight_read(block, oc):
    """The index of the weight among the block's reads: its first index is the output channel."""
    for idx, r in enumerate(block.reads):
        if len(r.region) >= 2 and r.region[0].min.same_as(oc):
            return idx
    return None


def _grouped_tile(sch, conv, n_red, m, k, v, inlined):
    """The channel tile for a grouped conv, or None (the caller falls back to the column tile)."""
    n_oc = extent(sch, sch.get_loops(conv)[-n_red - 3])
    lanes_dw = min(v, n_oc & -n_oc)  # 24 channels: vectors of 8
    if m == 1 and k == 1 and lanes_dw >= CPU["conv_min_vector"]:  # depthwise: each lane its own input channel
        return _channel_tile(sch, conv, n_red, width=lanes_dw, pack_input=inlined)
    width = min(v, m & -m)  # the widest power of two dividing m: a vector inside one group
    if width >= CPU["conv_min_vector"]:
        return _channel_tile(sch, conv, n_red, width=width, group=m)
    return None


def _channel_tile(sch, conv, n_red, width=None, group=None, pack_input=None):
    """Output channels in the vector: `conv_oc_vectors` registers of channels (when they divide
    the channel count, else one) x `conv_columns` output columns, one accumulator register each;
    the weights, packed [oc / width, rc, ry, rx, width], are whole-vector loads, each input element
    a broadcast. A grouped conv passes its `width` (a vector inside one group of `group` output
    channels); a depthwise one passes `pack_input` (a set, filled with the stages it inlines)."""
    loops = sch.get_loops(conv)
    *lead, oc, oh, ow = loops[:-n_red]
    reds = loops[-n_red:]
    v = lanes(block_bits(sch, conv))
    if width is None:
        width = v * CPU["conv_oc_vectors"] if extent(sch, oc) % (v * CPU["conv_oc_vectors"]) == 0 else v
    n_ow = extent(sch, ow)
    cap = min(n_ow, CPU["conv_columns"] * CPU["conv_oc_vectors"] // max(1, width // v))
    owb = _widest_divisor(n_ow, cap)
    if 2 * owb <= cap:  # a ragged width (7 of 6, 197): balanced tiles, the last one predicated
        owb = -(-n_ow // -(-n_ow // cap))
    if owb < 2:
        return None
    if len(sch.get(conv).writes[0].source.shape) != 4:
        return None  # the channel-last accumulator layout below is for NCHW
    _pack_channels(sch, conv, width, n_red)
    if pack_input is not None:
        _pack_input(sch, conv, width, pack_input)
    # the accumulator tile channel-last, so one output column of channels is whole vectors
    sch.transform_layout(conv, ("write", 0), lambda n, o, h, w_: (n, o // width, h, w_, o % width))
    if group and group > width:  # split at the group first: the vector's input index is provably one
        oc0g, oc0, oc1 = sch.split(oc, [None, group // width, width])
        oc0 = sch.fuse(oc0g, oc0)
    else:
        oc0, oc1 = sch.split(oc, [None, width])
    ow0, ow1 = sch.split(ow, [None, owb])
    sch.reorder(*lead, oc0, oh, ow0, *reds, ow1, oc1)
    sch.unroll(ow1)
    sch.vectorize(oc1)
    sch.parallel(sch.fuse(*lead, oc0, oh))
    return ow0, reds[0]


def _pack_input(sch, conv, width, inlined):
    """A depthwise conv's input, packed [N, C / width, H, W, width] in the kernel (its padding
    inlined into the packing), so each lane of an output vector reads its own channel in one
    whole-vector load. Adds the names of the stages it inlines to `inlined`."""
    import tvm

    block = sch.get(conv)
    oc = block.iter_vars[-(len([iv for iv in block.iter_vars if int(iv.iter_type) == 2]) + 3)].var
    weight = _weight_read(block, oc)
    idx = next(i for i, r in enumerate(block.reads) if i != weight and len(r.region) == 4)
    source = block.reads[idx].source
    pack = sch.cache_read(conv, idx, "global")
    for producer in sch.get_producers(pack):  # the padding: computed where it is packed
        if sch.get(producer).writes[0].source.same_as(source):
            name = sch.get(producer).name_hint
            try:
                sch.compute_inline(producer)
                inlined.add(name)
            except tvm.s_tir.ScheduleError:  # refused: the padding stays a stage of its own
                pass
    sch.transform_layout(pack, ("write", 0), lambda n, c, h, w_: (n, c // width, h, w_, c % width))
    n, c, h, w_ = sch.get_loops(pack)
    c0, c1 = sch.split(c, [None, width])
    sch.reorder(n, c0, h, w_, c1)
    sch.vectorize(c1)
    sch.parallel(sch.fuse(n, c0, h))


def _widest_divisor(n, cap):
    """The largest divisor of n not above cap."""
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def _pack_channels(sch, conv, v, n_red):
    block = sch.get(conv)
    oc = block.iter_vars[-(n_red + 3)].var  # (.., oc, oh, ow, rc[, ry, rx])
    idx = _weight_read(block, oc)
    if idx is None:
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
