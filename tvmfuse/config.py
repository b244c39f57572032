"""One config: tvmfuse's fusion knobs, typed, each with its default and what it does.

Where a value comes from, lowest precedence first:
  1. the defaults below;
  2. a `TVMFUSE_<KNOB>` environment variable (`TVMFUSE_MAX_GROUP_SIZE=8`, `TVMFUSE_SIBLING=0`);
  3. `config.override(...)` scopes, innermost wins (per thread / per asyncio task: a contextvar);
  4. keywords of the call: `build(mod, fusion="tvmfuse", max_group_size=8)`.
An unknown knob, at any level, is an `UnknownKnobError` that names the known ones.

Build options that are not fusion knobs: `TVMFUSE_DEBUG_DIR` (`debug_dir()`: where each build
writes its debug folder, see tvmfuse/debug.py). The per-target schedule constants live in one table
per target kind in `schedules/targets.py` (derived from the target's ISA; `TVMFUSE_CPU_<KEY>`
overrides, `schedules.targets.for_target` scopes them).
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from dataclasses import dataclass

from .errors import ConfigError, UnknownKnobError


@dataclass(frozen=True)
class Knobs:
    max_group_size: int = 64  # ops per fused kernel, at most
    allow_recompute: bool = False  # elementwise producers may be recomputed inside a matmul/conv kernel
    multi_output: bool = True  # a fused kernel may write several outputs (add + RMSNorm: sum and norm)
    stitch_reductions: bool = True  # several reductions over the same rows in one kernel (softmax)
    sibling: bool = True  # horizontal fusion of groups that read the same input
    attention: bool = True  # softmax(QKᵀ)V as one flash-attention kernel (passes/match_attention.py)
    # a transpose of a non-constant tensor fused in front of a matmul/conv that reads it; unless set,
    # the target's table decides (schedules/targets.py: on for llvm, whose packing stage absorbs it;
    # off for CUDA, where dlight's matmul reading it transposed measured slower than the two kernels)
    layout_prologue: bool = True
    strict: bool = False  # a schedule rule or pass that raises an unexpected error fails the build instead of falling back; CI and tests set it

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


KNOWN = tuple(f.name for f in dataclasses.fields(Knobs))
_TYPES = {f.name: f.type for f in dataclasses.fields(Knobs)}
_SCOPES: contextvars.ContextVar[dict] = contextvars.ContextVar("tvmfuse_knob_overrides", default={})
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def check_names(names, where: str = "fusion knob") -> None:
    """UnknownKnobError unless every name is a knob."""
    bad = sorted(set(names) - set(KNOWN))
    if bad:
        raise UnknownKnobError(f"unknown {where}(s) {bad}; known: {list(KNOWN)} (see tvmfuse/config.py)")


def _coerce(name: str, value, source: str):
    kind = _TYPES[name]
    if kind in (bool, "bool"):
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise ConfigError(f"{source}={value!r}: expected a bool (one of {_TRUE + _FALSE})")
    if isinstance(value, bool) or not str(value).strip().lstrip("-").isdigit():
        raise ConfigError(f"{source}={value!r}: expected an int")
    out = int(value)
    if out < 1:
        raise ConfigError(f"{source}={value!r}: must be at least 1")
    return out


def _from_env() -> dict:
    found = {}
    for key, value in os.environ.items():
        if not key.startswith("TVMFUSE_") or key in _NOT_KNOBS or key.startswith(_NOT_KNOB_PREFIXES):
            continue
        name = key[len("TVMFUSE_"):].lower()
        check_names([name], where=f"fusion knob (environment variable {key})")
        found[name] = _coerce(name, value, key)
    return found


_NOT_KNOBS = ("TVMFUSE_DEBUG_DIR",)  # build options, read by debug_dir()
_NOT_KNOB_PREFIXES = ("TVMFUSE_CPU_",)  # schedule constants, read by schedules/targets.py


def knobs(**overrides) -> Knobs:
    """The knobs in force here: defaults < TVMFUSE_* environment < override() scopes < `overrides`."""
    check_names(overrides)
    values = {**_from_env(), **_SCOPES.get(), **{k: _coerce(k, v, k) for k, v in overrides.items()}}
    return Knobs(**values)


def explicit(name: str, overrides=None) -> bool:
    """Whether knob `name` was set by the caller (`overrides`), an override() scope or TVMFUSE_*."""
    return name in (overrides or {}) or name in _SCOPES.get() or name in _from_env()


@contextlib.contextmanager
def override(**values):
    """Scoped knob values (tests, one experiment): `with config.override(sibling=False): ...`."""
    check_names(values)
    token = _SCOPES.set({**_SCOPES.get(), **{k: _coerce(k, v, k) for k, v in values.items()}})
    try:
        yield
    finally:
        _SCOPES.reset(token)


def debug_dir(explicit: str | os.PathLike | None = None) -> str | None:
    """Where builds write their debug folders: `explicit`, else TVMFUSE_DEBUG_DIR, else None (off)."""
    if explicit:
        return os.fspath(explicit)
    return os.environ.get("TVMFUSE_DEBUG_DIR", "").strip() or None
