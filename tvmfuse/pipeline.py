"""The compile pipeline, read as a list. One list of graph passes per fusion variant, then the
shared tail: default schedules, Relax lowering, finalize.

  import -> [variant passes: legalize / fuse] -> schedules.apply_default_schedules -> lower -> VM
"""
from __future__ import annotations

import tvm
from tvm import relax

VARIANTS = ("none", "tvm", "tvmfuse")


def graph_passes(fusion: str, knobs: dict | None = None) -> list:
    """The passes that turn a high-level Relax module into call_tir's, per fusion variant."""
    T = relax.transform
    if fusion == "none":  # every op its own kernel
        return [T.LegalizeOps(), T.AnnotateTIROpPattern()]
    if fusion == "tvm":  # TVM's stock fusion, as relax.get_default_pipeline does it
        return [T.LegalizeOps(), T.AnnotateTIROpPattern(), T.FoldConstant(), T.FuseOps(), T.FuseTIR()]
    if fusion == "tvmfuse":
        from .passes import tvmfuse_passes  # the custom fusion passes slot in here

        return tvmfuse_passes(knobs or {})
    raise ValueError(f"unknown fusion variant {fusion!r}; use one of {VARIANTS}")


def lowering_passes(target: tvm.target.Target) -> list:
    if target.kind.name == "cuda":
        from tvm.relax.backend.cuda import pipeline as P
    else:
        from tvm.relax.backend.cpu_generic import pipeline as P
    return P.dataflow_lower_passes(target) + P.finalize_passes(target)


def library_passes(target: tvm.target.Target) -> list:
    if target.kind.name == "cuda":
        from tvm.relax.backend.cuda import pipeline as P
    else:
        from tvm.relax.backend.cpu_generic import pipeline as P
    return P.library_dispatch_passes(target)
