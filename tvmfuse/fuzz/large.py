"""Large-shape fuzz graphs (`scripts/fuzz.py --shapes large`): each graph holds one or two anchors
that the CPU rewrites take, mixed with the ordinary vocabulary (ops.py):

- "winograd": conv2d 3x3, stride 1, padding 1, batch 1, float32, on a map of 20x20 and up
  (passes/winograd.py; the weight is an input, so the map must be large enough for the per-call
  weight transform to pay: `runtime_intensity` >= 16 from 20x20 on for F(2x2), 24x24 for F(4x4)).
- "conv1x1": a 1x1 conv whose output rows are 3, 4, 5 or 9 wide (passes/conv1x1_matmul.py: these
  fill under 70% of an AVX-512 conv tile's 8 columns); stride 1 on a new small input, or a
  stride that brings an existing 4-d value down to such a width.
- "stream": an elementwise op on a tensor of about 5 MiB (passes/streaming_stores.py), which
  with `CAMPAIGN_CPU` (thresholds at 1% of the last-level cache: this host reports 480 MiB of
  L3, so 4.8 MiB) is over the streaming threshold. A Winograd anchor sometimes gets a map that
  large too, so its output transform streams.

The spec carries what its check needs (spec.py, check.py): "cpu", CPU-table overrides for every
build of the graph (the streaming thresholds), and "reference_cpu", overrides for the unfused
reference only: the three rewrites off, so stock fusion's and tvmfuse's builds, rewritten, are
compared with a build that is not (a wrong Winograd tile is not hidden by the same wrong tile
in the reference).
"""
from __future__ import annotations

import contextlib

from .gen import add_ops, finish
from .graph import Graph, _Reject

CAMPAIGN_CPU = {"stream_working_set_pct": 1, "stream_output_pct": 1}  # 1% of the LLC (4.8 MiB here)
PLAIN_CPU = {"winograd": 0, "conv1x1_matmul_fill": 0, "streaming_stores": 0}  # no rewrite fires
LARGE_ELEMS = 1 << 19  # per new input (x4 per result): a 5 MiB stream tensor is 1.3 M floats
STREAM_SHAPES = ((1, 16, 280, 288), (1, 8, 400, 400), (1280, 1024), (4, 320, 1024), (2, 48, 112, 128))
WINO_MAPS = (20, 24, 28, 31, 32, 40)
SMALL_WIDTHS = (3, 4, 5, 9)  # 1x1 conv output widths that run as a matmul on AVX-512
ANCHORS = ("winograd", "conv1x1", "stream")
# the anchor of each draw: a Winograd graph costs 3-7 s to check (its transforms build slowly),
# a 1x1 or stream one about 1 s, so a fifth of the draws are Winograd
ANCHOR_DRAW = ("conv1x1", "stream", "winograd", "conv1x1", "stream")


@contextlib.contextmanager
def cpu_overrides(values: dict | None):
    """Within: the CPU schedule table with `values` over it, scoped by the setting's one owner
    (`tvmfuse.config.override(cpu=...)`, what TVMFUSE_CPU_<KEY> does for a whole process)."""
    from .. import config

    with config.override(cpu=values or None):
        yield


def _winograd(g: Graph):
    big = g.src.int(0, 31) == 31  # one in 32: a map whose output is over the streaming threshold (~30 s a graph)
    c, o = g.pick((4, 8, 12, 16)), g.pick((8, 16, 32))  # not 3 or 5: minutes in TIR lowering (stock)
    if big:  # 1.3 M outputs (a 400x400 map with 8 outputs took minutes to build: TIR's UnrollLoop)
        o = g.pick((16, 32))
        h, w = (288, 280) if o == 16 else (200, 200)
    else:
        h, w = g.pick(WINO_MAPS), g.pick(WINO_MAPS)
    x = g.new_input((1, c, h, w))
    wt = g.new_input((o, c, 3, 3))
    return g.emit("conv2d", [x, wt], (1, o, h, w), 9 * c * x.bound * wt.bound, strides=[1, 1], padding=[1, 1],
                  groups=1)


def _conv1x1(g: Graph):
    four = [v for v in g.vals if len(v.shape) == 4 and v.dtype == "float32" and min(v.shape[2:]) >= 6]
    if four and g.flag():  # a strided 1x1 conv that brings an existing map down to a small width
        x = g.pick(four)
        h, w = x.shape[2:]
        fits = [s for s in range(2, 9) if (w - 1) // s + 1 in SMALL_WIDTHS]
        if not fits:
            raise _Reject("no stride gives a small width")
        s = g.pick(fits)
    else:
        hw = g.pick(SMALL_WIDTHS)
        x, s = g.new_input((1, g.pick((16, 32, 64)), hw, hw)), 1
    c, (h, w) = x.shape[1], x.shape[2:]
    wt = g.new_input((g.pick((16, 32, 64)), c, 1, 1))
    shape = (1, wt.shape[0], (h - 1) // s + 1, (w - 1) // s + 1)
    return g.emit("conv2d", [x, wt], shape, c * x.bound * wt.bound, strides=[s, s], padding=[0, 0], groups=1)


def _stream(g: Graph):
    x = g.new_input(g.pick(STREAM_SHAPES))
    op = g.pick(("relu", "tanh", "sigmoid", "add", "multiply"))
    if op in ("add", "multiply"):
        b = g.new_input(x.shape[-1:]) if g.flag() else g.new_input(x.shape)  # a bias row, or a second tensor
        return g.emit(op, [x, b], x.shape, x.bound + b.bound if op == "add" else x.bound * b.bound)
    return g.emit(op, [x], x.shape, 1.0 if op != "relu" else x.bound)


LARGE_GENERATORS = {"winograd": _winograd, "conv1x1": _conv1x1, "stream": _stream}


def generate_large(src, max_ops: int = 2) -> dict:
    """One large-shape graph spec: float32, 1 or 2 anchors (ANCHORS), then 0..max_ops ops of the
    vocabulary on any value; "cpu" and "reference_cpu" as above."""
    g = Graph(src, "float32", max_elems=LARGE_ELEMS)
    for _ in range(src.int(1, 2)):
        for _attempt in range(4):
            mark = (len(g.inputs), len(g.ops), len(g.vals))
            try:
                LARGE_GENERATORS[g.pick(ANCHOR_DRAW)](g)
                break
            except _Reject:
                del g.inputs[mark[0]:], g.ops[mark[1]:], g.vals[mark[2]:]
    add_ops(g, src.int(0, max_ops))
    spec = finish(g)
    spec["cpu"], spec["reference_cpu"] = dict(CAMPAIGN_CPU), dict(PLAIN_CPU)
    return spec
