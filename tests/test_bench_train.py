"""Smoke test of `scripts/bench.py --train --quick` (tvmfuse/bench/train.py) on the MLP: one
training step per system, the JSON rows with their launches, bytes and numerics, and its errors."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "bench.py")


def _run(*args):
    return subprocess.run([sys.executable, SCRIPT, "--train", *args], capture_output=True, text=True, timeout=600)


def test_quick_train_bench_on_the_mlp_writes_json_and_markdown(tmp_path):
    out, md = tmp_path / "train.json", tmp_path / "train.md"
    p = _run("--quick", "--workloads", "mlp", "--json", str(out), "--markdown", str(md))
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    assert doc["mode"] == "train" and doc["machine"]["cpu"] and "threads for every system" in doc["timing"]
    (row,) = doc["rows"]
    systems = {"torch", "torch.compile", "tvmfuse"}
    assert (row["workload"], row["optimizer"]) == ("mlp", "sgd")
    assert set(row["ms"]) == systems and all(v > 0 for v in row["ms"].values())
    assert row["ok"] == dict.fromkeys(systems, True)  # parameters after the warm-up steps match eager's
    tvmfuse = row["parts"]["tvmfuse"]
    assert tvmfuse["forward"] > 0 and tvmfuse["backward"] > 0  # built by tvmfuse, launches from its plans
    assert row["launches"]["tvmfuse"] == (tvmfuse["forward"] + tvmfuse["backward"] + tvmfuse["optimizer"]
                                          + tvmfuse["copy_back"])
    # the optimizer step is built by tvmfuse: one kernel for the 6 parameters' updates, writing each
    # new parameter and momentum buffer in place (no copy_ back); fewer launches than eager's ops
    assert tvmfuse["optimizer"] == 1 and tvmfuse["copy_back"] == 0
    assert tvmfuse["optimizer"] + tvmfuse["copy_back"] < row["parts"]["torch"]["optimizer"]
    inductor = row["parts"]["torch.compile"]
    assert inductor["forward+backward"] > 0 and inductor["optimizer"] > 0
    assert row["bytes"]["tvmfuse"] > 0 and "optimizer step built by tvmfuse" in row["notes"]["tvmfuse"]
    assert "| mlp | sgd |" in p.stdout and "| mlp | sgd |" in md.read_text()
    # the optimizer step alone against its bound: 4256 parameters, SGD with momentum reads each
    # parameter, gradient and momentum and writes the parameter and momentum (5 x 4 bytes)
    assert row["opt_bytes"] == 5 * 4 * 4256 and row["bound_ms"] > 0
    assert set(row["opt_ms"]) == systems and all(v > 0 for v in row["opt_ms"].values())
    assert "memory bandwidth" in p.stdout and "optimizer bytes bound ms" in md.read_text()


def test_optimizer_bytes_count_the_state_of_each_parameter():
    import torch

    from tvmfuse.bench.train import _update_bytes

    w, b = torch.nn.Parameter(torch.randn(8, 4)), torch.nn.Parameter(torch.randn(4))
    opt = torch.optim.AdamW([w, b])
    assert _update_bytes(opt) == 0  # no gradient yet: nothing to update
    (w.sum() + b.sum()).backward()
    opt.step()  # exp_avg and exp_avg_sq per parameter, and a scalar step that is not counted
    assert _update_bytes(opt) == 7 * 4 * (32 + 4)


def test_train_bench_rejects_unknown_names():
    p = _run("--quick", "--workloads", "resnet9000", "--optimizers", "lion")
    assert p.returncode == 2 and "unknown workload 'resnet9000', optimizer 'lion'" in p.stderr


def test_inductor_kernel_calls_are_counted_in_its_generated_call(tmp_path):
    """Inductor's launches: the statements of its generated `call()` that run a kernel, whether the
    result is assigned (`buf6 = extern_kernels.convolution(...)`) or written to an `out=` buffer;
    allocations, asserts and other functions of the module are not launches."""
    import types

    from tvmfuse.bench.train import _inductor_calls

    src = tmp_path / "gen.py"
    src.write_text("def helper():\n    cpp_fused_9(a)\n\n"
                   "def call(self, args):\n"
                   "        buf0 = empty_strided_cpu((8, 64), (64, 1), torch.float32)\n"
                   "        assert_size_stride(primals_1, (64, 32), (32, 1))\n"
                   "        extern_kernels.addmm(primals_2, primals_3, buf9, alpha=1, beta=1, out=buf0)\n"
                   "        cpp_fused_gelu_0(buf0, buf1)\n"
                   "        buf6 = extern_kernels.convolution(buf1, buf0, stride=(1, 1))\n"
                   "        return (buf6, )\n\n"
                   "def benchmark_compiled_module(times=10):\n    cpp_fused_gelu_0(x)\n")
    assert _inductor_calls([types.SimpleNamespace(__file__=str(src))]) == 3


def test_the_parameter_check_allows_adams_noise_steps_but_not_sgds():
    """After the warm-up steps: AdamW's parameters may differ from eager's by 1% of the distance the
    steps can move them (lr per step, whatever the gradient), SGD's only within rtol/atol."""
    import types

    import torch

    from tvmfuse.bench import train

    w = torch.nn.Parameter(torch.zeros(4))
    noise = train.NORMALIZED_STEP_TOL * 1e-3 * train.WARMUP_STEPS / 2  # half the allowance at lr 1e-3
    for opt, ok in ((torch.optim.AdamW([w], lr=1e-3), True), (torch.optim.SGD([w], lr=1e-3), False)):
        step = types.SimpleNamespace(opt=opt, model=types.SimpleNamespace(parameters=lambda: [w]))
        assert train._params_close(step, [torch.full((4,), noise)]) is ok
    adam = types.SimpleNamespace(opt=torch.optim.AdamW([w], lr=1e-3), model=types.SimpleNamespace(parameters=lambda: [w]))
    assert not train._params_close(adam, [torch.full((4,), 4 * noise)])
