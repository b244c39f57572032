"""cpu.Pool: a window reduction (max or average pooling) for llvm, the window in registers.

Contract: `Pool.apply(func, target)` takes a PrimFunc with exactly one reduction whose loops are
spatial first, then up to three reduction loops of constant extents whose product is at most
`pool_max_window` (a pooling window: 3x3, 2x2, 7x7), reading one operand (no conv: a conv reads
two); the stages before it (a padding) and after it (an average's division, an activation) are
spatial. Anything else declines (None). The padded input stays its own stage when it is read
with overlapping windows (inlined, the border test would run once per window element).

Schedule (constants in targets.CPU):
  for (n, c, oh) in parallel:                  # whole output rows per task
    for ow0:                                   # a vector of v output columns (v divides the row
      out[c, oh, ow0*v : +v] = init            # when a power of two >= 4 does, else predicated)
      for ry, rx (unrolled): out[..] = max(out[..], in[c, oh*s + ry, (ow0*v + lane)*s + rx])
LLVM keeps the unrolled window's output vector in a register (the buffers do not alias). An
explicit local accumulator (cache_write) and an inlined padding both measured slower (0.37 and
0.37 against 0.30 ms for ResNet-50's pool, interleaved in one process, AMD EPYC znver4).
The outputs keep their own reduction order: only which outputs advance together changes, so the
result is bit-identical to the naive loop. Found as a cliff: ResNet-50's 3x3/2 max pool ran in
cpu.Fallback as 25,088 tiny parallel tasks, each updating its outputs in memory 9 times (3.5 ms
in the model on AMD EPYC znver4, against 0.17 ms of bytes).
"""
from __future__ import annotations

from tvm import s_tir

from ..common import block_bits, extent, inline_injective, is_reduction, lanes, operands_of_reduction, schedule_spatial
from ..rule import ScheduleRule
from ..targets import CPU


class Pool(ScheduleRule):
    name = "cpu.Pool"

    def apply(self, func, target):
        sch = s_tir.Schedule(func)
        infos = inline_injective(sch)
        reductions = [i for i in infos or [] if is_reduction(sch, i.block_rv)]
        if len(reductions) != 1:
            return None
        info = reductions[0]
        kinds = info.dom_kind()
        n_red = kinds.count("R")
        n_sp = len(kinds) - n_red
        if not 1 <= n_red <= 3 or kinds != "S" * n_sp + "R" * n_red or n_sp < 2:
            return None
        if operands_of_reduction(sch, info.block_rv) != 1:
            return None
        loops = sch.get_loops(info.block_rv)
        lead, reds = loops[:n_sp], loops[n_sp:]
        window = 1
        for r in reds:
            e = extent(sch, r)
            if e is None:
                return None
            window *= e
        n = extent(sch, lead[-1])
        if window > CPU["pool_max_window"] or not n:
            return None
        v = min(lanes(block_bits(sch, info.block_rv)), n)
        w = v
        while w > 1 and n % w:  # the widest power of two dividing the row: no predicated tail
            w //= 2
        v = w if w >= 4 else v
        ow0, ow1 = sch.split(lead[-1], [None, v])  # a ragged row: the last vector predicated
        sch.reorder(*lead[:-1], ow0, *reds, ow1)
        sch.parallel(sch.fuse(*lead[:-1]) if len(lead) > 2 else lead[0])
        for r in reds:
            sch.unroll(r)
        sch.vectorize(ow1)
        sch.decompose_reduction(info.block_rv, reds[0])
        for other in infos:
            if other.is_injective():
                schedule_spatial(sch, other)
        return sch.mod["main"]
