"""Fusion profitability: a sortable score for merging two legal groups.

score = bytes of global traffic saved - bytes of recompute added. An edge inside the merged group
saves the consumer's read of the tensor, and its write when nothing outside uses it; siblings save
the second read of their shared input. An elementwise producer that ends up upstream of a
compute-heavy op of the merged group (directly, or through layout ops such as reshape/permute
that only remap its indices) is recomputed once per reduction step: refused unless allow_recompute.
A dtype cast (astype) is not counted as recomputation: like a layout op it only changes how the
anchor reads its operand (one conversion per load, which the matmul's packing or shared-memory
stage does once per tile), so a half-precision build's cast of a float32 input fuses in front of
the matmul instead of standing as a kernel of its own.
A transpose that would end up upstream of a compute-heavy op is refused when the knob
layout_prologue is off (on by default for every target: the matmul reads the tensor as stored). A
gather (take) in a group with a compute-heavy op is refused on every target, upstream or downstream
(the matmul and conv rules pack strided operands and store whole tiles, not gathered ones: ViT's
CLS-token take upstream, and BLOOM's QKV split by take after its matmul, took the fallback
schedule: 1007 ms a call against 90 for the matmul on its own). A
producer fused in front of a compute-heavy op must not be used outside the merged group as well
(AOTAutograd saves a Linear's transposed weight for the backward graph): it would be a second
output written from the operand side of the matmul, which the matmul rules do not store, so the
group took the fallback schedule. A group of views (reshapes) is not fused after a value the other group
writes anyway: alone it costs nothing, fused it is a copy. With the knob `horizontal` on (training
graphs), a group with a compute-heavy op and one without are not merged as siblings: no read is
saved (the anchor reads its operand tile by tile, the sibling in a nest of its own), and the merge
would order the sibling's other readers after the anchor (a ReLU mask recomputed beside a conv's
weight gradient kept its input gradient from sharing that launch). `knobs` is every knob's value (Knobs.as_dict()): no defaults here.
"""
from __future__ import annotations

from .classify import BROADCAST, COMPUTE, ELEMENTWISE
from ..relax_utils import planning_bytes


TRANSPOSES = ("permute_dims", "transpose")  # layout ops that move data (a reshape only renames it)
CASTS = ("astype",)  # dtype conversions: read through by an anchor, not recomputed work
GATHERS = ("take", "gather_elements", "gather_nd")  # data-dependent reads: never with a compute-heavy op
VIEWS = ("reshape", "squeeze", "expand_dims", "flatten")  # rename a tensor's axes: a free view alone


def _feeds_anchor(g, merged):
    """Members of `merged` with a path, inside it, to one of its compute-heavy ops."""
    up = {i for i in merged if g.by_idx[i].cls == COMPUTE}
    anchors = set(up)
    grew = True
    while grew:
        grew = False
        for m in merged - up:
            if g.users[m] & up:
                up.add(m)
                grew = True
    return up - anchors


def _copies_a_view(g, a, b, merged):
    """The reason to refuse when one group holds only views (reshapes) of a value the other writes
    anyway (it is used outside the merged group): standing alone a view is free (a Relax reshape of
    a kernel's output is no kernel), fused it would be a second output, a copy of the first (a
    norm's output [4, 128, 256] also stored as the [512, 256] each Linear of the next layer reads)."""
    for src, dst in ((a, b), (b, a)):
        if not all(g.by_idx[i].op in VIEWS for i in dst):
            continue
        for p in src:
            if g.users[p] & dst and (g.external_uses[p] or g.users[p] - merged):
                v = g.by_idx[min(g.users[p] & dst)]
                return (f"{v.name} ({v.op}) only renames {g.by_idx[p].name}, which is written anyway: alone it "
                        "is a free view, fused it would be a copy")
    return None


def score(g, a: set, b: set, knobs, shared_inputs=()):
    merged = a | b
    saved = 0
    anchored = [any(g.by_idx[i].cls == COMPUTE for i in x) for x in (a, b)]
    if shared_inputs and knobs["horizontal"] and anchored[0] != anchored[1]:
        return None, ("sibling of a compute-heavy group: the anchor reads its operand tile by tile, so no read "
                      "is saved, and with horizontal on (fuse_horizontal.py) the two share a launch without one "
                      "having to wait for the other")
    upstream = _feeds_anchor(g, merged)
    recomputed = [g.by_idx[i] for i in upstream - _feeds_anchor(g, a) - _feeds_anchor(g, b)
                  if g.by_idx[i].cls in (ELEMENTWISE, BROADCAST) and g.by_idx[i].op not in CASTS]
    if recomputed and not knobs["allow_recompute"]:
        anchor = next(g.by_idx[i].name for i in merged if g.by_idx[i].cls == COMPUTE)
        n = recomputed[0]
        return None, (f"{n.name} ({n.op}) would be recomputed inside compute-heavy {anchor} "
                      "(allow_recompute=False)")
    anchors = [g.by_idx[i].name for i in merged if g.by_idx[i].cls == COMPUTE]
    gathered = [g.by_idx[i] for i in merged if g.by_idx[i].op in GATHERS]
    if gathered and anchors:
        where = "inside" if any(n.idx in upstream for n in gathered) else "after"
        return None, (f"{gathered[0].name} ({gathered[0].op}) would be gathered {where} compute-heavy {anchors[0]} "
                      "(the matmul and conv rules pack strided operands and store whole tiles, not gathered ones)")
    if not knobs["layout_prologue"]:
        transposed = [g.by_idx[i] for i in upstream - _feeds_anchor(g, a) - _feeds_anchor(g, b)
                      if g.by_idx[i].op in TRANSPOSES]
        if transposed:
            anchor = next(g.by_idx[i].name for i in merged if g.by_idx[i].cls == COMPUTE)
            n = transposed[0]
            return None, (f"{n.name} ({n.op}) would be read transposed inside compute-heavy {anchor} "
                          "(layout_prologue=False: this target's matmul is faster on its own layout)")
    escaping = [g.by_idx[i] for i in upstream if g.external_uses[i] or g.users[i] - merged]
    if escaping:
        anchor = next(g.by_idx[i].name for i in merged if g.by_idx[i].cls == COMPUTE)
        n = escaping[0]
        return None, (f"{n.name} ({n.op}) feeds compute-heavy {anchor} and is used outside the group too "
                      "(a transposed weight a backward graph saves): it would be a second output, written "
                      "from inside the matmul's operand packing, which no matmul rule does")
    why = _copies_a_view(g, a, b, merged)
    if why:
        return None, why
    for src, dst in ((a, b), (b, a)):
        for p in src:
            crossing = g.users[p] & dst
            if not crossing:
                continue
            nbytes = g.out_bytes(p)
            saved += nbytes  # one read fewer
            if not g.external_uses[p] and not (g.users[p] - merged):
                saved += nbytes  # and no write at all
            n = g.by_idx[p]
            if n.cls in (ELEMENTWISE, BROADCAST) and p in upstream:
                saved -= nbytes  # the producer's read is traded for recomputation, not saved
    saved += sum(planning_bytes(v.ty) for v in shared_inputs)
    if saved <= 0:
        return None, f"not profitable: saves {saved} bytes"
    return saved, None
