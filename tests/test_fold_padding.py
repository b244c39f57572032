"""FoldExplicitPadding (tvmfuse/passes/fold_padding.py): golden Before/Expected IR, the cases where it
must not fire, and numerics of the folded conv against the explicit pad."""
import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R

from tvmfuse.passes.fold_padding import FoldExplicitPadding


def _run(mod, *args):
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


@I.ir_module
class SamePadding:  # TF "same" padding of a stride-2 depthwise conv: bottom/right only
    @R.function
    def main(x: R.Tensor((1, 4, 8, 8), "float32"), w: R.Tensor((4, 1, 3, 3), "float32")):
        with R.dataflow():
            p = R.nn.pad(x, [0, 0, 0, 0, 0, 1, 0, 1])
            y = R.nn.conv2d(p, w, strides=2, groups=4)
            o = R.nn.relu(y)
            R.output(o)
        return o


@I.ir_module
class SamePaddingFolded:
    @R.function
    def main(x: R.Tensor((1, 4, 8, 8), "float32"), w: R.Tensor((4, 1, 3, 3), "float32")):
        with R.dataflow():
            y = R.nn.conv2d(x, w, strides=2, padding=[0, 0, 1, 1], groups=4)
            o = R.nn.relu(y)
            R.output(o)
        return o


@I.ir_module
class PadOnPadding:  # a conv with padding of its own, after an explicit pad: the widths add up
    @R.function
    def main(x: R.Tensor((1, 2, 6, 6), "float32"), w: R.Tensor((3, 2, 3, 3), "float32")):
        with R.dataflow():
            p = R.nn.pad(x, [0, 0, 0, 0, 2, 0, 1, 3])
            y = R.nn.conv2d(p, w, padding=1)
            R.output(y)
        return y


@I.ir_module
class PadOnPaddingFolded:
    @R.function
    def main(x: R.Tensor((1, 2, 6, 6), "float32"), w: R.Tensor((3, 2, 3, 3), "float32")):
        with R.dataflow():
            y = R.nn.conv2d(x, w, padding=[3, 2, 1, 4])
            R.output(y)
        return y


@I.ir_module
class ZeroPad:  # an all-zero pad is the identity
    @R.function
    def main(x: R.Tensor((1, 2, 6, 6), "float32")):
        with R.dataflow():
            p = R.nn.pad(x, [0, 0, 0, 0, 0, 0, 0, 0])
            o = R.nn.relu(p)
            R.output(o)
        return o


@I.ir_module
class ZeroPadDropped:
    @R.function
    def main(x: R.Tensor((1, 2, 6, 6), "float32")):
        with R.dataflow():
            o = R.nn.relu(x)
            R.output(o)
        return o


@pytest.mark.parametrize("before,expected,shapes", [
    (SamePadding, SamePaddingFolded, [(1, 4, 8, 8), (4, 1, 3, 3)]),
    (PadOnPadding, PadOnPaddingFolded, [(1, 2, 6, 6), (3, 2, 3, 3)]),
    (ZeroPad, ZeroPadDropped, [(1, 2, 6, 6)]),
])
def test_fold_explicit_padding_golden(before, expected, shapes):
    after = relax.transform.DeadCodeElimination()(FoldExplicitPadding(before))
    tvm.ir.assert_structural_equal(after, expected)
    args = [np.random.default_rng(i).standard_normal(s).astype("float32") for i, s in enumerate(shapes)]
    np.testing.assert_allclose(_run(after, *args), _run(before, *args), rtol=1e-5, atol=1e-5)


@I.ir_module
class NonZeroValue:
    @R.function
    def main(x: R.Tensor((1, 2, 6, 6), "float32"), w: R.Tensor((3, 2, 3, 3), "float32")):
        with R.dataflow():
            p = R.nn.pad(x, [0, 0, 0, 0, 1, 1, 1, 1], pad_value=1.0)
            y = R.nn.conv2d(p, w)
            R.output(y)
        return y


@I.ir_module
class ReflectMode:
    @R.function
    def main(x: R.Tensor((1, 2, 6, 6), "float32"), w: R.Tensor((3, 2, 3, 3), "float32")):
        with R.dataflow():
            p = R.nn.pad(x, [0, 0, 0, 0, 1, 1, 1, 1], pad_mode="reflect")
            y = R.nn.conv2d(p, w)
            R.output(y)
        return y


@I.ir_module
class ChannelPad:
    @R.function
    def main(x: R.Tensor((1, 2, 6, 6), "float32"), w: R.Tensor((3, 4, 3, 3), "float32")):
        with R.dataflow():
            p = R.nn.pad(x, [0, 0, 1, 1, 0, 0, 0, 0])
            y = R.nn.conv2d(p, w)
            R.output(y)
        return y


@I.ir_module
class PadAlsoAnOutput:  # the conv folds, the pad stays for its other reader
    @R.function
    def main(x: R.Tensor((1, 2, 6, 6), "float32"), w: R.Tensor((3, 2, 3, 3), "float32")):
        with R.dataflow():
            p = R.nn.pad(x, [0, 0, 0, 0, 1, 1, 1, 1])
            y = R.nn.conv2d(p, w)
            R.output(p, y)
        return (p, y)


@pytest.mark.parametrize("before", [NonZeroValue, ReflectMode, ChannelPad])
def test_fold_explicit_padding_must_not_fire(before):
    tvm.ir.assert_structural_equal(FoldExplicitPadding(before), before)


def test_a_pad_with_another_reader_stays():
    after = relax.transform.DeadCodeElimination()(FoldExplicitPadding(PadAlsoAnOutput))
    ops = [bd.value.op.name for blk in after["main"].body.blocks for bd in blk.bindings
           if isinstance(bd.value, relax.Call)]
    assert ops == ["relax.nn.pad", "relax.nn.conv2d"]
    conv = [bd.value for blk in after["main"].body.blocks for bd in blk.bindings
            if isinstance(bd.value, relax.Call) and bd.value.op.name == "relax.nn.conv2d"][0]
    assert [int(v) for v in conv.attrs.padding] == [1, 1, 1, 1] and conv.args[0].name == "x"
