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
