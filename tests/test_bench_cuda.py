"""The CUDA path of the benchmark, checked without a GPU: the L2-flush kernel (CUDA source; run on
the CPU), the flushed timing loop, the launch counter run on llvm (the same code as on CUDA), and
`--target cuda` stopping at once where there is no GPU."""
import os
import re
import subprocess
import sys
import time
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import tvm

from tvmfuse.bench import core as bench, gpu as bench_gpu
from tvmfuse.zoo import workloads
from tvmfuse.build import cuda_kernels, cuda_source
from tvmfuse.runtime.metrics import dynamic_launches, weighted_launches
from tvmfuse.target import resolve

from conftest import built

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_GPU = not tvm.cuda(0).exist


def _thread_extents(func):
    """{thread tag: loop extent} of the bound loops on the path from the root of a PrimFunc."""
    out, stmt = {}, func.body
    while stmt is not None:
        if isinstance(stmt, tvm.tirx.For) and stmt.thread_binding is not None:
            out[stmt.thread_binding.thread_tag] = int(stmt.extent)
        stmt = getattr(stmt, "block", None) or getattr(stmt, "body", None)
    return out


def test_flush_kernel_is_one_cuda_kernel_that_writes_the_whole_buffer():
    nbytes = (3 << 20) + 100  # not a whole number of blocks: rounded up
    func, ex = bench_gpu.build_flush(nbytes, resolve("cuda"))
    n = bench_gpu.flush_elems(nbytes)
    assert "T.Buffer((%d,)" % n in func.script()
    src = cuda_source(ex.mod)
    assert cuda_kernels(src) == [f"{bench_gpu.FLUSH_SYMBOL}_kernel"]
    body = src[src.rindex(f"{bench_gpu.FLUSH_SYMBOL}_kernel("):]
    # one store per thread, at blockIdx.x * 1024 + threadIdx.x, no bounds check
    assert re.search(r"flush_ptr\[\(\(\(\(int\)blockIdx\.x\) \* 1024\) \+ \(\(int\)threadIdx\.x\)\)\] =", body)
    assert body.count("flush_ptr[") == 1 and "if (" not in body and "for (" not in body
    # ... and the launch covers the buffer: blocks x threads = n elements >= nbytes
    assert _thread_extents(func) == {"blockIdx.x": n // 1024, "threadIdx.x": 1024}
    assert n % 1024 == 0 and nbytes <= 4 * n < nbytes + 4 * 1024


def test_flush_on_the_cpu_writes_every_element():
    f = bench_gpu.L2Flush(resolve("llvm"), tvm.cpu(0), nbytes=1 << 20)
    f()
    assert f.nbytes == 1 << 20
    assert np.array_equal(f.buffer.numpy(), np.arange(f.nbytes // 4) % 251)


def test_flush_size_is_twice_the_l2_or_the_fallback():
    assert bench_gpu.flush_bytes(SimpleNamespace(exist=True, l2_cache_size_bytes=50 << 20)) == 100 << 20
    assert bench_gpu.flush_bytes(SimpleNamespace(exist=True, l2_cache_size_bytes=None)) == 256 << 20
    assert bench_gpu.flush_bytes(tvm.cpu(0)) == bench_gpu.FALLBACK_FLUSH_BYTES  # a CPU reports no L2


def test_time_flushed_flushes_before_every_timed_call_and_times_only_the_call():
    log = []

    def flush():
        log.append("flush")
        time.sleep(0.02)  # outside the clock

    samples = bench_gpu.time_flushed(lambda: log.append("call"), lambda: log.append("sync"), flush, budget_s=0.1)
    assert log[:2] == ["call", "sync"]  # the warm-up
    assert log[2:] == ["flush", "call", "sync"] * len(samples)
    assert 1 <= len(samples) <= 6 and max(samples) < 0.01


def test_weighted_launches():
    calls = {"fused_a": 2, "fused_b": 1, "host_only": 3}
    assert weighted_launches(calls, None) == 6  # CPU: a call is a launch
    assert weighted_launches(calls, {"fused_a": 3, "fused_b": 1}) == 7  # host_only: no kernel


@pytest.mark.parametrize("fusion", ["tvm", "tvmfuse"])
@pytest.mark.parametrize("name", ["attention", "softmax_decomposed", "linear_regression_step"])
def test_launches_counted_while_running_equal_the_static_count(name, fusion):
    c = built(name, fusion)
    ran, per = dynamic_launches(c, c.convert_inputs(workloads.get(name, "small").inputs()))
    assert ran == c.launches and sum(p["calls"] for p in per.values()) == len(c.call_sites())


def test_launches_while_running_are_weighted_by_kernels_per_func():
    c = built("attention", "tvm")
    fake = {f: i + 2 for i, f in enumerate(sorted(set(c.call_sites())))}  # 2, 3, 4, ... kernels
    ran, per = dynamic_launches(c, c.convert_inputs(workloads.get("attention", "small").inputs()), fake)
    assert ran == sum(fake[f] for f in c.call_sites())
    assert all(p["launches"] == p["calls"] * fake[f] for f, p in per.items())


@pytest.mark.parametrize("fusion", ["none", "tvm", "tvmfuse"])
def test_cuda_static_count_is_the_weighting_of_one_call_per_site(fusion):
    """What the counter adds up on a GPU (calls x kernels per PrimFunc), fed one call per call site
    of a real CUDA build, is the static count from the source."""
    c = built("attention", fusion, target="cuda")
    assert weighted_launches(Counter(c.call_sites()), c.kernels_per_func()) == c.launches


def test_bench_row_reports_launches_while_running_next_to_the_static_count():
    row = bench.measure_workload("softmax_decomposed", "small", ("tvm", "tvmfuse", "numpy"), rounds=1,
                                 budget_s=0.01)
    assert row.ran == row.launches == {"tvm": 4, "tvmfuse": 1}
    assert all(row.ok.values()) and "| 4/1 | 4/1 |" in bench.summary([row], ["tvm", "tvmfuse", "numpy"])


def test_gpu_path_of_measure_workload_dry_run_on_the_cpu(monkeypatch):
    """bench.measure_workload's GPU branch (peers, tolerances, flushed single-call samples) with the
    CPU standing in for the GPU: llvm builds, and the flush kernel compiled for llvm."""
    monkeypatch.setattr(bench, "is_gpu", lambda target: True)
    monkeypatch.setattr(bench_gpu, "use_nvcc_without_nvrtc", lambda: None)
    flush = bench_gpu.L2Flush(resolve("llvm"), tvm.cpu(0), nbytes=1 << 20)
    monkeypatch.setattr(bench_gpu, "l2_flush", lambda arch: flush)
    row = bench.measure_workload("softmax_chain", "small", ("tvm", "tvmfuse", "numpy"), rounds=2, budget_s=0.02)
    assert set(row.ms) == {"tvm", "tvmfuse"} and row.skipped == {"numpy": "numpy is not a GPU system"}
    assert all(row.ok.values()) and row.ran == row.launches == {"tvm": 2, "tvmfuse": 1}
    assert all(n > 2 for n in row.samples.values())  # single calls, not one mean per round


def test_gpu_peers_say_why_they_do_not_run():
    w = workloads.get("softmax_chain", "small")
    assert bench_gpu.peer(w, "numpy", 1) == "numpy is not a GPU system"
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        assert "torch.cuda.is_available() is False" in bench_gpu.peer(w, "torch", 1)
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert "no CUDAExecutionProvider" in bench_gpu.peer(w, "onnxruntime", 1)


@pytest.mark.skipif(not NO_GPU, reason="a GPU exists here: --target cuda would run")
@pytest.mark.parametrize("cmd", [["scripts/bench.py", "--target", "cuda"], ["scripts/gpu_check.py"]])
def test_cuda_commands_without_a_gpu_exit_3_at_once(cmd):
    t0 = time.time()
    p = subprocess.run([sys.executable, *cmd], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 3, p.stderr
    assert time.time() - t0 < 30  # nothing was built
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("error: ") and "no CUDA GPU on this machine" in line


def test_tvm_device_timer_flushes_before_every_single_timed_call():
    """The device clock's TVM side is the VM's time_evaluator with number=1 and the flush as its
    f_preproc; on the CPU (whose clock is the device clock) the same code runs."""
    from tvmfuse.bench.gpu_clock import tvm_device_timer

    c = built("softmax_decomposed", "tvmfuse")
    args = c.convert_inputs(workloads.get("softmax_decomposed", "small").inputs())
    flushes = []
    timed = tvm_device_timer(c.vm(), args, c.device, lambda: flushes.append(1))
    samples = timed(4)
    assert len(samples) == 4 and all(0 < s < 1 for s in samples)
    assert len(flushes) == 4  # one flush before each timed call


def test_no_cuda_timer_is_a_reason_not_a_host_clock_figure():
    from tvmfuse.bench.gpu_clock import CUDA_TIMER, device_timer_reason

    if not tvm.runtime.enabled("cuda"):
        assert CUDA_TIMER in device_timer_reason(tvm.cuda(0))
    assert device_timer_reason(tvm.cpu(0)) is None


def test_gpu_rounds_keep_both_clocks_and_the_report_shows_the_launch_overhead():
    order = []
    ready = {"tvmfuse": bench.Ready(call=lambda: None, out=np.zeros(1)),
             "onnxruntime": bench.Ready(call=lambda: None, out=np.zeros(1))}

    def device(r, n):
        order.append(("device", n))
        return [0.001] * n if r is ready["tvmfuse"] else "host clock only"

    def sample(r):
        order.append(("host", 3))
        return [0.0015] * 3

    samples, _, on_device = bench._rounds(ready, sample, 2, device)
    assert order[:2] == [("host", 3), ("device", 3)]
    assert on_device == {"tvmfuse": [0.001] * 6, "onnxruntime": "host clock only"}
    row = bench.Row("w", ms={"tvmfuse": 1.5, "onnxruntime": 2.0}, device_ms={"tvmfuse": 1.0},
                    no_device_clock={"onnxruntime": "host clock only"}, ok={"tvmfuse": True, "onnxruntime": True})
    text = bench.summary([row], ["tvmfuse", "onnxruntime"])
    assert "| w | 1.0000 (+0.5000) |" in text and "- no device clock, onnxruntime: host clock only" in text
