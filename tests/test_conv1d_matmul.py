"""Conv1dAsMatmul (tvmfuse/passes/conv1d_matmul.py): the rewritten graph's form, the cases where it
must not fire, the im2col + matmul against a numpy conv1d (padding, stride, dilation, groups, a
weight that is an input), and the kernels a build runs (no cpu.Fallback for the conv)."""
import logging

import numpy as np
import pytest
import tvm
from tvm import relax

import tvmfuse
from tvmfuse.passes.conv1d_matmul import Conv1dAsMatmul

F32 = "float32"


def _conv1d_ref(x, w, stride=1, pad=(0, 0), dilation=1, groups=1):
    """A direct numpy conv1d, NCW / OIW, in float64."""
    n, c, _length = x.shape
    o, cg, k = w.shape
    xp = np.pad(x.astype("float64"), ((0, 0), (0, 0), pad))
    lo = (xp.shape[2] - dilation * (k - 1) - 1) // stride + 1
    og = o // groups
    out = np.zeros((n, o, lo))
    for f in range(o):
        g = f // og
        for kk in range(k):
            cols = xp[:, g * cg:(g + 1) * cg, kk * dilation: kk * dilation + stride * (lo - 1) + 1: stride]
            out[:, f] += np.einsum("c,ncl->nl", w[f, :, kk], cols)
    return out


def _mod(n, c, length, o, k, stride=1, pad=0, dilation=1, groups=1, w=None, layout="NCW"):
    shape = (n, c, length) if layout == "NCW" else (n, length, c)
    x = relax.Var("x", relax.TensorType(shape, F32))
    params = [x]
    if w is None:
        wv = relax.Var("w", relax.TensorType((o, c // groups, k), F32))
        params.append(wv)
    else:
        wv = relax.const(w)
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv1d(x, wv, strides=stride, padding=pad, dilation=dilation, groups=groups,
                                           data_layout=layout))
            z = bb.emit_output(relax.op.nn.gelu(y))
        bb.emit_func_output(z)
    return bb.get()


def _ops(mod):
    names = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op):
                names.append(b.value.op.name)
    return names


def test_a_conv1d_becomes_an_im2col_kernel_and_a_matmul_transposed_back():
    after = Conv1dAsMatmul(_mod(1, 16, 40, 32, 3, stride=2, pad=1))
    # the weight is an input: its rearrangement is three layout ops in the graph
    assert _ops(after) == ["relax.call_tir", "relax.reshape", "relax.permute_dims", "relax.reshape",
                           "relax.matmul", "relax.permute_dims", "relax.nn.gelu"], _ops(after)
    im2col = [f for gv, f in after.functions_items() if gv.name_hint.startswith("im2col")]
    assert len(im2col) == 1 and isinstance(im2col[0], tvm.tirx.PrimFunc)
    out_ty = after["main"].body.body.ty
    assert [int(d) for d in out_ty.shape.values] == [1, 32, 20]


def test_a_grouped_conv_is_a_batch_matmul_over_groups():
    after = Conv1dAsMatmul(_mod(1, 16, 40, 32, 3, groups=2, w=np.ones((32, 8, 3), F32)))
    assert _ops(after) == ["relax.call_tir", "relax.matmul", "relax.permute_dims", "relax.reshape", "relax.nn.gelu"]
    const = after["main"].body.blocks[0].bindings[1].value.args[1]
    assert const.value.shape == (2, 24, 16)


def test_a_constant_weight_is_rearranged_at_build_time():
    w = np.ones((32, 16, 3), F32)
    after = Conv1dAsMatmul(_mod(1, 16, 40, 32, 3, w=w))
    assert _ops(after) == ["relax.call_tir", "relax.matmul", "relax.permute_dims", "relax.nn.gelu"]
    const = after["main"].body.blocks[0].bindings[1].value.args[1]
    assert isinstance(const, tvm.ir.expr.Constant) and const.value.shape == (48, 32)


@pytest.mark.parametrize("case, mod", [
    ("depthwise", _mod(1, 16, 40, 16, 3, groups=16)),
    ("two outputs per group", _mod(1, 16, 40, 16, 3, groups=8)),
    ("reduction of 3", _mod(1, 1, 40, 16, 3)),
    ("channel-last layout", _mod(1, 16, 40, 32, 3, layout="NWC")),
    ("an im2col of 64 GiB", _mod(1, 1024, 1 << 20, 64, 16)),  # only its shapes are read: no data
])
def test_must_not_fire(case, mod, caplog):
    with caplog.at_level(logging.INFO, logger="tvmfuse.fusion"):
        after = Conv1dAsMatmul(mod)
    tvm.ir.assert_structural_equal(after, mod)
    assert "stays a conv" in caplog.text


def test_a_symbolic_length_keeps_the_conv():
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((1, 16, n), F32))
    w = relax.Var("w", relax.TensorType((32, 16, 3), F32))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.conv1d(x, w))
        bb.emit_func_output(y)
    mod = bb.get()
    tvm.ir.assert_structural_equal(Conv1dAsMatmul(mod), mod)


@pytest.mark.parametrize("n, c, length, o, k, stride, pad, dilation, groups", [
    (1, 1, 400, 32, 10, 5, 0, 1, 1),       # wav2vec2's first layer: one input channel, a wide kernel
    (1, 32, 199, 32, 3, 2, 0, 1, 1),       # its later layers: stride 2, a ragged length
    (2, 16, 41, 16, 8, 1, 4, 1, 4),        # the positional conv: groups, an even kernel, padded
    (1, 8, 50, 16, 3, 1, 1, 1, 1),         # Whisper's: padding 1
    (1, 8, 37, 12, 3, 1, 2, 2, 1),         # dilation 2
])
def test_rewritten_conv_matches_a_numpy_conv1d(n, c, length, o, k, stride, pad, dilation, groups):
    rng = np.random.default_rng(length)
    w = (rng.standard_normal((o, c // groups, k)) * 0.3).astype(F32)
    x = rng.standard_normal((n, c, length)).astype(F32)
    ref = _conv1d_ref(x, w, stride, (pad, pad), dilation, groups)
    ref = 0.5 * ref * (1 + np.vectorize(__import__("math").erf)(ref / np.sqrt(2)))
    for mod, args in ((_mod(n, c, length, o, k, stride, pad, dilation, groups, w=w), (x,)),
                      (_mod(n, c, length, o, k, stride, pad, dilation, groups), (x, w))):
        built = tvmfuse.build(mod, "llvm", "tvmfuse")
        rules = {str(f.attrs["tvmfuse.rule"]) for _g, f in built.mod.functions_items()
                 if getattr(f, "attrs", None) is not None and "tvmfuse.rule" in f.attrs}
        assert "cpu.Fallback" not in rules and "cpu.Matmul" in rules, rules
        np.testing.assert_allclose(built(*args), ref, rtol=1e-4, atol=1e-4)


def test_cuda_builds_keep_the_conv():
    mod = _mod(1, 16, 40, 32, 3)
    built = tvmfuse.build(mod, "cuda", "tvmfuse")
    assert any("conv1d" in gv.name_hint for gv, _f in built.mod.functions_items())
