import os
import sys

# a schedule rule or pass that raises an unexpected error fails the test instead of falling back
# (tvmfuse/config.py's `strict` knob); set before tvmfuse is imported, inherited by subprocesses
os.environ.setdefault("TVMFUSE_STRICT", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import pytest

import tvmfuse
from tvmfuse.zoo import workloads
from tvmfuse.install import install_once

# The suite's process runs as a program after its first tvmfuse build does, whichever test comes
# first (a test that runs TVM kernels before any build would otherwise start TVM's pool at its own
# default size). Import itself sets nothing: tests/test_import_side_effects.py checks that.
install_once()



def pytest_xdist_auto_num_workers(config):
    """`-n auto` (setup.cfg): one test worker per core, at most 4 (each worker holds torch, TVM and
    the models it built; most tests run one thread at a time, so a core per worker is what helps)."""
    from tvmfuse.target import num_cores

    return max(1, min(4, num_cores()))


_BUILDS = {}


def built(name, fusion, target="llvm", size="small"):
    """Build cache shared by the tests (a build is ~0.1-0.5 s; many tests read the same one)."""
    key = (name, fusion, target, size)
    if key not in _BUILDS:
        _BUILDS[key] = tvmfuse.build(workloads.get(name, size).mod, target, fusion)
    return _BUILDS[key]


_MODELS = {}


def real_model(name, size="small"):
    """Real-model cache shared by the test files (tvmfuse.zoo.models: each import is a torch.export
    and a constant fold, 1-5 s; bert-tiny, gpt2-tiny, llama-tiny and resnet-tiny are read by several
    files). Tests only read the Workload and its module."""
    from tvmfuse.zoo import models

    if (name, size) not in _MODELS:
        _MODELS[name, size] = models.get(name, size)
    return _MODELS[name, size]


def built_model(name, fusion, size="small"):
    """Build cache of real_model(name, size) under `fusion` for llvm, shared like `built`."""
    key = ("model", name, fusion, size)
    if key not in _BUILDS:
        _BUILDS[key] = tvmfuse.build(real_model(name, size).mod, "llvm", fusion)
    return _BUILDS[key]


def assert_matches(out, ref, rtol, atol):
    out = out if isinstance(out, tuple) else (out,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    assert len(out) == len(ref)
    for o, r in zip(out, ref):
        np.testing.assert_allclose(o, r, rtol=rtol, atol=atol)


@pytest.fixture
def build_cached():
    return built


def conv_module(x_shape, wv, bv, stride=1, padding=None, groups=1, dilation=1, const_weight=True, clip=None):
    """main(x) = relu(conv2d(x, W) + b), W the constant `wv` (or a second input `w` when
    const_weight is False), padding k // 2 unless given; `clip` = (lo, hi) for a clip instead of
    relu (ReLU6). The conv + bias + activation the conv schedule and conv rewrite tests build."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(tuple(x_shape), "float32"))
    params = [x]
    if const_weight:
        weight = relax.const(wv)
    else:
        weight = relax.Var("w", relax.TensorType(wv.shape, "float32"))
        params.append(weight)
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, weight, strides=stride, groups=groups, dilation=dilation,
                                           padding=wv.shape[-1] // 2 if padding is None else padding))
            y = relax.op.add(y, relax.const(bv))
            out = bb.emit_output(relax.op.nn.relu(y) if clip is None else relax.op.clip(y, *clip))
        bb.emit_func_output(out)
    return bb.get()


def kernel_rules(compiled) -> dict:
    """{kernel name: its tvmfuse.rule} of a build."""
    import tvm

    return {gv.name_hint: str(f.attrs["tvmfuse.rule"]) for gv, f in compiled.mod.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and "tvmfuse.rule" in f.attrs}
