import numpy as np
import pytest

from tvmfuse.zoo import workloads
from tvmfuse.errors import UnknownWorkloadError

ZOO = ["bias_relu_dropout", "conv_relu_bn_add", "softmax_chain", "softmax_decomposed", "layernorm_decomposed",
       "rmsnorm_residual", "mlp_block", "attention", "linear_regression_step", "multi_reduce"]


def test_zoo_lists_every_required_workload():
    assert set(ZOO) <= set(workloads.names())


@pytest.mark.parametrize("name", ZOO)
def test_inputs_are_deterministic_and_match_the_signature(name):
    w = workloads.get(name)
    a, b = w.inputs(), w.inputs()
    params = w.mod["main"].params
    assert len(a) == len(params)
    for x, y, p in zip(a, b, params):
        np.testing.assert_array_equal(x, y)
        assert list(x.shape) == [int(s) for s in p.ty.shape.values]


def test_bench_shapes_are_the_documented_ones():
    assert workloads.get("bias_relu_dropout", "bench").input_specs[0][1] == (4096, 1024)
    assert workloads.get("layernorm_decomposed", "bench").input_specs[0][1] == (4096, 768)
    assert workloads.get("conv_relu_bn_add", "bench").input_specs[0][1] == (1, 64, 56, 56)
    assert workloads.get("mlp_block", "bench").input_specs[0][1] == (512, 768)


def test_large_shapes_overflow_the_cache():
    """"large" is for the roofline: a memory-bound workload's minimal bytes must be over 4x a
    32 MiB last-level cache (else its bandwidth bound is no bound); compute-heavy ones stay as bench."""
    from tvmfuse.runtime import roofline

    assert set(workloads.memory_bound_names()) == {  # the facts the workloads carry
        "bias_relu_dropout", "softmax_chain", "softmax_decomposed", "layernorm_decomposed", "rmsnorm_residual",
        "multi_reduce", "linear_regression_step"}
    for name in workloads.names():
        large, bench = workloads.get(name, "large"), workloads.get(name, "bench")
        if roofline.flops(large) is None:
            assert roofline.minimal_bytes(large) > 4 * 32 * 2**20, name
        else:
            assert large.input_specs == bench.input_specs, name


def test_unknown_workload_lists_the_names():
    with pytest.raises(UnknownWorkloadError, match="softmax_chain"):
        workloads.get("no_such_model")


def test_unknown_size_is_named():
    with pytest.raises(UnknownWorkloadError, match="huge"):
        workloads.get("softmax_chain", "huge")


def test_one_workload_type_for_the_zoo_the_models_and_model_files():
    """The zoo, the real models and model files are one type (tvmfuse/zoo/workload.py): a model's is
    made by Workload.imported, with its inputs' specs and the FLOPs counted from its graph."""
    import tvmfuse
    from tvmfuse.runtime import roofline
    from tvmfuse.zoo.workload import Workload

    z = workloads.get("mlp_block")
    assert type(z) is Workload and z.zoo and not z.memory_bound
    assert type(tvmfuse.load("mlp_block")) is Workload
    m = Workload.imported("mlp", z.mod, z.inputs(), z.reference, size="small")
    assert not m.zoo and m.input_specs == z.input_specs
    assert m.flops == roofline.graph_flops(z.mod) > 0 and not m.memory_bound
    assert roofline.minimal_bytes(m) == roofline.minimal_bytes(z)
    x = m.inputs()
    x[0][...] = 0  # each call gets fresh copies of the fixed inputs
    np.testing.assert_array_equal(m.inputs()[0], z.inputs()[0])
    np.testing.assert_allclose(m.reference(*m.inputs()), z.reference(*z.inputs()))
    assert Workload.imported("no-ref", z.mod, z.inputs()).reference(*z.inputs()) is None
    mem = workloads.get("softmax_chain")
    assert Workload.imported("s", mem.mod, mem.inputs()).memory_bound and mem.memory_bound
