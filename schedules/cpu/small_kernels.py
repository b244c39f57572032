"""serial_when_small(func): a CPU kernel too small to pay for a parallel launch runs serially.

Contract. Takes a scheduled llvm PrimFunc; returns it with every parallel loop made serial when its
work (`work(func)`: the executions of every store, counted through every loop, vectorized lanes
included, reduction updates included) is under CPU["min_parallel_work"] x the runtime's threads;
otherwise, or when any loop extent is symbolic (a dynamic batch), returns it unchanged. Serial
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


def work(func) -> int | None:
    """Stores executed by one call of `func` (None: a symbolic loop extent)."""

    def count(stmt, mult):
        if isinstance(stmt, tirx.BufferStore):
            return mult
        if isinstance(stmt, tirx.For):
            if not isinstance(stmt.extent, tirx.IntImm):
                return None
            mult *= int(stmt.extent.value)
        total = 0
        for child in children(stmt):
            n = count(child, mult)
            if n is None:
                return None
            total += n
        return total

    return count(func.body, 1)


def serial_when_small(func, threads: int):
    """`func` with its parallel loops serial when its work is under the threshold (module docstring)."""
    per_thread = CPU["min_parallel_work"]
    if not per_thread or threads <= 1:
        return func
    n = work(func)
    if n is None or n >= per_thread * threads:
        return func

    def serial(loop):
        if loop.kind != tirx.ForKind.PARALLEL:
            return loop
        return tirx.For(loop.loop_var, loop.min, loop.extent, tirx.ForKind.SERIAL, loop.body, loop.thread_binding,
                        loop.annotations, loop.step, loop.span)

    return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.For, serial)], order="post"))
