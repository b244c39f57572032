"""Builders and runners for tuning, local or over TVM's own RPC tracker.

Contract
- `builder()`: MetaSchedule's LocalBuilder with `fast_build` (the stock default_build imports
  tvm.s_tir.tensor_intrin in every fresh worker pool, ~18 s here, and times out).
- `runner(evaluator, rpc=None)`: a LocalRunner, or an RPCRunner that asks the tracker at `rpc`
  ("HOST:PORT", key) for a session per candidate. A server that dies mid-run costs only the
  candidates in flight on it (they come back as failed trials); the run goes on with the others.
- `start_tracker` / `start_server` / `stop`: `python -m tvm.exec.rpc_tracker` and `rpc_server`
  subprocesses in their own session (so `stop` kills the process group, popen workers included).
  They bind to 127.0.0.1 unless told otherwise.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from tvm.s_tir import meta_schedule as ms


def fast_build(mod, target, _params):
    """ms.builder.default_build without the 18 s tensor_intrin import (see TVM notes §5), with the
    math lowering tvmfuse.build gives every kernel (so a trial is timed as it would run)."""
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    from schedules import lower_math

    return tvm_build(lower_math(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target), target=target)


def exact_build(mod, target, _params):
    """Build the kernel as the model runs it: a MetaSchedule layout-rewrite block stays in (fast_build
    drops it, which times a tuned CPU matmul without its weight re-layout, i.e. too fast)."""
    from tvm.driver import build as tvm_build

    from schedules import lower_math

    return tvm_build(lower_math(mod, target), target=target)


def builder(timeout_sec: float = 60.0, max_workers: int | None = None, exact: bool = False):
    """exact=False: MetaSchedule's trials; exact=True: the never-slower comparison."""
    return ms.builder.LocalBuilder(f_build=exact_build if exact else fast_build, timeout_sec=timeout_sec,
                                   max_workers=max_workers)


def evaluator(number: int = 3, repeat: int = 3, min_repeat_ms: int = 20):
    return ms.runner.EvaluatorConfig(number=number, repeat=repeat, min_repeat_ms=min_repeat_ms,
                                     enable_cpu_cache_flush=False)


def parse_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {addr!r}")
    return host, int(port)


def runner(evaluator_config, rpc: tuple[str, str] | None = None, session_timeout_sec: int = 60,
           max_workers: int | None = None):
    """Local runner, or an RPCRunner on (tracker "HOST:PORT", key)."""
    if rpc is None:
        return ms.runner.LocalRunner(evaluator_config=evaluator_config, timeout_sec=session_timeout_sec)
    host, port = parse_addr(rpc[0])
    cfg = ms.runner.RPCConfig(tracker_host=host, tracker_port=port, tracker_key=rpc[1],
                              session_timeout_sec=session_timeout_sec)
    return ms.runner.RPCRunner(rpc_config=cfg, evaluator_config=evaluator_config, max_workers=max_workers)


def check_tracker(rpc: tuple[str, str]) -> int:
    """Number of idle servers under the key; raises DeviceUnavailableError if the tracker is unreachable."""
    import tvm.rpc

    host, port = parse_addr(rpc[0])
    try:
        summary = tvm.rpc.connect_tracker(host, port).summary()
    except Exception as err:  # noqa: BLE001 - tvm raises plain RuntimeError/TVMError here
        from ..errors import DeviceUnavailableError

        raise DeviceUnavailableError(f"cannot reach the RPC tracker at {rpc[0]}: {str(err).splitlines()[-1]}. "
                                     "Start it with `python -m tvm.exec.rpc_tracker --host HOST --port PORT`") from None
    q = summary.get("queue_info", {}).get(rpc[1], {})
    return int(q.get("free", 0))


# ---------------------------------------------------------------------- processes (tests, local farms)
def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _spawn(args, log_path=None):
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    return subprocess.Popen([sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)


def start_tracker(host: str = "127.0.0.1", port: int | None = None, log_path=None):
    port = port or free_port(host)
    proc = _spawn(["tvm.exec.rpc_tracker", "--host", host, "--port", str(port), "--port-end", str(port + 1)],
                  log_path)
    proc.addr = f"{host}:{port}"
    _wait_port(host, port, proc)
    return proc


def start_server(tracker: str, key: str, host: str = "127.0.0.1", port: int | None = None, log_path=None):
    port = port or free_port(host)
    return _spawn(["tvm.exec.rpc_server", "--tracker", tracker, "--key", key, "--host", host,
                   "--port", str(port), "--port-end", str(port + 1)], log_path)


def wait_for_servers(tracker: str, key: str, n: int, timeout: float = 60.0) -> None:
    import tvm.rpc

    host, port = parse_addr(tracker)
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            q = tvm.rpc.connect_tracker(host, port).summary().get("queue_info", {}).get(key, {})
            if int(q.get("free", 0)) >= n:
                return
        except Exception:  # noqa: BLE001 - the tracker may still be starting
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{n} RPC server(s) under key {key!r} did not register with {tracker} in {timeout:.0f}s")


def stop(proc, sig=signal.SIGKILL) -> None:
    """Kill the process group of a tracker/server started here (its popen workers included)."""
    if proc is None or proc.poll() is not None and not _group_alive(proc.pid):
        return
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _wait_port(host, port, proc, timeout=30.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"RPC tracker exited with code {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"RPC tracker did not listen on {host}:{port}")
