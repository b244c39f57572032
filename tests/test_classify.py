import tvmfuse
from tvmfuse.zoo import workloads


def classes(name):
    return {o.var: (o.op, o.cls) for o in tvmfuse.classify(workloads.get(name).mod)}


def test_softmax_is_a_reduction_not_out_elementwise():
    c = tvmfuse.classify(workloads.get("softmax_chain").mod)
    soft = [o for o in c if o.op == "relax.nn.softmax"][0]
    assert soft.cls == "reduction"
    assert soft.op_pattern == 4 and "kOutEWiseFusable" in soft.reason


def test_bias_add_is_broadcast_and_relu_elementwise():
    ops = {op: cls for op, cls in classes("bias_relu_dropout").values()}
    assert ops["relax.add"] == "broadcast"
    assert ops["relax.nn.relu"] == "elementwise"


def test_layout_ops_are_injective_and_matmul_is_compute_heavy():
    ops = {}
    for op, cls in classes("attention").values():
        ops.setdefault(op, set()).add(cls)
    assert ops["relax.reshape"] == {"injective"}
    assert ops["relax.permute_dims"] == {"injective"}
    assert ops["relax.matmul"] == {"compute-heavy"}


def test_conv_and_reductions():
    ops = {op: cls for op, cls in classes("conv_relu_bn_add").values()}
    assert ops["relax.nn.conv2d"] == "compute-heavy"
    red = {op: cls for op, cls in classes("multi_reduce").values()}
    assert red["relax.max"] == red["relax.mean"] == "reduction"


def test_every_zoo_op_is_classified_and_none_is_opaque():
    for name in workloads.names():
        c = tvmfuse.classify(workloads.get(name).mod)
        assert len(c) > 0
        assert c.counts()["opaque"] == 0, str(c)


def test_table_prints_every_op():
    c = tvmfuse.classify(workloads.get("layernorm_decomposed").mod)
    text = str(c)
    assert text.count("\n") == len(c)
    assert "reduction" in text and "broadcast" in text


def test_external_call_is_opaque_with_reason():
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.call_dps_packed("my_ext_kernel", [x], out_ty=relax.TensorType((4,), "float32")))
            out = bb.emit_output(relax.op.exp(y))
        bb.emit_func_output(out)
    c = {o.op: o for o in tvmfuse.classify(bb.get())}
    assert c["relax.call_dps_packed"].cls == "opaque"
    assert "external" in c["relax.call_dps_packed"].reason
    assert c["relax.exp"].cls == "elementwise"


def _token_types(matmul=False):
    """BERT's token-type ids as AOTAutograd's forward has them: a buffer broadcast to the batch,
    gathered along the sequence (gather_elements), then an embedding lookup (take) and an add;
    `matmul`: the embedded rows go through a matmul instead of the add."""
    from tvm import relax

    bb = relax.BlockBuilder()
    d = relax.Var("d", relax.TensorType((1, 16), "int64"))
    i = relax.Var("i", relax.TensorType((2, 8), "int64"))
    e = relax.Var("e", relax.TensorType((2, 4), "float32"))
    w = relax.Var("w", relax.TensorType((4, 4), "float32"))
    with bb.function("main", [d, i, e, w]):
        with bb.dataflow():
            g = bb.emit(relax.op.gather_elements(relax.op.broadcast_to(d, (2, 16)), i, axis=1))
            t = bb.emit(relax.op.take(e, relax.op.reshape(g, (16,)), axis=0))
            out = relax.op.matmul(t, w) if matmul else relax.op.add(t, relax.const(1.0, "float32"))
            o = bb.emit_output(out)
        bb.emit_func_output(o)
    return bb.get()


def test_gather_elements_is_a_gather_and_fuses_with_its_lookup():
    import numpy as np

    mod = _token_types()
    (gather,) = [o for o in tvmfuse.classify(mod) if o.op == "relax.gather_elements"]
    assert gather.cls == "injective" and "gather" in gather.reason
    built = tvmfuse.build(mod, "llvm", "tvmfuse")
    assert built.launches == 1
    rng = np.random.default_rng(0)
    d, i = rng.integers(0, 2, (1, 16)), rng.integers(0, 16, (2, 8))
    e, w = rng.standard_normal((2, 4)).astype("float32"), np.eye(4, dtype="float32")
    want = e[np.take_along_axis(np.broadcast_to(d, (2, 16)), i, 1).reshape(-1)] + 1
    np.testing.assert_allclose(np.asarray(built(d, i, e, w)), want, rtol=1e-6)


def test_must_not_fire_a_gather_elements_in_front_of_a_matmul():
    """Like take: the matmul rule packs strided operands, not gathered ones (profitability.GATHERS)."""
    built = tvmfuse.build(_token_types(matmul=True), "llvm", "tvmfuse")
    assert not any("gather_elements" in n and "matmul" in n for n in built.call_sites())
