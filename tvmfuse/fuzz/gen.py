"""Random well-typed graphs over the ops fusion handles, as specs (spec.py).

Every choice goes through a `Source` with one method, `int(lo, hi)` (inclusive):
`RandomSource(seed)` draws from `random.Random(seed)` (the fixed-seed CI slice, campaigns), and
`HypothesisSource(data)` draws the same choices from hypothesis (so a failing graph shrinks: lower
numbers mean fewer ops, the first op kind, the first operand, size-1 dims, no extra outputs).

The graph itself (values, bounds, limits) is graph.py's `Graph`; each op kind's generator is in
ops.py (shapes="small") or large.py (shapes="large": the anchors of the CPU rewrites).
"""
from __future__ import annotations

import random

from . import ops as gen_ops
from .graph import (ALL_OPS, BINARY, DIMS, DTYPES, KINDS, LAYOUT, LIMIT, MAX_ELEMS, OTHER, REDUCE, SIZED_OPS,
                    UNARY, Graph, Val, _Reject, broadcast_shape, exp_bound)

__all__ = ["generate", "add_ops", "RandomSource", "HypothesisSource", "ALL_OPS", "BINARY", "DIMS", "DTYPES",
           "KINDS", "LAYOUT", "LIMIT", "MAX_ELEMS", "OTHER", "REDUCE", "SIZED_OPS", "UNARY", "Graph", "Val",
           "broadcast_shape", "exp_bound"]


class RandomSource:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)


class HypothesisSource:
    def __init__(self, data):
        from hypothesis import strategies as st

        self.data, self.st = data, st

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(self.st.integers(lo, hi))


def add_ops(g: Graph, count: int) -> None:
    """`count` ops of the vocabulary (ops.py), each of a random kind on random operands of `g`."""
    for _ in range(count):
        for _attempt in range(8):
            kind = g.pick(KINDS)
            mark = (len(g.inputs), len(g.ops), len(g.vals))
            try:
                gen_ops.GENERATORS[kind](g)
                break
            except _Reject:
                del g.inputs[mark[0]:], g.ops[mark[1]:], g.vals[mark[2]:]
        else:
            gen_ops.GENERATORS["tanh"](g)


def finish(g: Graph) -> dict:
    """`g`'s spec: its leaves as outputs, sometimes an intermediate as an extra output, and for a
    quarter of the graphs non-default tvmfuse knobs ("knobs")."""
    src = g.src
    extra = [g.pick([o["name"] for o in g.ops]) for _ in range(src.int(0, 1))]
    spec = g.spec(extra)
    if src.int(0, 3) == 3:  # a quarter of the graphs fuse under non-default knobs
        spec["knobs"] = {"allow_recompute": g.flag(), "multi_output": g.flag(), "stitch_reductions": g.flag(),
                         "sibling": g.flag(), "max_group_size": g.pick((2, 3, 64))}
    return spec


def generate(src, max_ops: int = 8, dtypes=DTYPES) -> dict:
    """One random graph spec: 1-2 inputs, 1..max_ops ops (composites count once), leaves as outputs,
    sometimes an intermediate as an extra output, sometimes tvmfuse knobs ("knobs")."""
    g = Graph(src, dtypes[src.int(0, len(dtypes) - 1)])
    for _ in range(src.int(1, 2)):
        g.new_input(g.shape())
    add_ops(g, src.int(1, max_ops))
    spec = finish(g)
    lead = [i["shape"][0] for i in spec["inputs"] if len(i["shape"]) >= 2]
    # two thirds of the graphs whose ops keep no sizes in their attributes (a quarter of all): the leading
    # dim symbolic, when its size is nowhere else in the inputs (a dim equal to it by coincidence
    # would have to stay equal to it) and is not the broadcast size 1
    if src.int(0, 2) >= 1 and lead and not SIZED_OPS & {o["op"] for o in spec["ops"]}:
        n = lead[0]
        elsewhere = [d for i in spec["inputs"] for k, d in enumerate(i["shape"]) if d == n and not (
            k == 0 and len(i["shape"]) >= 2)]
        if n > 1 and not elsewhere:
            spec["symbolic"] = {"n": n, "sizes": [n, n + 3]}  # a second, ragged size from the same build
    return spec


