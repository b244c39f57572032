"""Full-size models (BERT-base, GPT-2 small with its 50257-word LM head, ResNet-50, MobileNetV2,
ConvNeXt-T, ViT-B/16, SmolLM-135M) through
tvmfuse: they match PyTorch, every matmul and conv is taken by its real rule (no naive fallback,
whatever the extents), kernel names are short, and each kernel's FLOPs are counted for the
roofline. "small" size: sequence 16, image 64x64; the weights are full size."""
import numpy as np
import pytest
import tvm

pytest.importorskip("torch")
pytest.importorskip("transformers")

import tvmfuse  # noqa: E402
from tvmfuse.zoo import models  # noqa: E402
from tvmfuse.runtime.roofline import graph_flops  # noqa: E402

_CACHE = {}


def _built(name):
    if name not in _CACHE:
        w = models.get(name, "small")
        _CACHE[name] = (w, tvmfuse.build(w.mod, "llvm", "tvmfuse"))
    return _CACHE[name]


@pytest.mark.parametrize("name", models.FULL_SIZE)
def test_full_size_model_matches_pytorch(name):
    w, c = _built(name)
    x = w.inputs()
    out = c(*x)
    np.testing.assert_allclose(out[0] if isinstance(out, tuple) else out, w.reference(*x), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("name", models.FULL_SIZE)
def test_every_matmul_and_conv_takes_its_rule(name):
    _w, c = _built(name)
    heavy = {gv.name_hint: str(f.attrs.get("tvmfuse.rule")) for gv, f in c.mod.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc) and int(f.attrs.get("tvmfuse.flops", 0)) > 0}
    assert heavy and set(heavy.values()) <= {"cpu.Matmul", "cpu.Conv2D", "cpu.Attention"}, heavy
    attention = [r for r in c.rules() if r == "cpu.Attention"]
    assert len(attention) == models.ATTENTION_LAYERS.get(name, 0), c.rules()  # one call per layer


@pytest.mark.parametrize("name", models.FULL_SIZE)
def test_kernel_names_are_short(name):
    _w, c = _built(name)
    names = [gv.name_hint for gv, _f in c.mod.functions_items()]
    assert not [n for n in names if "_1_1" in n], names


def test_kernel_flops_add_up_to_the_model_flops():
    """The per-kernel FLOPs of the roofline view cover the model's matmul/conv FLOPs (padding to
    whole tiles adds a little: GPT-2's 50257 columns are computed as 50272)."""
    w, c = _built("gpt2-small")
    calls = {}
    for block in c.mod["main"].body.blocks:
        for bd in block.bindings:
            v = bd.value
            if isinstance(v, tvm.relax.Call) and getattr(v.op, "name", "") == "relax.call_tir":
                calls[v.args[0].name_hint] = calls.get(v.args[0].name_hint, 0) + 1
    total = sum(int(c.mod[n].attrs.get("tvmfuse.flops", 0)) * k for n, k in calls.items())
    model = graph_flops(w.mod)
    assert model <= total <= model * 1.01
