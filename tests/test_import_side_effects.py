"""`import tvmfuse` has no side effects (issue 32): no environment variable set, BlockBuilder.call_te
not patched, no TVM global function or TIR pipeline registered, no exit hook or thread started,
no torch / onnx / onnxruntime / transformers / xgboost imported. What a build needs is set up on
the first build (tvmfuse/install.py), with the behaviour `import tvmfuse` used to give.

Each check runs in a fresh interpreter: this one has imported and built with tvmfuse already."""
import json
import os
import subprocess
import sys

import pytest

from tvmfuse import target

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = ("torch", "onnx", "onnxruntime", "transformers", "xgboost")
THREAD_VARS = ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "TVM_THREAD_POOL_SPIN_COUNT")

_SNAPSHOT = r"""
import atexit, builtins, json, os, sys, threading
import tvm, tvm_ffi
from tvm import relax
from tvm.tirx import compilation_pipeline as cp

HEAVY = %r
call_te = relax.BlockBuilder.call_te

def snap():
    return {"environ": dict(os.environ), "call_te": relax.BlockBuilder.call_te is call_te,
            "funcs": sorted(tvm_ffi.registry.list_global_func_names()), "tir_pipelines": sorted(cp.PIPELINE_MAP),
            "atexit": atexit._ncallbacks(), "threads": threading.active_count()}

asked, real_import = [], builtins.__import__
def spy(name, globals=None, locals=None, fromlist=(), level=0):  # `import torch` even where it is loaded
    if level == 0 and name.partition(".")[0] in HEAVY:
        asked.append(name)
    return real_import(name, globals, locals, fromlist, level)

before, modules = snap(), set(sys.modules)
builtins.__import__ = spy
import tvmfuse
after_import, new = snap(), sorted(set(sys.modules) - modules)
from tvmfuse import tune  # the lazily loaded tuning package starts nothing either
builtins.__import__ = real_import
print(json.dumps({"before": before, "import": after_import, "tune": snap(), "asked": asked, "new": new}))
"""

# the heavy packages made unimportable (as in an install without them): nothing may ask for them
_HIDDEN = r"""
import importlib.abc, json, sys
HEAVY, asked = %r, []

class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HEAVY:
            asked.append(name)
            raise ModuleNotFoundError(f"hidden by the test: {name}", name=name)
        return None

sys.meta_path.insert(0, Hide())
import tvm  # tvm_ffi asks for torch (and goes on without it): TVM's own choice, not tvmfuse's
del asked[:]
import tvmfuse
print(json.dumps({"asked": asked, "loaded": sorted(m for m in sys.modules if m.partition(".")[0] in HEAVY)}))
"""

_FIRST_BUILD = r"""
import json, os
vars_ = %r
import tvmfuse, tvm
from tvm import relax
import numpy as np
before = {v: os.environ.get(v) for v in vars_}
bb = relax.BlockBuilder()
x = relax.Var("x", relax.TensorType((64, 64), "float32"))
with bb.function("main", [x]):
    with bb.dataflow():
        out = bb.emit_output(relax.op.exp(relax.op.add(x, x)))
    bb.emit_func_output(out)
c = tvmfuse.build(bb.get(), "llvm", "tvmfuse")
ok = bool(np.allclose(c(np.ones((64, 64), "float32")), np.exp(2.0), rtol=1e-5))
print(json.dumps({"before": before, "after": {v: os.environ.get(v) for v in vars_}, "ok": ok,
                  "launches": c.launches, "threads": tvm.runtime.num_threads()}))
"""


def _run(code, env=None):
    env = {**(os.environ if env is None else env), "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _clean_env():
    return {k: v for k, v in os.environ.items() if k not in THREAD_VARS}


@pytest.fixture(scope="module")
def snapshots():
    return _run(_SNAPSHOT % (HEAVY,), _clean_env())


@pytest.mark.parametrize("stage", ["import", "tune"])
def test_import_changes_nothing(snapshots, stage):
    before, after = snapshots["before"], snapshots[stage]
    assert after["environ"] == before["environ"]
    assert after["call_te"], "relax.BlockBuilder.call_te is no longer TVM's"
    assert after["funcs"] == before["funcs"]
    assert after["tir_pipelines"] == before["tir_pipelines"]
    assert after["atexit"] == before["atexit"]
    assert after["threads"] == before["threads"]


def test_import_asks_for_no_heavy_package(snapshots):
    assert snapshots["asked"] == []
    assert not [m for m in snapshots["new"] if m.partition(".")[0] in HEAVY]


def test_import_without_the_heavy_packages():
    res = _run(_HIDDEN % (HEAVY,))
    assert res["asked"] == []
    assert "torch" not in res["loaded"] and "onnx" not in res["loaded"] and "onnxruntime" not in res["loaded"]
    assert res["loaded"] == []


def test_first_build_sets_the_thread_pool_up():
    """The first build sizes TVM's pool to the cores and bounds its spin, as `import tvmfuse` did."""
    res = _run(_FIRST_BUILD % (THREAD_VARS,), _clean_env())
    assert res["before"] == {v: None for v in THREAD_VARS}  # import alone set nothing
    assert res["after"]["TVM_NUM_THREADS"] == str(target.num_cores())
    assert res["after"]["TVM_THREAD_POOL_SPIN_COUNT"] == str(target.SPIN_COUNT)
    assert res["after"]["OMP_NUM_THREADS"] is None
    assert res["threads"] == target.num_cores()
    assert res["ok"] and res["launches"] == 1  # add + exp composed into one kernel (te_compose)


def test_first_build_keeps_the_users_choice():
    env = {**_clean_env(), "OMP_NUM_THREADS": "1", "TVM_THREAD_POOL_SPIN_COUNT": "7"}
    res = _run(_FIRST_BUILD % (THREAD_VARS,), env)
    assert res["after"] == {"TVM_NUM_THREADS": None, "OMP_NUM_THREADS": "1", "TVM_THREAD_POOL_SPIN_COUNT": "7"}
    assert res["threads"] == 1
    assert res["ok"]


def test_call_te_is_tvms_after_a_build():
    """te_compose's recording call_te is on BlockBuilder only while tvmfuse composes TE."""
    import numpy as np
    from tvm import relax

    import tvmfuse
    from tvmfuse.fusion import te_compose

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.softmax(relax.op.multiply(x, x), axis=-1))
        bb.emit_func_output(out)
    c = tvmfuse.build(bb.get(), "llvm", "tvmfuse")
    assert c.launches == 1  # the legalizers' TE was recorded and composed
    xn = np.random.default_rng(0).standard_normal((8, 16)).astype("float32")
    e = np.exp(xn * xn - (xn * xn).max(-1, keepdims=True))
    np.testing.assert_allclose(c(xn), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    assert relax.BlockBuilder.call_te is te_compose._ORIG_CALL_TE
    assert te_compose._PATCH_USERS == 0
    with te_compose.recording_call_te():
        assert relax.BlockBuilder.call_te is te_compose._call_te
        with te_compose.recording_call_te():  # nested (or another thread): still installed
            pass
        assert relax.BlockBuilder.call_te is te_compose._call_te
    assert relax.BlockBuilder.call_te is te_compose._ORIG_CALL_TE


def test_register_pipeline_is_idempotent():
    from tvm.tirx import compilation_pipeline as cp

    from tvmfuse.passes.streaming_stores import PIPELINE, register_pipeline

    assert register_pipeline() == PIPELINE
    factory, names = cp.PIPELINE_MAP[PIPELINE], list(cp.PIPELINE_MAP)
    assert register_pipeline() == PIPELINE
    assert cp.PIPELINE_MAP[PIPELINE] is factory and list(cp.PIPELINE_MAP) == names
