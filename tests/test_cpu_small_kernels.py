"""schedules/cpu/small_kernels.py: a kernel too small for a parallel launch runs serially, a big or
symbolic one keeps its parallel loops, and the numerics do not change."""
import numpy as np
import tvm
from tvm import te, tirx

from schedules import apply_default_schedules
from schedules.cpu.small_kernels import serial_when_small, work
from tvmfuse import config
from tvmfuse.target import resolve


def _add(n, m=None):
    shape = (n if m is None else m, 64)
    a = te.placeholder(shape, name="a")
    b = te.compute(shape, lambda i, j: a[i, j] * 2.0 + 1.0, name="b")
    return tvm.IRModule({"main": te.create_prim_func([a, b]).with_attr("global_symbol", "main")})


def _parallel_loops(func) -> int:
    found = []

    def visit(node):
        if isinstance(node, tirx.For) and node.kind == tirx.ForKind.PARALLEL:
            found.append(node)
        return node

    import tvm_ffi

    tvm_ffi.structural_map(func.body, [(tirx.For, visit)], order="post")
    return len(found)


def test_a_small_kernel_runs_serially_and_a_big_one_in_parallel():
    target = resolve("llvm")
    small = apply_default_schedules(_add(8), target)["main"]  # 512 stores
    big = apply_default_schedules(_add(4096), target)["main"]  # 262144 stores
    assert work(small) == 8 * 64 and _parallel_loops(small) == 0
    assert work(big) == 4096 * 64 and _parallel_loops(big) >= 1


def test_the_threshold_and_a_symbolic_extent_keep_parallel_loops():
    target = resolve("llvm")
    with config.override(cpu={"min_parallel_work": 0}):  # off
        assert _parallel_loops(apply_default_schedules(_add(8), target)["main"]) >= 1
    n = tirx.Var("n", "int64")
    dyn = apply_default_schedules(_add(None, n), target)["main"]
    assert work(dyn) is None and _parallel_loops(dyn) >= 1
    assert serial_when_small(dyn, threads=1) is dyn  # one thread: nothing to save


def test_serial_small_kernels_compute_the_same():
    target = resolve("llvm")
    ex = tvm.compile(apply_default_schedules(_add(8), target), target=target)
    a = np.random.default_rng(0).standard_normal((8, 64)).astype("float32")
    out = tvm.runtime.empty((8, 64), "float32", tvm.cpu())
    ex["main"](tvm.runtime.tensor(a), out)
    np.testing.assert_allclose(out.numpy(), a * 2 + 1, rtol=1e-6)


def _two_nests(big_rows, small_rows):
    """Two independent updates in one kernel (a horizontally joined optimizer step's nests)."""
    a, c = te.placeholder((big_rows, 64), name="a"), te.placeholder((small_rows, 64), name="c")
    b = te.compute(a.shape, lambda i, j: a[i, j] * 2.0 + 1.0, name="b")
    d = te.compute(c.shape, lambda i, j: c[i, j] * 3.0, name="d")
    return tvm.IRModule({"main": te.create_prim_func([a, c, b, d]).with_attr("global_symbol", "main")})


def _nest_kinds(func):
    """The kind of the outermost loop of each nest, in program order."""
    from schedules.tir_walk import children

    def top(stmt):
        if isinstance(stmt, tirx.For):
            yield stmt.kind
            return
        for child in children(stmt):
            yield from top(child)

    return list(top(func.body))


def test_a_small_nest_beside_a_big_one_runs_serially():
    """The kernel is big (its first nest), so it stays parallel there; its 8-row nest does not pay
    for a launch of its own and runs serially. Same numerics."""
    target = resolve("llvm")
    mod = apply_default_schedules(_two_nests(4096, 8), target)
    assert _nest_kinds(mod["main"]) == [tirx.ForKind.PARALLEL, tirx.ForKind.SERIAL]
    with config.override(cpu={"min_parallel_work": 0}):  # off: both nests parallel
        assert _nest_kinds(apply_default_schedules(_two_nests(4096, 8), target)["main"]) == [tirx.ForKind.PARALLEL] * 2
    ex = tvm.compile(mod, target=target)
    rng = np.random.default_rng(1)
    a, c = rng.standard_normal((4096, 64)).astype("float32"), rng.standard_normal((8, 64)).astype("float32")
    b, d = (tvm.runtime.empty(s, "float32", tvm.cpu()) for s in ((4096, 64), (8, 64)))
    ex["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(c), b, d)
    np.testing.assert_allclose(b.numpy(), a * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(d.numpy(), c * 3, rtol=1e-6)


def test_the_launch_cost_script_times_both_forms():
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
    import parallel_launch

    (row,) = parallel_launch.measure(sizes=(2048,))
    assert row["n"] == 2048 and all(row[k] > 0 for k in row if k.endswith("us"))
