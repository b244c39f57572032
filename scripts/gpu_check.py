#!/usr/bin/env python
"""The CUDA check of tvmfuse on a GPU, in two phases or in one.

Two phases (a GPU machine with NO TVM compiler, e.g. the device tool's H200; docs/gpu.md):

    ./dev python scripts/device_bundle.py          # .devbundle/site: runtime-only tvm + tvm_ffi (cp312)
    ./dev python scripts/gpu_check.py prepare [--dir .devbundle/cases] [--arch sm_90] [--target cuda|llvm]
    # on the GPU machine, runtime-only TVM, no tvmfuse compiler import (scripts/gpu_device.py):
    python3 scripts/gpu_check.py run [--dir .devbundle/cases] [--out DIR] [--device cuda|cpu]

`prepare` builds every zoo workload (bench shapes) with fusion tvm and tvmfuse, and attention at
batch 1, 12 heads x 64, seq 128/512/2048 (plain and causal) as tvmfuse (one flash kernel),
tvmfuse-unfused (attention=False) and stock tvm, for CUDA (sm_90) here, exports each as a .so and
writes manifest.json (tvmfuse/bench/gpu_cases.py). `run` loads them with tvm.runtime.load_module, checks
numerics against a float64 reference (torch on the GPU; the numpy one where it was stored), counts
kernel launches while running, times medians of single calls each after an L2 flush, next to torch
eager / scaled_dot_product_attention, and writes gpu-run.json and gpu-run.md into --out.
`prepare --target llvm` + `run --device cpu` is the same flow on the CPU (its self-test).

One phase (`all`, or no subcommand; a machine with a GPU AND the compiler TVM): every zoo workload
built with fusion="tvm" and fusion="tvmfuse" for CUDA and measured by the benchmark's own code
(tvmfuse.bench.measure_workload with target="cuda"): outputs checked against numpy (rtol 1e-3,
atol 1e-4 at least), kernel launches counted while running and from the source, latency as the
median of single calls, each after an L2 flush. Writes the results as data,
results/gpu/<arch>-<date>.json (with the exact command line) and .md (the table), and prints
the table. The defaults fit in a few minutes on one GPU (bench shapes, 5 rounds x 0.1 s).

    ./dev python scripts/gpu_check.py [all] [--arch sm_90] [--size bench] [--out DIR]

On a machine without a GPU, `all` and `run --device cuda` stop at once with exit code 3 and say so.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
DEFAULT_CASES = os.path.join(".devbundle", "cases")

# The driver API symbols libtvm_runtime_cuda.so links (nm -D --undefined-only), plus what cudart
# probes first; each returns CUDA_ERROR_NO_DEVICE (100).
_STUB_SYMBOLS = ("cuDeviceGetName", "cuFuncSetAttribute", "cuLaunchKernelEx", "cuModuleGetFunction",
                 "cuModuleLoadData", "cuModuleUnload", "cuTensorMapEncodeTiled", "cuInit", "cuDriverGetVersion",
                 "cuGetProcAddress", "cuGetProcAddress_v2", "cuDeviceGet", "cuDeviceGetCount")


def cuda_stub_source() -> str:
    """C source of a libcuda.so.1 stand-in: every entry point fails with CUDA_ERROR_NO_DEVICE, so
    tvm.cuda(0).exist stays False, but libtvm_runtime_cuda.so loads, and with it TVM's CUDA codegen
    calls nvcc and keeps the binary (without it the cuda module is CUDA source only)."""
    lines = ["/* libcuda.so.1 stand-in for building CUDA with TVM on a machine without the driver */",
             'static const char *msg = "CUDA_ERROR_NO_DEVICE (tvmfuse libcuda stub: no driver here)";',
             "int cuGetErrorName(int e, const char **s) { *s = msg; return 0; }",
             "int cuGetErrorString(int e, const char **s) { *s = msg; return 0; }"]
    lines += [f"int {name}(void) {{ return 100; }}" for name in _STUB_SYMBOLS]
    return "\n".join(lines) + "\n"


def preload_cuda_stub() -> str | None:
    """Before TVM is imported: where libcuda.so.1 does not load (no driver), compile the stub with
    cc (soname libcuda.so.1) and load it RTLD_GLOBAL, so libtvm_runtime_cuda.so's dependency
    resolves to it. Returns the stub's path, or None when the real driver loads."""
    try:
        ctypes.CDLL("libcuda.so.1")
        return None
    except OSError:
        pass
    d = tempfile.mkdtemp(prefix="tvmfuse-cudastub-")
    src, lib = os.path.join(d, "stub.c"), os.path.join(d, "libcuda.so.1")
    with open(src, "w") as f:
        f.write(cuda_stub_source())
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1", "-o", lib, src], check=True)
    ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    return lib


def _ints(text):
    return [int(x) for x in text.split(",") if x.strip()]


def prepare_main(argv) -> int:
    ap = argparse.ArgumentParser(prog="gpu_check.py prepare",
                                 description="Build the cases for `run` (needs the compiler TVM; no GPU).")
    ap.add_argument("--dir", default=DEFAULT_CASES)
    ap.add_argument("--target", default="cuda", choices=("cuda", "llvm"))
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--size", default="bench")
    ap.add_argument("--workloads", default="all", help="comma-separated zoo names, all, or none")
    ap.add_argument("--systems", default="tvm,tvmfuse")
    ap.add_argument("--attention-seqs", default="128,512,2048", help="'' for none")
    ap.add_argument("--causal-seqs", default="128,512,2048", help="'' for none")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--max-ref-kib", type=int, default=2048, help="store the numpy reference up to this size")
    ap.add_argument("--models", default="bert-base", help="full-size models, weights as parameters ('' for none; "
                                                             "bert-base takes ~7 min to build here)")
    args = ap.parse_args(argv)
    stub = preload_cuda_stub() if args.target == "cuda" else None
    from tvmfuse.bench import cli as bench_cli

    bench_cli.quiet_runtimes()
    from tvmfuse.bench import gpu_cases
    from tvmfuse.zoo import workloads

    names = (workloads.names() if args.workloads == "all" else [] if args.workloads == "none"
             else [n.strip() for n in args.workloads.split(",") if n.strip()])
    command = " ".join(["./dev python scripts/gpu_check.py prepare", shlex.join(argv)]).strip()
    t0 = time.time()
    m = gpu_cases.prepare(args.dir, args.target, args.arch, args.size, names,
                          [s.strip() for s in args.systems.split(",") if s.strip()],
                          _ints(args.attention_seqs), _ints(args.causal_seqs), args.heads, args.head_dim,
                          args.max_ref_kib << 10, command, log=lambda s: print(s, flush=True),
                          models=[x.strip() for x in args.models.split(",") if x.strip()])
    m["prepared"]["cuda_stub"] = stub
    with open(os.path.join(args.dir, gpu_cases.MANIFEST), "w") as f:
        json.dump(m, f, indent=1)
    total = sum(os.path.getsize(os.path.join(args.dir, f)) for f in os.listdir(args.dir))
    print(f"{len(m['cases'])} cases in {args.dir} ({total / 2**20:.1f} MiB), {time.time() - t0:.0f}s"
          + (f"; libcuda stub {stub}" if stub else ""))
    for f in m["failed"]:
        print(f"not built: {f['id']}: {f['error']}")
    return 0


def run_main(argv) -> int:
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import gpu_device  # scripts/: runtime-only, imports no tvmfuse

    return gpu_device.main(argv)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["prepare"]:
        return prepare_main(argv[1:])
    if argv[:1] == ["run"]:
        return run_main(argv[1:])
    return all_main(argv[1:] if argv[:1] == ["all"] else argv)


def all_main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--size", default="bench")
    ap.add_argument("--systems", default="tvm,tvmfuse", help="comma-separated (peers run where they have CUDA)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    ap.add_argument("--budget", type=float, default=0.1, help="seconds of flushed calls per system per round")
    ap.add_argument("--out", default=os.path.join("results", "gpu"))
    args = ap.parse_args(argv)
    from tvmfuse.bench import cli as bench_cli

    bench_cli.quiet_runtimes()
    from tvmfuse.bench.gpu import NO_GPU_EXIT, describe_timing, no_gpu_reason

    reason = no_gpu_reason()
    if reason:
        print(f"error: {reason}; run this script on a machine with a GPU", file=sys.stderr)
        return NO_GPU_EXIT
    import tvm

    from tvmfuse.bench import core as bench
    from tvmfuse.zoo import workloads
    from tvmfuse.target import resolve

    systems, t0 = [s.strip() for s in args.systems.split(",") if s.strip()], time.time()
    rows = []
    for name in workloads.names():
        rows.append(bench.measure_workload(name, args.size, systems, args.rounds, args.budget, "cuda", arch=args.arch))
        print(f"{name}: ms {rows[-1].ms} launches {rows[-1].launches} ran {rows[-1].ran} ok {rows[-1].ok}",
              flush=True)
    header = (f"target {resolve('cuda', arch=args.arch)}, {describe_timing(args.arch)}, {args.size} shapes, "
              f"{args.rounds} rounds x {args.budget}s per system, {time.time() - t0:.0f}s in all")
    table = bench.summary(rows, systems)
    command = " ".join(["./dev python scripts/gpu_check.py", shlex.join(argv)]).strip()
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"{args.arch}-{datetime.date.today().isoformat()}")
    with open(stem + ".json", "w") as f:
        json.dump({"command": command, "device": str(tvm.cuda(0).device_name), "timing": header,
                   "size": args.size, "rows": [r.as_dict() for r in rows]}, f, indent=2)
    with open(stem + ".md", "w") as f:
        f.write(f"`{command}`\n\n{header}\n\n{table}\n")
    print(f"{header}\n\n{table}\n\nwrote {stem}.json and {stem}.md")
    bad = [r.workload for r in rows if not all(r.ok.values())]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
