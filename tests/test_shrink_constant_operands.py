"""ShrinkConstantOperands (tvmfuse/passes/shrink_constant_operands.py): golden Before/Expected IR,
the cases where it must not fire, numerics before and after, and BERT's all-zero attention mask
gone from its fused attention kernel."""
import json

import numpy as np
import pytest
import tvm
from tvm import relax

from tvmfuse.passes.shrink_constant_operands import ShrinkConstantOperands
from conftest import built_model, real_model

X = (1, 2, 4, 4)


def _module(op, const, x_shape=X, const_first=False, dtype="float32"):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            c = relax.const(const, str(const.dtype))
            y = bb.emit(op(c, x) if const_first else op(x, c))
            out = bb.emit_output(relax.op.nn.relu(y) if dtype.startswith("float") else y)
        bb.emit_func_output(out)
    return bb.get()


def _identity_module(x_shape=X):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(x))
        bb.emit_func_output(out)
    return bb.get()


def _after(mod):
    return relax.transform.DeadCodeElimination()(ShrinkConstantOperands(mod))


def _run(mod, x):
    ex = tvm.compile(mod, target="llvm")
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


RNG = np.random.default_rng(0)
ROW = RNG.standard_normal((1, 1, 1, 4)).astype("float32")  # one padding mask for every query row


@pytest.mark.parametrize("op,value,first", [
    (relax.op.add, 0.0, False), (relax.op.add, 0.0, True), (relax.op.subtract, 0.0, False),
    (relax.op.multiply, 1.0, False), (relax.op.multiply, 1.0, True), (relax.op.divide, 1.0, False),
])
def test_an_identity_constant_is_dropped(op, value, first):
    before = _module(op, np.full((1, 1, 4, 4), value, "float32"), const_first=first)
    tvm.ir.assert_structural_equal(_after(before), _identity_module())


def test_a_row_invariant_mask_is_cut_to_one_row():
    before = _module(relax.op.add, np.broadcast_to(ROW, (1, 1, 4, 4)).copy())
    expected = _module(relax.op.add, ROW)
    tvm.ir.assert_structural_equal(_after(before), expected)
    x = RNG.standard_normal(X).astype("float32")
    np.testing.assert_array_equal(_run(_after(before), x), _run(before, x))


def test_every_uniform_axis_is_cut():
    per_channel = RNG.standard_normal((1, 2, 1, 1)).astype("float32")
    before = _module(relax.op.multiply, np.broadcast_to(per_channel, X).copy())
    tvm.ir.assert_structural_equal(_after(before), _module(relax.op.multiply, per_channel))


@pytest.mark.parametrize("before", [
    _module(relax.op.add, np.zeros((3, 1, 4, 4), "float32"), x_shape=(1, 1, 4, 4)),  # widens the result
    _module(relax.op.add, RNG.standard_normal((1, 1, 4, 4)).astype("float32")),  # no uniform axis
    _module(relax.op.add, np.zeros((1, 1, 4, 4), "int32"), dtype="int32"),  # not float
    _module(relax.op.add, RNG.standard_normal((1, 1, 1, 4)).astype("float32")),  # already as small as it gets
], ids=["widens", "varies", "int", "minimal"])
def test_must_not_fire(before):
    tvm.ir.assert_structural_equal(ShrinkConstantOperands(before), before)


@pytest.mark.parametrize("op,value", [(relax.op.subtract, 0.0), (relax.op.divide, 1.0)])
def test_zero_minus_x_and_one_over_x_stay_with_their_constant_cut(op, value):
    """0 - x and 1 / x are not x: the op stays; its uniform constant is cut to one element."""
    before = _module(op, np.full((1, 1, 4, 4), value, "float32"), const_first=True)
    tvm.ir.assert_structural_equal(_after(before), _module(op, np.full((1, 1, 1, 1), value, "float32"),
                                                           const_first=True))
    x = RNG.uniform(1, 2, X).astype("float32")
    np.testing.assert_array_equal(_run(_after(before), x), _run(before, x))


def test_two_non_constant_operands_are_left_alone():
    bb = relax.BlockBuilder()
    x, y = relax.Var("x", relax.TensorType(X, "float32")), relax.Var("y", relax.TensorType(X, "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(x, y))
        bb.emit_func_output(out)
    mod = bb.get()
    tvm.ir.assert_structural_equal(ShrinkConstantOperands(mod), mod)


def test_berts_all_zero_mask_leaves_its_attention_kernel():
    """bert-tiny called without an attention_mask: transformers' [1, 1, S, S] mask folds to zeros.
    The pass drops it, so the fused attention kernel has no mask step (no gather per score vector),
    and the model still matches PyTorch."""
    m = real_model("bert-tiny")
    c = built_model("bert-tiny", "tvmfuse")
    specs = [json.loads(str(f.attrs["tvmfuse.attention"])) for _, f in c.mod.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and "tvmfuse.attention" in f.attrs]
    assert specs and all([s[0] for s in spec["steps"]] == ["mul"] for spec in specs), specs
    inputs = m.inputs()
    np.testing.assert_allclose(c(*inputs), m.reference(*inputs), rtol=m.rtol, atol=m.atol)
