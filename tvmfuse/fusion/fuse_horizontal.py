"""Horizontal fusion: independent elementwise groups (and column sums) of one dataflow block joined
into one kernel, and sibling groups around a compute-heavy op (a convolution's or a linear layer's
input and weight gradients, which read the same output gradient) joined into one launch.

An optimizer step over N parameters is N independent elementwise chains (one per parameter: its
gradient, its state and its update), which the planner's vertical and sibling merges leave as N
groups, N kernels. This pass joins such groups into one group: one PrimFunc whose body is the
groups' loop nests side by side (each keeps its own iteration space and its own TE computes, so
the math is unchanged; the CPU schedule's Injective rule parallelises and vectorises each nest),
one launch instead of N. A backward graph's bias and norm gradients are likewise independent
column sums over the batch (an MLP's second bias gradient and its LayerNorm's dgamma and dbeta).

Contract: `join(g, group_of, members, how, order, sealed, knobs, block_index, cyclic)` runs inside
plan_fusion.plan after its merge loop, when the knob `horizontal` is on (config.py: off by default,
on for the torch backend's training and update graphs, frontends/torch_train.py and
torch_update.py). It takes the planner's live groups and merges in place (members, group_of, how:
"horizontal", the GroupOrder `order`); it returns the refusals it logged ([plan.Refusal], kind
"horizontal"). A group joins only when
  - every op of it is elementwise or broadcast, or a column reduction (one that keeps the last
    axis: a bias gradient's or a norm's dgamma's sum over the batch) or the reshape of one's output;
    a row reduction, gather or layout op is never joined (rule "not_elementwise"), nor a sealed
    attention group. Joined column reductions must share one iteration space (legality's rule
    "reduction_space"), so cpu.ColumnReduction schedules them as siblings of one kernel;
  - or it holds a compute-heavy op (matmul, conv: a group legal on its own, its epilogue with it)
    and reads a value the joined group reads too (rule "no_shared_input" otherwise; an elementwise
    group may join one that holds a compute-heavy op without: a train-mode BatchNorm's step counters
    beside a convolution). Such nests are scheduled apart and run as one launch
    (schedules/nests.py: no rule schedules two anchors in one nest), so the legality check below
    covers only the joined groups without a compute-heavy op;
  - no path runs between it and the joined group in either direction, directly or through another
    group (rule "dependent": one would have to wait for the other; `cyclic` is the planner's
    cycle check, the direct edges are checked here);
  - the joined group stays within `horizontal_max_ops` ops (rule "horizontal_max_ops"; the joined
    nests are independent, so `max_group_size`, a bound on one fused nest, does not apply), and
    legality.check passes on it otherwise (multi_output on, no opaque op).
Groups are visited in the block's topological group order; each joins the first open horizontal
group that takes it, or opens a new one. A horizontal group of one member is no merge at all.
Every refusal is logged on `tvmfuse.fusion` with its rule.
"""
from __future__ import annotations

import logging

from tvm import relax

from . import legality
from .classify import BROADCAST, COMPUTE, ELEMENTWISE, REDUCTION
from .plan import Refusal

log = logging.getLogger("tvmfuse.fusion")

JOINABLE = (ELEMENTWISE, BROADCAST)


def _not_elementwise(g, group) -> str | None:
    for i in sorted(group):
        n = g.by_idx[i]
        if n.cls == REDUCTION and _column_reduction(n) or legality.relabels_a_reduction(g, group, n):
            continue
        if n.cls not in JOINABLE:
            return f"{n.name} ({n.op}) is {n.cls}, not elementwise"
    return None


def _anchored(g, group) -> bool:
    """Whether the group holds a compute-heavy op (matmul, conv)."""
    return any(g.by_idx[i].cls == COMPUTE for i in group)


def _reads(g, group) -> set:
    """The values the group's ops read from outside it."""
    made = {v for i in group for v in [g.by_idx[i].var] + [a.var for a in g.by_idx[i].aliases]}
    return {a for i in group for a in g.by_idx[i].call.args if isinstance(a, relax.Var) and a not in made}


def _column_reduction(n) -> bool:
    """Whether reduction `n` folds axes other than the trailing ones, keeping the last (a sum over
    the batch: a bias gradient, a norm's dgamma): such sums of one iteration space join as siblings
    of one column-reduction kernel."""
    space = n.row_space()
    return space is not None and not space[1]


def _direct_edge(g, a, b) -> bool:
    return any(g.users[p] & b for p in a) or any(g.users[p] & a for p in b) or \
        any(g.through[p] & b for p in a) or any(g.through[p] & a for p in b)


def _why_not(g, group_of, members, plain, x, y, order, knobs, cyclic):
    """(rule, reason) refusing to join group y into horizontal group x, or None. `plain`: the
    members of each horizontal group's groups without a compute-heavy op."""
    merged = members[x] | members[y]
    if len(merged) > knobs["horizontal_max_ops"]:
        return "horizontal_max_ops", (f"the horizontal group would hold {len(merged)} ops > "
                                      f"horizontal_max_ops={knobs['horizontal_max_ops']}")
    if _anchored(g, members[y]) and not _reads(g, members[x]) & _reads(g, members[y]):
        return "no_shared_input", ("a group with a compute-heavy op joins only a group that reads one of its "
                                   "inputs (its sibling)")
    if _direct_edge(g, members[x], members[y]) or cyclic(g, group_of, x, y, members, order):
        return "dependent", "a path runs between the two groups: one must finish before the other starts"
    if not plain[x] or not plain[y]:  # nothing new beside a group legal on its own
        return None
    checked = plain[x] | plain[y]
    return legality.check(g, checked, {**knobs, "max_group_size": max(knobs["max_group_size"], len(checked))})


def join(g, group_of, members, how, order, sealed, knobs, block_index, cyclic) -> list:
    """Join independent elementwise groups (see the module docstring); -> the refusals."""
    refused = []

    def names(group):
        return tuple(g.by_idx[i].name for i in sorted(group))

    def refuse(a, b, rule, reason):
        refused.append(Refusal(block_index, names(a), names(b), "horizontal", rule, reason))
        log.info("refused horizontal %s + %s: [%s] %s", list(names(a)), list(names(b)), rule, reason)

    candidates = []
    for gid in sorted(members, key=lambda x: order[x]):
        why = "a flash-attention group takes no other ops" if gid in sealed else \
            None if _anchored(g, members[gid]) else _not_elementwise(g, members[gid])
        if why:
            if len(members) > 1:
                refuse(members[gid], set(), "not_elementwise", why)
            continue
        candidates.append(gid)
    if len(candidates) < 2:
        return refused
    bins = []  # the horizontal groups open so far (group ids)
    plain = {gid: set() if _anchored(g, members[gid]) else set(members[gid]) for gid in candidates}
    for gid in candidates:
        for x in bins:
            res = _why_not(g, group_of, members, plain, x, gid, order, knobs, cyclic)
            if res is None:
                order.merge(x, gid)
                plain[x] |= plain.pop(gid)
                members[x] |= members.pop(gid)
                how[x] += ["horizontal"] + how.pop(gid)
                for i in members[x]:
                    group_of[i] = x
                break
            refuse(members[x], members[gid], *res)
        else:
            bins.append(gid)
    return refused
