"""The generated code of a build: LLVM IR or CUDA C, and the CUDA kernels it defines.

Read by `Compiled.source()` (build.py), the debug dump's `50_source.*` (debug.py) and the GPU
check's manifest (bench/gpu_cases.py); it knows nothing of either, so both can import it.
"""
from __future__ import annotations

import re

_KERNEL_DEF = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\(\d+\)\s+)?(\w+)\s*\([^;{]*\)\s*\{")


def cuda_source(module) -> str:
    """The CUDA C of every cuda module under a runtime module (walking its imports: VM -> llvm
    host -> cuda); "" when it has none."""
    stack, srcs = [module], []
    while stack:
        m = stack.pop()
        if m.kind == "cuda":
            srcs.append(m.inspect_source())
        stack.extend(m.imports)
    return "\n".join(srcs)


def llvm_source(module) -> str:
    """The LLVM IR of a runtime module's host code ("" when it imports none)."""
    return module.imports[0].inspect_source("ll") if module.imports else ""


def generated_source(module, target) -> str:
    """The kernels' code of a runtime module built for `target`: CUDA C for cuda, else LLVM IR."""
    return cuda_source(module) if target.kind.name == "cuda" else llvm_source(module)


def cuda_kernels(source: str) -> list[str]:
    """Names of the __global__ kernels DEFINED in CUDA source (each is also declared once: those
    declarations are not counted)."""
    return _KERNEL_DEF.findall(source)


_PTX_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\(")
_PTXAS_FUNC = re.compile(r"Function properties for (\w+)\s*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
                         r"(\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Compiling entry function '(\w+)'.*?\n.*?Used (\d+) registers", re.S)


def cuda_ptx(source: str, arch: str) -> tuple[dict, dict]:
    """CUDA C compiled as the device would get it: ({kernel: its PTX}, {kernel: ptxas -v's report:
    registers, stack, spill_stores, spill_loads (bytes)}). nvcc turns the source into PTX for
    `arch` ("sm_80"), ptxas -v assembles it; both must be on PATH (no GPU needed)."""
    import os
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cu, ptx = os.path.join(tmp, "k.cu"), os.path.join(tmp, "k.ptx")
        with open(cu, "w") as f:
            f.write(source)
        subprocess.run(["nvcc", "-ptx", f"-arch={arch}", "-o", ptx, cu], check=True, capture_output=True)
        log = subprocess.run(["ptxas", "-v", f"-arch={arch}", "-o", os.path.join(tmp, "k.cubin"), ptx],
                             check=True, capture_output=True, text=True)
        with open(ptx) as f:
            text = f.read()
    report = log.stdout + log.stderr
    kernels = {}
    parts = _PTX_ENTRY.split(text)
    for name, body in zip(parts[1::2], parts[2::2]):
        kernels[name] = body
    stats = {m[0]: {"stack": int(m[1]), "spill_stores": int(m[2]), "spill_loads": int(m[3])}
             for m in _PTXAS_FUNC.findall(report)}
    for name, regs in _PTXAS_REGS.findall(report):
        stats.setdefault(name, {})["registers"] = int(regs)
    return kernels, stats
