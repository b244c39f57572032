"""Apply tuned schedules at build: `apply_logs(mod, target, logs)`.

Contract: takes the module after the variant's graph passes (before the default schedules) and
returns it with every PrimFunc whose workload has a record that won against the default schedule
(`tasks.json`: use_tuned) replaced by that record's schedule, through MetaSchedule's own
`MetaScheduleApplyDatabase` queried with each function's tuning form (tasks.tuning_form). Those
PrimFuncs carry `tirx.is_scheduled` (so the default rules skip them) and `tvmfuse.tuned` = the
workload key. Everything else is left for the default schedules.
No logs folder for the target means nothing to apply. Nothing is measured here.
"""
from __future__ import annotations

import logging
import os

import tvm
from tvm import relax
from tvm.s_tir import meta_schedule as ms

from . import decisions
from .database import DurableDatabase, workload_key
from .keys import target_dir, target_key
from .tir_form import normalize, own_attrs, tuning_form

log = logging.getLogger("tvmfuse.tuning")


def winning_database(folder: str) -> tuple[ms.database.MemoryDatabase, int]:
    """A MemoryDatabase with the best record of each workload whose record beat the default."""
    won = {k for k, d in decisions.load(folder).items() if d.use_tuned}
    out = ms.database.MemoryDatabase()
    n = 0
    if not won:
        return out, 0
    db = DurableDatabase(folder)
    for wl in db.workloads():
        if workload_key(wl) not in won:
            continue
        top = db.get_top_k(wl, 1)
        if top and target_key(top[0].target) != os.path.basename(os.path.normpath(folder)):
            log.warning("%s: skipping the record of %s: it was tuned for %s (%s), not for this folder's target",
                        folder, workload_key(wl), target_key(top[0].target), top[0].target.kind.name)
            continue
        if top:
            out.commit_tuning_record(ms.database.TuningRecord(top[0].trace, out.commit_workload(wl.mod),
                                                              top[0].run_secs, top[0].target,
                                                              top[0].args_info))
            n += 1
    return out, n


def apply_logs(mod: tvm.IRModule, target: tvm.target.Target, logs: str) -> tvm.IRModule:
    folder = target_dir(logs, target, create=False)
    if not os.path.isdir(folder):
        log.info("no tuning logs for %s under %s; default schedules only", target, logs)
        return mod
    db, n = winning_database(folder)
    if n == 0:
        return mod
    unscheduled = {gv.name_hint for gv, f in mod.functions_items()
                   if isinstance(f, tvm.tirx.PrimFunc) and not (f.attrs and f.attrs.get("tirx.is_scheduled"))}
    query = tvm.IRModule({gv: tuning_form(f) if gv.name_hint in unscheduled else f
                          for gv, f in mod.functions_items()}, attrs=mod.attrs)  # the form tasks.py tuned
    with target, db, tvm.transform.PassContext(opt_level=3):
        tuned = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(query)
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)  # the rest keep their own form
    for gv, f in tuned.functions_items():
        if (isinstance(f, tvm.tirx.PrimFunc) and gv.name_hint in unscheduled and f.attrs
                and f.attrs.get("tirx.is_scheduled")):
            for k, v in own_attrs(mod[gv]).items():  # the group, constant params, ... of the build
                f = f.with_attr(k, v)
            out[gv] = f.with_attr("tvmfuse.tuned", workload_key(normalize(query[gv])))
    return out
