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
                return out, rule.name
    return func, None
