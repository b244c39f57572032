"""Merge tuning-log folders: `merge([A, B], C)` keeps the best record per workload.

Contract
- Inputs are target folders (`tuning_logs/llvm-znver5`) or logs roots (`tuning_logs`); a root is
  merged folder by folder (same target key into the same key under the output).
- Per workload the output holds the one record with the lowest mean latency over all inputs, and
  the `tasks.json` line that goes with it (the input the record came from), so the never-slower
  decision travels with the record. Inputs are only read (corrupt lines skipped with warnings).
- The output may already hold records: it is one of the inputs then, and it is appended to
  durably under its lock like any tuning run.
"""
from __future__ import annotations

import os

from tvm.s_tir import meta_schedule as ms

from . import decisions
from .database import RECORD_FILE, WORKLOAD_FILE, DurableDatabase, mean_secs, workload_key


def _is_target_folder(path: str) -> bool:
    return os.path.exists(os.path.join(path, WORKLOAD_FILE)) or os.path.exists(os.path.join(path, RECORD_FILE))


def _target_folders(path: str) -> dict[str, str]:
    if _is_target_folder(path):
        return {"": path}
    return {d: os.path.join(path, d) for d in sorted(os.listdir(path)) if _is_target_folder(os.path.join(path, d))}


def merge(inputs: list[str], output: str) -> dict[str, int]:
    """Returns {output folder: workloads written}."""
    groups: dict[str, list[str]] = {}
    for p in inputs:
        for key, folder in _target_folders(p).items():
            groups.setdefault(key, []).append(folder)
    summary = {}
    for key, folders in groups.items():
        out_dir = os.path.join(output, key) if key else output
        summary[out_dir] = _merge_folders(folders, out_dir)
    return summary


def _merge_folders(folders: list[str], out_dir: str) -> int:
    best: dict[str, tuple[float, object, object, decisions.Decision | None]] = {}
    for folder in folders:
        db, decs = DurableDatabase(folder), decisions.load(folder)
        for wl in db.workloads():
            top = db.get_top_k(wl, 1)
            if not top:
                continue
            key, secs = workload_key(wl), mean_secs(top[0])
            if key not in best or secs < best[key][0]:
                best[key] = (secs, wl, top[0], decs.get(key))
    out = DurableDatabase(out_dir)
    existing = decisions.load(out_dir)
    written = 0
    for key, (secs, wl, rec, dec) in best.items():
        cur = out.get_top_k(out.commit_workload(wl.mod), 1)
        if not cur or mean_secs(cur[0]) > secs:
            out.commit_tuning_record(ms.database.TuningRecord(rec.trace, out.commit_workload(wl.mod), rec.run_secs,
                                                              rec.target, rec.args_info))
            written += 1
        if dec is not None and (key not in existing or existing[key] != dec):
            dec.trials = max(dec.trials, existing[key].trials if key in existing else 0)
            decisions.save(out_dir, dec)
    return written
