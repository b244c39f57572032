"""FoldConstantsOnce (tvmfuse/passes/fold_constants.py): golden Before/Expected, the one-build
promise, agreement with TVM's FoldConstant, and the cases where it must not fire."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R, tirx as T

from tvmfuse.passes import fold_constants
from tvmfuse.passes.fold_constants import FoldConstantsOnce

F32 = "float32"
DCE = relax.transform.DeadCodeElimination()


def _bind(mod, **arrays):
    return relax.transform.BindParams("main", {k: np.asarray(v, F32) for k, v in arrays.items()})(mod)


@I.ir_module
class Normalize:  # the decomposed inference BatchNorm's denominator, on constant statistics
    @R.function
    def main(x: R.Tensor((1, 3, 2, 2), "float32"), var: R.Tensor((3,), "float32"),
             eps: R.Tensor((), "float32")) -> R.Tensor((1, 3, 2, 2), "float32"):
        with R.dataflow():
            v = R.expand_dims(var, axis=[0, 2, 3])
            a = R.add(v, eps)
            s = R.sqrt(a)
            o = R.divide(x, s)
            R.output(o)
        return o


@I.ir_module
class NormalizeFolded:
    @R.function
    def main(x: R.Tensor((1, 3, 2, 2), "float32"), s: R.Tensor((1, 3, 1, 1), "float32")
             ) -> R.Tensor((1, 3, 2, 2), "float32"):
        with R.dataflow():
            o = R.divide(x, s)
            R.output(o)
        return o


VAR = np.array([4, 9, 16], F32)  # sqrt(var + 0) is exact: the golden constant is bit-exact


def test_fold_golden():
    before = _bind(Normalize, var=VAR, eps=np.float32(0))
    after = DCE(FoldConstantsOnce(before))
    expected = _bind(NormalizeFolded, s=np.sqrt(VAR).reshape(1, 3, 1, 1))
    tvm.ir.assert_structural_equal(after, expected)


def test_bindings_only_the_folded_ones_read_are_dropped_at_once():
    """v and a feed only s: once s is a constant they are dead, and dropped by the pass itself (not
    left for TVM's FoldConstant, which would build one module for each, before DCE drops them)."""
    after = FoldConstantsOnce(_bind(Normalize, var=VAR, eps=np.float32(0)))
    (block,) = after["main"].body.blocks
    kinds = [(b.var.name, isinstance(b.value, tvm.ir.expr.Constant)) for b in block.bindings]
    assert kinds == [("s", True), ("o", False)], kinds


def test_one_build_for_every_folded_binding(monkeypatch):
    builds = []
    real = relax.build
    monkeypatch.setattr(relax, "build", lambda *a, **k: builds.append(1) or real(*a, **k))
    before = _bind(Normalize, var=VAR, eps=np.float32(1e-5))
    after = DCE(FoldConstantsOnce(before))
    assert len(builds) == 1
    assert [bd.value.op.name for bd in after["main"].body.blocks[0].bindings] == ["relax.divide"]


@I.ir_module
class Chain:
    @R.function
    def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((3, 4), "float32"), k: R.Tensor((4, 3), "float32"),
             b: R.Tensor((3,), "float32")) -> R.Tensor((2, 3), "float32"):
        with R.dataflow():
            wt = R.permute_dims(w)
            ws = R.multiply(wt, k)
            y = R.matmul(x, ws)
            z = R.add(y, b)
            R.output(z)
        return z


def test_same_graph_as_tvm_fold_constant():
    rng = np.random.default_rng(0)
    before = _bind(Chain, w=rng.standard_normal((3, 4)), k=rng.standard_normal((4, 3)))
    ours = DCE(FoldConstantsOnce(before))
    with tvm.transform.PassContext(opt_level=3):
        theirs = DCE(relax.transform.FoldConstant()(before))
    tvm.ir.assert_structural_equal(ours, theirs)
    ops = [bd.value.op.name for bd in ours["main"].body.blocks[0].bindings]
    assert ops == ["relax.matmul", "relax.add"]


@I.ir_module
class Pack:  # a weight's packing split off as its own PrimFunc (what PrepackWeights folds)
    @T.prim_func(private=True, s_tir=True)
    def pack(w: T.Buffer((4, 8), "float32"), p: T.Buffer((2, 4, 4), "float32")):
        for i, j, k in T.grid(2, 4, 4):
            with T.sblock("p"):
                vi, vj, vk = T.axis.remap("SSS", [i, j, k])
                p[vi, vj, vk] = w[vj, vi * 4 + vk]

    @R.function
    def main(x: R.Tensor((2, 4, 4), "float32"), w: R.Tensor((4, 8), "float32")) -> R.Tensor((2, 4, 4), "float32"):
        cls = Pack
        with R.dataflow():
            p = R.call_tir(cls.pack, (w,), out_ty=R.Tensor((2, 4, 4), "float32"))
            o = R.add(x, p)
            R.output(o)
        return o


def test_folds_a_call_tir_on_constants():
    w = np.arange(32, dtype=F32).reshape(4, 8)
    after = DCE(FoldConstantsOnce(_bind(Pack, w=w)))
    (add,) = after["main"].body.blocks[0].bindings
    packed = add.value.args[1]
    assert isinstance(packed, tvm.ir.expr.Constant)
    np.testing.assert_array_equal(packed.value.numpy(), w.reshape(4, 2, 4).transpose(1, 0, 2))


@I.ir_module
class OnInput:
    @R.function
    def main(x: R.Tensor((3,), "float32"), c: R.Tensor((3,), "float32")) -> R.Tensor((3,), "float32"):
        with R.dataflow():
            a = R.add(x, c)
            o = R.sqrt(a)
            R.output(o)
        return o


@I.ir_module
class Grows:
    @R.function
    def main(x: R.Tensor((256, 256), "float32"), c: R.Tensor((), "float32")) -> R.Tensor((256, 256), "float32"):
        with R.dataflow():
            big = R.broadcast_to(c, R.shape([256, 256]))
            o = R.add(x, big)
            R.output(o)
        return o


@I.ir_module
class Symbolic:
    @R.function
    def main(x: R.Tensor(("n", 3), "float32"), c: R.Tensor((3,), "float32")) -> R.Tensor(("n", 3), "float32"):
        n = T.int64()
        with R.dataflow():
            big = R.broadcast_to(c, R.shape([n, 3]))
            o = R.add(x, big)
            R.output(o)
        return o


@pytest.mark.parametrize("case", ["input", "grows", "symbolic"])
def test_must_not_fire(case, monkeypatch):
    mod = {"input": lambda: _bind(OnInput, c=np.ones(3)),
           "grows": lambda: _bind(Grows, c=np.float32(2)),
           "symbolic": lambda: _bind(Symbolic, c=np.ones(3))}[case]()
    monkeypatch.setattr(relax, "build", lambda *a, **k: pytest.fail("nothing to fold, nothing to build"))
    after = FoldConstantsOnce(mod)
    tvm.ir.assert_structural_equal(after, mod)


def test_guard_constants():
    assert fold_constants.SMALL < 256 * 256  # the Grows case above is past the guard
