"""Elementwise chains in one loop: a stage that reads an earlier stage's output element for element
runs in that stage's parallel loop, not in a second pass of its own.

Where: an optimizer step's kernel. SGD with momentum writes the new moment m' = 0.9 m + g, an
output (the moment's new value), and then the new parameter p' = p - lr m' reads it. Both are
outputs, so neither is inlined, and cpu.Injective gave each its own parallel loop: two fork-joins
per parameter and a second pass over m' (a BERT's 30 parameter pairs, 60 parallel loops).

Contract: `join(sch, block_rv, scheduled) -> bool` moves spatial block `block_rv` under the
parallel loop of its one in-kernel producer, already scheduled by `schedule_spatial_block` as
`parallel(outer) x vectorized(lanes)` (`scheduled`: the blocks scheduled so far), and vectorizes
its loops there; True when it did, False (nothing changed) otherwise. It joins only where the
join computes each element once: both blocks iterate over the same static shape, the consumer
reads the producer's output at its own indices, and the vector divides the last axis (so each
iteration of the outer loop is `lanes` elements of one row). It declines where the producer also
reads an input the consumer reads: that input may be the consumer's output written in place
later (passes/update_in_place.py: weight decay's p read by the moment, p' written over p), which
its legality rule only accepts in an earlier loop nest.
"""
from __future__ import annotations

import tvm
from tvm import s_tir

from .common import block_bits, extent, lanes


def join(sch, block_rv, scheduled) -> bool:
    """See the module docstring."""
    producers = sch.get_producers(block_rv)
    if len(producers) != 1 or not _among(sch, producers[0], scheduled):
        return False
    prod, cons = sch.get(producers[0]), sch.get(block_rv)
    shape = _static_extents(prod)
    if shape is None or shape != _static_extents(cons) or not shape:
        return False
    n = lanes(block_bits(sch, block_rv))
    if shape[-1] % n or lanes(block_bits(sch, producers[0])) != n:
        return False
    if not _reads_own_element(cons, prod) or _shared_inputs(sch, prod, cons):
        return False
    loops = sch.get_loops(producers[0])
    if len(loops) != 2 or sch.get(loops[0]).kind != tvm.tirx.ForKind.PARALLEL or extent(sch, loops[1]) != n:
        return False
    try:
        sch.reverse_compute_at(block_rv, loops[0], preserve_unit_loops=False)
    except (s_tir.ScheduleError, ValueError):
        return False
    inner = [lp for lp in sch.get_loops(block_rv)[1:] if extent(sch, lp) != 1]
    if len(inner) == 1 and extent(sch, inner[0]) == n:
        sch.vectorize(inner[0])
    return True


def _among(sch, block_rv, blocks) -> bool:
    """Whether `block_rv` is one of `blocks`; a block a schedule replaced (loop_partition's
    wrappers of a ragged tail) no longer exists and is none of them."""
    stmt = sch.get(block_rv)
    for b in blocks:
        try:
            if sch.get(b).same_as(stmt):
                return True
        except ValueError:  # "The block no longer exists in the IRModule"
            continue
    return False


def _static_extents(block):
    ext = [iv.dom.extent for iv in block.iter_vars]
    if not all(isinstance(e, tvm.tirx.IntImm) for e in ext) or any(int(iv.iter_type) != 0 for iv in block.iter_vars):
        return None
    return [int(e) for e in ext]


def _reads_own_element(cons, prod) -> bool:
    """The consumer reads each buffer the producer writes at its own iter vars, in order, and the
    producer writes it at its own."""
    written = {w.source for w in prod.writes}
    ivs_p, ivs_c = [iv.var for iv in prod.iter_vars], [iv.var for iv in cons.iter_vars]
    if not all(len(w.region) == len(ivs_p) and all(r.min.same_as(v) for r, v in zip(w.region, ivs_p))
               for w in prod.writes):
        return False
    reads = [r for r in cons.reads if any(r.source.same_as(w) for w in written)]
    return bool(reads) and all(len(r.region) == len(ivs_c) and all(g.min.same_as(v) for g, v in zip(r.region, ivs_c))
                               for r in reads)


def _shared_inputs(sch, prod, cons) -> bool:
    params = list(sch.mod["main"].params)
    inputs = lambda block: {p for p in params for r in block.reads if r.source.same_as(p)}  # noqa: E731
    return bool(inputs(prod) & inputs(cons))
