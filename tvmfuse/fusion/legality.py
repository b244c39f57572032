"""Fusion legality: may these two groups share one kernel without changing the math?

Each rule is (name, check) with check(graph, members, knobs) -> None (ok) or a reason. Rules look
at the merged member set only; profitability is decided elsewhere (profitability.py). Reduction
order and accumulation dtype are kept by construction: every op keeps its own TE compute.
"""
from __future__ import annotations

from tvm import relax

from .classify import BROADCAST, COMPUTE, ELEMENTWISE, OPAQUE, REDUCTION


def _opaque(g, members, knobs):
    for i in members:
        n = g.by_idx[i]
        if n.cls == OPAQUE:
            return f"{n.name} ({n.op}) is opaque: {n.reason}"
        if n.escapes:
            return f"{n.name} ({n.op}) is used as a whole tuple outside its group"
        if n.dims is None and n.cls != OPAQUE and not n.aliases:
            return f"{n.name} ({n.op}) has no known shape"
    return None


def _size(g, members, knobs):
    if len(members) > knobs["max_group_size"]:
        return f"group would hold {len(members)} ops > max_group_size={knobs['max_group_size']}"
    return None


def _anchors(g, members, knobs):
    anchors = [g.by_idx[i] for i in members if g.by_idx[i].cls == COMPUTE]
    if len(anchors) > 1:
        return f"two compute-heavy ops ({anchors[0].name}, {anchors[1].name}) in one kernel"
    if anchors and any(g.by_idx[i].cls == REDUCTION for i in members):
        red = next(g.by_idx[i] for i in members if g.by_idx[i].cls == REDUCTION)
        return (f"reduction {red.name} ({red.op}) with compute-heavy {anchors[0].name}: it needs the whole "
                "output of the anchor (a grid-wide barrier on GPU)")
    return None


def _anchor_paths(g, members, anchor):
    """{var: path} for every value of the group computed from the anchor's output, where a path
    names the index-remapping ops (slices, split fields, transposes, concats ...) it went through;
    elementwise and broadcast ops keep their operand's path. Two paths meeting in one op mean that
    op reads the anchor's output at more than one position per element."""
    paths = {g.by_idx[anchor].var: ()}
    for i in sorted(members):  # block order is a topological order
        n = g.by_idx[i]
        if i == anchor:
            continue
        seen = {paths[v] for v in _arg_vars(n.call) if v in paths}
        if not seen:
            continue
        if len(seen) > 1:
            return n, sorted(seen)
        (path,) = seen
        out = path if n.cls in (ELEMENTWISE, BROADCAST) else path + (i,)
        paths[n.var] = out
        for alias in n.aliases:  # a split's fields are different slices of its input
            paths[alias.var] = out + (int(alias.value.index),)
    return None


def _arg_vars(call):
    out = []
    for a in call.args:
        out += list(a.fields) if isinstance(a, relax.Tuple) else [a]
    return [a for a in out if isinstance(a, relax.Var)]


def _gathering_epilogue(g, members, knobs):
    anchors = [i for i in members if g.by_idx[i].cls == COMPUTE]
    if len(anchors) != 1:
        return None
    met = _anchor_paths(g, members, anchors[0])
    if met is None:
        return None
    n, _paths = met
    return (f"{n.name} ({n.op}) combines values read from {g.by_idx[anchors[0]].name}'s output at different "
            "positions (another slice, split field or layout of it): its element needs outputs of other "
            "tiles of the anchor, so the anchor's output would have to be whole first (a grid-wide "
            "barrier on GPU; on CPU no tile of the anchor could carry it)")


def _compatible(shape, row):
    """Equal leading dims: ints by value, symbolic dims when provably equal (relax_utils.SymDim)."""
    return shape is not None and tuple(shape[: len(row)]) == tuple(row)


def _reduction_space(g, members, knobs):
    reds = [g.by_idx[i] for i in members if g.by_idx[i].cls == REDUCTION]
    if not reds:
        return None
    spaces = {r.name: r.row_space() for r in reds}
    if any(s is None for s in spaces.values()):
        return "a reduction without a known iteration space"
    first = reds[0]
    row, trailing = spaces[first.name]
    for r in reds[1:]:
        if spaces[r.name] != (row, trailing):
            return (f"reductions {first.name} and {r.name} iterate over different spaces "
                    f"({list(row)} vs {list(spaces[r.name][0])}): not stitchable into one row loop")
        if not trailing and r.reduced_axes() != first.reduced_axes():
            return (f"reductions {first.name} and {r.name} fold different axes of {list(row)} "
                    f"({first.reduced_axes()} vs {r.reduced_axes()}): not stitchable into one row loop")
    if len(reds) > 1 and not knobs["stitch_reductions"]:
        return "reduction stitching disabled (stitch_reductions=False)"
    for i in members:
        n = g.by_idx[i]
        if n.cls == REDUCTION:
            continue
        ok = _compatible(n.dims, row) if trailing else tuple(n.dims or ()) in (row, tuple(first.dims or ())) \
            or _per_channel(n, first, row)
        if not ok and (relabels_a_reduction(g, members, n) or trailing and _regroups_rows(g, members, n, row)):
            continue
        if not ok:
            return (f"{n.name} ({n.op}, shape {list(n.dims or [])}) does not iterate over the rows "
                    f"{list(row)} of reduction {first.name}")
    return None


_RELABEL = ("reshape", "squeeze", "expand_dims", "flatten")


def relabels_a_reduction(g, members, n) -> bool:
    """Whether `n` only renames the axes of a reduction's output in the group, element for element
    (a bias gradient's sum over the batch, [1, 64] -> [64]): an epilogue on the reduced values,
    which the reduction writes first, whatever rows it iterated over."""
    if n.op not in _RELABEL or n.shape is None:
        return False
    srcs = [g.by_idx[p] for p in g.producers[n.idx] if p in members]
    return len(srcs) == 1 and srcs[0].cls == REDUCTION and srcs[0].shape is not None and \
        _count(srcs[0].shape) == _count(n.shape) and len(g.producers[n.idx]) == 1


def _regroups_rows(g, members, n, row) -> bool:
    """Whether `n` reshapes a member that iterates over the rows by regrouping the row dims only,
    its trailing dims kept ([4, 128, 256] -> [512, 256] over rows [4, 128]: a norm's output
    flattened for the Linear after it). Element for element it is the same row-major order, so each
    row of the kernel is still whole rows of the output; the row rules store through such a view
    (schedules/common.store_views_in_producers)."""
    if n.op not in _RELABEL or n.shape is None or len(g.producers[n.idx]) != 1:
        return False
    src = g.by_idx[next(iter(g.producers[n.idx]))]
    if src.idx not in members or src.shape is None or not _compatible(src.dims, row):
        return False
    tail = tuple(src.shape[len(row):])
    lead = tuple(n.shape[: len(n.shape) - len(tail)])
    return tuple(n.shape[len(lead):]) == tail and _count(lead) == _count(src.shape[: len(row)])


def _per_channel(n, red, row) -> bool:
    """Whether `n` is a vector over what reduction `red` keeps, its unit dims aside ([16], [16, 1, 1]
    and [1, 16, 1, 1] beside a BatchNorm's statistics over N, H, W of [4, 16, 16, 16]: the saved
    mean, the affine weight, the running statistics), where the kernel can be a channel chain
    (schedules/channel_rows.py): static shapes, the last axis folded, so each channel's elements
    are contiguous along W. With the channels last (NHWC) each row would be a strided column; the
    statistics and the normalization then stay two kernels, each with its own layout."""
    if n.dims is None or red.dims is None or not all(isinstance(d, int) for d in row):
        return False
    kept = _non_unit(red.dims)  # empty for one channel: a scalar beside it is no channel vector
    return bool(kept) and len(row) - 1 in (red.reduced_axes() or ()) and _non_unit(n.dims) == kept


def _non_unit(shape) -> tuple:
    """`shape` without its 1s: [16], [16, 1, 1] and [1, 16, 1, 1] are one per-channel vector."""
    return tuple(d for d in shape if not (isinstance(d, int) and d == 1))


def _count(shape) -> int:
    total = 1
    for d in shape:
        total *= int(d)
    return total


def _multi_output(g, members, knobs):
    if knobs["multi_output"]:
        return None
    outs = [i for i in members if g.external_uses[i] or (g.users[i] - members)]
    if len(outs) > 1:
        return "group would have several outputs (multi_output=False)"
    return None


RULES = [("opaque", _opaque), ("max_group_size", _size), ("anchor", _anchors),
         ("gathering_epilogue", _gathering_epilogue),
         ("reduction_space", _reduction_space), ("multi_output", _multi_output)]


# The flash-attention rule: an attention match (match_attention.py) as a whole is legal although it
# holds two anchors and a reduction between them: its kernel keeps a running max and sum per query
# row (online softmax), so no score ever needs the whole output of the first matmul. It still
# takes no opaque op and respects the size limit. Any other reduction next to an anchor is refused.
ATTENTION_RULES = [("opaque", _opaque), ("max_group_size", _size)]


def check(g, members, knobs):
    """(rule, reason) of the first rule that refuses, or None when the merge is legal."""
    rules = ATTENTION_RULES if frozenset(members) in g.attention else RULES
    for name, rule in rules:
        reason = rule(g, members, knobs)
        if reason:
            return name, reason
    return None

