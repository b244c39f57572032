"""The pipeline, the plan, the config and the debug dumps (issue 17)."""
import json
import os

import pytest
import tvm

import tvmfuse
from tvmfuse import config, pipeline
from tvmfuse.report import html as report
from tvmfuse.zoo import workloads
from tvmfuse.errors import ConfigError, UnknownKnobError
from tvmfuse.fusion.plan import Plan
from tvmfuse.fusion.te_compose import NotComposable
from conftest import real_model

DEBUG_FILES = {"00_input.py", "10_classified.txt", "20_plan.json", "30_fused.py", "40_scheduled.py",
               "50_source.ll", "pass_timing.txt"}


# ------------------------------------------------------------------------------------ config
@pytest.mark.parametrize("fusion", pipeline.VARIANTS)
def test_an_unknown_knob_names_the_known_ones(fusion):
    w = workloads.get("softmax_chain")
    with pytest.raises(UnknownKnobError) as err:
        tvmfuse.build(w.mod, "llvm", fusion, stich_reductions=False)
    assert "stich_reductions" in str(err.value) and "stitch_reductions" in str(err.value)


def test_knobs_from_the_environment_and_scopes(monkeypatch):
    mod = workloads.get("softmax_chain").mod
    assert config.knobs().max_group_size == 64
    monkeypatch.setenv("TVMFUSE_MAX_GROUP_SIZE", "1")
    assert config.knobs().max_group_size == 1
    assert "-> 4 kernels" in tvmfuse.explain(mod)  # nothing fuses under a 1-op limit
    with config.override(max_group_size=2):
        assert config.knobs().max_group_size == 2
        assert config.knobs(max_group_size=3).max_group_size == 3  # the call's keyword wins
    assert config.knobs().max_group_size == 1
    monkeypatch.setenv("TVMFUSE_SIBLING", "maybe")
    with pytest.raises(ConfigError, match="TVMFUSE_SIBLING"):
        config.knobs()
    monkeypatch.delenv("TVMFUSE_SIBLING")
    monkeypatch.setenv("TVMFUSE_MAX_GROUP_SIZ", "4")
    with pytest.raises(UnknownKnobError, match="TVMFUSE_MAX_GROUP_SIZ"):
        config.knobs()


# ------------------------------------------------------------------------------------ plan
def test_the_build_carries_its_plan():
    w = workloads.get("mlp_block")
    c = tvmfuse.build(w.mod, "llvm", "tvmfuse")
    assert c.plan is not None and Plan.of(c.mod).to_json() == c.plan.to_json()
    assert c.plan.kernels() == c.launches
    stamped = {gv.name_hint: f.attrs["tvmfuse.group"] for gv, f in c.mod.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and "tvmfuse.group" in f.attrs}
    assert sorted(stamped) == sorted(g.kernel for g in c.plan.groups if g.fused)
    for g in c.plan.groups:
        if g.fused:
            assert str(stamped[g.kernel]["ops"]) == ",".join(op for _, op, _ in g.ops)
            assert str(stamped[g.kernel]["kind"]) == g.kind == "anchor + epilogue"
    assert tvmfuse.explain(c) == c.plan.explain() == tvmfuse.explain(w.mod)
    assert tvmfuse.build(w.mod, "llvm", "tvm").plan is None


def _two_layers(second_width=16):
    """x -> relu(x @ W1 + b1) -> relu(. @ W2 + b2): two anchor + epilogue groups, with their own
    constant weights; structurally equal when the widths are."""
    import numpy as np
    from tvm import relax
    from tvm.relax import op as R

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for n in (16, second_width):
                w = relax.const(rng.standard_normal((int(h.ty.shape[1]), n)).astype("float32"))
                b = relax.const(rng.standard_normal((n,)).astype("float32"))
                h = bb.emit(R.nn.relu(bb.emit(R.add(bb.emit(R.matmul(h, w)), b))))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("width, kernels", [(16, 1), (24, 2)])
def test_structurally_equal_groups_share_one_primfunc(width, kernels):
    """A transformer's layers are the same kernel with other weights: one PrimFunc to schedule and
    compile, called once per layer (as TVM's FuseTIR shares its functions); groups of other
    shapes keep their own."""
    import numpy as np

    mod = _two_layers(width)
    c = tvmfuse.build(mod, "llvm", "tvmfuse")
    funcs = [gv.name_hint.removesuffix("_prepacked") for gv, f in c.mod.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc)]  # PrepackWeights renames the kernels it packs for
    fused = [g for g in c.plan.groups if g.fused]
    assert len(fused) == 2 and c.launches == 2
    assert len(funcs) == len({g.kernel for g in fused}) == kernels and set(funcs) == {g.kernel for g in fused}
    x = np.random.default_rng(1).standard_normal((8, 16)).astype("float32")
    ref = tvmfuse.build(mod, "llvm", "none")(x)
    np.testing.assert_allclose(c(x), ref, rtol=1e-5, atol=1e-5)


def test_a_group_te_refuses_shows_as_refused(monkeypatch):
    from tvmfuse.fusion import fuse_groups_te

    def refuse(g, members):
        raise NotComposable("refused for the test")

    monkeypatch.setattr(fuse_groups_te, "_lower_group", refuse)
    w = workloads.get("softmax_chain")
    c = tvmfuse.build(w.mod, "llvm", "tvmfuse")
    (g,) = c.plan.te_refused
    assert g.te_refused == "refused for the test" and not g.fused and g.kernel is None
    assert c.launches == c.plan.kernels() == 4
    text = tvmfuse.explain(c)
    assert "-> 4 kernels" in text and "refused by TE lowering" in text and "refused for the test" in text
    assert not [grp for grp in tvmfuse.report.viz.fusion_graph(c).groups if grp.fused]


def test_a_report_builds_each_variant_once(monkeypatch, tmp_path):
    runs = []
    real = pipeline.run

    def counting(mod, opts, until="prepack"):
        runs.append((opts.fusion, until))
        return real(mod, opts, until)

    monkeypatch.setattr(pipeline, "run", counting)
    report.run(["softmax_chain"], out=str(tmp_path / "r.html"), repeat=2)
    assert sorted(runs) == [("none", "prepack"), ("tvm", "prepack"), ("tvmfuse", "prepack")]


# ------------------------------------------------------------------------------------ debug
def _check_debug_folder(folder, fusion):
    assert set(os.listdir(folder)) == DEBUG_FILES
    plan = json.load(open(os.path.join(folder, "20_plan.json")))
    assert plan["groups"] if fusion == "tvmfuse" else plan["plan"] is None
    timing = open(os.path.join(folder, "pass_timing.txt")).read()
    for phase in pipeline.PHASES[:-1]:
        assert f"tvmfuse.{phase}" in timing
    assert "define" in open(os.path.join(folder, "50_source.ll")).read()
    assert "class Module" in open(os.path.join(folder, "30_fused.py")).read()


def test_debug_dir_for_a_zoo_workload_and_a_real_model(tmp_path, monkeypatch):
    monkeypatch.setenv("TVMFUSE_DEBUG_DIR", str(tmp_path))
    w = workloads.get("layernorm_decomposed")
    c = tvmfuse.build(w.mod, "llvm", "tvmfuse", name="layernorm_decomposed")
    assert c.debug_folder == str(tmp_path / "001-layernorm_decomposed-tvmfuse")
    _check_debug_folder(c.debug_folder, "tvmfuse")
    monkeypatch.delenv("TVMFUSE_DEBUG_DIR")
    m = real_model("resnet-tiny")  # tvmfuse.load_model("resnet-tiny"), shared with the other files
    c = tvmfuse.build(m.mod, "llvm", "tvm", debug_dir=tmp_path, name="resnet-tiny")
    assert os.path.basename(c.debug_folder) == "002-resnet-tiny-tvm"
    _check_debug_folder(c.debug_folder, "tvm")
    assert tvmfuse.build(w.mod, "llvm", "tvm").debug_folder is None  # off unless asked for


def test_user_instruments_see_every_phase():
    seen = []

    @tvm.ir.instrument.pass_instrument
    class Phases:
        def run_after_pass(self, mod, info):
            if info.name.startswith("tvmfuse."):
                seen.append(info.name)

    tvmfuse.build(workloads.get("softmax_chain").mod, "llvm", "tvmfuse", instruments=[Phases()])
    phases = [n for n in seen if n.removeprefix("tvmfuse.") in pipeline.PHASES]
    assert phases == [f"tvmfuse.{p}" for p in pipeline.PHASES]
