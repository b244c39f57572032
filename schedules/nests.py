"""Independent nests of one horizontal kernel scheduled apart, then run as one launch.

fusion/fuse_horizontal.py joins sibling groups that each hold a compute-heavy op (a convolution's
input gradient and its weight gradient, both reading the output gradient; a linear layer's two
matmul gradients) into one kernel. Their loop nests share no intermediate buffer, and each wants
its own rule (cpu.Conv2D for one, cpu.Matmul for the next): no rule schedules two anchors at once.

Contract: `Nests(rules).apply(func, target)` takes a PrimFunc whose `tvmfuse.group` kind is
"horizontal" and whose root statements fall into at least two parts (statements linked by a buffer
one writes and another touches), one of them holding a compute-heavy block (a reduction reading
two buffers at indices that move with a reduction variable: matmul, conv). It cuts the function
into one PrimFunc per compute-heavy part and one for every other part together (the elementwise
and column-reduction nests a horizontal join put beside them, which the rules schedule side by side
as before), each with the parameters it touches, schedules each with `rules()` (the target's rule
list after this one), and returns their scheduled bodies one after the other in one function. The
math of each nest is its rule's, unchanged; only the launch is shared.
Declines (None) for any other function, when a part is left to no rule, or when a part's schedule
changed a parameter buffer or set a function attribute another part set differently.
The rule name recorded on the kernel lists the parts' rules: "cpu.Nests[cpu.Conv2D,cpu.Matmul]".
"""
from __future__ import annotations

from tvm import s_tir, tirx

from .row_chain import reduction_operands
from .rule import ScheduleRule, apply_rules
from .tir_walk import children

GROUP_ATTR = "tvmfuse.group"  # fusion/plan.FUNC_ATTR: {"kind": "horizontal (n independent nests)", ...}


class Nests(ScheduleRule):
    name = "cpu.Nests"

    def __init__(self, rules):
        self.rules = rules  # () -> the rules each part is offered, in order

    def apply(self, func, target):
        group = func.attrs.get(GROUP_ATTR) if func.attrs else None
        if group is None or not str(group["kind"]).startswith("horizontal"):
            return None
        if not isinstance(func.body, s_tir.SBlockRealize):
            return None
        stmts = _statements(func.body.block)
        parts = split(stmts)
        heavy = [any(reduction_operands(b) >= 2 for b in _blocks(s)) for s in stmts]  # matmul, conv
        anchored = [p for p in parts if any(heavy[i] for i in p)]
        if len(parts) < 2 or not anchored:
            return None
        rest = sorted(i for p in parts if p not in anchored for i in p)
        cuts = sorted(anchored + ([rest] if rest else []), key=min)
        scheduled, names = [], []
        for cut in cuts:
            sub = _sub_function(func, [stmts[i] for i in cut])
            out, rule = apply_rules(sub, target, self.rules())
            if rule is None or not all(a.same_as(b) for a, b in zip(out.params, sub.params)):
                return None
            scheduled.append(out)
            names.append(rule)
        joined = _join(func, scheduled)
        return None if joined is None else joined.with_attr("tvmfuse.rule", f"{self.name}[{','.join(names)}]")


def _statements(root) -> list:
    return list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]


def _blocks(stmt):
    """Every SBlock under `stmt`."""
    stack = [stmt]
    while stack:
        s = stack.pop()
        if isinstance(s, s_tir.SBlock):
            yield s
        stack.extend(children(s))


def split(stmts) -> list[list[int]]:
    """The root statements' indices in parts: two statements are in one part when one writes a
    buffer the other reads or writes (an intermediate, or an output read again). Parameters both
    only read (a shared input) do not link them."""
    touched = []
    for s in stmts:
        reads, writes = [], []
        for b in _blocks(s):
            reads += [r.source for r in b.reads]
            writes += [w.source for w in b.writes]
        touched.append((reads, writes))
    parent = list(range(len(stmts)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, (_, wi) in enumerate(touched):
        for j, (rj, wj) in enumerate(touched):
            if i != j and any(w.same_as(x) for w in wi for x in rj + wj):
                parent[find(i)] = find(j)
    parts = {}
    for i in range(len(stmts)):
        parts.setdefault(find(i), []).append(i)
    return sorted(parts.values(), key=min)


def _uses(stmts, buf) -> bool:
    return any(r.source.same_as(buf) for s in stmts for b in _blocks(s) for r in list(b.reads) + list(b.writes))


def _sub_function(func, stmts):
    """`func` cut to `stmts`: the parameters and root buffers they touch, the attributes kept
    (`tvmfuse.constant_params`, indices into the parameters, renumbered)."""
    root = func.body.block
    keep = [i for i, p in enumerate(func.params) if _uses(stmts, p)]
    allocs = [a for a in root.alloc_buffers if _uses(stmts, a)]
    body = tirx.SeqStmt(stmts) if len(stmts) > 1 else stmts[0]
    block = s_tir.SBlock([], [], [], root.name_hint, body, None, allocs, [], root.annotations)
    sub = tirx.PrimFunc([func.params[i] for i in keep], s_tir.SBlockRealize([], True, block), attrs=func.attrs)
    marked = func.attrs.get("tvmfuse.constant_params")
    if marked is not None:
        sub = sub.with_attr("tvmfuse.constant_params", [keep.index(int(i)) for i in marked if int(i) in keep])
    return sub


def _join(func, parts):
    """One function: `func`'s parameters and attributes, the scheduled parts' root bodies in order,
    their root buffers and annotations together. None when two parts set one attribute or root
    annotation differently."""
    stmts, allocs, notes, attrs = [], [], {}, {}
    for part in parts:
        root = part.body.block
        stmts += _statements(root)
        allocs += list(root.alloc_buffers)
        for target, items in ((notes, root.annotations), (attrs, part.attrs or {})):
            for key, value in items.items():
                if str(key) == "tvmfuse.constant_params":
                    continue
                if key in target and str(target[key]) != str(value):
                    return None
                target[key] = value
    old = func.body.block
    block = s_tir.SBlock([], [], [], old.name_hint, tirx.SeqStmt(stmts), None, allocs, [], notes)
    out = func.with_body(s_tir.SBlockRealize([], True, block))
    for key, value in attrs.items():
        if not (func.attrs and key in func.attrs):
            out = out.with_attr(key, value)
    return out
