"""Bad input everywhere a user can hand something in: each gets a clear tvmfuse error (or a logged
fallback), never a bare traceback from deep inside TVM and never a crash of the process.

Covered: model files (missing, empty, garbage, truncated, unsupported op, Relay syntax error,
broken .py), modules (not a module, no main, opaque ops), run-time inputs (count, shape, rank,
dtype, symbolic dims, 0-d, non-contiguous), targets, tuning-log folders (missing, a file, garbage).
"""
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax import op as R

import tvmfuse
from tvmfuse.errors import (DeviceUnavailableError, FrontendError, InputError, TargetError, TvmfuseError,
                            UnknownWorkloadError)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mod(specs, body, dtype="float32"):
    bb = relax.BlockBuilder()
    params = [relax.Var(n, relax.TensorType(s, dtype)) for n, s in specs]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


@pytest.fixture(scope="module")
def add_relu():
    mod = _mod([("x", (4, 8)), ("y", (4, 8))], lambda bb, x, y: R.nn.relu(bb.emit(R.add(x, y))))
    return tvmfuse.build(mod, "llvm", "tvmfuse")


# ------------------------------------------------------------------------------ model files
def _onnx_bytes():
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Exp", ["r"], ["y"])],
                          "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m.SerializeToString()


def _unsupported_onnx_bytes():
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    node = helper.make_node("FancyOp", ["x"], ["y"], domain="com.example")
    g = helper.make_graph([node], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    m.ir_version = 8
    return m.SerializeToString()


def _relay_text():
    with open(os.path.join(ROOT, "tests", "relay", "mlp.txt")) as f:
        return f.read()


MODEL_FILES = {  # name -> (file content, what the error must say)
    "empty.onnx": (b"", "onnx"),
    "garbage.onnx": (b"\x08\x07not a protobuf at all\xff\xfe" * 8, "onnx"),
    "truncated.onnx": (lambda: _onnx_bytes()[: len(_onnx_bytes()) // 2], "truncated.onnx"),
    "unsupported.onnx": (_unsupported_onnx_bytes, "FancyOp"),
    "syntax.txt": (b'#[version = "0.0.5"]\ndef @main(%x: Tensor[(2, 3), float32]) {\n  nn.relu(%x\n}\n', "syntax.txt"),
    "truncated.txt": (lambda: _relay_text()[: len(_relay_text()) // 2].encode(), "truncated.txt"),
    "raises.py": (b"raise RuntimeError('boom')\n", "boom"),
    "nothing.py": (b"x = 1\n", "defines neither"),
}


@pytest.mark.parametrize("name", sorted(MODEL_FILES))
def test_malformed_model_file_is_a_frontend_error(name, tmp_path):
    from tvmfuse.loader import load_model

    content, says = MODEL_FILES[name]
    content = content() if callable(content) else content
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(FrontendError) as err:
        load_model(str(path))
    assert says in str(err.value)
    assert isinstance(err.value, TvmfuseError)


def test_missing_model_file_and_unknown_name(tmp_path):
    from tvmfuse.loader import load_model

    with pytest.raises(FrontendError, match="no such file"):
        load_model(str(tmp_path / "nope.onnx"))
    with pytest.raises(UnknownWorkloadError, match="unknown workload 'resnet9000'"):
        load_model("resnet9000")
    with pytest.raises(TvmfuseError):
        load_model(str(tmp_path))  # a folder is not a model


def test_cli_reports_a_truncated_model_without_a_traceback(tmp_path):
    path = tmp_path / "truncated.onnx"
    path.write_bytes(_onnx_bytes()[:40])
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "tune.py"), "--model", str(path)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode > 0, r  # an error exit, not a signal (a crash gives a negative code)
    assert "Traceback" not in r.stderr + r.stdout
    assert "truncated.onnx" in r.stderr + r.stdout


# ------------------------------------------------------------------------------ modules
@pytest.mark.parametrize("bad", [None, np.zeros(3), "def main(): pass", 42])
def test_build_rejects_what_is_not_a_module(bad):
    with pytest.raises(InputError, match="IRModule"):
        tvmfuse.build(bad, "llvm")


def test_build_rejects_a_module_without_main():
    mod = _mod([("x", (4,))], lambda bb, x: R.exp(x))
    other = tvm.IRModule({"forward": mod["main"]})
    with pytest.raises(InputError, match="no function 'main'.*forward"):
        tvmfuse.build(other, "llvm")


@tvm.register_global_func("tvmfuse_test.add_one")
def _add_one(x, out):
    out.copyfrom(x.numpy() + 1)


OPAQUE = {  # op -> (relax builder, numpy reference, what the fusion log says)
    "call_dps_packed": (lambda y: relax.call_dps_packed("tvmfuse_test.add_one", [y],
                                                        out_ty=relax.TensorType((4, 4), "float32")),
                        lambda a: a + 1, "external kernel"),
    "sort": (lambda y: R.sort(y, axis=-1), lambda a: np.sort(a, -1), "external kernel"),  # dispatched to a TIR kernel
    "cumsum": (lambda y: R.cumsum(y, axis=-1), lambda a: np.cumsum(a, -1), "external kernel"),
}


@pytest.mark.parametrize("fusion", ["none", "tvm", "tvmfuse"])
@pytest.mark.parametrize("op", sorted(OPAQUE))
def test_opaque_op_is_left_unfused_logged_and_runs(op, fusion, caplog):
    make, ref, says = OPAQUE[op]

    def body(bb, x):
        z = bb.emit(make(bb.emit(R.exp(x))))
        return R.multiply(bb.emit(R.negative(z)), x)

    mod = _mod([("x", (4, 4))], body)
    with caplog.at_level(logging.INFO, logger="tvmfuse.fusion"):
        c = tvmfuse.build(mod, "llvm", fusion)
    xn = np.random.default_rng(0).standard_normal((4, 4)).astype("float32")
    np.testing.assert_allclose(c(xn), -ref(np.exp(xn)) * xn, rtol=1e-5, atol=1e-6)
    if fusion == "tvmfuse":
        assert "opaque" in caplog.text and says in caplog.text
        assert c.launches == 2 + (op != "call_dps_packed")  # exp | opaque op | negative+multiply


# ------------------------------------------------------------------------------ run-time inputs
def test_wrong_input_count_shape_rank_dtype(add_relu):
    x = np.ones((4, 8), "float32")
    with pytest.raises(InputError, match="main takes 2 inputs"):
        add_relu()
    with pytest.raises(InputError, match="main takes 2 inputs"):
        add_relu(x, x, x)
    with pytest.raises(InputError, match=r"input 1 'y': expected shape \[4, 8\], got \[8, 4\]"):
        add_relu(x, x.T.copy())
    with pytest.raises(InputError, match=r"expected shape \[4, 8\], got \[32\]"):
        add_relu(x, x.ravel())
    with pytest.raises(InputError, match="expected dtype float32, got int64"):
        add_relu(x, [[1] * 8] * 4)  # a Python list becomes int64
    with pytest.raises(InputError, match=r"input 1 'y': expected shape \[4, 8\], got \[\]"):
        add_relu(x, None)
    with pytest.raises(InputError, match="expected dtype float32, got object"):
        add_relu(x, np.full((4, 8), None))


def test_unusual_but_valid_inputs_work(add_relu):
    x = np.arange(32, dtype="float32").reshape(8, 4).T  # non-contiguous view
    np.testing.assert_allclose(add_relu(x, x), np.maximum(2 * x, 0))
    scalar = _mod([("s", ()), ("v", (3,))], lambda bb, s, v: R.multiply(s, v))  # 0-d input (found by fuzzing)
    out = tvmfuse.build(scalar, "llvm", "tvmfuse")(np.array(2.0, "float32"), np.ones(3, "float32"))
    np.testing.assert_allclose(out, [2.0, 2.0, 2.0])


def test_symbolic_dims_are_checked_before_tvm_sees_them():
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(R.nn.relu(bb.emit(R.exp(x))))
        bb.emit_func_output(out)
    c = tvmfuse.build(bb.get(), "llvm", "tvmfuse")
    xn = np.zeros((3, 4), "float32")
    np.testing.assert_allclose(c(xn), np.ones((3, 4)))
    with pytest.raises(InputError, match=r"input 0 'x': expected shape \[n, 4\], got \[3, 5\]"):
        c(np.zeros((3, 5), "float32"))
    with pytest.raises(InputError, match=r"expected shape \[n, 4\], got \[12\]"):
        c(np.zeros(12, "float32"))


# ------------------------------------------------------------------------------ targets
@pytest.mark.parametrize("target", ["tpu", "", None, 42, "llvm -mcpu=znver4", {"kind": "no-such-kind"},
                                    ["llvm"]])
def test_unknown_or_malformed_target(target):
    mod = _mod([("x", (4,))], lambda bb, x: R.exp(x))
    with pytest.raises(TargetError):
        tvmfuse.build(mod, target)


def test_cuda_module_cannot_run_without_a_gpu_says_so():
    if tvm.cuda(0).exist:
        pytest.skip("a GPU is present")
    c = tvmfuse.build(_mod([("x", (4,))], lambda bb, x: R.exp(x)), "cuda")
    with pytest.raises(DeviceUnavailableError, match="no cuda device"):
        c(np.ones(4, "float32"))


# ------------------------------------------------------------------------------ tuning logs
def _build_with_logs(logs):
    mod = _mod([("x", (4, 8))], lambda bb, x: R.nn.relu(bb.emit(R.exp(x))))
    return tvmfuse.build(mod, "llvm", "tvmfuse", tuning_logs=logs)


def test_tuning_logs_that_are_not_a_folder_fall_back_with_a_log(tmp_path, caplog):
    pytest.importorskip("tvmfuse.tuning")
    afile = tmp_path / "logs.json"
    afile.write_text("{}")
    for logs in (str(tmp_path / "missing"), str(afile)):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="tvmfuse.tuning"):
            c = _build_with_logs(logs)
        assert c.launches == 1
        assert logs in caplog.text  # the fallback names the path it could not use


def test_tuning_logs_full_of_garbage_are_skipped_with_warnings(tmp_path, caplog):
    pytest.importorskip("tvmfuse.tuning")
    from tvmfuse.target import resolve
    from tvmfuse.tuning import target_key

    folder = tmp_path / target_key(resolve("llvm"))
    folder.mkdir()
    for name in ("database_workload.json", "database_tuning_record.json", "tasks.json"):
        (folder / name).write_bytes(b'{"truncated": [1, 2\n\x00\xff garbage\n[0, {"not": "a record"}]\n')
    with caplog.at_level(logging.WARNING, logger="tvmfuse.tuning"):
        c = _build_with_logs(str(tmp_path))
    assert c.launches == 1
    assert "skipping" in caplog.text


def _tuned_folder(tmp_path, record_target):
    """A logs folder for this machine's llvm key holding one winning record, tuned for `record_target`."""
    from tvm.s_tir import meta_schedule as ms

    from tvmfuse import pipeline
    from tvmfuse.target import resolve
    from tvmfuse.tuning import decisions, target_key
    from tvmfuse.tuning.database import DurableDatabase, workload_key
    from tvmfuse.tuning.tasks import normalize, tuning_form

    mod = _mod([("x", (4, 8))], lambda bb, x: R.nn.relu(bb.emit(R.exp(x))))
    with resolve("llvm"):
        fused = tvm.transform.Sequential(pipeline.graph_passes("tvmfuse"))(mod)
    name, func = next((gv.name_hint, f) for gv, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc))
    norm = normalize(tuning_form(func))  # the form tasks.extract tunes and apply_logs queries
    sch = tvm.s_tir.Schedule(norm)
    sch.parallel(sch.get_loops(sch.get_child_blocks(sch.get_sblock("root"))[-1])[0])
    folder = tmp_path / target_key(resolve("llvm"))
    db = DurableDatabase(str(folder))
    wl = db.commit_workload(norm)
    db.commit_tuning_record(ms.database.TuningRecord(sch.trace, wl, [1e-6], record_target,
                                                     ms.arg_info.ArgInfo.from_prim_func(norm["main"])))
    decisions.save(str(folder), decisions.Decision(workload=workload_key(norm), task=name, trials=8, default_ms=1.0,
                                                   tuned_ms=0.001, use_tuned=True, target=str(record_target)))
    return mod, folder


def _tuned_funcs(mod, logs):
    p = tvmfuse.prepare(mod, "llvm", "tvmfuse", tuning_logs=str(logs))
    return [gv.name_hint for gv, f in p.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and f.attrs.get("tvmfuse.tuned")]


def test_tuning_record_from_an_older_tvm_is_skipped_with_a_warning(tmp_path, caplog):
    pytest.importorskip("tvmfuse.tuning")
    from tvmfuse.target import resolve

    mod, folder = _tuned_folder(tmp_path, resolve("llvm"))
    assert _tuned_funcs(mod, tmp_path)  # the record as written is applied
    rec = folder / "database_tuning_record.json"  # TVM <= 0.26 wrote GetBlock, 0.27 has GetSBlock
    rec.write_text(rec.read_text().replace('"GetSBlock"', '"GetBlock"'))
    with caplog.at_level(logging.WARNING, logger="tvmfuse.tuning"):
        assert _tuned_funcs(mod, tmp_path) == []
    assert "database_tuning_record.json:1: skipping unreadable record" in caplog.text


def test_tuning_record_for_another_target_is_ignored_with_a_warning(tmp_path, caplog):
    pytest.importorskip("tvmfuse.tuning")
    from tvmfuse.target import resolve

    mod, _ = _tuned_folder(tmp_path, resolve("cuda"))
    with caplog.at_level(logging.WARNING, logger="tvmfuse.tuning"):
        assert _tuned_funcs(mod, tmp_path) == []
    assert "cuda" in caplog.text


# ------------------------------------------------------------------------------ safe defaults
def _sources():
    import ast

    for top in ("tvmfuse", "schedules", "scripts"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    with open(path) as fh:
                        yield os.path.relpath(path, ROOT), ast.parse(fh.read(), path)


def _imports(tree):
    import ast

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)


PICKLERS = {"pickle", "cPickle", "cloudpickle", "dill", "joblib", "shelve", "marshal"}
FETCHERS = {"urllib.request", "urllib3", "requests", "httpx", "http.client", "aiohttp", "ftplib",
            "huggingface_hub", "torch.hub", "wget"}


def test_no_pickle_no_network_fetchers_no_wildcard_binds():
    import ast

    found = []
    for path, tree in _sources():
        for name in _imports(tree):
            if name.split(".")[0] in PICKLERS or any(name == f or name.startswith(f + ".") for f in FETCHERS):
                found.append(f"{path}: imports {name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "0.0.0.0" in node.value:
                found.append(f"{path}:{node.lineno}: binds {node.value!r}")
            if isinstance(node, ast.Attribute) and node.attr in ("from_pretrained", "hf_hub_download"):
                found.append(f"{path}:{node.lineno}: calls .{node.attr} (may download)")
    assert not found, "\n".join(found)


def test_rpc_helpers_bind_to_loopback_by_default():
    import inspect

    rpc = pytest.importorskip("tvmfuse.tuning.rpc")
    for fn in (rpc.start_tracker, rpc.start_server, rpc.free_port):
        assert inspect.signature(fn).parameters["host"].default == "127.0.0.1", fn.__name__


def test_tuning_logs_are_json_lines(tmp_path):
    pytest.importorskip("tvmfuse.tuning")
    import json

    from tvmfuse.target import resolve

    _, folder = _tuned_folder(tmp_path, resolve("llvm"))
    files = [p for p in folder.iterdir() if p.is_file() and p.name != ".lock"]
    assert {p.name for p in files} >= {"database_workload.json", "database_tuning_record.json", "tasks.json"}
    for p in files:
        for line in p.read_text().splitlines():
            json.loads(line)  # every line is JSON: nothing binary, nothing pickled


GUARD = r"""
import socket, sys
LOCAL = ("127.0.0.1", "localhost", "::1", "0.0.0.0", None, "")
def _deny(host):
    if host not in LOCAL and not str(host).startswith("/"):
        sys.stderr.write(f"NETWORK ACCESS to {host!r}\n")
        raise OSError(f"network access to {host!r} denied by the test")
_orig_connect, _orig_gai = socket.socket.connect, socket.getaddrinfo
socket.socket.connect = lambda self, addr: (_deny(addr[0] if isinstance(addr, tuple) else addr), _orig_connect(self, addr))[1]
socket.getaddrinfo = lambda host, *a, **k: (_deny(host), _orig_gai(host, *a, **k))[1]
import numpy as np, tvmfuse
from tvmfuse.zoo import models
from tvmfuse.loader import load_model
# a full-size model is built as the user's loader builds it (transformers' config and module, where
# the hub could be reached), then stops where models._torch_model would torch.export it: exporting
# is offline by nature, and seven full-size exports were 100 s of this test. The tiny models go
# through the whole loader. (models.py binds from_torch at import, so the stop patches the module's
# _torch_model, the one name every full-size builder calls.)
class Built(Exception):
    pass
_import = models._torch_model
def _stop(name, *a, **k):
    if name in models.FULL_SIZE:
        raise Built(name)
    return _import(name, *a, **k)
models._torch_model = _stop
built = []
for name in models.names():
    try:
        load_model(name)
    except Built as stop:
        built.append(str(stop))
print("BUILT", sorted(built))
w = tvmfuse.zoo.workloads.get("softmax_chain")
tvmfuse.build(w.mod, "llvm", "tvmfuse")(*w.inputs())
print("OK", models.names())
"""


def test_nothing_is_fetched_from_the_network_at_run_time():
    """Load every real model (the full-size ones up to their torch.export) and build + run a
    workload, with every non-loopback connection refused."""
    env = {**os.environ, "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0"}
    r = subprocess.run([sys.executable, "-c", GUARD], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert "NETWORK ACCESS" not in r.stderr, r.stderr[-2000:]
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-2000:]
    from tvmfuse.zoo import models

    assert f"BUILT {sorted(models.FULL_SIZE)}" in r.stdout, r.stdout[-2000:]  # each full-size module was built
