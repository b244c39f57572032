"""Side-by-side benchmark of the zoo across systems, measured in one process run.

Contract: `run(names, size, systems, rounds, budget_s)` builds every (workload, system) pair,
checks each system's outputs against the workload's numpy reference, then times all systems of a
workload in interleaved rounds (system order rotated each round, so drift and noisy neighbours hit
every system alike) and returns one `Row` per workload with the median per-call latency of each.

Systems: "none" / "tvm" / "tvmfuse" (tvmfuse.build on llvm with the default schedules, untuned),
"tvm+tuned" / "tvmfuse+tuned" (the same with `logs`, tuned records that beat the defaults),
"onnxruntime" (all graph optimizations), "torch" (eager) and "torch.compile" (Inductor; its
compile time is kept in the row), all with the same thread count as TVM (tvmfuse.baselines), and
"numpy" (the workload's reference). A system a workload has no form for is left out of its row.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from . import workloads
from .build import build
from .target import resolve, runtime_threads

TVM_SYSTEMS = ("none", "tvm", "tvmfuse")
TUNED = ("tvm+tuned", "tvmfuse+tuned")
PEERS = ("onnxruntime", "torch", "torch.compile")
SYSTEMS = TVM_SYSTEMS + PEERS + ("numpy",)
REDUCTION_HEAVY = ("softmax_chain", "softmax_decomposed", "layernorm_decomposed", "rmsnorm_residual",
                   "multi_reduce")


@dataclass
class Row:
    workload: str
    ms: dict = field(default_factory=dict)  # system -> median ms per call
    launches: dict = field(default_factory=dict)  # TVM systems -> static launches
    ok: dict = field(default_factory=dict)  # system -> outputs match the reference
    skipped: dict = field(default_factory=dict)  # system -> why it has no number
    compile_s: dict = field(default_factory=dict)  # torch.compile: seconds of the first call

    def ratio(self, a, b):
        """How many times faster a is than b (b's ms over a's)."""
        return self.ms[b] / self.ms[a] if a in self.ms and b in self.ms else None

    def as_dict(self):
        return asdict(self)


def _close(out, ref, w):
    out = out if isinstance(out, tuple) else (out,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    return len(out) == len(ref) and all(np.allclose(o, r, rtol=w.rtol, atol=w.atol) for o, r in zip(out, ref))


def _callables(w, systems, target, threads, logs=None):
    """system -> (zero-argument call, its outputs, launches or None); system -> why skipped;
    system -> compile seconds."""
    from . import baselines

    x = w.inputs()
    out, skipped, compile_s = {}, {}, {}
    for s in systems:
        if s in TVM_SYSTEMS or s in TUNED:
            if s in TUNED and not logs:
                skipped[s] = "no tuning logs given"
                continue
            c = build(w.mod, target, s.split("+")[0], tuning_logs=logs if s in TUNED else None)
            vm, args = c.vm(), c.convert_inputs(x)
            f = vm["main"]
            out[s] = (lambda f=f, args=args: f(*args), c(*x), c.launches)
        elif not isinstance(w, workloads.Workload):  # a real model (tvmfuse.models)
            call = _model_peer(w, s, x)
            if call is None:
                skipped[s] = "not wired for real models"
                continue
            out[s] = (call, call(), None)
        elif s == "onnxruntime":
            if baselines.onnx_model(w) is None:
                skipped[s] = "no ONNX form"
                continue
            r = baselines.OrtRunner(w, threads)
            out[s] = (lambda r=r: r(*x), r(*x), None)
        elif s in ("torch", "torch.compile"):
            r = baselines.TorchRunner(w, threads, compiled=s == "torch.compile")
            if r.compile_s:
                compile_s[s] = r.compile_s
            out[s] = (r.run, r(*x), None)
        elif s == "numpy":
            out[s] = (lambda: w.reference(*x), w.reference(*x), None)
        else:
            raise ValueError(f"unknown system {s!r}; use some of {', '.join(SYSTEMS + TUNED)}")
    return out, skipped, compile_s


def _model_peer(m, system, x):
    """The peers of a real model: its framework's own forward ("torch"; for the ONNX export,
    "onnxruntime" is its reference session). None where the model has no such form."""
    if system == "torch" and m.eager is not None:
        return lambda: _as_numpy(m.eager(*x))
    if system == "onnxruntime" and m.name.endswith("-onnx"):
        return lambda: m.reference(*x)
    return None


def _as_numpy(out):
    if isinstance(out, (tuple, list)):
        return tuple(_as_numpy(o) for o in out)
    return out.detach().numpy() if hasattr(out, "detach") else np.asarray(out)


def _load(name, size):
    """A zoo workload, or a real model from tvmfuse.models (bert-tiny, gpt2-tiny, ...)."""
    from . import models

    return models.get(name, size) if name in models.names() else workloads.get(name, size)


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


def measure_workload(name, size="bench", systems=SYSTEMS, rounds=7, budget_s=0.2, target="llvm", logs=None):
    w = _load(name, size)
    t = resolve(target)
    calls, skipped, compile_s = _callables(w, systems, t, runtime_threads(), logs)
    ref = w.reference(*w.inputs())
    row = Row(name, skipped=skipped, compile_s=compile_s)
    for s, (_, res, launches) in calls.items():
        row.ok[s] = bool(_close(res, ref, w))
        if launches is not None:
            row.launches[s] = launches
    samples = {s: [] for s in calls}
    order = list(calls)
    for r in range(rounds):
        for s in order[r % len(order):] + order[: r % len(order)]:
            samples[s].append(_time(calls[s][0], budget_s))
    row.ms = {s: statistics.median(v) * 1e3 for s, v in samples.items()}
    return row


def geomean(values):
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def best_peer(row):
    ms = {s: row.ms[s] for s in PEERS if s in row.ms}
    return min(ms, key=ms.get) if ms else None


# (label, system a, system b, workloads or None for all): "a is N times faster than b"
_GEOMEANS = [
    ("tvmfuse vs tvm, all workloads", "tvmfuse", "tvm", None),
    ("tvmfuse vs tvm, reduction-heavy", "tvmfuse", "tvm", REDUCTION_HEAVY),
    ("tvmfuse vs onnxruntime", "tvmfuse", "onnxruntime", None),
    ("tvmfuse vs torch eager", "tvmfuse", "torch", None),
    ("tvmfuse vs torch.compile", "tvmfuse", "torch.compile", None),
    ("tvmfuse+tuned vs tvm+tuned", "tvmfuse+tuned", "tvm+tuned", None),
    ("tvmfuse+tuned vs tvmfuse", "tvmfuse+tuned", "tvmfuse", None),
]


def summary(rows, systems):
    """Markdown: one line per workload, then the geometric means the targets are stated in."""
    ratio_cols = [(a, b) for a, b in (("tvmfuse", "tvm"), ("tvmfuse", "onnxruntime"), ("tvmfuse", "torch"),
                                      ("tvmfuse+tuned", "tvm+tuned")) if a in systems and b in systems]
    head = (["workload"] + [f"{s} ms" for s in systems] + ["launches tvm/tvmfuse"]
            + [f"{a} vs {b}" for a, b in ratio_cols] + ["tvmfuse vs best peer", "numerics"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    fmt = lambda x: f"{x:.2f}x" if x else "-"
    for r in rows:
        cells = [r.workload] + [f"{r.ms[s]:.3f}" if s in r.ms else "-" for s in systems]
        cells.append(f"{r.launches.get('tvm', '-')}/{r.launches.get('tvmfuse', '-')}")
        cells += [fmt(r.ratio(a, b)) for a, b in ratio_cols]
        peer = best_peer(r)
        cells.append(f"{fmt(r.ratio('tvmfuse', peer))} ({peer})" if peer else "-")
        cells.append("ok" if all(r.ok.values()) else "MISMATCH " + ",".join(s for s, v in r.ok.items() if not v))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for label, a, b, subset in _GEOMEANS:
        g = geomean([r.ratio(a, b) for r in rows if subset is None or r.workload in subset])
        if g:
            lines.append(f"- geometric mean, {label}: {g:.2f}x")
    g = geomean([r.ratio("tvmfuse", best_peer(r)) for r in rows if best_peer(r)])
    if g:
        lines.append(f"- geometric mean, tvmfuse vs the best peer of each workload: {g:.2f}x")
    compiles = [f"{r.workload} {r.compile_s['torch.compile']:.1f}s" for r in rows if "torch.compile" in r.compile_s]
    if compiles:
        lines.append("- torch.compile compile time (first call): " + ", ".join(compiles))
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
    for r in rows:
        if r.workload not in workloads.names():
            continue  # real models: no minimal-bytes model here
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
    return "\n".join(lines)
