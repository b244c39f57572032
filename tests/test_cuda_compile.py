"""CUDA builds compile here (nvcc/driver not needed); kernels are counted from the generated source."""
import pytest

from tvmfuse import workloads

from conftest import built

# kernels counted from the CUDA source (dlight may split a fused group until tvmfuse's own CUDA
# schedules land; these are the counts today)
EXPECTED = {
    ("softmax_chain", "none"): 4, ("softmax_chain", "tvm"): 2, ("softmax_chain", "tvmfuse"): 1,
    ("softmax_decomposed", "tvm"): 4, ("softmax_decomposed", "tvmfuse"): 1,
    ("layernorm_decomposed", "tvmfuse"): 1, ("conv_relu_bn_add", "tvmfuse"): 1,
    ("attention", "tvm"): 7, ("attention", "tvmfuse"): 3,
}


@pytest.mark.parametrize("fusion", ["none", "tvm", "tvmfuse"])
@pytest.mark.parametrize("name", workloads.names())
def test_cuda_build_compiles_with_kernels_and_no_host_fallback(name, fusion):
    c = built(name, fusion, target="cuda")
    assert "__global__" in c.source()
    assert c.host_fallbacks() == []
    assert c.launches >= len(c.call_sites())
    if (name, fusion) in EXPECTED:
        assert c.launches == EXPECTED[(name, fusion)]


def test_cuda_without_device_says_so():
    from tvmfuse.errors import DeviceUnavailableError

    c = built("softmax_chain", "tvmfuse", target="cuda")
    with pytest.raises(DeviceUnavailableError, match="no cuda device"):
        c(*workloads.get("softmax_chain").inputs())
