"""The custom fusion passes: plans, golden IR, must-not-fire cases, bytes, numerics."""
import logging

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax import op as R

import tvmfuse
from tvmfuse.zoo import workloads
from tvmfuse.relax_utils import call_tir_sites
from tvmfuse.runtime.metrics import bytes_moved

from conftest import assert_matches, built

ONE_KERNEL = ["softmax_decomposed", "layernorm_decomposed", "rmsnorm_residual", "multi_reduce", "softmax_chain"]
STRICTLY_FEWER = ONE_KERNEL + ["attention"]


@pytest.mark.parametrize("name", workloads.names())
def test_launches_never_exceed_stock(name):
    assert built(name, "tvmfuse").launches <= built(name, "tvm").launches


@pytest.mark.parametrize("name", STRICTLY_FEWER)
def test_strictly_fewer_launches_than_stock(name):
    assert built(name, "tvmfuse").launches < built(name, "tvm").launches


@pytest.mark.parametrize("name", ONE_KERNEL)
def test_row_reduction_chains_are_one_kernel(name):
    assert built(name, "tvmfuse").launches == 1


def test_softmax_moves_2n_elements():
    w = workloads.get("softmax_decomposed")
    n = int(np.prod(w.input_specs[0][1]))
    assert bytes_moved(built("softmax_decomposed", "tvmfuse").mod)[0] == 2 * n * 4


def test_layernorm_moves_2n_plus_parameters():
    w = workloads.get("layernorm_decomposed")
    (rows, cols) = w.input_specs[0][1]
    assert bytes_moved(built("layernorm_decomposed", "tvmfuse").mod)[0] == 4 * (2 * rows * cols + 2 * cols)


def test_multi_reduce_reads_its_input_once():
    nbytes, reads, writes = bytes_moved(built("multi_reduce", "tvmfuse").mod)
    n = int(np.prod(workloads.get("multi_reduce").input_specs[0][1]))
    assert (reads, writes) == (1, 3) and nbytes == 4 * n + 3 * 4


def _mod(specs, body):
    bb = relax.BlockBuilder()
    params = [relax.Var(n, relax.TensorType(s, "float32")) for n, s in specs]
    with bb.function("main", params):
        with bb.dataflow():
            out = body(bb, *params)
            out = bb.emit_output(relax.Tuple(out) if isinstance(out, list) else out)
        bb.emit_func_output(out)
    return bb.get()


def _callees(mod):
    return [gv.name_hint for _, gv, _, _ in call_tir_sites(mod["main"])]


def test_golden_double_softmax_is_one_primfunc_with_its_own_stages():
    mod = _mod([("x", (8, 16))], lambda bb, x: bb.emit(R.nn.softmax(bb.emit(R.nn.softmax(x)))))
    fused = tvmfuse.fuse(mod)
    assert _callees(fused) == ["fused_softmax"]
    pf = fused["fused_softmax"]
    assert len(pf.params) == 2  # one input, one output: the intermediate softmax stays in-kernel
    sch = tvm.s_tir.Schedule(pf)
    blocks = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert sum(b.startswith("T_softmax_maxelem") for b in blocks) == 2  # each softmax keeps its reductions
    xn = np.random.default_rng(0).standard_normal((8, 16)).astype("float32")
    s = lambda a: np.exp(a - a.max(-1, keepdims=True)) / np.exp(a - a.max(-1, keepdims=True)).sum(-1, keepdims=True)
    assert_matches(tvmfuse.build(mod, "llvm", "tvmfuse")(xn), s(s(xn)), 1e-5, 1e-6)
    assert bytes_moved(tvmfuse.prepare(mod, "llvm", "tvmfuse"))[0] == 2 * 8 * 16 * 4


def test_golden_transpose_into_sum():
    mod = _mod([("x", (8, 16))], lambda bb, x: bb.emit(R.sum(bb.emit(R.permute_dims(x, [1, 0])), axis=[1])))
    fused = tvmfuse.fuse(mod)
    assert _callees(fused) == ["fused_permute_dims_sum"]
    xn = np.random.default_rng(1).standard_normal((8, 16)).astype("float32")
    assert_matches(tvmfuse.build(mod, "llvm", "tvmfuse")(xn), xn.T.sum(1), 1e-5, 1e-5)


def test_must_not_fire_reductions_over_different_axes(caplog):
    def body(bb, x):
        return [bb.emit(R.sum(x, axis=[0])), bb.emit(R.sum(x, axis=[1]))]

    mod = _mod([("x", (8, 16))], body)
    with caplog.at_level(logging.INFO, logger="tvmfuse.fusion"):
        fused = tvmfuse.fuse(mod)
    assert len(_callees(fused)) == 0  # both stay single ops (legalized later, one kernel each)
    assert "reduction_space" in caplog.text or "different spaces" in caplog.text
    assert "different spaces" in tvmfuse.explain(mod)


def test_must_not_fire_two_matmuls():
    def body(bb, x, w1, w2):
        return bb.emit(R.matmul(bb.emit(R.matmul(x, w1)), w2))

    mod = _mod([("x", (4, 8)), ("w1", (8, 8)), ("w2", (8, 8))], body)
    assert "two compute-heavy ops" in tvmfuse.explain(mod)
    assert tvmfuse.build(mod, "llvm", "tvmfuse").launches == 2


def test_must_not_fire_elementwise_prologue_into_matmul_unless_recompute_allowed():
    def body(bb, x, w):
        return bb.emit(R.matmul(bb.emit(R.exp(x)), w))

    mod = _mod([("x", (4, 8)), ("w", (8, 8))], body)
    assert "recomputed" in tvmfuse.explain(mod)
    assert tvmfuse.build(mod, "llvm", "tvmfuse").launches == 2
    assert tvmfuse.build(mod, "llvm", "tvmfuse", allow_recompute=True).launches == 1


def test_knobs_switch_rules_off():
    mod = workloads.get("softmax_decomposed").mod
    assert tvmfuse.build(mod, "llvm", "tvmfuse", stitch_reductions=False).launches > 1
    mr = workloads.get("multi_reduce").mod
    assert tvmfuse.build(mr, "llvm", "tvmfuse", sibling=False).launches > 1
    assert tvmfuse.build(workloads.get("layernorm_decomposed").mod, "llvm", "tvmfuse", max_group_size=3).launches > 1
    with pytest.raises(TypeError, match="unknown fusion knob"):
        tvmfuse.fuse(mod, fuse_everything=True)


def test_opaque_op_stays_unfused_and_the_build_succeeds(caplog):
    def body(bb, x):
        y = bb.emit(R.exp(x))
        z = bb.emit(relax.call_dps_packed("ext_kernel", [y], out_ty=relax.TensorType((4, 4), "float32")))
        return bb.emit(R.multiply(z, x))

    mod = _mod([("x", (4, 4))], body)
    with caplog.at_level(logging.INFO, logger="tvmfuse.fusion"):
        fused = tvmfuse.fuse(mod)
    assert "opaque" in caplog.text
    assert "call_dps_packed" in fused["main"].script()  # the opaque op is kept, unfused
    prepared = tvmfuse.prepare(mod, "llvm", "tvmfuse")  # and the build pipeline still succeeds
    assert len(list(call_tir_sites(prepared["main"]))) == 2  # exp and multiply, one kernel each


def test_explain_names_every_group_and_refused_edge():
    for name in workloads.names():
        text = tvmfuse.explain(workloads.get(name).mod)
        n_groups = built(name, "tvmfuse").launches
        assert text.count("  group ") == n_groups, text
    text = tvmfuse.explain(workloads.get("attention").mod, attention=False)  # the path without flash attention
    assert "refused edge" in text and "needs the whole output of the anchor" in text


@pytest.mark.parametrize("name", workloads.names())
def test_fused_matches_unfused(name):
    w = workloads.get(name)
    assert_matches(built(name, "tvmfuse")(*w.inputs()), built(name, "none")(*w.inputs()), w.rtol, w.atol)


def test_split_inside_a_fused_group():
    """topi.split returns a tvm_ffi.Array; te_compose must unpack it (GPT-2's q/k/v split)."""
    import numpy as np
    from tvm import relax

    import tvmfuse

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 192), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = bb.emit(relax.op.split(x, [64, 128], axis=2))
            a, b, c = (bb.emit(relax.TupleGetItem(parts, i)) for i in range(3))
            out = bb.emit_output(relax.op.add(bb.emit(relax.op.multiply(a, b)), c))
        bb.emit_func_output(out)
    xv = np.random.default_rng(0).standard_normal((1, 16, 192)).astype("float32")
    c_ = tvmfuse.build(bb.get(), "llvm", "tvmfuse")
    np.testing.assert_allclose(c_(xv), xv[..., :64] * xv[..., 64:128] + xv[..., 128:], rtol=1e-5, atol=1e-6)
    assert c_.launches == 1


def test_bias_add_through_a_reshape_is_not_recomputed_inside_a_matmul():
    """add -> reshape -> permute -> matmul: the add would run once per reduction step (the layout
    ops between only remap indices), so profitability refuses it with its reason."""
    import logging

    from tvm import relax

    import tvmfuse

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 32), "float32"))
    b = relax.Var("b", relax.TensorType((32,), "float32"))
    w = relax.Var("w", relax.TensorType((2, 16, 8), "float32"))
    with bb.function("main", [x, b, w]):
        with bb.dataflow():
            a = bb.emit(relax.op.add(x, b))
            r = bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(a, (16, 2, 16))), [1, 0, 2]))
            out = bb.emit_output(relax.op.matmul(r, w))
        bb.emit_func_output(out)
    text = tvmfuse.explain(bb.get())
    assert "would be recomputed inside compute-heavy" in text
    groups = [line for line in text.splitlines() if line.strip().startswith("group")]
    assert not any("add" in g and "matmul" in g for g in groups), text
