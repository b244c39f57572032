import pytest

import tvmfuse
from tvmfuse.zoo import workloads

from conftest import built


def test_softmax_of_n_by_m_moves_8nm_bytes_when_fused():
    n, m = 64, 128
    c = built("softmax_decomposed", "tvmfuse")
    nbytes, reads, writes = tvmfuse.runtime.bytes_moved(c.mod)
    assert (nbytes, reads, writes) == (8 * n * m, 1, 1)


def test_bytes_moved_unfused_counts_every_kernel():
    # softmax_decomposed unfused: max(x) r NM w N; sub(x,mx) r NM+N w NM; exp r NM w NM;
    # sum r NM w N; div r NM+N w NM  ->  7 reads, 5 writes
    n, m = 64, 128
    c = built("softmax_decomposed", "none")
    nbytes, reads, writes = tvmfuse.runtime.bytes_moved(c.mod)
    assert (reads, writes) == (7, 5)
    assert nbytes == 4 * (n * m + n + (n * m + n) + n * m + n * m + n * m + n * m + n + (n * m + n) + n * m)


def test_textbook_conv_relu_bn_add_accesses():
    # conv -> relu -> bn -> add: unfused every op reads and writes its tensors; fused: one kernel
    none = tvmfuse.runtime.bytes_moved(built("conv_relu_bn_add", "none").mod)
    fused = tvmfuse.runtime.bytes_moved(built("conv_relu_bn_add", "tvmfuse").mod)
    assert none[2] == 6 and fused[2] == 1  # writes (bn also writes its two moving stats)
    assert fused[1] == 6  # x, w, gamma, beta, mean, var read once each
    assert fused[0] < none[0]


def test_peak_memory_planned_and_unplanned():
    c = built("softmax_decomposed", "none")
    n, m = 64, 128
    # intermediates mx (N), sub (NM), exp (NM), sum (N): the liveness peak is sub + exp while exp runs
    unplanned = tvmfuse.runtime.unplanned_peak(c.mod)
    planned = tvmfuse.runtime.planned_peak(c.mod)
    assert unplanned == 4 * 2 * n * m
    assert 0 < planned <= 4 * (2 * n * m + 2 * n)
    f = built("softmax_decomposed", "tvmfuse")
    assert tvmfuse.runtime.unplanned_peak(f.mod) == 0 and tvmfuse.runtime.planned_peak(f.mod) == 0


def test_measure_reports_latency_median_and_spread():
    w = workloads.get("softmax_chain")
    m = tvmfuse.measure(built("softmax_chain", "tvmfuse"), w.inputs(), repeat=3)
    lat = m.latency_ms
    assert lat["repeats"] == 3 and lat["p10"] <= lat["median"] <= lat["p90"]
    assert m.dynamic_launches == 1


def test_compare_table_text_json_markdown():
    w = workloads.get("softmax_decomposed")
    cmp = tvmfuse.compare(w.mod, w.inputs(), "llvm", reference=w.reference(*w.inputs()), name="sd", repeat=2)
    assert [r.variant for r in cmp.rows] == ["none", "tvm", "tvmfuse"]
    assert all(cmp.checks.values())
    d = cmp.as_dict()
    assert d["vs_tvm"]["tvmfuse"]["launches"] == pytest.approx(1 / 4)
    assert "| tvmfuse | 1 |" in cmp.to_markdown()
    assert "tvmfuse" in str(cmp) and '"variant": "tvm"' in cmp.to_json()


def test_kernel_profile_takes_each_kernels_median_over_runs(monkeypatch):
    """One run stalled by the host (1 s added to one kernel call in the middle run of 3) must not
    make that kernel look slow: each kernel's time is its median over the runs, not the mean."""
    from tvmfuse.runtime import metrics as runtime

    w = workloads.get("softmax_decomposed", "small")
    c = built("softmax_decomposed", "none")
    names = runtime.kernel_names(c)
    seen = {"kernel_calls": 0, "stall_at": None}

    class StalledOnce(runtime.KernelCounter):
        def __call__(self, func, func_symbol, before_run, ret_value, *args):
            out = super().__call__(func, func_symbol, before_run, ret_value, *args)
            if not before_run and func_symbol in names:
                seen["kernel_calls"] += 1
                if seen["kernel_calls"] == seen["stall_at"]:
                    self.times[func_symbol] += 1.0
            return out

    monkeypatch.setattr(runtime, "KernelCounter", StalledOnce)
    runtime.kernel_profile(c, w.inputs(), runs=3, budget_s=60)  # how many kernel calls 3 runs make
    seen["stall_at"], seen["kernel_calls"] = seen["kernel_calls"] // 2 + 1, 0
    stalled = runtime.kernel_profile(c, w.inputs(), runs=3, budget_s=60)
    assert seen["kernel_calls"] >= seen["stall_at"]
    assert max(r["ms"] for r in stalled) < 100, stalled  # the mean would put 333 ms on one kernel
