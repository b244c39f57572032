"""The suite's summary: pass rate per stage, geometric means, machine record, JSON and markdown.

`summarize(rows)` -> {"stages": {stage: {"passed", "ran", "rate"}}, "pass_all": architectures that
passed import[torch.export], build[tvmfuse] and numerics[tvmfuse], "backend": compiled without
eager fallback, "geomean": tvmfuse's latency over each peer's (below 1: tvmfuse faster), over
fusion="tvm"'s and over the best peer's per model, "slower_than_tvm": the models where tvmfuse
was slower than fusion="tvm" beyond the run's noise (the lower quartile of their per-round ratio
above 1: slower in more than three rounds of four)}. A row whose process died has the stage it died
in (or "process") failed with the error class and first line (scripts/suite.py).
"""
from __future__ import annotations

import json
import os

from ..bench.report import geomean
from ..runtime.machine import describe

PEERS = ("onnxruntime", "torch", "torch.compile", "torch.compile+freezing")
CORE = ("import[torch.export]", "build[tvmfuse]", "numerics[tvmfuse]")


def _stage_names(rows):
    seen = []
    for r in rows:
        for s in r.get("stages", {}):
            if s not in seen:
                seen.append(s)
    return seen


def summarize(rows) -> dict:
    stages = {}
    for s in _stage_names(rows):
        ran = [r for r in rows if s in r.get("stages", {})]
        passed = sum(r["stages"][s]["ok"] for r in ran)
        stages[s] = {"passed": passed, "ran": len(ran), "rate": round(passed / len(ran), 3) if ran else None}
    core = sum(all(r.get("stages", {}).get(s, {}).get("ok") for s in CORE) for r in rows)
    ratios = {other: _geomean([_over(r, other) for r in rows]) for other in ("tvm",) + PEERS + ("best peer",)}
    families = {}
    for r in rows:
        families.setdefault(r.get("family", ""), []).append(_over(r, "best peer"))
    backend = [r["backend"] for r in rows if "backend" in r]
    slower = [r["model"] for r in rows if r.get("tvmfuse_over_tvm", {}).get("q1", 0) > 1]
    return {"slower_than_tvm": slower, "models": len(rows), "stages": stages,
            "pass_all": {"passed": core, "of": len(rows), "rate": round(core / len(rows), 3) if rows else None},
            "backend": {"compiled": sum(b["compiled"] for b in backend), "of": len(backend),
                        "graph_breaks": sum(b["graph_breaks"] for b in backend)},
            "tvmfuse_over": ratios,
            "best_peer_by_family": {f: _geomean(v) for f, v in families.items() if any(x for x in v)}}


def _over(row, other):
    """tvmfuse's latency over `other`'s in one row (the best peer: the fastest of PEERS), or None."""
    ms = row.get("latency_ms", {})
    peer = min((ms[p] for p in PEERS if p in ms), default=None) if other == "best peer" else ms.get(other)
    return ms["tvmfuse"] / peer if ms.get("tvmfuse") and peer else None


def _geomean(values) -> dict:
    vals = [v for v in values if v]
    return {"geomean": round(geomean(vals), 4) if vals else None, "models": len(vals)}


def machine() -> dict:
    """The run's machine record (tvmfuse/runtime/machine.py), with transformers' version added."""
    import transformers

    from ..runtime.machine import record

    rec = record("llvm")
    rec["versions"]["transformers"] = transformers.__version__
    return rec


def _cell(row, stage):
    st = row.get("stages", {}).get(stage)
    return "" if st is None else ("ok" if st["ok"] else "FAIL")


def markdown(result) -> str:
    rows, summ, mach = result["rows"], result["summary"], result["machine"]
    stages = list(summ["stages"])
    out = [f"# tvmfuse model suite ({result['size']}, batch {result['batch']})", "",
           describe(mach), "",
           f"Command: `{result['command']}`", ""]
    for part in result.get("parts", []):
        out.append(f"- `{part['command']}` (commit {part['commit']}): {', '.join(part['models'])}")
    if result.get("parts"):
        out.append("")
    out += ["## Pass rates", "", "| stage | passed | ran | rate |", "|---|---|---|---|"]
    out += [f"| {s} | {v['passed']} | {v['ran']} | {v['rate']} |" for s, v in summ["stages"].items()]
    pa, be = summ["pass_all"], summ["backend"]
    out += ["", f"Import + build + numerics (torch.export, tvmfuse): {pa['passed']}/{pa['of']}. "
            f"torch.compile(backend=\"tvmfuse\") without eager fallback: {be['compiled']}/{be['of']} "
            f"({be['graph_breaks']} graph breaks in all).", ""]
    if any(v["models"] for v in summ["tvmfuse_over"].values()):
        out += ["## tvmfuse latency over each (geometric mean; below 1: tvmfuse faster)", "",
                "| vs | geomean | models |", "|---|---|---|"]
        out += [f"| {k} | {v['geomean']} | {v['models']} |" for k, v in summ["tvmfuse_over"].items()]
        if any("tvmfuse_over_tvm" in r for r in rows):
            slower = summ.get("slower_than_tvm", [])
            out += ["", "Slower than fusion=\"tvm\" beyond noise (per-round ratio's lower quartile above 1): "
                    + (", ".join(slower) if slower else "none") + "."]
        fams = summ.get("best_peer_by_family", {})
        if fams:
            out += ["", "### tvmfuse over the best peer, by family", "", "| family | geomean | models |", "|---|---|---|"]
            out += [f"| {f} | {v['geomean']} | {v['models']} |" for f, v in fams.items()]
        out.append("")
    lat = [s for s in ("tvmfuse", "tvm") + PEERS if any(s in r.get("latency_ms", {}) for r in rows)]
    ratio = any("tvmfuse_over_tvm" in r for r in rows)
    head = (["model", "family"] + stages + ["launches tvm/tvmfuse"] + [f"{s} ms" for s in lat]
            + (["tvmfuse/tvm per round: median [q1, q3]"] if ratio else []) + ["first error"])
    out += ["## Rows", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        errs = [f"{s}: {v.get('error', 'failed')}" for s, v in r.get("stages", {}).items() if not v["ok"]]
        ln, ms = r.get("launches", {}), r.get("latency_ms", {})
        cells = [r["model"], r.get("family", "")] + [_cell(r, s) for s in stages]
        cells += [f"{ln.get('tvm', '')}/{ln.get('tvmfuse', '')}"] + [str(ms.get(s, "")) for s in lat]
        if ratio:
            q = r.get("tvmfuse_over_tvm")
            cells.append(f"{q['median']:.3f} [{q['q1']:.3f}, {q['q3']:.3f}]" if q else "")
        cells.append(errs[0].replace("|", "/")[:200] if errs else "")
        out.append("| " + " | ".join(cells) + " |")
    notes = [f"- {r['model']}: {r['note']}" for r in rows if r.get("note")]
    if notes:
        out += ["", "## Sizes that differ from the default config", ""] + notes
    return "\n".join(out) + "\n"


def merge(results, command: str) -> dict:
    """One result from several runs of the same size and batch (an interrupted run and its rest): a
    later run's row replaces an earlier one's for the same model; `parts` keeps each run's command,
    commit and models. The runs must share size, batch and machine (CPU and thread count)."""
    first = results[0]
    for r in results[1:]:
        for key in ("size", "batch"):
            if r[key] != first[key]:
                raise ValueError(f"cannot merge suite results with different {key}: {first[key]!r} and {r[key]!r} "
                                 f"(commands {first['command']!r} and {r['command']!r})")
        a, b = first["machine"].get("cpu"), r["machine"].get("cpu")
        if a != b:
            raise ValueError(f"cannot merge suite results from different machines: {a!r} and {b!r}")
    by_model = {}
    for r in results:
        for row in r["rows"]:
            by_model[row["model"]] = row
    from .archs import names
    order = {n: i for i, n in enumerate(names())}
    rows = sorted(by_model.values(), key=lambda row: order.get(row["model"], len(order)))
    parts = [{"command": r["command"], "commit": (r["machine"].get("commit") or {}).get("hash"),
              "models": [row["model"] for row in r["rows"] if by_model[row["model"]] is row]} for r in results]
    stages = []
    for r in results:
        stages += [s for s in r["stages"] if s not in stages]
    return {"size": first["size"], "batch": first["batch"], "stages": stages,
            "timeout_s": max(r["timeout_s"] for r in results), "command": command,
            "machine": results[-1]["machine"], "parts": parts, "rows": rows, "summary": summarize(rows)}


def write(result, json_path, md_path):
    for p in (json_path, md_path):
        if os.path.dirname(p):
            os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(json_path, "w") as f:
        json.dump(result, f, indent=1, default=str)
    with open(md_path, "w") as f:
        f.write(markdown(result))
