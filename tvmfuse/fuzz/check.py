"""The differential check: one spec built unfused ("none"), with stock fusion ("tvm") and with
tvmfuse's fusion on llvm, run on the same inputs and compared with per-dtype tolerances. A spec with
a symbolic dim is then built once symbolic and checked at two sizes (_check_symbolic).

Failure kinds: "baseline" (the unfused build or run fails: not a fusion bug, the graph or TVM is
at fault), "build"/"run" (a fused variant fails where the unfused one works), "mismatch" (numbers
differ beyond tolerance) and "launches" (tvmfuse launches more kernels than stock fusion). A symbolic
graph that TVM's own variants cannot build is "symbolic-baseline", ok: checked statically only.
"""
from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass, field

import numpy as np

from ..relax_utils import NOMINAL_EXTENT
from .large import cpu_overrides
from .rewrites import StreamWatch, taken
from .spec import make_inputs, to_module

TOL = {"float32": 1e-4, "float16": 2e-2}  # rtol; atol = rtol * max(1, max |reference|)


@dataclass
class Outcome:
    ok: bool
    kind: str = "ok"
    variant: str = ""
    detail: str = ""
    launches: dict = field(default_factory=dict)
    rewrites: dict = field(default_factory=dict)  # the tvmfuse build's CPU rewrites (rewrites.taken)

    def __str__(self):
        return "ok" if self.ok else f"{self.kind} [{self.variant}] {self.detail}"


def tolerance(spec: dict) -> float:
    dtypes = {i["dtype"] for i in spec["inputs"]} | {o["attrs"].get("dtype") for o in spec["ops"]}
    return TOL["float16"] if "float16" in dtypes else TOL["float32"]


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def compare(out, ref, tol) -> str | None:
    """None when `out` matches `ref`; else what differs."""
    out, ref = _as_tuple(out), _as_tuple(ref)
    if len(out) != len(ref):
        return f"{len(out)} outputs, expected {len(ref)}"
    for k, (o, r) in enumerate(zip(out, ref)):
        if o.shape != r.shape or o.dtype != r.dtype:
            return f"output {k}: {o.dtype}{list(o.shape)} vs {r.dtype}{list(r.shape)}"
        o64, r64 = o.astype("float64"), r.astype("float64")
        if not np.isfinite(r64).all():
            return f"output {k}: the unfused reference is not finite (generator bound too loose)"
        atol = tol * max(1.0, float(np.abs(r64).max(initial=0.0)))
        bad = ~np.isclose(o64, r64, rtol=tol, atol=atol)
        if bad.any():
            i = tuple(int(j) for j in np.argwhere(bad)[0])
            return (f"output {k}: {int(bad.sum())}/{bad.size} elements differ; at {list(i)} got {o64[i]!r}, "
                    f"expected {r64[i]!r} (rtol=atol/scale={tol})")
    return None


def _short_error(err: BaseException) -> str:
    lines = [ln for ln in "".join(traceback.format_exception_only(type(err), err)).splitlines() if ln.strip()]
    return " | ".join(lines[-3:])[:600]


def _build(spec, target, variant, knobs, instruments=()):
    """One variant's build, under the spec's CPU-table overrides ("cpu"; for the unfused reference
    also "reference_cpu": large.py turns the rewrites off there)."""
    import tvmfuse

    cpu = dict(spec.get("cpu") or {})
    if variant == "none":
        cpu.update(spec.get("reference_cpu") or {})
    with cpu_overrides(cpu):
        return tvmfuse.build(to_module(spec), target, variant, instruments=instruments, **knobs)


def _run_all(spec, target, inputs, rewrites=None):
    """Build none / tvm / tvmfuse, then run them fused first: an output element a fused kernel fails to
    write then holds stale memory, not (by luck) the reference's value from a buffer freed just before.
    `rewrites` (a dict) gets the tvmfuse build's rewrites. Returns (outputs, launches, failing Outcome or None)."""
    compiled, launches, outs = {}, {}, {}
    for variant in ("none", "tvm", "tvmfuse"):
        try:
            knobs = spec.get("knobs", {}) if variant == "tvmfuse" else {}
            watch = StreamWatch() if variant == "tvmfuse" else None
            compiled[variant] = _build(spec, target, variant, knobs, [watch] if watch else ())
            launches[variant] = compiled[variant].launches
            if watch is not None and rewrites is not None:
                rewrites.update(taken(compiled[variant], spec, watch))
        except Exception as err:  # noqa: BLE001 - every failure is a finding, reported with its variant
            kind = "baseline" if variant == "none" else "build"
            return outs, launches, Outcome(False, kind, variant, f"{type(err).__name__}: {_short_error(err)}", launches)
    for variant in ("tvmfuse", "tvm", "none"):
        try:
            outs[variant] = compiled[variant](*inputs)
        except Exception as err:  # noqa: BLE001
            kind = "baseline" if variant == "none" else "run"
            return outs, launches, Outcome(False, kind, variant, f"{type(err).__name__}: {_short_error(err)}", launches)
    return outs, launches, None


def check_spec(spec: dict, target="llvm", input_seed: int = 0) -> Outcome:
    """Build and run the three variants of `spec` and compare them against the unfused one."""
    log = logging.getLogger("tvmfuse.fusion")
    level = log.level
    log.setLevel(logging.WARNING)  # one line per refused merge is too much for thousands of graphs
    rewrites = {}
    try:
        outs, launches, failed = _run_all(spec, target, make_inputs(spec, input_seed), rewrites)
    finally:
        log.setLevel(level)
    out = _verdict(spec, target, input_seed, outs, launches, failed)
    out.rewrites = rewrites
    return out


def _verdict(spec, target, input_seed, outs, launches, failed) -> Outcome:
    if failed:
        return failed
    tol = tolerance(spec)
    for variant in ("tvm", "tvmfuse"):
        diff = compare(outs[variant], outs["none"], tol)
        if diff:
            return Outcome(False, "mismatch", variant, diff, launches)
    # knobs may forbid what stock does
    if launches["tvmfuse"] > launches["tvm"] and not spec.get("knobs"):
        return Outcome(False, "launches", "tvmfuse",
                       f"tvmfuse {launches['tvmfuse']} launches > stock {launches['tvm']}", launches)
    if spec.get("symbolic"):
        return _check_symbolic(spec, target, input_seed, tol, launches, outs["none"])
    return Outcome(True, launches=launches)


def _static_launches_at_nominal(spec, target) -> int:
    """tvmfuse's launches for the static graph at n = NOMINAL_EXTENT, the size the planner weighs a
    symbolic dim at. Where a knob caps the groups (max_group_size), greedy merging takes the most
    profitable edges first, and which those are depends on sizes: the static plan at n=7 and the
    symbolic one (weighed at the nominal size) may pick different, equally legal, merges (found by
    fuzzing, seed 41903). At the nominal size both weigh alike, so a difference there is a real
    gap in symbolic legality."""
    import tvmfuse

    return tvmfuse.build(to_module(spec, NOMINAL_EXTENT), target, "tvmfuse", **spec.get("knobs", {})).launches


def _check_symbolic(spec, target, input_seed, tol, launches, static_ref) -> Outcome:
    """The spec with its symbolic dim (spec["symbolic"]): tvm and tvmfuse built ONCE, symbolic, run
    at each size against the unfused static build of that size; tvmfuse launches no more than it
    does statically. A graph Relax cannot type with the symbolic dim (an input whose leading size
    equals n by coincidence but meets another axis) is checked statically only."""
    import tvm

    import tvmfuse

    n = tvm.tirx.Var("n", "int64")
    try:
        mod = to_module(spec, n)
    except Exception:  # noqa: BLE001 - not a fusion question: the graph needs n to equal a constant
        return Outcome(True, launches=launches)
    built = {}
    for variant in ("tvm", "tvmfuse"):  # stock "tvm" failing: TVM's limit, not fusion's
        try:
            knobs = spec.get("knobs", {}) if variant == "tvmfuse" else {}
            built[variant] = tvmfuse.build(mod, target, variant, **knobs)
        except Exception as err:  # noqa: BLE001
            detail = f"{type(err).__name__}: {_short_error(err)}"
            if variant != "tvmfuse":  # TVM itself cannot take the graph symbolic: checked statically only
                return Outcome(True, "symbolic-baseline", variant + "/symbolic", detail, launches)
            return Outcome(False, "build", variant + "/symbolic", detail, launches)
    if built["tvmfuse"].launches > launches["tvmfuse"]:
        nominal = _static_launches_at_nominal(spec, target)
        if built["tvmfuse"].launches > nominal:
            return Outcome(False, "launches", "tvmfuse/symbolic", f"symbolic build launches {built['tvmfuse'].launches} "
                           f"> static {launches['tvmfuse']} (and {nominal} at n={NOMINAL_EXTENT})", launches)
    for size in spec["symbolic"]["sizes"]:
        inputs = make_inputs(spec, input_seed, size)
        try:  # at the spec's own size, the unfused static output the static check computed
            ref = static_ref if size == spec["symbolic"]["n"] else \
                tvmfuse.build(to_module(spec, size), target, "none")(*inputs)
        except Exception as err:  # noqa: BLE001
            return Outcome(False, "baseline", f"none@{size}", f"{type(err).__name__}: {_short_error(err)}", launches)
        for variant, c in built.items():
            try:
                out = c(*inputs)
            except Exception as err:  # noqa: BLE001
                return Outcome(False, "run", f"{variant}/symbolic@{size}", f"{type(err).__name__}: {_short_error(err)}",
                               launches)
            diff = compare(out, ref, tol)
            if diff:
                return Outcome(False, "mismatch", f"{variant}/symbolic@{size}", diff, launches)
    return Outcome(True, launches=launches)
