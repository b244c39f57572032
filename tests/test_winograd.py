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
    monkeypatch.setenv("TVMFUSE_CPU_WINOGRAD_TILES", str(m))
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
    (dict(const_weight=False), "a weight that is an input, on a map too small to pay for its transform"),
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
    rng = np.random.default_rng(2)
    wv = (rng.standard_normal((16, 16, 3, 3)) * 0.2).astype("float32")
    bv = np.zeros((1, 16, 1, 1), "float32")
    small = tvmfuse.build(_module(16, 16, 6, 6, wv, bv), "llvm", "tvmfuse")
    assert not WINOGRAD_RULES & _rules(small)
    monkeypatch.setenv("TVMFUSE_CPU_WINOGRAD_MAX_WEIGHT_MIB", "0")
    assert not WINOGRAD_RULES & _rules(tvmfuse.build(_module(16, 16, 10, 10, wv, bv), "llvm", "tvmfuse"))
    monkeypatch.setenv("TVMFUSE_CPU_WINOGRAD_MAX_WEIGHT_MIB", "16")
    monkeypatch.setenv("TVMFUSE_CPU_WINOGRAD", "0")
    assert not WINOGRAD_RULES & _rules(tvmfuse.build(_module(16, 16, 10, 10, wv, bv), "llvm", "tvmfuse"))


def test_cuda_builds_keep_the_direct_conv():
    rng = np.random.default_rng(3)
    wv = (rng.standard_normal((16, 16, 3, 3)) * 0.2).astype("float32")
    compiled = tvmfuse.build(_module(16, 16, 10, 10, wv, np.zeros((1, 16, 1, 1), "float32")), "cuda", "tvmfuse")
    assert not WINOGRAD_RULES & _rules(compiled)


def _run_weight_transform(wv, m):
    import tvm
    from tvmfuse.passes.winograd import weight_transform

    o, c = wv.shape[:2]
    lib = tvm.compile(tvm.IRModule({"main": weight_transform(c, o, 16, m)}), target="llvm")
    out = tvm.runtime.tensor(np.zeros(((m + 2) ** 2, c, o), "float32"))
    lib["main"](tvm.runtime.tensor(wv), out)
    return out.numpy()


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("o,c", [(48, 16), (24, 8), (5, 3)])
def test_the_run_time_weight_transform_is_the_build_time_one(m, o, c):
    """winograd_weight (G W Gᵀ at run time, in float32) against transformed_weight (float64 at build
    time): channel counts a whole vector, a part vector (24: 8 lanes) and none (5)."""
    wv = np.random.default_rng(o + m).standard_normal((o, c, 3, 3)).astype("float32")
    np.testing.assert_allclose(_run_weight_transform(wv, m), transformed_weight(wv, m), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fusion", ["none", "tvm", "tvmfuse"])
@pytest.mark.parametrize("c,o,h,w", [(32, 32, 28, 28), (24, 40, 29, 27)])
def test_a_weight_that_is_an_input_is_transformed_on_every_call(c, o, h, w, fusion):
    """A conv whose weight is a function input (a model built with its parameters as inputs) runs
    as Winograd where the FLOPs saved pay for transforming the weight each call: one more kernel
    (winograd.WeightTransform); numerics against PyTorch on a whole and a ragged map, and the
    second call with another weight gives that weight's conv (nothing is cached across calls)."""
    rng = np.random.default_rng(c + h)
    wv = (rng.standard_normal((o, c, 3, 3)) * 0.2).astype("float32")
    bv = rng.standard_normal((1, o, 1, 1)).astype("float32")
    xv = rng.standard_normal((1, c, h, w)).astype("float32")
    compiled = tvmfuse.build(_module(c, o, h, w, wv, bv, const_weight=False), "llvm", fusion)
    rules = _rules(compiled)
    assert WINOGRAD_RULES | {"winograd.WeightTransform", "cpu.Matmul"} <= rules and "cpu.Conv2D" not in rules, rules
    np.testing.assert_allclose(compiled(xv, wv), _reference(xv, wv, bv, padding=1), rtol=1e-4, atol=1e-4)
    w2 = (rng.standard_normal((o, c, 3, 3)) * 0.2).astype("float32")
    np.testing.assert_allclose(compiled(xv, w2), _reference(xv, w2, bv, padding=1), rtol=1e-4, atol=1e-4)


def test_a_weight_that_is_an_input_is_refused_where_its_transform_costs_more(caplog):
    """runtime_intensity: FLOPs saved per byte the per-call transform moves. 16 channels on a 10x10
    map save too few (stays direct, the reason logged); 64 on 56x56 save 90 per byte (F(4x4))."""
    import logging

    import schedules.targets as targets
    from tvmfuse.passes.winograd import _tile, runtime_intensity

    table = targets.cpu_table()
    assert runtime_intensity(64, 56, 56, 64, 4) == pytest.approx(90.4, abs=0.1)
    assert _tile(64, 56, 56, 64, table, runtime_weight=True) == 4
    assert _tile(16, 10, 10, 16, table) == 4  # a constant weight: transformed once, at build time
    why = _tile(16, 10, 10, 16, table, runtime_weight=True)
    assert isinstance(why, str) and "winograd_runtime_flops_per_byte" in why, why
    rng = np.random.default_rng(4)
    wv = (rng.standard_normal((16, 16, 3, 3)) * 0.2).astype("float32")
    with caplog.at_level(logging.INFO, logger="tvmfuse.fusion"):
        compiled = tvmfuse.build(_module(16, 16, 10, 10, wv, np.zeros((1, 16, 1, 1), "float32"), const_weight=False),
                                 "llvm", "tvmfuse")
    assert "cpu.Conv2D" in _rules(compiled)
    assert any("stays direct" in r.message and "winograd_runtime_flops_per_byte" in r.message for r in caplog.records)
