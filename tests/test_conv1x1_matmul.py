"""Conv1x1AsMatmul (tvmfuse/passes/conv1x1_matmul.py): golden Before/Expected IR, the cases where it
must not fire, the profitability model, and the rewritten convs against numpy inside full builds."""
import logging

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R

import tvmfuse
from tvmfuse.passes.conv1x1_matmul import conv1x1_as_matmul, fill
from schedules.targets import cpu_table

F32 = "float32"
AVX2 = {"conv_columns": 6, "mm_rows": 4, "conv1x1_matmul_fill": 70}  # the table's keys the pass reads
HASWELL = {"kind": "llvm", "mcpu": "haswell"}  # an AVX2 target any AVX2 host runs
AVX512 = {"conv_columns": 8, "mm_rows": 8, "conv1x1_matmul_fill": 70}


@I.ir_module
class Before:
    @R.function
    def main(x: R.Tensor((1, 16, 7, 7), "float32"), w: R.Tensor((32, 16, 1, 1), "float32")):
        with R.dataflow():
            y = R.nn.conv2d(x, w)
            z = R.nn.relu(y)
            R.output(z)
        return z


@I.ir_module
class Expected:
    @R.function
    def main(x: R.Tensor((1, 16, 7, 7), "float32"), w: R.Tensor((32, 16, 1, 1), "float32")):
        with R.dataflow():
            a = R.permute_dims(R.reshape(x, R.shape([1, 16, 49])), axes=[0, 2, 1])
            wt = R.permute_dims(R.reshape(w, R.shape([32, 16])), axes=[1, 0])
            m = R.matmul(a, wt)
            y = R.reshape(R.permute_dims(m, axes=[0, 2, 1]), R.shape([1, 32, 7, 7]))
            z = R.nn.relu(y)
            R.output(z)
        return z


def test_golden_1x1_conv_on_a_7x7_map_becomes_a_matmul_over_pixels():
    after = conv1x1_as_matmul(AVX2)(Before)
    tvm.ir.assert_structural_equal(after, relax.transform.Normalize()(Expected))


@I.ir_module
class Strided:
    @R.function
    def main(x: R.Tensor((1, 16, 14, 14), "float32"), w: R.Tensor((32, 16, 1, 1), "float32")):
        with R.dataflow():
            y = R.nn.conv2d(x, w, strides=[2, 2])
            R.output(y)
        return y


@I.ir_module
class StridedExpected:
    @R.function
    def main(x: R.Tensor((1, 16, 14, 14), "float32"), w: R.Tensor((32, 16, 1, 1), "float32")):
        with R.dataflow():
            xs = R.strided_slice(x, axes=[2, 3], begin=[0, 0], end=[14, 14], strides=[2, 2])
            a = R.permute_dims(R.reshape(xs, R.shape([1, 16, 49])), axes=[0, 2, 1])
            wt = R.permute_dims(R.reshape(w, R.shape([32, 16])), axes=[1, 0])
            m = R.matmul(a, wt)
            y = R.reshape(R.permute_dims(m, axes=[0, 2, 1]), R.shape([1, 32, 7, 7]))
            R.output(y)
        return y


def test_golden_strided_1x1_conv_slices_its_input_first():
    after = conv1x1_as_matmul(AVX2)(Strided)
    tvm.ir.assert_structural_equal(after, relax.transform.Normalize()(StridedExpected))


def _conv_mod(c, o, h, k=1, stride=1, pad=0, groups=1):
    x = relax.Var("x", relax.TensorType((1, c, h, h), F32))
    w = relax.Var("w", relax.TensorType((o, c // groups, k, k), F32))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.conv2d(x, w, strides=stride, padding=pad, groups=groups))
        bb.emit_func_output(y)
    return bb.get()


@pytest.mark.parametrize("case, mod, table", [
    ("3x3 kernel", _conv_mod(16, 32, 7, k=3, pad=1), AVX2),
    ("padded 1x1", _conv_mod(16, 32, 7, pad=1), AVX2),
    ("grouped 1x1", _conv_mod(16, 32, 7, groups=2), AVX2),
    ("14-wide rows fill 0.78 of 6 columns", _conv_mod(16, 32, 14), AVX2),
    ("28-wide rows fill 1.0 of 8 columns", _conv_mod(16, 32, 28), AVX512),
    ("7-wide rows fill 0.88 of 8 columns (AVX-512)", _conv_mod(16, 32, 7), AVX512),
    ("threshold 0 turns it off", _conv_mod(16, 32, 7), dict(AVX2, conv1x1_matmul_fill=0)),
])
def test_must_not_fire(case, mod, table, caplog):
    with caplog.at_level(logging.INFO, logger="tvmfuse.fusion"):
        after = conv1x1_as_matmul(table)(mod)
    tvm.ir.assert_structural_equal(after, mod)
    if "fill" in case:  # a legal conv kept for profitability says why
        assert "stays a conv" in caplog.text


def test_profitability_model_is_the_tiles_fill():
    assert fill(7, 6) == pytest.approx(7 / 12) and fill(14, 6) == pytest.approx(14 / 18)
    assert fill(49, 4) == pytest.approx(49 / 52) and fill(56, 14) == 1.0
    assert fill(7, 8) == 7 / 8  # AVX-512 (2 x 8 tile): a 7-wide row fills most of it


@pytest.mark.parametrize("c, o, h, stride", [(64, 128, 7, 1), (32, 64, 14, 2), (24, 40, 13, 2), (8, 16, 19, 3),
                                           (16, 24, 8, 1), (8, 40, 3, 1)])
def test_rewritten_conv_with_bias_relu_is_one_matmul_kernel_and_matches_numpy(c, o, h, stride):
    """Inside a build: the conv (constant weight, folded bias, relu) becomes one cpu.Matmul kernel
    under tvmfuse, right against numpy; output widths 7, 8 and 3 fill under 70% of the conv tile
    on AVX2 (built for `haswell`, which every AVX2 host runs, so the test is the same on any host)."""
    rng = np.random.default_rng(c)
    w = (rng.standard_normal((o, c, 1, 1)) * 0.1).astype(F32)
    b = rng.standard_normal((1, o, 1, 1)).astype(F32)
    x_var = relax.Var("x", relax.TensorType((1, c, h, h), F32))
    bb = relax.BlockBuilder()
    with bb.function("main", [x_var]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x_var, relax.const(w), strides=stride))
            z = bb.emit_output(relax.op.nn.relu(relax.op.add(y, relax.const(b))))
        bb.emit_func_output(z)
    mod = bb.get()
    x = rng.standard_normal((1, c, h, h)).astype(F32)
    xs = x[:, :, ::stride, ::stride]
    ref = np.maximum(np.einsum("oc,nchw->nohw", w[:, :, 0, 0], xs) + b, 0)
    c_ = tvmfuse.build(mod, HASWELL, "tvmfuse")
    rules = sorted({str(f.attrs["tvmfuse.rule"]) for _g, f in c_.mod.functions_items()
                    if getattr(f, "attrs", None) is not None and "tvmfuse.rule" in f.attrs})
    assert c_.launches == 1 and rules == ["cpu.Matmul"], (c_.launches, rules)
    np.testing.assert_allclose(c_(x), ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(tvmfuse.build(mod, "llvm", "none")(x), ref, rtol=1e-4, atol=1e-4)


def test_cuda_builds_keep_the_conv():
    """The rewrite is an llvm schedule choice: CUDA's conv schedule sees the conv as before."""
    mod = _conv_mod(16, 32, 7)
    c_ = tvmfuse.build(mod, "cuda", "tvmfuse")
    assert "conv2d" in " ".join(gv.name_hint for gv, _f in c_.mod.functions_items())


def test_host_table_has_the_threshold():
    assert 0 < cpu_table(None)["conv1x1_matmul_fill"] <= 100
