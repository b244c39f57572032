"""scripts/tune.py end to end on tiny shapes (the bench shapes run in the README command)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "tune.py")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=600)


def test_tune_prints_the_table_and_writes_json(tmp_path):
    out = tmp_path / "r.json"
    p = run("--model", "softmax_decomposed", "--size", "small", "--repeat", "3", "--json", str(out))
    assert p.returncode == 0, p.stderr
    assert "tvmfuse" in p.stdout and "geometric mean" in p.stdout
    data = json.loads(out.read_text())
    rows = {r["variant"]: r for r in data["results"][0]["rows"]}
    assert rows["none"]["launches"] == 5 and rows["tvmfuse"]["launches"] == 1
    assert all(data["results"][0]["numerics_ok"].values())


def test_tune_train_measures_a_training_step_beside_stock_tvm(tmp_path):
    """--train: forward, backward (relax.transform.Gradient) and the Adam update of the zoo's
    trainable workloads, one module each, built under every variant and checked against the
    unfused build."""
    out = tmp_path / "t.json"
    p = run("--train", "--optimizer", "adam", "--size", "small", "--repeat", "3", "--json", str(out))
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    names = [r["workload"] for r in data["results"]]
    assert names == ["layernorm_decomposed train[adam] [small]", "mlp_block train[adam] [small]"]
    for r in data["results"]:
        assert all(r["numerics_ok"].values())
        rows = {x["variant"]: x for x in r["rows"]}
        assert rows["tvmfuse"]["launches"] < rows["tvm"]["launches"] < rows["none"]["launches"]


def test_tune_train_needs_to_know_the_trainable_parameters():
    p = run("--train", "--model", "softmax_decomposed", "--size", "small")
    assert p.returncode == 2 and "--train-params N" in p.stderr
    p = run("--train", "--model", "mlp_block", "--size", "small", "--trials", "4")
    assert p.returncode == 2 and "--train measures default schedules only" in p.stderr


def test_tune_unknown_model_lists_the_names():
    p = run("--model", "resnet9000")
    assert p.returncode == 2
    assert "unknown workload 'resnet9000'" in p.stderr and "softmax_chain" in p.stderr


def test_tune_unknown_target():
    p = run("--target", "tpu", "--model", "softmax_chain")
    assert p.returncode == 2 and "unknown target 'tpu'" in p.stderr
