"""Fault injection on the tuning-record database (tvmfuse.tuning.database): SIGKILL at random
points of a writer, a disk that fills up mid-write, a corrupted byte in the middle of a file.
After each fault the folder loads and holds every record that was acknowledged before it."""
import errno
import logging
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms

from tvmfuse.tuning import database
from tvmfuse.tuning.database import DurableDatabase

WRITER = """
import sys
from test_tuning_faults import commit_records
commit_records(sys.argv[1], int(sys.argv[2]), 10 ** 6, ack=True)
"""


def _workload_mod():
    a = te.placeholder((8,), name="a")
    b = te.compute((8,), lambda i: a[i] + 1.0, name="b")
    return tvm.IRModule({"main": te.create_prim_func([a, b])})


def commit_records(folder, round_id, n, ack=False):
    """Commit n records of one workload, run_secs = round_id * 1e6 + i; print 'ack <secs>' after
    each commit returned (it is then on disk: flushed and fsynced)."""
    mod = _workload_mod()
    db = DurableDatabase(folder)
    wl = db.commit_workload(mod)
    trace = tvm.s_tir.Schedule(mod).trace
    target = tvm.target.Target("llvm")
    for i in range(n):
        secs = float(round_id * 10 ** 6 + i)
        db.commit_tuning_record(ms.database.TuningRecord(trace, wl, [secs], target, None))
        if ack:
            print(f"ack {secs}", flush=True)
    return db


def _secs(folder):
    return {float(r.run_secs[0]) for r in DurableDatabase(folder).get_all_tuning_records()}


def test_sigkill_at_random_points_loses_no_acknowledged_record(tmp_path):
    folder = str(tmp_path)
    rng = random.Random(0)
    acked, kills = set(), 0
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.abspath(__file__)) + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    for rnd in range(1, 9):
        p = subprocess.Popen([sys.executable, "-c", WRITER, folder, str(rnd)], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, env=env, text=True)
        try:
            first = p.stdout.readline()  # the writer is up and committing
            assert first.startswith("ack"), "the writer did not start"
            acked.add(float(first.split()[1]))
            deadline = time.time() + rng.uniform(0.05, 0.5)
            while time.time() < deadline:
                line = p.stdout.readline()
                if line.startswith("ack"):
                    acked.add(float(line.split()[1]))
            os.kill(p.pid, signal.SIGKILL)  # anywhere: mid-write, mid-fsync, between records
            kills += 1
            rest = p.stdout.read()  # acks printed before the kill landed
            acked |= {float(x.split()[1]) for x in rest.splitlines() if x.startswith("ack")}
        finally:
            p.kill()
            p.wait()
        on_disk = _secs(folder)
        assert acked <= on_disk, f"lost after kill {kills}: {sorted(acked - on_disk)[:5]}"
    assert kills == 8 and len(acked) > 8
    print(f"faults: {kills} SIGKILLs, {len(acked)} records acknowledged, 0 lost, {len(_secs(folder))} on disk")


def test_disk_full_mid_write_loses_nothing_acknowledged(tmp_path, monkeypatch, caplog):
    folder = str(tmp_path)
    commit_records(folder, 1, 5)
    real = database.append_line

    def full_disk(path, text):  # half the line reaches the file, then the disk is full
        with open(path, "ab") as f:
            f.write(text.encode()[: len(text) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(database, "append_line", full_disk)
    with pytest.raises((OSError, RuntimeError), match="No space left on device"):  # RuntimeError: via TVM's FFI
        commit_records(folder, 2, 1)
    monkeypatch.setattr(database, "append_line", real)  # space freed: the next writer goes on
    commit_records(folder, 3, 2)
    with caplog.at_level(logging.WARNING, logger="tvmfuse.tuning"):
        assert _secs(folder) == {1e6 + i for i in range(5)} | {3e6, 3e6 + 1}
    assert "skipping corrupt or truncated line" in caplog.text


def test_corrupted_byte_in_the_middle_costs_one_record(tmp_path, caplog):
    folder = str(tmp_path)
    commit_records(folder, 1, 9)
    path = os.path.join(folder, database.RECORD_FILE)
    lines = open(path, "rb").read().splitlines(keepends=True)
    mid = lines[4]
    lines[4] = mid[:10] + b"\x00" + mid[11:]  # one byte inside the 5th record
    open(path, "wb").write(b"".join(lines))
    with caplog.at_level(logging.WARNING, logger="tvmfuse.tuning"):
        got = _secs(folder)
    assert got == {1e6 + i for i in range(9)} - {1e6 + 4}
    assert f"{path}:5:" in caplog.text
