"""Channel chains (schedules/channel_rows.py, legality's per-channel rule): a train-mode BatchNorm's
statistics over N, H, W and its normalization over [N, C, H, W] as one kernel, one row per channel,
forward and backward; each build checked against numpy.

Must not fire: the channels last (NHWC: each channel a strided column), a symbolic batch, and a
function whose kept axes lead already (a layer norm: a row chain as it is).
"""
import numpy as np
import pytest
import tvm
from tvm import relax, s_tir

import tvmfuse
from schedules import channel_rows

F32 = "float32"
EPS = 1e-5
op = relax.op


def _vec(t, axes):
    """A [C] vector broadcast over the other axes of a 4-d layout: [C, 1, 1] for NCHW."""
    for _ in range(axes):
        t = op.expand_dims(t, axis=[-1])
    return t


def _bn_forward(shape, channels_last=False, symbolic=False):
    """y = relu(gamma * (x - mean) * rsqrt(var + eps) + beta), plus the saved mean and rstd and the
    running mean's update, as AOTAutograd's decomposed train-mode BatchNorm computes them."""
    bb = relax.BlockBuilder()
    c = shape[-1] if channels_last else shape[1]
    axes = [0, 1, 2] if channels_last else [0, 2, 3]
    dims = (tvm.tirx.Var("n", "int64"),) + tuple(shape[1:]) if symbolic else shape
    x = relax.Var("x", relax.TensorType(dims, F32))
    gamma, beta, running = (relax.Var(n, relax.TensorType((c,), F32)) for n in ("gamma", "beta", "running"))
    with bb.function("main", [x, gamma, beta, running]):
        with bb.dataflow():
            var = bb.emit(op.variance(x, axis=axes, keepdims=True))
            mean = bb.emit(op.mean(x, axis=axes, keepdims=True))
            rstd = bb.emit(op.rsqrt(op.add(var, relax.const(EPS, F32))))
            xhat = bb.emit(op.multiply(op.subtract(x, mean), rstd))
            g, b = (gamma, beta) if channels_last else (_vec(gamma, 2), _vec(beta, 2))
            y = bb.emit(op.nn.relu(op.add(op.multiply(xhat, g), b)))
            saved_mean = bb.emit(op.squeeze(mean, axis=axes))
            saved_rstd = bb.emit(op.squeeze(rstd, axis=axes))
            new_running = bb.emit(op.add(op.multiply(saved_mean, relax.const(0.1, F32)),
                                         op.multiply(running, relax.const(0.9, F32))))
            out = bb.emit_output(relax.Tuple([y, saved_mean, saved_rstd, new_running]))
        bb.emit_func_output(out)
    return bb.get()


def _bn_forward_numpy(x, gamma, beta, running, axes=(0, 2, 3)):
    mean = x.mean(axis=axes, keepdims=True)
    rstd = 1 / np.sqrt(x.var(axis=axes, keepdims=True) + EPS)
    shape = [1] * x.ndim
    shape[[k for k in range(x.ndim) if k not in axes][0]] = -1
    y = np.maximum((x - mean) * rstd * gamma.reshape(shape) + beta.reshape(shape), 0)
    return [y, mean.ravel(), rstd.ravel(), mean.ravel() * 0.1 + running * 0.9]


def _bn_backward(shape):
    """BatchNorm's backward as torch decomposes it: dbeta = sum(dy), dgamma = sum(dy * xhat), and
    dx = (dy - dbeta / M - xhat * dgamma / M) * gamma * rstd, from the saved mean and rstd."""
    bb = relax.BlockBuilder()
    n, c, h, w = shape
    m = float(n * h * w)
    x, dy = (relax.Var(k, relax.TensorType(shape, F32)) for k in ("x", "dy"))
    mean, rstd, gamma = (relax.Var(k, relax.TensorType((c,), F32)) for k in ("mean", "rstd", "gamma"))
    with bb.function("main", [x, dy, mean, rstd, gamma]):
        with bb.dataflow():
            xhat = bb.emit(op.multiply(op.subtract(x, _vec(mean, 2)), _vec(rstd, 2)))
            dbeta = bb.emit(op.sum(dy, axis=[0, 2, 3]))
            dgamma = bb.emit(op.sum(op.multiply(dy, xhat), axis=[0, 2, 3]))
            centered = op.subtract(op.subtract(dy, _vec(op.divide(dbeta, relax.const(m, F32)), 2)),
                                   op.multiply(xhat, _vec(op.divide(dgamma, relax.const(m, F32)), 2)))
            dx = bb.emit(op.multiply(centered, _vec(op.multiply(gamma, rstd), 2)))
            out = bb.emit_output(relax.Tuple([dx, dgamma, dbeta]))
        bb.emit_func_output(out)
    return bb.get()


def _rules(built):
    return dict(zip(built.call_sites(), built.rules()))


@pytest.mark.parametrize("shape", [(4, 16, 16, 16), (4, 32, 8, 8), (2, 3, 5, 7), (2, 8, 14, 14)])
def test_batch_norm_forward_is_one_channel_row_kernel(shape):
    built = tvmfuse.build(_bn_forward(shape), "llvm", "tvmfuse")
    assert built.launches == 1
    assert list(_rules(built).values()) == ["cpu.RowReduction"]  # not the fallback's naive nest
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 2 + 1).astype(F32)
    gamma, beta, running = (rng.standard_normal(shape[1]).astype(F32) for _ in range(3))
    for got, want in zip(built(x, gamma, beta, running), _bn_forward_numpy(x, gamma, beta, running)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(4, 16, 16, 16), (2, 3, 5, 7)])
def test_batch_norm_backward_is_one_channel_row_kernel(shape):
    built = tvmfuse.build(_bn_backward(shape), "llvm", "tvmfuse")
    assert built.launches == 1
    assert list(_rules(built).values()) == ["cpu.RowReduction"]
    rng = np.random.default_rng(1)
    x, dy = (rng.standard_normal(shape).astype(F32) for _ in range(2))
    c = shape[1]
    mean = x.mean(axis=(0, 2, 3)).astype(F32)
    rstd = (1 / np.sqrt(x.var(axis=(0, 2, 3)) + EPS)).astype(F32)
    gamma = rng.standard_normal(c).astype(F32)
    b = (slice(None), None, None)
    xhat = (x - mean[b]) * rstd[b]
    m = x.size / c
    dbeta, dgamma = dy.sum(axis=(0, 2, 3)), (dy * xhat).sum(axis=(0, 2, 3))
    dx = (dy - dbeta[b] / m - xhat * dgamma[b] / m) * (gamma * rstd)[b]
    for got, want in zip(built(x, dy, mean, rstd, gamma), [dx, dgamma, dbeta]):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


def test_must_not_fire_with_the_channels_last():
    """NHWC: the statistics and the normalization stay two kernels (each channel would be a
    strided column of the row rule); the results are still right."""
    shape = (2, 6, 6, 8)
    built = tvmfuse.build(_bn_forward(shape, channels_last=True), "llvm", "tvmfuse")
    assert built.launches >= 2
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape).astype(F32)
    gamma, beta, running = (rng.standard_normal(8).astype(F32) for _ in range(3))
    want = _bn_forward_numpy(x, gamma, beta, running, axes=(0, 1, 2))
    for got, w in zip(built(x, gamma, beta, running), want):
        np.testing.assert_allclose(np.asarray(got), w, rtol=1e-4, atol=1e-4)


def test_must_not_fire_with_a_symbolic_batch():
    plan = tvmfuse.pipeline.plan(_bn_forward((4, 8, 6, 6), symbolic=True)).plan
    assert len(plan.groups) >= 2  # statistics and normalization apart


def _scheduled(func):
    sch = s_tir.Schedule(func)
    from schedules.common import inline_injective

    assert inline_injective(sch) is not None
    return sch


def _only_primfunc(mod):
    (func,) = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    return func


def test_lead_kept_axes_moves_the_channel_first_and_declines_a_row_chain():
    fused = tvmfuse.pipeline.plan(_bn_forward((2, 4, 3, 5))).mod
    sch = _scheduled(_only_primfunc(fused))
    assert channel_rows.lead_kept_axes(sch)
    full = [b for b in sch.get_child_blocks(sch.get_sblock("root"))
            if [int(iv.dom.extent) for iv in sch.get(b).iter_vars] == [4, 2, 3, 5]]
    assert full  # the normalization now visits channel, then N, H, W
    # a layer norm's reductions keep the leading axis already: nothing to do
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 32), F32))
    with bb.function("main", [x]):
        with bb.dataflow():
            mean = op.mean(x, axis=[1], keepdims=True)
            out = bb.emit_output(op.subtract(x, mean))
        bb.emit_func_output(out)
    sch = _scheduled(_only_primfunc(tvmfuse.pipeline.plan(bb.get()).mod))
    before = sch.mod["main"]
    assert not channel_rows.lead_kept_axes(sch)
    tvm.ir.assert_structural_equal(sch.mod["main"], before)
