"""Winograd3x3 (tvmfuse/passes/winograd.py): numerics against PyTorch on ragged maps, the kernels it
makes and the rules that take them, every fusion variant, and the convs it must leave alone."""
import numpy as np
import pytest

import tvmfuse
from conftest import conv_module, kernel_rules
from tvmfuse.passes.winograd import transformed_weight

torch = pytest.importorskip("torch")

WINOGRAD_RULES = {"winograd.InputTransform", "winograd.OutputTransform"}


def _module(c, o, h, w, wv, bv, stride=1, padding=1, groups=1, dilation=1, batch=1, const_weight=True):
    return conv_module((batch, c, h, w), wv, bv, stride=stride, padding=padding, groups=groups, dilation=dilation,
                       const_weight=const_weight)


def _rules(c):
    return set(kernel_rules(c).values())

def _reference(xv, wv, bv, **kw):
    y = torch.nn.functional.conv2d(torch.from_numpy(xv).double(), torch.from_numpy(wv).double(), **kw)
    return torch.relu(y + torch.from_numpy(bv).double()).numpy()


@pytest.mark.parametrize("fusion", ["none", "tvm", "tvmfuse"])
@pytest.mark.parametrize("c,o,h,w", [(16, 16, 8, 8), (32, 48, 13, 13), (8, 24, 9, 10)])
def test_winograd_conv_matches_pytorch(c, o, h, w, fusion):
    rng = np.random.default_rng(c + o + h + w)
    wv = (rng.standard_normal((o, c, 3, 3)) * 0.2).astype("float32")
    bv = rng.standard_normal((1, o, 1, 1)).astype("float32")
    xv = rng.standard_normal((1, c, h, w)).astype("float32")
    compiled = tvmfuse.build(_module(c, o, h, w, wv, bv), "llvm", fusion)
    rules = _rules(compiled)
    assert WINOGRAD_RULES <= rules and "cpu.Matmul" in rules and "cpu.Conv2D" not in rules, rules
    np.testing.assert_allclose(compiled(xv), _reference(xv, wv, bv, padding=1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("c,o,h,w,m", [(16, 16, 56, 56, 4), (32, 32, 7, 7, 4), (64, 64, 9, 9, 4),
                                        (256, 256, 14, 14, 4), (512, 512, 7, 7, 2)])
def test_the_tile_is_the_one_with_the_fewest_multiply_adds_under_the_weight_limit(c, o, h, w, m):
    """F(4x4) where its weight is under winograd_max_weight_mib (36/9 of W: 512x512 is 36 MiB) and it
    does fewer multiply-adds; F(2x2) otherwise (7x7 at 512 channels: 16 MiB)."""
    import schedules.targets as targets
    from tvmfuse.passes.winograd import _tile

    assert _tile(c, h, w, o, targets.cpu_table()) == m


def test_f4_tile_choice_is_refused_with_its_reason(monkeypatch):
    import schedules.targets as targets
    from tvmfuse.passes.winograd import _tile

    table = targets.cpu_table()
    monkeypatch.setitem(table, "winograd_max_weight_mib", 1)
    assert _tile(128, 28, 28, 128, table) == 2  # F(4x4): 2.25 MiB; F(2x2): 1 MiB
    monkeypatch.setitem(table, "winograd_max_weight_mib", 0)
    assert "winograd_max_weight_mib=0" in _tile(128, 28, 28, 128, table)


@pytest.mark.parametrize("m", [2, 4])
def test_winograd_tiles_match_pytorch_at_every_tile_size(m, monkeypatch):
    """Each tile size alone on a ragged map (13x11: partial tiles, sliced) and a whole one."""
    import schedules.targets as targets

    monkeypatch.setitem(targets.cpu_table(), "winograd_tiles", (m,))
    for c, o, h, w in [(24, 40, 13, 11), (32, 32, 16, 16)]:
        rng = np.random.default_rng(m + h)
        wv = (rng.standard_normal((o, c, 3, 3)) * 0.2).astype("float32")
        bv = rng.standard_normal((1, o, 1, 1)).astype("float32")
        xv = rng.standard_normal((1, c, h, w)).astype("float32")
        compiled = tvmfuse.build(_module(c, o, h, w, wv, bv), "llvm", "tvmfuse")
        assert WINOGRAD_RULES <= _rules(compiled)
        matmul = next(f for gv, f in compiled.mod.functions_items() if "matmul" in gv.name_hint)
        assert int(matmul.params[0].ty.shape[0]) == (m + 2) ** 2  # n² batches
        np.testing.assert_allclose(compiled(xv), _reference(xv, wv, bv, padding=1), rtol=1e-4, atol=1e-4)


def test_transformed_weight_is_g_w_gt():
    """U[4a+b, c, o] = (G W[o, c] Gᵀ)[a, b]: its column sums give back W's row sums (G's rows 1, 2
    average the taps: 0.5 + 0.5 of each), and a delta kernel maps to G's outer products."""
    w = np.zeros((1, 1, 3, 3), "float32")
    w[0, 0, 1, 1] = 1.0  # the centre tap
    u = transformed_weight(w).reshape(4, 4)
    g1 = np.array([0, 0.5, -0.5, 0])  # G's centre column
    np.testing.assert_allclose(u, np.outer(g1, g1))


@pytest.mark.parametrize("kw,why", [
    (dict(stride=2), "strided"),
    (dict(groups=2), "grouped"),
    (dict(padding=0), "unpadded"),
    (dict(dilation=2, padding=2), "dilated"),
    (dict(batch=2), "batch 2"),
    (dict(const_weight=False), "a weight that is an input"),
])
def test_winograd_must_not_fire(kw, why):
    c = o = 16
    rng = np.random.default_rng(1)
    wv = (rng.standard_normal((o, c // kw.get("groups", 1), 3, 3)) * 0.2).astype("float32")
    bv = rng.standard_normal((1, o, 1, 1)).astype("float32")
    compiled = tvmfuse.build(_module(c, o, 10, 10, wv, bv, **kw), "llvm", "tvmfuse")
    assert not WINOGRAD_RULES & _rules(compiled), why
    assert "cpu.Conv2D" in _rules(compiled), why


def test_small_maps_and_large_weights_stay_direct(monkeypatch):
    """Profitability: a 6x6 map (under winograd_min_map) stays a direct conv, and so does a conv
    whose transformed weight is over winograd_max_weight_mib; TVMFUSE_CPU_WINOGRAD=0 turns it off."""
    import schedules.targets as targets

    rng = np.random.default_rng(2)
    wv = (rng.standard_normal((16, 16, 3, 3)) * 0.2).astype("float32")
    bv = np.zeros((1, 16, 1, 1), "float32")
    small = tvmfuse.build(_module(16, 16, 6, 6, wv, bv), "llvm", "tvmfuse")
    assert not WINOGRAD_RULES & _rules(small)
    table = targets.cpu_table()
    monkeypatch.setitem(table, "winograd_max_weight_mib", 0)
    assert not WINOGRAD_RULES & _rules(tvmfuse.build(_module(16, 16, 10, 10, wv, bv), "llvm", "tvmfuse"))
    monkeypatch.setitem(table, "winograd_max_weight_mib", 16)
    monkeypatch.setitem(table, "winograd", 0)
    assert not WINOGRAD_RULES & _rules(tvmfuse.build(_module(16, 16, 10, 10, wv, bv), "llvm", "tvmfuse"))


def test_cuda_builds_keep_the_direct_conv():
    rng = np.random.default_rng(3)
    wv = (rng.standard_normal((16, 16, 3, 3)) * 0.2).astype("float32")
    compiled = tvmfuse.build(_module(16, 16, 10, 10, wv, np.zeros((1, 16, 1, 1), "float32")), "cuda", "tvmfuse")
    assert not WINOGRAD_RULES & _rules(compiled)
