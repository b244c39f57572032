"""Two tuners write into one tuning_logs folder at once; one is killed with SIGKILL mid-tuning.
The survivor finishes, and the folder loads whole: one workload line, every committed record."""
import json
import os
import signal
import subprocess
import sys
import time

from tvmfuse.target import resolve
from tvmfuse.tuning.database import DurableDatabase
from tvmfuse.tuning.keys import target_dir

TESTS = os.path.dirname(os.path.abspath(__file__))
TUNER = f"""
import sys
sys.path.insert(0, {TESTS!r})
from test_tuning import tiny_model
from tvmfuse.tuning import tune
tune(tiny_model(), "llvm", "tvmfuse", trials=4, logs=sys.argv[1], resume=False, num_trials_per_iter=2,
     population_size=32, progress=False)
"""


def _lines(path):
    return open(path).read().splitlines() if os.path.exists(path) else []


def test_concurrent_tuners_and_sigkill_leave_a_loadable_database(tmp_path):
    logs = str(tmp_path)
    folder = target_dir(logs, resolve("llvm"))
    records = os.path.join(folder, "database_tuning_record.json")
    spawn = lambda: subprocess.Popen([sys.executable, "-c", TUNER, logs], start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    victim, survivor = spawn(), spawn()
    try:
        t0 = time.time()
        while len(_lines(records)) < 2 and time.time() - t0 < 240:
            assert victim.poll() is None or survivor.poll() is None
            time.sleep(0.2)
        assert len(_lines(records)) >= 2, "no tuning round was committed in 240 s"
        os.killpg(victim.pid, signal.SIGKILL)  # mid-tuning: its current round is lost, nothing else
        victim.wait(timeout=30)
        _, err = survivor.communicate(timeout=400)
        assert survivor.returncode == 0, err.decode()[-3000:]
    finally:
        for p in (victim, survivor):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    workloads = _lines(os.path.join(folder, "database_workload.json"))
    assert len(workloads) == 1  # written once, although both tuners committed the workload
    good = []
    for line in _lines(records):
        try:
            good.append(json.loads(line))
        except ValueError:
            pass  # at most the victim's torn line
    assert len(_lines(records)) - len(good) <= 1
    assert all(r[0] == 0 for r in good)
    db = DurableDatabase(folder)
    assert len(db) == len(good) >= 4  # the survivor's 4 trials plus whatever the victim committed
    tasks = [json.loads(x) for x in _lines(os.path.join(folder, "tasks.json"))]
    assert tasks and tasks[-1]["trials"] >= 4
