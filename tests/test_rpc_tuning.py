"""Distributed tuning on TVM's RPC system: a tracker and two rpc_servers on 127.0.0.1, MetaSchedule's
RPCRunner measuring on them. One server is killed mid-run; the run still completes with records."""
import os
import threading
import time

from test_tuning import tiny_model

from tvmfuse.target import resolve
from tvmfuse.tuning import rpc, tune
from tvmfuse.tuning.database import DurableDatabase
from tvmfuse.tuning.keys import target_dir


def test_tuning_over_rpc_survives_a_dead_server(tmp_path):
    key = "tvmfuse-test-cpu"
    tracker = rpc.start_tracker("127.0.0.1", log_path=str(tmp_path / "tracker.log"))
    servers = [rpc.start_server(tracker.addr, key, "127.0.0.1", log_path=str(tmp_path / f"server{i}.log"))
               for i in range(2)]
    logs = str(tmp_path / "logs")
    records = os.path.join(target_dir(logs, resolve("llvm")), "database_tuning_record.json")
    killed = threading.Event()

    def kill_one_after_first_round():
        t0 = time.time()
        while time.time() - t0 < 300 and not killed.is_set():
            if os.path.exists(records) and os.path.getsize(records) > 0:
                rpc.stop(servers[0])
                killed.set()
                return
            time.sleep(0.2)

    try:
        rpc.wait_for_servers(tracker.addr, key, 2, timeout=60)
        killer = threading.Thread(target=kill_one_after_first_round, daemon=True)
        killer.start()
        res = tune(tiny_model(), "llvm", "tvmfuse", trials=4, logs=logs, rpc=(tracker.addr, key),
                   num_trials_per_iter=2, population_size=32, progress=False)
        killer.join(timeout=5)
        assert killed.is_set(), "the first round never committed, so no server was killed"
        assert servers[0].poll() is not None and servers[1].poll() is None
        (task,) = res.tasks
        assert task.trials_total == 4 and task.default_ms is not None
        db = DurableDatabase(os.path.dirname(records))
        assert len(db) == task.trials_run == 4
        assert any(float(r.run_secs[0]) < 1e9 for r in db.get_all_tuning_records())  # real measurements
    finally:
        for p in servers + [tracker]:
            rpc.stop(p)
