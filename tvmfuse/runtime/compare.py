"""`tvmfuse.compare`: one table of variants, side by side, measured in one run."""
from __future__ import annotations

import json

import numpy as np

from ..build import build
from .metrics import measure


class Comparison:
    def __init__(self, name, target, rows, checks, builds=None):
        self.name, self.target, self.rows, self.checks = name, str(target), rows, checks
        self.builds = builds or {}  # variant -> the Compiled measured (report and explain reuse it)

    def ratios(self, base):
        by = {r.variant: r for r in self.rows}
        if base not in by:
            return {}
        b = by[base]
        out = {}
        for r in self.rows:
            lat, blat = r.latency_ms.get("median"), b.latency_ms.get("median")
            out[r.variant] = {
                "launches": r.launches / b.launches if b.launches else None,
                "bytes": r.bytes_moved / b.bytes_moved if b.bytes_moved else None,
                "speedup": blat / lat if lat and blat else None,
            }
        return out

    def as_dict(self):
        return {"workload": self.name, "target": self.target,
                "rows": [r.as_dict() for r in self.rows], "numerics_ok": self.checks,
                "vs_none": self.ratios("none"), "vs_tvm": self.ratios("tvm")}

    def to_json(self):
        return json.dumps(self.as_dict(), indent=2)

    def _table(self):
        head = ["variant", "launches", "dyn", "MB moved", "reads/writes", "peak KB (planned/unplanned)",
                "median ms", "p10-p90 ms", "speedup vs none", "speedup vs tvm", "ok"]
        rn, rt = self.ratios("none"), self.ratios("tvm")
        fmt = lambda v: "-" if v is None else f"{v:.2f}x"
        rows = []
        for r in self.rows:
            lat = r.latency_ms
            rows.append([
                r.variant, str(r.launches), "-" if r.dynamic_launches is None else str(r.dynamic_launches),
                f"{r.bytes_moved / 1e6:.2f}", f"{r.global_reads}/{r.global_writes}",
                f"{r.peak_memory_bytes / 1024:.0f}/{r.peak_memory_unplanned_bytes / 1024:.0f}",
                f"{lat['median']:.3f}" if lat else "-",
                f"{lat['p10']:.3f}-{lat['p90']:.3f}" if lat else "-",
                fmt(rn.get(r.variant, {}).get("speedup")), fmt(rt.get(r.variant, {}).get("speedup")),
                {True: "yes", False: "NO", None: "-"}[self.checks.get(r.variant)],
            ])
        return head, rows

    def to_markdown(self):
        head, rows = self._table()
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return f"**{self.name}** ({self.target})\n\n" + "\n".join(lines)

    def __str__(self):
        head, rows = self._table()
        w = [max(len(x) for x in col) for col in zip(head, *rows)]
        line = lambda cells: "  ".join(c.ljust(n) for c, n in zip(cells, w))
        return "\n".join([f"{self.name} on {self.target}", line(head), line(["-" * n for n in w])]
                         + [line(r) for r in rows])


def _close(out, ref, rtol, atol):
    out = out if isinstance(out, tuple) else (out,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    return len(out) == len(ref) and all(np.allclose(o, r, rtol=rtol, atol=atol) for o, r in zip(out, ref))


def compare(mod, inputs, target="llvm", variants=("none", "tvm", "tvmfuse"), reference=None,
            name="model", rtol=1e-4, atol=1e-5, run=True, repeat=15, tuning_logs=None, **knobs) -> Comparison:
    """Build `mod` under each variant (once each; `.builds` keeps them), check numerics against
    `reference` (outputs or the first variant's outputs), and measure launches, bytes, peak memory
    and latency side by side. A variant "X+tuned" is X built with the tuned schedules from
    `tuning_logs`. `knobs` go to the tvmfuse variants."""
    from ..target import resolve

    target = resolve(target)
    rows, checks, first, builds = [], {}, reference, {}
    for v in variants:
        base, _, tuned = v.partition("+")
        c = build(mod, target, base, tuning_logs=(tuning_logs or "tuning_logs") if tuned else None, name=name,
                  **(knobs if base == "tvmfuse" else {}))
        builds[v] = c
        m = measure(c, inputs, run=run, repeat=repeat)
        m.variant = v
        if run:
            out = c(*inputs)
            if first is None:
                first = out
            checks[v] = bool(_close(out, first, rtol, atol))
        else:
            checks[v] = None
        rows.append(m)
    return Comparison(name, str(target), rows, checks, builds)
