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


def work(func) -> int | None:
    """Stores executed by one call of `func` (None: a symbolic loop extent)."""
    total = 0

    def visit(stmt, mult):
        nonlocal total
        if stmt is None or total is None:
            return
        if isinstance(stmt, tirx.For):
            if not isinstance(stmt.extent, tirx.IntImm):
                total = None
                return
            visit(stmt.body, mult * int(stmt.extent.value))
        elif isinstance(stmt, tirx.BufferStore):
            total += mult
        elif isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                visit(s, mult)
        else:
            for field in ("block", "body", "then_case", "else_case", "init"):
                child = getattr(stmt, field, None)
                if isinstance(child, tirx.Stmt):
                    visit(child, mult)

    visit(func.body, 1)
    return total


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
