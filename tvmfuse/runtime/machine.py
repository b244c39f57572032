"""The machine record every benchmark's JSON carries, and its one-line form for the markdown header.

Contract: `record(target)` returns a dict with the CPU model (/proc/cpuinfo "model name"), the llvm
mcpu the TVM systems are built for, the cores this process may use and the threads every system
runs, L2 and L3 sizes (sysfs, per cache instance), the GPU when the target is CUDA, the git commit
of the tvmfuse checkout (short hash, and whether the tree had uncommitted changes), and the
versions of python, tvm, tvm-ffi, torch, onnxruntime, onnx and numpy (None for what is not
installed, read from the package metadata so nothing is imported for it). `describe(rec)` is the
record in one line.
"""
from __future__ import annotations

import glob
import os
import platform
import subprocess
from importlib import metadata

_PACKAGES = {"tvm": "apache-tvm", "tvm-ffi": "apache-tvm-ffi", "torch": "torch", "onnxruntime": "onnxruntime",
             "onnx": "onnx", "numpy": "numpy"}
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout tvmfuse/ is in


def _size_bytes(text: str) -> int:
    text = text.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text.rstrip("KMGkmg")) * mult


def cache_sizes() -> dict:
    """{"L1d", "L1i", "L2", "L3": bytes per cache instance} of cpu0 from sysfs ({} when unknown)."""
    out = {}
    for index in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            level = open(os.path.join(index, "level")).read().strip()
            kind = open(os.path.join(index, "type")).read().strip()
            size = _size_bytes(open(os.path.join(index, "size")).read())
        except (OSError, ValueError):  # an entry sysfs does not fill on this kernel
            continue
        name = f"L{level}" + {"Data": "d", "Instruction": "i"}.get(kind, "")
        out[name] = size
    return out


def git_commit(root: str = _ROOT) -> dict:
    """{"hash": short hash, "dirty": uncommitted changes to tracked files} of the checkout, or
    {"hash": None, "dirty": None} outside a git checkout (an installed package)."""
    def git(*args):
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=30)

    try:
        head = git("rev-parse", "--short", "HEAD")
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired):  # no git binary
        return {"hash": None, "dirty": None}
    if head.returncode != 0:
        return {"hash": None, "dirty": None}
    return {"hash": head.stdout.strip(), "dirty": bool(status.stdout.strip())}


def versions() -> dict:
    out = {"python": platform.python_version()}
    for name, dist in _PACKAGES.items():
        try:
            out[name] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def record(target="llvm") -> dict:
    """The machine record of a benchmark run for `target` ("llvm", "cuda" or a Target)."""
    import tvm

    from ..target import cpu_name, host_cpu, num_cores, resolve, runtime_threads

    t = resolve(target)
    rec = {"cpu": cpu_name(), "mcpu": str(t.attrs["mcpu"]) if "mcpu" in t.attrs else host_cpu(),
           "cores": num_cores(), "logical_cpus": os.cpu_count(), "threads": runtime_threads(),
           "caches": cache_sizes(), "target": str(t), "commit": git_commit(), "versions": versions()}
    if t.kind.name == "cuda":
        dev = tvm.cuda(0)
        rec["gpu"] = str(dev.device_name) if dev.exist else None
    return rec


def _mib(n):
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n / 2**10:g} KiB"


def describe(rec: dict) -> str:
    """One line: CPU, mcpu, cores/threads, caches, GPU, commit, versions."""
    caches = ", ".join(f"{k} {_mib(v)}" for k, v in rec["caches"].items() if k in ("L2", "L3"))
    commit = rec["commit"]["hash"] or "no git checkout"
    if rec["commit"]["dirty"]:
        commit += " (dirty)"
    libs = ", ".join(f"{k} {v}" for k, v in rec["versions"].items() if v)
    gpu = f"; GPU {rec['gpu']}" if rec.get("gpu") else ""
    return (f"machine: {rec['cpu']}, llvm mcpu={rec['mcpu']}, {rec['cores']} cores ({rec['logical_cpus']} logical), "
            f"{rec['threads']} threads per system, {caches or 'caches unknown'}{gpu}; commit {commit}; {libs}")
