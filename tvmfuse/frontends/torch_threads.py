"""TVM kernels on PyTorch's OpenMP threads, for builds that run between PyTorch ops.

Contract: `module_on_torch_threads(compiled)` returns the build's executable loaded so that its CPU
kernels run their parallel loops on the OpenMP team PyTorch's own ops use (torch.get_num_threads()
threads), and `main_on_torch_threads(compiled)` the `main` of a VM of it; each returns None
where that cannot be set up here (PyTorch not built with OpenMP, no C compiler with -fopenmp, a
non-CPU build): the caller then uses the build's ordinary VM, and the reason is logged once.
Results are the same either way: only who runs each kernel's parallel chunks changes.

Why: TVM's CPU kernels hand their parallel loops to TVM's own thread pool. Around a torch.compile
backend, PyTorch's ops run in between on libgomp's threads, which spin (not yield) for some
milliseconds after every parallel op. On a machine with as many threads as cores, a TVM kernel
launched in that window shares its cores with the spinning threads, and its statically split chunks
wait for the descheduled worker: one elementwise PyTorch op before a BERT-small backward graph
(2 layers, hidden 256, 70 kernels) took it from 23 ms to 31 ms (AMD EPYC, 2 threads). Inductor's
kernels avoid this by being OpenMP code themselves; this module does the same for TVM's.

How: an LLVM-built module calls the runtime's parallel launcher through a function pointer it
exports (`__TVMBackendParallelLaunch`, filled in when the module is loaded). The build's executable
is exported to a shared library, loaded, and that pointer (and the barrier's, where the module has
one) is set to a 20-line OpenMP launcher compiled once per machine against the libgomp PyTorch
loaded. The launcher gives each OpenMP thread one task, as TVM's own OpenMP backend does.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import tempfile

log = logging.getLogger("tvmfuse.torch")

_SOURCE = r"""
#include <omp.h>
#ifdef __cplusplus
extern "C" {
#endif
typedef struct { void* sync_handle; int num_task; } TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);

int tvmfuse_omp_parallel_launch(FTVMParallelLambda flambda, void* cdata, int num_task) {
  int err = 0;
  int n = num_task > 0 ? num_task : omp_get_max_threads();
#pragma omp parallel num_threads(n)
  {
    TVMParallelGroupEnv env;
    env.sync_handle = 0;
    env.num_task = omp_get_num_threads(); /* 1 inside another parallel region */
    int r = flambda(omp_get_thread_num(), &env, cdata);
    if (r != 0) {
#pragma omp atomic write
      err = r;
    }
  }
  return err;
}

int tvmfuse_omp_parallel_barrier(int task_id, TVMParallelGroupEnv* penv) {
#pragma omp barrier
  return 0;
}
#ifdef __cplusplus
}
#endif
"""

_POINTERS = (("__TVMBackendParallelLaunch", "tvmfuse_omp_parallel_launch"),
             ("__TVMBackendParallelBarrier", "tvmfuse_omp_parallel_barrier"))


def _cache_dir() -> str:
    path = os.path.join(tempfile.gettempdir(), f"tvmfuse-{os.getuid() if hasattr(os, 'getuid') else 'user'}")
    os.makedirs(path, exist_ok=True)
    return path


@functools.cache
def launcher():
    """(ctypes library of the OpenMP launcher, None) or (None, why it is unavailable)."""
    import torch

    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None, "PyTorch's CPU ops do not run on OpenMP here"
    from tvm.support import cc

    digest = hashlib.sha256(_SOURCE.encode()).hexdigest()[:16]
    path = os.path.join(_cache_dir(), f"omp_launch-{digest}.so")
    try:
        if not os.path.exists(path):
            src = os.path.join(_cache_dir(), f"omp_launch-{digest}-{os.getpid()}.c")
            with open(src, "w") as f:
                f.write(_SOURCE)
            tmp = path + f".{os.getpid()}.tmp.so"
            cc.create_shared(tmp, [src], options=["-O2", "-fopenmp"])
            os.replace(tmp, path)  # atomic: another process never loads a half-written library
            os.remove(src)
        lib = ctypes.CDLL(path)
    except Exception as err:  # noqa: BLE001 - any compiler or loader failure: TVM's own pool instead
        return None, f"the OpenMP launcher could not be built ({type(err).__name__}: {str(err)[:200]})"
    return lib, None


def main_on_torch_threads(compiled):
    """The `main` of a VM of `compiled` whose kernels run on PyTorch's OpenMP threads (see the
    module docstring), or None with the reason logged once per reason."""
    import tvm
    from tvm import relax

    module = module_on_torch_threads(compiled)
    return None if module is None else relax.VirtualMachine(module, tvm.cpu(0))["main"]


def module_on_torch_threads(compiled):
    """The executable of `compiled` loaded from a shared library whose kernels run on PyTorch's
    OpenMP threads (see the module docstring; its kernels are also callable one by one,
    `get_function(name, query_imports=True)`), or None with the reason logged once per reason."""
    import tvm

    if compiled.target.kind.name != "llvm":
        return None
    lib, why = launcher()
    if lib is None:
        _log_once(why)
        return None
    with tempfile.TemporaryDirectory(dir=_cache_dir()) as tmp:
        path = os.path.join(tmp, "graph.so")
        try:
            compiled.executable.export_library(path)
            module = tvm.runtime.load_module(path)
            handle = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except Exception as err:  # noqa: BLE001 - export needs a C compiler: the in-memory build instead
            _log_once(f"the build could not be exported to a shared library ({type(err).__name__}: {str(err)[:200]})")
            return None
        for pointer, function in _POINTERS:
            try:
                slot = ctypes.c_void_p.in_dll(handle, pointer)
            except ValueError:  # the module never uses it (no kernel with a barrier)
                continue
            slot.value = ctypes.cast(getattr(lib, function), ctypes.c_void_p).value
    return module


@functools.cache
def _log_once(why: str) -> None:
    log.info("tvmfuse: kernels run on TVM's thread pool, not PyTorch's OpenMP threads: %s", why)
