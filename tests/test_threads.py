"""TVM's CPU thread pool gets every core tvmfuse may use (TVM's own x86 default is half the
logical CPUs, which on a machine without hyper-threading leaves half the cores idle)."""
import os
import subprocess
import sys

import psutil
import pytest

from tvmfuse import target


def _threads_in_child(env):
    code = "import tvmfuse, tvm; print(tvm.runtime.num_threads())"
    env = {k: v for k, v in env.items()}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def _clean_env():
    return {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}


def test_import_sizes_the_pool_to_the_cores():
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
