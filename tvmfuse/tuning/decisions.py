"""Per-task tuning state next to the records: `tasks.json` (JSON lines, human-readable).

Contract
- One line per finished tuning step of a task: workload key (structural hash), task name, the
  trial budget it has satisfied, the default schedule's latency and the best tuned record's latency,
  both measured the same way in one batch, and `use_tuned` (the tuned record is applied at build
  only when it beats the default).
- The last line of a workload wins. Lines are appended durably under the folder lock (same
  guarantees as database.py); corrupt lines are skipped with a warning naming file and line.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass

from .database import LineReader, append_line, folder_lock

TASKS_FILE = "tasks.json"


@dataclass
class Decision:
    workload: str  # structural hash (first field of the workload line)
    task: str  # PrimFunc name it was tuned under (names differ across models; the key does not)
    trials: int  # trial budget satisfied so far (resume skips the task when it covers the request)
    default_ms: float | None  # default schedule, measured with the tuning runner
    tuned_ms: float | None  # best tuned record, measured in the same batch
    use_tuned: bool
    target: str = ""
    time: str = ""
    weight_ms: float | None = None  # the default's latency when first seen: splits the budget, never updated,
    # so a rerun asks each task for the same number of trials

    @staticmethod
    def from_dict(d: dict) -> "Decision":
        fields = Decision.__dataclass_fields__
        return Decision(**{k: d.get(k) for k in fields if k in d})


def load(folder: str) -> dict[str, Decision]:
    """workload key -> latest Decision."""
    out: dict[str, Decision] = {}
    reader = LineReader(os.path.join(folder, TASKS_FILE))
    for _, lineno, obj in reader.read_new():
        if obj is None:
            continue
        try:
            d = Decision.from_dict(obj)
            out[d.workload] = d
        except (TypeError, AttributeError) as err:
            import logging

            logging.getLogger("tvmfuse.tuning").warning("%s:%d: skipping bad task line (%s)", reader.path,
                                                        lineno, err)
    return out


def save(folder: str, d: Decision) -> None:
    d.time = d.time or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with folder_lock(folder):
        append_line(os.path.join(folder, TASKS_FILE), json.dumps(asdict(d), sort_keys=True))
