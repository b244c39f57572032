"""scripts/tune.py tuning flags and scripts/nightly.py, end to end on small shapes and 2 trials."""
import json
import os
import subprocess
import sys

import pytest
import tvm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def script(name, *args, timeout=600, env=None):
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", name), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=None if env is None else {**os.environ, **env})


def test_tune_cli_tunes_and_prints_tuned_variants(tmp_path):
    logs = str(tmp_path / "logs")
    p = script("tune.py", "--model", "bias_relu_dropout", "--size", "small", "--variants", "tvm,tvmfuse",
               "--trials", "2", "--logs", logs, "--resume", "--repeat", "3", "--json", str(tmp_path / "r.json"))
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {r["variant"]: r for r in json.loads((tmp_path / "r.json").read_text())["results"][0]["rows"]}
    assert set(rows) == {"tvm", "tvmfuse", "tvm+tuned", "tvmfuse+tuned"}
    assert "tvmfuse+tuned vs tvm+tuned" in p.stdout and "geometric mean" in p.stdout
    assert "tuning bias_relu_dropout [tvmfuse]" in p.stderr  # the progress bar over the tasks
    assert os.path.exists(os.path.join(logs, os.listdir(logs)[0], "tasks.json"))


def test_tune_cli_cuda_without_gpu_fails_fast():
    if tvm.cuda(0).exist:
        pytest.skip("a GPU is present: CUDA tuning would run locally")
    p = script("tune.py", "--model", "softmax_chain", "--target", "cuda", "--trials", "2", timeout=120)
    assert p.returncode == 2 and "--rpc-tracker" in p.stderr, p.stderr[-2000:]


def test_tune_cli_rpc_flags_go_together():
    p = script("tune.py", "--model", "softmax_chain", "--trials", "2", "--rpc-tracker", "127.0.0.1:9", timeout=120)
    assert p.returncode == 2 and "--rpc-key" in p.stderr


def test_nightly_twice_reports_no_regression_and_shows_history(tmp_path):
    args = ["--models", "softmax_decomposed", "--size", "small", "--trials", "0", "--logs", str(tmp_path),
            "--repeat", "5", "--threshold", "2.0"]
    # one thread: at these 5 us kernels, waking a second pool thread made a run read 2.5x slower
    # now and then, which the comparison (rightly) calls a regression; and even on one thread, a
    # run beside the other test workers read 6 -> 9.5 us (+65%): the threshold here is loose, the
    # detection itself is test_nightly_fails_on_a_launch_count_increase's
    one = {"TVM_NUM_THREADS": "1"}
    first = script("nightly.py", *args, env=one)
    assert first.returncode == 0, first.stdout + first.stderr[-2000:]
    assert "no earlier run to compare with" in first.stdout
    second = script("nightly.py", *args, env=one)
    assert second.returncode == 0, second.stdout + second.stderr[-2000:]
    assert "0 regressed" in second.stdout and "history (last 10 runs)" in second.stdout
    runs = sorted(os.listdir(tmp_path / "history"))
    assert len(runs) == 2 and all(r.endswith(".json") for r in runs)
    data = json.loads((tmp_path / "history" / runs[-1]).read_text())
    assert set(data["models"]["softmax_decomposed"]) == {"none", "tvm", "tvmfuse", "tvm+tuned", "tvmfuse+tuned"}
    assert data["models"]["softmax_decomposed"]["tvmfuse"]["launches"] == 1


def test_nightly_fails_on_a_launch_count_increase(tmp_path):
    from tvmfuse.tuning import history

    old = {"date": "1", "target": "llvm", "size": "small",
           "models": {"m": {"tvmfuse": {"launches": 1, "bytes": 8, "latency_ms": 1.0}}}}
    new = {"date": "2", "target": "llvm", "size": "small",
           "models": {"m": {"tvmfuse": {"launches": 2, "bytes": 8, "latency_ms": 0.5}}}}
    d = history.diff(old, new, 0.15)
    assert d.failed and "launches 1 -> 2" in d.regressed[0]
    slower = {**new, "models": {"m": {"tvmfuse": {"launches": 1, "bytes": 8, "latency_ms": 1.3}}}}
    assert history.diff(old, slower, 0.15).failed and not history.diff(old, slower, 0.5).failed
