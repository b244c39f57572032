"""The fusion pictures (tvmfuse.report.viz), checked structurally in the SVG XML: every op appears once,
every group is drawn as a box, node colours are the colours of the op classes, and the groups and
refusals are the ones `tvmfuse.explain` prints."""
import re
import xml.etree.ElementTree as ET

import networkx as nx
import pytest

import tvmfuse
from tvmfuse.report import viz
from tvmfuse.zoo import workloads

SVG = "{http://www.w3.org/2000/svg}"


def torch_model_mod():
    """An imported model: a tiny torch MLP block through relax.frontend.torch (weights as constants)."""
    torch = pytest.importorskip("torch")
    from tvm.relax.frontend.torch import from_exported_program

    class Block(torch.nn.Module):
        def __init__(self, d=16):
            super().__init__()
            self.ln, self.fc1, self.fc2 = torch.nn.LayerNorm(d), torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d)

        def forward(self, x):
            return x + torch.softmax(self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x)))), dim=-1)

    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(4, 16)
    mod = from_exported_program(torch.export.export(model, (x,)), keep_params_as_input=False)
    with torch.no_grad():
        ref = model(x).numpy()
    return mod, [x.numpy()], ref


def svg_nodes(svg):
    """{id: element} of every element with an id."""
    root = ET.fromstring(svg)
    return {e.get("id"): e for e in root.iter() if e.get("id")}


def fill_of(elem):
    """The fill colour of the node's box: the first path inside the node's group."""
    for e in elem.iter(f"{SVG}path"):
        m = re.search(r"fill:\s*(#[0-9a-fA-F]{6})", e.get("style", ""))
        if m:
            return m.group(1).lower()
    return None


def explain_groups(text):
    """[(block, group index, [var names])] and [(block, rule)] parsed from tvmfuse.explain."""
    groups, refused, block = [], [], None
    for line in text.splitlines():
        if line.startswith("block "):
            block = int(line.split()[1].rstrip(":"))
        elif line.strip().startswith("group "):
            j = int(line.split()[1])
            ops = line.split("): ", 1)[1].split(", ")
            groups.append((block, j, [o.split(":")[0] for o in ops]))
        elif line.strip().startswith("refused "):
            refused.append((block, re.search(r"\[(\w+)\]", line).group(1)))
    return groups, refused


def check_picture(mod, fg, svg, **knobs):
    from tvmfuse.pipeline import fold_constants

    ops = tvmfuse.classify(fold_constants(mod))  # the graph the build plans on
    ids = viz.svg_ids(svg)
    nodes = svg_nodes(svg)
    # every op appears once: one node in the graph, one element op-<var> in the picture
    assert sorted(fg.ops()) == sorted(o.var for o in ops)
    op_ids = [i for i in ids if i.startswith("op-")]
    assert sorted(op_ids) == sorted(f"op-{o.var}" for o in ops)
    assert len(set(ids)) == len(ids)
    # colours match the classes (classify's and the node's)
    for o in ops:
        assert fg.graph.nodes[o.var]["cls"] == o.cls
        assert fill_of(nodes[f"op-{o.var}"]) == viz.CLASS_COLORS[o.cls], o
    # every group is drawn, and every op is inside exactly one group
    assert sorted(i for i in ids if i.startswith("group-")) == sorted(f"group-{g.id}" for g in fg.groups)
    members = [m for g in fg.groups for m in g.members]
    assert sorted(members) == sorted(fg.ops())
    for g in fg.groups:
        assert (f"grouplabel-{g.id}" in nodes) == g.fused
    # every edge is drawn, with its tensor label
    for u, v, d in fg.graph.edges(data=True):
        assert f"edge-{u}-{v}" in nodes
        assert d["label"] in "".join(nodes[f"label-{u}-{v}"].itertext())
    # the picture shows the groups and refusals that explain prints
    groups, refused = explain_groups(tvmfuse.explain(mod, **knobs))
    assert [(g.block, g.index, g.members) for g in fg.groups] == groups
    assert [(r["block"], r["rule"]) for r in fg.refused] == refused


def check_layout(fg):
    """No group box holds a node of another group; nodes never share a cell."""
    pos = viz.layout(fg)
    assert len(set(pos.values())) == len(pos)
    for g in fg.groups:
        cols = [pos[m][0] for m in g.members]
        rows = [pos[m][1] for m in g.members]
        for n, (c, r) in pos.items():
            if n not in g.members:
                assert not (min(cols) <= c <= max(cols) and min(rows) <= r <= max(rows)), (g.id, n)


@pytest.mark.parametrize("name", workloads.names())
def test_zoo_picture(name):
    mod = workloads.get(name, "small").mod
    fg = viz.fusion_graph(mod)
    svg = viz.draw(fg, title=name)
    check_picture(mod, fg, svg)
    check_layout(fg)
    assert svg == viz.draw(fg, title=name)  # deterministic: no dates, stable ids


def test_imported_torch_model_picture(tmp_path):
    mod, _, _ = torch_model_mod()
    fg = viz.fusion_graph(mod)
    out = tmp_path / "torch.svg"
    svg = viz.draw(fg, out, title="torch block")
    assert out.read_text() == svg
    check_picture(mod, fg, svg)
    check_layout(fg)
    assert any(g.fused for g in fg.groups) and len(fg.ops()) >= 8
    ids = viz.svg_ids(svg)
    assert "in-x" in ids and "out-0" in ids


def test_kernel_graph_has_one_node_per_kernel():
    mod = workloads.get("attention", "small").mod
    fg = viz.fusion_graph(mod)
    svg = viz.draw_kernels(fg)
    K = viz.kernel_graph(fg)
    kernels = [n for n, d in K.nodes(data=True) if d["kind"] == "kernel"]
    assert sorted(kernels) == sorted(g.id for g in fg.groups)
    ids = viz.svg_ids(svg)
    assert sorted(i for i in ids if i.startswith("op-")) == sorted(f"op-{g.id}" for g in fg.groups)
    assert nx.is_directed_acyclic_graph(K)
    assert f"{len(fg.groups)} kernels" in svg


def test_knobs_change_the_groups():
    mod = workloads.get("layernorm_decomposed", "small").mod
    fused = viz.fusion_graph(mod)
    apart = viz.fusion_graph(mod, stitch_reductions=False)
    assert len(apart.groups) > len(fused.groups)
    assert any(r["rule"] == "reduction_space" for r in apart.refused)
    check_picture(mod, apart, viz.draw(apart), stitch_reductions=False)
    with pytest.raises(TypeError, match="unknown fusion knob"):
        viz.fusion_graph(mod, not_a_knob=1)


def test_png_output(tmp_path):
    fg = viz.fusion_graph(workloads.get("softmax_chain", "small").mod)
    viz.draw(fg, tmp_path / "g.png")
    data = (tmp_path / "g.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"


def test_long_graph_renders():
    """A 240-op chain (the upper end of what the picture is for) renders with every op once."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for k in range(60):
                h = bb.emit(relax.op.exp(h))
                h = bb.emit(relax.op.add(h, x))
                s = bb.emit(relax.op.sum(h, axis=[1], keepdims=True))
                h = bb.emit(relax.op.divide(h, s))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    mod = bb.get()
    fg = viz.fusion_graph(mod)
    svg = viz.draw(fg, edge_labels=False)
    assert len(fg.ops()) == 240
    ids = viz.svg_ids(svg)
    assert len([i for i in ids if i.startswith("op-")]) == 240
    assert len([i for i in ids if i.startswith("group-")]) == len(fg.groups)
    assert len(svg) < 2_000_000
