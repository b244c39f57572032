"""Which CPU rewrites a build of a fuzz graph took, read from what the passes leave behind:

- "winograd": PrimFuncs of the planned graph (`Compiled.planned`, after fold_constants) with
  the `tvmfuse.winograd` attribute (passes/winograd.py marks each conv's output transform).
- "conv1x1_matmul": the spec's 1x1 convs minus the 1x1 conv2d calls left in the planned graph
  (passes/conv1x1_matmul.py replaces each one it takes by a matmul).
- "streaming_stores": PrimFuncs whose stores StreamStores rewrote (a `pragma_import_llvm` of the
  streaming-store helpers around the body, right after the pass), seen by a PassInstrument
  during tvm.compile; "stream_marked": those MarkStreamingStores marked (`tvmfuse.stream`).
"""
from __future__ import annotations

import tvm
from tvm.ir.instrument import pass_instrument
from tvm import relax, tirx

REWRITES = ("winograd", "conv1x1_matmul", "streaming_stores")


@pass_instrument
class StreamWatch:
    """Counts the functions MarkStreamingStores marks and StreamStores rewrites in one build."""

    def __init__(self):
        self.marked = 0
        self.streamed = 0

    def run_after_pass(self, mod, info):
        from ..passes.streaming_stores import STREAM_ATTR

        if info.name == "tvmfuse.MarkStreamingStores":
            self.marked += sum(1 for _, f in mod.functions_items()
                               if isinstance(f, tirx.PrimFunc) and f.attrs and STREAM_ATTR in f.attrs)
        elif info.name == "tvmfuse.StreamStores":
            self.streamed += sum(1 for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)
                                 and isinstance(f.body, tirx.AttrStmt) and f.body.attr_key == "pragma_import_llvm")


def _conv1x1_calls(mod) -> int:
    n = 0
    conv = tvm.ir.Op.get("relax.nn.conv2d")
    for _, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        calls = []
        relax.analysis.post_order_visit(func.body, lambda e: calls.append(e) if isinstance(e, relax.Call) else None)
        for c in calls:
            if c.op.same_as(conv) and [int(d) for d in c.args[1].ty.shape.values[2:]] == [1, 1]:
                n += 1
    return n


def spec_conv1x1(spec: dict) -> int:
    shapes = {i["name"]: i["shape"] for i in spec["inputs"]}
    return sum(1 for o in spec["ops"] if o["op"] == "conv2d" and shapes.get(o["args"][1], [0, 0, 0, 0])[2:] == [1, 1])


def taken(compiled, spec: dict, watch: StreamWatch) -> dict:
    """{rewrite: how many times the build `compiled` of `spec` took it} (REWRITES, plus stream_marked)."""
    from ..passes.winograd import WINOGRAD_ATTR

    planned = compiled.planned
    wino = sum(1 for _, f in planned.functions_items()
               if isinstance(f, tirx.PrimFunc) and f.attrs and WINOGRAD_ATTR in f.attrs)
    return {"winograd": wino, "conv1x1_matmul": max(0, spec_conv1x1(spec) - _conv1x1_calls(planned)),
            "streaming_stores": watch.streamed, "stream_marked": watch.marked}
