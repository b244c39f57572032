"""Default CUDA schedules: tvmfuse's row-reduction rule, then TVM's dlight GPU rules, Fallback last.

Rules, each able to decline: cuda.Attention (cuda/attention.py) for fused attention groups, then,
in the order of the CUDA table:
  TensorCoreMatmul     - a float16/bfloat16 matmul group on tensor cores (cuda/tensor_core.py)
  dlight Matmul, GEMV  - tiled through shared memory (SIMT: tensor cores are the rule above's; its
                         constants tvmfuse's, CoalescedMatmul) / vectorized GEMV
  RowReduction         - a row chain (see row_chain.py) becomes ONE kernel: a thread block per row,
                         its reductions cross-thread (warp shuffles + shared memory), every stage
                         of the row computed at the row loop, results of reductions in shared memory
  dlight Reduction, GeneralReduction, Fallback
A rule declines by returning None or raising a ScheduleError (rule.py), and the next rule gets
the function. A function no rule schedules is reported, because an unscheduled PrimFunc in a CUDA
build silently runs on the host. Before dlight's Matmul, a group's injective stages are inlined
(its padding, which dlight would otherwise leave unscheduled); a matmul read by several output
stages is declined there (dlight stores through one epilogue), and dlight runs with a
reverse_compute_inline that refuses a producer with other consumers (one_consumer_reverse_inline).

After the rules, every kernel function (tuned ones too) passes two fixes found on an H200:
  scalar_bool_loads - no vector loads of bool (TVM prints bool x2 as ushort2: wrong masks)
  bind_stray_loops  - a block left outside any thread binding gets its own threads (it would run
                      in the host code on device pointers); stray_blocks() lists them for tests
"""
from __future__ import annotations

import contextlib
import logging
import threading

from tvm import s_tir
from tvm.s_tir import dlight as dl

from .. import row_chain
from ..common import inline_injective, is_reduction, store_views_in_producers
from .inline import inlined
from ..rule import ScheduleRule
from ..targets import CUDA

log = logging.getLogger("tvmfuse.schedule")


class DlightRule(ScheduleRule):
    def __init__(self, rule, inline_first=False, tensorize=True, name=None):
        self.rule, self.name = rule, f"dlight.gpu.{name or type(rule).__name__}"
        self.inline_first, self.tensorize = inline_first, tensorize

    def apply(self, func, target):
        if self.inline_first:  # a tvmfuse group's padding stays a stage that dlight's Matmul leaves
            func = inlined(func)  # unscheduled (on the host): inline every injective stage first
            if _reduction_with_several_readers(func):  # dlight's Matmul stores through one epilogue
                log.info("rule %s declined: the matmul is read by several output stages", self.name)
                return None
        if not self.tensorize:  # tensor cores are cuda.TensorCoreMatmul's: what it declined, dlight's
            func = func.with_attr("dlight.do_not_tensorize", True)  # Matmul tiles in SIMT
        with target, one_consumer_reverse_inline():
            sch = self.rule.apply(func, target, False)
        if isinstance(sch, list):
            sch = sch[0] if sch else None
        return None if sch is None else sch.mod["main"]


def _reduction_with_several_readers(func) -> bool:
    """Whether a block with a reduction is read by more than one stage (GPT-2's fused QKV: one
    matmul, three outputs). dlight's Matmul asserts on it (it inlines the epilogue into the store
    from its accumulator, one stage only); cuda.TensorCoreMatmul stores each of them."""
    sch = s_tir.Schedule(func)
    try:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except s_tir.ScheduleError:
        return False
    return any(is_reduction(sch, b) and len(sch.get_consumers(b)) > 1 for b in blocks)


_PATCH = {"lock": threading.Lock(), "depth": 0, "orig": None}


@contextlib.contextmanager
def one_consumer_reverse_inline():
    """Within: Schedule.reverse_compute_inline refuses (ScheduleError) a consumer whose producer
    has other consumers. TVM 0.27 does not check that: it inlines the consumer into the producer,
    whose buffer the other consumers still read and nothing declares any more (ill-formed TIR).
    dlight's Matmul meets it on GPT-2's fused QKV (one matmul split into three outputs, in its
    `auto_inline_consumers`, and then asserts that none is left): a refusal instead of ill-formed
    TIR (such a group is declined before, _reduction_with_several_readers; this guards the rest).
    The method is patched on the class while any build (of any thread) is inside, and put back
    when the last one leaves."""
    with _PATCH["lock"]:
        if _PATCH["depth"] == 0:
            _PATCH["orig"] = orig = s_tir.Schedule.reverse_compute_inline

            def checked(sch, block):
                if any(len(sch.get_consumers(p)) > 1 for p in sch.get_producers(block)):
                    raise s_tir.ScheduleError("reverse_compute_inline: the producer has other consumers")
                return orig(sch, block)

            s_tir.Schedule.reverse_compute_inline = checked
        _PATCH["depth"] += 1
    try:
        yield
    finally:
        with _PATCH["lock"]:
            _PATCH["depth"] -= 1
            if _PATCH["depth"] == 0:
                s_tir.Schedule.reverse_compute_inline = _PATCH["orig"]


class CoalescedMatmul(dl.gpu.Matmul):
    """dlight's Matmul (the float32 SIMT one) with the CUDA constants of targets.CUDA["simt_matmul"].

    dlight's own CUDA constants give each thread of the shared-memory fetch 8 consecutive K
    elements (4 loads of 2), so one load of a warp touches 16 rows: reading a weight as stored
    ([N, K], a transposed Linear weight fused into the matmul) measured slower than a transpose
    kernel plus the matmul on an H200. Here each thread's part of a tile is one vector of
    `vector_size` (a K tile of micro_size_k = threads x vector_size / tile rows), so a warp's
    load covers whole rows of the tile: both operands are read coalesced, however they are stored."""

    def get_configs(self, target):
        if target.kind.name == "cuda":
            return dl.gpu.Matmul.Config(**CUDA["simt_matmul"])
        return super().get_configs(target)


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
        store_views_in_producers(sch)
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
        if row_chain.join_row(sch, chain.blocks, row) is None:
            return None
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


def scalar_bool_loads(func):
    """`func` with every vectorized loop around a block that reads a bool buffer unrolled instead.

    Why: TVM 0.27's CUDA codegen prints a 2-lane bool load as `*(ushort2*)(p + i)`, 4 bytes for 2
    one-byte bools, so each lane mixes two mask bytes and the last one reads past the buffer. Seen
    on an H200 (2026-12-04): the causal mask `where(tril, scores, -1e9)` under dlight's matmul
    epilogue gave max relative errors of 1.2-1.3 at 128 and 512 tokens and an illegal address at
    2048 (a 4 MiB mask read 2 bytes past its end), for stock tvm and tvmfuse alike. Unrolled, the
    loads are scalar `bool`s; the float stores beside them lose their 2-wide vector form only."""
    import tvm_ffi
    import tvm

    names, every = [], []

    def visit(block):
        every.append(block.name_hint)
        if any(str(r.source.dtype) == "bool" for r in block.reads):
            names.append(block.name_hint)

    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, visit), order="post")
    if not names:
        return func
    sch = s_tir.Schedule(func)
    changed = False
    for name in dict.fromkeys(names):
        if every.count(name) > 1:  # unnamed blocks of a kernel TVM writes by hand (its GPU cumsum,
            continue  # over GPT-2's bool mask): no loop of ours around them, taken as it is
        for loop in sch.get_loops(sch.get_sblock(name)):
            if sch.get(loop).kind == tvm.tirx.ForKind.VECTORIZED:
                sch.unroll(loop)
                changed = True
    return sch.mod["main"] if changed else func


def stray_blocks(func) -> list:
    """Names of the blocks of a CUDA PrimFunc that no thread binding encloses. Such a block runs in
    the host part of the function, on device pointers: a segfault on a real GPU (the padding of a
    conv group that dlight's Matmul scheduled around, seen on an H200, 2026-12-04)."""
    sch = s_tir.Schedule(func)
    return [sch.get(rv).name_hint for rv in _stray(sch)]


def _stray(sch) -> list:
    """The block RVs under the root with no thread-bound loop around them (blocks nested deeper sit
    inside one of these, or inside a bound loop)."""
    import tvm

    out = []
    try:
        root = sch.get_sblock("root")
    except s_tir.ScheduleError:  # a kernel written with its own thread launches (cuda_attention)
        return out
    for rv in sch.get_child_blocks(root):
        if not any(sch.get(lp).kind == tvm.tirx.ForKind.THREAD_BINDING for lp in sch.get_loops(rv)):
            out.append(rv)
    return out


def bind_stray_loops(func):
    """`func` with each stray spatial block (stray_blocks) given its own kernel: its loops fused,
    split by `stray_threads` and bound to blockIdx.x / threadIdx.x. A stray reduction is left (and
    stays in the list the tests check)."""
    sch = s_tir.Schedule(func)
    stray = _stray(sch)
    if not stray:
        return func
    for rv in stray:
        loops = sch.get_loops(rv)
        if not loops or any(int(iv.iter_type) != 0 for iv in sch.get(rv).iter_vars):
            continue
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        bx, tx = sch.split(fused, [None, CUDA["stray_threads"]])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
    return sch.mod["main"]


def rules():
    from .attention import Attention
    from .tensor_core import TensorCoreMatmul

    names = CUDA["rules"]
    out = [Attention()]  # a fused attention group (tvmfuse.attention) first: it writes its own kernel
    ours = {"RowReduction": RowReduction, "TensorCoreMatmul": TensorCoreMatmul}
    for name in names:
        if name in ours:
            out.append(ours[name]())
        elif name == "Matmul":
            out.append(DlightRule(CoalescedMatmul(), inline_first=True, tensorize="TensorCoreMatmul" not in names,
                                  name="Matmul"))
        else:
            out.append(DlightRule(getattr(dl.gpu, name)()))
    return out
