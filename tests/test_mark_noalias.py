"""MarkNoAlias (passes/mark_noalias.py): a PrimFunc with at most one buffer gets `tirx.noalias`,
others are left alone, and no build hands the LLVM codegen a function without it (one such
function costs every kernel of the module its alias info: TVM 0.27 shares one TBAA tag then)."""
from __future__ import annotations

import numpy as np
import tvm
from tvm.script import ir as I, relax as R, tirx as T

import tvmfuse
from tvmfuse import pipeline
from tvmfuse.passes.mark_noalias import ATTR, MarkNoAlias


@I.ir_module
class Before:
    @T.prim_func(private=True)
    def shape_func(H: T.Buffer((T.int64(2),), "int64")):
        T.func_attr({"tirx.is_host_func": True})
        H[T.int64(1)] = T.int64(4) * H[T.int64(0)]

    @T.prim_func(private=True)
    def copy(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32")):
        for i in range(4):
            B[i] = A[i]


def _noalias(f):
    return bool(f.attrs and f.attrs.get(ATTR))


def test_one_buffer_is_marked_and_two_are_not():
    after = MarkNoAlias(Before)
    assert _noalias(after["shape_func"]) and not _noalias(Before["shape_func"])
    assert not _noalias(after["copy"])  # A and B could be one array: not this pass's call
    tvm.ir.assert_structural_equal(after["shape_func"].body, Before["shape_func"].body)


def test_idempotent_and_a_no_op_when_all_are_marked():
    once = MarkNoAlias(Before)
    tvm.ir.assert_structural_equal(MarkNoAlias(once), once)


@I.ir_module
class Dyn:
    @R.function
    def main(x: R.Tensor(("n", 16), "float32"), w: R.Tensor((16, 16), "float32")):
        with R.dataflow():
            y = R.nn.relu(R.matmul(x, w))
            z = R.nn.softmax(R.add(y, x), axis=-1)
            R.output(z)
        return z


def _codegen_module(compiled):
    """The module the build hands tvm.compile: its Relax lowered by the codegen phase."""
    opts = pipeline.Options.for_target(compiled.target, compiled.fusion)
    with compiled.target, tvm.transform.PassContext(opt_level=3):
        return pipeline.phase("codegen", opts)(compiled.mod)


def test_a_symbolic_build_hands_codegen_only_noalias_functions():
    c = tvmfuse.build(Dyn, "llvm", "tvmfuse")
    low = _codegen_module(c)
    funcs = {gv.name_hint: f for gv, f in low.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert "shape_func" in funcs  # VMShapeLower's host function: the one TVM leaves unmarked
    assert all(_noalias(f) for f in funcs.values()), [n for n, f in funcs.items() if not _noalias(f)]
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 16)).astype("float32")
    for n in (1, 5, 64):
        x = rng.standard_normal((n, 16)).astype("float32")
        y = np.maximum(x @ w, 0) + x
        e = np.exp(y - y.max(-1, keepdims=True))
        np.testing.assert_allclose(c(x, w), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
