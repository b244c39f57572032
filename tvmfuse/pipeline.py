"""The compile pipeline, read as a list: the phases every build runs, in order, for every variant.

  phase           what happens                                                 where
  normalize       library dispatch for the target (the input is checked first)  TVM's backend lists
  fold_constants  constants folded; explicit zero pads into the conv's padding; passes/fold_padding.py,
                  BatchNorm and other per-channel affine chains folded into    passes/fold_batch_norm.py
                  conv/matmul weights; constant operands cut to the axes they  shrink_constant_operands.py
                  vary along; conv1d as im2col + matmul; 1x1 convs on small    passes/conv1d_matmul.py,
                  maps as matmuls over pixels, 3x3 stride-1 convs as           conv1x1_matmul.py, winograd.py
                  Winograd F(4x4) / F(2x2) (llvm) (every variant alike; the conv
                  rewrites only in float32 builds)
  precision       with a half `dtype` (float16 / bfloat16): constants cast once, passes/cast_to_half.py
                  activations in the half type, matmul/conv accumulating and
                  softmax, norms, sums computed in float32; main's float32
                  inputs and outputs kept (nothing to do without a dtype)
  fuse            the variant: "none" = every op its own kernel (LegalizeOps);  fusion/fuse_groups_te.py,
                  "tvm" = TVM's FuseOps + FuseTIR; "tvmfuse" = classify ops,     plan_fusion.py, legality.py,
                  plan groups, lower each group to ONE TE compute (the Plan      profitability.py,
                  is stamped on the module); Winograd output + epilogue as one   fusion/te_compose.py,
                  kernel                                                         fuse_winograd_epilogue.py
  mark_constants  which PrimFunc parameters are constant weights                passes/prepack_weights.py
  apply_tuning    MetaSchedule records (tuning_logs/) that beat the default     tuning/apply.py
  schedule        default schedule rules per target (decline -> next rule,      schedules/
                  fallback last), FLOPs stamped, vector math lowered
  in_place        an update graph's new parameter values written into the      passes/update_in_place.py
                  parameters (main's `tvmfuse.updates`; nothing without it)
  prepack         packing of constant weights moved to build time (llvm)        passes/prepack_weights.py
  codegen         Relax lowering to the VM, tvm.compile (shape functions marked TVM's backend lists,
                  noalias: one unmarked function costs the whole LLVM module    passes/mark_noalias.py
                  its alias info)

Each phase is one `tvm.transform.Sequential` named `tvmfuse.<phase>`, so TVM's PassInstruments
(timing, printing, tvmfuse.debug's dumps, a user's own) see the phases and every pass inside them.
`run` runs them on a module under the caller's PassContext and target; `tvmfuse.build`,
`tvmfuse.prepare`, `explain`/`viz` (up to "fuse") and the tuning tasks (up to "mark_constants",
the module apply_tuning queries) all go through it. The target is resolved once, by the caller.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import tvm
from tvm import relax

from . import config
from .errors import ConfigError
from .install import install_once
from .fusion.plan import Plan
from .relax_utils import GRAPH_LOCK
from .target import resolve
from .tuning.apply import apply_logs

VARIANTS = ("none", "tvm", "tvmfuse")
_BUILD_TE = ("normalize", "fold_constants", "precision", "fuse")  # phases that build TE from Relax ops (GRAPH_LOCK)
PHASES = ("normalize", "fold_constants", "precision", "fuse", "mark_constants", "apply_tuning", "schedule", "in_place",
          "prepack", "codegen")


@dataclass(frozen=True)
class Options:
    """What one build is asked for. `target` is a resolved tvm.target.Target. Make one with
    `for_target`: the one place the knobs of a build, a tuning run, explain and viz are decided."""
    target: tvm.target.Target
    fusion: str = "tvm"
    knobs: config.Knobs = config.Knobs()
    tuning_logs: str | None = None
    dtype: str | None = None  # compute in "float16" / "bfloat16" (phase "precision"); None: as imported

    @classmethod
    def for_target(cls, target, fusion: str = "tvm", tuning_logs: str | None = None, dtype: str | None = None,
                   **knobs) -> "Options":
        """Checked options: `target` resolved (once: a Target is kept as it is), the variant known,
        the dtype known, the knobs known and typed, over the target's knob defaults (config.TARGET_DEFAULTS)."""
        t = resolve(target)
        return cls(t, check_variant(fusion), config.knobs(t, **knobs), tuning_logs, check_dtype(dtype))


@dataclass
class Stages:
    """What `run` hands back: the module the planner saw, the plan, and the last phase's module."""
    planned: tvm.IRModule | None = None  # after fold_constants and precision: the graph fusion planned on
    plan: Plan | None = None  # tvmfuse's plan (None for "none" / "tvm")
    mod: tvm.IRModule | None = None  # after the last phase run


def check_variant(fusion: str) -> str:
    if fusion not in VARIANTS:
        raise ValueError(f"unknown fusion variant {fusion!r}; use one of {VARIANTS}")
    return fusion


DTYPES = (None, "float16", "bfloat16")


def check_dtype(dtype: str | None) -> str | None:
    """`dtype` if a build can compute in it: None (as imported), "float16" or "bfloat16"."""
    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}; use one of {DTYPES}")
    return dtype


# ------------------------------------------------------------------------------------ phases
def constant_passes() -> list:
    """Build-time work on constants, the same for every variant (so variants still compare fusion):
    constant subgraphs evaluated (a transposed weight becomes a constant in the layout it is read),
    explicit zero pads folded into the conv they feed, inference BatchNorm and other per-channel
    affine chains folded into conv / matmul weights, constant operands of elementwise ops cut to
    the axes they vary along (an all-zero attention mask dropped)."""
    from .passes.fold_batch_norm import FoldBatchNorm
    from .passes.fold_constants import fold_all
    from .passes.fold_padding import FoldExplicitPadding
    from .passes.shrink_constant_operands import ShrinkConstantOperands

    return [fold_all(), FoldExplicitPadding, FoldBatchNorm, ShrinkConstantOperands,
            relax.transform.DeadCodeElimination()]


def graph_passes(fusion: str, knobs: config.Knobs | None = None) -> list:
    """The passes that turn a high-level Relax module into call_tir's, per fusion variant."""
    T = relax.transform
    if fusion == "none":  # every op its own kernel
        return [T.LegalizeOps(), T.AnnotateTIROpPattern()]
    if fusion == "tvm":  # TVM's stock fusion, as relax.get_default_pipeline does it
        return [T.LegalizeOps(), T.AnnotateTIROpPattern(), T.FoldConstant(), T.FuseOps(), T.FuseTIR()]
    if fusion == "tvmfuse":
        from .passes import tvmfuse_passes  # the custom fusion passes slot in here

        return tvmfuse_passes(knobs if knobs is not None else config.knobs())
    raise ValueError(f"unknown fusion variant {fusion!r}; use one of {VARIANTS}")


def _backend(target: tvm.target.Target):
    """TVM's per-backend pass lists (relax.pipeline.dataflow_lower_passes is broken in 0.27)."""
    if target.kind.name == "cuda":
        from tvm.relax.backend.cuda import pipeline
    else:
        from tvm.relax.backend.cpu_generic import pipeline
    return pipeline


def library_passes(target: tvm.target.Target) -> list:
    return _backend(target).library_dispatch_passes(target)


def lowering_passes(target: tvm.target.Target) -> list:
    P = _backend(target)
    return P.dataflow_lower_passes(target) + P.finalize_passes(target)


def _function_pass(name, fn):
    """A module pass around a plain function of the module (so instruments see it)."""
    return tvm.transform.module_pass(lambda mod, _ctx: fn(mod), opt_level=0, name=name)


def phase_passes(phase: str, opts: Options) -> list:
    """The passes of one phase, for one build."""
    import schedules

    from .passes.prepack_weights import MarkConstantParams, PrepackWeights

    t = opts.target
    if phase == "normalize":
        return library_passes(t)
    if phase == "precision":
        from .passes.cast_to_half import CastToHalf

        return [CastToHalf(opts.dtype)] if opts.dtype else []
    if phase == "fold_constants":
        if t.kind.name != "llvm" or opts.dtype:  # the conv rewrites are float32 transforms
            return constant_passes()
        from .passes.conv1d_matmul import Conv1dAsMatmul
        from .passes.conv1x1_matmul import conv1x1_as_matmul
        from .passes.winograd import winograd_3x3

        table = schedules.targets.cpu_table(t)
        return constant_passes() + [Conv1dAsMatmul, conv1x1_as_matmul(table), winograd_3x3(table)]
    if phase == "fuse":
        return graph_passes(opts.fusion, opts.knobs)
    if phase == "mark_constants":
        return [MarkConstantParams]
    if phase == "apply_tuning":
        if not opts.tuning_logs:
            return []
        return [_function_pass("ApplyTuningLogs", lambda m: apply_logs(m, t, opts.tuning_logs))]
    if phase == "schedule":
        from .runtime.roofline import stamp_flops

        return [_function_pass("ApplyDefaultSchedules", lambda m: schedules.apply_default_schedules(m, t)),
                _function_pass("StampFlops", stamp_flops),  # before lower_math: Schedule() rejects its Lets
                _function_pass("LowerMath", lambda m: schedules.lower_math(m, t))]
    if phase == "in_place":
        from .passes.update_in_place import UpdateInPlace

        return [UpdateInPlace]
    if phase == "prepack":
        return [PrepackWeights] if t.kind.name == "llvm" else []
    if phase == "codegen":
        from .passes.mark_noalias import MarkNoAlias

        if t.kind.name != "llvm":
            return lowering_passes(t) + [MarkNoAlias]
        from .passes.streaming_stores import MarkStreamingStores
        from .runtime.roofline import last_level_cache_bytes

        return [MarkStreamingStores(schedules.targets.cpu_table(t), last_level_cache_bytes())] + \
            lowering_passes(t) + [MarkNoAlias]
    raise ValueError(f"unknown phase {phase!r}; the phases are {PHASES}")


def phase(name: str, opts: Options) -> tvm.transform.Pass:
    """One phase as a named Sequential (`tvmfuse.<name>`)."""
    return tvm.transform.Sequential(phase_passes(name, opts), name=f"tvmfuse.{name}")


def run(mod: tvm.IRModule, opts: Options, until: str = "prepack") -> Stages:
    """Run the phases from "normalize" through `until` (not "codegen": tvm.compile does that, see
    build.py) under the caller's PassContext and target scope."""
    if until not in PHASES[:-1]:
        raise ValueError(f"run() stops at one of {PHASES[:-1]}, not {until!r}")
    install_once()  # before fold_constants runs its first kernel (tvmfuse/install.py)
    out = Stages()
    for name in PHASES[: PHASES.index(until) + 1]:
        with GRAPH_LOCK if name in _BUILD_TE else contextlib.nullcontext(), \
                config.override(strict=opts.knobs.strict):  # the rules and passes read it from the scope
            mod = phase(name, opts)(mod)
        if name in ("fold_constants", "precision"):
            out.planned = mod  # the graph fusion plans on
        elif name == "fuse":
            out.plan = Plan.of(mod)
    out.mod = mod
    return out


def fold_constants(mod: tvm.IRModule, target="llvm") -> tvm.IRModule:
    """The graph the fusion planner sees in a build of `mod` (normalize + fold_constants)."""
    opts = Options.for_target(target, "tvmfuse")
    with opts.target, tvm.transform.PassContext(opt_level=3):
        return run(mod, opts, until="fold_constants").planned


def plan(mod: tvm.IRModule, target="llvm", **knobs) -> Stages:
    """Run the pipeline through "fuse" for the tvmfuse variant: the planned graph and its Plan,
    without scheduling or compiling (what explain and viz show for a module not built). `knobs`
    as for tvmfuse.build, over the target's defaults (Options.for_target)."""
    opts = Options.for_target(target, "tvmfuse", **knobs)
    with opts.target, tvm.transform.PassContext(opt_level=3):
        return run(mod, opts, until="fuse")
