"""The schedule-rule protocol: `apply(func, target) -> PrimFunc | None` (None = decline)."""
from __future__ import annotations

import logging

from .targets import for_target

log = logging.getLogger("tvmfuse.schedule")


class ScheduleRule:
    name = "rule"

    def apply(self, func, target):  # pragma: no cover - interface
        raise NotImplementedError


def apply_rules(func, target, rules):
    """Try each rule in order; the first that does not decline wins. Returns (func, rule name).
    The rules read the constants of `target` (targets.for_target)."""
    with for_target(target):
        for rule in rules:
            try:
                out = rule.apply(func, target)
            except Exception as err:  # a rule that fails to apply declines; the next one gets a chance
                log.debug("rule %s declined with error: %s", rule.name, err)
                out = None
            if out is not None:
                return _single_definitions(out), rule.name
    return func, None


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
