"""The device clock of the GPU benchmark: each call timed on the GPU itself, after an L2 flush.

The host clock (bench/gpu_portable.time_flushed: launch to device synchronization) includes the
host's dispatch of every kernel and one synchronization; on a 30-100 µs model that is most of the
figure. The device clock times the stream from the call's first kernel to its last:

- TVM systems: the VM's `time_evaluator` with number=1, so every repeat is one call, and
  `f_preproc` set to FLUSH_FUNC, a global function that runs the process's L2 flush before each
  repeat. On CUDA, TVM's timer (`profiling.timer.cuda`, registered by TVM's CUDA runtime) records
  CUDA events around the call; where that timer is missing, `tvm_device_timer` says so instead of
  returning a host-clock figure under the device clock's name.
- torch peers: torch.cuda.Event(enable_timing=True) records around each call, after the same flush.
- onnxruntime has no device clock here: its rows keep the host clock only.

launch overhead = host-clock median - device-clock median, per system: what the host adds.
"""
from __future__ import annotations

from typing import Callable

FLUSH_FUNC = "tvmfuse.bench.l2_flush"
CUDA_TIMER = "profiling.timer.cuda"


def register_flush(flush: Callable[[], None]) -> str:
    """Make `flush` the global function FLUSH_FUNC (replacing an earlier one); returns its name."""
    import tvm_ffi

    tvm_ffi.register_global_func(FLUSH_FUNC, lambda *args: flush(), override=True)
    return FLUSH_FUNC


def device_timer_reason(dev) -> str | None:
    """None when TVM can time on `dev`'s own clock; else why not (one line)."""
    import tvm_ffi

    if dev.dlpack_device_type() == 1:  # kDLCPU: the CPU's clock is the device clock
        return None
    if tvm_ffi.get_global_func(CUDA_TIMER, allow_missing=True) is None:
        return f"TVM's runtime has no {CUDA_TIMER} (a TVM built without CUDA): no device clock"
    return None


def tvm_device_timer(vm, args, dev, flush: Callable[[], None]):
    """n -> [seconds of n single calls of vm["main"](*args), each after flush(), on dev's clock];
    or a string, why dev has no device clock here."""
    why = device_timer_reason(dev)
    if why:
        return why
    register_flush(flush)
    vm.save_function("main", "tvmfuse_timed_main", *args)

    def timed(n: int) -> list[float]:
        f = vm.time_evaluator("tvmfuse_timed_main", dev, number=1, repeat=n, f_preproc=FLUSH_FUNC)
        return list(f().results)

    return timed


def torch_device_timer(call: Callable[[], None], flush: Callable[[], None]):
    """n -> [seconds of n single calls of call(), each after flush(), between two CUDA events]."""
    import torch

    from .gpu_portable import time_events

    return lambda n: time_events(call, flush, torch, n)
