"""Shrinking a failing graph to a minimal one.

Two ways, both over the generator's choices (gen.py draws everything through `Source.int`):
- `hypothesis_search`: hypothesis draws the choices, finds failures and shrinks them itself.
- `shrink_seed`: a failing `RandomSource(seed)` graph is replayed from its recorded choices, and
  choices are deleted or lowered while the graph still fails the same way (delta debugging, the
  same moves hypothesis makes on its choice sequence). Used for a failing CI seed.
"""
from __future__ import annotations

import random

from .gen import generate


class RecordingSource:
    def __init__(self, seed: int):
        self.rng, self.choices = random.Random(seed), []

    def int(self, lo, hi):
        v = self.rng.randint(lo, hi)
        self.choices.append(v)
        return v


class ReplaySource:
    """Replays recorded choices; a value below the range or missing is the lowest, one above wraps."""

    def __init__(self, choices):
        self.choices, self.i = list(choices), 0

    def int(self, lo, hi):
        v = self.choices[self.i] if self.i < len(self.choices) else lo
        self.i += 1
        return lo if v < lo else v if v <= hi else lo + (v - lo) % (hi - lo + 1)


def _still_fails(choices, max_ops, fails, gen=generate):
    try:
        spec = gen(ReplaySource(choices), max_ops)
    except Exception:  # noqa: BLE001 - a candidate the generator cannot replay is not a smaller failure
        return None
    return spec if fails(spec) else None


def shrink_seed(seed: int, max_ops: int, fails, budget: int = 150, gen=generate):
    """The smallest spec found (within `budget` checks) that still `fails(spec)`; None if the
    seed's graph does not fail. `gen`: the generator (gen.generate, large.generate_large)."""
    src = RecordingSource(seed)
    best_spec = gen(src, max_ops)
    if not fails(best_spec):
        return None
    best, tries = src.choices, 0
    improved = True
    while improved and tries < budget:
        improved = False
        for i in range(len(best)):  # lower each choice: small values one by one, then halve
            for v in sorted(set(range(min(best[i], 12))) | {best[i] // 2, best[i] - 1}):
                if v < best[i] and tries < budget:
                    cand = best[:i] + [v] + best[i + 1:]
                    tries += 1
                    spec = _still_fails(cand, max_ops, fails, gen)
                    if spec is not None:
                        best, best_spec, improved = cand, spec, True
                        break
        for size in (8, 4, 2, 1):  # delete runs of choices
            i = 0
            while i < len(best) and tries < budget:
                cand = best[:i] + best[i + size:]
                tries += 1
                spec = _still_fails(cand, max_ops, fails, gen)
                if spec is not None:
                    best, best_spec, improved = cand, spec, True
                else:
                    i += size
    return best_spec


def hypothesis_search(seed: int, examples: int, max_ops: int, check, on_graph=None, gen=generate):
    """Run hypothesis for `examples` graphs from `seed`; returns (minimal failing spec, outcome) or
    None. `check(spec) -> Outcome`; `on_graph(spec, outcome)` sees every graph tried, shrinks included."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st

    from .gen import HypothesisSource

    last = {}

    @hseed(seed)
    @settings(max_examples=examples, database=None, deadline=None, print_blob=False,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def run(data):
        spec = gen(HypothesisSource(data), max_ops)
        out = check(spec)
        if on_graph:
            on_graph(spec, out)
        if not out.ok and out.kind != "baseline":  # the unfused build failing is no fusion bug
            last["spec"], last["out"] = spec, out
            raise AssertionError(str(out))

    try:
        run()
    except Exception:  # noqa: BLE001 - AssertionError, or an ExceptionGroup of several
        if "spec" in last:
            return last["spec"], last["out"]
        raise
    return None
