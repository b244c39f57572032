"""Tuning tasks of a fused module, pure TIR: no pipeline here (pipeline.py's apply_tuning phase
imports this through apply.py; the pipeline client that makes the fused module is tasks.py).

- `extract(mod)` gives one `Task` per structurally distinct, unscheduled PrimFunc. Its `mod` is
  the function's tuning form (`tuning_form`), normalized the way `MetaScheduleApplyDatabase`
  normalizes a function before querying (`s_tir.meta_schedule.normalize_mod`), so a record found
  here is the record applied at build (apply.py queries with the same form), in this model or in
  any other model with the same PrimFunc. `source` is the function as the build schedules it by
  default: the never-slower rule measures the default schedule on it.
- `tuning_form(func)`: the function with its stages that only copy a parameter inlined. A fused
  group reads per-channel parameters through reshape stages indexed `(c + h + w) % C`; MetaSchedule's
  AutoInline keeps such a stage (it takes the `%` read for non-injective), and its tiling of the
  group's epilogue then fails (reverse_compute_at: producers outside the loop), so the whole task
  errors. Inlined, the epilogue reads the parameter itself. (StmtSimplify would also remove the
  `%`, but it folds the unit-loop bindings that MetaSchedule's multi-level tiling and dlight's
  analysis need: every trial came out untiled.) The default rules keep the source form.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax
from tvm.s_tir.meta_schedule.tir_integration import _normalize_mod

from ..relax_utils import call_tir_sites


@dataclass
class Task:
    name: str  # the PrimFunc's name in the module (first one if several share the workload)
    mod: tvm.IRModule  # normalized {"main": tuning_form(PrimFunc)}: what MetaSchedule tunes
    weight: int  # call sites in main (in every version of main in a bucketed build)
    key: str = ""  # workload structural hash, filled by the driver
    source: tvm.IRModule | None = None  # normalized {"main": PrimFunc}: what the default rules schedule


def normalize(func: tvm.tirx.PrimFunc) -> tvm.IRModule:
    return _normalize_mod(func)


def tuning_form(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    func = without_own_attrs(func)
    sch = tvm.s_tir.Schedule(func)
    try:
        root = sch.get_sblock("root")
    except tvm.s_tir.ScheduleError:  # hand-written TIR without blocks (a scan, a sort): as it is
        return func
    local = {b.name for b in sch.get(root).alloc_buffers}
    inlined = True
    while inlined:  # one at a time: inlining changes the blocks
        inlined = False
        for b in sch.get_child_blocks(root):
            if _copies_a_parameter(sch.get(b), local):
                try:
                    sch.compute_inline(b)
                except tvm.s_tir.ScheduleError:
                    continue
                inlined = True
                break
    return sch.mod["main"]


def own_attrs(func) -> dict:
    """tvmfuse's bookkeeping attributes (`tvmfuse.*`: group, constant params, ...) of a PrimFunc."""
    return {k: v for k, v in (func.attrs or {}).items() if str(k).startswith("tvmfuse.")}


def without_own_attrs(func):
    """The workload without tvmfuse's bookkeeping: a record matches however the function was fused
    or stamped (apply.py puts the attributes back on the tuned function)."""
    for k in own_attrs(func):
        func = func.without_attr(k)
    return func


def _copies_a_parameter(block, local) -> bool:
    """A stage that only re-indexes function parameters into a buffer of the group (a reshape of a
    batch-norm vector): value = param[index]."""
    body = block.body
    return (isinstance(getattr(body, "value", None), tvm.ir.TensorLoad) and len(block.reads) > 0
            and all(r.source.name not in local for r in block.reads)
            and all(w.source.name in local for w in block.writes))


def extract(mod: tvm.IRModule) -> list[Task]:
    calls: dict[str, int] = {}
    for _, func in mod.functions_items():  # main, and a bucketed build's versions of it
        if isinstance(func, relax.Function):
            for _, gv, _, _ in call_tir_sites(func):
                calls[gv.name_hint] = calls.get(gv.name_hint, 0) + 1
    tasks: list[Task] = []
    for gv, func in sorted(mod.functions_items(), key=lambda kv: kv[0].name_hint):
        if not isinstance(func, tvm.tirx.PrimFunc) or (func.attrs and func.attrs.get("tirx.is_scheduled")):
            continue
        norm = normalize(tuning_form(func))
        weight = calls.get(gv.name_hint, 0)
        if weight == 0:
            continue
        same = next((t for t in tasks if tvm_ffi.structural_equal(t.mod, norm)), None)
        if same:
            same.weight += weight
        else:
            tasks.append(Task(gv.name_hint, norm, weight, source=normalize(func)))
    return tasks
