"""Default schedules for (fused) PrimFuncs, per target. Entry points: `apply_default_schedules`,
then `lower_math` (vectorizable exp/erf on llvm, for every PrimFunc however it was scheduled)."""
from __future__ import annotations

import logging

import tvm

from .cpu import rules as cpu
from .cuda import rules as cuda
from .rule import apply_rules
from .cpu.vector_math import lower_math

__all__ = ["apply_default_schedules", "lower_math"]

log = logging.getLogger("tvmfuse.schedule")


def apply_default_schedules(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """Schedule every unscheduled PrimFunc of `mod` for `target`. Returns a new module."""
    mod = mod.clone()
    gpu = target.kind.name == "cuda"
    rules = cuda.rules() if gpu else cpu.RULES
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    for gv, func in mod.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc) or func.attrs and func.attrs.get("tirx.is_scheduled"):
            continue
        sched, rule = apply_rules(func, target, rules, gv.name_hint)
        rule = str(sched.attrs["tvmfuse.rule"]) if rule and sched.attrs and "tvmfuse.rule" in sched.attrs else rule
        if rule is None:
            log.warning("no %s schedule rule applied to %s; left unscheduled", target.kind.name, gv.name_hint)
            continue
        for key, value in (func.attrs or {}).items():  # tvmfuse's bookkeeping (group, constant params,
            if str(key).startswith("tvmfuse.") and not (sched.attrs and key in sched.attrs):  # ...) stays
                sched = sched.with_attr(key, value)  # on a kernel a rule wrote anew
        out[gv] = sched.with_attr("tirx.is_scheduled", True).with_attr("tvmfuse.rule", rule)
    if not gpu:  # a kernel too small for a parallel launch runs serially (cpu/small_kernels.py)
        from tvmfuse.target import runtime_threads

        from .cpu.small_kernels import serial_when_small

        threads = runtime_threads()
        for gv, func in list(out.functions_items()):
            if isinstance(func, tvm.tirx.PrimFunc) and func.attrs and func.attrs.get("tvmfuse.rule"):
                out[gv] = serial_when_small(func, threads)
    if gpu:  # every kernel, tuned ones too: no vector loads of bool, no stage left on the host
        for gv, func in list(out.functions_items()):
            if isinstance(func, tvm.tirx.PrimFunc) and func.attrs and func.attrs.get("tirx.is_scheduled"):
                out[gv] = cuda.bind_stray_loops(cuda.scalar_bool_loads(func))
    return out
