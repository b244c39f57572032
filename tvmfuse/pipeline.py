"""The compile pipeline, read as a list. Build-time constant work shared by every variant, one
list of graph passes per fusion variant, then the shared tail: default schedules, weight
pre-packing, Relax lowering, finalize.

  import -> constant_passes (fold constants, BatchNorm into weights) -> [variant passes: legalize /
         fuse] -> MarkConstantParams -> [tuned records] -> schedules.apply_default_schedules
         -> schedules.lower_math -> PrepackWeights (llvm) -> Relax lowering -> VM
"""
from __future__ import annotations

import tvm
from tvm import relax

VARIANTS = ("none", "tvm", "tvmfuse")


def constant_passes() -> list:
    """Build-time work on constants, the same for every variant (so variants still compare fusion):
    constant subgraphs evaluated (a transposed weight becomes a constant in the layout it is read),
    inference BatchNorm and other per-channel affine chains folded into conv / matmul weights."""
    from .passes.fold_batch_norm import FoldBatchNorm

    T = relax.transform
    return [T.FoldConstant(), FoldBatchNorm, T.DeadCodeElimination()]


def fold_constants(mod: tvm.IRModule) -> tvm.IRModule:
    """`constant_passes` on a module: the graph the fusion planner sees in a build (explain and
    the pictures plan on it too, so they describe the kernels the build makes)."""
    with tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential(constant_passes())(mod)


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
