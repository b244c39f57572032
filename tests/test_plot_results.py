"""scripts/plot_results.py: the bar chart of a bench run."""
import glob
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "plot_results.py")
# a committed models run (the current one of any machine; the archive when results/cpu has none)
RESULT = sorted(glob.glob(os.path.join(ROOT, "results", "cpu", "models-*.json"))
                or glob.glob(os.path.join(ROOT, "results", "archive", "cpu", "models-*.json")))[-1]
PNG = b"\x89PNG\r\n\x1a\n"

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import plot_results  # noqa: E402


def test_script_writes_a_png_for_a_committed_run(tmp_path):
    out = tmp_path / "img" / "models.png"
    subprocess.run([sys.executable, SCRIPT, RESULT, "-o", str(out)], check=True, cwd=ROOT)
    assert out.read_bytes()[:8] == PNG


def _run(rows):
    return {"target": '{"kind":"llvm","mcpu":"x"}', "timing": "2 threads", "rows": rows}


def test_new_and_missing_columns():
    data = _run([
        {"workload": "a", "ms": {"tvmfuse": 2.0, "tvm": 4.0, "vanilla tvm": 6.0, "numpy": 9.0},
         "ok": {"tvmfuse": True, "tvm": True, "vanilla tvm": True}},
        {"workload": "b", "ms": {"tvmfuse": 1.0, "tvm": 1.0, "torch.compile (freezing)": 0.5},
         "ok": {"tvmfuse": True, "tvm": True, "torch.compile (freezing)": True}},
        {"workload": "c", "ms": {"tvmfuse": 1.0, "onnxruntime": 3.0}, "ok": {"tvmfuse": True, "onnxruntime": False}},
    ])
    rel, names = plot_results.relative_latencies(data)
    assert names == ["a", "b", "c"]
    assert list(rel) == ["tvm", "vanilla tvm", "torch.compile (freezing)"]   # no numpy, no failed onnxruntime
    assert rel["tvm"] == [2.0, 1.0, None]
    assert rel["vanilla tvm"] == [3.0, None, None]
    assert rel["torch.compile (freezing)"] == [None, 0.5, None]


def test_nothing_to_plot_is_an_error(tmp_path):
    with pytest.raises(ValueError):
        plot_results.plot(_run([{"workload": "a", "ms": {"tvmfuse": 1.0}}]), str(tmp_path / "x.png"))


def test_plot_draws_requested_systems(tmp_path):
    with open(RESULT) as f:
        data = json.load(f)
    drawn = plot_results.plot(data, str(tmp_path / "m.png"), systems=["onnxruntime", "torch.compile"])
    assert drawn == ["onnxruntime", "torch.compile"]
    assert (tmp_path / "m.png").read_bytes()[:8] == PNG
