"""Smoke test of scripts/bench.py on small shapes: the table, JSON rows, numerics and errors."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "bench.py")

pytest.importorskip("onnxruntime")


def _run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=600)


def test_quick_bench_prints_the_table_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    systems = "none,tvm,tvmfuse,onnxruntime,torch,numpy"  # torch.compile: 10-20 s of compile per workload
    p = _run("--quick", "--workloads", "softmax_decomposed,conv_relu_bn_add", "--systems", systems,
             "--json", str(out))
    assert p.returncode == 0, p.stderr
    assert "| softmax_decomposed |" in p.stdout
    assert "geometric mean, tvmfuse vs stock FuseOps (tvmfuse schedules), all workloads" in p.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [r["workload"] for r in rows] == ["softmax_decomposed", "conv_relu_bn_add"]
    for r in rows:
        assert set(r["ms"]) == set(systems.split(","))
        assert all(r["ok"].values()) and all(v > 0 for v in r["ms"].values())
        assert r["launches"]["tvmfuse"] <= r["launches"]["tvm"]


def test_bench_rejects_unknown_system_and_workload():
    p = _run("--quick", "--systems", "tvm,xla")
    assert p.returncode == 2 and "unknown system(s) ['xla']" in p.stderr
    p = _run("--quick", "--workloads", "resnet9000")
    assert p.returncode == 2 and "unknown workload 'resnet9000'" in p.stderr


def test_bench_with_logs_that_are_not_a_folder_says_so(tmp_path):
    p = _run("--quick", "--logs", str(tmp_path / "nope"))
    assert p.returncode == 2 and "is not a folder" in p.stderr


def test_bench_runs_a_real_model(tmp_path):
    out = tmp_path / "m.json"
    p = _run("--quick", "--workloads", "resnet-tiny", "--systems", "tvm,tvmfuse,torch,numpy", "--json", str(out))
    assert p.returncode == 0, p.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert set(row["ms"]) == {"tvm", "tvmfuse", "torch"} and all(row["ok"].values())
    assert row["skipped"] == {"numpy": "numpy has no form of a real model"}


def test_the_torch_compile_backend_is_a_system_of_real_models():
    """torch.compile[tvmfuse]: the module through torch.compile(backend="tvmfuse"), timed beside
    Inductor; checked against the reference like every system; the zoo has no torch module."""
    from tvmfuse.bench import core as bench

    row = bench.measure_workload("resnet-tiny", "small", ("tvmfuse", bench.BACKEND), rounds=1, budget_s=0.0)
    assert set(row.ms) == {"tvmfuse", bench.BACKEND} and row.ok[bench.BACKEND]
    assert row.compile_s[bench.BACKEND] > 0
    zoo = bench.measure_workload("bias_relu_dropout", "small", ("tvmfuse", bench.BACKEND), rounds=1, budget_s=0.0)
    assert bench.BACKEND in zoo.skipped and bench.BACKEND not in zoo.ms


def test_the_system_after_numpy_waits_for_openblas_to_stop_spinning(monkeypatch):
    """numpy's OpenBLAS workers spin ~0.1 s after a call and slowed the next system by 20%: the
    benchmark sleeps BLAS_SPIN_S after timing numpy, every round, and only then."""
    import numpy as np

    from tvmfuse.bench import core as bench

    events = []
    ready = {s: bench.Ready(call=lambda s=s: events.append(s), out=np.zeros(1)) for s in ("tvm", "numpy", "torch")}
    monkeypatch.setattr(bench, "_callables", lambda *a, **k: (ready, {}))
    monkeypatch.setattr(bench.time, "sleep", lambda s: events.append(f"sleep {s}"))
    bench.measure_workload("bias_relu_dropout", "small", ("tvm", "numpy", "torch"), rounds=3, budget_s=0.0)
    sleeps = [i for i, e in enumerate(events) if e.startswith("sleep")]
    assert len(sleeps) == 3 and all(events[i - 1] == "numpy" for i in sleeps)
    assert all(e == f"sleep {bench.BLAS_SPIN_S}" for e in (events[i] for i in sleeps))


@pytest.mark.parametrize("totals, taken, kept", [
    ([20.0, 9.0, 14.0], 2, 9.0),  # a slow stretch: retaken until one sums near the timed median
    ([10.5, 9.0], 1, 10.5),  # within PROFILE_SLACK of the 10 ms timed: taken once
    ([30.0, 25.0, 40.0], 3, 25.0),  # never near: the fastest of PROFILE_TRIES
])
def test_a_kernel_profile_far_slower_than_the_timing_is_retaken(monkeypatch, totals, taken, kept):
    """The kernel profile of a real model runs after the timing rounds; one taken in a slow stretch
    of the host made every kernel look slow (false cliffs). It is retaken, the fastest kept."""
    from tvmfuse.bench import core as bench
    from tvmfuse.runtime import metrics as runtime

    calls = []

    def fake_profile(compiled, inputs, runs, budget_s):
        calls.append(1)
        return [{"name": "k", "ms": totals[len(calls) - 1]}]

    monkeypatch.setattr(runtime, "kernel_profile", fake_profile)
    rows = bench._kernel_rows(None, [], timed_ms=10.0)
    assert len(calls) == taken and rows[0]["ms"] == kept


def test_dynamic_bench_runs_one_symbolic_build_against_static_and_torch_compile(tmp_path):
    """bench_dynamic on the tiny BERT at one length, one round: the row, its systems, numerics."""
    from tvmfuse.bench import dynamic as bench_dynamic

    out = tmp_path / "d.json"
    md = tmp_path / "d.md"
    assert bench_dynamic.main(["--model", "bert-tiny", "--seqs", "8,9", "--rounds", "1", "--buckets", "8",
                               "--json", str(out), "--markdown", str(md)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["seq"] for r in rows] == [8, 9] and all(all(r["ok"].values()) for r in rows)
    assert set(rows[0]["ms"]) == {"tvmfuse dynamic", "tvmfuse static", "torch.compile dyn", "torch eager",
                                  "tvmfuse backend dyn", "tvmfuse bucketed"}
    assert [r["bucket"] for r in rows] == ["static version", "generic"]
    assert "--buckets 8" in md.read_text() and "machine: " in md.read_text()
    assert json.loads(out.read_text())["machine"]["cpu"]


def test_json_and_markdown_carry_the_machine_record_and_vanilla_tvm(tmp_path):
    """The bench JSON records the machine (CPU, mcpu, cores, threads, caches, commit, versions) and
    the markdown header has it in one line; vanilla TVM runs as a system with its launches."""
    out, md = tmp_path / "b.json", tmp_path / "b.md"
    p = _run("--quick", "--workloads", "softmax_chain", "--systems", "vanilla tvm,tvmfuse,numpy",
             "--json", str(out), "--markdown", str(md))
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    rec = data["machine"]
    assert {"cpu", "mcpu", "cores", "threads", "caches", "commit", "versions"} <= set(rec)
    assert rec["cpu"] and rec["mcpu"] and rec["cores"] >= 1 and rec["threads"] >= 1
    assert {"hash", "dirty"} == set(rec["commit"])
    assert {"python", "tvm", "tvm-ffi", "torch", "onnxruntime", "numpy"} <= set(rec["versions"])
    assert rec["versions"]["tvm"] and rec["versions"]["numpy"]
    (row,) = data["rows"]
    assert row["ok"]["vanilla tvm"] and row["launches"]["vanilla tvm"] == 2
    text = md.read_text()
    assert "machine: " in text and f"mcpu={rec['mcpu']}" in text
    assert "tvmfuse vs vanilla TVM (relax.build + dlight)" in text


def test_best_peer_includes_torch_compile_with_freezing():
    from tvmfuse.bench import core as bench

    row = bench.Row("w", ms={"tvmfuse": 1.0, "tvm": 1.5, "torch.compile": 2.0, bench.FREEZING: 0.5,
                             "onnxruntime": 3.0, bench.VANILLA: 4.0})
    assert bench.best_peer(row) == bench.FREEZING
    systems = ["tvm", bench.VANILLA, "tvmfuse", "onnxruntime", "torch.compile", bench.FREEZING]
    text = bench.summary([row], systems)
    assert "| 0.50x (torch.compile (freezing)) |" in text
    assert "geometric mean, tvmfuse vs torch.compile (freezing): 0.50x" in text
    assert "geometric mean, tvmfuse vs stock FuseOps (tvmfuse schedules), all workloads: 1.50x" in text
    assert "geometric mean, tvmfuse vs vanilla TVM (relax.build + dlight): 4.00x" in text


def test_a_slow_system_is_timed_in_few_rounds_of_one_call(monkeypatch):
    """A system whose call took over SLOW_CALL_S (vanilla TVM's naive loops on a big model) gets one
    call in each of SLOW_ROUNDS rounds, and the row and the summary say so."""
    import numpy as np

    from tvmfuse.bench import core as bench

    events = []
    ready = {s: bench.Ready(call=lambda s=s: events.append(s), out=np.zeros(1)) for s in ("tvmfuse", bench.VANILLA)}
    ready[bench.VANILLA].call_s = bench.SLOW_CALL_S + 1
    monkeypatch.setattr(bench, "_callables", lambda *a, **k: (ready, {}))
    row = bench.measure_workload("bias_relu_dropout", "small", ("tvmfuse", bench.VANILLA), rounds=5, budget_s=0.0)
    assert row.samples[bench.VANILLA] == events.count(bench.VANILLA) == bench.SLOW_ROUNDS
    assert row.samples["tvmfuse"] == 5
    assert "rounds of one call" in row.capped[bench.VANILLA] and bench.VANILLA not in row.capped.get("tvmfuse", "")
    assert f"- {bench.VANILLA} on bias_relu_dropout: one call took" in bench.summary([row], ["tvmfuse", bench.VANILLA])


def test_a_half_precision_row_builds_and_runs_every_system_in_it():
    """--dtype float16: tvmfuse built in float16 and torch eager run in it, both checked against the
    float32 reference at the half tolerance; the systems with no half form say why."""
    from tvmfuse.bench import core as bench

    row = bench.measure_workload("mlp_block", "small", ("tvmfuse", "torch", "onnxruntime", "numpy"), rounds=1,
                                 budget_s=0.0, dtype="float16")
    assert row.ok == {"tvmfuse": True, "torch": True} and set(row.ms) == {"tvmfuse", "torch"}
    assert row.skipped == {"onnxruntime": bench.NO_HALF_FORM["onnxruntime"], "numpy": bench.NO_HALF_FORM["numpy"]}
    from tvmfuse.target import resolve
    from tvmfuse.zoo import workloads

    calls, _ = bench._callables(workloads.get("mlp_block", "small"), ("tvmfuse", "torch"), resolve("llvm"), 1,
                                dtype="float16")
    assert "float16" in calls["tvmfuse"].compiled.mod.script()  # computed in half, not float32 relabelled
    assert all(a.dtype == torch_float16() for a in calls["torch"].call.__self__.args if a.is_floating_point())


def torch_float16():
    import torch

    return torch.float16


def test_batch_sizes_apply_to_the_real_models_only():
    from tvmfuse.bench.cli import _jobs
    from tvmfuse.errors import TvmfuseError
    from tvmfuse.zoo import models

    assert _jobs(["mlp_block", "bert-tiny"], "1,8") == [(1, "mlp_block"), (1, "bert-tiny"), (8, "bert-tiny")]
    with pytest.raises(TvmfuseError, match="only the real models"):
        _jobs(["mlp_block"], "8")
    with pytest.raises(TvmfuseError, match="whole numbers"):
        _jobs(["bert-tiny"], "0,x")
    w = models.get("bert-tiny", "small", batch=3)
    assert w.inputs()[0].shape[0] == 3


def test_a_real_model_row_at_batch_two_names_its_batch():
    from tvmfuse.bench import core as bench

    row = bench.measure_workload("bert-tiny", "small", ("tvmfuse", "torch"), rounds=1, budget_s=0.0, batch=2)
    assert row.workload == "bert-tiny (batch 2)" and row.ok == {"tvmfuse": True, "torch": True}
