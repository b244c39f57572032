"""Pictures of the fusion: the op graph of a Relax function, coloured by op class, with the fused
groups drawn as boxes around their ops.

`fusion_graph(mod_or_compiled, **knobs)` reads a tvmfuse build's plan (tvmfuse/fusion/plan.py; of a module
not built, the plan a build makes, planned once) and returns a `FusionGraph`: a networkx DiGraph with one node per op (plus
the function's inputs and outputs), edges as tensors (attr `label`: shape and dtype), the groups and
the refused merges. `draw(fg)` renders it as SVG text with matplotlib: a layered layout (layers are
networkx's topological generations; each group keeps a block of columns, like a graphviz cluster,
see `layout`), text kept as text, no dates in the file, and an SVG id on every node (`op-<var>`, `in-<param>`, `out-<k>`), edge (`edge-<src>-<dst>`)
and group box (`group-b<block>g<index>`), so tests and other tools can read the picture structurally.
`draw_kernels(fg)` draws the graph after fusion: one node per kernel.
"""
from __future__ import annotations

import io
import re
from dataclasses import dataclass, field

import networkx as nx
import tvm
from tvm import relax

from ..fusion.classify import BROADCAST, CLASSES, COMPUTE, ELEMENTWISE, INJECTIVE, OPAQUE, REDUCTION, classify_call
from ..relax_utils import static_shape

# One colour per op class (Okabe-Ito, colour-blind safe): the pictures and the HTML report share it.
CLASS_COLORS = {
    ELEMENTWISE: "#56b4e9",
    BROADCAST: "#009e73",
    INJECTIVE: "#f0e442",
    REDUCTION: "#e69f00",
    COMPUTE: "#d55e00",
    OPAQUE: "#cc79a7",
}
IO_COLOR = "#ffffff"
GROUP_EDGE = "#333333"


@dataclass
class Group:
    id: str  # "b<block>g<index>", the numbering `tvmfuse.explain` prints
    block: int
    index: int
    members: list  # node ids (op var names), in block order
    kind: str  # group_kind() of its classes
    te_refused: str | None = None  # planned, but TE lowering refused it: its ops stay separate kernels

    @property
    def fused(self):
        return len(self.members) > 1 and self.te_refused is None


@dataclass
class FusionGraph:
    graph: nx.DiGraph
    groups: list = field(default_factory=list)  # [Group]
    refused: list = field(default_factory=list)  # [dict(block, kind, a, b, rule, reason)]
    var_node: dict = field(default_factory=dict)  # Relax var name (aliases included) -> op node
    plan: object = None  # the tvmfuse.fusion.plan.Plan drawn

    def ops(self):
        return [n for n, d in self.graph.nodes(data=True) if d["kind"] == "op"]

    def group_of(self, node):
        return self.graph.nodes[node].get("group")


def tensor_label(ty) -> str:
    """'8x64 float32' for a tensor type; '(a, b)' for a tuple."""
    if isinstance(ty, relax.TupleType):
        return "(" + ", ".join(tensor_label(f) for f in ty.fields) + ")"
    if not isinstance(ty, relax.TensorType):
        return ""
    shape = static_shape(ty)
    dims = "x".join(str(d) for d in shape) if shape is not None else "?"
    return f"{dims or 'scalar'} {ty.dtype}"


# ---------------------------------------------------------------------------------------- graph
def fusion_graph(mod, func_name: str = "main", target="llvm", **knobs) -> FusionGraph:
    """The op graph of `mod[func_name]` with the groups and refusals of tvmfuse's fusion plan.
    `mod` is a module (planned as a tvmfuse build for `target` plans it) or a tvmfuse `Compiled`
    (its own plan)."""
    from ..fusion.api import plan_of

    mod, plan = plan_of(mod, target, **knobs)
    func = mod[func_name]
    G = nx.DiGraph()
    fg = FusionGraph(G, plan=plan)
    group_of = {}  # op var name -> Group
    for pg in plan.groups:
        grp = Group(pg.id, pg.block, pg.index, pg.names, pg.kind, pg.te_refused)
        fg.groups.append(grp)
        group_of.update({n: grp for n in pg.names})
    for r in plan.refused:
        fg.refused.append({"block": r.block, "kind": r.kind, "a": list(r.a), "b": list(r.b), "rule": r.rule,
                           "reason": r.reason})
    sources = {}  # var -> [(node id, tensor var)]
    for prm in func.params:
        nid = f"in-{prm.name}"
        G.add_node(nid, kind="input", name=prm.name, op="input", cls=None, group=None,
                   shape=tensor_label(prm.ty))
        sources[prm] = [(nid, prm)]
    for block in func.body.blocks:
        for bd in block.bindings:
            _add_binding(G, bd, sources, group_of)
    for k, src in enumerate(_resolve(func.body.body, sources)):
        nid = f"out-{k}"
        G.add_node(nid, kind="output", name=f"output {k}", op="output", cls=None, group=None,
                   shape=tensor_label(src[1].ty))
        G.add_edge(src[0], nid, label=tensor_label(src[1].ty))
    for v, srcs in sources.items():
        if len(srcs) == 1 and G.nodes[srcs[0][0]]["kind"] == "op":
            fg.var_node.setdefault(v.name, srcs[0][0])
    return fg


def _resolve(expr, sources):
    """The (node, tensor var) pairs an expression reads."""
    out = []
    for v in relax.analysis.free_vars(expr) if not isinstance(expr, relax.Var) else [expr]:
        out += sources.get(v, [])
    return out


def _add_binding(G, bd, sources, group_of):
    v = bd.value
    if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op):
        name = bd.var.name
        nid = name if name not in G else f"{name}#{len(G)}"
        cls, reason, _ = classify_call(v)
        grp = group_of.get(name)
        G.add_node(nid, kind="op", name=name, op=v.op.name.replace("relax.", ""), cls=cls, reason=reason,
                   group=grp.id if grp else None, shape=tensor_label(bd.var.ty))
        for src, tv in _resolve(v, sources):
            G.add_edge(src, nid, label=tensor_label(tv.ty))
        sources[bd.var] = [(nid, bd.var)]
    elif isinstance(v, relax.TupleGetItem) and len(sources.get(v.tuple_value, [])) == 1 \
            and sources[v.tuple_value][0][1].same_as(v.tuple_value):
        sources[bd.var] = [(sources[v.tuple_value][0][0], bd.var)]  # one field of an op's tuple
    elif isinstance(v, relax.TupleGetItem) and isinstance(v.tuple_value, relax.Tuple):
        sources[bd.var] = _resolve(v.tuple_value.fields[v.index], sources)
    else:  # aliases, tuples, anything else: pass the tensors through
        sources[bd.var] = _resolve(v, sources)


def layout(fg: FusionGraph) -> dict:
    """{node: (column, layer)}. Layers are networkx's topological generations (a source: an input
    or an op on constants only, sits just above its first consumer). Each group is a block of
    columns over its layers, placed like a graphviz cluster: at the free columns nearest its
    producers, so no box ever holds a foreign node. Inside a block, nodes are ordered by the mean column of their producers."""
    G = fg.graph
    layer = {n: k for k, gen in enumerate(nx.topological_generations(G)) for n in gen}
    for n in G:  # sources (inputs, ops on constants only) sit just above their first consumer
        if G.in_degree(n) == 0 and G.out_degree(n):
            layer[n] = max(0, min(layer[c] for c in G.successors(n)) - 1)
    blocks = [grp.members for grp in fg.groups]
    grouped = {n for m in blocks for n in m}
    blocks += [[n] for n in G if n not in grouped and G.nodes[n]["kind"] != "input"]
    blocks = [m for _, m in sorted(enumerate(blocks), key=lambda t: (min(layer[n] for n in t[1]), t[0]))]
    blocks += [[n] for n in G if G.nodes[n]["kind"] == "input"]
    col, placed = {}, []  # placed: (x0, x1, y0, y1)
    for members in blocks:
        rows = {}
        for n in members:
            rows.setdefault(layer[n], []).append(n)
        width = max(len(r) for r in rows.values())
        y0, y1 = min(rows), max(rows)
        near = [col[m] for n in members for m in list(G.predecessors(n)) + list(G.successors(n)) if m in col]
        target = sum(near) / len(near) - (width - 1) / 2 if near else 0.0
        busy = [(a, b) for a, b, c, d in placed if c <= y1 and y0 <= d]
        right = max([b for _, b in busy] + [0])
        limit = max(right, int(round(target)))  # every column from `right` on is free
        free = [x for x in range(limit + 1) if all(x + width <= a or x >= b for a, b in busy)]
        x = min(free, key=lambda x: (abs(x - target), x))
        placed.append((x, x + width, y0, y1))
        for y, nodes in sorted(rows.items()):
            def bary(n):
                ps = [col[p] for p in G.predecessors(n) if p in col]
                return (sum(ps) / len(ps) if ps else x + width / 2, str(n))
            start = x + (width - len(nodes)) // 2
            col.update({n: start + k for k, n in enumerate(sorted(nodes, key=bary))})
    return {n: (col[n], layer[n]) for n in G}


# ---------------------------------------------------------------------------------------- drawing
_NODE_W, _LAYER_H = 1.55, 0.95  # inches per node slot across and per layer down


def _setup_matplotlib():
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays <text>, searchable and small
    matplotlib.rcParams["svg.hashsalt"] = "tvmfuse"  # stable ids: the same graph gives the same file
    import matplotlib.pyplot as plt

    return plt




def draw(fg: FusionGraph, path=None, groups: bool = True, title: str | None = None,
         edge_labels: bool = True) -> str:
    """SVG text of the op graph (with the group boxes when `groups`); also written to `path`."""
    G = fg.graph
    n_ops = len(fg.ops())
    kernels = len(fg.groups) + sum(1 for n in fg.ops() if G.nodes[n]["group"] is None)
    head = (title or "op graph") + (f": {n_ops} ops -> {kernels} kernels" if groups else f": {n_ops} ops")
    return _render(fg, path, groups, head, edge_labels)


def _render(fg, path, groups, head, edge_labels):
    plt = _setup_matplotlib()
    from matplotlib.patches import Patch, Rectangle

    G = fg.graph
    grid = layout(fg)
    pos = {n: (c * _NODE_W, -y * _LAYER_H) for n, (c, y) in grid.items()}
    width = 1 + max((c for c, _ in grid.values()), default=0)
    depth = 1 + max((y for _, y in grid.values()), default=0)
    fig_w = max(6.0, width * _NODE_W + 1.2)
    fig_h = max(3.0, depth * _LAYER_H + 1.4)
    fig, ax = plt.subplots(figsize=(fig_w, fig_h))
    ax.set_axis_off()
    fig.subplots_adjust(left=0.01, right=0.99, top=1 - 0.9 / fig_h, bottom=0.5 / fig_h)
    if groups:
        _draw_group_boxes(ax, fg, pos, Rectangle)
    _draw_edges(ax, G, grid, pos, edge_labels)
    for n, d in G.nodes(data=True):
        _draw_node(ax, n, d, pos[n])
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    ax.set_xlim(min(xs) - _NODE_W * 0.7, max(xs) + _NODE_W * 0.7)
    ax.set_ylim(min(ys) - _LAYER_H * 0.6, max(ys) + _LAYER_H * 0.6)
    used = [c for c in CLASSES if any(d.get("cls") == c for _, d in G.nodes(data=True))]
    legend = ax.legend(handles=[Patch(facecolor=CLASS_COLORS[c], edgecolor="#333333", label=c) for c in used],
                       loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(used) or 1, fontsize=7,
                       frameon=False)
    legend.set_gid("legend")
    fig.suptitle(head, fontsize=9, y=1 - 0.15 / fig_h, va="top")
    return _save(fig, plt, path)


def _draw_edges(ax, G, grid, pos, edge_labels):
    """Edges to the next layer go straight; longer ones bow ~0.5 in sideways, clear of the nodes
    between (arc3's rad is relative to the edge length, so edges are drawn in buckets of rad)."""
    buckets = {}
    for u, v in G.edges():
        span = abs(grid[v][1] - grid[u][1])
        rad = 0.0 if span <= 1 else round(min(0.6, 1.0 / span), 2)
        buckets.setdefault(rad, []).append((u, v))
    labels = nx.get_edge_attributes(G, "label")
    for rad, edges in sorted(buckets.items()):
        style = f"arc3,rad={rad}"
        patches = nx.draw_networkx_edges(G, pos, edgelist=edges, ax=ax, arrows=True, arrowsize=8, width=0.8,
                                         edge_color="#555555", node_size=700, connectionstyle=style)
        for (u, v), p in zip(edges, patches):
            p.set_gid(f"edge-{u}-{v}")
        if edge_labels:
            texts = nx.draw_networkx_edge_labels(G, pos, edge_labels={e: labels[e] for e in edges}, ax=ax,
                                                 font_size=5.5, font_color="#444444", rotate=False,
                                                 bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none",
                                                       "alpha": 0.8}, connectionstyle=style)
            for (u, v), t in texts.items():
                t.set_gid(f"label-{u}-{v}")


def _draw_node(ax, n, d, xy):
    if d["kind"] == "op":
        label, fc, style = f"{d['name']}\n{d['op']}", CLASS_COLORS[d["cls"]], "round,pad=0.3"
        gid = f"op-{n}"
    else:
        label, fc, style = f"{d['name']}\n{d['shape']}", IO_COLOR, "round4,pad=0.3"
        gid = n
    t = ax.text(xy[0], xy[1], label, ha="center", va="center", fontsize=6.5, zorder=3,
                bbox={"boxstyle": style, "fc": fc, "ec": "#333333", "lw": 0.6})
    t.set_gid(gid)


def _draw_group_boxes(ax, fg, pos, Rectangle):
    for grp in fg.groups:
        pts = [pos[n] for n in grp.members if n in pos]
        if not pts:
            continue
        x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
        y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
        pad_x, pad_y = _NODE_W * 0.45, _LAYER_H * 0.3
        top = pad_y + (0.12 if grp.fused else 0.0)  # room for the label
        box = Rectangle((x0 - pad_x, y0 - pad_y), x1 - x0 + 2 * pad_x, y1 - y0 + pad_y + top, zorder=0.5,
                        fc="#fafafa" if grp.fused else "none", ec=GROUP_EDGE if grp.fused else "#aaaaaa",
                        lw=1.2 if grp.fused else 0.5, ls="--" if grp.fused else ":")
        box.set_gid(f"group-{grp.id}")
        ax.add_patch(box)
        if grp.fused:
            t = ax.text(x0 - pad_x + 0.04, y1 + top - 0.03, f"{grp.id}: {len(grp.members)} ops\n{grp.kind}",
                        fontsize=5.5, ha="left", va="top", color=GROUP_EDGE, zorder=0.6)
            t.set_gid(f"grouplabel-{grp.id}")


def kernel_graph(fg: FusionGraph) -> nx.DiGraph:
    """The graph after fusion: one node per kernel (a group, or an op outside any dataflow block)."""
    G = fg.graph
    K = nx.DiGraph()
    node_k = {}
    for grp in fg.groups:
        cls = [G.nodes[n]["cls"] for n in grp.members]
        main = next((c for c in (COMPUTE, REDUCTION, OPAQUE) if c in cls), None) or max(cls, key=cls.count)
        K.add_node(grp.id, kind="kernel", name=grp.id, op=grp.kind, cls=main, group=grp.id, ops=len(grp.members))
        node_k.update({n: grp.id for n in grp.members})
    for n, d in G.nodes(data=True):
        if n not in node_k:
            K.add_node(n, **d)
            node_k[n] = n
    for u, v, d in G.edges(data=True):
        if node_k[u] != node_k[v]:
            K.add_edge(node_k[u], node_k[v], **d)
    return K


def draw_kernels(fg: FusionGraph, path=None, title: str | None = None) -> str:
    """SVG of the graph after fusion: each kernel one node, coloured by its main op class (the
    compute-heavy anchor, else a reduction, else an opaque op, else its most common class)."""
    K = kernel_graph(fg)
    for n, d in K.nodes(data=True):
        if d["kind"] == "kernel":
            d["kind"], d["name"] = "op", f"{n} ({d['ops']} ops)"
    n_k = sum(1 for _, d in K.nodes(data=True) if d["kind"] == "op")
    head = f"{title or 'after fusion'}: {n_k} kernels"
    return _render(FusionGraph(K, [], fg.refused), path, False, head, True)


def _save(fig, plt, path):
    """SVG text of `fig`; written to `path` too (as PNG when the path ends in .png)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": "tvmfuse"})
    if path and str(path).endswith(".png"):
        fig.savefig(path, dpi=110)
        path = None
    plt.close(fig)
    svg = buf.getvalue()
    if path:
        with open(path, "w") as f:
            f.write(svg)
    return svg


def svg_ids(svg: str) -> list[str]:
    """Every id="..." in an SVG, in document order (for tests and tools)."""
    return re.findall(r'\bid="([^"]+)"', svg)
