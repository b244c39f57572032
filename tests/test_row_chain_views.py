"""A row chain whose output is a reshape of its last stage (a channels-last layer norm flattened for
the Linear after it: ConvNeXt's [1, 56, 56, 96] -> [3136, 96]) keeps the row rule: the reshape is
stored by the norm itself (common.store_views_in_producers), not a stage whose rows differ."""
import numpy as np
import pytest
import tvm
from tvm import relax

import tvmfuse


def _norm_then_linear(h, w, c, out):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, h, w, c), "float32"))
    g, b = (relax.Var(n, relax.TensorType((c,), "float32")) for n in ("g", "b"))
    wt = relax.Var("wt", relax.TensorType((c, out), "float32"))
    with bb.function("main", [x, g, b, wt]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.layer_norm(x, g, b, axes=[-1], epsilon=1e-6))
            flat = bb.emit(relax.op.reshape(y, (h * w, c)))
            z = bb.emit_output(relax.op.matmul(flat, wt))
        bb.emit_func_output(z)
    return bb.get()


def _rules(c):
    return {gv.name_hint: str(f.attrs["tvmfuse.rule"]) for gv, f in c.mod.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and "tvmfuse.rule" in f.attrs}


@pytest.mark.parametrize("h,w,c", [(7, 7, 96), (5, 3, 20)])
def test_layer_norm_stored_through_a_reshape_takes_the_row_rule(h, w, c):
    c_ = tvmfuse.build(_norm_then_linear(h, w, c, 16), "llvm", "tvmfuse")
    rules = _rules(c_)
    norm = [n for n in rules if "layer_norm" in n]
    assert norm and all("reshape" in n for n in norm), rules  # the planner fused the reshape: the case
    assert {rules[n] for n in norm} == {"cpu.RowReduction"}, rules
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, h, w, c)).astype("float32") * 2 + 1
    g, b = rng.random(c, "float32"), rng.random(c, "float32")
    wt = rng.standard_normal((c, 16)).astype("float32")
    x64 = x.astype("float64")
    y = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-6) * g + b
    np.testing.assert_allclose(np.asarray(c_(x, g, b, wt)), y.reshape(h * w, c) @ wt, rtol=1e-4, atol=1e-4)


def test_on_cuda_the_norm_through_a_reshape_takes_the_row_rule():
    mod = tvmfuse.prepare(_norm_then_linear(7, 7, 96, 16), "cuda", "tvmfuse")
    rules = {gv.name_hint: str(f.attrs["tvmfuse.rule"]) for gv, f in mod.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and "tvmfuse.rule" in f.attrs}
    assert {r for n, r in rules.items() if "layer_norm" in n} == {"cuda.RowReduction"}, rules


def test_a_transposing_output_copy_is_not_stored_by_its_producer():
    """Must not fire: a copy that moves elements (a transpose) is no view; it stays its own stage."""
    from tvm import s_tir
    from tvm.script import tirx as T

    from schedules.common import store_views_in_producers

    @T.prim_func(s_tir=True)
    def f(x: T.Buffer((4, 8), "float32"), out: T.Buffer((8, 4), "float32")):
        y = T.sblock_alloc_buffer((4, 8))
        for i, j in T.grid(4, 8):
            with T.sblock("y"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = x[vi, vj] * T.float32(2)
        for i, j in T.grid(8, 4):
            with T.sblock("out"):
                vi, vj = T.axis.remap("SS", [i, j])
                out[vi, vj] = y[vj, vi]

    sch = s_tir.Schedule(f)
    store_views_in_producers(sch)
    assert sch.get(sch.get_sblock("out")).name_hint == "out"  # get_sblock raises once it is inlined
