"""The suite's machinery (tvmfuse.suite): a crash or hang costs one row with its error class, and
the summary's pass rates and geometric means come from the rows."""
import json
import sys

import pytest

from tvmfuse.suite import summary
from tvmfuse.suite.process import run_command


def _cmd(code):
    return [sys.executable, "-c", code]


def test_a_segfault_costs_one_row_with_its_signal(tmp_path):
    out = tmp_path / "row.json"
    code = (f"import json, os, signal; json.dump({{'stages': {{'import[torch.export]': {{'ok': True}}}}}}, "
            f"open({str(out)!r}, 'w')); os.kill(os.getpid(), signal.SIGSEGV)")
    row = run_command(_cmd(code), str(out), timeout=60, base={"model": "m"})
    assert row["model"] == "m" and row["stages"]["import[torch.export]"]["ok"]
    assert row["stages"]["process"]["error"].startswith("SIGSEGV")
    assert "after import[torch.export]" in row["stages"]["process"]["error"]


def test_a_hang_is_killed_at_the_timeout(tmp_path):
    row = run_command(_cmd("import time; time.sleep(60)"), str(tmp_path / "row.json"), timeout=2)
    assert row["stages"]["process"] == {"ok": False, "error": "Timeout: over 2 s"}


def test_an_exception_gives_its_class_and_first_line(tmp_path):
    row = run_command(_cmd("raise ValueError('bad shape\\nmore')"), str(tmp_path / "row.json"), timeout=60)
    assert row["stages"]["process"]["error"] == "ValueError: bad shape"


def _row(name, ok, ms, family="encoder"):
    st = {s: {"ok": ok} for s in summary.CORE}
    return {"model": name, "family": family, "stages": st, "latency_ms": ms,
            "backend": {"compiled": ok, "graph_breaks": 1, "eager_reasons": []}}


def test_summary_pass_rates_and_geomeans():
    rows = [_row("a", True, {"tvmfuse": 1.0, "tvm": 2.0, "torch": 4.0, "onnxruntime": 2.0}),
            _row("b", False, {"tvmfuse": 4.0, "tvm": 2.0, "torch": 1.0}),
            _row("c", True, {"tvmfuse": 1.0, "torch": 4.0}, family="audio")]
    s = summary.summarize(rows)
    assert s["best_peer_by_family"] == {"encoder": {"geomean": 1.4142, "models": 2},
                                        "audio": {"geomean": 0.25, "models": 1}}
    rows = rows[:2]
    s = summary.summarize(rows)
    assert s["pass_all"] == {"passed": 1, "of": 2, "rate": 0.5}
    assert s["stages"]["build[tvmfuse]"] == {"passed": 1, "ran": 2, "rate": 0.5}
    assert s["tvmfuse_over"]["tvm"] == {"geomean": 1.0, "models": 2}  # sqrt(0.5 * 2)
    assert s["tvmfuse_over"]["best peer"]["geomean"] == 1.4142  # sqrt(1/2 * 4/1): best peers 2 and 1
    assert s["backend"] == {"compiled": 1, "of": 2, "graph_breaks": 2}
    result = {"size": "tiny", "batch": 1, "command": "x", "rows": rows, "summary": s,
              "machine": {"cpu": "c", "mcpu": "m", "cores": 2, "logical_cpus": 2, "threads": 2, "caches": {},
                          "commit": {"hash": "abc", "dirty": False}, "versions": {}}}  # runtime.machine.record's keys
    md = summary.markdown(result)
    assert "| build[tvmfuse] | 1 | 2 | 0.5 |" in md and "| best peer | 1.4142 | 2 |" in md
    assert "| encoder | 1.4142 | 2 |" in md
    json.dumps(result)


def _result(rows, cpu="c", commit="abc", size="full"):
    return {"size": size, "batch": 1, "stages": ["import", "build"], "timeout_s": 100, "command": f"run {commit}",
            "rows": rows, "summary": summary.summarize(rows),
            "machine": {"cpu": cpu, "mcpu": "m", "cores": 2, "logical_cpus": 2, "threads": 2, "caches": {},
                        "commit": {"hash": commit, "dirty": False}, "versions": {}}}


def test_merge_takes_a_later_rows_place_and_keeps_each_runs_command():
    first = _result([_row("bert", True, {}), _row("qwen2", False, {})], commit="old")
    rest = _result([_row("qwen2", True, {})], commit="new")
    merged = summary.merge([first, rest], "merge")
    assert [r["model"] for r in merged["rows"]] == ["bert", "qwen2"]
    assert merged["summary"]["pass_all"] == {"passed": 2, "of": 2, "rate": 1.0}
    assert merged["parts"] == [{"command": "run old", "commit": "old", "models": ["bert"]},
                               {"command": "run new", "commit": "new", "models": ["qwen2"]}]
    md = summary.markdown(merged)
    assert "`run old` (commit old): bert" in md and "`run new` (commit new): qwen2" in md


def test_merge_refuses_runs_from_different_machines_or_sizes():
    a = _result([_row("bert", True, {})])
    with pytest.raises(ValueError, match="different machines"):
        summary.merge([a, _result([_row("gpt2", True, {})], cpu="other")], "m")
    with pytest.raises(ValueError, match="different size"):
        summary.merge([a, _result([_row("gpt2", True, {})], size="tiny")], "m")


def test_slower_than_stock_is_judged_against_the_runs_own_noise():
    from tvmfuse.suite.runner import quartiles

    noisy = _row("noisy", True, {"tvmfuse": 1.02, "tvm": 1.0})
    noisy["tvmfuse_over_tvm"] = quartiles([0.97, 1.05, 0.99, 1.04, 1.02])  # slower in 3 rounds of 5: noise
    slow = _row("slow", True, {"tvmfuse": 1.2, "tvm": 1.0})
    slow["tvmfuse_over_tvm"] = quartiles([1.1, 1.2, 1.25, 1.18, 1.3])
    assert noisy["tvmfuse_over_tvm"] == {"median": 1.02, "q1": 0.99, "q3": 1.04}
    s = summary.summarize([noisy, slow])
    assert s["slower_than_tvm"] == ["slow"]
    md = summary.markdown({"size": "full", "batch": 1, "command": "x", "rows": [noisy, slow], "summary": s,
                           "machine": _result([])["machine"]})
    assert "beyond noise (per-round ratio's lower quartile above 1): slow." in md
    assert "| 1.020 [0.990, 1.040] |" in md


def test_numerics_atol_follows_the_outputs_scale():
    import numpy as np

    from tvmfuse.suite.runner import compare

    ref = np.array([1000.0, 0.5], "float32")
    assert compare(ref + np.array([0.0, 2e-3], "float32"), ref, "full") == pytest.approx(2e-3, rel=1e-3)
    with pytest.raises(AssertionError, match="output scale 1000"):
        compare(ref + np.array([0.0, 2.0], "float32"), ref, "full")  # 2e-3 of the scale: beyond reassociation
    with pytest.raises(AssertionError):
        compare(np.array([1.0, 0.5 + 3e-3], "float32"), np.array([1.0, 0.5], "float32"), "full")  # order-1 output
