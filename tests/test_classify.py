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
