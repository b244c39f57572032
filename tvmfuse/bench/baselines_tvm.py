"""The "vanilla tvm" peer: the workload's Relax module built the way a TVM user builds it, untouched
by tvmfuse.

Contract: `vanilla_pipeline(target)` is TVM 0.27's own default Relax pipeline for the target with
dlight's default schedules, and `build_vanilla(mod, target)` compiles `mod` with it and TVM's
default TIR pipeline, returning a `tvmfuse.build.Compiled` (for the launch counts and the runtime
the other TVM systems use). No tvmfuse pass, schedule rule, Winograd rewrite, weight prepacking
or TIR pipeline takes part.

- cuda: `relax.get_default_pipeline(target)`, which already applies dlight's GPU rules (Matmul,
  GEMV, Reduction, GeneralReduction, Fallback) after FuseOps + FuseTIR.
- llvm: TVM's cpu_generic pipeline (library dispatch, LegalizeOps, AnnotateTIROpPattern,
  FoldConstant, FuseOps, FuseTIR, then lowering) with dlight's CPU rules (GEMV, Reduction; dlight
  has no CPU Fallback or Matmul rule) applied after FuseTIR, the place the CUDA pipeline applies
  its rules. `relax.get_default_pipeline` for llvm schedules nothing: a kernel no dlight rule takes
  stays TVM's naive loop nest (one thread, no vectorization), which is what TVM gives without
  tuning. The target is the benchmark's (same mcpu and cores as every TVM system).
"""
from __future__ import annotations

import tvm
from tvm import relax

from ..target import resolve


def dlight_rules(target: tvm.target.Target) -> list:
    """dlight's default schedule rules for the target, in TVM's order."""
    from tvm.s_tir import dlight as dl

    if target.kind.name == "cuda":
        return [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()]
    return [dl.cpu.GEMV(), dl.cpu.Reduction()]


def _phases(target: tvm.target.Target) -> tuple[list, list]:
    """(passes up to and including dlight's schedules, lowering passes) of TVM's pipeline."""
    from tvm.s_tir import dlight as dl

    if target.kind.name == "cuda":
        from tvm.relax.backend.cuda import pipeline as p
    else:
        from tvm.relax.backend.cpu_generic import pipeline as p
    front = p.library_dispatch_passes(target) + p.legalize_passes(target)
    if target.kind.name != "cuda":  # the CUDA list ends with dlight already
        front = front + [dl.ApplyDefaultSchedule(*dlight_rules(target))]
    return front, p.dataflow_lower_passes(target) + p.finalize_passes(target)


def vanilla_pipeline(target) -> tvm.transform.Pass:
    """TVM's default Relax pipeline for `target` with dlight's default schedules (see the module doc)."""
    t = resolve(target)
    if t.kind.name == "cuda":
        return relax.get_default_pipeline(t)
    front, back = _phases(t)
    return tvm.transform.Sequential(front + back, name="vanilla_tvm")


def build_vanilla(mod: tvm.IRModule, target="llvm"):
    """`mod` compiled by TVM alone (vanilla_pipeline's passes, TVM's default TIR pipeline), as a
    tvmfuse Compiled whose `.mod` is the scheduled module before lowering (its call sites are the
    static launches)."""
    from ..build import Compiled, check_module

    check_module(mod)
    t = resolve(target)
    front, back = _phases(t)
    with t, tvm.transform.PassContext(opt_level=3):
        scheduled = tvm.transform.Sequential(front, name="vanilla_tvm.schedule")(mod)
        ex = tvm.compile(scheduled, target=t, relax_pipeline=tvm.transform.Sequential(back, name="vanilla_tvm.lower"),
                         tir_pipeline="default")
    return Compiled(scheduled, ex, t, "vanilla")
