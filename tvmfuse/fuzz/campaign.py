"""A timed fuzz campaign (what scripts/fuzz.py runs): graphs tried, ops covered, failures, shrunk.

engine "random": seeds seed, seed+1, ... through `RandomSource`; a failing seed is shrunk by replay
(shrink.shrink_seed). engine "hypothesis": batches of hypothesis examples from `seed`, shrunk by
hypothesis. Baseline failures (the unfused build fails too) are counted apart: no fusion bug.
"""
from __future__ import annotations

import collections
import json
import os
import time
from dataclasses import asdict, dataclass, field

from .check import Outcome, check_spec
from .gen import ALL_OPS, RandomSource, generate
from .large import CAMPAIGN_CPU, generate_large
from .rewrites import REWRITES
from .shrink import hypothesis_search, shrink_seed

GENERATORS = {"small": generate, "large": generate_large}  # --shapes
from .spec import spec_id, spec_ops, to_module


@dataclass
class Summary:
    engine: str
    seed: int
    max_ops: int
    seconds: float = 0.0
    graphs: int = 0  # every graph built and checked (shrink attempts included)
    distinct: int = 0  # distinct graphs among them
    ops: dict = field(default_factory=lambda: {op: 0 for op in ALL_OPS})
    dtypes: dict = field(default_factory=dict)
    multi_output: int = 0  # graphs whose main returns a tuple
    with_knobs: int = 0  # graphs fused by tvmfuse under non-default knobs
    symbolic: int = 0  # graphs built once with a symbolic leading dim and checked at two sizes
    attention: int = 0  # graphs with the attention composite (a softmax between two matmuls)
    launches: dict = field(default_factory=lambda: {"none": 0, "tvm": 0, "tvmfuse": 0})  # summed
    shapes: str = "small"
    # distinct graphs whose tvmfuse build took each CPU rewrite (rewrites.py), "any": at least one of
    # them; stream_marked: MarkStreamingStores marked a kernel (StreamStores may find no whole vector)
    rewrites: dict = field(default_factory=lambda: {k: 0 for k in (*REWRITES, "stream_marked", "any")})
    timeouts: list = field(default_factory=list)  # {seed, spec_id, seconds}: graphs stopped by the supervisor
    baseline_failures: list = field(default_factory=list)  # the unfused build fails: not fusion
    failures: list = field(default_factory=list)  # {seed, kind, variant, detail, spec_id, spec}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    def merge(self, other: "Summary") -> None:
        """Add `other` (a later run over other seeds: supervise.py's restarts) to this summary."""
        for name, mine in asdict(self).items():
            theirs = getattr(other, name)
            if isinstance(mine, (int, float)) and not isinstance(mine, bool) and name not in ("seed", "max_ops"):
                setattr(self, name, mine + theirs)
            elif isinstance(mine, dict):
                getattr(self, name).update({k: mine.get(k, 0) + v for k, v in theirs.items()})
            elif isinstance(mine, list):
                getattr(self, name).extend(theirs)

    def text(self) -> str:
        lines = [f"engine {self.engine}, seed {self.seed}, max_ops {self.max_ops}: {self.seconds:.0f} s",
                 f"graphs tried: {self.graphs} ({self.distinct} distinct), multi-output: {self.multi_output}, "
                 f"non-default knobs: {self.with_knobs}, symbolic: {self.symbolic}, attention: {self.attention}, "
                 f"graphs with inputs of dtype: {self.dtypes}",
                 f"kernel launches summed over the graphs: {self.launches}",
                 f"shapes {self.shapes}; graphs whose tvmfuse build took a CPU rewrite: {self.rewrites}",
                 "ops covered: " + ", ".join(f"{k} {v}" for k, v in sorted(self.ops.items()))]
        missing = [k for k, v in self.ops.items() if not v]
        if missing:
            lines.append(f"ops NOT covered: {missing}")
        lines.append(f"baseline failures (unfused build fails too): {len(self.baseline_failures)}")
        for f in self.baseline_failures[:5]:
            lines.append(f"  seed {f['seed']}: {f['detail'][:200]}")
        lines.append(f"graphs stopped after the per-graph time limit: {len(self.timeouts)}")
        for t in self.timeouts:
            lines.append(f"  seed {t['seed']} -> {t['spec_id']}: over {t['seconds']:.0f} s")
        lines.append(f"fusion failures: {len(self.failures)}")
        for f in self.failures:
            lines.append(f"  seed {f['seed']} -> {f['spec_id']} ({len(f['spec']['ops'])} ops): "
                         f"{f['kind']} [{f['variant']}] {f['detail'][:300]}")
        return "\n".join(lines)


class _Tally:
    def __init__(self, summary: Summary):
        self.s, self.seen = summary, set()

    def __call__(self, spec, out, seed=None):
        s = self.s
        s.graphs += 1
        sid = spec_id(spec)
        if sid in self.seen:
            return
        self.seen.add(sid)
        s.distinct += 1
        for op in spec_ops(spec):
            s.ops[op] = s.ops.get(op, 0) + 1
        for dt in {i["dtype"] for i in spec["inputs"]}:
            s.dtypes[dt] = s.dtypes.get(dt, 0) + 1
        s.multi_output += len(spec["outputs"]) > 1
        s.with_knobs += bool(spec.get("knobs"))
        s.symbolic += bool(spec.get("symbolic"))
        ops = [o["op"] for o in spec["ops"]]
        s.attention += "softmax" in ops and ops.count("matmul") >= 2
        for v, n in out.launches.items():
            s.launches[v] += n
        took = [k for k in (*REWRITES, "stream_marked") if out.rewrites.get(k)]
        for k in took:
            s.rewrites[k] += 1
        s.rewrites["any"] += any(k in REWRITES for k in took)
        if out.kind == "baseline" and len(s.baseline_failures) < 50:
            s.baseline_failures.append({"seed": seed, "detail": out.detail, "spec_id": sid})


def _signature(out):
    return (out.kind, out.variant, out.detail.split(":")[0][:80])


def _record(summary, seed, spec, out):
    summary.failures.append({"seed": seed, "kind": out.kind, "variant": out.variant, "detail": out.detail,
                             "spec_id": spec_id(spec), "spec": spec})


def run(minutes: float, seed: int = 0, max_ops: int = 8, engine: str = "random", progress=None,
        shapes: str = "small", on_graph=None, seeds: int | None = None) -> Summary:
    """Graphs from `seed` on until `minutes` pass (or `seeds` graphs are done). `on_graph(seed, spec,
    outcome, seconds, summary)` sees each random-engine graph before it is checked (outcome None) and
    after (supervise.py logs them and snapshots the summary)."""
    s = Summary(engine, seed, max_ops, shapes=shapes)
    gen = GENERATORS[shapes]
    tally, sigs = _Tally(s), set()
    t0 = time.monotonic()
    deadline = t0 + 60 * minutes

    def checked(spec, seed_=None):
        out = check_spec(spec)
        tally(spec, out, seed_)
        return out

    k = 0
    while time.monotonic() < deadline and (seeds is None or k < seeds):
        cur = seed + k
        k += 1
        if engine == "hypothesis":
            found = hypothesis_search(cur, 25, max_ops, checked, gen=gen)
            if found and _signature(found[1]) not in sigs:
                sigs.add(_signature(found[1]))
                _record(s, cur, *found)
        else:
            spec = gen(RandomSource(cur), max_ops)
            t1 = time.monotonic()
            if on_graph:
                on_graph(cur, spec, None, 0.0, s)
            out = checked(spec, cur)
            if on_graph:
                on_graph(cur, spec, out, time.monotonic() - t1, s)
            if not out.ok and out.kind != "baseline" and _signature(out) not in sigs:
                sigs.add(_signature(out))
                kind = out.kind
                small = shrink_seed(cur, max_ops, lambda sp: checked(sp, cur).kind == kind, budget=80, gen=gen)
                again = check_spec(small or spec)
                if again.ok:  # failed once, passed on re-check: keep the first outcome, marked flaky
                    small, again = spec, Outcome(False, out.kind, out.variant, "flaky (passed on re-check): "
                                                 + out.detail, out.launches)
                _record(s, cur, small or spec, again)
        if progress and k % 25 == 0:
            progress(f"[fuzz] {s.graphs} graphs, {len(s.failures)} failures, {time.monotonic() - t0:.0f} s")
    s.seconds = time.monotonic() - t0
    return s


def save_regression(failure: dict, folder: str, note: str = "") -> str:
    """Write a failure as tests/regressions/<spec_id>.json (replayed by tests/test_fuzz_regressions.py)."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{failure['spec_id']}.json")
    doc = {"id": failure["spec_id"], "found_by": f"scripts/fuzz.py seed {failure['seed']}",
           "failure": f"{failure['kind']} [{failure['variant']}] {failure['detail']}", "note": note,
           "xfail": None, "spec": failure["spec"], "tvmscript": to_module(failure["spec"]).script()}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    return path
