"""TVM's CPU thread pool gets every core tvmfuse may use (TVM's own x86 default is half the
logical CPUs, which on a machine without hyper-threading leaves half the cores idle). tvmfuse sets
it up on its first build, not on import (tvmfuse/install.py; tests/test_import_side_effects.py)."""
import os
import subprocess
import sys

import psutil
import pytest

from tvmfuse import target


# a first build (what sets TVM's pool up), then the code that reads it
_FIRST_BUILD = """
import tvmfuse, tvm
from tvm import relax
bb = relax.BlockBuilder()
x = relax.Var("x", relax.TensorType((16,), "float32"))
with bb.function("main", [x]):
    with bb.dataflow():
        out = bb.emit_output(relax.op.exp(x))
    bb.emit_func_output(out)
tvmfuse.build(bb.get(), "llvm")
"""


def _threads_in_child(env):
    code = _FIRST_BUILD + "print(tvm.runtime.num_threads())"
    env = {k: v for k, v in env.items()}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def _clean_env():
    return {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}


def test_first_build_sizes_the_pool_to_the_cores():
    assert _threads_in_child(_clean_env()) == target.num_cores()


@pytest.mark.parametrize("var", ["TVM_NUM_THREADS", "OMP_NUM_THREADS"])
def test_a_user_choice_is_kept(var):
    assert _threads_in_child({**_clean_env(), var: "1"}) == 1


def test_runtime_threads_reads_the_variables(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("TVM_NUM_THREADS", "3")
    assert target.runtime_threads() == 3
    monkeypatch.setenv("TVM_NUM_THREADS", "junk")  # not a count: the default
    assert target.runtime_threads() == target.num_cores()


def test_one_thread_per_physical_core(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 16 if logical else 8)
    assert target.num_cores() == 8  # 2 hyper-threads per core
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert target.num_cores() == 2  # a 4-CPU affinity set is 2 cores
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 16)  # no hyper-threading
    assert target.num_cores() == 4


_IDLE = """
import resource, time
import numpy as np
from tvm import relax
import tvmfuse

bb = relax.BlockBuilder()
x = relax.Var("x", relax.TensorType((1 << 20,), "float32"))
with bb.function("main", [x]):
    with bb.dataflow():
        out = bb.emit_output(relax.op.exp(relax.op.add(x, x)))
    bb.emit_func_output(out)
c = tvmfuse.build(bb.get(), "llvm")
f, args = c.vm()["main"], c.convert_inputs([np.ones(1 << 20, "float32")])
cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
burnt = []
for _ in range(5):
    for _ in range(20):
        f(*args)  # a parallel kernel: the pool's workers ran a task each
    c0 = cpu()
    time.sleep(0.2)
    burnt.append(cpu() - c0)
print(sorted(burnt)[2] * 1e3)
"""


def _idle_cpu_ms(env):
    out = subprocess.run([sys.executable, "-c", _IDLE], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


@pytest.mark.skipif(target.num_cores() < 2, reason="one core: TVM's pool has no workers to spin")
def test_idle_workers_sleep_soon_after_a_call():
    """tvmfuse bounds the pool's spin (target.SPIN_COUNT) on its first build: after a call the workers
    sleep within well under a millisecond, instead of burning the cores for ~75 ms as TVM's
    default does (the control, with TVM's default spin set by hand, shows the measure can fail)."""
    env = {k: v for k, v in _clean_env().items() if k != "TVM_THREAD_POOL_SPIN_COUNT"}
    assert _idle_cpu_ms(env) < 20
    # the control crosses the same 20 ms line: TVM's 300000 yields burn ~75 ms on the AMD EPYCs and
    # ~46 ms on the Intel Xeon (yields cost what the host makes them), against ~0.1 ms bounded. On a
    # host whose cores are busy with other work (parallel test workers), each yield hands the core
    # away and the spin costs the process nothing: the control cannot tell, so the check is skipped
    control = _idle_cpu_ms({**env, "TVM_THREAD_POOL_SPIN_COUNT": "300000"})
    if control <= 20 and psutil.cpu_percent(interval=0.5) > 40:
        pytest.skip(f"the host's cores are busy: the unbounded control burnt only {control:.2f} ms")
    assert control > 20


def test_a_users_spin_count_is_kept():
    code = _FIRST_BUILD + "import os; print(os.environ['TVM_THREAD_POOL_SPIN_COUNT'])"
    env = {**_clean_env(), "TVM_THREAD_POOL_SPIN_COUNT": "7"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == "7"
