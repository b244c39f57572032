"""What both halves of the GPU check share: the build side (tvmfuse/bench/gpu_cases.py, bench/gpu.py)
imports it as part of tvmfuse; the run side (scripts/gpu_env.py, gpu_reference.py), on a machine
with TVM's runtime only, loads this file by path, since importing the tvmfuse package would import
TVM's compiler. So it imports nothing but the standard library and numpy."""
from __future__ import annotations

import hashlib
import time


def inputs_digest(arrays) -> str:
    """sha256 over the inputs' dtypes, shapes and bytes: prepare records it, run recomputes it."""
    import numpy as np

    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def time_flushed(call, sync, flush, budget_s: float) -> list[float]:
    """Seconds of single calls, each after `flush()` (which returns with the device idle): start the
    clock, `call()`, `sync()`, stop. One untimed warm-up call first; then calls until `budget_s` of
    wall time (flushes included) has passed, at least one. Returns every sample."""
    call()
    sync()
    samples, t_end = [], time.perf_counter() + budget_s
    while not samples or time.perf_counter() < t_end:
        flush()
        t0 = time.perf_counter()
        call()
        sync()
        samples.append(time.perf_counter() - t0)
    return samples


def time_events(call, flush, torch, n: int) -> list[float]:
    """Seconds of n single calls on the GPU's own clock: flush(), then torch.cuda.Event records
    around call() on the current stream (TVM's and torch's kernels both go to the default stream),
    read after the end event completes. The host's dispatch before the first kernel is outside the
    clock; a system's launch overhead is its host-clock median minus this one. `torch` is passed
    in: this file imports nothing but the standard library and numpy."""
    out = []
    for _ in range(n):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e-3)
    return out
