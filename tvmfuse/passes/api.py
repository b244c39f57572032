"""Public fusion API: `tvmfuse.fuse(mod, **knobs)` and `tvmfuse.explain(mod, **knobs)`."""
from __future__ import annotations

from .fuse_groups_te import FuseGroupsTE
from .plan_fusion import DEFAULT_KNOBS


def _check_knobs(knobs):
    bad = sorted(set(knobs) - set(DEFAULT_KNOBS))
    if bad:
        raise TypeError(f"unknown fusion knob(s) {bad}; known: {sorted(DEFAULT_KNOBS)}")


def fuse(mod, **knobs):
    """The fused module: one call_tir per fused group (each one TE-built PrimFunc); ops left unfused
    stay high-level Relax ops (LegalizeOps gives them their own kernel)."""
    _check_knobs(knobs)
    return FuseGroupsTE(**knobs)(mod)


def explain(mod, **knobs) -> str:
    """Text: every fused group with the op classes inside, and every refused edge with its rule."""
    from ..pipeline import fold_constants

    _check_knobs(knobs)
    p = FuseGroupsTE(**knobs)
    p(fold_constants(mod))
    lines = []
    for k, plan in enumerate(p.report):
        g = plan.graph
        lines.append(f"block {k}: {len(g.nodes)} ops -> {len(plan.groups)} kernels")
        for j, members in enumerate(plan.groups):
            ops = ", ".join(f"{g.by_idx[i].name}:{g.by_idx[i].op}[{g.by_idx[i].cls}]" for i in members)
            lines.append(f"  group {j} ({len(members)} ops): {ops}")
        for a, b, kind, rule, reason in plan.refused:
            lines.append(f"  refused {kind} {a} + {b}: [{rule}] {reason}")
    return "\n".join(lines)
