"""The two-phase GPU check without a GPU: `prepare` (tvmfuse.bench.gpu_cases) writes exported cases and a
manifest; `run` (scripts/gpu_device.py, runtime-only TVM, no tvmfuse import) loads them and checks,
counts and times them. Here on llvm + the CPU, the flow the device runs on CUDA."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tvmfuse.bench import gpu_cases
from tvmfuse.zoo import workloads

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import gpu_device  # noqa: E402


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("cases"))
    m = gpu_cases.prepare(d, "llvm", size="small", names=["softmax_chain"], attention_seqs=(16,), causal_seqs=(16,),
                          heads=2, head_dim=8, log=lambda s: None)
    return d, m


def _run(d, out, *extra):
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1")
    return subprocess.run([sys.executable, "scripts/gpu_check.py", "run", "--dir", d, "--device", "cpu", "--out", out,
                           "--bundle", os.path.join(d, "no-bundle"), "--no-torch", "--rounds", "1", "--budget", "0.01",
                           *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_manifest_describes_each_case(cases):
    d, m = cases
    assert m["prepared"]["target_kind"] == "llvm" and not m["failed"]
    ids = [c["id"] for c in m["cases"]]
    assert ids == ["softmax_chain.tvm", "softmax_chain.tvmfuse"] + [
        f"{g}-s16.{s}" for g in ("attention", "attention_causal") for s in ("tvmfuse", "tvmfuse-unfused", "tvm")]
    with open(os.path.join(d, gpu_cases.MANIFEST)) as f:
        assert json.load(f)["cases"] == m["cases"]
    c = {c["id"]: c for c in m["cases"]}
    assert c["softmax_chain.tvm"]["launches"] == 2 and c["softmax_chain.tvmfuse"]["launches"] == 1
    assert c["attention-s16.tvmfuse"]["launches"] == 1 and c["attention-s16.tvm"]["launches"] > 1
    w = workloads.get("softmax_chain", "small")
    # the run phase regenerates the inputs; prepare records their digest, and both agree
    assert c["softmax_chain.tvm"]["input_sha256"] == gpu_cases.inputs_digest(w.inputs())
    assert gpu_device.inputs_digest(gpu_device.make_inputs(c["softmax_chain.tvm"])) == gpu_cases.inputs_digest(
        w.inputs())
    with np.load(os.path.join(d, c["softmax_chain.tvm"]["ref"])) as z:
        np.testing.assert_array_equal(z["out0"], w.reference(*w.inputs()))
    assert all(os.path.exists(os.path.join(d, x["file"])) and not gpu_cases.check_binary(os.path.join(d, x["file"]))
               for x in m["cases"])  # llvm: no fatbin


def test_numpy_attention_reference_matches_the_workload(cases):
    _, m = cases
    for case in (x for x in m["cases"] if x["id"].endswith(".tvm") and "attention" in x):
        mask = case["attention"]["mask"]
        w = workloads.attention_workload(1, 16, 2, 8, mask=mask)
        x = gpu_device.make_inputs(case)
        (ref,), _ = gpu_device.attention_reference(case, x, None, "cpu")
        np.testing.assert_allclose(ref, w.reference(*w.inputs()), rtol=1e-5, atol=1e-6)


def test_run_phase_is_runtime_only_and_checks_counts_and_times(cases, tmp_path):
    d, _ = cases
    p = _run(d, str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.load(open(tmp_path / "gpu-run.json"))
    assert res["env"]["runtime_only"] and res["env"]["compiler_modules"] == []
    rows = {r["group"]: r for r in res["rows"]}
    assert set(rows) == {"softmax_chain", "attention-s16", "attention_causal-s16"}
    sm = rows["softmax_chain"]["systems"]
    assert sm["tvm"]["ran"] == sm["tvm"]["launches"] == 2 and sm["tvmfuse"]["ran"] == 1
    assert all(s["ok"] and s["ms"] > 0 and s["samples"] >= 1 for r in rows.values() for s in r["systems"].values())
    assert rows["attention-s16"]["reference"] == "numpy float64" and rows["softmax_chain"]["inputs_match_prepare"]
    md = open(tmp_path / "gpu-run.md").read()
    assert "| softmax_chain |" in md and "| 16 | causal |" in md


def test_run_phase_reports_a_wrong_result(cases, tmp_path):
    d, m = cases
    bad = str(tmp_path / "cases")
    shutil.copytree(d, bad)
    ref = next(c["ref"] for c in m["cases"] if c["workload"] == "softmax_chain")
    with np.load(os.path.join(bad, ref)) as z:
        out = z["out0"].copy()
    out[3, 5] += 1.0
    np.savez_compressed(os.path.join(bad, ref), out0=out)
    p = _run(bad, str(tmp_path / "out"), "--only", "softmax_chain")
    assert p.returncode == 1 and "FAILED: softmax_chain" in p.stderr
    row = json.load(open(tmp_path / "out" / "gpu-run.json"))["rows"][0]
    assert not row["systems"]["tvmfuse"]["ok"] and row["systems"]["tvmfuse"]["check"]["max_abs"] >= 0.5


@pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("cc") is None, reason="needs nvcc and cc")
def test_cuda_prepare_exports_a_fatbin_without_a_driver(tmp_path):
    """Without libcuda, TVM's codegen keeps CUDA source only; prepare's stub driver makes it run nvcc,
    so the exported library holds a fatbin the device can load."""
    p = subprocess.run([sys.executable, "scripts/gpu_check.py", "prepare", "--dir", str(tmp_path), "--size", "small",
                        "--workloads", "softmax_chain", "--systems", "tvmfuse", "--attention-seqs", "",
                        "--causal-seqs", "", "--models", ""], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    (case,) = json.load(open(tmp_path / "manifest.json"))["cases"]
    assert gpu_cases.check_binary(str(tmp_path / case["file"]))
    assert case["kernels"] == ["fused_add_relu_softmax_multiply_kernel"] and case["launches"] == 1
    assert case["kernels_per_func"] == {"fused_add_relu_softmax_multiply": 1} and case["rtol"] >= 1e-3


def test_a_model_with_generated_weights_runs_from_its_manifest(tmp_path):
    """bert-tiny with its weights as parameters: the run phase regenerates the big weights by the
    rule prepare used (same sha256), takes the small ones from the npz, and matches torch eager."""
    pytest.importorskip("transformers")
    d = str(tmp_path / "cases")
    m = gpu_cases.prepare(d, "llvm", size="small", names=[], attention_seqs=(), causal_seqs=(), systems=("tvmfuse",),
                          models=("bert-tiny",), log=lambda s: None)
    (case,) = m["cases"]
    assert case["model"]["name"] == "bert-tiny" and len(case["inputs"]) == len(case["input_gen"]) > 30
    assert {g["rule"] for g in case["input_gen"]} == {"stored", "normal"}
    assert gpu_device.inputs_digest(gpu_device.make_inputs(case, d)) == case["input_sha256"]
    p = _run(d, str(tmp_path / "out"))
    assert p.returncode == 0, p.stdout + p.stderr
    row = json.load(open(tmp_path / "out" / "gpu-run.json"))["rows"][0]
    assert row["inputs_match_prepare"] and row["systems"]["tvmfuse"]["ok"] and row["systems"]["tvmfuse"]["ran"] > 1
    prof = row["systems"]["tvmfuse"]["profile_ms"]  # a model is profiled kernel function by function
    assert set(prof) <= set(case["kernel_funcs"]) and len(prof) > 1 and all(v > 0 for v in prof.values())
    assert "(each call synchronized" in open(tmp_path / "out" / "gpu-run.md").read()


def test_isolated_groups_survive_a_crashing_one(cases, tmp_path):
    """--isolate: each group in its own process, rows merged; a group whose process dies (here a
    library that is not one: loading it is fine to fail, so we make the child segfault on purpose
    through a bad .so) costs only itself and its row names the step it was in."""
    d, m = cases
    bad = str(tmp_path / "cases")
    shutil.copytree(d, bad)
    man = json.load(open(os.path.join(bad, "manifest.json")))
    victim = next(c for c in man["cases"] if c["group"] == "softmax_chain")
    with open(os.path.join(bad, victim["file"]), "wb") as f:  # truncated: dlopen fails or crashes
        f.write(open(os.path.join(d, victim["file"]), "rb").read()[:4096])
    p = _run(bad, str(tmp_path / "out"), "--isolate")
    res = json.load(open(tmp_path / "out" / "gpu-run.json"))
    groups = {r["group"]: r for r in res["rows"]}
    assert set(groups) == {c["group"] for c in man["cases"]}, p.stdout + p.stderr
    assert groups["softmax_chain"]["errors"], groups["softmax_chain"]
    others = [r for g, r in groups.items() if g != "softmax_chain"]
    assert others and all(not r["errors"] and all(s["ok"] for s in r["systems"].values()) for r in others)
    assert p.returncode == 1 and "each group in its own process" in res["timing"]


def test_the_run_side_device_clock_times_each_flushed_call_between_events():
    """time_events (scripts/gpu_env.py) with a stand-in for torch.cuda: a flush before each call, the
    call between the start and end events, their elapsed time (ms) returned in seconds; the report
    shows the device clock with the launch overhead."""
    import gpu_env
    import gpu_report
    from types import SimpleNamespace

    log = []

    class Event:
        def __init__(self, enable_timing):
            self.t = None

        def record(self):
            log.append("record")
            self.t = len(log)

        def synchronize(self):
            log.append("sync")

        def elapsed_time(self, end):
            return 2.0  # ms

    torch = SimpleNamespace(cuda=SimpleNamespace(Event=Event))
    got = gpu_env.time_events(lambda: log.append("call"), lambda: log.append("flush"), torch, 2)
    assert got == [0.002, 0.002]
    assert log == ["flush", "record", "call", "record", "sync"] * 2
    row = {"workload": "mlp_block", "attention": None, "errors": {}, "skipped": {},
           "systems": {"tvmfuse": {"ms": 0.05, "device_ms": 0.03, "launch_overhead_ms": 0.02, "ok": True,
                                   "check": {"ok": True, "max_rel": 0.0}}}}
    assert "| mlp_block | 0.0300 (+0.0200) |" in gpu_report.tables([row])
