"""Frontends on real models: import (torch.export / ONNX), then every fusion variant against the
framework's own outputs (PyTorch eager, onnxruntime); launches tvmfuse <= tvm; bad input errors."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import tvmfuse  # noqa: E402
from tvmfuse.zoo import models  # noqa: E402
from tvmfuse.errors import FrontendError, InputError  # noqa: E402
from conftest import built_model, real_model  # noqa: E402

MODELS = [m for m in models.names() if m not in models.FULL_SIZE]  # full size: test_full_models.py
VARIANTS = ("none", "tvm", "tvmfuse")

def loaded(name):
    return real_model(name)


def built(name, variant):
    return built_model(name, variant)


def _case(name, variant):
    return pytest.param(name, variant, id=f"{name}-{variant}")


@pytest.mark.parametrize("name", MODELS)
def test_real_model_imports_with_static_inputs(name):
    w = loaded(name)
    params = w.mod["main"].params
    assert len(params) == len(w.inputs()) == 1
    assert [int(d) for d in params[0].ty.shape.values] == list(w.inputs()[0].shape)
    assert w.inputs()[0].dtype == (np.float32 if name == "resnet-tiny" else np.int64)


@pytest.mark.parametrize("name,variant", [_case(n, v) for n in MODELS for v in VARIANTS])
def test_real_model_matches_framework(name, variant):
    w = loaded(name)
    out = built(name, variant)(*w.inputs())
    np.testing.assert_allclose(out, w.reference(*w.inputs()), rtol=w.rtol, atol=w.atol)


@pytest.mark.parametrize("name", MODELS)
def test_real_model_launches_tvmfuse_le_tvm(name):
    none, tvm_, ours = (built(name, v).launches for v in VARIANTS)
    assert ours <= tvm_ < none


def test_onnx_model_reference_is_onnxruntime_and_agrees_with_torch():
    w = loaded("bert-tiny-onnx")
    ids = w.inputs()[0]
    np.testing.assert_allclose(w.reference(ids), w.eager(ids).numpy(), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- from_torch options
class _Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 32)
        self.ln = torch.nn.LayerNorm(32)

    def forward(self, x):
        return self.ln(torch.nn.functional.gelu(self.fc(x)))


def _small():
    torch.manual_seed(0)
    return _Small().eval(), torch.randn(4, 16)


def test_from_torch_params_as_inputs():
    m, x = _small()
    mod, params = tvmfuse.from_torch(m, (x,), params="inputs")
    assert len(mod["main"].params) == 1 + len(params) == 5
    c = tvmfuse.build(mod, "llvm", "tvmfuse")
    np.testing.assert_allclose(c(x.numpy(), *params), m(x).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_from_torch_constants_default_and_wrong_shape_at_run_time():
    m, x = _small()
    mod = tvmfuse.from_torch(m, x)  # a lone tensor is accepted as the inputs tuple
    c = tvmfuse.build(mod, "llvm", "tvmfuse")
    np.testing.assert_allclose(c(x.numpy()), m(x).detach().numpy(), rtol=1e-4, atol=1e-5)
    with pytest.raises(InputError, match=r"expected shape \[4, 16\], got \[4, 15\]"):
        c(np.zeros((4, 15), "float32"))


def tvmfuse_tirx():
    import tvm

    return tvm.tirx


def test_from_torch_dynamic_batch():
    from torch.export import Dim

    m, x = _small()
    mod = tvmfuse.from_torch(m, (x,), dynamic_shapes={"x": {0: Dim("batch", min=1, max=64)}})
    batch = mod["main"].params[0].ty.shape.values[0]
    assert not isinstance(batch, tvmfuse_tirx().IntImm), batch  # symbolic
    c = tvmfuse.build(mod, "llvm", "tvm")
    x3 = torch.randn(3, 16)
    np.testing.assert_allclose(c(x3.numpy()), m(x3).detach().numpy(), rtol=1e-4, atol=1e-5)


class _Kth(torch.nn.Module):
    def forward(self, x):
        return torch.kthvalue(x, 2, dim=-1).values


class _WithUnsupported(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.pick = _Kth()

    def forward(self, x):
        return self.pick(self.proj(x))


def test_from_torch_unsupported_op_names_op_and_module_path():
    with pytest.raises(FrontendError, match=r"'kthvalue\.default' in pick \(_Kth\)"):
        tvmfuse.from_torch(_WithUnsupported(), (torch.randn(2, 8),))


def test_from_torch_example_inputs_of_the_wrong_shape():
    with pytest.raises(FrontendError, match=r"example inputs \(\[2, 5\]:float32\).*same reduction dim"):
        tvmfuse.from_torch(_WithUnsupported(), (torch.randn(2, 5),))


def test_from_torch_rejects_non_modules():
    with pytest.raises(FrontendError, match="expects a torch.nn.Module"):
        tvmfuse.from_torch(lambda x: x, (torch.randn(2),))


# ---------------------------------------------------------------- from_onnx
def _onnx_mlp(batch=3):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((16, 8)).astype("float32"), rng.standard_normal(8).astype("float32")
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 8])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_from_onnx_file_matches_onnxruntime(tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(_onnx_mlp(), str(path))
    mod = tvmfuse.from_onnx(path)
    x = np.random.default_rng(1).standard_normal((3, 16)).astype("float32")
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    launches = {}
    for v in VARIANTS:
        c = tvmfuse.build(mod, "llvm", v)
        np.testing.assert_allclose(c(x), ref, rtol=1e-5, atol=1e-6)
        launches[v] = c.launches
    assert launches["tvmfuse"] <= launches["tvm"]


def test_from_onnx_keeps_a_named_symbolic_batch():
    """dim_param "N" not fixed by shapes= stays symbolic: one build runs every batch, fused like
    the static import, and matches ONNX Runtime."""
    model = _onnx_mlp(batch="N")
    mod = tvmfuse.from_onnx(model)
    assert str(mod["main"].params[0].ty.shape.values[0]) == "N"
    c = tvmfuse.build(mod, "llvm", "tvmfuse")
    assert c.launches == tvmfuse.build(tvmfuse.from_onnx(model, shapes={"x": [4, 16]}), "llvm", "tvmfuse").launches
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (1, 4, 9):
        x = np.random.default_rng(n).standard_normal((n, 16)).astype("float32")
        np.testing.assert_allclose(c(x), sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_from_onnx_shapes_fix_symbolic_dims_and_unnamed_ones_need_them():
    model = _onnx_mlp(batch="N")
    model.graph.input[0].type.tensor_type.shape.dim[0].ClearField("dim_param")  # unknown, no name
    with pytest.raises(FrontendError, match=r"input 'x' has unknown, unnamed dimensions.*shapes=\{'x'"):
        tvmfuse.from_onnx(model)
    model = _onnx_mlp(batch="N")
    mod = tvmfuse.from_onnx(model, shapes={"x": [5, 16]})
    assert [int(d) for d in mod["main"].params[0].ty.shape.values] == [5, 16]
    with pytest.raises(FrontendError, match=r"\['y'\], which are not inputs"):
        tvmfuse.from_onnx(model, shapes={"y": [5, 8]})


def test_from_onnx_missing_file(tmp_path):
    with pytest.raises(FrontendError, match=r"no such file '.*nope\.onnx'"):
        tvmfuse.from_onnx(tmp_path / "nope.onnx")


def test_from_onnx_corrupt_file(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07\x12\x05this is not a protobuf \xff\xfe" * 8)
    with pytest.raises(FrontendError, match="not a valid ONNX model|empty graph|fails onnx.checker"):
        tvmfuse.from_onnx(bad)
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(_onnx_mlp().SerializeToString()[:-40])
    with pytest.raises(FrontendError, match="bad.onnx|truncated.onnx"):
        tvmfuse.from_onnx(truncated)


def test_from_onnx_unsupported_op_is_named():
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Celu", ["x"], ["y"], name="act0")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(FrontendError, match=r"does not support 'Celu' \(nodes act0\)"):
        tvmfuse.from_onnx(model)
