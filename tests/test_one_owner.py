"""One owner per setting: build, tuning, explain and viz take their options from
pipeline.Options.for_target (so they plan the same kernels on every target), and the CPU table's
overrides are owned by tvmfuse/config.py (checked, scoped)."""
import pytest
import tvm
import tvm_ffi
from tvm.ir.instrument import pass_instrument

import tvmfuse
from schedules.targets import CPU_SCHEMA, cpu_table
from tvmfuse import config, pipeline
from tvmfuse.zoo import workloads
from tvmfuse.errors import ConfigError, UnknownKnobError
from tvmfuse.fusion.api import plan_of
from tvmfuse.target import resolve
from tvmfuse.tuning.tasks import extract, fused_module


@pass_instrument
class _AtApplyTuning:
    """Keeps the module the build's apply_tuning phase would query (after mark_constants)."""

    def __init__(self):
        self.mod = None

    def run_after_pass(self, mod, info):
        if info.name == "tvmfuse.mark_constants":
            self.mod = mod


def _kernels(tasks) -> dict:
    """{workload structural hash: call sites} of tuning tasks."""
    return {tvm_ffi.structural_hash(t.mod): t.weight for t in tasks}


# linear_regression_step: xᵀ (a transpose of an input) feeds a matmul, so layout_prologue
# decides whether it is its own kernel (off) or read inside the matmul (on, the default)
@pytest.mark.parametrize("target", ["llvm", "cuda"])
def test_tuning_and_build_see_the_same_kernels(target):
    w = workloads.get("linear_regression_step")
    t = resolve(target)
    tuned = extract(fused_module(w.mod, t, "tvmfuse"))  # the path tvmfuse.tune takes
    seen = _AtApplyTuning()
    built = tvmfuse.build(w.mod, t, "tvmfuse", instruments=[seen])
    assert seen.mod is not None
    assert _kernels(tuned) == _kernels(extract(seen.mod))
    assert sorted(task.name for task in tuned) == sorted(set(built.call_sites()))
    # and the workload is one where the knob matters: the other setting plans other kernels
    other = extract(fused_module(w.mod, t, "tvmfuse", {"layout_prologue": False}))
    assert _kernels(other) != _kernels(tuned)


@pytest.mark.parametrize("target", ["llvm", "cuda"])
def test_explain_shows_the_plan_the_build_makes(target):
    w = workloads.get("linear_regression_step")
    text = plan_of(w.mod, target)[1].explain()
    assert text == tvmfuse.build(w.mod, target, "tvmfuse").plan.explain()
    matmul = next(line for line in text.splitlines() if "lv7:matmul" in line)  # the xᵀ·g matmul
    assert "permute_dims" in matmul  # read inside the matmul on both targets (layout_prologue)


def test_options_for_target_resolves_once_and_applies_target_defaults(monkeypatch):
    t = resolve("cuda")
    opts = pipeline.Options.for_target(t, "tvmfuse")
    assert opts.target.same_as(t)  # a Target is kept as it is
    assert opts.knobs.layout_prologue is True
    monkeypatch.setitem(config.TARGET_DEFAULTS, "cuda", {"layout_prologue": False})  # a per-target default
    assert pipeline.Options.for_target(t, "tvmfuse").knobs.layout_prologue is False
    assert pipeline.Options.for_target(t, "tvmfuse", layout_prologue=True).knobs.layout_prologue is True
    assert pipeline.Options.for_target("llvm", "tvmfuse").knobs.layout_prologue is True
    with pytest.raises(ValueError, match="unknown fusion variant"):
        pipeline.Options.for_target(t, "fused")
    with pytest.raises(UnknownKnobError):
        pipeline.Options.for_target(t, "tvmfuse", no_such_knob=1)


# ------------------------------------------------------------------ CPU table overrides
def test_a_scoped_cpu_override_changes_the_table_and_is_restored():
    base = cpu_table()
    with config.override(cpu={"conv_columns": base["conv_columns"] + 1, "winograd_tiles": (2,)}):
        assert cpu_table()["conv_columns"] == base["conv_columns"] + 1
        assert cpu_table()["winograd_tiles"] == (2,)
        with config.override(cpu={"winograd": 0}):  # inner scopes add to the outer ones
            assert cpu_table()["winograd"] == 0 and cpu_table()["winograd_tiles"] == (2,)
        assert config.cpu_overrides() == {"conv_columns": base["conv_columns"] + 1, "winograd_tiles": (2,)}
    assert cpu_table() == base
    assert config.cpu_overrides() == {}


def test_environment_overrides_are_read_at_call_time(monkeypatch):
    base = cpu_table()
    monkeypatch.setenv("TVMFUSE_CPU_MM_ROWS", str(base["mm_rows"] + 2))
    monkeypatch.setenv("TVMFUSE_CPU_WINOGRAD_TILES", "4, 2")
    assert cpu_table()["mm_rows"] == base["mm_rows"] + 2
    assert cpu_table()["winograd_tiles"] == (4, 2)
    with config.override(cpu={"mm_rows": 1}):  # a scope wins over the environment
        assert cpu_table()["mm_rows"] == 1
    monkeypatch.delenv("TVMFUSE_CPU_MM_ROWS")
    assert cpu_table()["mm_rows"] == base["mm_rows"]


def test_an_unknown_cpu_key_is_an_error_naming_the_known_ones(monkeypatch):
    with pytest.raises(UnknownKnobError, match="conv_columns"):
        with config.override(cpu={"l3_bytes": 1 << 20}):
            pass
    monkeypatch.setenv("TVMFUSE_CPU_CONV_COLUMN", "4")  # a typo of conv_columns
    with pytest.raises(UnknownKnobError, match="TVMFUSE_CPU_CONV_COLUMN"):
        cpu_table()


@pytest.mark.parametrize("key,value", [("conv_columns", "four"), ("conv_columns", -1), ("conv_columns", True),
                                       ("vector_math", "maybe"), ("winograd_tiles", "4,x")])
def test_a_bad_cpu_value_is_a_config_error(key, value, monkeypatch):
    with pytest.raises(ConfigError, match=key):
        with config.override(cpu={key: value}):
            pass
    monkeypatch.setenv(f"TVMFUSE_CPU_{key.upper()}", str(value))
    with pytest.raises(ConfigError, match=f"TVMFUSE_CPU_{key.upper()}"):
        cpu_table()


def test_the_schema_covers_every_entry_of_the_table():
    assert set(CPU_SCHEMA) == set(cpu_table())
    assert set(CPU_SCHEMA) == set(cpu_table(tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})))
