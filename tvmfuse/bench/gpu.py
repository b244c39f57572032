"""The CUDA side of the side-by-side benchmark (`tvmfuse.bench` with target="cuda").

- `no_gpu_reason()`: why CUDA cannot run here, or None; checked before anything is built.
- `L2Flush`: a small TVM-compiled kernel that writes every element of a device buffer of twice the
  GPU's L2 (as the device reports it, else FALLBACK_FLUSH_BYTES), so no timed call finds its
  inputs or weights left in L2 by the call before.
- `time_flushed(call, sync, flush, budget_s)`: single calls, each after a flush, each timed on the
  host clock from launch to device synchronization. Each round also times as many calls on the
  device's own clock (tvmfuse/bench/gpu_clock.py: CUDA events), so the row has both and the launch
  overhead (host - device) per system.
- `peer(w, system, threads)`: the CUDA form of a peer (torch, torch.compile with and without
  freezing, onnxruntime), or why it has none here.

Why the host clock is kept beside time_evaluator's device clock: in TVM 0.27 the VM's `time_evaluator` (tvm/runtime/vm.py) does not
pass `cache_flush_bytes` on; the module-level one (tvm/runtime/module.py) does, but the C++ timer
behind it (WrapTimeEvaluator in upstream src/runtime/profiling.cc; the wheel ships only the binary)
flushes with a device-to-device copy once per repeat, before `number` calls, and it can time only
TVM functions. The peers need the
same flush and the same clock to be comparable, so one loop times every system: flush and
synchronize, start the clock, one call, synchronize, stop. The clock therefore includes the
host-side dispatch of the call and one synchronization (a few µs on every system alike).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import shutil

from .gpu_portable import time_flushed  # noqa: F401  (bench/core.py calls it from here)
from ..target import is_gpu, resolve

# Bytes the flush writes when the device does not report its L2 size: at least twice the L2 of
# current data-centre GPUs (H100/H200: 50 MB).
FALLBACK_FLUSH_BYTES = 256 << 20
FLUSH_THREADS = 1024  # threads per block of the flush kernel (the CUDA maximum)
FLUSH_SYMBOL = "tvmfuse_flush_l2"
NO_GPU_EXIT = 3  # exit code of every command that needs a GPU and finds none


def no_gpu_reason() -> str | None:
    """None when tvm.cuda(0) exists; else why CUDA cannot run here (one line)."""
    import tvm

    if tvm.cuda(0).exist:
        return None
    if not tvm.runtime.enabled("cuda"):
        why = "TVM's CUDA runtime is not loaded (no NVIDIA driver here, or a TVM built without CUDA)"
    else:
        why = "tvm.cuda(0) does not exist (no GPU visible: check nvidia-smi and CUDA_VISIBLE_DEVICES)"
    return f"no CUDA GPU on this machine: {why}"


def use_nvcc_without_nvrtc() -> None:
    """TVM compiles CUDA kernels with NVRTC by default, which needs the cuda-bindings package; when
    it is missing and nvcc is on PATH, use nvcc (TVM_CUDA_COMPILE_MODE), unless the user chose."""
    if os.environ.get("TVM_CUDA_COMPILE_MODE") or not shutil.which("nvcc"):
        return
    try:
        has_nvrtc = importlib.util.find_spec("cuda.bindings") is not None
    except ModuleNotFoundError:  # no "cuda" package at all
        has_nvrtc = False
    if not has_nvrtc:
        os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"


def flush_bytes(dev) -> int:
    """Twice the device's L2 size, or FALLBACK_FLUSH_BYTES where the device does not report it."""
    l2 = dev.l2_cache_size_bytes if dev.exist else None
    return 2 * int(l2) if l2 else FALLBACK_FLUSH_BYTES


def flush_elems(nbytes: int) -> int:
    """int32 elements of the flush buffer: at least nbytes, in whole blocks of FLUSH_THREADS."""
    return -(-nbytes // (4 * FLUSH_THREADS)) * FLUSH_THREADS


def flush_func(nbytes: int, target):
    """The flush PrimFunc `FLUSH_SYMBOL(buf: int32[flush_elems(nbytes)])`: writes buf[i] = i % 251
    (a pattern a test can check) for every i. On a GPU target it is one kernel, one thread per
    element (no bounds check: the size is whole blocks); elsewhere a plain loop."""
    import tvm
    from tvm import te

    buf = te.compute((flush_elems(nbytes),), lambda i: (i % 251).astype("int32"), name="flush")
    func = te.create_prim_func([buf]).with_attr("global_symbol", FLUSH_SYMBOL)
    if not is_gpu(target):
        return func
    sch = tvm.s_tir.Schedule(func)
    (i,) = sch.get_loops(sch.get_sblock("flush"))
    bx, tx = sch.split(i, factors=[None, FLUSH_THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    return sch.mod["main"]


def build_flush(nbytes: int, target):
    """(the flush PrimFunc, its compiled Executable) for `target`; compiles without a GPU."""
    import tvm

    func = flush_func(nbytes, target)
    with target:
        return func, tvm.compile(tvm.IRModule({FLUSH_SYMBOL: func}), target=target)


class L2Flush:
    """Evicts the device's caches between timed calls. Calling it writes the whole flush buffer
    (`nbytes`, by default flush_bytes(dev)) with the compiled flush kernel and returns once the
    device has finished."""

    def __init__(self, target, dev, nbytes: int | None = None):
        import tvm

        nbytes = nbytes or flush_bytes(dev)
        _, ex = build_flush(nbytes, target)
        n = flush_elems(nbytes)
        self.dev, self.kernel, self.nbytes = dev, ex[FLUSH_SYMBOL], 4 * n
        self.buffer = tvm.runtime.empty((n,), "int32", dev)

    def __call__(self):
        self.kernel(self.buffer)
        self.dev.sync()


@functools.cache
def l2_flush(arch: str) -> L2Flush:
    """The process's L2Flush for tvm.cuda(0), built once per CUDA architecture."""
    import tvm

    return L2Flush(resolve("cuda", arch=arch), tvm.cuda(0))


def describe_timing(arch: str) -> str:
    """One line on how GPU rows are timed: the device, its L2, and the flush before every call."""
    import tvm

    dev, flush = tvm.cuda(0), l2_flush(arch)
    l2 = dev.l2_cache_size_bytes
    return (f"{dev.device_name} (L2 {f'{l2 / 2**20:.0f} MiB' if l2 else 'size not reported'}), "
            f"{flush.nbytes / 2**20:.0f} MiB written by a TVM kernel before every timed call, "
            "medians of single device-synchronized calls")


def peer(w, system: str, threads: int, dtype: str = "float32"):
    """`system` on the GPU for workload w, as the fields of a tvmfuse.bench.Ready (call: zero
    arguments, out: its outputs as numpy, sync, compile_s), or a string: why it cannot run here."""
    from . import baselines

    if system == "numpy":
        return "numpy is not a GPU system"
    x = w.inputs()
    if system in ("torch", "torch.compile", "torch.compile+freezing"):
        try:
            import torch
        except ImportError:
            return "torch is not installed"
        if not torch.cuda.is_available():
            return f"torch {torch.__version__} has no CUDA here (torch.cuda.is_available() is False)"
        from .gpu_clock import torch_device_timer

        r = baselines.TorchRunner(w, threads, compiled=system != "torch", device="cuda",
                                  freezing=system == "torch.compile+freezing", dtype=dtype)
        return {"call": r.run, "out": r(*x), "sync": torch.cuda.synchronize, "compile_s": r.compile_s,
                "device_timer": lambda flush: torch_device_timer(r.run, flush)}
    if system == "onnxruntime":
        try:
            import onnxruntime as ort
        except ImportError:
            return "onnxruntime is not installed"
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (install onnxruntime-gpu)"
        if baselines.onnx_model(w) is None:
            return "no ONNX form"
        r = baselines.OrtRunner(w, threads, device="cuda")  # run_with_iobinding returns when done
        return {"call": r.bound(*x), "out": r(*x),
                "device_timer": lambda flush: "onnxruntime's session gives no device clock: host clock only"}
    raise ValueError(f"{system!r} is not a peer")
