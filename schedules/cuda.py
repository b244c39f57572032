"""Default CUDA schedules: TVM's dlight GPU rules in the order of the CUDA table, Fallback last.

Applied function by function; a rule that raises (dlight's Reduction trips on 0-d full reductions)
declines, and the next rule gets the function. A function no rule schedules is reported, because
an unscheduled PrimFunc in a CUDA build silently runs on the host.
"""
from __future__ import annotations

from tvm.s_tir import dlight as dl

from .rule import ScheduleRule
from .targets import CUDA


class DlightRule(ScheduleRule):
    def __init__(self, rule):
        self.rule, self.name = rule, f"dlight.gpu.{type(rule).__name__}"

    def apply(self, func, target):
        with target:
            sch = self.rule.apply(func, target, False)
        if isinstance(sch, list):
            sch = sch[0] if sch else None
        return None if sch is None else sch.mod["main"]


def rules():
    return [DlightRule(getattr(dl.gpu, name)()) for name in CUDA["rules"]]
