"""Default CPU (llvm) schedules: inline injective stages, parallel outer loops, vectorize.

Rules, in order, each able to decline:
  Nests         - a horizontal kernel holding compute-heavy nests (a conv's input and weight gradients):
                  each such nest, and the rest together, scheduled apart by the rules below, run as
                  one launch (../nests.py)
  Attention     - a fused attention group (tvmfuse.attention): one flash-attention kernel (cpu/attention.py)
  Injective     - every remaining block is spatial: fuse its loops, parallel outer, vectorize inner
                  (a nest whose rows are shorter than a vector over flat views of its buffers first,
                  ../flat_views.py, so its lanes compute no index divisions; a block that reads an
                  earlier one element for element in that one's loop, ../elementwise_chains.py)
  Matmul        - matmul / batch matmul + epilogue: blocked, register micro-kernel (cpu/matmul.py)
  Conv2D        - direct NCHW conv2d + epilogue: channel x row x vector tile (cpu/conv.py)
  ColumnReduction - sums over outer axes (x^T @ g, a bias gradient): parallel column stripes, or
                  parallel chunks of rows into vector partial rows (cpu/column_reduction.py)
  RowReduction  - a row-reduction chain: parallel rows, every stage at the row (cpu/reduction.py)
  FullReduction - reductions to a scalar: parallel chunks x vector partials, sibling chunks merged
  Pool          - a small-window reduction of one operand (max/avg pooling): rows parallel, the
                  window unrolled into a vector register of outputs (cpu/pool.py)
  Fallback   - any other func: inline injective stages, parallelise each root block's leading spatial
               loops and vectorize a spatial innermost loop when it is contiguous and divisible
  AsWritten  - what even Fallback declines: a kernel TOPI wrote with its own loops (an opaque block:
               cumsum, sort, scatter) that already runs a loop in parallel, kept as written (a scan
               is serial along its axis); one with only serial loops is left unscheduled, with a warning
The same rules are applied to every fusion variant, so comparisons between variants are fair.
"""
from __future__ import annotations

import tvm
from tvm import s_tir

from .attention import Attention
from .conv import Conv2D
from .matmul import Matmul
from .pool import Pool
from .column_reduction import ColumnReduction
from .reduction import FullReduction, RowReduction
from tvm.s_tir.dlight.analysis import normalize_prim_func

from .. import elementwise_chains
from ..common import inline_injective, lanes, schedule_reduction, schedule_spatial
from ..flat_views import flat_views
from ..nests import Nests
from ..rule import ScheduleRule
from ..tir_walk import children


class Injective(ScheduleRule):
    name = "cpu.Injective"

    def apply(self, func, target):
        sch = s_tir.Schedule(func)
        infos = inline_injective(sch)
        if not infos or not all(i.is_injective() for i in infos):
            return None
        func = sch.mod["main"]
        flat = flat_views(func, _short_rows)
        if flat is not func:
            sch = s_tir.Schedule(flat)
            infos = normalize_prim_func(sch)
            if not infos:
                return None
        done = []
        for info in infos:
            if not elementwise_chains.join(sch, info.block_rv, done):  # else in its producer's loop
                schedule_spatial(sch, info)
            done.append(info.block_rv)
        return sch.mod["main"]


def _short_rows(extents) -> bool:
    """A nest of several axes whose last is shorter than a float32 vector: fused and vectorized, its
    lanes would compute their indices with divisions (flat_views.py)."""
    return len(extents) > 1 and extents[-1] < lanes(32)


class AsWritten(ScheduleRule):
    """Declines unless the function already has a parallel loop: TOPI's hand-written kernels
    (`ir_builder`: cumsum's scan is parallel over the other axes, serial along its own) carry their
    own schedule in an opaque block the block rules cannot read. A function with only serial loops
    is declined, so a naive loop still reaches Fallback, or the "left unscheduled" warning."""
    name = "cpu.AsWritten"

    def apply(self, func, target):
        return func if _has_parallel_loop(func.body) else None


def _has_parallel_loop(stmt) -> bool:
    """Whether a For of kind parallel is anywhere in `stmt` (blocks, sequences, branches, lets)."""
    if isinstance(stmt, tvm.tirx.For) and stmt.kind == tvm.tirx.ForKind.PARALLEL:
        return True
    return any(_has_parallel_loop(s) for s in children(stmt))


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


RULES = [Nests(lambda: RULES[1:]), Attention(), Injective(), Matmul(), Conv2D(), ColumnReduction(), RowReduction(),
         FullReduction(), Pool(), Fallback(), AsWritten()]
