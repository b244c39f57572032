"""Golden Before/Expected IR tests for tvmfuse's own module passes (issue 17, item 8).

Each test writes Before and Expected in TVMScript and compares whole modules with
`tvm.ir.assert_structural_equal`. Constants are bound into the TVMScript with
`relax.transform.BindParams` (numpy values), Before and Expected alike, so the comparison checks the
constants' values too (see test_golden_comparison_sees_constant_values). The values are small
integers and powers of two: every folded product is exact in float32, whatever the order of the
pass's arithmetic.

- FoldBatchNorm (passes/fold_batch_norm.py): conv2d / matmul + a constant per-channel affine chain
  folds into the weight and one bias add; the cases where it must not fire give Expected == Before.
- MarkConstantParams (passes/prepack_weights.py): which PrimFunc gets `tvmfuse.constant_params`,
  with which parameter indices.
- schedules.common.pack_at_build_time + PrepackWeights: the marked packing block leaves the kernel
  and becomes a constant computed at build time; unmarked modules are unchanged.

FuseGroupsTE has no golden test here on purpose (its output is being changed).
"""
import numpy as np
import pytest
import tvm
from tvm import relax, s_tir
from tvm.script import ir as I, relax as R, tirx as T

from schedules.common import pack_at_build_time
from tvmfuse.passes.fold_batch_norm import FoldBatchNorm
from tvmfuse.passes.prepack_weights import CONSTANT_PARAMS, PREPROC, MarkConstantParams, PrepackWeights

F32 = "float32"


def _bind(mod, **arrays):
    """Bind numpy values to main's parameters of those names: they become Relax constants."""
    return relax.transform.BindParams("main", {k: np.asarray(v, F32) for k, v in arrays.items()})(mod)


def _run(mod, *args):
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    return out.numpy() if hasattr(out, "numpy") else [o.numpy() for o in out]


def _check_well_formed(mod):
    """relax.analysis.well_formed raises (0.27) or returns False on an ill-formed module."""
    assert relax.analysis.well_formed(mod) is not False


def _op_names(mod):
    return [bd.value.op.name for blk in mod["main"].body.blocks for bd in blk.bindings
            if isinstance(bd.value, relax.Call) and isinstance(bd.value.op, tvm.ir.Op)]


# ====================================================================== FoldBatchNorm
# conv: x (1, 2, 4, 4), W (3, 2, 3, 3) OIHW, per-channel constants (1, 3, 1, 1)
CONV_W = ((np.arange(54) % 7) - 3).astype(F32).reshape(3, 2, 3, 3)
MEAN = np.array([1, -2, 3], F32).reshape(1, 3, 1, 1)
STD = np.array([2, 0.5, 4], F32).reshape(1, 3, 1, 1)
GAMMA = np.array([1, 2, 0.25], F32).reshape(1, 3, 1, 1)
BETA = np.array([0, 1, -1], F32).reshape(1, 3, 1, 1)
# matmul: x (2, 4), W (4, 3), per-channel constants (3,)
MM_W = ((np.arange(12) % 5) - 2).astype(F32).reshape(4, 3)
MM_S = np.array([2, 0.5, -4], F32)
MM_B = np.array([1, -3, 0.5], F32)


@I.ir_module
class ConvBN:
    @R.function
    def main(x: R.Tensor((1, 2, 4, 4), "float32"), w: R.Tensor((3, 2, 3, 3), "float32"),
             mean: R.Tensor((1, 3, 1, 1), "float32"), std: R.Tensor((1, 3, 1, 1), "float32"),
             gamma: R.Tensor((1, 3, 1, 1), "float32"), beta: R.Tensor((1, 3, 1, 1), "float32")
             ) -> R.Tensor((1, 3, 4, 4), "float32"):
        with R.dataflow():
            y = R.nn.conv2d(x, w, padding=1)
            a = R.subtract(y, mean)
            b = R.divide(a, std)
            c = R.multiply(b, gamma)
            d = R.add(c, beta)
            o = R.nn.relu(d)
            R.output(o)
        return o


@I.ir_module
class ConvBNFolded:
    @R.function
    def main(x: R.Tensor((1, 2, 4, 4), "float32"), w: R.Tensor((3, 2, 3, 3), "float32"),
             bias: R.Tensor((1, 3, 1, 1), "float32")) -> R.Tensor((1, 3, 4, 4), "float32"):
        with R.dataflow():
            y = R.nn.conv2d(x, w, padding=1)
            d = R.add(y, bias)
            o = R.nn.relu(d)
            R.output(o)
        return o


def _conv_bn_folded_constants():
    per_out = lambda a: a.reshape(-1, 1, 1, 1)  # noqa: E731  (OIHW: O is the output channel)
    w = CONV_W / per_out(STD) * per_out(GAMMA)
    bias = (0 - MEAN) / STD * GAMMA + BETA
    return w.astype(F32), bias.astype(F32)


def test_fold_conv_batch_norm_golden():
    before = _bind(ConvBN, w=CONV_W, mean=MEAN, std=STD, gamma=GAMMA, beta=BETA)
    w, bias = _conv_bn_folded_constants()
    expected = _bind(ConvBNFolded, w=w, bias=bias)
    after = FoldBatchNorm(before)
    _check_well_formed(after)
    tvm.ir.assert_structural_equal(after, expected)
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 4)).astype(F32)
    np.testing.assert_allclose(_run(after, x), _run(before, x), rtol=1e-5, atol=1e-5)


def test_golden_comparison_sees_constant_values():
    """Guard for every golden test here: a one-ulp change of one folded constant is a mismatch."""
    before = _bind(ConvBN, w=CONV_W, mean=MEAN, std=STD, gamma=GAMMA, beta=BETA)
    w, bias = _conv_bn_folded_constants()
    bias_off = bias.copy()
    bias_off[0, 1, 0, 0] = np.nextafter(bias_off[0, 1, 0, 0], np.float32(np.inf))
    with pytest.raises(ValueError):
        tvm.ir.assert_structural_equal(FoldBatchNorm(before), _bind(ConvBNFolded, w=w, bias=bias_off))


@I.ir_module
class MatmulAffine:
    @R.function
    def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 3), "float32"), s: R.Tensor((3,), "float32"),
             b: R.Tensor((3,), "float32")) -> R.Tensor((2, 3), "float32"):
        with R.dataflow():
            y = R.matmul(x, w)
            z = R.multiply(y, s)
            o = R.add(z, b)
            R.output(o)
        return o


@I.ir_module
class MatmulAffineFolded:
    @R.function
    def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 3), "float32"),
             b: R.Tensor((3,), "float32")) -> R.Tensor((2, 3), "float32"):
        with R.dataflow():
            y = R.matmul(x, w)
            o = R.add(y, b)
            R.output(o)
        return o


def test_fold_matmul_scale_and_bias_golden():
    before = _bind(MatmulAffine, w=MM_W, s=MM_S, b=MM_B)
    expected = _bind(MatmulAffineFolded, w=MM_W * MM_S.reshape(1, -1), b=MM_B)  # W scaled per column
    after = FoldBatchNorm(before)
    _check_well_formed(after)
    tvm.ir.assert_structural_equal(after, expected)
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(F32)
    np.testing.assert_allclose(_run(after, x), _run(before, x), rtol=1e-5, atol=1e-5)


@I.ir_module
class MatmulDivide:
    @R.function
    def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 3), "float32"),
             s: R.Tensor((3,), "float32")) -> R.Tensor((2, 3), "float32"):
        with R.dataflow():
            y = R.matmul(x, w)
            z = R.divide(y, s)
            R.output(z)
        return z


@I.ir_module
class MatmulOnly:
    @R.function
    def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 3), "float32")) -> R.Tensor((2, 3), "float32"):
        with R.dataflow():
            z = R.matmul(x, w)
            R.output(z)
        return z


def test_fold_matmul_divide_golden_no_bias_add():
    """A chain of scales only: the weight absorbs it and no bias add is emitted."""
    after = FoldBatchNorm(_bind(MatmulDivide, w=MM_W, s=MM_S))
    tvm.ir.assert_structural_equal(after, _bind(MatmulOnly, w=MM_W / MM_S.reshape(1, -1)))


@I.ir_module
class MatmulWeightAlsoOutput:
    @R.function
    def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 3), "float32"), s: R.Tensor((3,), "float32")):
        with R.dataflow():
            y = R.matmul(x, w)
            z = R.multiply(y, s)
            t = (z, w)
            R.output(t)
        return t


@I.ir_module
class MatmulWeightAlsoOutputFolded:
    @R.function
    def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 3), "float32"), w2: R.Tensor((4, 3), "float32")):
        with R.dataflow():
            z = R.matmul(x, w2)
            t = (z, w)
            R.output(t)
        return t


def test_weight_that_is_also_an_output_is_returned_unscaled():
    """The folded weight is a new constant: the returned weight keeps its original values."""
    after = FoldBatchNorm(_bind(MatmulWeightAlsoOutput, w=MM_W, s=MM_S))
    tvm.ir.assert_structural_equal(after, _bind(MatmulWeightAlsoOutputFolded, w=MM_W, w2=MM_W * MM_S))


@I.ir_module
class MatmulMidChainOutput:
    @R.function
    def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 3), "float32"), s: R.Tensor((3,), "float32"),
             b: R.Tensor((3,), "float32")):
        with R.dataflow():
            y = R.matmul(x, w)
            z = R.multiply(y, s)
            o = R.add(z, b)
            t = (o, z)
            R.output(t)
        return t


@I.ir_module
class MatmulMidChainOutputFolded:
    @R.function
    def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 3), "float32"), b: R.Tensor((3,), "float32")):
        with R.dataflow():
            z = R.matmul(x, w)
            o = R.add(z, b)
            t = (o, z)
            R.output(t)
        return t


def test_chain_stops_at_an_intermediate_that_is_also_an_output():
    """z is needed unfolded-past: the scale folds, the bias add after z stays a separate op."""
    after = FoldBatchNorm(_bind(MatmulMidChainOutput, w=MM_W, s=MM_S, b=MM_B))
    tvm.ir.assert_structural_equal(after, _bind(MatmulMidChainOutputFolded, w=MM_W * MM_S, b=MM_B))


# ---------------------------------------------------------------- FoldBatchNorm: must not fire
@I.ir_module
class ConvOutputAlsoReturned:
    @R.function
    def main(x: R.Tensor((1, 2, 4, 4), "float32"), w: R.Tensor((3, 2, 3, 3), "float32"),
             std: R.Tensor((1, 3, 1, 1), "float32")):
        with R.dataflow():
            y = R.nn.conv2d(x, w, padding=1)
            b = R.divide(y, std)
            t = (b, y)
            R.output(t)
        return t


@I.ir_module
class MatmulSecondConsumer:
    @R.function
    def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 3), "float32"), s: R.Tensor((3,), "float32")):
        with R.dataflow():
            y = R.matmul(x, w)
            z = R.multiply(y, s)
            u = R.nn.relu(y)
            t = (z, u)
            R.output(t)
        return t


@I.ir_module
class MatmulRowConstant:
    @R.function
    def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 3), "float32"),
             s: R.Tensor((2, 1), "float32")) -> R.Tensor((2, 3), "float32"):
        with R.dataflow():
            y = R.matmul(x, w)
            z = R.multiply(y, s)
            R.output(z)
        return z


@I.ir_module
class MatmulConstantOnTheLeft:
    @R.function
    def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 3), "float32"),
             s: R.Tensor((3,), "float32")) -> R.Tensor((2, 3), "float32"):
        with R.dataflow():
            y = R.matmul(x, w)
            z = R.divide(s, y)
            R.output(z)
        return z


@I.ir_module
class MatmulBiasOnly:
    @R.function
    def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 3), "float32"),
             b: R.Tensor((1, 3), "float32")) -> R.Tensor((2, 3), "float32"):
        with R.dataflow():
            y = R.matmul(x, w)
            o = R.add(y, b)
            R.output(o)
        return o


@I.ir_module
class ConvNHWC:
    @R.function
    def main(x: R.Tensor((1, 4, 4, 2), "float32"), w: R.Tensor((3, 3, 2, 3), "float32"),
             s: R.Tensor((3,), "float32")) -> R.Tensor((1, 4, 4, 3), "float32"):
        with R.dataflow():
            y = R.nn.conv2d(x, w, padding=1, data_layout="NHWC", kernel_layout="HWIO")
            z = R.multiply(y, s)
            R.output(z)
        return z


_CONV_CONSTS = dict(w=CONV_W, mean=MEAN, std=STD, gamma=GAMMA, beta=BETA)
MUST_NOT_FIRE = {
    # statistics that are not constants (training-mode / runtime values): the first link breaks
    "statistic_is_a_parameter": (ConvBN, {k: v for k, v in _CONV_CONSTS.items() if k != "mean"}),
    "weight_is_a_parameter": (ConvBN, {k: v for k, v in _CONV_CONSTS.items() if k != "w"}),
    "anchor_output_also_returned": (ConvOutputAlsoReturned, dict(w=CONV_W, std=STD)),
    "anchor_has_a_second_consumer": (MatmulSecondConsumer, dict(w=MM_W, s=MM_S)),
    "constant_varies_along_rows": (MatmulRowConstant, dict(w=MM_W, s=np.array([[2], [4]], F32))),
    "divide_by_zero": (MatmulDivide, dict(w=MM_W, s=np.array([2, 0, 4], F32))),
    "divide_by_inf": (MatmulDivide, dict(w=MM_W, s=np.array([2, np.inf, 4], F32))),
    "constant_on_the_left": (MatmulConstantOnTheLeft, dict(w=MM_W, s=MM_S)),
    # (a (1, 3) bias: re-emitting it would reshape it to (3,), so a needless rewrite shows)
    "lone_bias_add_saves_nothing": (MatmulBiasOnly, dict(w=MM_W, b=MM_B.reshape(1, 3))),
    "conv_not_nchw_oihw": (ConvNHWC, dict(w=np.ones((3, 3, 2, 3), F32), s=MM_S)),
}


@pytest.mark.parametrize("case", sorted(MUST_NOT_FIRE))
def test_fold_batch_norm_must_not_fire(case):
    mod, consts = MUST_NOT_FIRE[case]
    before = _bind(mod, **consts)
    tvm.ir.assert_structural_equal(FoldBatchNorm(before), before)


@I.ir_module
class MatmulInterleaved:
    @R.function
    def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 3), "float32"), s: R.Tensor((3,), "float32")):
        with R.dataflow():
            y = R.matmul(x, w)
            u = R.nn.relu(x)  # not part of the chain, bound between the anchor and its link
            z = R.multiply(y, s)
            t = (z, u)
            R.output(t)
        return t


def test_fold_keeps_unrelated_bindings_inside_the_chain_span():
    after = FoldBatchNorm(_bind(MatmulInterleaved, w=MM_W, s=MM_S))
    _check_well_formed(after)  # raised "DataflowVar u is not defined" before the fix
    assert sorted(_op_names(after)) == ["relax.matmul", "relax.nn.relu"]


# ====================================================================== MarkConstantParams
@I.ir_module
class MarkBefore:
    @T.prim_func(private=True, s_tir=True)
    def mm(X: T.Buffer((2, 4), "float32"), W: T.Buffer((4, 4), "float32"), Y: T.Buffer((2, 4), "float32")):
        for i, j, k in T.grid(2, 4, 4):
            with T.sblock("mm"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    Y[vi, vj] = T.float32(0)
                Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vk, vj]

    @T.prim_func(private=True, s_tir=True)
    def add(A: T.Buffer((2, 4), "float32"), B: T.Buffer((2, 4), "float32"), C: T.Buffer((2, 4), "float32")):
        for i, j in T.grid(2, 4):
            with T.sblock("add"):
                vi, vj = T.axis.remap("SS", [i, j])
                C[vi, vj] = A[vi, vj] + B[vi, vj]

    @T.prim_func(private=True, s_tir=True)
    def scale(S: T.Buffer((2, 4), "float32"), A: T.Buffer((2, 4), "float32"), C: T.Buffer((2, 4), "float32")):
        for i, j in T.grid(2, 4):
            with T.sblock("scale"):
                vi, vj = T.axis.remap("SS", [i, j])
                C[vi, vj] = S[vi, vj] * A[vi, vj]

    @R.function
    def main(x: R.Tensor((2, 4), "float32"), y: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32"),
             b: R.Tensor((2, 4), "float32"), s: R.Tensor((2, 4), "float32")) -> R.Tensor((2, 4), "float32"):
        cls = MarkBefore
        with R.dataflow():
            lv = R.call_tir(cls.mm, (x, w), out_ty=R.Tensor((2, 4), "float32"))  # w constant here
            lv1 = R.call_tir(cls.add, (lv, b), out_ty=R.Tensor((2, 4), "float32"))  # b constant here ...
            lv2 = R.call_tir(cls.add, (lv1, y), out_ty=R.Tensor((2, 4), "float32"))  # ... y is not
            lv3 = R.call_tir(cls.scale, (s, lv2), out_ty=R.Tensor((2, 4), "float32"))
            lv4 = R.call_tir(cls.scale, (s, lv3), out_ty=R.Tensor((2, 4), "float32"))
            R.output(lv4)
        return lv4


@I.ir_module
class MarkExpected:
    @T.prim_func(private=True, s_tir=True)
    def mm(X: T.Buffer((2, 4), "float32"), W: T.Buffer((4, 4), "float32"), Y: T.Buffer((2, 4), "float32")):
        T.func_attr({"tvmfuse.constant_params": [1]})
        for i, j, k in T.grid(2, 4, 4):
            with T.sblock("mm"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    Y[vi, vj] = T.float32(0)
                Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vk, vj]

    @T.prim_func(private=True, s_tir=True)
    def add(A: T.Buffer((2, 4), "float32"), B: T.Buffer((2, 4), "float32"), C: T.Buffer((2, 4), "float32")):
        for i, j in T.grid(2, 4):
            with T.sblock("add"):
                vi, vj = T.axis.remap("SS", [i, j])
                C[vi, vj] = A[vi, vj] + B[vi, vj]

    @T.prim_func(private=True, s_tir=True)
    def scale(S: T.Buffer((2, 4), "float32"), A: T.Buffer((2, 4), "float32"), C: T.Buffer((2, 4), "float32")):
        T.func_attr({"tvmfuse.constant_params": [0]})
        for i, j in T.grid(2, 4):
            with T.sblock("scale"):
                vi, vj = T.axis.remap("SS", [i, j])
                C[vi, vj] = S[vi, vj] * A[vi, vj]

    @R.function
    def main(x: R.Tensor((2, 4), "float32"), y: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32"),
             b: R.Tensor((2, 4), "float32"), s: R.Tensor((2, 4), "float32")) -> R.Tensor((2, 4), "float32"):
        cls = MarkExpected
        with R.dataflow():
            lv = R.call_tir(cls.mm, (x, w), out_ty=R.Tensor((2, 4), "float32"))
            lv1 = R.call_tir(cls.add, (lv, b), out_ty=R.Tensor((2, 4), "float32"))
            lv2 = R.call_tir(cls.add, (lv1, y), out_ty=R.Tensor((2, 4), "float32"))
            lv3 = R.call_tir(cls.scale, (s, lv2), out_ty=R.Tensor((2, 4), "float32"))
            lv4 = R.call_tir(cls.scale, (s, lv3), out_ty=R.Tensor((2, 4), "float32"))
            R.output(lv4)
        return lv4


_MARK_CONSTS = dict(w=np.eye(4), b=np.ones((2, 4)), s=np.full((2, 4), 2))


def test_mark_constant_params_golden():
    """mm: W constant at its only call -> [1]; scale: S constant at both calls -> [0]; add: B is a
    constant at one call and an activation at the other -> no attribute at all."""
    after = MarkConstantParams(_bind(MarkBefore, **_MARK_CONSTS))
    tvm.ir.assert_structural_equal(after, _bind(MarkExpected, **_MARK_CONSTS))
    assert CONSTANT_PARAMS not in (after["add"].attrs or {})


def test_mark_constant_params_must_not_fire_without_constants():
    before = MarkBefore  # nothing bound: every argument is a parameter of main
    tvm.ir.assert_structural_equal(MarkConstantParams(before), before)


# ====================================================================== pack_at_build_time + PrepackWeights
@I.ir_module
class PackBefore:
    @T.prim_func(private=True, s_tir=True)
    def mm(X: T.Buffer((4, 8), "float32"), W: T.Buffer((8, 8), "float32"), Y: T.Buffer((4, 8), "float32")):
        T.func_attr({"tirx.noalias": True})
        Wp = T.sblock_alloc_buffer((2, 8, 4), "float32")
        for j0, k, j1 in T.grid(2, 8, 4):
            with T.sblock("pack"):  # the packing copy a schedule puts in front of the matmul
                vj0, vk, vj1 = T.axis.remap("SSS", [j0, k, j1])
                Wp[vj0, vk, vj1] = W[vk, vj0 * 4 + vj1]
        for i, j, k in T.grid(4, 8, 8):
            with T.sblock("matmul"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    Y[vi, vj] = T.float32(0)
                Y[vi, vj] = Y[vi, vj] + X[vi, vk] * Wp[vj // 4, vk, vj % 4]

    @T.prim_func(private=True, s_tir=True)
    def relu(A: T.Buffer((4, 8), "float32"), B: T.Buffer((4, 8), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i, j in T.grid(4, 8):
            with T.sblock("relu"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = T.max(A[vi, vj], T.float32(0))

    @R.function
    def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        cls = PackBefore
        with R.dataflow():
            y = R.call_tir(cls.mm, (x, w), out_ty=R.Tensor((4, 8), "float32"))
            o = R.call_tir(cls.relu, (y,), out_ty=R.Tensor((4, 8), "float32"))
            R.output(o)
        return o


@I.ir_module
class PackMarked:
    """What MarkConstantParams + pack_at_build_time make of PackBefore's mm (w constant)."""

    @T.prim_func(private=True, s_tir=True)
    def mm(X: T.Buffer((4, 8), "float32"), W: T.Buffer((8, 8), "float32"), Y: T.Buffer((4, 8), "float32")):
        T.func_attr({"tirx.noalias": True, "tvmfuse.constant_params": [1]})
        with T.sblock("root"):
            T.reads()
            T.writes()
            T.sblock_attr({"tvmfuse.prepack": True})
            Wp = T.sblock_alloc_buffer((2, 8, 4), "float32")
            for j0, k, j1 in T.grid(2, 8, 4):
                with T.sblock("pack"):
                    vj0, vk, vj1 = T.axis.remap("SSS", [j0, k, j1])
                    T.reads(W[vk, vj0 * 4 + vj1])
                    T.writes(Wp[vj0, vk, vj1])
                    T.sblock_attr({"meta_schedule.layout_rewrite_preproc": True})
                    Wp[vj0, vk, vj1] = W[vk, vj0 * 4 + vj1]
            for i, j, k in T.grid(4, 8, 8):
                with T.sblock("matmul"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    T.reads(X[vi, vk], Wp[vj // 4, vk, vj % 4])
                    T.writes(Y[vi, vj])
                    with T.init():
                        Y[vi, vj] = T.float32(0)
                    Y[vi, vj] = Y[vi, vj] + X[vi, vk] * Wp[vj // 4, vk, vj % 4]

    @T.prim_func(private=True, s_tir=True)
    def relu(A: T.Buffer((4, 8), "float32"), B: T.Buffer((4, 8), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i, j in T.grid(4, 8):
            with T.sblock("relu"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = T.max(A[vi, vj], T.float32(0))

    @R.function
    def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        cls = PackMarked
        with R.dataflow():
            y = R.call_tir(cls.mm, (x, w), out_ty=R.Tensor((4, 8), "float32"))
            o = R.call_tir(cls.relu, (y,), out_ty=R.Tensor((4, 8), "float32"))
            R.output(o)
        return o


@I.ir_module
class PackExpected:
    """After PrepackWeights: the kernel reads the packed weight, a constant computed at build time."""

    @T.prim_func(private=True, s_tir=True)
    def mm_prepacked(X: T.Buffer((4, 8), "float32"), Wp: T.Buffer((2, 8, 4), "float32"),
                     Y: T.Buffer((4, 8), "float32")):
        T.func_attr({"tirx.noalias": True, "tvmfuse.constant_params": [1]})
        for i, j, k in T.grid(4, 8, 8):
            with T.sblock("matmul"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                T.reads(X[vi, vk], Wp[vj // 4, vk, vj % 4])
                T.writes(Y[vi, vj])
                with T.init():
                    Y[vi, vj] = T.float32(0)
                Y[vi, vj] = Y[vi, vj] + X[vi, vk] * Wp[vj // 4, vk, vj % 4]

    @T.prim_func(private=True, s_tir=True)
    def relu(A: T.Buffer((4, 8), "float32"), B: T.Buffer((4, 8), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i, j in T.grid(4, 8):
            with T.sblock("relu"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = T.max(A[vi, vj], T.float32(0))

    @R.function
    def main(x: R.Tensor((4, 8), "float32"), wp: R.Tensor((2, 8, 4), "float32")) -> R.Tensor((4, 8), "float32"):
        cls = PackExpected
        with R.dataflow():
            y = R.call_tir(cls.mm_prepacked, (x, wp), out_ty=R.Tensor((4, 8), "float32"))
            o = R.call_tir(cls.relu, (y,), out_ty=R.Tensor((4, 8), "float32"))
            R.output(o)
        return o


PACK_W = (np.arange(64) % 9 - 4).astype(F32).reshape(8, 8)
PACK_WP = PACK_W.reshape(8, 2, 4).transpose(1, 0, 2).copy()  # Wp[j0, k, j1] = W[k, 4 * j0 + j1]


def _mark_and_schedule(mod):
    """MarkConstantParams, then what a schedule rule does (cpu_matmul / cpu_conv): offer the
    packing block to pack_at_build_time. Returns (module, whether it marked the block)."""
    mod = MarkConstantParams(mod)
    sch = s_tir.Schedule(mod["mm"])
    marked = pack_at_build_time(sch, sch.get_sblock("pack"))
    out = mod.clone() if hasattr(mod, "clone") else tvm.IRModule(dict(mod.functions_items()))
    out["mm"] = sch.mod["main"]
    return out, marked


def _prepack(mod):
    with tvm.target.Target("llvm"), tvm.transform.PassContext(opt_level=3):
        return PrepackWeights(mod)


def test_pack_at_build_time_marks_the_packing_of_a_constant_weight_golden():
    mod, marked = _mark_and_schedule(_bind(PackBefore, w=PACK_W))
    assert marked
    tvm.ir.assert_structural_equal(mod, _bind(PackMarked, w=PACK_W))


def test_prepack_weights_golden():
    marked, _ = _mark_and_schedule(_bind(PackBefore, w=PACK_W))
    after = _prepack(marked)
    tvm.ir.assert_structural_equal(after, _bind(PackExpected, wp=PACK_WP))
    assert PREPROC not in after.script()
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(F32)
    ref = np.maximum(x @ PACK_W, 0)
    np.testing.assert_allclose(_run(marked, x), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_run(after, x), ref, rtol=1e-5, atol=1e-5)


def test_prepack_weights_output_is_well_formed():
    marked, _ = _mark_and_schedule(_bind(PackBefore, w=PACK_W))
    after = _prepack(marked)
    _check_well_formed(after)
    tvm.ir.assert_structural_equal(after, _bind(PackExpected, wp=PACK_WP))


def test_prepack_weights_must_not_fire_for_a_non_constant_weight():
    before = PackBefore  # w stays a parameter: MarkConstantParams lists nothing for mm
    mod, marked = _mark_and_schedule(before)
    assert not marked
    tvm.ir.assert_structural_equal(mod, before)
    tvm.ir.assert_structural_equal(_prepack(mod), before)


def test_prepack_weights_must_not_fire_without_a_marked_block():
    """Constant weight, constant_params stamped, but no rule marked the packing: unchanged."""
    before = MarkConstantParams(_bind(PackBefore, w=PACK_W))
    assert [int(i) for i in before["mm"].attrs[CONSTANT_PARAMS]] == [1]
    tvm.ir.assert_structural_equal(_prepack(before), before)


@I.ir_module
class PackInplaceUser:
    @T.prim_func(private=True, s_tir=True)
    def mm(X: T.Buffer((4, 8), "float32"), W: T.Buffer((8, 8), "float32"), Y: T.Buffer((4, 8), "float32")):
        T.func_attr({"tirx.noalias": True})
        Wp = T.sblock_alloc_buffer((2, 8, 4), "float32")
        for j0, k, j1 in T.grid(2, 8, 4):
            with T.sblock("pack"):
                vj0, vk, vj1 = T.axis.remap("SSS", [j0, k, j1])
                Wp[vj0, vk, vj1] = W[vk, vj0 * 4 + vj1]
        for i, j, k in T.grid(4, 8, 8):
            with T.sblock("matmul"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    Y[vi, vj] = T.float32(0)
                Y[vi, vj] = Y[vi, vj] + X[vi, vk] * Wp[vj // 4, vk, vj % 4]

    @T.prim_func(private=True, s_tir=True)
    def relu_inplace(A: T.Buffer((4, 8), "float32")):
        for i, j in T.grid(4, 8):
            with T.sblock("relu"):
                vi, vj = T.axis.remap("SS", [i, j])
                A[vi, vj] = T.max(A[vi, vj], T.float32(0))

    @R.function
    def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        cls = PackInplaceUser
        with R.dataflow():
            y = R.call_tir(cls.mm, (x, w), out_ty=R.Tensor((4, 8), "float32"))
            o = R.call_tir_inplace(cls.relu_inplace, (y,), inplace_indices=[0], out_ty=R.Tensor((4, 8), "float32"))
            R.output(o)
        return o


def test_prepack_weights_keeps_primfuncs_called_otherwise():
    marked, ok = _mark_and_schedule(_bind(PackInplaceUser, w=PACK_W))
    assert ok
    after = _prepack(marked)
    assert "relu_inplace" in [gv.name_hint for gv in after.get_global_vars()]
    _check_well_formed(after)
