"""Plan fusion groups over one dataflow block: score-ordered greedy merging (Inductor's way).

Each attention (match_attention.py) starts as one sealed group that merges with nothing else.
Candidates are producer->consumer edges between groups and sibling pairs (groups reading the same
external input, or reduction groups reading the same value of the block). The best-scored candidate that is legal (legality.py) and creates no cycle is
merged; repeat until none is left. With the knob `horizontal` on, independent elementwise groups
are then joined (fuse_horizontal.py). Refusals of the final plan are logged on `tvmfuse.fusion`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from tvm import relax

from .. import config
from .classify import REDUCTION
from .plan import Refusal
from . import fuse_horizontal, legality, match_attention, profitability
from .graph import BlockGraph
from .group_order import GroupOrder, group_order

log = logging.getLogger("tvmfuse.fusion")

DEFAULT_KNOBS = config.Knobs().as_dict()  # the knobs' defaults (tvmfuse/config.py owns them)


@dataclass
class BlockPlan:
    """The plan of one dataflow block, in terms of its BlockGraph's node indices."""
    graph: BlockGraph
    groups: list  # sorted lists of node idx, ordered by first member
    refused: list = field(default_factory=list)  # [Refusal]
    merges: dict = field(default_factory=dict)  # first member of a group -> ["edge"/"sibling", ...]
    attention: dict = field(default_factory=dict)  # first member -> match_attention.AttentionMatch


def _creates_cycle(g, group_of, ga, gb, members, order=None):
    """Merging is cyclic iff a path between them runs through a third group, or through a binding
    that is not an op (g.through: a match_cast between them must run after the one and before the
    other, so they cannot be one kernel).

    The search walks groups, not nodes, and only those before the target in a topological order of
    the groups (`order`: a GroupOrder, or group_order's dict; computed when not given): a path
    s -> d only passes groups between s and d in that order, and d cannot reach s at all when it comes after s. (Node indices
    are no bound: a path can enter a fused group at a late node and leave it from an early one.)
    Without a bound a 30-layer model's plan spent 24 s here walking to the end of the block."""
    order = group_order(g, group_of, members) if order is None else order
    for s, d in ((ga, gb), (gb, ga)):
        bound = order[d]
        if order[s] > bound:
            continue
        through = {group_of[c] for p in members[s] for c in g.through[p]} - {s}
        if d in through:
            return True
        stack = {group_of[c] for p in members[s] for c in g.users[p]} | through
        stack = [x for x in stack if x not in (s, d) and order[x] < bound]
        seen = set()
        while stack:
            gid = stack.pop()
            if gid in seen:
                continue
            seen.add(gid)
            for p in members[gid]:
                for c in g.users[p] | g.through[p]:
                    x = group_of[c]
                    if x == d:
                        return True
                    if x != gid and order[x] < bound and x not in seen:
                        stack.append(x)
    return False


def _external_args(g) -> dict:
    """node -> the block's inputs (vars no op of the block binds) it reads, computed once."""
    return {n.idx: [a for a in n.call.args if isinstance(a, relax.Var) and a not in g.node_of_var]
            for n in g.nodes}


def _candidates(g, group_of, knobs, external_args):
    seen = set()
    for n in g.nodes:
        for c in g.users[n.idx]:
            key = tuple(sorted((group_of[n.idx], group_of[c])))
            if key[0] != key[1] and key not in seen:
                seen.add(key)
                yield key, ()
    if not knobs["sibling"]:
        return
    readers = {}
    for n in g.nodes:
        for a in external_args[n.idx]:
            readers.setdefault(a, set()).add(group_of[n.idx])
    for var, gids in list(readers.items()) + list(_reduction_readers(g, group_of).items()):
        gids = sorted(gids)
        for i, x in enumerate(gids):
            for y in gids[i + 1:]:
                if (x, y) not in seen:
                    seen.add((x, y))
                    yield (x, y), (var,)


def _reduction_readers(g, group_of) -> dict:
    """{value the block computes: the groups that read it and reduce}: sibling reductions (a
    batch norm's mean and variance of a convolution's output, the sums over the batch of its
    backward) read the value once in one kernel. Only groups holding a reduction: siblings of an
    internal value that are all elementwise gain nothing a producer-consumer merge does not give,
    and joining them made transformer kernels larger and slower. Whether the two reductions
    iterate over one space is legality's to check (legality._reduction_space)."""
    reducing = {group_of[n.idx] for n in g.nodes if n.cls == REDUCTION}
    readers = {}
    for n in g.nodes:
        if group_of[n.idx] not in reducing:
            continue
        for a in n.call.args:
            if isinstance(a, relax.Var) and a in g.node_of_var:
                readers.setdefault(a, set()).add(group_of[n.idx])
    return {v: gids for v, gids in readers.items() if len(gids) > 1}


def _as_dict(knobs) -> dict:
    """Knobs (config.Knobs), a dict of some knobs, or None -> every knob's value."""
    if isinstance(knobs, config.Knobs):
        return knobs.as_dict()
    return config.knobs(**(knobs or {})).as_dict()


def plan(block, outputs, knobs=None, block_index: int = 0) -> BlockPlan:
    knobs = _as_dict(knobs)
    g = BlockGraph(block, outputs)
    group_of = {n.idx: n.idx for n in g.nodes}
    members = {n.idx: {n.idx} for n in g.nodes}
    how = {n.idx: [] for n in g.nodes}  # group -> merge kinds, in order
    sealed = _seed_attention(g, group_of, members, how, knobs)
    external_args = _external_args(g)
    # score and legality are functions of the two groups' members only: cached per pair, and
    # dropped for the two groups a merge changes (the cycle check depends on every group: not cached)
    scores, legal = {}, {}
    order = GroupOrder(g, group_of, members)  # kept topological as groups merge
    while True:
        scored = []
        for (x, y), shared in _candidates(g, group_of, knobs, external_args):
            if x in sealed or y in sealed:
                continue
            key = (x, y, shared)
            if key not in scores:
                scores[key] = profitability.score(g, members[x], members[y], knobs, shared)[0]
            if scores[key] is not None:
                scored.append((scores[key], x, y, "sibling" if shared else "edge"))
        merged = False
        for s, x, y, kind in sorted(scored, key=lambda t: (-t[0], t[1], t[2])):
            if (x, y) not in legal:
                legal[(x, y)] = not legality.check(g, members[x] | members[y], knobs)
            if not legal[(x, y)] or _creates_cycle(g, group_of, x, y, members, order):
                continue
            order.merge(x, y)
            members[x] |= members.pop(y)
            how[x] += [kind] + how.pop(y)
            for i in members[x]:
                group_of[i] = x
            scores = {k: v for k, v in scores.items() if not {x, y} & {k[0], k[1]}}
            legal = {k: v for k, v in legal.items() if not {x, y} & set(k)}
            merged = True
            break
        if not merged:
            break
    joined = []
    if knobs["horizontal"]:  # independent elementwise groups as one kernel (fuse_horizontal.py)
        joined = fuse_horizontal.join(g, group_of, members, how, order, sealed, knobs, block_index, _creates_cycle)
    p = BlockPlan(g, [sorted(m) for m in sorted(members.values(), key=min)],
                  merges={min(members[x]): how[x] for x in members},
                  attention={min(members[x]): m for x, m in sealed.items()})
    _record_refusals(p, group_of, members, knobs, block_index, sealed)
    p.refused += joined
    return p


def _seed_attention(g, group_of, members, how, knobs) -> dict:
    """Each attention (match_attention.find) starts as one group, sealed: legal as a whole under
    legality's flash-attention rule, and merged with nothing else. -> {group id: match}."""
    if not knobs.get("attention", True):
        return {}
    matches, _misses = match_attention.find(g)
    g.attention = [frozenset(m.members) for m in matches]
    sealed = {}
    for m in matches:
        if legality.check(g, m.members, knobs):  # e.g. more ops than max_group_size
            continue
        x = min(m.members)
        for i in m.members - {x}:
            members[x] |= members.pop(i)
            how.pop(i)
        for i in m.members:
            group_of[i] = x
        how[x] = ["attention"]
        sealed[x] = m
    return sealed


def _record_refusals(p, group_of, members, knobs, block_index, sealed=()):
    g = p.graph
    order = group_order(g, group_of, members)
    for (x, y), shared in _candidates(g, group_of, knobs, _external_args(g)):
        res = ("attention", "a flash-attention group takes no other ops") if x in sealed or y in sealed \
            else legality.check(g, members[x] | members[y], knobs)
        if res is None and _creates_cycle(g, group_of, x, y, members, order):
            res = ("cycle", "merging would create a cycle through another group")
        if res is None:
            _, why = profitability.score(g, members[x], members[y], knobs, shared)
            res = ("profitability", why) if why else None
        if res is None:
            continue
        names = lambda gid: [g.by_idx[i].name for i in sorted(members[gid])]
        kind = "sibling" if shared else "edge"
        p.refused.append(Refusal(block_index, tuple(names(x)), tuple(names(y)), kind, res[0], res[1]))
        log.info("refused %s %s + %s: [%s] %s", kind, names(x), names(y), res[0], res[1])
