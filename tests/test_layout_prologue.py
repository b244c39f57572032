"""The knob layout_prologue (tvmfuse/config.py, fusion/profitability.py): a transpose of a
non-constant tensor in front of a matmul is fused into it, on llvm and on CUDA (where the matmul
reads its second operand as [N, K]: the weight as stored), unless the caller turns the knob off."""
import logging

import numpy as np
import pytest
from tvm import relax

import tvmfuse
from tvmfuse import config

RNG = np.random.default_rng(3)


def _module():
    x = relax.Var("x", relax.TensorType((16, 32), "float32"))
    w = relax.Var("w", relax.TensorType((64, 32), "float32"))  # a weight passed in, not a constant
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            wt = bb.emit(relax.op.permute_dims(w, [1, 0]))
            out = bb.emit_output(relax.op.nn.relu(bb.emit(relax.op.matmul(x, wt))))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("target,knobs,launches", [
    ("llvm", {}, 1),  # llvm: the packing stage absorbs the transpose
    ("llvm", {"layout_prologue": False}, 2),
    ("cuda", {}, 1),  # CUDA: the matmul reads the weight as stored, no transpose kernel
    ("cuda", {"layout_prologue": False}, 2),  # off: a transpose kernel, then the matmul
])
def test_transpose_prologue_follows_the_target_unless_set(target, knobs, launches, caplog):
    with caplog.at_level(logging.INFO, logger="tvmfuse.fusion"):
        c = tvmfuse.build(_module(), target, "tvmfuse", **knobs)
    assert c.launches == launches
    if launches == 2:
        assert "read transposed inside compute-heavy" in caplog.text
    if target == "llvm":
        x, w = RNG.standard_normal((16, 32)).astype("float32"), RNG.standard_normal((64, 32)).astype("float32")
        np.testing.assert_allclose(c(x, w), np.maximum(x @ w.T, 0), rtol=1e-4, atol=1e-4)


def test_an_override_scope_counts_as_set():
    with config.override(layout_prologue=False):
        assert config.explicit("layout_prologue")
        assert tvmfuse.build(_module(), "cuda", "tvmfuse").launches == 2
    assert not config.explicit("layout_prologue")
