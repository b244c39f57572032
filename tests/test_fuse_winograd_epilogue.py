"""FuseWinogradEpilogue (tvmfuse/passes/fuse_winograd_epilogue.py): the output transform, the layout
change back to NCHW and the elementwise chain after it as one kernel; where the chain stops; the
graph before and after the pass; numerics against PyTorch."""
import numpy as np
import pytest
import tvm
from tvm import relax

import tvmfuse
from conftest import conv_module, kernel_rules
from tvmfuse.passes.fuse_winograd_epilogue import FuseWinogradEpilogue
from tvmfuse.pipeline import fold_constants

torch = pytest.importorskip("torch")


def _data(c, o, h, w, seed=0):
    rng = np.random.default_rng(seed)
    wv = (rng.standard_normal((o, c, 3, 3)) * 0.2).astype("float32")
    bv = rng.standard_normal((1, o, 1, 1)).astype("float32")
    xv = rng.standard_normal((1, c, h, w)).astype("float32")
    return wv, bv, xv


def _conv(xv, wv):
    return torch.nn.functional.conv2d(torch.from_numpy(xv).double(), torch.from_numpy(wv).double(), padding=1)


def _module(c, o, h, w, wv, bv, tail):
    """main(x) = tail(conv2d(x, W) + b, x) with W, b constants; `tail(y, x, emit)` returns the outputs."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, h, w), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(relax.op.nn.conv2d(x, relax.const(wv), padding=1), relax.const(bv)))
            out = bb.emit_output(tail(y, x, bb.emit))
        bb.emit_func_output(out)
    return bb.get()


def _calls(func):
    """The op (or called PrimFunc) of each binding of main's dataflow block, in order."""
    out = []
    for b in func.body.blocks[0].bindings:
        v = b.value
        if isinstance(v, relax.Call) and v.op.same_as(tvm.ir.Op.get("relax.call_tir")):
            out.append(v.args[0].name_hint)
        elif isinstance(v, relax.Call):
            out.append(v.op.name)
    return out


def test_the_pass_replaces_the_chain_by_one_call_and_keeps_the_rest():
    """Before: call_tir(winograd_output) -> reshape -> permute_dims -> add(bias) -> relu.
    After: one call_tir of a PrimFunc (rule winograd.OutputTransform) on (M, bias); the input
    transform and the matmul are untouched; the output Var is the same one."""
    wv, bv, _ = _data(16, 16, 8, 8)
    before = fold_constants(conv_module((1, 16, 8, 8), wv, bv))
    assert _calls(before["main"]) == ["winograd_input", "relax.matmul", "winograd_output", "relax.reshape",
                                      "relax.permute_dims", "relax.add", "relax.nn.relu"]
    after = FuseWinogradEpilogue(before)
    calls = _calls(after["main"])
    assert calls == ["winograd_input", "relax.matmul", "fused_winograd_output_add_relu"], calls
    last = after["main"].body.blocks[0].bindings[-1]
    assert last.var.same_as(before["main"].body.blocks[0].bindings[-1].var)
    m_var = after["main"].body.blocks[0].bindings[1].var
    args = list(last.value.args[1].fields)
    assert args[0].same_as(m_var) and isinstance(args[1], tvm.ir.expr.Constant) and args[1].ty.shape[1] == 16
    func = after[last.value.args[0]]
    assert str(func.attrs["tvmfuse.rule"]) == "winograd.OutputTransform" and func.attrs["tirx.is_scheduled"]
    assert "winograd_output" not in [gv.name_hint for gv in after.get_global_vars()]  # the old one is dead


@pytest.mark.parametrize("c,o,h,w", [(16, 16, 8, 8), (32, 48, 13, 13), (8, 24, 9, 10), (16, 32, 28, 28)])
def test_one_kernel_after_the_matmul_and_it_matches_pytorch(c, o, h, w):
    """tvmfuse: input transform, matmul, output transform with bias and ReLU (3 kernels); stock
    fusion keeps the layout change and the epilogue a fourth. Ragged maps (13x13, 9x10) slice."""
    wv, bv, xv = _data(c, o, h, w)
    ref = torch.relu(_conv(xv, wv) + torch.from_numpy(bv).double()).numpy()
    fused = tvmfuse.build(conv_module((1, c, h, w), wv, bv), "llvm", "tvmfuse")
    stock = tvmfuse.build(conv_module((1, c, h, w), wv, bv), "llvm", "tvm")
    assert sorted(kernel_rules(fused).values()) == ["cpu.Matmul", "winograd.InputTransform",
                                                    "winograd.OutputTransform"], kernel_rules(fused)
    assert fused.launches == 3 and stock.launches == 4
    np.testing.assert_allclose(fused(xv), ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(stock(xv), ref, rtol=1e-4, atol=1e-4)


def test_a_residual_add_joins_the_chain():
    """relu(conv + b + x): both adds and the ReLU in the output kernel, x read as an operand."""
    wv, bv, xv = _data(16, 16, 12, 12)
    mod = _module(16, 16, 12, 12, wv, bv, lambda y, x, emit: relax.op.nn.relu(emit(relax.op.add(y, x))))
    compiled = tvmfuse.build(mod, "llvm", "tvmfuse")
    assert "fused_winograd_output_add_add_relu" in kernel_rules(compiled) and compiled.launches == 3
    ref = torch.relu(_conv(xv, wv) + torch.from_numpy(bv).double() + torch.from_numpy(xv).double()).numpy()
    np.testing.assert_allclose(compiled(xv), ref, rtol=1e-4, atol=1e-4)


def test_the_chain_stops_at_a_value_used_twice():
    """(relu(y), y) with y = conv + b: y is an output too, so the chain ends at the bias add and the
    ReLU is a kernel of its own; both outputs are right."""
    wv, bv, xv = _data(16, 16, 10, 10)
    mod = _module(16, 16, 10, 10, wv, bv, lambda y, x, emit: relax.Tuple([emit(relax.op.nn.relu(y)), y]))
    compiled = tvmfuse.build(mod, "llvm", "tvmfuse")
    assert "fused_winograd_output_add" in kernel_rules(compiled) and compiled.launches == 4
    y = (_conv(xv, wv) + torch.from_numpy(bv).double()).numpy()
    out = compiled(xv)
    np.testing.assert_allclose(out[0], np.maximum(y, 0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out[1], y, rtol=1e-4, atol=1e-4)


def test_a_reduction_after_the_conv_stays_out():
    """mean over the map is a reduction: the chain takes the bias add only; the mean is its own kernel."""
    wv, bv, xv = _data(16, 16, 10, 10)
    mod = _module(16, 16, 10, 10, wv, bv, lambda y, x, emit: relax.op.mean(y, axis=[2, 3]))
    compiled = tvmfuse.build(mod, "llvm", "tvmfuse")
    assert "fused_winograd_output_add" in kernel_rules(compiled)
    ref = (_conv(xv, wv) + torch.from_numpy(bv).double()).mean(dim=(2, 3)).numpy()
    np.testing.assert_allclose(compiled(xv), ref, rtol=1e-4, atol=1e-4)


def test_other_variants_and_other_call_tirs_are_left_alone():
    """The pass runs in the tvmfuse variant only; on a module without a Winograd output it changes
    nothing (the same object back)."""
    wv, bv, _ = _data(16, 16, 8, 8)
    mod = conv_module((1, 16, 8, 8), wv, bv)
    assert FuseWinogradEpilogue(mod).same_as(mod)
    for fusion in ("none", "tvm"):
        rules = kernel_rules(tvmfuse.build(mod, "llvm", fusion))
        assert "winograd_output" in rules and not any(k.startswith("fused_winograd") for k in rules), rules


def _bn_module(c, h, w, wv, statistics_out=False):
    """main(x, gamma, beta, mean, var) = batch_norm(relu(conv2d(x, W)), ...)[0] + x, the statistics
    inputs (FoldBatchNorm cannot fold them); `statistics_out`: the new mean is an output as well."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, h, w), "float32"))
    stats = [relax.Var(n, relax.TensorType((c,), "float32")) for n in ("gamma", "beta", "mean", "var")]
    with bb.function("main", [x, *stats]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, relax.const(wv), padding=1))))
            bn = bb.emit(relax.op.nn.batch_norm(y, *stats, axis=1, epsilon=1e-5, training=False))
            out = bb.emit(relax.op.add(bb.emit(relax.TupleGetItem(bn, 0)), x))
            if statistics_out:
                out = relax.Tuple([out, bb.emit(relax.TupleGetItem(bn, 1))])
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get()


def _bn_reference(xv, wv, g, b, mu, var):
    y = torch.relu(_conv(xv, wv))
    sh = (1, -1, 1, 1)
    t = [torch.from_numpy(a).double().reshape(sh) for a in (g, b, mu, var)]
    return ((y - t[2]) / torch.sqrt(t[3] + 1e-5) * t[0] + t[1] + torch.from_numpy(xv).double()).numpy()


def test_a_batch_norm_of_input_statistics_joins_the_chain():
    """relu, batch_norm (with its TupleGetItem) and the residual add in the output kernel: 3 kernels;
    the graph after the pass calls the fused kernel on (M, x and the four statistics)."""
    c, h, w = 16, 12, 12
    wv, _, xv = _data(c, c, h, w, seed=5)
    rng = np.random.default_rng(6)
    g, b, mu = (rng.standard_normal(c).astype("float32") for _ in range(3))
    var = (np.abs(rng.standard_normal(c)) + 0.5).astype("float32")
    after = FuseWinogradEpilogue(fold_constants(_bn_module(c, h, w, wv)))
    assert _calls(after["main"]) == ["winograd_input", "relax.matmul",
                                     "fused_winograd_output_relu_batch_norm_add"], _calls(after["main"])
    compiled = tvmfuse.build(_bn_module(c, h, w, wv), "llvm", "tvmfuse")
    assert compiled.launches == 3, kernel_rules(compiled)
    np.testing.assert_allclose(compiled(xv, g, b, mu, var), _bn_reference(xv, wv, g, b, mu, var), rtol=1e-4, atol=1e-4)


def test_the_chain_stops_at_a_batch_norm_whose_statistics_are_read():
    """The batch_norm's second output is a function output: the chain ends at the ReLU and the
    batch_norm stays out of the output kernel; both outputs are right."""
    c, h, w = 16, 10, 10
    wv, _, xv = _data(c, c, h, w, seed=7)
    rng = np.random.default_rng(8)
    g, b, mu = (rng.standard_normal(c).astype("float32") for _ in range(3))
    var = (np.abs(rng.standard_normal(c)) + 0.5).astype("float32")
    after = FuseWinogradEpilogue(fold_constants(_bn_module(c, h, w, wv, statistics_out=True)))
    assert "fused_winograd_output_relu" in _calls(after["main"]) and "relax.nn.batch_norm" in _calls(after["main"])
    compiled = tvmfuse.build(_bn_module(c, h, w, wv, statistics_out=True), "llvm", "tvmfuse")
    out = compiled(xv, g, b, mu, var)
    np.testing.assert_allclose(out[0], _bn_reference(xv, wv, g, b, mu, var), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out[1], mu, rtol=1e-6)
