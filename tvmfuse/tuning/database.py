"""The durable tuning database: MetaSchedule's JSON-lines format, owned by us.

Contract
- One folder per target key holds `database_workload.json` and `database_tuning_record.json`, the
  same files and line format as `ms.database.JSONDatabase` (a workload line is `Workload.as_json()`;
  a record line is `[workload_line_index, TuningRecord.as_json()]`), so the stock database can read a
  clean folder too.
- Every commit appends one line with a single write, then flush + fsync, under an exclusive `fcntl`
  lock on `<folder>/.lock`. Killing the process (even with SIGKILL) loses at most what was not yet
  committed; a half-written last line is ended with a newline by the next writer and skipped by
  readers.
- Loading never aborts: a corrupt or truncated line is skipped with a warning on the
  `tvmfuse.tuning` logger that names the file and the 1-based line; the rest loads.
- Line indexes count every non-empty line, good or bad, so a bad workload line never shifts the
  index of the ones after it.
- Two processes may tune into one folder at once: before each append a writer reads what others
  appended since its last read (under the lock), so indexes stay consistent and a workload is
  written once.
- Queries (`get_top_k`, `query_schedule`, ...) are answered by an in-memory MetaSchedule
  `MemoryDatabase` holding everything loaded or committed. Nothing is pickled.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os

import tvm
import tvm_ffi
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.database import PyDatabase, TuningRecord, Workload

log = logging.getLogger("tvmfuse.tuning")

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
LOCK_FILE = ".lock"


@contextlib.contextmanager
def folder_lock(folder: str, exclusive: bool = True):
    """fcntl lock on `<folder>/.lock`; read-only folders are read without a lock."""
    try:
        fd = os.open(os.path.join(folder, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def append_line(path: str, text: str) -> None:
    """Append one line durably. Call with the folder lock held. Ends a torn last line first."""
    with open(path, "ab+") as f:
        f.seek(0, os.SEEK_END)
        prefix = b""
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                prefix = b"\n"
        f.write(prefix + text.encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())


class LineReader:
    """Incremental reader of a JSON-lines file: yields (index, 1-based line number, obj or None)."""

    def __init__(self, path: str):
        self.path, self.offset, self.count, self.lineno = path, 0, 0, 0
        self._torn = False  # the last read ended inside a line

    def read_new(self):
        if not os.path.exists(self.path):
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        if not data:
            return
        self.offset += len(data)
        if self._torn and data.startswith(b"\n"):
            data = data[1:]  # a writer ended the torn line we already counted
        self._torn = not data.endswith(b"\n")
        chunks = data.split(b"\n")
        for raw in chunks if self._torn else chunks[:-1]:
            self.lineno += 1
            if not raw.strip():
                continue
            idx = self.count
            self.count += 1
            try:
                obj = json.loads(raw)
            except ValueError as err:
                log.warning("%s:%d: skipping corrupt or truncated line (%s)", self.path, self.lineno, err)
                obj = None
            yield idx, self.lineno, obj


@derived_object
class DurableDatabase(PyDatabase):
    """A MetaSchedule database stored durably in `folder` (see the module docstring)."""

    def __init__(self, folder: str):
        super().__init__()
        os.makedirs(folder, exist_ok=True)
        self.folder = folder
        self.mem = ms.database.MemoryDatabase()
        self._wl = LineReader(os.path.join(folder, WORKLOAD_FILE))
        self._rec = LineReader(os.path.join(folder, RECORD_FILE))
        self._by_index: dict[int, Workload] = {}  # file line index -> canonical workload
        self._index_of: list[tuple[Workload, int]] = []  # canonical workload -> first file index
        self.records_in_order: list[tuple[Workload, TuningRecord]] = []  # file order (curves, resume)
        with folder_lock(folder, exclusive=False):
            self._ingest()

    # ------------------------------------------------------------------ reading
    def _ingest(self) -> None:
        for idx, lineno, obj in self._wl.read_new():
            if obj is None:
                continue
            try:
                wl = self.mem.commit_workload(Workload.from_json(obj).mod)
            except Exception as err:  # noqa: BLE001 - any bad line is skipped, never fatal
                log.warning("%s:%d: skipping unreadable workload (%s)", self._wl.path, lineno, _short(err))
                continue
            self._by_index[idx] = wl
            if self._find_index(wl) is None:
                self._index_of.append((wl, idx))
        for _, lineno, obj in self._rec.read_new():
            if obj is None:
                continue
            try:
                wl = self._by_index[int(obj[0])]
                rec = TuningRecord.from_json(obj[1], wl)
            except KeyError:
                log.warning("%s:%d: skipping record of unknown workload %s", self._rec.path, lineno, obj[0])
                continue
            except Exception as err:  # noqa: BLE001
                log.warning("%s:%d: skipping unreadable record (%s)", self._rec.path, lineno, _short(err))
                continue
            self.mem.commit_tuning_record(rec)
            self.records_in_order.append((wl, rec))

    def _find_index(self, wl: Workload) -> int | None:
        for w, i in self._index_of:
            if w.same_as(wl):
                return i
        for w, i in self._index_of:
            if tvm_ffi.structural_equal(w.mod, wl.mod):
                return i
        return None

    # ------------------------------------------------------------------ PyDatabase interface
    def has_workload(self, mod: tvm.IRModule) -> bool:
        return self.mem.has_workload(mod)

    def commit_workload(self, mod: tvm.IRModule) -> Workload:
        if self.mem.has_workload(mod):
            return self.mem.commit_workload(mod)
        with folder_lock(self.folder):
            self._ingest()  # another process may have written it meanwhile
            wl = self.mem.commit_workload(mod)
            self._index_locked(wl)
        return wl

    def commit_tuning_record(self, record: TuningRecord) -> None:
        with folder_lock(self.folder):
            self._ingest()
            idx = self._index_locked(record.workload)
            append_line(self._rec.path, json.dumps([idx, record.as_json()]))
            self._ingest()

    def _index_locked(self, wl: Workload) -> int:
        """The file index of `wl`, appending its line first if the file lacks it (lock held)."""
        idx = self._find_index(wl)
        if idx is None:
            append_line(self._wl.path, json.dumps(wl.as_json()))
            self._ingest()
            idx = self._find_index(wl)
        return idx

    def get_top_k(self, workload: Workload, top_k: int) -> list[TuningRecord]:
        return list(self.mem.get_top_k(workload, top_k))

    def get_all_tuning_records(self) -> list[TuningRecord]:
        return list(self.mem.get_all_tuning_records())

    def __len__(self) -> int:
        return len(self.mem)

    # ------------------------------------------------------------------ helpers for tvmfuse
    def reload(self) -> None:
        """Read what other processes appended since the last read."""
        with folder_lock(self.folder, exclusive=False):
            self._ingest()

    def records_of(self, mod: tvm.IRModule) -> list[TuningRecord]:
        """All records of `mod`'s workload in file (trial) order."""
        if not self.mem.has_workload(mod):
            return []
        wl = self.mem.commit_workload(mod)
        return [r for w, r in self.records_in_order if w.same_as(wl)]

    def workloads(self) -> list[Workload]:
        return [w for w, _ in self._index_of]


def mean_secs(record: TuningRecord) -> float:
    """Mean measured seconds of a record; failed trials count as 1e10 (MetaSchedule's convention)."""
    secs = [float(s) for s in (record.run_secs or [])]
    return sum(secs) / len(secs) if secs else 1e10


def workload_key(wl_or_mod) -> str:
    """The structural hash MetaSchedule writes as the first field of a workload line."""
    wl = wl_or_mod if isinstance(wl_or_mod, Workload) else Workload(wl_or_mod)
    return str(wl.as_json()[0])


def _short(err: Exception) -> str:
    s = str(err).strip().splitlines()
    return s[-1][:200] if s else type(err).__name__
