"""Public fusion API: `tvmfuse.fuse(mod, **knobs)` and `tvmfuse.explain(mod_or_compiled, target, **knobs)`."""
from __future__ import annotations

from .. import config
from ..frontends import torch_records
from .fuse_groups_te import FuseGroupsTE


def fuse(mod, **knobs):
    """The fused module: one call_tir per fused group (each one TE-built PrimFunc); ops left unfused
    stay high-level Relax ops (LegalizeOps gives them their own kernel). Its plan: `Plan.of(result)`."""
    return FuseGroupsTE(knobs=config.knobs(**knobs))(mod)


def plan_of(mod_or_compiled, target="llvm", **knobs):
    """(planned graph, Plan): a build's own (a `Compiled` of the tvmfuse variant), else the plan a
    tvmfuse build of the module for `target` makes (the pipeline through its fuse phase, run once,
    with the knobs such a build has: pipeline.Options.for_target)."""
    from ..build import Compiled
    from ..pipeline import plan

    if isinstance(mod_or_compiled, Compiled):
        if knobs:
            raise TypeError("explain/viz of a built module take no knobs: it has its own plan")
        if mod_or_compiled.plan is None:
            raise ValueError(f"this module was built with fusion={mod_or_compiled.fusion!r}: only a "
                             "fusion='tvmfuse' build has a tvmfuse plan")
        return mod_or_compiled.planned, mod_or_compiled.plan
    stages = plan(mod_or_compiled, target, **knobs)
    return stages.planned, stages.plan


def explain(mod_or_compiled, target="llvm", **knobs) -> str:
    """Text: every fused group with the op classes inside, every group TE lowering refused, and every
    refused merge with its rule. Of a `Compiled`, its own plan; of a module, the plan of a tvmfuse
    build for `target`. Of a torch model (`torch.compile(model, backend="tvmfuse")` or the model
    itself, after a call) or a compiled function (`torch.compile(opt.step, backend="tvmfuse")`): every
    graph dynamo gave the backend, compiled by tvmfuse or eager with its reason (frontends/torch_records.py)."""
    if callable(getattr(mod_or_compiled, "modules", None)) or hasattr(mod_or_compiled, "_torchdynamo_orig_callable"):
        # a torch.nn.Module, torch.compile's wrapper of one, or a compiled function (an optimizer's step)
        if knobs:
            raise TypeError("explain of a torch model takes no knobs: it reports what the backend did")
        return torch_records.report(mod_or_compiled)
    return plan_of(mod_or_compiled, target, **knobs)[1].explain()
