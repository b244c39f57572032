"""A training forward's layer norm, its statistics saved for the backward, flattened for the Linear
after it ([4, 6, 16] -> [24, 16]):

- legality (fusion/legality.py `_regroups_rows`): a reshape that regroups only the norm's rows
  stays in the norm's kernel (mean, rstd and the normalized rows: one kernel, not three); a reshape
  that mixes rows with the normalized axis does not;
- profitability (fusion/profitability.py `_copies_a_view`): when the norm's output is also used
  elsewhere (the residual connection), its reshape stays out of the kernel, a free view, instead of
  a second copy of the output;
- launches count what the VM runs: a reshape left alone is a view, no kernel (Compiled.call_sites).

Each build is checked against numpy, and the norm's kernel takes the row rule, not the fallback.
"""
import numpy as np
import pytest
from tvm import relax

import tvmfuse
from tvmfuse.fusion.graph import BlockGraph
from tvmfuse.fusion.plan_fusion import plan
from tvmfuse.config import Knobs

B, S, H, N = 4, 6, 16, 8
EPS = 1e-5


def _norm(bb, x, g):
    mean = bb.emit(relax.op.mean(x, axis=[-1], keepdims=True))
    var = bb.emit(relax.op.variance(x, axis=[-1], keepdims=True))
    rstd = bb.emit(relax.op.rsqrt(relax.op.add(var, relax.const(EPS, "float32"))))
    y = bb.emit(relax.op.multiply(relax.op.multiply(relax.op.subtract(x, mean), rstd), g))
    return mean, rstd, y


def _module(residual: bool, flat=(B * S, H), matmul=True):
    """x [B, S, H] -> layer norm (mean and rstd returned, as AOT saves them) -> reshape `flat` ->
    matmul (without `matmul`, the reshape is returned: a flattened activation saved for the
    backward); with `residual` the norm's output is returned too."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((B, S, H), "float32"))
    g = relax.Var("g", relax.TensorType((H,), "float32"))
    w = relax.Var("w", relax.TensorType((flat[1], N), "float32"))
    with bb.function("main", [x, g, w]):
        with bb.dataflow():
            mean, rstd, y = _norm(bb, x, g)
            flat_y = bb.emit(relax.op.reshape(y, flat))
            out = bb.emit(relax.op.matmul(flat_y, w)) if matmul else flat_y
            outs = [out, mean, rstd] + ([y] if residual else [])
            result = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(result)
    return bb.get()


def _inputs(flat=(B * S, H)):
    rng = np.random.default_rng(0)
    return [rng.standard_normal((B, S, H)).astype("float32"), rng.standard_normal(H).astype("float32"),
            rng.standard_normal((flat[1], N)).astype("float32")]


def _reference(x, g, w, flat=(B * S, H)):
    mean = x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(x.var(-1, keepdims=True) + EPS)
    y = (x - mean) * rstd * g
    return y.reshape(flat) @ w, mean, rstd, y


def _groups(mod):
    func = mod["main"]
    (block,) = func.body.blocks
    g = BlockGraph(block, set(relax.analysis.free_vars(func.body.body)))
    ops = {n.idx: n.op for n in g.nodes}
    return [sorted(ops[i] for i in grp) for grp in plan(block, set(relax.analysis.free_vars(func.body.body)),
                                                         Knobs().as_dict()).groups], ops


def test_a_reshape_regrouping_the_rows_joins_the_norm_and_its_statistics():
    groups, _ = _groups(_module(residual=False))
    norm = next(grp for grp in groups if "mean" in grp)
    assert "variance" in norm and "reshape" in norm and "rsqrt" in norm


def test_a_reshape_mixing_rows_with_the_normalized_axis_stays_out():
    """[4, 6, 16] -> [4, 96]: a row of the output holds six rows of the norm (must not fire)."""
    flat = (B, S * H)
    groups, _ = _groups(_module(residual=False, flat=flat))
    norm = next(grp for grp in groups if "mean" in grp)
    assert "reshape" not in norm


@pytest.mark.parametrize("matmul", [True, False])
def test_the_reshape_of_a_norm_output_used_elsewhere_stays_a_view(matmul):
    groups, _ = _groups(_module(residual=True, matmul=matmul))
    norm = next(grp for grp in groups if "mean" in grp)
    assert "variance" in norm and "reshape" not in norm


def test_the_reshape_of_a_norm_output_used_nowhere_else_is_stored_by_the_norm():
    """Must not fire: the norm's output exists only as the reshape, so the kernel writes it so."""
    groups, _ = _groups(_module(residual=False, matmul=False))
    norm = next(grp for grp in groups if "mean" in grp)
    assert "reshape" in norm


@pytest.mark.parametrize("residual", [False, True])
def test_numerics_kernels_and_launches(residual):
    c = tvmfuse.build(_module(residual), "llvm", "tvmfuse")
    got = c(*_inputs())
    for a, b in zip(got, _reference(*_inputs())):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    rules = dict(zip(c.call_sites(), c.rules()))
    norm = [n for n in rules if "variance" in n]
    assert len(norm) == 1 and rules[norm[0]] == "cpu.RowReduction", rules
    assert c.launches == 2, rules  # the norm and the matmul; a reshape left alone launches nothing


def test_the_row_mixing_reshape_still_computes_the_same():
    flat = (B, S * H)
    c = tvmfuse.build(_module(False, flat), "llvm", "tvmfuse")
    for a, b in zip(c(*_inputs(flat)), _reference(*_inputs(flat), flat=flat)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
