"""Target resolution: user-facing names -> tvm.target.Target dicts.

`llvm` is built for the host CPU (mcpu detected, so AVX-512 etc. are used; num-cores follows the
machine). `cuda` defaults to sm_90 and is compile-only on a machine without a GPU.
"""
from __future__ import annotations

import os

import tvm

from .errors import TargetError

KNOWN = ("llvm", "cuda")


def host_cpu() -> str:
    return str(tvm.target.codegen.llvm_get_system_cpu())


def num_cores() -> int:
    """Cores this process may run on: its CPU affinity set, one thread per physical core
    (hyper-threads share a core's vector units, so compute-bound kernels gain nothing from them)."""
    import psutil

    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    logical, physical = psutil.cpu_count() or allowed, psutil.cpu_count(logical=False) or allowed
    return max(1, allowed // max(1, logical // physical))


_THREAD_VARS = ("TVM_NUM_THREADS", "OMP_NUM_THREADS")  # what TVM's thread pool reads, in order


def runtime_threads() -> int:
    """The CPU threads TVM's runtime uses in this process (and the count every baseline of the
    benchmark is given): TVM_NUM_THREADS, else OMP_NUM_THREADS, else num_cores()."""
    for var in _THREAD_VARS:
        if os.environ.get(var, "").strip().isdigit() and int(os.environ[var]) > 0:
            return int(os.environ[var])
    return num_cores()


# Yields a TVM pool worker spins through after its task before it sleeps (TVM_THREAD_POOL_SPIN_COUNT).
# TVM's default, 300000, kept both workers spinning for ~75 ms after every call: 150 ms of CPU burnt
# in 200 ms idle, taken from whatever else the process runs (PyTorch around a torch.compile
# backend, the benchmark's peers). 0 wakes the workers with a futex for every kernel launch:
# MobileNetV2's 54 launches ran 6.06 ms instead of 4.91. 100 yields (well under 0.1 ms here) keep
# the workers awake across back-to-back launches and let them sleep once the model returns: 4.91
# ms, 0.1 ms of CPU burnt after a call (znver4, 2 threads, scripts/bench.py's timing loop).
SPIN_COUNT = 100


def bound_spinning() -> None:
    """Have TVM's CPU workers spin SPIN_COUNT yields between kernels, then sleep, unless the user
    set TVM_THREAD_POOL_SPIN_COUNT. Read once, when the pool starts: tvmfuse sets it on import."""
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", str(SPIN_COUNT))


def use_all_cores() -> None:
    """Size TVM's CPU thread pool to num_cores() unless the user chose (TVM_NUM_THREADS or
    OMP_NUM_THREADS set). TVM's own default on x86 is half the logical CPUs, on the assumption of
    hyper-threading: on a machine without it (2 vCPUs here) every kernel ran on 1 thread of 2.
    The pool reads the variable once, when it starts (the first parallel kernel of a thread), so
    tvmfuse sets it on import; subprocesses (MetaSchedule's builders and runners) inherit it."""
    if not any(os.environ.get(v, "").strip() for v in _THREAD_VARS):
        os.environ["TVM_NUM_THREADS"] = str(num_cores())


def resolve(target="llvm", arch: str = "sm_90") -> tvm.target.Target:
    """Turn "llvm" / "cuda" / a dict / a Target into a Target. Unknown names raise TargetError."""
    if isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, dict):
        try:
            return tvm.target.Target(target)
        except Exception as err:  # TVM's message is long; keep it but say what we were given
            raise TargetError(f"invalid target dict {target!r}: {err}") from None
    if not isinstance(target, str) or (target.split() or [""])[0] not in KNOWN:  # "" too
        raise TargetError(
            f"unknown target {target!r}: use one of {', '.join(KNOWN)} "
            "(or pass a dict such as {'kind': 'cuda', 'arch': 'sm_90'})"
        )
    if target == "llvm":
        return tvm.target.Target({"kind": "llvm", "mcpu": host_cpu(), "num-cores": num_cores()})
    if target == "cuda":
        return tvm.target.Target(
            {
                "kind": "cuda",
                "arch": arch,
                "max_threads_per_block": 1024,
                "max_shared_memory_per_block": 49152,
                "thread_warp_size": 32,
            }
        )
    raise TargetError(f"target {target!r} takes no options as a string; pass a dict instead")


def is_gpu(target: tvm.target.Target) -> bool:
    return target.kind.name == "cuda"


def cpu_name() -> str:
    """The host CPU's model name (what every benchmark table names), e.g. "AMD EPYC"."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()
