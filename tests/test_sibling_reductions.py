"""Sibling reductions of a value the block computes (fusion/plan_fusion.py `_reduction_readers`):
a train-mode batch norm's mean and variance of a convolution's output read it in one kernel
instead of two; the sums over the batch of its backward likewise.

Must not fire: two reductions of one value over different axes (their rows differ: legality's
reduction_space refuses), and two elementwise groups of one computed value (no reduction: not a
candidate at all). Each build is checked against numpy, and the joined kernel takes the row rule,
not the fallback, at the shapes where the rule once mistook which of two equal loops was the
partial sums' lanes (16 channels of 4 x 16 x 16: a 32 x 32 split).
"""
import numpy as np
import pytest
from tvm import relax

import tvmfuse
from tvmfuse.config import Knobs
from tvmfuse.fusion.plan_fusion import plan

EPS = 1e-5
F32 = "float32"


def _bn_stats(shape, other_axes=None, elementwise=False):
    """x -> conv2d (3x3, same channels) -> y; returns (y, mean(y), rsqrt(var(y) + eps)) over the
    batch and spatial axes, as AOTAutograd's forward saves them. `other_axes`: the mean is taken
    over those axes instead (must not join); `elementwise`: no reductions, two scalings of y."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, F32))
    w = relax.Var("w", relax.TensorType((shape[1], shape[1], 3, 3), F32))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
            if elementwise:
                a = bb.emit(relax.op.multiply(y, relax.const(2.0, F32)))
                b = bb.emit(relax.op.add(y, relax.const(1.0, F32)))
                out = bb.emit_output(relax.Tuple([a, b]))
            else:
                var = bb.emit(relax.op.variance(y, [0, 2, 3], keepdims=True))
                mean = bb.emit(relax.op.mean(y, other_axes or [0, 2, 3], keepdims=True))
                rstd = bb.emit(relax.op.rsqrt(relax.op.add(var, relax.const(EPS, F32))))
                out = bb.emit_output(relax.Tuple([y, mean, rstd]))
        bb.emit_func_output(out)
    return bb.get()


def _groups(mod):
    func = mod["main"]
    (block,) = func.body.blocks
    outputs = set(relax.analysis.free_vars(func.body.body))
    p = plan(block, outputs, Knobs().as_dict())
    ops = {n.idx: n.op for n in p.graph.nodes}
    return [sorted(ops[i] for i in grp) for grp in p.groups]


def _conv(x, w):
    n, c, h, wd = x.shape
    pad = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd), F32)
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", pad[:, :, i:i + h, j:j + wd], w[:, :, i, j])
    return out


@pytest.mark.parametrize("shape", [(4, 16, 16, 16), (4, 32, 8, 8), (2, 3, 5, 7)])
def test_mean_and_variance_of_a_conv_output_are_one_row_kernel(shape):
    mod = _bn_stats(shape)
    assert ["add", "mean", "rsqrt", "variance"] in _groups(mod)
    built = tvmfuse.build(mod, "llvm", "tvmfuse")
    assert built.launches == 2  # the convolution, and the statistics in one pass
    stats = [r for n, r in zip(built.call_sites(), built.rules()) if "variance" in n]
    assert stats == ["cpu.RowReduction"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(F32)
    w = (rng.standard_normal((shape[1], shape[1], 3, 3)) / 3).astype(F32)
    y, mean, rstd = (np.asarray(o) for o in built(x, w))
    want = _conv(x, w)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(mean, want.mean((0, 2, 3), keepdims=True), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rstd, 1 / np.sqrt(want.var((0, 2, 3), keepdims=True) + EPS), rtol=1e-4)


def test_must_not_fire_for_reductions_over_different_axes():
    """A mean over the channels beside a variance over the batch: different rows, two kernels."""
    groups = _groups(_bn_stats((2, 4, 6, 6), other_axes=[1]))
    assert ["mean"] in groups and ["add", "rsqrt", "variance"] in groups


def test_must_not_fire_for_elementwise_siblings_of_a_computed_value():
    """Two elementwise uses of the convolution's output: not sibling reductions, not joined here
    (the convolution's epilogue may take one of them; never both into one group of their own)."""
    groups = _groups(_bn_stats((2, 4, 6, 6), elementwise=True))
    assert ["add", "multiply"] not in groups
