"""Default CUDA schedules: tvmfuse's row-reduction rule, then TVM's dlight GPU rules, Fallback last.

Rules, each able to decline: cuda.Attention (cuda_attention.py) for fused attention groups, then,
in the order of the CUDA table:
  dlight Matmul, GEMV  - tiled through shared memory / vectorized GEMV
  RowReduction         - a row chain (see row_chain.py) becomes ONE kernel: a thread block per row,
                         its reductions cross-thread (warp shuffles + shared memory), every stage
                         of the row computed at the row loop, results of reductions in shared memory
  dlight Reduction, GeneralReduction, Fallback
A rule that raises (dlight's Reduction trips on 0-d full reductions) declines, and the next rule gets
the function. A function no rule schedules is reported, because an unscheduled PrimFunc in a CUDA
build silently runs on the host.
"""
from __future__ import annotations

from tvm import s_tir
from tvm.s_tir import dlight as dl

from . import row_chain
from .common import inline_injective
from .rule import ScheduleRule
from .targets import CUDA


class DlightRule(ScheduleRule):
    def __init__(self, rule):
        self.rule, self.name = rule, f"dlight.gpu.{type(rule).__name__}"

    def apply(self, func, target):
        with target:
            sch = self.rule.apply(func, target, False)
        if isinstance(sch, list):
            sch = sch[0] if sch else None
        return None if sch is None else sch.mod["main"]


def _threads(inner: int, rows: int) -> int:
    cap = CUDA["row_threads"] if rows else CUDA["full_reduction_threads"]
    t = CUDA["warp"]
    while t < inner and t < cap:
        t *= 2
    return t


def _inner_extent(sch, block_rv, rows):
    n = 1
    for iv in list(sch.get(block_rv).iter_vars)[rows:]:
        n *= int(iv.dom.extent)
    return n


class RowReduction(ScheduleRule):
    name = "cuda.RowReduction"

    def apply(self, func, target):
        sch = s_tir.Schedule(func)
        inline_injective(sch, keep=lambda sch, info: False)  # on a GPU recomputing beats a round trip
        chain = row_chain.analyze(sch)
        if chain is None or not row_chain.same_thread_mapping(sch, chain):
            return None
        if _stage_outputs(sch, chain):  # their write-back copies joined the chain: read it again
            chain = row_chain.analyze(sch)
            if chain is None:
                return None
        rows = chain.rows
        threads = _threads(max(_inner_extent(sch, b, rows) for b in chain.blocks), rows)
        first = chain.blocks[0]
        if rows:  # the first stage's row loop is the thread block; every later stage joins it
            lead = sch.get_loops(first)[:rows]
            row = sch.fuse(*lead) if rows > 1 else lead[0]
        else:  # full reductions: one thread block does them all
            loops = sch.get_loops(first)
            row = sch.add_unit_loop(loops[0] if loops else first)  # above the stage's loops
        sch.bind(row, "blockIdx.x")
        row_chain.join_row(sch, chain.blocks, row)
        for b in chain.blocks:
            _bind_inner(sch, b, row, threads)
            if b in chain.reductions and not row_chain.is_output(sch, b):
                sch.set_scope(b, 0, "shared")  # a cross-thread result every thread reads
        return sch.mod["main"]


def _stage_outputs(sch, chain) -> bool:
    """An output the kernel also reads (the residual sum of rmsnorm_residual, the max of
    multi_reduce) is staged on chip: the stage writes a copy its consumers read (registers for a
    spatial stage, read back on the same thread; shared memory for a cross-thread reduction) and a
    write-back stage stores the output. Returns whether any stage was staged."""
    staged = False
    for b in chain.blocks[:-1]:
        if row_chain.is_output(sch, b) and sch.get_consumers(b):
            scope = "shared" if b in chain.reductions else "local"
            sch.cache_write(b, 0, scope, consumer_blocks=sch.get_consumers(b))
            staged = True
    return staged


def _bind_inner(sch, block_rv, row, threads):
    """Fuse the block's loops below the row loop and spread them over threadIdx.x; for a reduction
    only its reduction loops (the spatial ones left are unit)."""
    loops = sch.get_loops(block_rv)
    row_loop = sch.get(row)
    k = next(i for i, lp in enumerate(loops) if sch.get(lp).same_as(row_loop))
    inner = loops[k + 1:]
    kinds = [int(iv.iter_type) for iv in sch.get(block_rv).iter_vars]
    if 2 in kinds:
        inner = inner[len(inner) - kinds.count(2):]
    if not inner:
        return
    fused = sch.fuse(*inner) if len(inner) > 1 else inner[0]
    _, tx = sch.split(fused, [None, threads])
    sch.bind(tx, "threadIdx.x")


def rules():
    from .cuda_attention import Attention

    names = CUDA["rules"]
    out = [Attention()]  # a fused attention group (tvmfuse.attention) first: it writes its own kernel
    for name in names:
        out.append(RowReduction() if name == "RowReduction" else DlightRule(getattr(dl.gpu, name)()))
    return out
