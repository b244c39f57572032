"""Distributed tuning on TVM's RPC system: a tracker and two rpc_servers on 127.0.0.1, MetaSchedule's
RPCRunner measuring on them. One server is killed mid-run; the run still completes with records.
A server that hangs costs a candidate the session timeout, not the run; a tracker that is down is
reported in seconds."""
import os
import signal
import threading
import time

import pytest
from test_tuning import tiny_model

from tvmfuse.errors import DeviceUnavailableError
from tvmfuse.target import resolve
from tvmfuse.tuning import rpc, tune
from tvmfuse.tuning.database import DurableDatabase
from tvmfuse.tuning.keys import target_dir

KEY = "tvmfuse-test-cpu"


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    """A tracker and two servers, shared by the tests below (their start-up is most of the cost)."""
    d = tmp_path_factory.mktemp("farm")
    tracker = rpc.start_tracker("127.0.0.1", log_path=str(d / "tracker.log"))
    servers = [rpc.start_server(tracker.addr, KEY, "127.0.0.1", log_path=str(d / f"server{i}.log"))
               for i in range(2)]
    try:
        rpc.wait_for_servers(tracker.addr, KEY, 2, timeout=60)
        yield tracker, servers
    finally:
        for p in servers + [tracker]:
            rpc.stop(p)


def test_tuning_over_rpc_survives_a_dead_server(farm, tmp_path):
    tracker, servers = farm
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

    killer = threading.Thread(target=kill_one_after_first_round, daemon=True)
    killer.start()
    res = tune(tiny_model(), "llvm", "tvmfuse", trials=4, logs=logs, rpc=(tracker.addr, KEY),
               num_trials_per_iter=2, population_size=32, progress=False)
    killer.join(timeout=5)
    assert killed.is_set(), "the first round never committed, so no server was killed"
    assert servers[0].poll() is not None and servers[1].poll() is None
    (task,) = res.tasks
    assert task.trials_total == 4 and task.default_ms is not None
    db = DurableDatabase(os.path.dirname(records))
    assert len(db) == task.trials_run == 4
    assert any(float(r.run_secs[0]) < 1e9 for r in db.get_all_tuning_records())  # real measurements


def test_a_hung_server_costs_a_candidate_the_session_timeout(farm, tmp_path):
    """SIGSTOP: the server's sockets stay open, so the tracker still hands it out and a connect still
    succeeds, but nothing answers (a host that froze or dropped off the network). The stock RPCRunner
    would wait forever; ours gives up after session_timeout_sec and reports a failed trial."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.builder.local_builder import default_export

    from test_tuning_faults import _workload_mod

    tracker, servers = farm
    target = resolve("llvm")
    mod = _workload_mod()
    artifact = default_export(rpc.fast_build(mod, target, None))
    runner = rpc.runner(rpc.evaluator(number=1, repeat=1, min_repeat_ms=0), (tracker.addr, KEY),
                        session_timeout_sec=3)
    alive = [p for p in servers if p.poll() is None]  # all of them when this test runs alone
    for p in alive:
        os.killpg(p.pid, signal.SIGSTOP)
    try:
        (fut,) = runner.run([ms.runner.RunnerInput(artifact, "cpu", ms.arg_info.ArgInfo.from_prim_func(mod["main"]))])
        out, t0 = [], time.time()
        waiter = threading.Thread(target=lambda: out.append(fut.result()), daemon=True)
        waiter.start()
        waiter.join(timeout=60)
        assert out, "the candidate on a hung server never came back"
        assert out[0].run_secs is None and "Timeout" in out[0].error_msg, out[0].error_msg
        assert time.time() - t0 < 30
    finally:
        for p in alive:
            os.killpg(p.pid, signal.SIGCONT)


def test_a_tracker_that_is_down_is_reported_in_seconds(tmp_path):
    """tvm.rpc.connect_tracker retries a refused connection for 60 s; tune() says so in a few."""
    t0 = time.time()
    with pytest.raises(DeviceUnavailableError, match="cannot reach the RPC tracker"):
        tune(tiny_model(), "llvm", "tvmfuse", trials=2, logs=str(tmp_path), rpc=(f"127.0.0.1:{rpc.free_port()}", KEY),
             progress=False)
    assert time.time() - t0 < 30
