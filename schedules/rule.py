"""The schedule-rule protocol: `apply(func, target) -> PrimFunc | None`.

A rule that does not fit a function declines by returning None, after checking its own
preconditions. A TVM `ScheduleError` (a schedule primitive that refused: compute_inline of a block
that cannot be inlined, a split that does not divide) is also a decline: the next rule gets the
function. Any other exception is a bug in the rule: it is logged at WARNING with the rule's and the
kernel's names, and re-raised when the `strict` knob is on (CI and the tests set it); without it
the next rule gets the function, so a user's build still finishes. A schedule that is not
well-formed TIR (s_tir's verify_well_formed) is a decline too, logged at WARNING.
"""
from __future__ import annotations

import logging

from tvm.s_tir import ScheduleError

from tvmfuse import config
from tvmfuse.errors import fall_back_or_raise

from .targets import for_target

log = logging.getLogger("tvmfuse.schedule")


class ScheduleRule:
    name = "rule"

    def apply(self, func, target):  # pragma: no cover - interface
        raise NotImplementedError


def apply_rules(func, target, rules, name=None):
    """Try each rule in order; the first that does not decline wins. Returns (func, rule name).
    The rules read the constants of `target` (targets.for_target). `name` (the kernel's, for the
    log) defaults to the function's global_symbol."""
    name = name or (func.attrs.get("global_symbol") if func.attrs else None) or "<unnamed kernel>"
    with for_target(target):
        for rule in rules:
            out = try_rule(rule, func, target, name)
            if out is not None:
                out = _single_definitions(out)
                if _well_formed(out, rule, name):
                    return out, rule.name
    return func, None


def _well_formed(func, rule, name) -> bool:
    """Whether a rule's schedule is well-formed TIR; if not, the rule is taken to decline (WARNING):
    dlight's Matmul on a matmul with several outputs (GPT-2's fused QKV split in three) inlines one
    of them into its store and leaves the others reading a buffer nothing declares (TVM 0.27's
    reverse_compute_inline does not check that its producer has one consumer), which
    would fail the build later, far from the rule."""
    from tvm.s_tir.analysis import verify_well_formed

    try:
        verify_well_formed(func, assert_mode=True)
        return True
    except Exception as err:  # noqa: BLE001  TVM raises InternalError with the verifier's report
        lines = str(err).strip().splitlines() or [""]
        log.warning("rule %s gave ill-formed TIR for %s, declined: %s", rule.name, name,
                    next((ln for ln in lines if "ill-formed" in ln), lines[0]))
        return False


def try_rule(rule, func, target, name):
    """`rule.apply(func, target)`, None when it declines (returns None or raises ScheduleError).
    Any other error: a WARNING naming the rule and the kernel, raised under the `strict` knob."""
    try:
        return rule.apply(func, target)
    except ScheduleError as err:  # a schedule primitive refused: the rule does not fit, a decline
        log.debug("rule %s declined %s: %s", rule.name, name, (str(err).strip().splitlines() or [""])[0])
        return None
    except Exception as err:  # noqa: BLE001  anything else is a bug in the rule: surfaced, see above
        fall_back_or_raise(log, err, f"schedule rule {rule.name} on kernel {name}", config.knobs().strict)
        return None


def _single_definitions(func):
    """`func` with every block iteration variable defined once: loop_partition (a ragged row's
    vector body and scalar tail, common.schedule_spatial_block) copies a block with the same
    iteration variables, which TVM's later Schedule() and well-formedness checks reject as
    redefinitions. Each later copy gets fresh variables of the same names."""
    import tvm
    import tvm_ffi

    if tvm.tirx.analysis.verify_well_formed(func, assert_mode=False):
        return func
    seen = set()

    def block(b):
        olds = [iv.var for iv in b.iter_vars]
        if not any(v in seen for v in olds):
            seen.update(olds)
            return b
        fresh = {v: tvm.tirx.Var(v.name, v.ty) for v in olds}
        out = tvm_ffi.structural_map(b, [(tvm.ir.expr.Var, lambda v: fresh.get(v, v))], order="post")
        seen.update(fresh.values())
        return out

    return func.with_body(tvm_ffi.structural_map(func.body, [(tvm.s_tir.SBlock, block)], order="pre"))
