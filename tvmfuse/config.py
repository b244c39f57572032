"""One config: tvmfuse's fusion knobs, typed, each with its default and what it does.

Where a value comes from, lowest precedence first:
  1. the defaults below;
  2. a `TVMFUSE_<KNOB>` environment variable (`TVMFUSE_MAX_GROUP_SIZE=8`, `TVMFUSE_SIBLING=0`);
  3. `config.override(...)` scopes, innermost wins (per thread / per asyncio task: a contextvar);
  4. keywords of the call: `build(mod, fusion="tvmfuse", max_group_size=8)`.
An unknown knob, at any level, is an `UnknownKnobError` that names the known ones.

Per-target knob defaults (`TARGET_DEFAULTS`) sit between 1 and 2: `knobs(target=...)` applies
them, and `pipeline.Options.for_target` is the one place a build, a tuning run, explain and viz
get their knobs from (none has a per-target default at present).

CPU schedule constants. The table itself is derived from the llvm target's ISA in
`schedules/targets.py` (`cpu_table`; its entries and their kinds in schedules/cpu/constants.py);
this module owns the overrides of its entries, which the table applies each time it is read:
  1. `TVMFUSE_CPU_<KEY>=<value>` in the environment (`TVMFUSE_CPU_CONV_COLUMNS=4`,
     `TVMFUSE_CPU_WINOGRAD=0`, `TVMFUSE_CPU_WINOGRAD_TILES=4,2`), read on every call;
  2. `config.override(cpu={"conv_columns": 4})` scopes, innermost wins per key (knobs and CPU
     entries can be set in one scope: `override(sibling=False, cpu={...})`).
A key the table does not have is an `UnknownKnobError` naming the known keys; a value of the
wrong kind (an int entry given "four", a negative int) is a `ConfigError`. `cpu_overrides()`
gives the overrides in force.

Build options that are not fusion knobs: `TVMFUSE_DEBUG_DIR` (`debug_dir()`: where each build
writes its debug folder, see tvmfuse/debug.py).
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from dataclasses import dataclass

from schedules.cpu.constants import SCHEMA as CPU_SCHEMA

from .errors import ConfigError, UnknownKnobError


@dataclass(frozen=True)
class Knobs:
    max_group_size: int = 64  # ops per fused kernel, at most
    allow_recompute: bool = False  # elementwise producers may be recomputed inside a matmul/conv kernel
    multi_output: bool = True  # a fused kernel may write several outputs (add + RMSNorm: sum and norm)
    stitch_reductions: bool = True  # several reductions over the same rows in one kernel (softmax)
    sibling: bool = True  # horizontal fusion of groups that read the same input
    # independent elementwise groups joined into one kernel (fusion/fuse_horizontal.py): an optimizer
    # step over N parameters as one kernel, not N; on for the backend's update graphs (torch_update.py)
    horizontal: bool = False
    horizontal_max_ops: int = 256  # ops per horizontally joined kernel, at most
    attention: bool = True  # softmax(QKᵀ)V as one flash-attention kernel (fusion/match_attention.py)
    # a transpose of a non-constant tensor fused in front of a matmul/conv that reads it: a
    # transposed weight read as stored, the head split/merge read where the matmul reads it (llvm's
    # packing stage absorbs it; CUDA's matmuls read their second operand as [N, K], a Linear's weight)
    layout_prologue: bool = True
    strict: bool = False  # a schedule rule or pass that raises an unexpected error fails the build instead of falling back; CI and tests set it

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


KNOWN = tuple(f.name for f in dataclasses.fields(Knobs))
_TYPES = {f.name: f.type for f in dataclasses.fields(Knobs)}
_SCOPES: contextvars.ContextVar[dict] = contextvars.ContextVar("tvmfuse_knob_overrides", default={})
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")

# Knob defaults per target kind, over the Knobs defaults and under everything a user sets.
# (CUDA had layout_prologue off: dlight's float32 SIMT matmul reading a transposed weight measured
# slower than a transpose kernel + the matmul on an H200, 218.7 against 28.8 + 153.2 us per FFN
# matmul, its shared-memory fetch giving each thread 8 consecutive K elements so that a warp's load
# touches 16 rows; it is on again: no transpose is a kernel of its own, and the tensor-core matmul,
# cuda/tensor_core.py, fetches the weight as stored with a warp's lanes along K, coalesced)
TARGET_DEFAULTS: dict = {}


def check_names(names, where: str = "fusion knob") -> None:
    """UnknownKnobError unless every name is a knob."""
    bad = sorted(set(names) - set(KNOWN))
    if bad:
        raise UnknownKnobError(f"unknown {where}(s) {bad}; known: {list(KNOWN)} (see tvmfuse/config.py)")


def _coerce(name: str, value, source: str):
    kind = _TYPES[name]
    if kind in (bool, "bool"):
        return _bool(value, source)
    return _int(value, source, least=1)


def _bool(value, source: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ConfigError(f"{source}={value!r}: expected a bool (one of {_TRUE + _FALSE})")


def _int(value, source: str, least: int) -> int:
    if isinstance(value, bool) or not str(value).strip().lstrip("-").isdigit():
        raise ConfigError(f"{source}={value!r}: expected an int")
    out = int(value)
    if out < least:
        raise ConfigError(f"{source}={value!r}: must be at least {least}")
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
_NOT_KNOB_PREFIXES = ("TVMFUSE_CPU_",)  # CPU table entries: cpu_overrides()


def knobs(target=None, **overrides) -> Knobs:
    """The knobs in force here: defaults < TARGET_DEFAULTS of `target` (a tvm Target, or None) <
    TVMFUSE_* environment < override() scopes < `overrides`."""
    check_names(overrides)
    per_target = TARGET_DEFAULTS.get(target.kind.name, {}) if target is not None else {}
    scoped = {k: v for k, v in _SCOPES.get().items() if k != "cpu"}
    values = {**per_target, **_from_env(), **scoped, **{k: _coerce(k, v, k) for k, v in overrides.items()}}
    return Knobs(**values)


def explicit(name: str, overrides=None) -> bool:
    """Whether knob `name` was set by the caller (`overrides`), an override() scope or TVMFUSE_*."""
    return name in (overrides or {}) or name in _SCOPES.get() or name in _from_env()


@contextlib.contextmanager
def override(cpu: dict | None = None, **values):
    """Scoped knob values (tests, one experiment): `with config.override(sibling=False): ...`;
    `cpu={key: value}` scopes entries of the CPU schedule table (schedules/targets.py)."""
    check_names(values)
    scoped = {**_SCOPES.get(), **{k: _coerce(k, v, k) for k, v in values.items()}}
    if cpu:
        scoped["cpu"] = {**scoped.get("cpu", {}), **{k: _cpu_value(k, v, f"cpu[{k!r}]") for k, v in cpu.items()}}
    token = _SCOPES.set(scoped)
    try:
        yield
    finally:
        _SCOPES.reset(token)


# ------------------------------------------------------------------ CPU schedule table overrides
_CPU_ENV = "TVMFUSE_CPU_"


def _cpu_value(key: str, value, source: str):
    """`value` as the CPU table's entry `key` takes it (the kind of its derived value)."""
    if key not in CPU_SCHEMA:
        raise UnknownKnobError(f"unknown CPU table key {key!r} ({source}); known: {sorted(CPU_SCHEMA)} "
                               "(see schedules/cpu/constants.py)")
    kind = CPU_SCHEMA[key]
    if kind is bool:
        return _bool(value, source)
    if kind is int:
        return _int(value, source, least=0)
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise ConfigError(f"{source}={value!r}: expected a comma-separated list or a tuple")
    if kind == "ints":
        return tuple(_int(v, source, least=1) for v in items)
    return tuple(str(v).strip() for v in items)


def cpu_overrides() -> dict:
    """The CPU table entries set here: TVMFUSE_CPU_<KEY> environment < override(cpu=...) scopes."""
    found = {}
    for key, value in os.environ.items():
        if key.startswith(_CPU_ENV):
            name = key[len(_CPU_ENV):].lower()
            found[name] = _cpu_value(name, value, key)
    return {**found, **_SCOPES.get().get("cpu", {})}


def debug_dir(explicit: str | os.PathLike | None = None) -> str | None:
    """Where builds write their debug folders: `explicit`, else TVMFUSE_DEBUG_DIR, else None (off)."""
    if explicit:
        return os.fspath(explicit)
    return os.environ.get("TVMFUSE_DEBUG_DIR", "").strip() or None
