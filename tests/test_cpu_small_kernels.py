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


def test_the_launch_cost_script_times_both_forms():
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
    import parallel_launch

    (row,) = parallel_launch.measure(sizes=(2048,))
    assert row["n"] == 2048 and all(row[k] > 0 for k in row if k.endswith("us"))
