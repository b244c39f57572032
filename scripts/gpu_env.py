"""The run half of the GPU check (scripts/gpu_device.py): the machine. Runtime-only TVM from the
bundle (and TVM's CUDA runtime library, which runtime-only mode does not load by itself), the
device's facts for the report, and the timing: an L2 flush before each single call, host clock to
device synchronization, medians."""
from __future__ import annotations

import ctypes
import glob
import os
import platform
import subprocess
import sys
import time

FALLBACK_FLUSH_BYTES = 256 << 20
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_portable():
    """tvmfuse/bench/gpu_portable.py, by path (importing the tvmfuse package would import the compiler)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tvmfuse_gpu_portable", os.path.join(ROOT, "tvmfuse", "bench/gpu_portable.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_PORTABLE = load_portable()
time_flushed = _PORTABLE.time_flushed  # the same timing loop as the benchmark's (bench_gpu)
time_events = _PORTABLE.time_events  # ... and the same device clock (bench/gpu_clock.py)


# ---------------------------------------------------------------- environment
def setup_runtime(bundle: str, device: str) -> dict:
    """Make `import tvm` the runtime-only TVM (the bundle's, unless one is importable already),
    import it, and on CUDA load TVM's CUDA runtime library (runtime-only TVM does not). Returns
    facts for the report. Call before anything imports tvm."""
    info = {}
    site, fallback = os.path.join(bundle, "site"), os.path.join(bundle, "fallback")
    os.environ.setdefault("TVM_USE_RUNTIME_LIB", "1")
    os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")  # no JIT build of a torch addon
    if os.path.isdir(site) and os.path.abspath(site) not in [os.path.abspath(p) for p in sys.path]:
        sys.path.insert(0, os.path.abspath(site))
    if os.path.isdir(fallback):
        sys.path.append(os.path.abspath(fallback))  # last: the machine's own typing_extensions wins
    if device == "cuda":
        try:
            import torch  # noqa: F401  (first, so its CUDA libraries are the ones loaded)
        except ImportError:
            pass
    t0 = time.perf_counter()
    import tvm

    info["tvm"] = tvm.__version__
    info["tvm_file"] = os.path.dirname(tvm.__file__)
    info["runtime_only"] = bool(tvm.base._RUNTIME_ONLY)
    info["import_s"] = round(time.perf_counter() - t0, 2)
    if device == "cuda":
        info.update(load_cuda_runtime(tvm, bundle))
    info["compiler_modules"] = sorted(m for m in ("tvm.relax", "tvmfuse") if m in sys.modules)
    return info


def _cudart_candidates(bundle):
    pats = ["/usr/local/cuda*/lib64/libcudart.so.13*", "/usr/local/cuda*/targets/*/lib/libcudart.so.13*",
            "/usr/lib/x86_64-linux-gnu/libcudart.so.13*"]
    for p in sys.path:
        pats.append(os.path.join(p, "nvidia", "*", "lib", "libcudart.so.13*"))
        pats.append(os.path.join(p, "nvidia", "cu13", "lib", "libcudart.so.13*"))
    out = []
    for pat in pats:
        out += sorted(glob.glob(pat))
    out.append(os.path.join(bundle, "cudart", "libcudart.so.13"))
    return out


def load_cuda_runtime(tvm, bundle) -> dict:
    """Load libcudart.so.13 (the system's, else a pip-installed one, else the bundle's copy) and
    TVM's libtvm_runtime_cuda.so, which registers the cuda device API and the loader of CUDA
    modules ("ffi.Module.load_from_bytes.cuda")."""
    info = {}
    try:
        ctypes.CDLL("libcudart.so.13", mode=ctypes.RTLD_GLOBAL)
        info["cudart"] = "libcudart.so.13 (loader path)"
    except OSError:
        errors = []
        for path in _cudart_candidates(bundle):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                info["cudart"] = path
                break
            except OSError as err:
                errors.append(f"{path}: {err}")
        else:
            info["cudart"] = None
            info["cudart_errors"] = errors[-3:]
    from tvm_ffi.libinfo import load_lib_ctypes

    from pathlib import Path

    lib_dir = Path(tvm.__file__).resolve().parent / "lib"
    for name in ("tvm_runtime_cuda", "tvm_runtime_extra"):
        if name in tvm.base._LOADED_LIBS:
            continue
        try:
            tvm.base._LOADED_LIBS[name] = load_lib_ctypes("tvm", name, "RTLD_LOCAL", extra_lib_paths=[lib_dir])
            info[name] = "loaded"
        except Exception as err:  # noqa: BLE001  OSError, RuntimeError; reported, the run goes on
            info[name] = f"failed: {str(err).splitlines()[0][:300]}"
    info["cuda_enabled"] = bool(tvm.runtime.enabled("cuda"))
    return info


# ---------------------------------------------------------------- timing
class Flush:
    """Evicts the caches before a timed call: writes a buffer of twice the device's L2 (CUDA:
    torch, then synchronizes) or FALLBACK_FLUSH_BYTES (CPU: numpy)."""

    def __init__(self, device, torch):
        self.torch, self.device = torch, device
        if device == "cuda" and torch is not None and torch.cuda.is_available():
            l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0)
            self.nbytes = 2 * int(l2) if l2 else FALLBACK_FLUSH_BYTES
            self.buf = torch.empty(self.nbytes // 4, dtype=torch.int32, device="cuda")
            self.how = f"torch zero_() of {self.nbytes / 2**20:.0f} MiB (2x L2 {l2 / 2**20:.0f} MiB) + synchronize"
        elif device == "cuda":
            self.nbytes, self.buf, self.how = 0, None, "none (torch with CUDA is missing)"
        else:
            import numpy as np

            self.nbytes = 64 << 20
            self.buf = np.empty(self.nbytes // 4, dtype="int32")
            self.how = f"numpy fill of {self.nbytes / 2**20:.0f} MiB"

    def __call__(self):
        if self.buf is None:
            return
        if self.device == "cuda":
            self.buf.zero_()
            self.torch.cuda.synchronize()
        else:
            self.buf.fill(1)


def import_torch(no_torch: bool):
    """torch for the references and peers, or None (--no-torch, or not installed)."""
    if no_torch:
        return None
    try:
        import torch
    except ImportError:
        return None
    # float32 peers in full float32 (cuDNN convolutions default to TF32 on Ampere and later)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def device_facts(device, torch, dev):
    facts = {"host": platform.node(), "python": platform.python_version(), "machine": platform.machine()}
    try:
        import numpy as np

        facts["numpy"] = np.__version__
    except ImportError:
        pass
    if torch is not None:
        facts["torch"] = torch.__version__
        facts["torch_cuda"] = torch.version.cuda
    if device == "cuda":
        if torch is not None and torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            facts["device"] = torch.cuda.get_device_name(0)
            facts["capability"] = f"sm_{p.major}{p.minor}"
            facts["memory_gib"] = round(p.total_memory / 2**30, 1)
            facts["l2_bytes"] = getattr(p, "L2_cache_size", None)
            facts["sms"] = p.multi_processor_count
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,power.limit",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            facts["nvidia_smi"] = q.stdout.strip() or q.stderr.strip()
        except (OSError, subprocess.SubprocessError) as err:
            facts["nvidia_smi"] = f"unavailable: {err}"
        try:
            facts["tvm_device"] = str(dev.device_name)
            facts["tvm_compute_version"] = str(dev.compute_version)
        except Exception as err:  # noqa: BLE001
            facts["tvm_device"] = f"error: {err}"
    else:
        try:
            with open("/proc/cpuinfo") as f:
                facts["device"] = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
        except (OSError, StopIteration):
            facts["device"] = platform.processor()
    return facts
