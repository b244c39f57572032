"""What tvmfuse sets up in the process: once, on first use, never on `import tvmfuse`.

`import tvmfuse` changes no environment variable, patches nothing and registers nothing
(tests/test_import_side_effects.py). The entry points that compile or run kernels call
`install_once()` first: `build`, `prepare`, every run of the pipeline (`explain`, `viz`, the tuning
tasks), `Compiled`'s VM, `measure`, `tune`, the benchmark and the roofline.
"""
from __future__ import annotations

import threading

from .passes.streaming_stores import register_pipeline
from .target import bound_spinning, use_all_cores

_LOCK = threading.Lock()
_DONE = False


def install_once() -> None:
    """Set up, once per process (idempotent, thread-safe), what tvmfuse's builds and runs rely on:

    - TVM's CPU thread pool sized to `target.num_cores()` (TVM_NUM_THREADS, `target.use_all_cores`)
      and its idle spin bounded (TVM_THREAD_POOL_SPIN_COUNT, `target.bound_spinning`), each
      unless the user set the variable (TVM_NUM_THREADS or OMP_NUM_THREADS for the pool size).
      TVM reads them when a thread's pool starts, at the first parallel kernel that thread
      launches, and MetaSchedule's builder and runner processes inherit them when they start. A
      build runs its first kernel (the constant folding) after this call, so the first build sizes
      the pool as `import tvmfuse` used to. A kernel the program runs with TVM alone before any
      tvmfuse entry point gets TVM's own defaults in that thread, as without tvmfuse.
    - The "tvmfuse" TIR pipeline (TVM's s_tir lowering, then StreamStores) registered with TVM:
      `tvm.compile` in TVM 0.27 takes a TIR pipeline by name only (`tirx.build` asserts a str).

    Not here: te_compose's recording `BlockBuilder.call_te`, which is installed only while one of
    TVM's legalizers composes TE for tvmfuse (`te_compose.recording_call_te`)."""
    global _DONE
    if _DONE:
        return
    with _LOCK:
        if _DONE:
            return
        use_all_cores()
        bound_spinning()
        register_pipeline()
        _DONE = True
