"""Channel chains as row chains: a reduction over every axis but the channels, and its consumers.

A train-mode BatchNorm is the example: per channel c of an NCHW input, the mean and variance fold
the N, H and W axes, and the normalization then runs over all of [N, C, H, W] reading them. Its
reductions keep the channel axis, which is not the leading one, so the full-shape consumer's
leading loop (N) is not the reductions' (C), and `row_chain.analyze` finds no common row.

Contract: `lead_kept_axes(sch)` rewrites, in place, every spatial block that iterates over the
reductions' whole input shape so that its iteration runs over the kept axes first (the channel
axis, then N, H, W): `transform_block_layout` with that permutation, which changes the order in
which the block visits its elements, not what it computes. Afterwards `row_chain.analyze` sees
one row per channel: each reduction folds its channel's elements, and the consumer's row is that
channel's elements, so RowReduction computes a channel's statistics and normalizes it while its
elements are still in cache. Returns True when it changed a block; False (nothing changed) when
the function is not such a chain: no reduction, reductions that keep different axes or read
inputs of different shapes, a kept axis already leading, or a full-shape block that writes
anything but its own element (a transposed or gathered store).
"""
from __future__ import annotations

import tvm

from .row_chain import vars_in

_SPATIAL, _REDUCE = 0, 2


def lead_kept_axes(sch) -> bool:
    """See the module docstring."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    reductions = [b for b in blocks if any(int(iv.iter_type) == _REDUCE for iv in sch.get(b).iter_vars)]
    if not reductions:
        return False
    kept = {_kept_axes(sch, b) for b in reductions}
    if len(kept) != 1 or None in kept:
        return False
    shape, axes = kept.pop()
    if not axes or list(axes) == list(range(len(axes))):
        return False  # no kept axis, or the kept axes lead already (a row chain as it is)
    perm = list(axes) + [k for k in range(len(shape)) if k not in axes]
    full = [b for b in blocks if _over(sch.get(b), shape)]
    if not full or not all(_writes_own_element(sch.get(b)) for b in full):
        return False
    index_map = tvm.tirx.IndexMap.from_func(lambda *ivs: [ivs[k] for k in perm], ndim=len(perm))
    for b in full:
        sch.transform_block_layout(b, index_map)
    return True


def _kept_axes(sch, block_rv):
    """(shape of the inputs a reduction folds, the positions of them it keeps: indexed by a
    spatial iter var), or None where that cannot be told: inputs of different shapes or kept
    positions (x and dy in a BatchNorm's backward agree), or a shape that is not static. Reads
    that are not one iter var per position (broadcasts) do not count."""
    block = sch.get(block_rv)
    spatial = {iv.var.name for iv in block.iter_vars if int(iv.iter_type) == _SPATIAL}
    reduce = {iv.var.name for iv in block.iter_vars if int(iv.iter_type) == _REDUCE}
    found = set()
    for r in block.reads:
        if not any(vars_in(rg.min) & reduce for rg in r.region):
            continue  # not folded: a per-channel operand (the mean a variance subtracts)
        if not all(isinstance(rg.min, tvm.tirx.Var) for rg in r.region):
            continue  # a broadcast read (an average pool's gradient, dy[n, c, 0, 0])
        shape = tuple(_shape(r.source))
        if None in shape:
            return None
        found.add((shape, tuple(k for k, rg in enumerate(r.region) if rg.min.name in spatial)))
    return found.pop() if len(found) == 1 else None


def _shape(buffer):
    """The static shape of a buffer (None for a symbolic dim)."""
    return [int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in buffer.shape]


def _over(block, shape) -> bool:
    """A spatial block whose iteration space is exactly `shape` (one iter var per dim, in order)."""
    ivs = list(block.iter_vars)
    return (len(ivs) == len(shape) and all(int(iv.iter_type) == _SPATIAL for iv in ivs)
            and all(isinstance(iv.dom.extent, tvm.tirx.IntImm) and int(iv.dom.extent) == d
                    for iv, d in zip(ivs, shape)))


def _writes_own_element(block) -> bool:
    """Every buffer the block writes is indexed by its iter vars, in order, one per dim."""
    ivs = [iv.var for iv in block.iter_vars]
    return all(len(w.region) == len(ivs) and all(rg.min.same_as(v) for rg, v in zip(w.region, ivs))
               for w in block.writes)
