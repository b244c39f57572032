import numpy as np
import pytest

import tvmfuse
from tvmfuse.zoo import workloads
from tvmfuse.errors import InputError, TargetError

from conftest import assert_matches, built

ZOO = workloads.names()


@pytest.mark.parametrize("fusion", ["none", "tvm", "tvmfuse"])
@pytest.mark.parametrize("name", ZOO)
def test_zoo_matches_numpy(name, fusion):
    w = workloads.get(name)
    c = built(name, fusion)
    assert_matches(c(*w.inputs()), w.reference(*w.inputs()), w.rtol, w.atol)


# exact static launch counts (call_tir sites in main, less the reshapes lowering makes views: the
# unfused attention's 4 head splits and merges)
NONE = {"bias_relu_dropout": 3, "softmax_chain": 4, "softmax_decomposed": 5, "layernorm_decomposed": 9,
        "multi_reduce": 5, "attention": 9}
TVM = {"bias_relu_dropout": 1, "softmax_chain": 2, "softmax_decomposed": 4, "layernorm_decomposed": 3,
       "rmsnorm_residual": 3, "multi_reduce": 4, "mlp_block": 2, "attention": 7}


@pytest.mark.parametrize("name,n", sorted(NONE.items()))
def test_static_launches_unfused(name, n):
    assert built(name, "none").launches == n


@pytest.mark.parametrize("name,n", sorted(TVM.items()))
def test_static_launches_stock(name, n):
    assert built(name, "tvm").launches == n


@pytest.mark.parametrize("name", ["softmax_chain", "attention", "linear_regression_step"])
def test_dynamic_launches_equal_static_for_straight_line_graphs(name):
    c = built(name, "tvm")
    m = tvmfuse.measure(c, workloads.get(name).inputs(), repeat=2)
    assert m.dynamic_launches == c.launches


def test_build_rejects_unknown_target():
    with pytest.raises(TargetError, match="unknown target 'tpu'"):
        tvmfuse.build(workloads.get("softmax_chain").mod, "tpu")


def test_build_rejects_unknown_variant():
    with pytest.raises(ValueError, match="unknown fusion variant 'xla'"):
        tvmfuse.build(workloads.get("softmax_chain").mod, "llvm", "xla")


def test_wrong_input_shape_names_the_argument():
    c = built("softmax_chain", "tvm")
    x, y = workloads.get("softmax_chain").inputs()
    with pytest.raises(InputError, match=r"input 1 'y': expected shape \[64, 128\], got \[64, 127\]"):
        c(x, y[:, :127])


def test_wrong_input_dtype_names_the_argument():
    c = built("softmax_chain", "tvm")
    x, y = workloads.get("softmax_chain").inputs()
    with pytest.raises(InputError, match="input 0 'x': expected dtype float32, got float64"):
        c(x.astype("float64"), y)


def test_wrong_input_count():
    c = built("softmax_chain", "tvm")
    with pytest.raises(InputError, match="main takes 2 inputs"):
        c(workloads.get("softmax_chain").inputs()[0])


def test_llvm_target_uses_host_cpu():
    from tvmfuse.target import host_cpu, resolve

    t = resolve("llvm")
    assert str(t.attrs["mcpu"]) == host_cpu()
    assert int(t.attrs["num-cores"]) >= 1


def test_llvm_source_is_vectorized():
    src = built("bias_relu_dropout", "tvmfuse").source()
    assert "<16 x float>" in src or "<8 x float>" in src
