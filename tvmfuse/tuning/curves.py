"""Tuning curves for reports: `curves(logs_dir, target) -> {task: [(trial_index, best_ms), ...]}`.

Contract: reads the records of `<logs_dir>/<target key>/` in file (trial) order and returns, per
task, the running best latency after each trial (failed trials repeat the previous best; leading
failures are left out). Task names come from `tasks.json`; a workload without a task line is named
by its key. Read-only; corrupt lines are skipped with a warning.
"""
from __future__ import annotations

import os

from ..target import resolve
from . import decisions
from .database import DurableDatabase, mean_secs, workload_key
from .keys import target_dir


def curves(logs_dir: str, target="llvm") -> dict[str, list[tuple[int, float]]]:
    folder = target_dir(logs_dir, resolve(target), create=False)
    if not os.path.isdir(folder):
        return {}
    names = {k: d.task for k, d in decisions.load(folder).items()}
    db = DurableDatabase(folder)
    keys: list = []  # (workload, key); FFI objects are matched by identity
    out: dict[str, list[tuple[int, float]]] = {}
    best: dict[str, float] = {}
    count: dict[str, int] = {}
    for wl, rec in db.records_in_order:
        handle = next((k for w, k in keys if w.same_as(wl)), None)
        if handle is None:
            handle = workload_key(wl)
            keys.append((wl, handle))
        name = names.get(handle, handle)
        count[name] = count.get(name, 0) + 1
        secs = mean_secs(rec)
        if secs < 1e9:
            best[name] = min(best.get(name, secs), secs)
        if name in best:
            out.setdefault(name, []).append((count[name], best[name] * 1e3))
    return out
