"""Default CPU (llvm) schedules: inline injective stages, parallel outer loops, vectorize.

Rules, in order, each able to decline:
  Attention     - a fused attention group (tvmfuse.attention): one flash-attention kernel (cpu_attention.py)
  Injective     - every remaining block is spatial: fuse its loops, parallel outer, vectorize inner
  Matmul        - matmul / batch matmul + epilogue: blocked, register micro-kernel (cpu_matmul.py)
  Conv2D        - direct NCHW conv2d + epilogue: channel x row x vector tile (cpu_conv.py)
  ColumnReduction - x^T @ g: parallel chunks of rows, vector partial rows (cpu_reduction.py)
  RowReduction  - a row-reduction chain: parallel rows, every stage at the row (cpu_reduction.py)
  FullReduction - reductions to a scalar: parallel chunks x vector partials, sibling chunks merged
  Pool          - a small-window reduction of one operand (max/avg pooling): rows parallel, the
                  window unrolled into a vector register of outputs (cpu_pool.py)
  Fallback   - any other func: inline injective stages, parallelise each root block's leading spatial
               loops and vectorize a spatial innermost loop when it is contiguous and divisible
The same rules are applied to every fusion variant, so comparisons between variants are fair.
"""
from __future__ import annotations

from tvm import s_tir

from .cpu_attention import Attention
from .cpu_conv import Conv2D
from .cpu_matmul import Matmul
from .cpu_pool import Pool
from .cpu_reduction import ColumnReduction, FullReduction, RowReduction
from .common import inline_injective, schedule_reduction, schedule_spatial
from .rule import ScheduleRule


class Injective(ScheduleRule):
    name = "cpu.Injective"

    def apply(self, func, target):
        sch = s_tir.Schedule(func)
        infos = inline_injective(sch)
        if not infos or not all(i.is_injective() for i in infos):
            return None
        for info in infos:
            schedule_spatial(sch, info)
        return sch.mod["main"]


class Fallback(ScheduleRule):
    name = "cpu.Fallback"

    def apply(self, func, target):
        sch = s_tir.Schedule(func)
        infos = inline_injective(sch)
        if infos is None:
            return None
        for info in infos:
            if info.is_injective():
                schedule_spatial(sch, info)
            else:
                schedule_reduction(sch, info)
        return sch.mod["main"]


RULES = [Attention(), Injective(), Matmul(), Conv2D(), ColumnReduction(), RowReduction(), FullReduction(),
         Pool(), Fallback()]
