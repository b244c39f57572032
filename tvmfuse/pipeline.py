"""The compile pipeline, read as a list. One list of graph passes per fusion variant, then the
shared tail: default schedules, Relax lowering, finalize.

  import -> [variant passes: legalize / fuse] -> [tuned records] -> schedules.apply_default_schedules
         -> schedules.lower_math -> Relax lowering -> VM
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


def _backend(target: tvm.target.Target):
    """TVM's per-backend pass lists (relax.pipeline.dataflow_lower_passes is broken in 0.27)."""
    if target.kind.name == "cuda":
        from tvm.relax.backend.cuda import pipeline
    else:
        from tvm.relax.backend.cpu_generic import pipeline
    return pipeline


def lowering_passes(target: tvm.target.Target) -> list:
    P = _backend(target)
    return P.dataflow_lower_passes(target) + P.finalize_passes(target)


def library_passes(target: tvm.target.Target) -> list:
    return _backend(target).library_dispatch_passes(target)
