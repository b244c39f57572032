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
