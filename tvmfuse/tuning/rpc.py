"""Builders and runners for tuning, local or over TVM's own RPC tracker.

Contract
- `builder()`: MetaSchedule's LocalBuilder with `fast_build` (the stock default_build imports
  tvm.s_tir.tensor_intrin in every fresh worker pool, ~18 s here, and times out).
  `builder(pool=BuildPool())`: the same builds in worker processes that outlive one build() call.
  LocalBuilder starts a fresh pool per call (per tuning round), and each worker's `import tvm`
  costs ~6 s of CPU; a BuildPool starts them once per tuning session and recycles a worker after
  `max_uses` builds (the leak LocalBuilder's fresh pools guard against).
- `runner(evaluator, rpc=None)`: a LocalRunner, or an RPCRunner that asks the tracker at `rpc`
  ("HOST:PORT", key) for a session per candidate. A server that dies mid-run costs only the
  candidates in flight on it (they come back as failed trials); the run goes on with the others.
  A server that hangs (stopped, or its host unreachable) costs a candidate `session_timeout_sec`:
  the stock RPCRunner has no timeout on its worker and would wait forever.
- `check_tracker(rpc, timeout)`: a tracker that refuses connections is reported after `timeout`
  seconds (TVM's connect_tracker retries for 60 s).
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

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder import local_builder as _ms_local_builder
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind


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


def builder(timeout_sec: float = 60.0, max_workers: int | None = None, exact: bool = False,
            pool: "BuildPool | None" = None):
    """exact=False: MetaSchedule's trials; exact=True: the never-slower comparison.
    pool: build in its long-lived workers (its own timeout and worker count apply)."""
    f_build = exact_build if exact else fast_build
    if pool is not None:
        return _PooledBuilder(f_build, pool)
    return ms.builder.LocalBuilder(f_build=f_build, timeout_sec=timeout_sec, max_workers=max_workers)


class BuildPool:
    """Build worker processes shared by the builders of one tuning session; started on first use.
    `close()` ends them (they also exit when this process does)."""

    def __init__(self, timeout_sec: float = 60.0, max_workers: int | None = None, max_uses: int = 64):
        from tvm.s_tir.meta_schedule.utils import cpu_count

        self.timeout_sec, self.max_uses = timeout_sec, max_uses
        self.max_workers = max_workers or cpu_count(logical=True)
        self._pool = None

    def _executor(self):
        if self._pool is None:
            self._pool = PopenPoolExecutor(max_workers=self.max_workers, timeout=self.timeout_sec,
                                           maximum_process_uses=self.max_uses)
        return self._pool

    def start(self) -> None:
        """Start every worker now, in the background (each loads what a build needs); no-op once started."""
        if self._pool is not None:
            return
        pool = self._executor()
        for _ in range(self.max_workers):  # no idle thread yet: each submit gets its own worker
            pool.submit(_warm_build_worker)

    def map(self, f_build, build_inputs):
        jobs = [(f_build, None, b.mod, b.target, _ms_local_builder._serialize_params(b.params))
                for b in build_inputs]
        return list(self._executor().map_with_error_catching(lambda x: _ms_local_builder._worker_func(*x), jobs))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


def _warm_build_worker() -> None:
    """Runs in a build worker: the imports of its first build (this module comes with the pickle)."""
    import tvm.driver  # noqa: F401
    import tvm.s_tir.transform  # noqa: F401

    import schedules  # noqa: F401
    import tvmfuse.config  # noqa: F401 (the CPU table reads its overrides at call time)


@derived_object
class _PooledBuilder(ms.builder.PyBuilder):
    """LocalBuilder.build, in a BuildPool's workers (same results and error messages)."""

    def __init__(self, f_build, pool: BuildPool):
        super().__init__()
        self.f_build, self.pool = f_build, pool

    def build(self, build_inputs):
        results = []
        for r in self.pool.map(self.f_build, build_inputs):
            if r.status == StatusKind.COMPLETE:
                results.append(ms.builder.BuilderResult(r.value, None))
            elif r.status == StatusKind.TIMEOUT:
                results.append(ms.builder.BuilderResult(
                    None, f"LocalBuilder: Timeout, killed after {self.pool.timeout_sec} seconds"))
            else:
                results.append(ms.builder.BuilderResult(None, "LocalBuilder: An exception occurred\n" + str(r.value)))
        return results


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
    r = ms.runner.RPCRunner(rpc_config=cfg, evaluator_config=evaluator_config, max_workers=max_workers)
    # RPCRunner's pool has no timeout, so a candidate on a hung server (SIGSTOPped, host gone without
    # closing its sockets) never returns. With one, the worker answers TIMEOUT after session_timeout_sec
    # and RPCRunnerFuture reports "RPCRunner: Timeout, killed after ..." (a failed trial). Set on the
    # pool RPCRunner already started (its sanity check ran a worker): a new pool would start another.
    if getattr(r.pool, "_timeout", 0) is None:
        r.pool._timeout = session_timeout_sec
    return r


def check_tracker(rpc: tuple[str, str], timeout: float = 5.0) -> int:
    """Number of idle servers under the key; raises DeviceUnavailableError if the tracker is unreachable
    for `timeout` seconds (tvm.rpc.connect_tracker alone retries a refused connection for 60 s)."""
    import tvm.rpc

    host, port = parse_addr(rpc[0])
    try:
        _probe(host, port, timeout)
        summary = tvm.rpc.connect_tracker(host, port).summary()
    except Exception as err:  # noqa: BLE001 - tvm raises plain RuntimeError/TVMError here
        from ..errors import DeviceUnavailableError

        raise DeviceUnavailableError(f"cannot reach the RPC tracker at {rpc[0]}: {str(err).splitlines()[-1]}. "
                                     "Start it with `python -m tvm.exec.rpc_tracker --host HOST --port PORT`") from None
    q = summary.get("queue_info", {}).get(rpc[1], {})
    return int(q.get("free", 0))


def _probe(host: str, port: int, timeout: float) -> None:
    """Return once (host, port) accepts a TCP connection; OSError after `timeout` seconds of refusals
    (or of an unanswered connect: a host that is down)."""
    deadline = time.time() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=max(0.1, deadline - time.time())).close()
            return
        except OSError as err:
            if time.time() + 0.25 >= deadline:
                raise OSError(f"{host}:{port}: {err.strerror or err}") from None
            time.sleep(0.25)


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
