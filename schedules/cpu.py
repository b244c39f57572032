"""Default CPU (llvm) schedules: inline injective stages, parallel outer loops, vectorize.

Rules, in order, each able to decline:
  Injective  - every remaining block is spatial: fuse its loops, parallel outer, vectorize inner
  Fallback   - any other func: inline injective stages, parallelise each root block's leading spatial
               loops and vectorize a spatial innermost loop when it is contiguous and divisible
The same rules are applied to every fusion variant, so comparisons between variants are fair.
"""
from __future__ import annotations

import tvm
from tvm import s_tir
from tvm.s_tir.dlight.analysis import normalize_prim_func

from .rule import ScheduleRule
from .targets import CPU


def _lanes(dtype_bits: int) -> int:
    return max(1, min(CPU["max_vector_lanes"], CPU["vector_bytes"] * 8 // dtype_bits))


def _extent(sch, loop):
    ext = sch.get(loop).extent
    return int(ext) if isinstance(ext, tvm.tirx.IntImm) else None


def _inline_injective(sch):
    """compute_inline every non-output spatial block that allows it (repeat until none changes)."""
    changed = True
    while changed:
        changed = False
        infos = normalize_prim_func(sch)
        if infos is None:
            return None
        for info in infos:
            if info.is_injective() and not _is_output(sch, info.block_rv) and not _costly_to_recompute(sch, info):
                try:
                    sch.compute_inline(info.block_rv)
                    changed = True
                    break
                except Exception:
                    continue
    return normalize_prim_func(sch)


def _costly_to_recompute(sch, info):
    """Stages kept as in-kernel buffers instead of inlined:
    - a pure copy (transpose, reshape) read by a reduction: inlined, the matmul would read its
      operand with strides; materialised, it is a packed operand
    - a stage read by several consumers that calls a transcendental (exp in softmax): inlining
      would evaluate it once per consumer"""
    consumers = sch.get_consumers(info.block_rv)
    body = sch.get(info.block_rv).body
    is_copy = isinstance(body, tvm.tirx.BufferStore) and isinstance(body.value, tvm.tirx.BufferLoad)
    if is_copy and any(_is_reduction(sch, c) for c in consumers):
        return True
    if len(consumers) < 2:
        return False
    return any(f"T.{name}(" in str(body) for name in CPU["costly_intrinsics"])


def _is_reduction(sch, block_rv):
    return any(int(iv.iter_type) == 2 for iv in sch.get(block_rv).iter_vars)  # 2 = CommReduce


def _is_output(sch, block_rv):
    params = sch.mod["main"].params  # 0.27: params are the buffers; a region's buffer is .source
    return any(any(w.source.same_as(p) for p in params) for w in sch.get(block_rv).writes)


def _block_bits(sch, block_rv):
    writes = sch.get(block_rv).writes
    return tvm.runtime.DataType(str(writes[0].source.dtype)).bits if writes else 32


def _schedule_spatial(sch, info):
    loops = info.get_loops()
    if not loops:  # a 0-d output (the divide of a full mean): nothing to parallelise
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    ext = _extent(sch, fused)
    lanes = _lanes(_block_bits(sch, info.block_rv))
    if ext is not None and ext % lanes == 0 and ext >= lanes * CPU["min_parallel_extent"]:
        outer, inner = sch.split(fused, [None, lanes])
        sch.parallel(outer)
        sch.vectorize(inner)
    elif ext is None or ext >= CPU["min_parallel_extent"]:
        sch.parallel(fused)


def _schedule_reduction(sch, info):
    kinds = info.dom_kind()
    loops = info.get_loops()
    lead = [lp for lp, k in zip(loops, kinds) if k == "S"]
    if kinds[: len(lead)] != "S" * len(lead) or not lead:
        return  # spatial loops not leading: leave it serial rather than reorder the math
    fused = sch.fuse(*lead) if len(lead) > 1 else lead[0]
    ext = _extent(sch, fused)
    if ext is None or ext >= CPU["min_parallel_extent"]:
        sch.parallel(fused)


class Injective(ScheduleRule):
    name = "cpu.Injective"

    def apply(self, func, target):
        sch = s_tir.Schedule(func)
        infos = _inline_injective(sch)
        if not infos or not all(i.is_injective() for i in infos):
            return None
        for info in infos:
            _schedule_spatial(sch, info)
        return sch.mod["main"]


class Fallback(ScheduleRule):
    name = "cpu.Fallback"

    def apply(self, func, target):
        sch = s_tir.Schedule(func)
        infos = _inline_injective(sch)
        if infos is None:
            return None
        for info in infos:
            if info.is_injective():
                _schedule_spatial(sch, info)
            else:
                _schedule_reduction(sch, info)
        return sch.mod["main"]


RULES = [Injective(), Fallback()]
