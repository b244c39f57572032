"""tvmfuse.frontends.torch_tensors: torch tensors in and out of a build through DLPack. Inputs TVM
can take as they are go in as views, the rest as copies (unaligned, strided); outputs come back as
views of TVM's tensors, and an output that is an input comes back as a copy."""
import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import tvmfuse
from tvmfuse.errors import InputError
from tvmfuse.frontends import torch_tensors


def _module():
    """main(x, y) -> (x + y, x): the second output is an input, returned as is."""
    bb = relax.BlockBuilder()
    x, y = (relax.Var(n, relax.TensorType((4, 8), "float32")) for n in ("x", "y"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            s = bb.emit_output(relax.op.add(x, y))
            out = bb.emit_output(relax.Tuple([s, x]))
        bb.emit_func_output(out)
    return bb.get()


@pytest.fixture(scope="module")
def compiled():
    return tvmfuse.build(_module(), "llvm", "tvmfuse")


def test_aligned_inputs_are_views_and_outputs_match(compiled):
    """Aligned torch tensors go to the VM as they are (tvm-ffi's DLPack) and come back as torch."""
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    assert x.data_ptr() % torch_tensors.TVM_ALIGNMENT == 0
    view = torch_tensors.to_tvm(x)
    x[0, 0] = 7.0
    assert view.numpy()[0, 0] == 7.0  # no copy: TVM sees the write
    s, same = torch_tensors.call(compiled, [x, y])
    torch.testing.assert_close(s, x + y)
    torch.testing.assert_close(same, x)
    assert same.data_ptr() != x.data_ptr()  # the returned input is a copy, not the caller's tensor


def test_unaligned_and_strided_inputs_are_copied():
    base = torch.randn(5, 8)
    unaligned = base[1:]  # 32 bytes past an aligned start
    strided = torch.randn(8, 4).t()
    assert unaligned.data_ptr() % torch_tensors.TVM_ALIGNMENT
    for t in (unaligned, strided):
        np.testing.assert_array_equal(torch_tensors.to_tvm(t).numpy(), t.numpy())


def test_call_tensors_checks_its_inputs_like_numpy_ones(compiled):
    """Compiled.call_tensors (tvm.runtime Tensors in, no copy) checks shapes and dtypes as
    __call__ does; torch_tensors.call leaves that to dynamo's guards, which recompile first."""
    x = tvm.runtime.from_dlpack(torch.randn(4, 8))
    with pytest.raises(InputError, match="input 1 'y': expected shape"):
        compiled.call_tensors(x, tvm.runtime.from_dlpack(torch.randn(4, 9)))
    with pytest.raises(InputError, match="expected dtype float32, got float64"):
        compiled.call_tensors(x, tvm.runtime.from_dlpack(torch.randn(4, 8, dtype=torch.float64)))
    s, same = compiled.call_tensors(x, x)
    np.testing.assert_allclose(s.numpy(), 2 * x.numpy())


def test_outputs_written_in_place_are_returned_as_their_inputs():
    """An output the build writes into an input (passes/update_in_place.py) comes back as the
    caller's input tensor itself, holding the new value; an input that had to be copied (strided)
    leaves its output to come from the VM, and the caller's tensor untouched."""
    from tvmfuse.passes.update_in_place import UPDATES

    p, g, m = (relax.Var(n, relax.TensorType((8, 16), "float32")) for n in ("p", "g", "m"))
    bb = relax.BlockBuilder()
    with bb.function("main", [p, g, m]):  # SGD with momentum: m' = 0.9 m + g; p' = p - 0.1 m'
        with bb.dataflow():
            m2 = bb.emit(relax.op.add(relax.op.multiply(m, relax.const(0.9, "float32")), g))
            p2 = bb.emit(relax.op.subtract(p, relax.op.multiply(m2, relax.const(0.1, "float32"))))
            out = bb.emit_output(relax.Tuple([p2, m2]))
        bb.emit_func_output(out)
    mod = bb.get()
    mod["main"] = mod["main"].with_attr(UPDATES, {0: 0, 1: 2})
    built = tvmfuse.build(mod, "llvm", "tvmfuse")
    donated = {0: 0, 1: 2}
    p, g, m = (torch.randn(8, 16) for _ in range(3))
    want_m = 0.9 * m + g
    want_p = p - 0.1 * want_m
    p0, m0 = p.clone(), m.clone()
    new_p, new_m = torch_tensors.call(built, [p, g, m], donated)
    assert new_p is p and new_m is m
    torch.testing.assert_close(p, want_p)
    torch.testing.assert_close(m, want_m)
    strided = torch.empty(16, 8).t().copy_(p0)  # not contiguous: made dense before the call
    new_p, new_m = torch_tensors.call(built, [strided, g, m0.clone()], donated)
    assert new_p is not strided
    torch.testing.assert_close(new_p, want_p)
    torch.testing.assert_close(strided, p0)


def test_only_kernel_outputs_skip_the_aliasing_check():
    """An output a kernel writes is fresh memory; an input returned as it is, or a reshape of one
    (a view once lowered: its own kernel, built without fusion), may alias the caller's tensor:
    checked (and copied) at every call. Fused, the same reshape is a kernel's output: fresh."""
    bb = relax.BlockBuilder()
    x, y = (relax.Var(n, relax.TensorType((4, 8), "float32")) for n in ("x", "y"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            s = bb.emit(relax.op.add(x, y))
            v = bb.emit(relax.op.reshape(x, (8, 4)))
            out = bb.emit_output(relax.Tuple([s, v, x]))
        bb.emit_func_output(out)
    assert torch_tensors._fresh_outputs(tvmfuse.build(bb.get(), "llvm", "tvmfuse")) == {0, 1}
    built = tvmfuse.build(bb.get(), "llvm", "none")
    assert torch_tensors._fresh_outputs(built) == {0}
    xt, yt = torch.randn(4, 8), torch.randn(4, 8)
    s, v, same = torch_tensors.call(built, [xt, yt])
    torch.testing.assert_close(s, xt + yt)
    torch.testing.assert_close(v, xt.reshape(8, 4))
    assert v.data_ptr() != xt.data_ptr() and same.data_ptr() != xt.data_ptr()
