"""The side-by-side benchmark's report: the markdown table, the geometric means, the roofline.

Contract: `summary(rows, systems)` is one line per workload (median ms of each system, launches,
ratios, the best peer, numerics), then the geometric means; every ratio names its peer by
tvmfuse.bench.systems.LABELS and a legend line says what each system is. `best_peer(row)` is the
fastest of bench_systems.BEST_PEERS in the row (torch.compile with freezing and vanilla TVM
included). `roofline_table` and `kernel_tables` set latencies against the machine's measured
bandwidth and matmul rate.
"""
from __future__ import annotations

import math

from ..zoo import workloads
from .systems import BACKEND, BEST_PEERS, FREEZING, VANILLA, label, legend


def geomean(values):
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def best_peer(row):
    ms = {s: row.ms[s] for s in BEST_PEERS if s in row.ms}
    return min(ms, key=ms.get) if ms else None


def _vs(a, b, subset=""):
    return f"{label(a)} vs {label(b)}" + (f", {subset}" if subset else "")


# (label, system a, system b, the Row fact that selects workloads or None for all): "a is N times
# faster than b"
_GEOMEANS = [
    (_vs("tvmfuse", "tvm", "all workloads"), "tvmfuse", "tvm", None),
    (_vs("tvmfuse", "tvm", "reduction-heavy"), "tvmfuse", "tvm", "reduction_heavy"),
    (_vs("tvmfuse", VANILLA), "tvmfuse", VANILLA, None),
    (_vs("tvmfuse", "onnxruntime"), "tvmfuse", "onnxruntime", None),
    (_vs("tvmfuse", "torch"), "tvmfuse", "torch", None),
    (_vs("tvmfuse", "torch.compile"), "tvmfuse", "torch.compile", None),
    (_vs("tvmfuse", FREEZING), "tvmfuse", FREEZING, None),
    (_vs(BACKEND, "torch.compile"), BACKEND, "torch.compile", None),
    (_vs("tvmfuse+tuned", "tvm+tuned"), "tvmfuse+tuned", "tvm+tuned", None),
    (_vs("tvmfuse+tuned", "tvmfuse"), "tvmfuse+tuned", "tvmfuse", None),
]
_RATIO_COLUMNS = (("tvmfuse", "tvm"), ("tvmfuse", VANILLA), ("tvmfuse", "onnxruntime"), ("tvmfuse", "torch"),
                  ("tvmfuse", FREEZING), ("tvmfuse+tuned", "tvm+tuned"))

def _fmt(x):
    return f"{x:.2f}x" if x else "-"


def _table(rows, systems):
    """The per-workload lines of the summary."""
    ratio_cols = [(a, b) for a, b in _RATIO_COLUMNS if a in systems and b in systems]
    counted = [s for s in (VANILLA, "tvm", "tvmfuse") if s in systems or s != VANILLA]
    head = (["workload"] + [f"{s} ms" for s in systems] + [f"launches {'/'.join(counted)}", f"ran {'/'.join(counted)}"]
            + [_vs(a, b) for a, b in ratio_cols] + ["tvmfuse vs best peer", "numerics"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.workload] + [f"{r.ms[s]:.3f}" if s in r.ms else "-" for s in systems]
        cells += ["/".join(str(d.get(s, "-")) for s in counted) for d in (r.launches, r.ran)]
        cells += [_fmt(r.ratio(a, b)) for a, b in ratio_cols]
        peer = best_peer(r)
        cells.append(f"{_fmt(r.ratio('tvmfuse', peer))} ({label(peer)})" if peer else "-")
        cells.append("ok" if all(r.ok.values()) else "MISMATCH " + ",".join(s for s, v in r.ok.items() if not v))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _clock_table(rows, systems):
    """GPU rows: each system's median on the device clock (CUDA events around each flushed call) and
    its launch overhead (the host clock's median minus the device clock's)."""
    if not any(getattr(r, "device_ms", None) for r in rows):
        return []
    shown = [s for s in systems if any(s in r.device_ms for r in rows)]
    lines = ["", "Device clock (CUDA events around each call, after an L2 flush): median ms, and in brackets the "
             "launch overhead the host clock adds (host median - device median)", "",
             "| workload | " + " | ".join(f"{s} device ms" for s in shown) + " |", "|" + "---|" * (len(shown) + 1)]
    for r in rows:
        cells = [f"{r.device_ms[s]:.4f} (+{r.ms[s] - r.device_ms[s]:.4f})" if s in r.device_ms and s in r.ms
                 else "-" for s in shown]
        lines.append(f"| {r.workload} | " + " | ".join(cells) + " |")
    whys = sorted({f"{s}: {why}" for r in rows for s, why in getattr(r, "no_device_clock", {}).items()})
    return lines + ([""] + [f"- no device clock, {w}" for w in whys] if whys else [])


def summary(rows, systems):
    """Markdown: the legend, one line per workload, then the geometric means the targets are stated in."""
    lines = [legend(systems), ""] + _table(rows, systems) + [""]
    for text, a, b, subset in _GEOMEANS:
        g = geomean([r.ratio(a, b) for r in rows if subset is None or getattr(r, subset)])
        if g:
            lines.append(f"- geometric mean, {text}: {g:.2f}x")
    g = geomean([r.ratio("tvmfuse", best_peer(r)) for r in rows if best_peer(r)])
    if g:
        lines.append(f"- geometric mean, tvmfuse vs the best peer of each workload "
                     f"(the fastest of {', '.join(label(s) for s in BEST_PEERS if s in systems)}): {g:.2f}x")
    memory = [r for r in rows if r.memory_bound and best_peer(r)]
    g = geomean([r.ratio("tvmfuse", best_peer(r)) for r in memory])
    if g and len(memory) < len(rows):
        lines.append(f"- geometric mean, tvmfuse vs the best peer, memory-bound zoo workloads: {g:.2f}x")
    skips = {(s, why): [r.workload for r in rows if r.skipped.get(s) == why]
             for r in rows for s, why in r.skipped.items()}
    for (s, why), names in skips.items():
        lines.append(f"- {s} skipped ({why}): " + ("all workloads" if len(names) == len(rows) else ", ".join(names)))
    for r in rows:
        for s, why in r.capped.items():
            lines.append(f"- {s} on {r.workload}: {why}")
    for system in ("torch.compile", FREEZING, BACKEND):
        compiles = [f"{r.workload} {r.compile_s[system]:.1f}s" for r in rows if system in r.compile_s]
        if compiles:
            lines.append(f"- {system} compile time (first call): " + ", ".join(compiles))
    lines += _clock_table(rows, systems)
    builds = [f"{r.workload} {r.import_s:.1f}s + {r.build_s['tvmfuse']:.1f}s" for r in rows
              if r.import_s and "tvmfuse" in r.build_s]
    if builds:
        lines.append("- real models, import + tvmfuse build: " + ", ".join(builds))
    return "\n".join(lines)


def roofline_table(rows, size, systems, bandwidth, peak_gflops, llc):
    """Markdown: for memory-bound workloads, each system's latency as a multiple of the bandwidth
    bound (minimal bytes / measured GB/s); for compute-heavy ones, achieved GFLOP/s."""
    from ..runtime import roofline

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
    from ..runtime.metrics import format_roofline, roofline_view

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
