"""Grouped and depthwise convs under cpu.Conv2D (schedules/cpu/conv.py: _grouping, _grouped_tile,
_pack_input): numerics against PyTorch on ragged shapes, the rule that takes them, and code that
computes whole vectors instead of one lane at a time."""
import re

import numpy as np
import pytest

import tvmfuse
from conftest import conv_module, kernel_rules

torch = pytest.importorskip("torch")


def _module(c, o, hw, k, stride, groups, const_weight, wv, bv):
    return conv_module((1, c, hw, hw), wv, bv, stride=stride, groups=groups, const_weight=const_weight)


_rules = kernel_rules

CASES = [  # (in, out, map, kernel, stride, groups)
    (32, 32, 13, 3, 1, 32),  # depthwise, a ragged map
    (48, 48, 15, 3, 2, 48),  # depthwise, strided
    (16, 16, 9, 7, 1, 16),  # depthwise 7x7 (ConvNeXt)
    (64, 64, 11, 3, 1, 4),  # 16 outputs per group: whole vectors in a group
    (64, 64, 14, 3, 2, 8),  # 8 per group (ResNeXt): half vectors on AVX-512
    (64, 64, 12, 1, 1, 4),  # a grouped 1x1 (ShuffleNet)
    (64, 64, 10, 3, 1, 32),  # 2 per group: the column tile
    (24, 24, 10, 3, 1, 24),  # depthwise, channels not a multiple of the vector: the column tile
    (16, 32, 9, 3, 1, 16),  # depthwise with a channel multiplier of 2
]


@pytest.mark.parametrize("const_weight", [True, False])
@pytest.mark.parametrize("c,o,hw,k,stride,groups", CASES)
def test_grouped_conv_numerics(c, o, hw, k, stride, groups, const_weight):
    rng = np.random.default_rng(c + o + hw + k + groups)
    wv = (rng.standard_normal((o, c // groups, k, k)) * 0.2).astype("float32")
    bv = rng.standard_normal((1, o, 1, 1)).astype("float32")
    xv = rng.standard_normal((1, c, hw, hw)).astype("float32")
    compiled = tvmfuse.build(_module(c, o, hw, k, stride, groups, const_weight, wv, bv), "llvm", "tvmfuse")
    assert set(_rules(compiled).values()) == {"cpu.Conv2D"}, _rules(compiled)
    ref = torch.relu(torch.nn.functional.conv2d(torch.from_numpy(xv).double(), torch.from_numpy(wv).double(),
                                                stride=stride, padding=k // 2, groups=groups)
                     + torch.from_numpy(bv).double()).numpy()
    out = compiled(xv) if const_weight else compiled(xv, wv)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cpu", ["znver4", "haswell"])
@pytest.mark.parametrize("groups", [64, 8])
def test_each_lane_reads_its_input_in_a_whole_vector(cpu, groups):
    """A depthwise conv (groups 64) and a ResNeXt-style one (8 outputs per group): the channel
    tile read a different input channel in every lane, one scalar load inserted per lane (226
    element inserts against 14 FMAs in this kernel on znver4, 9 GFLOP/s for ResNeXt's 3x3 at
    g = 32). Now the input is a broadcast or a packed vector: FMAs outnumber element inserts."""
    wv = np.ones((64, 64 // groups, 3, 3), "float32")
    mod = _module(64, 64, 14, 3, 1, groups, True, wv, np.zeros((1, 64, 1, 1), "float32"))
    compiled = tvmfuse.build(mod, {"kind": "llvm", "mcpu": cpu, "num-cores": 2}, "tvmfuse")
    asm = compiled.executable.mod.imports[0].inspect_source("asm")
    inserts = len(re.findall(r"\bv(?:insertps|pinsrd|insertf\w*)\b", asm))
    fmas = len(re.findall(r"\bvfmadd\w+\b", asm))
    assert fmas > inserts, (fmas, inserts)


def test_bench_conv_grouped_set_runs_and_checks_against_torch(tmp_path):
    """scripts/bench_conv.py --set grouped: one MobileNetV2 depthwise conv, checked against PyTorch
    before it is timed next to it; the JSON row carries both timings."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "convs.json"
    proc = subprocess.run([sys.executable, os.path.join(root, "scripts", "bench_conv.py"), "--set", "grouped",
                           "--only", "8", "--budget", "0.01", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| 8 | 96->96 3x3/2 g96 on 112x112 |" in proc.stdout
    (row,) = json.loads(out.read_text())["rows"]
    assert row["groups"] == 96 and row["rule"] == "cpu.Conv2D" and row["ms"] > 0 and row["torch_ms"] > 0
    assert json.loads(out.read_text())["machine"]["commit"]["hash"]
