"""A campaign that survives a graph whose build or run never ends (scripts/fuzz.py --graph-timeout).

The campaign runs in a child process (`scripts/fuzz.py --child-log LOG --child-summary PART`) that
appends one JSON line per graph to LOG, {"seed", "start"} before checking it and {"seed", "spec_id",
"kind", "variant", "seconds", "rewrites"} after, and rewrites PART (its Summary so far) after each.
The parent polls LOG: a graph started more than `graph_timeout` seconds ago gets the child's process
group killed, is recorded in `Summary.timeouts` (its spec is the generator's, from its seed: a
timeout is a finding, reported with the seed that rebuilds it) and the campaign restarts from the
next seed with the time left. A TVM pass that loops inside C++ cannot be interrupted from Python in
the same process; a process boundary can.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from .campaign import GENERATORS, Summary
from .gen import RandomSource
from .spec import spec_id


def child_hooks(log_path: str, part_path: str):
    """The on_graph callback of a child campaign: log lines and summary snapshots."""

    def on_graph(seed, spec, out, seconds, summary):
        with open(log_path, "a") as f:
            if out is None:
                f.write(json.dumps({"seed": seed, "start": time.time()}) + "\n")
            else:
                f.write(json.dumps({"seed": seed, "spec_id": spec_id(spec), "kind": out.kind, "variant": out.variant,
                                    "seconds": round(seconds, 3), "rewrites": out.rewrites}) + "\n")
        if out is not None:
            tmp = part_path + ".tmp"
            with open(tmp, "w") as f:
                f.write(summary.to_json())
            os.replace(tmp, part_path)

    return on_graph


def _last(log_path: str):
    try:
        with open(log_path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return None
    return json.loads(lines[-1]) if lines else None


def _load(part_path: str):
    try:
        with open(part_path) as f:
            return Summary(**json.load(f))
    except FileNotFoundError:
        return None


def supervise(child_args: list, minutes: float, seed: int, max_ops: int, shapes: str, graph_timeout: float,
              log_path: str, progress=None, max_timeouts: int | None = None) -> Summary:
    """Run the campaign of `child_args` (scripts/fuzz.py options other than --minutes, --seed and the
    child's files) in children from `seed` for `minutes`, each graph limited to `graph_timeout` s;
    stop early after `max_timeouts` graphs over the limit (None: never)."""
    total = Summary("random", seed, max_ops, shapes=shapes)
    t0 = time.monotonic()
    deadline = t0 + 60 * minutes
    cur, part_no = seed, 0
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "scripts", "fuzz.py")
    while time.monotonic() < deadline - 5:
        part = f"{log_path}.part{part_no}.json"
        part_no += 1
        left = (deadline - time.monotonic()) / 60
        cmd = [sys.executable, script, *child_args, "--minutes", f"{left:.3f}", "--seed", str(cur),
               "--child-log", log_path, "--child-summary", part]
        child = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL)
        stuck = None
        while child.poll() is None:
            time.sleep(min(1.0, graph_timeout / 2))
            last = _last(log_path)
            if last and "start" in last and time.time() - last["start"] > graph_timeout:
                stuck = last
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        got = _load(part)
        if got is not None:
            total.merge(got)
        last = _last(log_path)
        if stuck is None and child.returncode in (0, 1):
            break  # the child ran out of time (1: it found a fusion failure)
        bad = stuck or (last if last and "start" in last else None)
        if bad is None:
            raise RuntimeError(f"the fuzz child exited with {child.returncode} outside a graph")
        spec = GENERATORS[shapes](RandomSource(bad["seed"]), max_ops)
        what = "timeout" if stuck else f"crash (exit status {child.returncode})"
        total.timeouts.append({"seed": bad["seed"], "spec_id": spec_id(spec), "what": what,
                               "seconds": time.time() - bad["start"], "spec": spec})
        with open(log_path, "a") as f:
            f.write(json.dumps({"seed": bad["seed"], "spec_id": spec_id(spec), "kind": what}) + "\n")
        if progress:
            progress(f"[fuzz] seed {bad['seed']}: {what}; restarting at {bad['seed'] + 1}")
        cur = bad["seed"] + 1
        if max_timeouts is not None and len(total.timeouts) >= max_timeouts:
            break
    total.seconds = time.monotonic() - t0
    return total
