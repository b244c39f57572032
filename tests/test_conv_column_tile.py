"""cpu.Conv2D's choice between its two tiles (schedules/cpu/conv.py: _prefer_columns): a conv with a
short reduction (MobileNetV2's 16->96 expansion) or too few output channels to fill the channel
vector writes its NCHW rows from a column tile; strided convs, narrow maps and long reductions keep
the channel tile. Numerics against PyTorch in both tiles."""
import re

import numpy as np
import pytest
import tvm

import tvmfuse
from conftest import conv_module

torch = pytest.importorskip("torch")

ZNVER4 = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}  # AVX-512: 16 lanes
HASWELL = {"kind": "llvm", "mcpu": "haswell", "num-cores": 2}  # AVX2: 8 lanes


def _module(c, o, hw, k, stride, wv, bv):
    return conv_module((1, c, hw, hw), wv, bv, stride=stride, clip=(0.0, 6.0))


def _build(c, o, hw, k, stride, target):
    rng = np.random.default_rng(c * 7 + o + hw + k)
    wv = (rng.standard_normal((o, c, k, k)) * 0.2).astype("float32")
    bv = rng.standard_normal((1, o, 1, 1)).astype("float32")
    return tvmfuse.build(_module(c, o, hw, k, stride, wv, bv), target, "tvmfuse"), wv, bv


def _tile(compiled):
    """'channels' when the conv accumulates in a channel-last 5-d tile, else 'columns'."""
    convs = [f for _gv, f in compiled.mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)
             and f.attrs and str(f.attrs.get("tvmfuse.rule", "")) == "cpu.Conv2D"]
    assert len(convs) == 1, [gv.name_hint for gv, _f in compiled.mod.functions_items()]
    shapes = re.findall(r"conv2d_nchw\w* = T\.sblock_alloc_buffer\(\(([^)]*)\)", convs[0].script())
    return "channels" if any(s.count(",") == 4 for s in shapes) else "columns"


# (in, out, map, kernel, stride, target, tile)
CASES = [
    (16, 48, 32, 1, 1, ZNVER4, "columns"),  # a 16-step reduction, 32 wide: the expansion of MobileNetV2
    (40, 24, 16, 1, 1, ZNVER4, "columns"),  # 24 outputs do not fill 16 lanes
    (72, 32, 16, 1, 1, ZNVER4, "channels"),  # 72 steps: the channel tile
    (16, 48, 32, 1, 2, ZNVER4, "channels"),  # strided: columns would gather their input
    (16, 48, 28, 1, 1, ZNVER4, "channels"),  # 28 wide: 4 of 16 lanes
    (16, 48, 28, 1, 1, HASWELL, "columns"),  # ... 4 of 8 lanes on AVX2
    (64, 64, 32, 1, 1, ZNVER4, "channels"),  # a long reduction: the channel tile
]


@pytest.mark.parametrize("c,o,hw,k,stride,target,tile", CASES)
def test_tile_choice(c, o, hw, k, stride, target, tile):
    compiled, _wv, _bv = _build(c, o, hw, k, stride, target)
    assert _tile(compiled) == tile


@pytest.mark.parametrize("c,o,hw,k,stride", [(16, 48, 32, 1, 1), (40, 24, 16, 1, 1), (12, 32, 24, 1, 1),
                                             (3, 32, 48, 1, 1), (16, 48, 28, 1, 1)])
def test_column_tile_numerics(c, o, hw, k, stride):
    compiled, wv, bv = _build(c, o, hw, k, stride, "llvm")
    xv = np.random.default_rng(hw).standard_normal((1, c, hw, hw)).astype("float32")
    ref = torch.clamp(torch.nn.functional.conv2d(torch.from_numpy(xv).double(), torch.from_numpy(wv).double(),
                                                 stride=stride, padding=k // 2)
                      + torch.from_numpy(bv).double(), 0, 6).numpy()
    np.testing.assert_allclose(compiled(xv), ref, rtol=1e-4, atol=1e-4)
