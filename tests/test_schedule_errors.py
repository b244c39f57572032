"""The schedule-rule protocol's errors (schedules/rule.py): a rule declines by returning None or by a
TVM ScheduleError; any other exception is a bug, logged at WARNING and raised under `strict`."""
import logging

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir, te

import schedules
import tvmfuse
from schedules.cpu import rules as cpu
from schedules.rule import ScheduleRule, apply_rules
from tvmfuse import config
from tvmfuse.passes import fold_constants

LLVM = tvm.target.Target("llvm")


def _func():
    a = te.placeholder((64,), "float32", name="A")
    b = te.compute((64,), lambda i: a[i] * 2.0, name="B")
    c = te.compute((64,), lambda i: b[i] + 1.0, name="C")
    return te.create_prim_func([a, c]).with_attr("global_symbol", "scale_shift")


class Raises(ScheduleRule):
    name = "test.Raises"

    def __init__(self, err):
        self.err = err

    def apply(self, func, target):
        raise self.err


class InlinesTheOutput(ScheduleRule):
    """Asks TVM for something it refuses: compute_inline of the output block (a ScheduleError)."""
    name = "test.InlinesTheOutput"

    def apply(self, func, target):
        sch = s_tir.Schedule(func)
        sch.compute_inline(sch.get_sblock("C"))
        return sch.mod["main"]


class Declines(ScheduleRule):
    name = "test.Declines"

    def apply(self, func, target):
        return None


class Takes(ScheduleRule):
    name = "test.Takes"

    def apply(self, func, target):
        return func.with_attr("test.taken", True)


def test_the_environment_of_the_tests_is_strict():
    assert config.knobs().strict  # conftest sets TVMFUSE_STRICT=1 for the whole session


@pytest.mark.parametrize("err", [ValueError("a bug"), KeyError("missing"), IndexError("off by one")])
def test_a_rule_that_raises_anything_else_fails_under_strict(err):
    with config.override(strict=True), pytest.raises(type(err)):
        apply_rules(_func(), LLVM, [Raises(err), Takes()])


def test_without_strict_it_is_a_warning_naming_rule_and_kernel_and_the_next_rule_runs(caplog):
    with config.override(strict=False), caplog.at_level(logging.WARNING, logger="tvmfuse.schedule"):
        out, rule = apply_rules(_func(), LLVM, [Raises(KeyError("missing")), Takes()])
    assert rule == "test.Takes" and out.attrs["test.taken"]
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1
    assert "test.Raises" in warned[0].getMessage() and "scale_shift" in warned[0].getMessage()
    assert "KeyError" in warned[0].getMessage()


def test_a_schedule_error_is_a_decline_even_under_strict(caplog):
    with pytest.raises(s_tir.ScheduleError):  # the rule really meets TVM's own error
        InlinesTheOutput().apply(_func(), LLVM)
    with config.override(strict=True), caplog.at_level(logging.DEBUG, logger="tvmfuse.schedule"):
        out, rule = apply_rules(_func(), LLVM, [InlinesTheOutput(), Takes()])
    assert rule == "test.Takes" and out.attrs["test.taken"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "test.InlinesTheOutput declined scale_shift" in caplog.text


def test_a_rule_returning_none_declines():
    with config.override(strict=True):
        out, rule = apply_rules(_func(), LLVM, [Declines(), Takes()])
        assert rule == "test.Takes" and out.attrs["test.taken"]
        func = _func()
        assert apply_rules(func, LLVM, [Declines()]) == (func, None)  # every rule declined


def _mlp():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.relu(relax.op.add(x, relax.const(np.ones((4, 16), "float32")))))
        bb.emit_func_output(y)
    return bb.get()


def test_a_build_fails_under_strict_and_falls_back_without(monkeypatch, caplog):
    """The knob as a build keyword reaches the rules (pipeline.run scopes it)."""
    monkeypatch.setattr(cpu, "RULES", [Raises(KeyError("missing"))] + cpu.RULES)
    with pytest.raises(KeyError):
        tvmfuse.build(_mlp(), "llvm", "tvmfuse")  # strict from the environment
    with caplog.at_level(logging.WARNING, logger="tvmfuse.schedule"):
        compiled = tvmfuse.build(_mlp(), "llvm", "tvmfuse", strict=False)
    assert "schedule rule test.Raises on kernel" in caplog.text
    x = np.random.default_rng(0).standard_normal((4, 16)).astype("float32")
    np.testing.assert_allclose(compiled(x), np.maximum(x + 1, 0), rtol=1e-6)
    assert compiled.rules() and "test.Raises" not in compiled.rules() and "-" not in compiled.rules()


def test_apply_default_schedules_names_the_kernel_in_the_error(monkeypatch, caplog):
    monkeypatch.setattr(cpu, "RULES", [Raises(ValueError("a bug"))] + cpu.RULES)
    mod = tvm.IRModule({"scale_shift": _func()})
    with config.override(strict=False), caplog.at_level(logging.WARNING, logger="tvmfuse.schedule"):
        out = schedules.apply_default_schedules(mod, LLVM)
    assert "test.Raises on kernel scale_shift raised ValueError" in caplog.text
    assert str(out["scale_shift"].attrs["tvmfuse.rule"]) != "test.Raises"


def test_fold_constants_failing_is_surfaced(monkeypatch, caplog):
    """FoldConstantsOnce's one build failing is a bug: raised under strict, a WARNING without (and
    relax's FoldConstant folds the bindings instead)."""
    def broken(*_args):
        raise TypeError("a bug in the folding")

    monkeypatch.setattr(fold_constants, "_evaluate", broken)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            c = bb.emit(relax.op.add(relax.const(np.ones(4, "float32")), relax.const(np.ones(4, "float32"))))
            y = bb.emit_output(relax.op.add(x, c))
        bb.emit_func_output(y)
    mod = bb.get()
    with config.override(strict=True), pytest.raises(TypeError, match="a bug in the folding"):
        fold_constants.FoldConstantsOnce(mod)
    with config.override(strict=False), caplog.at_level(logging.WARNING, logger="tvmfuse.passes"):
        assert fold_constants.FoldConstantsOnce(mod) is not None
    assert "FoldConstantsOnce on main raised TypeError" in caplog.text
