"""serial_when_small(func): a CPU kernel, or a loop nest of one, too small to pay for a parallel
launch runs serially.

Contract. Takes a scheduled llvm PrimFunc; returns it with every parallel loop made serial when its
work (`work(func)`: the executions of every store, counted through every loop, vectorized lanes
included, reduction updates included) is under CPU["min_parallel_work"] x the runtime's threads;
otherwise each parallel loop whose own work (its body's stores times its extent) is under that
threshold is made serial, the others kept: a kernel of several nests (a horizontally joined
optimizer step over a ResNet's 60 tensors, BatchNorm's 64-element weights beside 37k-element convs)
launches only the nests worth splitting. A loop with a symbolic extent (a dynamic batch) inside is
kept as it is. Serial
execution of a parallel loop is always a legal schedule (the loop's iterations are independent),
so only speed changes. Set min_parallel_work to 0 (TVMFUSE_CPU_MIN_PARALLEL_WORK=0) to keep every
parallel loop.

Why: every parallel loop is a launch on TVM's thread pool, which wakes its workers and joins them
(microseconds); a training step of a small MLP (8 x 32 -> 64 -> 32) is a dozen kernels of a few
thousand elements each, where the launches cost more than the work they split.
"""
from __future__ import annotations

import tvm_ffi
from tvm import tirx

from ..targets import CPU
from ..tir_walk import children


def _stores(stmt, mult=1) -> int | None:
    """Stores executed by `stmt` (None: a symbolic loop extent inside)."""
    if isinstance(stmt, tirx.BufferStore):
        return mult
    if isinstance(stmt, tirx.For):
        if not isinstance(stmt.extent, tirx.IntImm):
            return None
        mult *= int(stmt.extent.value)
    total = 0
    for child in children(stmt):
        n = _stores(child, mult)
        if n is None:
            return None
        total += n
    return total


def work(func) -> int | None:
    """Stores executed by one call of `func` (None: a symbolic loop extent)."""
    return _stores(func.body)


def _serial(loop):
    return tirx.For(loop.loop_var, loop.min, loop.extent, tirx.ForKind.SERIAL, loop.body, loop.thread_binding,
                    loop.annotations, loop.step, loop.span)


def serial_when_small(func, threads: int):
    """`func` with its parallel loops serial where their work is under the threshold (module docstring)."""
    per_thread = CPU["min_parallel_work"]
    if not per_thread or threads <= 1:
        return func
    n = work(func)
    if n is None:
        return func
    whole = n < per_thread * threads

    def serial(loop):
        if loop.kind != tirx.ForKind.PARALLEL:
            return loop
        if whole:
            return _serial(loop)
        own = _stores(loop)
        return _serial(loop) if own is not None and own < per_thread * threads else loop

    return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.For, serial)], order="post"))
