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


class Alpha(torch.nn.Module):
    def forward(self, x, y):  # SGD's weight decay add(grad, p, alpha=wd); its update add(p, buf, alpha=-lr)
        return (torch.add(x, y, alpha=0.5) + torch.sub(x, y, alpha=2.0) + torch.add(x, 3.0, alpha=2.0)
                + torch.rsub(x, y, alpha=3.0) + torch.rsub(x, 2.0, alpha=0.25) + torch.add(x, y))


def test_add_and_sub_keep_alpha():
    """TVM's converters dropped alpha (x + alpha*y imported as x + y)."""
    rng = np.random.default_rng(0)
    _check(Alpha(), rng.standard_normal((4, 8)).astype("float32"), rng.standard_normal((4, 8)).astype("float32"))


def test_functional_copy_casts_broadcasts_and_leaves_self_alone():
    """aten.copy.default(self, src) is src in self's dtype and shape; a later reader of self sees
    self (TVM's converter, copy_'s, rebound it to src)."""
    import tvm
    from tvmfuse.frontends.from_torch import FIXES
    from tvm.relax.frontend.torch import from_exported_program

    class Copy(torch.nn.Module):
        def forward(self, x, y):
            return torch.ops.aten.copy.default(x, y) * 2 + x

    x = torch.randn(3, 4)
    y = torch.randn(4).to(torch.float64)
    ep = torch.export.export(Copy(), (x, y))
    mod = from_exported_program(ep, custom_convert_map=FIXES)
    ex = tvm.compile(mod, "llvm")
    out = tvm.relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()), tvm.runtime.tensor(y.numpy()))
    out = out[0] if not hasattr(out, "numpy") else out
    np.testing.assert_allclose(out.numpy(), Copy()(x, y).numpy(), rtol=1e-6, atol=1e-6)


def test_alpha_through_the_fx_route_of_the_backend():
    """TVM's FX importer (the backend's first route) dropped alpha as well, for functions and methods."""
    x, y = torch.randn(4, 8), torch.randn(4, 8)

    def f(a, b):
        return torch.add(a, b, alpha=0.5) - torch.sub(b, a, alpha=3) + a.add(b, alpha=2) + torch.rsub(a, b, alpha=2)

    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(f, backend="tvmfuse", options={"fallback": "error"})(x, y)
    torch.testing.assert_close(out, f(x, y), rtol=1e-5, atol=1e-6)
