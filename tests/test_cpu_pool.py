"""schedules/cpu/pool.py: pooling windows get cpu.Pool (not the fallback) and the same numbers."""
import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import tvmfuse
from schedules.cpu.pool import Pool

RNG = np.random.default_rng(7)


def _pool_module(shape, kind, size, stride, pad):
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    op = relax.op.nn.max_pool2d if kind == "max" else relax.op.nn.avg_pool2d
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(bb.emit(op(x, size, stride, (pad,) * 4))))
        bb.emit_func_output(out)
    return bb.get()


def _ref(x, kind, size, stride, pad):
    t = torch.from_numpy(x)
    if kind == "max":
        return torch.relu(torch.nn.functional.max_pool2d(t, size, stride, pad)).numpy()
    # relax's avg_pool2d divides by the window's in-bounds elements (count_include_pad=False)
    return torch.relu(torch.nn.functional.avg_pool2d(t, size, stride, pad, count_include_pad=False)).numpy()


@pytest.mark.parametrize("shape,kind,size,stride,pad,rule", [
    ((1, 64, 112, 112), "max", 3, 2, 1, "cpu.Pool"),  # ResNet-50's pool: rows of 56, vectors of 8
    ((1, 5, 13, 13), "max", 3, 2, 1, "cpu.Pool"),  # ragged: rows of 7, the last vector predicated
    ((1, 8, 9, 9), "avg", 3, 1, 1, "cpu.Pool"),  # stride 1, padded; the division a stage after it
    # windows that do not overlap read the input once: the row-reduction rule takes them first
    ((2, 3, 16, 16), "avg", 2, 2, 0, "cpu.RowReduction"),
    ((1, 4, 14, 14), "max", 7, 7, 0, "cpu.RowReduction"),
])
def test_pools_take_a_real_rule_and_match_torch(shape, kind, size, stride, pad, rule):
    x = RNG.standard_normal(shape).astype("float32")
    for fusion in ("none", "tvmfuse"):
        c = tvmfuse.build(_pool_module(shape, kind, size, stride, pad), "llvm", fusion)
        rules = {str(f.attrs["tvmfuse.rule"]) for _g, f in c.mod.functions_items()
                 if isinstance(f, tvm.tirx.PrimFunc) and "tvmfuse.rule" in f.attrs}
        assert rule in rules and "cpu.Fallback" not in rules, rules
        np.testing.assert_allclose(c(x), _ref(x, kind, size, stride, pad), rtol=1e-5, atol=1e-6)


def _matmul_func():
    a = tvm.te.placeholder((8, 8), name="a")
    b = tvm.te.placeholder((8, 8), name="b")
    k = tvm.te.reduce_axis((0, 8), name="k")
    c = tvm.te.compute((8, 8), lambda i, j: tvm.te.sum(a[i, k] * b[k, j], axis=k), name="c")
    return tvm.te.create_prim_func([a, b, c])


def _long_sum_func():
    a = tvm.te.placeholder((4, 4096), name="a")
    k = tvm.te.reduce_axis((0, 4096), name="k")
    c = tvm.te.compute((4,), lambda i: tvm.te.sum(a[i, k], axis=k), name="c")
    return tvm.te.create_prim_func([a, c])


@pytest.mark.parametrize("func", [_matmul_func, _long_sum_func], ids=["two-operands", "window-too-large"])
def test_pool_declines_what_is_not_a_window(func):
    assert Pool().apply(func(), tvm.target.Target("llvm")) is None
