"""Nightly history: dated JSON results under `<logs>/history/` and the run-to-run comparison.

Contract
- `save(folder, result)` writes `<UTC date-time>.json` atomically (temp file + fsync + rename):
  {"date", "target", "size", "models": {model: {variant: {"launches", "bytes", "latency_ms"}}},
  "tuning": {...}}.
- `previous(folder, result)` is the newest earlier result for the same target and size.
- `diff(old, new, threshold)` lists improvements and regressions per model and variant. A latency
  regression beyond `threshold` (0.15 = 15% slower), after dividing by the run's common slowdown
  (`machine_factor`: the median new/old ratio; a loaded shared box slows everything alike), or any
  launch-count increase is a failure.
- `table(folder, n)` prints the last n runs: geometric-mean latency per variant.
"""
from __future__ import annotations

import glob
import json
import math
import os
import time
from dataclasses import dataclass, field


MIN_FOR_FACTOR = 6  # fewer comparable latencies than this: compare them raw


def stamp() -> str:
    return time.strftime("%Y-%m-%dT%H%M%SZ", time.gmtime())


def save(folder: str, result: dict) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{result['date']}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def runs(folder: str) -> list[dict]:
    out = []
    for p in sorted(glob.glob(os.path.join(folder, "*.json"))):
        try:
            with open(p) as f:
                r = json.load(f)
            r["_path"] = p
            out.append(r)
        except (OSError, ValueError):
            continue  # a half-written or foreign file is not history
    return out


def previous(folder: str, result: dict) -> dict | None:
    same = [r for r in runs(folder) if r.get("target") == result["target"] and r.get("size") == result["size"]
            and r.get("date", "") < result["date"]]
    return same[-1] if same else None


@dataclass
class Diff:
    improved: list[str] = field(default_factory=list)
    regressed: list[str] = field(default_factory=list)  # failures
    unchanged: int = 0
    factor: float = 1.0  # machine_factor used for the latencies

    @property
    def failed(self) -> bool:
        return bool(self.regressed)


def machine_factor(old: dict, new: dict) -> float:
    """Median of new/old latency over every (model, variant): how much slower the machine ran this
    time (a shared box under load slows everything alike). 1.0 with fewer than MIN_FOR_FACTOR pairs."""
    ratios = sorted(now["latency_ms"] / before["latency_ms"]
                    for model, variants in new["models"].items() for v, now in variants.items()
                    for before in [old.get("models", {}).get(model, {}).get(v)]
                    if before and before.get("latency_ms") and now.get("latency_ms"))
    return ratios[len(ratios) // 2] if len(ratios) >= MIN_FOR_FACTOR else 1.0


def diff(old: dict, new: dict, threshold: float, normalize: bool = True) -> Diff:
    """Latency changes are measured against `machine_factor` when `normalize` (a regression must
    stand out from the run's common slowdown); launch counts are compared as they are."""
    d = Diff()
    d.factor = machine_factor(old, new) if normalize else 1.0
    for model, variants in new["models"].items():
        for v, now in variants.items():
            before = old.get("models", {}).get(model, {}).get(v)
            if not before:
                continue
            if now["launches"] > before["launches"]:
                d.regressed.append(f"{model} [{v}] launches {before['launches']} -> {now['launches']}")
            a, b = before.get("latency_ms"), now.get("latency_ms")
            if not a or not b:
                continue
            change = b / a / d.factor - 1
            line = f"{model} [{v}] {a:.4f} -> {b:.4f} ms ({change:+.0%}" + (
                f" after the machine factor {d.factor:.2f})" if d.factor != 1.0 else ")")
            if change > threshold:
                d.regressed.append(line)
            elif change < -threshold:
                d.improved.append(line)
            else:
                d.unchanged += 1
    return d


def geomean(values) -> float | None:
    vals = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def table(folder: str, target: str, size: str, n: int = 10) -> str:
    rs = [r for r in runs(folder) if r.get("target") == target and r.get("size") == size][-n:]
    if not rs:
        return ""
    variants = []
    for r in rs:
        for m in r["models"].values():
            variants += [v for v in m if v not in variants]
    head = "| run | models | " + " | ".join(f"{v} ms (geomean)" for v in variants) + " |"
    lines = [head, "|---|---|" + "---|" * len(variants)]
    for r in rs:
        cells = []
        for v in variants:
            g = geomean(m.get(v, {}).get("latency_ms") for m in r["models"].values())
            cells.append(f"{g:.4f}" if g else "-")
        lines.append(f"| {r['date']} | {len(r['models'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
