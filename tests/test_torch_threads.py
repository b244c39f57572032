"""tvmfuse.frontends.torch_threads: a build's kernels run their parallel loops on PyTorch's OpenMP
threads. The launcher gives each thread of the team one task; a build whose launcher pointer was
redirected computes what the build on TVM's own pool computes; where the launcher cannot be set up,
torch_tensors falls back to the build's own VM with the reason logged."""
import ctypes
import logging

import numpy as np
import pytest
import torch
from tvm import relax

import tvmfuse
from tvmfuse.frontends import torch_tensors, torch_threads

LAMBDA = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


class _Env(ctypes.Structure):
    _fields_ = [("sync_handle", ctypes.c_void_p), ("num_task", ctypes.c_int32)]


def _launcher():
    lib, why = torch_threads.launcher()
    if lib is None:
        pytest.skip(f"no OpenMP launcher here: {why}")
    return lib


@pytest.mark.parametrize("threads", [1, 2])
def test_the_launcher_gives_each_thread_of_torchs_team_one_task(threads):
    lib = _launcher()
    seen = []

    @LAMBDA
    def task(task_id, penv, cdata):
        env = ctypes.cast(penv, ctypes.POINTER(_Env)).contents
        seen.append((task_id, env.num_task))
        return 0

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert lib.tvmfuse_omp_parallel_launch(task, None, 0) == 0
    finally:
        torch.set_num_threads(before)
    assert sorted(seen) == [(i, threads) for i in range(threads)]


def test_a_failing_task_fails_the_launch():
    lib = _launcher()
    failing = LAMBDA(lambda task_id, penv, cdata: -1)
    assert lib.tvmfuse_omp_parallel_launch(failing, None, 1) == -1


def _matmul_relu():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((67, 96), "float32"))
    w = relax.Var("w", relax.TensorType((96, 80), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.matmul(x, w)))
        bb.emit_func_output(out)
    return bb.get()


def test_a_build_on_torchs_threads_computes_what_it_computes_on_tvms_pool():
    _launcher()
    compiled = tvmfuse.build(_matmul_relu(), "llvm", "tvmfuse")
    main = torch_threads.main_on_torch_threads(compiled)
    assert main is not None
    x, w = torch.randn(67, 96), torch.randn(96, 80)
    got = torch.from_dlpack(main(x, w))
    own = torch.from_dlpack(compiled._main()(x, w))
    torch.testing.assert_close(got, own, rtol=0, atol=0)
    np.testing.assert_allclose(got.numpy(), np.maximum(x.numpy() @ w.numpy(), 0), rtol=1e-5, atol=1e-4)


def test_without_the_launcher_calls_run_on_the_builds_own_vm_and_say_why(monkeypatch, caplog):
    monkeypatch.setattr(torch_threads, "launcher", lambda: (None, "no compiler for the test"))
    torch_threads._log_once.cache_clear()
    compiled = tvmfuse.build(_matmul_relu(), "llvm", "tvmfuse")
    x, w = torch.randn(67, 96), torch.randn(96, 80)
    with caplog.at_level(logging.INFO, logger="tvmfuse.torch"):
        (got,) = torch_tensors.call(compiled, [x, w])
    torch.testing.assert_close(got, torch.relu(x @ w), rtol=1e-5, atol=1e-4)
    assert "no compiler for the test" in caplog.text
