"""Side-by-side benchmark of the zoo across systems, measured in one process run.

Contract: `run(names, size, systems, rounds, budget_s)` builds every (workload, system) pair,
checks each system's outputs against the workload's numpy reference, then times all systems of a
workload in interleaved rounds (system order rotated each round, so drift and noisy neighbours hit
every system alike) and returns one `Row` per workload with the median per-call latency of each.

Systems: "none" / "tvm" / "tvmfuse" (tvmfuse.build on llvm with the default schedules, untuned),
"tvm+tuned" / "tvmfuse+tuned" (the same with `logs`, tuned records that beat the defaults),
"onnxruntime" (all graph optimizations), "torch" (eager) and "torch.compile" (Inductor; its
compile time is kept in the row), all with the same thread count as TVM (tvmfuse.baselines),
"torch.compile[tvmfuse]" (real models: the PyTorch module through torch.compile(backend="tvmfuse"),
the path a PyTorch user takes; not a peer) and "numpy" (the workload's reference). A system a workload has no form for is left out of its row.

On target="cuda" (tvmfuse.bench_gpu) the TVM systems run on tvm.cuda(0), each timed call follows an
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

from . import workloads
from .build import build
from .runtime import dynamic_launches
from .target import is_gpu, resolve, runtime_threads

TVM_SYSTEMS = ("none", "tvm", "tvmfuse")
TUNED = ("tvm+tuned", "tvmfuse+tuned")
PEERS = ("onnxruntime", "torch", "torch.compile")
BACKEND = "torch.compile[tvmfuse]"  # a real model's module through torch.compile(backend="tvmfuse")
SYSTEMS = TVM_SYSTEMS + PEERS + (BACKEND, "numpy")
# numpy's OpenBLAS keeps its worker threads spinning for ~0.1 s after a call (its default thread
# timeout, 2^28 cycles): the system timed next ran 20% slow (mlp_block 13.6 ms instead of 11.2).
# The benchmark waits this long after timing numpy.
BLAS_SPIN_S = 0.15



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


def _tvm_system(w, system, target, x, logs):
    """A TVM system (none/tvm/tvmfuse, +tuned with `logs`) built for `target`, its inputs on the
    target's device, its launches counted statically and over one instrumented run."""
    t0 = time.perf_counter()
    c = build(w.mod, target, system.split("+")[0], tuning_logs=logs if system in TUNED else None)
    build_s = time.perf_counter() - t0
    f, args = c.vm()["main"], c.convert_inputs(x)
    ran, _ = dynamic_launches(c, args)
    return Ready(lambda: f(*args), c(*x), c.device.sync, launches=c.launches, ran=ran, build_s=build_s, compiled=c)


def _callables(w, systems, target, threads, logs=None):
    """system -> Ready; system -> why skipped. On a GPU target the peers are their CUDA forms
    (tvmfuse.bench_gpu.peer)."""
    from . import baselines, bench_gpu

    x = w.inputs()
    out, skipped = {}, {}
    for s in systems:
        if s not in SYSTEMS + TUNED:
            raise ValueError(f"unknown system {s!r}; use some of {', '.join(SYSTEMS + TUNED)}")
        if s in TUNED and not logs:
            skipped[s] = "no tuning logs given"
        elif s in TVM_SYSTEMS or s in TUNED:
            out[s] = _tvm_system(w, s, target, x, logs)
        elif not w.zoo:  # a real model (tvmfuse.models) or a model file
            got = "not wired for real models on CUDA" if is_gpu(target) else (
                "numpy has no form of a real model" if s == "numpy" else baselines.model_peer(w, s, threads))
            if isinstance(got, str):
                skipped[s] = got
            else:
                call, compile_s = got
                out[s] = Ready(call, _as_numpy(call()), compile_s=compile_s)
        elif s == BACKEND:
            skipped[s] = "real models only (the zoo has no torch module)"
        elif is_gpu(target):
            got = bench_gpu.peer(w, s, threads)
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
        elif s in ("torch", "torch.compile"):
            r = baselines.TorchRunner(w, threads, compiled=s == "torch.compile")
            out[s] = Ready(r.run, r(*x), compile_s=r.compile_s)
        else:  # numpy
            out[s] = Ready(lambda: w.reference(*x), w.reference(*x))
    return out, skipped


def _as_numpy(out):
    if isinstance(out, (tuple, list)):
        return tuple(_as_numpy(o) for o in out)
    return out.detach().numpy() if hasattr(out, "detach") else np.asarray(out)


def _load(name, size):
    """A zoo workload, a real model or a model file (tvmfuse.load)."""
    from .frontends import load

    return load(name, size)


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
    """sample(Ready) -> per-call seconds of one round. CPU: one figure, the mean over budget_s of
    back-to-back calls. GPU: every single call of the round, each after an L2 flush."""
    if not is_gpu(target):
        return lambda r: [_time(r.call, budget_s)]
    from . import bench_gpu

    flush = bench_gpu.l2_flush(arch)
    return lambda r: bench_gpu.time_flushed(r.call, r.sync, flush, budget_s)


def measure_workload(name, size="bench", systems=SYSTEMS, rounds=7, budget_s=0.2, target="llvm", logs=None,
                     arch="sm_90"):
    """One Row for workload `name`: every system built, checked against the reference, then timed in
    `rounds` interleaved rounds (order rotated each round); ms is the median over all samples.
    target "cuda" (compiled for `arch`) needs a GPU; bench_gpu.no_gpu_reason() says whether."""
    t0 = time.perf_counter()
    w = _load(name, size)
    import_s = time.perf_counter() - t0
    t = resolve(target, arch=arch)
    if is_gpu(t):
        from . import bench_gpu

        bench_gpu.use_nvcc_without_nvrtc()
    calls, skipped = _callables(w, systems, t, runtime_threads(), logs)
    ref = w.reference(*w.inputs())
    rtol, atol = (max(w.rtol, 1e-3), max(w.atol, 1e-4)) if is_gpu(t) else (w.rtol, w.atol)
    row = Row(name, skipped=skipped, compile_s={s: r.compile_s for s, r in calls.items() if r.compile_s},
              build_s={s: r.build_s for s, r in calls.items() if r.build_s},
              memory_bound=w.memory_bound, reduction_heavy=w.reduction_heavy)
    if not w.zoo:
        row.import_s, row.flops = import_s, w.flops
    for s, r in calls.items():
        row.ok[s] = bool(_close(r.out, ref, rtol, atol))
        if r.launches is not None:
            row.launches[s], row.ran[s] = r.launches, r.ran
    sample = _sampler(t, arch, budget_s)
    samples = {s: [] for s in calls}
    order = list(calls)
    for i in range(rounds):
        for s in order[i % len(order):] + order[: i % len(order)]:
            samples[s] += sample(calls[s])
            if s == "numpy":
                time.sleep(BLAS_SPIN_S)
    row.ms = {s: statistics.median(v) * 1e3 for s, v in samples.items()}
    if row.flops and "tvmfuse" in calls and not is_gpu(t):
        row.kernels = [{k: v for k, v in r.items() if k != "outputs"}
                       for r in _kernel_rows(calls["tvmfuse"].compiled, w.inputs(), row.ms["tvmfuse"])]
    row.samples = {s: len(v) for s, v in samples.items()}
    return row


PROFILE_TRIES = 3  # kernel profiles taken at most per model
PROFILE_SLACK = 1.15  # ... until one's kernels sum to at most this times the timed median


def _kernel_rows(compiled, inputs, timed_ms: float) -> list[dict]:
    """tvmfuse's kernel profile of a real model, taken once after the timing rounds: retaken (up to
    PROFILE_TRIES) while its kernels sum to more than PROFILE_SLACK x the median the rounds timed,
    keeping the fastest. The host has stretches where everything runs up to 2x slower; a profile
    taken in one made every kernel look half as fast and flagged cliffs that were not there
    (MobileNetV2, 2026-12-05: kernels summed to 11.6 ms against 4.5 on a quiet stretch)."""
    from .runtime import kernel_profile

    best = None
    for _ in range(PROFILE_TRIES):
        rows = kernel_profile(compiled, inputs, runs=5, budget_s=3.0)
        total = sum(r["ms"] for r in rows)
        if best is None or total < best[0]:
            best = (total, rows)
        if total <= PROFILE_SLACK * timed_ms:
            break
    return best[1]


def geomean(values):
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def best_peer(row):
    ms = {s: row.ms[s] for s in PEERS if s in row.ms}
    return min(ms, key=ms.get) if ms else None


# (label, system a, system b, the Row fact that selects workloads or None for all): "a is N times
# faster than b"
_GEOMEANS = [
    ("tvmfuse vs tvm, all workloads", "tvmfuse", "tvm", None),
    ("tvmfuse vs tvm, reduction-heavy", "tvmfuse", "tvm", "reduction_heavy"),
    ("tvmfuse vs onnxruntime", "tvmfuse", "onnxruntime", None),
    ("tvmfuse vs torch eager", "tvmfuse", "torch", None),
    ("tvmfuse vs torch.compile", "tvmfuse", "torch.compile", None),
    ("torch.compile[tvmfuse] vs torch.compile (Inductor)", BACKEND, "torch.compile", None),
    ("tvmfuse+tuned vs tvm+tuned", "tvmfuse+tuned", "tvm+tuned", None),
    ("tvmfuse+tuned vs tvmfuse", "tvmfuse+tuned", "tvmfuse", None),
]


def summary(rows, systems):
    """Markdown: one line per workload, then the geometric means the targets are stated in."""
    ratio_cols = [(a, b) for a, b in (("tvmfuse", "tvm"), ("tvmfuse", "onnxruntime"), ("tvmfuse", "torch"),
                                      ("tvmfuse+tuned", "tvm+tuned")) if a in systems and b in systems]
    head = (["workload"] + [f"{s} ms" for s in systems] + ["launches tvm/tvmfuse", "ran tvm/tvmfuse"]
            + [f"{a} vs {b}" for a, b in ratio_cols] + ["tvmfuse vs best peer", "numerics"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    fmt = lambda x: f"{x:.2f}x" if x else "-"
    for r in rows:
        cells = [r.workload] + [f"{r.ms[s]:.3f}" if s in r.ms else "-" for s in systems]
        cells += [f"{d.get('tvm', '-')}/{d.get('tvmfuse', '-')}" for d in (r.launches, r.ran)]
        cells += [fmt(r.ratio(a, b)) for a, b in ratio_cols]
        peer = best_peer(r)
        cells.append(f"{fmt(r.ratio('tvmfuse', peer))} ({peer})" if peer else "-")
        cells.append("ok" if all(r.ok.values()) else "MISMATCH " + ",".join(s for s, v in r.ok.items() if not v))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for label, a, b, subset in _GEOMEANS:
        g = geomean([r.ratio(a, b) for r in rows if subset is None or getattr(r, subset)])
        if g:
            lines.append(f"- geometric mean, {label}: {g:.2f}x")
    g = geomean([r.ratio("tvmfuse", best_peer(r)) for r in rows if best_peer(r)])
    if g:
        lines.append(f"- geometric mean, tvmfuse vs the best peer of each workload: {g:.2f}x")
    memory = [r for r in rows if r.memory_bound and best_peer(r)]
    g = geomean([r.ratio("tvmfuse", best_peer(r)) for r in memory])
    if g and len(memory) < len(rows):
        lines.append(f"- geometric mean, tvmfuse vs the best peer, memory-bound zoo workloads: {g:.2f}x")
    skips = {(s, why): [r.workload for r in rows if r.skipped.get(s) == why]
             for r in rows for s, why in r.skipped.items()}
    for (s, why), names in skips.items():
        lines.append(f"- {s} skipped ({why}): " + ("all workloads" if len(names) == len(rows) else ", ".join(names)))
    for system in ("torch.compile", BACKEND):
        compiles = [f"{r.workload} {r.compile_s[system]:.1f}s" for r in rows if system in r.compile_s]
        if compiles:
            lines.append(f"- {system} compile time (first call): " + ", ".join(compiles))
    builds = [f"{r.workload} {r.import_s:.1f}s + {r.build_s['tvmfuse']:.1f}s" for r in rows
              if r.import_s and "tvmfuse" in r.build_s]
    if builds:
        lines.append("- real models, import + tvmfuse build: " + ", ".join(builds))
    return "\n".join(lines)


def roofline_table(rows, size, systems, bandwidth, peak_gflops, llc):
    """Markdown: for memory-bound workloads, each system's latency as a multiple of the bandwidth
    bound (minimal bytes / measured GB/s); for compute-heavy ones, achieved GFLOP/s."""
    from . import roofline

    gbs = max(bandwidth.values())
    lines = [f"Measured: {', '.join(f'{k} {v:.1f} GB/s' for k, v in bandwidth.items())}; "
             f"numpy matmul {peak_gflops:.0f} GFLOP/s; last-level cache {llc / 2**20:.0f} MiB" if llc else "",
             "", "| workload | minimal MB | cache-resident | bound ms | "
             + " | ".join(f"{s}" for s in systems) + " |", "|" + "---|" * (len(systems) + 4)]
    models = [r for r in rows if r.flops]
    for r in rows:
        if r.workload not in workloads.names():
            continue  # real models: their compute bound below
        w = workloads.get(r.workload, size)
        nbytes, fl = roofline.minimal_bytes(w), roofline.flops(w)
        bound = nbytes / gbs / 1e6
        if fl:
            cells = [f"{fl / (r.ms[s] * 1e6):.0f} GFLOP/s" if s in r.ms else "-" for s in systems]
        else:
            cells = [f"{r.ms[s] / bound:.1f}x bound" if s in r.ms else "-" for s in systems]
        # data re-read call after call stays in the LLC unless it is several times larger:
        # only a "no" row's bound is a bound
        resident = "-" if not llc else "yes" if nbytes < llc else "partly" if nbytes < 4 * llc else "no"
        lines.append(f"| {r.workload} | {nbytes / 1e6:.1f} | {resident} | {bound:.3f} | " + " | ".join(cells) + " |")
    if models:  # compute bound: the model's matmul/conv FLOPs at numpy's matmul rate of this run
        lines += ["", "| model | GFLOP | compute bound ms | " + " | ".join(systems) + " |",
                  "|" + "---|" * (len(systems) + 3)]
        for r in models:
            bound = r.flops / peak_gflops / 1e6
            cells = [f"{r.ms[s] / bound:.2f}x bound" if s in r.ms else "-" for s in systems]
            lines.append(f"| {r.workload} | {r.flops / 1e9:.2f} | {bound:.1f} | " + " | ".join(cells) + " |")
        lines += kernel_tables(models, peak_gflops, gbs)
    return "\n".join(lines)


def kernel_tables(rows, peak_gflops, gbs, top: int = 8):
    """Per real model: tvmfuse's slowest kernels against their roofline (runtime.roofline_view),
    plus every cliff (2% of the time or more at under 25% of the roofline)."""
    from .runtime import format_roofline, roofline_view

    lines = []
    for r in rows:
        if not r.kernels:
            continue
        view = roofline_view(r.kernels, peak_gflops, gbs)
        shown = sorted(view, key=lambda k: -k["ms"])[:top]
        shown += [k for k in view if k["cliff"] and k not in shown]
        cliffs = [k["name"] for k in view if k["cliff"]]
        lines += ["", f"{r.workload}, tvmfuse kernels (slowest {top}; cliffs: {', '.join(cliffs) or 'none'}):", "",
                  format_roofline(shown)]
    return lines
