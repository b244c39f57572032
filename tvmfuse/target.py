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
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


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
