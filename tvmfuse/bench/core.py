"""Side-by-side benchmark of the zoo across systems, measured in one process run.

Contract: `measure_workload(name, size, systems, rounds, budget_s)` builds every (workload, system) pair,
checks each system's outputs against the workload's numpy reference, then times all systems of a
workload in interleaved rounds (system order rotated each round, so drift and noisy neighbours hit
every system alike) and returns one `Row` per workload with the median per-call latency of each.

Systems (tvmfuse.bench.systems says what each is; its LABELS name them in every ratio): "none" /
"tvm" / "tvmfuse" (tvmfuse.build's variants with tvmfuse's default schedules, untuned: "tvm" is
stock FuseOps on tvmfuse's schedules), "tvm+tuned" / "tvmfuse+tuned" (the same with `logs`, tuned
records that beat the defaults), "vanilla tvm" (relax.build with TVM's default pipeline and
dlight, untouched by tvmfuse: tvmfuse.bench.baselines_tvm), "onnxruntime" (all graph optimizations),
"torch" (eager), "torch.compile" (Inductor, default mode) and "torch.compile+freezing" (Inductor
with freezing=True; compile times kept in the row), all with the same thread count as TVM
(tvmfuse.bench.baselines), "torch.compile[tvmfuse]" (real models: the PyTorch module through
torch.compile(backend="tvmfuse"), the path a PyTorch user takes; not a peer) and "numpy" (the
workload's reference). A system a workload has no form for is left out of its row. A system
whose single call takes over SLOW_CALL_S (vanilla TVM's naive loops on a full-size model) is timed
in at most SLOW_ROUNDS rounds of one call each; the row's `capped` says so.

On target="cuda" (tvmfuse.bench.gpu) the TVM systems run on tvm.cuda(0), each timed call follows an
L2 flush, the peers run on the GPU where their runtime can (else the row says why not), numpy is
left out, and the numerics tolerances are at least rtol 1e-3 / atol 1e-4. On every target the TVM
systems' kernel launches are counted twice: statically and while running (`Row.ran`).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from ..zoo import workloads
from .baselines_tvm import build_vanilla
from ..build import build
from ..install import install_once
from ..runtime.metrics import dynamic_launches
from ..target import is_gpu, resolve, runtime_threads

from .report import best_peer, geomean, kernel_tables, roofline_table, summary  # noqa: F401 (bench.summary)
from .systems import BACKEND, FREEZING, PEERS, SYSTEMS, TUNED, TVM_SYSTEMS, VANILLA  # noqa: F401

# numpy's OpenBLAS keeps its worker threads spinning for ~0.1 s after a call (its default thread
# timeout, 2^28 cycles): the system timed next ran 20% slow (mlp_block 13.6 ms instead of 11.2).
# The benchmark waits this long after timing numpy.
BLAS_SPIN_S = 0.15
# A system whose call takes longer than this (vanilla TVM's unscheduled loop nests on a full-size
# model: seconds to a minute per call) is timed in at most SLOW_ROUNDS rounds of one call each, so
# that a run stays bounded; the row records it in `capped`.
SLOW_CALL_S = 2.0
SLOW_ROUNDS = 3
F32 = "float32"

@dataclass
class Row:
    workload: str
    ms: dict = field(default_factory=dict)  # system -> median ms per call
    launches: dict = field(default_factory=dict)  # TVM systems -> static launches
    ran: dict = field(default_factory=dict)  # TVM systems -> launches counted while running
    samples: dict = field(default_factory=dict)  # system -> timings the median is taken over
    ok: dict = field(default_factory=dict)  # system -> outputs match the reference
    skipped: dict = field(default_factory=dict)  # system -> why it has no number
    compile_s: dict = field(default_factory=dict)  # torch.compile: seconds of the first call
    build_s: dict = field(default_factory=dict)  # TVM systems: seconds of tvmfuse.build
    import_s: float = 0.0  # a real model: seconds to import it (torch.export + from_exported_program)
    flops: int = 0  # a real model: its matmul/conv FLOPs (roofline.graph_flops)
    kernels: list = field(default_factory=list)  # a real model: tvmfuse's runtime.kernel_profile rows
    memory_bound: bool = False  # the workload's fact (workload.Workload.memory_bound)
    reduction_heavy: bool = False  # the workload's fact (workload.Workload.reduction_heavy)
    capped: dict = field(default_factory=dict)  # system -> how its timing was cut short (SLOW_CALL_S)
    device_ms: dict = field(default_factory=dict)  # GPU: system -> median ms on the device's clock
    no_device_clock: dict = field(default_factory=dict)  # GPU: system -> why it has no device clock

    def ratio(self, a, b):
        """How many times faster a is than b (b's ms over a's)."""
        return self.ms[b] / self.ms[a] if a in self.ms and b in self.ms else None

    def as_dict(self):
        return asdict(self)


def _close(out, ref, rtol, atol):
    out = out if isinstance(out, tuple) else (out,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    return len(out) == len(ref) and all(np.allclose(o, r, rtol=rtol, atol=atol) for o, r in zip(out, ref))


def _no_sync():
    pass


@dataclass
class Ready:
    """A system ready to time: `call()` runs one inference, `out` is its outputs (numpy), `sync()`
    waits for the device work `call` queued; `launches`/`ran`: a TVM system's kernel launches,
    static and counted while running (None for the peers); `compile_s`: torch.compile's first call."""
    call: Callable
    out: object
    sync: Callable = _no_sync
    launches: int | None = None
    ran: int | None = None
    compile_s: float = 0.0
    build_s: float = 0.0
    compiled: object = None  # a TVM system's tvmfuse.Compiled (the per-kernel profile)
    call_s: float = 0.0  # a TVM system: seconds of one call (its numerics run), for SLOW_CALL_S
    # GPU only: flush -> (n -> n device-clock seconds, each call after flush()) or why there is no
    # device clock (tvmfuse.bench.gpu_clock)
    device_timer: Callable | None = None


def _tvm_system(w, system, target, x, logs, dtype=F32):
    """A TVM system (none/tvm/tvmfuse, +tuned with `logs`, or vanilla TVM) built for `target` (in
    `dtype`: build's half precision), its inputs on the target's device, its launches counted
    statically and over one instrumented run."""
    t0 = time.perf_counter()
    if system == VANILLA:
        c = build_vanilla(w.mod, target)
    else:
        c = build(w.mod, target, system.split("+")[0], tuning_logs=logs if system in TUNED else None,
                  dtype=None if dtype == F32 else dtype)
    build_s = time.perf_counter() - t0
    f, args = c.vm()["main"], c.convert_inputs(x)
    t0 = time.perf_counter()
    out = c(*x)
    call_s = time.perf_counter() - t0
    ran, _ = dynamic_launches(c, args)
    timer = None
    if c.device.dlpack_device_type() != 1:  # a GPU (kDLCPU is 1): the device clock too
        from .gpu_clock import tvm_device_timer

        vm = c.vm()
        timer = lambda flush: tvm_device_timer(vm, args, c.device, flush)  # noqa: E731
    return Ready(lambda: f(*args), out, c.device.sync, launches=c.launches, ran=ran, build_s=build_s, compiled=c,
                 call_s=call_s, device_timer=timer)


# Under a half dtype (build's dtype=, passes/cast_to_half.py) the systems that have no such form
# are left out, each with its reason; torch runs the model in that dtype.
NO_HALF_FORM = {
    VANILLA: "vanilla TVM has no half-precision build here (relax.build of the float32 module)",
    "onnxruntime": "the ONNX export is float32: not a half-precision peer",
    BACKEND: "torch.compile[tvmfuse] builds float32",
    "numpy": "the float32 reference, not a half-precision system",
}


def _half_reason(s, dtype):
    return NO_HALF_FORM.get(s) if dtype != F32 else None


def _callables(w, systems, target, threads, logs=None, dtype=F32):
    """system -> Ready; system -> why skipped. On a GPU target the peers are their CUDA forms
    (tvmfuse.bench.gpu.peer, baselines.model_peer on "cuda"); in a half `dtype` the TVM systems
    are built in it and torch runs in it."""
    from . import baselines, gpu as bench_gpu

    x = w.inputs()
    out, skipped = {}, {}
    for s in systems:
        if s not in SYSTEMS + TUNED:
            raise ValueError(f"unknown system {s!r}; use some of {', '.join(SYSTEMS + TUNED)}")
        if s in TUNED and not logs:
            skipped[s] = "no tuning logs given"
        elif _half_reason(s, dtype):
            skipped[s] = _half_reason(s, dtype)
        elif s in TVM_SYSTEMS or s in TUNED or s == VANILLA:
            out[s] = _tvm_system(w, s, target, x, logs, dtype)
        elif not w.zoo:  # a real model (tvmfuse.zoo.models) or a model file
            got = ("numpy has no form of a real model" if s == "numpy" else
                   baselines.model_peer(w, s, threads, "cuda" if is_gpu(target) else "cpu", dtype))
            if isinstance(got, str):
                skipped[s] = got
            else:
                call, compile_s = got
                out[s] = Ready(call, _as_numpy(call()), compile_s=compile_s, **_gpu_fields(target, call))
        elif s == BACKEND:
            skipped[s] = "real models only (the zoo has no torch module)"
        elif is_gpu(target):
            got = bench_gpu.peer(w, s, threads, dtype)
            if isinstance(got, str):
                skipped[s] = got
            else:
                out[s] = Ready(**got)
        elif s == "onnxruntime":
            if baselines.onnx_model(w) is None:
                skipped[s] = "no ONNX form"
                continue
            r = baselines.OrtRunner(w, threads)
            out[s] = Ready(lambda r=r: r(*x), r(*x))
        elif s in ("torch", "torch.compile", FREEZING):
            r = baselines.TorchRunner(w, threads, compiled=s != "torch", freezing=s == FREEZING, dtype=dtype)
            out[s] = Ready(r.run, r(*x), compile_s=r.compile_s)
        else:  # numpy
            out[s] = Ready(lambda: w.reference(*x), w.reference(*x))
    return out, skipped


def _gpu_fields(target, call) -> dict:
    """A torch peer's Ready fields on a GPU: synchronize, and the device clock (CUDA events)."""
    if not is_gpu(target):
        return {}
    import torch

    from .gpu_clock import torch_device_timer

    return {"sync": torch.cuda.synchronize, "device_timer": lambda flush: torch_device_timer(call, flush)}


def _as_numpy(out):
    if isinstance(out, (tuple, list)):
        return tuple(_as_numpy(o) for o in out)
    if hasattr(out, "detach"):
        out = out.detach()
        return (out.float() if out.is_floating_point() else out).cpu().numpy()
    return np.asarray(out)


def _load(name, size, batch=1):
    """A zoo workload, a real model (`batch` deep) or a model file (tvmfuse.load)."""
    from ..loader import load

    return load(name, size, batch) if batch != 1 else load(name, size)


def _time(call, budget_s):
    """Per-call seconds: as many calls as fit in budget_s (at least 1), after one warm-up."""
    call()
    n, t0 = 0, time.perf_counter()
    while True:
        call()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= budget_s:
            return dt / n


def _sampler(target, arch, budget_s):
    """(sample, device): sample(Ready) -> per-call seconds of one round. CPU: one figure, the mean
    over budget_s of back-to-back calls. GPU: every single call of the round, each after an L2
    flush, on the host clock. device(Ready, n) -> n device-clock seconds (each call after a flush),
    or a string saying why the system has none; None on the CPU (one clock)."""
    if not is_gpu(target):
        return (lambda r: [_time(r.call, budget_s)]), None
    from . import gpu as bench_gpu

    flush = bench_gpu.l2_flush(arch)
    timers = {}

    def device(r, n):
        if id(r) not in timers:
            timers[id(r)] = r.device_timer(flush) if r.device_timer else "no device clock for this system"
        t = timers[id(r)]
        return t if isinstance(t, str) else t(n)

    return (lambda r: bench_gpu.time_flushed(r.call, r.sync, flush, budget_s)), device


def measure_workload(name, size="bench", systems=SYSTEMS, rounds=7, budget_s=0.2, target="llvm", logs=None,
                     arch="sm_90", dtype=F32, batch=1):
    """One Row for workload `name`: every system built, checked against the reference, then timed in
    `rounds` interleaved rounds (order rotated each round); ms is the median over all samples.
    target "cuda" (compiled for `arch`) needs a GPU; bench_gpu.no_gpu_reason() says whether.
    dtype "float16"/"bfloat16": the TVM systems built in it, torch run in it, the numerics held to
    cast_to_half.HALF_TOLERANCE against the float32 reference. batch: a real model's batch (the
    row's workload is then "NAME (batch N)")."""
    install_once()  # TVM's pool sized before any system runs; runtime_threads() agrees with it
    t0 = time.perf_counter()
    w = _load(name, size, batch)
    import_s = time.perf_counter() - t0
    t = resolve(target, arch=arch)
    if is_gpu(t):
        from . import gpu as bench_gpu

        bench_gpu.use_nvcc_without_nvrtc()
    calls, skipped = _callables(w, systems, t, runtime_threads(), logs, dtype)
    ref = w.reference(*w.inputs())
    rtol, atol = (max(w.rtol, 1e-3), max(w.atol, 1e-4)) if is_gpu(t) else (w.rtol, w.atol)
    if dtype != F32:
        from ..passes.cast_to_half import HALF_TOLERANCE

        scale = max(float(np.abs(r).max()) for r in (ref if isinstance(ref, tuple) else (ref,)))
        rtol, atol = HALF_TOLERANCE[dtype], HALF_TOLERANCE[dtype] * scale
    row = Row(name if batch == 1 else f"{name} (batch {batch})", skipped=skipped,
              compile_s={s: r.compile_s for s, r in calls.items() if r.compile_s}, build_s={s: r.build_s for s, r in calls.items() if r.build_s},
              memory_bound=w.memory_bound, reduction_heavy=w.reduction_heavy)
    if not w.zoo:
        row.import_s, row.flops = import_s, w.flops
    for s, r in calls.items():
        row.ok[s] = bool(_close(r.out, ref, rtol, atol))
        if r.launches is not None:
            row.launches[s], row.ran[s] = r.launches, r.ran
    sample, device = _sampler(t, arch, budget_s)
    samples, row.capped, on_device = _rounds(calls, sample, rounds, device)
    row.ms = {s: statistics.median(v) * 1e3 for s, v in samples.items()}
    row.device_ms = {s: statistics.median(v) * 1e3 for s, v in on_device.items() if isinstance(v, list) and v}
    row.no_device_clock = {s: v for s, v in on_device.items() if isinstance(v, str)}
    if row.flops and "tvmfuse" in calls and not is_gpu(t):
        row.kernels = [{k: v for k, v in r.items() if k != "outputs"}
                       for r in _kernel_rows(calls["tvmfuse"].compiled, w.inputs(), row.ms["tvmfuse"])]
    row.samples = {s: len(v) for s, v in samples.items()}
    return row


def _one_call(r) -> list:
    """One call, timed to the device's end: a slow system's sample (its warm-up was its numerics run)."""
    t0 = time.perf_counter()
    r.call()
    r.sync()
    return [time.perf_counter() - t0]


def _rounds(calls, sample, rounds, device=None):
    """The interleaved rounds: ({system: per-call seconds}, {system: how its timing was capped},
    {system: device-clock seconds, or why it has none}). A system whose call took over SLOW_CALL_S
    gets one call in each of the first SLOW_ROUNDS rounds. With `device` (GPU), each system's
    host-clock samples of a round are followed by as many device-clock samples."""
    slow = {s for s, r in calls.items() if r.call_s > SLOW_CALL_S}
    capped = {s: f"one call took {calls[s].call_s:.1f} s (over {SLOW_CALL_S:g} s): timed in "
                 f"{min(rounds, SLOW_ROUNDS)} rounds of one call, not {rounds} rounds of the budget" for s in slow}
    samples, on_device = {s: [] for s in calls}, {}
    order = list(calls)
    for i in range(rounds):
        for s in order[i % len(order):] + order[: i % len(order)]:
            if s in slow:
                samples[s] += _one_call(calls[s]) if i < SLOW_ROUNDS else []
            else:
                got = sample(calls[s])
                samples[s] += got
                if device is not None and not isinstance(on_device.get(s), str):
                    more = device(calls[s], len(got))
                    on_device[s] = more if isinstance(more, str) else on_device.get(s, []) + more
            if s == "numpy":
                time.sleep(BLAS_SPIN_S)
    return samples, capped, on_device


PROFILE_TRIES = 3  # kernel profiles taken at most per model
PROFILE_SLACK = 1.15  # ... until one's kernels sum to at most this times the timed median


def _kernel_rows(compiled, inputs, timed_ms: float) -> list[dict]:
    """tvmfuse's kernel profile of a real model, taken once after the timing rounds: retaken (up to
    PROFILE_TRIES) while its kernels sum to more than PROFILE_SLACK x the median the rounds timed,
    keeping the fastest. The host has stretches where everything runs up to 2x slower; a profile
    taken in one made every kernel look half as fast and flagged cliffs that were not there
    (MobileNetV2, 2026-12-05: kernels summed to 11.6 ms against 4.5 on a quiet stretch)."""
    from ..runtime.metrics import kernel_profile

    best = None
    for _ in range(PROFILE_TRIES):
        rows = kernel_profile(compiled, inputs, runs=5, budget_s=3.0)
        total = sum(r["ms"] for r in rows)
        if best is None or total < best[0]:
            best = (total, rows)
        if total <= PROFILE_SLACK * timed_ms:
            break
    return best[1]
