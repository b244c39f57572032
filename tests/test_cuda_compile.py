"""CUDA builds compile here (nvcc/driver not needed); kernels are counted from the generated source."""
import re
import shutil

import pytest

from tvmfuse.zoo import workloads

from conftest import built

ROW_CHAINS = ("softmax_decomposed", "layernorm_decomposed", "rmsnorm_residual", "softmax_chain", "multi_reduce")

# kernels counted from the CUDA source; every row-reduction chain is ONE kernel (cuda.RowReduction)
EXPECTED = {
    **{(name, "tvmfuse"): 1 for name in ROW_CHAINS},
    ("softmax_chain", "none"): 4, ("softmax_chain", "tvm"): 2,
    ("softmax_decomposed", "tvm"): 4, ("rmsnorm_residual", "tvm"): 3, ("multi_reduce", "tvm"): 4,
    ("conv_relu_bn_add", "tvmfuse"): 1, ("attention", "tvm"): 7, ("attention", "tvmfuse"): 1,
}
_SIGNATURE = re.compile(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(([^;{]*)\)\s*\{")


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


@pytest.mark.parametrize("size", ["small", "bench"])
@pytest.mark.parametrize("name", workloads.names())
def test_cuda_kernels_take_only_buffers(name, size):
    """Static shapes: every loop of a kernel is bound or inside it. A scalar kernel parameter is a
    loop the schedule left outside the kernel (the launch would cover only one iteration of it)."""
    c = built(name, "tvmfuse", target="cuda", size=size)
    for kernel, params in _SIGNATURE.findall(c.source()):
        scalars = [p.strip() for p in params.split(",") if "*" not in p]
        assert scalars == [], f"{kernel} takes scalar parameters {scalars}"


@pytest.mark.parametrize("name", ROW_CHAINS)
def test_row_chain_is_one_block_per_row_with_cross_thread_reduction(name):
    src = built(name, "tvmfuse", target="cuda", size="bench").source()
    assert "threadIdx.x" in src
    assert ("blockIdx.x" in src) == (name != "multi_reduce")  # full reductions: one thread block
    assert "__shfl_down_sync" in src  # warp-shuffle reduction, then shared memory across warps


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("name", ROW_CHAINS)
def test_row_chain_cuda_source_compiles_to_ptx(name):
    from tvm.support import nvcc

    c = built(name, "tvmfuse", target="cuda")
    with c.target:
        ptx = nvcc.compile_cuda(c.source(), target_format="ptx", arch="sm_90", compiler="nvcc")
    assert b".target sm_90" in bytes(ptx)


@pytest.mark.parametrize("name", workloads.names())
def test_every_tvmfuse_group_is_one_cuda_kernel(name):
    """No default CUDA rule splits a tvmfuse group: one __global__ kernel per call site."""
    c = built(name, "tvmfuse", target="cuda", size="bench")
    assert c.launches == len(c.call_sites()), c.kernels_per_func()


_BOOL_PARAM = re.compile(r"bool\* __restrict__ (\w+)")


@pytest.mark.parametrize("fusion,knobs", [("tvm", {}), ("tvmfuse", {"attention": False}), ("tvmfuse", {})])
def test_no_vector_loads_of_a_bool_mask(fusion, knobs):
    """TVM's CUDA codegen prints a 2-lane bool load as `*(ushort2*)`, 4 bytes for 2 bools (wrong
    masks on an H200: relative errors 1.2-1.3, and an illegal address at 2048 tokens);
    schedules/cuda.scalar_bool_loads keeps bool loads scalar in every kernel."""
    import tvmfuse

    w = workloads.attention_workload(1, 128, 12, 64, mask="causal")
    src = tvmfuse.build(w.mod, "cuda", fusion, **knobs).source()
    params = set(_BOOL_PARAM.findall(src))
    assert params, "the causal mask is a bool parameter of some kernel"
    for p in params:
        assert not re.search(r"\*\(\w+\*\)\(" + p + r"\b", src), f"a vector load of bool {p}"


@pytest.mark.parametrize("fusion", ["none", "tvm", "tvmfuse"])
@pytest.mark.parametrize("name", workloads.names())
def test_no_stage_is_left_on_the_host(name, fusion):
    """Every block of every CUDA kernel function sits under a thread binding: a stage outside one
    runs in the host code on device pointers (a segfault on an H200: the padding of tvmfuse's
    conv + relu + batch-norm + add group, which dlight's Matmul scheduled around)."""
    import tvm

    from schedules.cuda.rules import stray_blocks

    c = built(name, fusion, target="cuda", size="bench" if name == "conv_relu_bn_add" else "small")
    for gv, f in c.mod.functions_items():
        if isinstance(f, tvm.tirx.PrimFunc):
            assert stray_blocks(f) == [], gv.name_hint
