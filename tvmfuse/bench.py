"""Side-by-side benchmark of the zoo across systems, measured in one process run.

Contract: `run(names, size, systems, rounds, budget_s)` builds every (workload, system) pair,
checks each system's outputs against the workload's numpy reference, then times all systems of a
workload in interleaved rounds (system order rotated each round, so drift and noisy neighbours hit
every system alike) and returns one `Row` per workload with the median per-call latency of each.

Systems: "none" / "tvm" / "tvmfuse" (tvmfuse.build on llvm with the default schedules, untuned),
"onnxruntime" (tvmfuse.baselines, all graph optimizations, the same thread count as TVM), and
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
from .target import num_cores, resolve

TVM_SYSTEMS = ("none", "tvm", "tvmfuse")
SYSTEMS = TVM_SYSTEMS + ("onnxruntime", "numpy")
REDUCTION_HEAVY = ("softmax_chain", "softmax_decomposed", "layernorm_decomposed", "rmsnorm_residual",
                   "multi_reduce")


@dataclass
class Row:
    workload: str
    ms: dict = field(default_factory=dict)  # system -> median ms per call
    launches: dict = field(default_factory=dict)  # TVM systems -> static launches
    ok: dict = field(default_factory=dict)  # system -> outputs match the reference
    skipped: dict = field(default_factory=dict)  # system -> why it has no number

    def ratio(self, a, b):
        """How many times faster a is than b (b's ms over a's)."""
        return self.ms[b] / self.ms[a] if a in self.ms and b in self.ms else None

    def as_dict(self):
        return asdict(self)


def _close(out, ref, w):
    out = out if isinstance(out, tuple) else (out,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    return len(out) == len(ref) and all(np.allclose(o, r, rtol=w.rtol, atol=w.atol) for o, r in zip(out, ref))


def _callables(w, systems, target, threads):
    """system -> (zero-argument call, reference-comparable outputs or None, launches or None)."""
    x = w.inputs()
    out, skipped = {}, {}
    for s in systems:
        if s in TVM_SYSTEMS:
            c = build(w.mod, target, s)
            vm, args = c.vm(), c.convert_inputs(x)
            f = vm["main"]
            out[s] = (lambda f=f, args=args: f(*args), c(*x), c.launches)
        elif s == "onnxruntime":
            from . import baselines

            if baselines.onnx_model(w) is None:
                skipped[s] = "no ONNX form"
                continue
            r = baselines.OrtRunner(w, threads)
            out[s] = (lambda r=r: r(*x), r(*x), None)
        elif s == "numpy":
            out[s] = (lambda: w.reference(*x), w.reference(*x), None)
        else:
            raise ValueError(f"unknown system {s!r}; use some of {', '.join(SYSTEMS)}")
    return out, skipped


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


def measure_workload(name, size="bench", systems=SYSTEMS, rounds=7, budget_s=0.2, target="llvm"):
    w = workloads.get(name, size)
    t = resolve(target)
    calls, skipped = _callables(w, systems, t, int(t.attrs.get("num-cores", num_cores())))
    ref = w.reference(*w.inputs())
    row = Row(name, skipped=skipped)
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


def summary(rows, systems):
    """Markdown: one line per workload, then the geometric means the targets are stated in."""
    head = ["workload"] + [f"{s} ms" for s in systems] + ["launches tvm/tvmfuse", "tvmfuse vs tvm",
                                                          "tvmfuse vs onnxruntime", "numerics"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.workload] + [f"{r.ms[s]:.3f}" if s in r.ms else "-" for s in systems]
        cells.append(f"{r.launches.get('tvm', '-')}/{r.launches.get('tvmfuse', '-')}")
        for base in ("tvm", "onnxruntime"):
            x = r.ratio("tvmfuse", base)
            cells.append(f"{x:.2f}x" if x else "-")
        cells.append("ok" if all(r.ok.values()) else "MISMATCH " + ",".join(s for s, v in r.ok.items() if not v))
        lines.append("| " + " | ".join(cells) + " |")
    g_all = geomean([r.ratio("tvmfuse", "tvm") for r in rows])
    g_red = geomean([r.ratio("tvmfuse", "tvm") for r in rows if r.workload in REDUCTION_HEAVY])
    g_ort = geomean([r.ratio("tvmfuse", "onnxruntime") for r in rows])
    lines.append("")
    for label, g in (("tvmfuse vs tvm, all workloads", g_all), ("tvmfuse vs tvm, reduction-heavy", g_red),
                     ("tvmfuse vs onnxruntime", g_ort)):
        if g:
            lines.append(f"- geometric mean speedup, {label}: {g:.2f}x")
    return "\n".join(lines)
