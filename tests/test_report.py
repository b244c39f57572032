"""The HTML report (tvmfuse.report, `tvmfuse report`, `scripts/tune.py --report`), checked
structurally on two zoo workloads and one imported torch model.

"No external URLs" means here: the document contains no "http://" or "https://" at all (the inline
SVGs lose their namespace declarations, which HTML does not need), no <script>, <link>, <img>,
<iframe> or src= attribute, every href is a fragment ("#..."), and every CSS url() points at "#...".
"""
import os
import re
import shutil
import subprocess
import sys
import types
import xml.etree.ElementTree as ET

import pytest

import tvmfuse
from tvmfuse import cli
from tvmfuse.report import html as report, viz
from tvmfuse.zoo import workloads
from conftest import real_model
from tvmfuse.pipeline import fold_constants
from tvmfuse.runtime.metrics import bytes_moved, dynamic_launches, kernel_profile

from test_viz import torch_model_mod

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZOO = ["softmax_chain", "attention"]


def assert_offline(doc):
    assert not re.search(r"https?://", doc, re.I)
    assert not re.search(r"<(script|link|img|iframe|object|embed)\b", doc, re.I)
    assert not re.search(r"\bsrc\s*=", doc, re.I)
    assert all(h.startswith("#") for h in re.findall(r'href="([^"]*)"', doc))
    assert all(u.startswith("#") for u in re.findall(r"url\(\s*([^)]*)\)", doc))


def inline_svgs(doc):
    """Every inline <svg> element, parsed as XML (so each one is well formed)."""
    return [ET.fromstring(s) for s in re.findall(r"<svg\b.*?</svg>", doc, re.S)]


def by_id(doc):
    return {e.get("id"): e for svg in inline_svgs(doc) for e in svg.iter() if e.get("id")}


@pytest.fixture(scope="module")
def rendered():
    entries = []
    for name in ZOO:
        w = workloads.get(name, "small")
        cmp = tvmfuse.compare(w.mod, w.inputs(), "llvm", reference=w.reference(*w.inputs()), name=name, repeat=3)
        entries.append(report.profile(report.Entry(name, w.mod, cmp, w.inputs()), "llvm"))
    mod, ins, ref = torch_model_mod()
    cmp = tvmfuse.compare(mod, ins, "llvm", reference=ref, name="torch_block", repeat=3)
    entries.append(report.profile(report.Entry("torch_block", mod, cmp, ins), "llvm"))
    return entries, report.render(entries, "llvm", report.tuning_curves(None, "llvm"))


def test_report_is_self_contained(rendered):
    _, doc = rendered
    assert doc.startswith("<!DOCTYPE html>") and doc.rstrip().endswith("</html>")
    assert_offline(doc)
    ids = re.findall(r'\bid="([^"]+)"', doc)
    assert len(ids) == len(set(ids)), "ids must stay unique across the inline pictures"
    assert len(doc) < 3_000_000


def test_report_sections(rendered):
    entries, doc = rendered
    assert "No tuning logs were used" in doc
    ids = by_id(doc)
    for k, e in enumerate(entries):
        assert f'<h2 id="w{k}">{e.name}</h2>' in doc
        for r in e.comparison.rows:  # the table and one bar per variant in each chart
            assert f"<td>{r.variant}</td>" in doc
            for chart in ("latency", "launches", "bytes"):
                assert f"w{k}-bars-bar-{chart}-{r.variant}" in ids
        for base in ("none", "tvm"):
            assert f"summary-bar-speedup-{base}-{e.name}" in ids


def test_report_graphs_match_the_plan(rendered):
    entries, doc = rendered
    ids = by_id(doc)
    for k, e in enumerate(entries):
        fg = viz.fusion_graph(e.mod)
        ops = tvmfuse.classify(fold_constants(e.mod))  # the graph the build plans on
        got = sorted(i for i in ids if i.startswith(f"w{k}-graph-op-"))
        assert got == sorted(f"w{k}-graph-op-{o.var}" for o in ops)  # every op once
        for o in ops:  # colours match the classes
            style = next(p.get("style") for p in ids[f"w{k}-graph-op-{o.var}"].iter("path"))
            assert viz.CLASS_COLORS[o.cls] in style
        for g in fg.groups:  # every group drawn, and one node per kernel in the after-picture
            assert f"w{k}-graph-group-{g.id}" in ids
            assert f"w{k}-kernels-op-{g.id}" in ids
        for r in fg.refused:  # the refused-fusion reasons
            assert report._e(r["reason"]) in doc


def test_report_profiles(rendered):
    entries, doc = rendered
    for e in entries:
        rows = {r.variant: r for r in e.comparison.rows}
        for variant, prof in e.profiles.items():
            assert sum(p["calls"] for p in prof) == rows[variant].dynamic_launches
            assert abs(sum(p["share"] for p in prof) - 1.0) < 1e-6
            for p in prof:
                assert f"<td>{p['name']}</td>" in doc
        fg = viz.fusion_graph(e.mod)
        kinds = [report._kernel_groups(e, fg, "tvmfuse", p) for p in e.profiles["tvmfuse"]]
        inside = [op.split(":")[0] for _, ops in kinds for op in ops.split(", ")]
        assert sorted(inside) == sorted(fg.ops())  # each op in exactly one tvmfuse kernel
        assert all(kind.split(":")[0] in {g.id for g in fg.groups} for kind, _ in kinds)


def test_report_of_builds_not_run():
    """What a CUDA report looks like on a machine without a GPU: static figures, no latency or profile."""
    w = workloads.get("softmax_chain", "small")
    cmp = tvmfuse.compare(w.mod, w.inputs(), "llvm", run=False, name="softmax_chain")
    doc = report.render([report.profile(report.Entry("softmax_chain", w.mod, cmp, None), "llvm")])
    assert_offline(doc)
    assert "not run here" in doc and "No per-kernel profile" in doc
    ids = by_id(doc)
    assert "w0-bars-bar-launches-tvmfuse" in ids and "w0-bars-bar-latency-tvmfuse" not in ids


def test_kernel_profile_adds_up(build_cached):
    w = workloads.get("rmsnorm_residual", "small")
    for fusion in ("none", "tvm", "tvmfuse"):
        c = build_cached("rmsnorm_residual", fusion)
        prof = kernel_profile(c, w.inputs(), runs=2)
        n, per = dynamic_launches(c, c.convert_inputs(w.inputs()))
        assert sum(p["calls"] for p in prof) == n and [p["name"] for p in prof] == list(per)
        assert sum(p["bytes"] for p in prof) == bytes_moved(c.mod)[0]
        assert all(p["ms"] > 0 for p in prof)


@pytest.mark.parametrize("name", workloads.names())
def test_every_kernel_maps_to_its_ops(name, build_cached):
    """The profile's 'group kind' and 'ops inside' are found for every kernel of none and tvmfuse."""
    w = workloads.get(name, "small")
    fg = viz.fusion_graph(w.mod)
    entry = report.Entry(name, w.mod, None, w.inputs())
    for fusion in ("none", "tvmfuse"):
        for p in kernel_profile(build_cached(name, fusion), w.inputs(), runs=1):
            kind, ops = report._kernel_groups(entry, fg, fusion, p)
            assert kind != "-" and ops != "-", (fusion, p)
            if fusion == "tvmfuse":
                assert all(k.split(":")[0] in {g.id for g in fg.groups} for k in kind.split("; "))


def test_tuning_curves_section(monkeypatch):
    fake = types.ModuleType("tvmfuse.tuning")
    fake.curves = lambda logs, target: {"fused_add_relu": [(0, 3.0), (8, 2.0), (16, 1.5)],
                                        "softmax": [(0, 5.0), (8, 4.0)]}
    monkeypatch.setitem(sys.modules, "tvmfuse.tuning", fake)
    curves = report.tuning_curves("some/logs", "llvm")
    doc = report.render([], "llvm", curves)
    ids = by_id(doc)
    assert "curves-curve-fused_add_relu" in ids and "curves-curve-softmax" in ids
    assert_offline(doc)
    monkeypatch.setitem(sys.modules, "tvmfuse.tuning", types.ModuleType("tvmfuse.tuning"))
    assert "not available" in report.tuning_curves("some/logs", "llvm")


def test_tuning_curves_of_empty_logs(tmp_path):
    """The real tvmfuse.tuning.curves on a folder without records: the section says so."""
    pytest.importorskip("tvmfuse.tuning")
    note = report.tuning_curves(str(tmp_path), "llvm")
    assert isinstance(note, str) and str(tmp_path) in note


def test_cli_report_and_graph(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert cli.main(["report", "--model", "softmax_chain", "--repeat", "3", "--out", str(out)]) == 0
    doc = out.read_text()
    assert_offline(doc)
    assert "softmax_chain [small]" in doc and "w0-graph-op-" in doc
    svg = tmp_path / "g.svg"
    assert cli.main(["graph", "--model", "layernorm_decomposed", "--out", str(svg)]) == 0
    assert "op-lv" in svg.read_text()
    assert cli.main(["report", "--model", "resnet9000", "--out", str(out)]) == 2
    assert "unknown workload" in capsys.readouterr().err


def test_tune_script_report(tmp_path):
    out = tmp_path / "t.html"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "tune.py"), "--model", "bias_relu_dropout",
                        "--size", "small", "--repeat", "3", "--report", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    doc = out.read_text()
    assert_offline(doc)
    assert "bias_relu_dropout [small]" in doc and "Per-kernel profile" in doc


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed")
def test_headless_chromium_screenshot(tmp_path, rendered):
    """The report renders in a browser, offline: the screenshot shows the class colours."""
    from PIL import Image

    _, doc = rendered
    page, shot = tmp_path / "r.html", tmp_path / "r.png"
    page.write_text(doc)
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1400,2400", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    im = Image.open(shot).convert("RGB")
    assert im.size == (1400, 2400)
    colors = {rgb for _, rgb in im.getcolors(maxcolors=1 << 24)}
    for cls in ("reduction", "compute-heavy", "injective"):
        rgb = tuple(int(viz.CLASS_COLORS[cls][i:i + 2], 16) for i in (1, 3, 5))
        assert rgb in colors, cls


def test_a_kernel_shared_by_layers_names_its_first_group_and_the_rest():
    """bert-tiny's two layers share their kernels: each shared kernel's row names its first group
    and how many more, and lists the ops of every call (no op in two rows)."""
    pytest.importorskip("transformers")
    w = real_model("bert-tiny")  # tvmfuse.load("bert-tiny"), shared with the other files
    cmp = tvmfuse.compare(w.mod, w.inputs(), "llvm", name="bert-tiny", variants=("tvmfuse",))
    e = report.profile(report.Entry("bert-tiny", w.mod, cmp, w.inputs()), "llvm")
    fg = viz.fusion_graph(e.mod)
    rows = {p["name"]: (p["calls"], report._kernel_groups(e, fg, "tvmfuse", p)) for p in e.profiles["tvmfuse"]}
    calls, (kind, _ops) = rows["fused_attention"]
    assert calls == 2 and kind.endswith("flash attention (and 1 more like it)"), kind
    inside = [op.split(":")[0] for _c, (_k, ops) in rows.values() for op in ops.split(", ")]
    assert len(inside) == len(set(inside))  # no op in two rows
    attention = [g for g in fg.groups if g.kind == "flash attention"]
    listed = {op.split(":")[0] for op in rows["fused_attention"][1][1].split(", ")}
    assert len(attention) == 2 and {m for g in attention for m in g.members} <= listed  # both layers' ops
