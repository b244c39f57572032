"""Measure candidate schedules of one task the way MetaSchedule measures its trials.

Contract: `measure(mods, target, builder, runner)` builds every `{"main": PrimFunc}` module with the
tuning builder and times it with the tuning runner (same EvaluatorConfig, same device: local or
RPC), in one batch, and returns the mean seconds per module (None when a build or run failed).
The never-slower rule compares the default schedule with the best tuned record through this
function, so both are measured the same way.
"""
from __future__ import annotations

import logging

import tvm
from tvm.s_tir import meta_schedule as ms

import schedules

log = logging.getLogger("tvmfuse.tuning")


def default_scheduled(task_mod: tvm.IRModule, target) -> tvm.IRModule | None:
    """The task under tvmfuse's default schedule rules; None if no rule applies."""
    out = schedules.apply_default_schedules(task_mod, target)
    f = out["main"]
    return out if f.attrs and f.attrs.get("tirx.is_scheduled") else None


def measure(mods: list[tvm.IRModule | None], target, builder, runner) -> list[float | None]:
    idx = [i for i, m in enumerate(mods) if m is not None]
    results: list[float | None] = [None] * len(mods)
    if not idx:
        return results
    builds = builder.build([ms.builder.BuilderInput(mods[i], target) for i in idx])
    run_inputs, run_idx = [], []
    for i, b in zip(idx, builds):
        if b.error_msg:
            log.warning("build of a reference schedule failed: %s", b.error_msg.strip().splitlines()[-1][:200])
            continue
        args = ms.arg_info.ArgInfo.from_prim_func(mods[i]["main"])
        device = "cpu" if target.kind.name == "llvm" else target.kind.name
        run_inputs.append(ms.runner.RunnerInput(b.artifact_path, device, args))
        run_idx.append(i)
    futures = runner.run(run_inputs) if run_inputs else []
    for i, fut in zip(run_idx, futures):
        res = fut.result()
        if res.error_msg or not res.run_secs:
            log.warning("run of a reference schedule failed: %s", (res.error_msg or "no timings")[:200])
            continue
        secs = [float(s) for s in res.run_secs]
        results[i] = sum(secs) / len(secs)
    _cleanup(builds)
    return results


def _cleanup(builds) -> None:
    import os
    import shutil

    for b in builds:
        if b.artifact_path:
            shutil.rmtree(os.path.dirname(b.artifact_path), ignore_errors=True)
