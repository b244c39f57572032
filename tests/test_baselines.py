"""The ONNX Runtime baselines compute what the zoo workloads compute (else a ratio means nothing)."""
import numpy as np
import pytest

from tvmfuse.bench import baselines
from tvmfuse.zoo import workloads

from conftest import assert_matches

pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("name", workloads.names())
def test_onnx_baseline_matches_the_reference(name):
    w = workloads.get(name)
    if baselines.onnx_model(w) is None:
        pytest.skip(f"{name} has no ONNX form (a training step)")
    x = w.inputs()
    assert_matches(baselines.OrtRunner(w, threads=1)(*x), w.reference(*x), 1e-3, 1e-4)


def test_workload_without_onnx_form_is_refused_clearly():
    with pytest.raises(ValueError, match="no ONNX form"):
        baselines.OrtRunner(workloads.get("linear_regression_step"), threads=1)


@pytest.mark.parametrize("name", workloads.names())
def test_torch_baseline_matches_the_reference(name):
    pytest.importorskip("torch")
    w = workloads.get(name)
    x = w.inputs()
    assert_matches(baselines.TorchRunner(w, threads=1)(*x), w.reference(*x), 1e-3, 1e-4)


def test_vanilla_tvm_is_tvm_alone_and_matches_the_reference():
    """The "vanilla tvm" peer: TVM's default pipeline (FuseOps) with dlight's CPU rules, no tvmfuse
    schedule rule on any kernel; dlight scheduled the softmax kernel, not the elementwise one."""
    import tvm

    from tvmfuse.bench.baselines_tvm import build_vanilla

    w = workloads.get("softmax_chain")
    c = build_vanilla(w.mod, "llvm")
    x = w.inputs()
    assert_matches(c(*x), w.reference(*x), w.rtol, w.atol)
    assert c.launches == 2 and c.rules() == ["-", "-"]  # stock FuseOps: add+relu, softmax+multiply
    scheduled = {gv.name_hint: f.attrs is not None and "tirx.is_scheduled" in f.attrs
                 for gv, f in c.mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert scheduled == {"fused_add_relu": False, "fused_softmax_multiply": True}


def test_freezing_peer_compiles_its_own_graph_and_matches():
    """torch.compile with freezing on a zoo workload already compiled in default mode: it compiles
    a graph of its own (Dynamo would hand back the default-mode one under a config scope alone)."""
    pytest.importorskip("torch")
    from torch._dynamo.utils import counters

    w = workloads.get("bias_relu_dropout")
    x = w.inputs()
    baselines.TorchRunner(w, threads=1, compiled=True)
    graphs = counters["stats"]["unique_graphs"]
    frozen = baselines.TorchRunner(w, threads=1, freezing=True)
    assert counters["stats"]["unique_graphs"] == graphs + 1
    assert_matches(frozen(*x), w.reference(*x), 1e-3, 1e-4)


def test_frozen_model_peer_bakes_the_weights_in():
    """Freezing is really on for a real model's peer: a weight changed after compiling reaches
    eager and default-mode torch.compile, not the frozen graph (its weights are constants)."""
    import types

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    x = np.random.default_rng(0).standard_normal((2, 8)).astype("float32")
    m = types.SimpleNamespace(name="tiny-linear", module=module, inputs=lambda: [x])
    default, _ = baselines.model_peer(m, "torch.compile", threads=1)
    frozen, _ = baselines.model_peer(m, "torch.compile+freezing", threads=1)
    before = frozen()
    np.testing.assert_allclose(before, default(), rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        module[0].bias.add_(1.0)
    np.testing.assert_allclose(frozen(), before)
    assert not np.allclose(default(), before)


def test_vanilla_tvm_for_cuda_is_tvms_default_gpu_pipeline():
    """On CUDA, vanilla TVM is relax.get_default_pipeline (dlight's GPU rules): every kernel on the
    GPU, none left on the host. Compile only: no GPU needed."""
    import shutil

    from tvmfuse.bench import gpu as bench_gpu
    from tvmfuse.bench.baselines_tvm import build_vanilla

    if not shutil.which("nvcc"):
        pytest.skip("nvcc is not on PATH")
    bench_gpu.use_nvcc_without_nvrtc()
    c = build_vanilla(workloads.get("softmax_chain").mod, "cuda")
    assert c.kernels_per_func() == {"fused_add_relu": 1, "fused_softmax_multiply": 1}
    assert c.launches == 2 and c.host_fallbacks() == []


def test_a_model_past_protobufs_limit_is_exported_to_a_file_with_external_weights():
    """BLOOM-560m's 2.2 GB do not fit one protobuf message: _export_onnx writes such a model to a
    file with its weights beside it, and both the importer and ONNX Runtime read it from there.
    Forced here (to_file=True) on a small module; the size rule is checked on its own."""
    import os

    import torch

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    x = np.random.default_rng(0).standard_normal((2, 8)).astype("float32")
    path, why = baselines._export_onnx(m, [x], to_file=True)
    assert isinstance(path, str) and os.path.exists(path), why
    model = baselines.load_exported(path)
    assert [i.name for i in model.graph.input] == ["input_0"]
    with torch.no_grad():
        ref = m(torch.from_numpy(x)).numpy()
    got = baselines._ort_session(path, 1).run(None, {"input_0": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    blob, _ = baselines._export_onnx(m, [x])  # small: in memory
    assert isinstance(blob, bytes)
