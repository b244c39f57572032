"""The model suite's tiny slice: every architecture of tvmfuse.suite.archs at its tiny
config (1 layer, widths 16-64, seq 8, images 32x32), imported through torch.export, built under
fusion="tvmfuse" and checked against PyTorch eager (rtol 1e-3, atol 1e-4). An architecture that
cannot pass yet is in XFAIL with its reason (strict: it fails the run once it passes)."""
import numpy as np
import pytest

from tvmfuse.suite import archs
from tvmfuse.suite.runner import ATOL, RTOL, check_init

XFAIL: dict[str, str] = {}  # name -> reason; at most 2


def _param(name):
    marks = [pytest.mark.xfail(reason=XFAIL[name], strict=True)] if name in XFAIL else []
    return pytest.param(name, marks=marks, id=name)


def test_the_suite_has_forty_architectures_and_few_expected_failures():
    assert len(archs.ARCHS) >= 40
    assert len(XFAIL) <= 2
    families = {a.family for a in archs.ARCHS}
    assert {"encoder", "decoder", "encoder-decoder", "vision-transformer", "hierarchical-vision", "cnn", "audio",
            "llm"} <= families


@pytest.mark.parametrize("name", [_param(n) for n in archs.names()])
def test_tiny_architecture_imports_builds_and_matches(name):
    import torch

    import tvmfuse

    arch = archs.BY_NAME[name]
    module = archs.build_module(arch, "tiny")
    arrays = archs.make_inputs(arch, "tiny", batch=1)
    tensors = tuple(torch.from_numpy(a) for a in arrays)
    init = check_init(module, tensors)
    assert init["denormals"] == 0 and 1e-3 < init["max_abs"] < 1e3, init
    with torch.no_grad():
        ref = module(*tensors).numpy()
    mod = tvmfuse.from_torch(module, tensors)
    out = tvmfuse.build(mod, "llvm", "tvmfuse")(*arrays)
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL["tiny"])
