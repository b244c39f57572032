"""One self-contained HTML report of what fusion did and bought.

`write(path, entries, ...)` renders, for every workload: the comparison table, bar charts of
latency, launches and bytes moved per variant, the op graph with the fused groups and the kernel
graph after fusion (report/viz.py), the per-kernel profile of each variant (runtime.kernel_profile), and the
refused merges with their rules (the same FuseGroupsTE run `tvmfuse.explain` prints). With tuning
logs, a tuning-curve plot (best latency vs trials, per task) from `tvmfuse.tuning.curves`.

The file works offline: CSS inline, pictures as inline SVG, no scripts, no links. The SVGs lose
their XML prolog, metadata and namespace declarations (HTML needs none of them), so the document
holds no "http://" or "https://" at all; ids are prefixed per picture, so they stay unique.
"""
from __future__ import annotations

import datetime as _dt
import html
import importlib
import io
import re
from dataclasses import dataclass, field

from . import viz
from ..errors import TvmfuseError

VARIANT_COLORS = {"none": "#9e9e9e", "tvm": "#4e79a7", "tvmfuse": "#e15759"}

CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:1400px;color:#222;padding:0 16px}
h1{font-size:24px}h2{font-size:20px;border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:40px}h3{font-size:16px;margin-top:22px}
table{border-collapse:collapse;margin:8px 0;font-size:13px}th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
.row{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}
.pic{border:1px solid #ddd;overflow:auto;max-height:900px;max-width:100%;background:#fff}
.pic svg{display:block;height:auto}
.bar{background:#e15759;height:10px;display:inline-block;vertical-align:middle;margin-right:6px}
.legend span{display:inline-block;padding:1px 8px;margin:2px;border:1px solid #333;border-radius:4px;font-size:12px}
.note{color:#666}pre{background:#f7f7f7;padding:8px;overflow:auto;font-size:12px}
"""


@dataclass
class Entry:
    """One workload in the report: its module, its measured Comparison and what to profile."""
    name: str
    mod: object  # tvm.IRModule (high-level Relax)
    comparison: object  # tvmfuse.Comparison
    inputs: list | None = None  # numpy inputs; None: no per-kernel profile
    profiles: dict = field(default_factory=dict)  # variant -> kernel_profile rows (filled by `profile`)
    knobs: dict = field(default_factory=dict)  # fusion knobs of the tvmfuse variant
    tuning_logs: str | None = None  # where "X+tuned" variants find their schedules


def _built(entry: Entry, variant: str, target):
    """The variant's Compiled: the one its comparison measured, else a new build."""
    from ..build import build

    have = getattr(entry.comparison, "builds", {}).get(variant) if entry.comparison is not None else None
    if have is not None:
        return have
    base, _, tuned = variant.partition("+")  # "tvmfuse+tuned": tvmfuse with the tuned schedules
    kw = dict(entry.knobs) if base == "tvmfuse" else {}
    if tuned:
        kw["tuning_logs"] = entry.tuning_logs or "tuning_logs"
    return build(entry.mod, target, base, name=entry.name, **kw)


def profile(entry: Entry, target, variants=None, runs: int = 5) -> Entry:
    """Fill `entry.profiles` with each variant's per-kernel profile (of the build its comparison
    measured: no variant is built twice)."""
    from ..runtime.metrics import kernel_profile

    if entry.inputs is None:
        return entry
    for v in variants or [r.variant for r in entry.comparison.rows]:
        try:
            entry.profiles[v] = kernel_profile(_built(entry, v, target), entry.inputs, runs=runs)
        except (TvmfuseError, ValueError, TypeError) as err:  # no device here, unknown variant, ...
            entry.profiles[v] = str(err)
    return entry


def tuning_curves(logs, target):
    """{task: [(trial, best ms)]} from tvmfuse.tuning.curves, or a string saying why there is none."""
    if not logs:
        return "No tuning logs were used (default schedules). Pass --logs DIR to plot tuning curves."
    try:
        curves = getattr(importlib.import_module("tvmfuse.tuning"), "curves")
    except (ImportError, AttributeError):
        return f"Tuning logs given ({logs}), but tvmfuse.tuning.curves is not available in this install."
    try:
        return curves(logs, target) or f"No tuning records found in {logs}."
    except Exception as err:  # noqa: BLE001 - a broken log must not lose the rest of the report
        return f"Could not read tuning logs in {logs}: {err}"


# ---------------------------------------------------------------------------------------- svg
def inline_svg(svg: str, prefix: str) -> str:
    """matplotlib SVG -> an <svg> element for HTML: no prolog, DOCTYPE, metadata or xmlns
    declarations (xlink:href becomes SVG 2's href); every id (and reference to it) prefixed with
    `prefix-`. The result is still well-formed XML."""
    svg = re.sub(r"<\?xml[^>]*\?>\s*", "", svg)
    svg = re.sub(r"<!DOCTYPE[^>]*>\s*", "", svg)
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.S)
    svg = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", svg)
    svg = svg.replace("xlink:href=", "href=")  # SVG 2 href: no xlink namespace needed
    svg = re.sub(r'\bid="', f'id="{prefix}-', svg)
    svg = re.sub(r"url\(#", f"url(#{prefix}-", svg)
    svg = re.sub(r'href="#', f'href="#{prefix}-', svg)
    return svg.strip()


def _fig_svg(fig, plt) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": "tvmfuse"})
    plt.close(fig)
    return buf.getvalue()


def variant_charts(cmp) -> str:
    """SVG: latency (median, p10-p90 whiskers), launches and MB moved, one bar per variant."""
    plt = viz._setup_matplotlib()
    rows = cmp.rows
    names = [r.variant for r in rows]
    colors = [VARIANT_COLORS.get(n, "#59a14f") for n in names]
    fig, axes = plt.subplots(1, 3, figsize=(9.5, 2.6))
    lat = [r.latency_ms.get("median", 0.0) for r in rows]
    err = [[max(0.0, m - r.latency_ms.get("p10", m)) for m, r in zip(lat, rows)],
           [max(0.0, r.latency_ms.get("p90", m) - m) for m, r in zip(lat, rows)]]
    panels = [("latency", "median ms (p10-p90)", lat, err), ("launches", "kernel launches",
              [r.launches for r in rows], None), ("bytes", "MB moved", [r.bytes_moved / 1e6 for r in rows], None)]
    for ax, (key, label, vals, yerr) in zip(axes, panels):
        ax.set_title(label, fontsize=9)
        ax.tick_params(labelsize=8)
        ax.spines[["top", "right"]].set_visible(False)
        if not any(vals):  # latency of a build that could not run here
            ax.set_yticks([])
            ax.text(0.5, 0.5, "not run here", transform=ax.transAxes, ha="center", fontsize=8, color="#666")
            continue
        bars = ax.bar(names, vals, color=colors, yerr=yerr, capsize=3)
        for n, b in zip(names, bars):
            b.set_gid(f"bar-{key}-{n}")
        ax.bar_label(bars, fmt="%.3g", fontsize=7)
    fig.tight_layout()
    return _fig_svg(fig, plt)


def speedup_chart(entries) -> str:
    """SVG: tvmfuse speedup over tvm and over none, per workload."""
    plt = viz._setup_matplotlib()
    names = [e.name for e in entries]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.8 * len(names) + 2), 2.8))
    width = 0.38
    for k, base in enumerate(("none", "tvm")):
        vals = [(e.comparison.ratios(base).get("tvmfuse") or {}).get("speedup") or 0.0 for e in entries]
        xs = [i + (k - 0.5) * width for i in range(len(names))]
        bars = ax.bar(xs, vals, width, color=VARIANT_COLORS[base], label=f"tvmfuse vs {base}")
        for n, b in zip(names, bars):
            b.set_gid(f"bar-speedup-{base}-{n}")
    ax.axhline(1.0, color="#333", lw=0.8, ls="--")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("speedup (x)", fontsize=8)
    ax.legend(fontsize=8, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return _fig_svg(fig, plt)


def curves_chart(curves: dict) -> str:
    """SVG: best latency so far vs trial index, one line per tuning task."""
    plt = viz._setup_matplotlib()
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    for task, pts in sorted(curves.items()):
        pts = sorted(pts)
        line, = ax.step([p[0] for p in pts], [p[1] for p in pts], where="post", label=task, lw=1.2)
        line.set_gid(f"curve-{task}")
    ax.set_xlabel("trials", fontsize=8)
    ax.set_ylabel("best latency (ms)", fontsize=8)
    ax.set_yscale("log")
    ax.legend(fontsize=7, frameon=False, loc="upper right", ncol=max(1, len(curves) // 12))
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return _fig_svg(fig, plt)


# ---------------------------------------------------------------------------------------- html
def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _table(head, rows, num=()) -> str:
    """rows are lists of already-escaped HTML cells; columns in `num` are right-aligned."""
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i in num else f"<td>{c}</td>"
                                   for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{trs}</table>"


def _pic(svg, prefix) -> str:
    return f'<div class="pic">{inline_svg(svg, prefix)}</div>'


def comparison_html(cmp) -> str:
    head, rows = cmp._table()
    return _table(head, [[_e(c) for c in r] for r in rows], num=range(1, len(head) - 1))


def _kernel_groups(entry, fg, variant, row):
    """(group kind, ops inside) of one profiled kernel, from the vars it writes."""
    G = fg.graph
    variant = variant.partition("+")[0]
    if variant == "tvm":  # FuseOps renames main's vars: only the kernel name tells its ops
        return "TVM FuseOps" if row["name"].startswith("fused_") else "single op", "(ops in the name)"
    nodes = list(dict.fromkeys(fg.var_node[o] for o in row["outputs"] if o in fg.var_node))
    if not nodes:
        return "-", "-"
    gids = list(dict.fromkeys(G.nodes[n]["group"] for n in nodes if G.nodes[n]["group"]))
    if variant == "tvmfuse" and gids:
        groups = [g for g in fg.groups if g.id in gids]
        kinds = list(dict.fromkeys(g.kind for g in groups))
        members = [m for g in groups for m in g.members]
        if len(groups) > 1 and len(kinds) == 1:  # one kernel shared by equal groups (a model's layers)
            kind = f"{groups[0].id}: {kinds[0]} (and {len(groups) - 1} more like it)"
        else:
            kind = "; ".join(f"{g.id}: {g.kind}" for g in groups)
    else:  # one op per kernel; a PrimFunc called several times lists each call's op
        members = nodes
        kind = "single " + "/".join(sorted({G.nodes[n]["cls"] for n in nodes}))
    return kind, ", ".join(f"{m}:{G.nodes[m]['op']}" for m in members)


def profile_html(entry, fg) -> str:
    if entry.inputs is None or not entry.profiles:
        return '<p class="note">No per-kernel profile (the workload was not run here).</p>'
    out = []
    for variant, rows in entry.profiles.items():
        if isinstance(rows, str):
            out.append(f"<h4>{_e(variant)}</h4><p class='note'>not profiled: {_e(rows)}</p>")
            continue
        body = []
        for r in rows:
            kind, ops = _kernel_groups(entry, fg, variant, r)
            bar = f'<span class="bar" style="width:{100 * r["share"]:.0f}px"></span>'
            body.append([_e(r["name"]), _e(kind), _e(ops), str(r["calls"]), f"{r['bytes'] / 1e3:.1f}",
                         f"{r['ms']:.4f}", f"{bar}{100 * r['share']:.1f}%"])
        total = sum(r["ms"] for r in rows)
        out.append(f"<h4>{_e(variant)}: {len(rows)} kernels, {total:.4f} ms in kernels</h4>" + _table(
            ["kernel", "group kind", "ops inside", "calls", "KB moved", "ms", "share of total"], body,
            num=(3, 4, 5)))
    return "\n".join(out)


def refused_html(fg) -> str:
    if not fg.refused:
        return '<p class="note">No merge was refused.</p>'
    rows = [[str(r["block"]), _e(r["kind"]), _e(", ".join(r["a"])), _e(", ".join(r["b"])), _e(r["rule"]),
             _e(r["reason"])] for r in fg.refused]
    return _table(["block", "kind", "group A", "group B", "rule", "reason"], rows)


def legend_html() -> str:
    spans = "".join(f'<span style="background:{c}">{_e(k)}</span>' for k, c in viz.CLASS_COLORS.items())
    return f'<p class="legend">op classes: {spans}</p>'


def _planned(entry):
    """What the graphs and explain describe: the tvmfuse build measured, else the module (planned once)."""
    built = getattr(entry.comparison, "builds", {}).get("tvmfuse") if entry.comparison is not None else None
    return (built, {}) if built is not None else (entry.mod, entry.knobs)


def entry_html(k, entry) -> str:
    subject, knobs = _planned(entry)
    fg = viz.fusion_graph(subject, **knobs)
    plan = fg.plan
    cmp = entry.comparison
    fused = sum(1 for g in fg.groups if g.fused)
    parts = [f'<h2 id="w{k}">{_e(entry.name)}</h2>',
             f"<p>{len(fg.ops())} ops; tvmfuse plans {plan.kernels()} kernels ({fused} fused groups); "
             f"{len(fg.refused)} refused merges. Numerics: "
             + ", ".join(f"{_e(v)} {'ok' if ok else ('-' if ok is None else 'DIFFERS')}"
                         for v, ok in cmp.checks.items()) + "</p>",
             "<h3>Comparison</h3>", comparison_html(cmp), _pic(variant_charts(cmp), f"w{k}-bars"),
             "<h3>Graph: before and after fusion</h3>",
             '<div class="row">' + _pic(viz.draw(fg, title="ops with fused groups"), f"w{k}-graph")
             + _pic(viz.draw_kernels(fg, title="kernels after fusion"), f"w{k}-kernels") + "</div>",
             "<h3>Per-kernel profile</h3>", profile_html(entry, fg),
             "<h3>Refused fusions</h3>", refused_html(fg),
             f"<details><summary>tvmfuse.explain</summary><pre>{_e(plan.explain())}</pre></details>"]
    return "\n".join(parts)


def render(entries, target="llvm", curves=None, title="tvmfuse fusion report") -> str:
    """The whole HTML document as a string. `curves`: a dict from tuning_curves, or a note."""
    import tvm

    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    toc = " · ".join(f'<a href="#w{k}">{_e(e.name)}</a>' for k, e in enumerate(entries))
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>"
             f"<style>{CSS}</style></head><body>", f"<h1>{_e(title)}</h1>",
             f"<p class='note'>target {_e(target)} · TVM {_e(tvm.__version__)} · {len(entries)} workloads · "
             f"made {when}. Latency: medians of time_evaluator repeats; per-kernel times: host-side, "
             "through vm.set_instrument (a few µs of hook overhead each).</p>", legend_html(), f"<p>{toc}</p>"]
    if len(entries) > 1:
        parts += ["<h2>Summary</h2>", _pic(speedup_chart(entries), "summary")]
    parts += [entry_html(k, e) for k, e in enumerate(entries)]
    parts.append("<h2>Tuning curves</h2>")
    if isinstance(curves, dict) and curves:
        parts.append(_pic(curves_chart(curves), "curves"))
    else:
        parts.append(f"<p class='note'>{_e(curves or tuning_curves(None, target))}</p>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write(path, entries, target="llvm", curves=None, title="tvmfuse fusion report") -> str:
    """Render the report and write it to `path`; returns the path."""
    doc = render(entries, target, curves, title)
    with open(path, "w", encoding="utf-8") as f:
        f.write(doc)
    return path


def _load(name, size):
    """A zoo workload, a real model or a model file (tvmfuse.load)."""
    from ..loader import load

    return load(name, size)


def run(models, size="small", target="llvm", out="report.html", logs=None,
        variants=("none", "tvm", "tvmfuse"), repeat=5, progress=None) -> str:
    """Measure workloads (`models`: zoo names, real models or model files) and write the report:
    what `tvmfuse report` runs. Variants "X+tuned" take their schedules from `logs`."""
    import tvm

    from ..runtime.compare import compare
    from ..target import resolve

    tgt = resolve(target)
    can_run = tgt.kind.name != "cuda" or tvm.cuda(0).exist
    entries = []
    tuned = {"tuning_logs": logs} if any("+" in v for v in variants) else {}
    for name in models:
        w = _load(name, size)
        if progress:
            progress(name)
        ins = w.inputs()
        cmp = compare(w.mod, ins, tgt, variants, reference=w.reference(*ins) if can_run else None,
                      name=f"{name} [{size}]", rtol=w.rtol, atol=w.atol, run=can_run, repeat=repeat, **tuned)
        cmp.target = target
        entries.append(profile(Entry(cmp.name, w.mod, cmp, ins if can_run else None, tuning_logs=logs), tgt))
    return write(out, entries, target, tuning_curves(logs, tgt))


def from_comparisons(path, names, size, comparisons, target="llvm", logs=None, run=True) -> str:
    """The report for zoo workloads already measured (scripts/tune.py --report): adds the graphs and
    the per-kernel profiles of the builds the Comparisons measured."""
    from ..target import resolve

    tgt = resolve(target)  # once, for every entry and the tuning curves
    entries = []
    for name, cmp in zip(names, comparisons):
        w = _load(name, size)
        entry = Entry(cmp.name, w.mod, cmp, w.inputs() if run else None, tuning_logs=logs)
        entries.append(profile(entry, tgt))
    return write(path, entries, str(cmp.target) if comparisons else str(target), tuning_curves(logs, tgt))
