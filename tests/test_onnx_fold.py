"""from_onnx on torch.onnx.export's shape arithmetic (tvmfuse/frontends/onnx_fold.py): TF-"same"
padding computed from the input's shape (MobileNetV1's) imports, builds and matches PyTorch."""
import numpy as np
import onnx
import pytest
import torch

import tvmfuse
from tvmfuse.bench.baselines import _export_onnx
from tvmfuse.frontends import onnx_fold


class SamePadConv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, stride=2)

    def forward(self, x):  # transformers' MobileNetV1 apply_tf_padding: pads from the input's shape
        h, w = x.shape[-2:]
        ph = max(3 - (h % 2 or 2), 0)
        pw = max(3 - (w % 2 or 2), 0)
        x = torch.nn.functional.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))
        return self.conv(x)


def _model():
    torch.manual_seed(0)
    m = SamePadConv().eval()
    x = np.random.default_rng(0).standard_normal((1, 3, 9, 9)).astype("float32")
    blob, why = _export_onnx(m, [x])
    assert blob is not None, why
    return m, x, onnx.load_from_string(blob)


def test_computed_pads_import_after_folding():
    m, x, model = _model()
    with torch.no_grad():
        ref = m(torch.from_numpy(x)).numpy()
    out = tvmfuse.build(tvmfuse.from_onnx(model), "llvm", "tvmfuse")(x)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_the_folding_is_what_makes_it_import(monkeypatch):
    _, _, model = _model()
    assert onnx_fold.static_inputs(model)
    assert "Shape" in {n.op_type for n in model.graph.node}
    assert "Shape" not in {n.op_type for n in onnx_fold.fold(model).graph.node}
    monkeypatch.setattr(onnx_fold, "static_inputs", lambda model: False)  # no retry
    with pytest.raises(tvmfuse.FrontendError, match="ONNX frontend failed"):
        tvmfuse.from_onnx(model)
