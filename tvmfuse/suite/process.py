"""One process per model, with a time limit: a crash, a hang or a segfault costs one row.

`run_isolated(name, size, batch, stages, timeout)` runs `python -m tvmfuse.suite.runner` in its own
process group, reads the row it wrote after each stage, and on a timeout (the group killed), a
signal (SIGSEGV, SIGABRT, ...) or a non-zero exit adds the failed stage "process" with the error
class and first line ("Timeout: ...", "SIGSEGV: ...", or the traceback's last line).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _last_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        head = ln.split(":", 1)[0]
        if head.replace(".", "").replace("_", "").isalnum() and (head.endswith(("Error", "Exception"))
                                                                   or head.startswith("tvm.")):
            return ln[:300]
    return (lines[-1][:300] if lines else "no output")


def run_command(cmd, out_path, timeout, base=None) -> dict:
    """Run `cmd` (which writes its row to out_path) under `timeout` seconds; the row, with a failed
    "process" stage when it timed out or died."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
        failure = None
        if proc.returncode < 0:
            failure = f"{signal.Signals(-proc.returncode).name}: the process died ({_last_error(err)})"
        elif proc.returncode:
            failure = _last_error(err)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        failure = f"Timeout: over {timeout} s"
    row = dict(base or {})
    if os.path.exists(out_path) and os.path.getsize(out_path):
        with open(out_path) as f:
            row.update(json.load(f))
    row.setdefault("stages", {})
    if failure:
        done = list(row["stages"])
        row["stages"]["process"] = {"ok": False, "error": failure + (f" (after {done[-1]})" if done else "")}
    return row


def run_isolated(name, size="tiny", batch=1, stages=("import", "build", "numerics"), timeout=600) -> dict:
    from . import archs

    arch = archs.BY_NAME[name]
    base = {"model": name, "family": arch.family, "size": size, "batch": batch, "note": arch.note}
    with tempfile.TemporaryDirectory(prefix="tvmfuse-suite-") as tmp:
        out = os.path.join(tmp, "row.json")
        cmd = [sys.executable, "-m", "tvmfuse.suite.runner", name, "--size", size, "--batch", str(batch),
               "--stages", ",".join(stages), "--out", out]
        return run_command(cmd, out, timeout, base)
