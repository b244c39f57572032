"""Golden tests of tvmfuse/frontends/torch_fixes.py: ATen ops TVM's importer got wrong, imported
with from_torch, built and compared with PyTorch eager."""
import numpy as np
import pytest
import torch

import tvmfuse


def _check(module, *arrays):
    tensors = tuple(torch.from_numpy(a) for a in arrays)
    with torch.no_grad():
        ref = module(*tensors).numpy()
    out = tvmfuse.build(tvmfuse.from_torch(module, tensors), "llvm", "tvm")(*arrays)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


class IntDivide(torch.nn.Module):
    def forward(self, x, y):  # DeBERTa-v2's log buckets: torch.log(abs_pos / mid)
        return torch.log(x.abs() / 3 + 1) + x / y


def test_true_division_of_integers_is_float():
    rng = np.random.default_rng(0)
    x = rng.integers(-20, 20, size=(4, 8)).astype("int64")
    y = rng.integers(1, 7, size=(4, 8)).astype("int64")
    _check(IntDivide(), x, y)


class Index(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def forward(self, x, a, b):
        if self.kind == "trailing":  # ConvBERT's unfold: x[:, :, a, b]
            return x[:, :, a, b]
        if self.kind == "middle":  # adjacent indexed dims, a sliced dim on each side
            return x[:, a, b]
        return x[a, :, b]  # not adjacent: the indexed dims go in front


@pytest.mark.parametrize("kind", ["trailing", "middle", "apart"])
def test_index_with_sliced_dims_and_broadcast_indices(kind):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 6, 7, 4)).astype("float32")
    a = rng.integers(0, 4, size=(3, 2, 1, 1)).astype("int64")
    b = rng.integers(0, 4, size=(1, 5)).astype("int64")
    _check(Index(kind), x, a, b)
