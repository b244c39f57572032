"""scripts/tune.py --model with model files: Relay text, ONNX, a torch .py, a Relax .py; bad files."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "tune.py")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=600, cwd=ROOT)


def _rows(path):
    data = json.loads(path.read_text())
    res = data["results"][0]
    return {r["variant"]: r for r in res["rows"]}, res["numerics_ok"]


@pytest.mark.parametrize("spec", ["tests/relay/conv_bn_relu.txt", "tests/data/torch_convnet.py",
                                  "tests/data/relax_module.py"])
def test_tune_model_file(spec, tmp_path):
    if spec.endswith("convnet.py"):
        pytest.importorskip("torch")
    out = tmp_path / "r.json"
    p = run("--model", spec, "--size", "small", "--repeat", "3", "--json", str(out))
    assert p.returncode == 0, p.stderr[-2000:]
    rows, ok = _rows(out)
    assert all(ok.values()), ok
    assert rows["tvmfuse"]["launches"] <= rows["tvm"]["launches"] < rows["none"]["launches"]


def test_tune_onnx_file(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    from tvmfuse.zoo.models import export_onnx

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32)).eval()
    path = tmp_path / "mlp.onnx"
    path.write_bytes(export_onnx(m, [torch.randn(4, 16).numpy()], ["x"]))
    out = tmp_path / "r.json"
    p = run("--model", str(path), "--size", "small", "--repeat", "3", "--json", str(out))
    assert p.returncode == 0, p.stderr[-2000:]
    rows, ok = _rows(out)
    assert all(ok.values()) and rows["tvmfuse"]["launches"] <= rows["tvm"]["launches"]


def test_tune_bad_model_files(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"garbage" * 10)
    broken = tmp_path / "broken.relay"
    broken.write_text('#[version = "0.0.5"]\ndef @main(%x: Tensor[(2), float32]) {\n  nn.relu(%x,, )\n}\n')
    cases = [("missing.onnx", "no such file 'missing.onnx'"),
             (str(bad), "is not a valid ONNX model"),
             (str(broken), "broken.relay:3:14: Relay syntax error")]
    for spec, msg in cases:
        p = run("--model", spec, "--size", "small")
        assert p.returncode == 2 and msg in p.stderr, (spec, p.stderr[-1500:])


def test_models_script_measures_a_real_model(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "m.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "models.py"), "--models", "resnet-tiny",
                        "--size", "small", "--repeat", "3", "--json", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    v = row["variants"]
    assert all(v[k]["ok"] for k in ("none", "tvm", "tvmfuse"))
    assert v["tvmfuse"]["launches"] <= v["tvm"]["launches"] < v["none"]["launches"]
    assert row["eager_ms"] > 0 and "| resnet-tiny [small] |" in p.stdout
    assert row["machine"]["cpu"] and row["machine"]["versions"]["tvm"] and "machine: " in p.stdout
