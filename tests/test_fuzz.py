"""Differential fuzzing of fusion (tvmfuse.fuzz): the fixed-seed CI slice, a hypothesis run that
shrinks, the generator's own guarantees, and a fault injected into the fusion path being caught.

A failing seed here is shrunk with `tvmfuse.fuzz.shrink.shrink_seed(seed, MAX_OPS, fails)` or
scripts/fuzz.py, then saved under tests/regressions/ (tests/test_fuzz_regressions.py replays it).
"""
import collections
import json

import pytest
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax

from tvmfuse.fusion import te_compose
from tvmfuse.fuzz import (ALL_OPS, HypothesisSource, RandomSource, check_spec, generate, make_inputs, spec_ops,
                          to_module)
from tvmfuse.fuzz.shrink import shrink_seed

SLICE = range(200)  # the fixed-seed slice CI runs: 200 graphs x 3 builds
MAX_OPS = 6


def _spec(seed):
    return generate(RandomSource(seed), MAX_OPS)


@pytest.mark.parametrize("seed", SLICE)
def test_fixed_seed_slice(seed):
    spec = _spec(seed)
    out = check_spec(spec)
    assert out.ok, f"seed {seed}: {out}\nspec: {json.dumps(spec)}"


def test_slice_covers_every_op_dtype_and_shape_kind():
    specs = [_spec(s) for s in SLICE]
    ops = collections.Counter(op for s in specs for op in spec_ops(s))
    assert set(ALL_OPS) <= set(ops), f"not covered: {set(ALL_OPS) - set(ops)}"
    dtypes = {i["dtype"] for s in specs for i in s["inputs"]}
    assert dtypes == {"float32", "float16"}
    dims = {d for s in specs for i in s["inputs"] for d in i["shape"]}
    assert {1, 3, 7, 13, 17} <= dims
    assert sum(len(s["outputs"]) > 1 for s in specs) >= 50  # multi-output graphs
    # the attention composite (matmul with a permuted K, scale, mask, softmax, matmul with V), a
    # symbolic one among them
    attn = [s for s in specs if any(o["op"] == "softmax" and o["attrs"].get("axis") == -1 for o in s["ops"])
            and sum(o["op"] == "matmul" for o in s["ops"]) >= 2]
    assert len(attn) >= 5 and any(s.get("symbolic") for s in attn), len(attn)
    assert any(i["shape"] == [] or len(i["shape"]) == 4 for s in specs for i in s["inputs"])
    # a quarter of the graphs: the leading dim symbolic, built once, checked at two sizes
    assert sum(bool(s.get("symbolic")) for s in specs) >= len(SLICE) // 5


@settings(max_examples=30, derandomize=True, database=None, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(st.data())
def test_hypothesis_graphs_fuse_correctly(data):
    spec = generate(HypothesisSource(data), MAX_OPS)
    out = check_spec(spec)
    assert out.ok, f"{out}\nspec: {json.dumps(spec)}"


def test_generator_is_deterministic_and_json_round_trips():
    a, b = _spec(7), _spec(7)
    assert a == b and a != _spec(8)
    assert json.loads(json.dumps(a)) == a
    mod = to_module(a)
    assert relax.analysis.well_formed(mod) in (None, True)  # 0.27 returns None when well formed
    xs = make_inputs(a)
    assert [list(x.shape) for x in xs] == [i["shape"] for i in a["inputs"]]


def test_generated_values_stay_in_range():
    import numpy as np

    import tvmfuse

    for seed in range(5):
        spec = _spec(seed)
        out = tvmfuse.build(to_module(spec), "llvm", "none")(*make_inputs(spec))
        for o in out if isinstance(out, tuple) else (out,):
            assert np.isfinite(o.astype("float64")).all()


def test_injected_fusion_fault_is_caught_and_shrunk(monkeypatch):
    """Make the fused path compute `subtract` as `add` (only inside fused groups: single ops are
    legalized by TVM). The differential check must catch it and shrink it to a tiny graph."""
    orig = te_compose.op_to_te

    def faulty(call, env):
        if call.op.name == "relax.subtract":
            call = relax.Call(tvm.ir.Op.get("relax.add"), call.args, call.attrs, call.ty_args)
        return orig(call, env)

    monkeypatch.setattr(te_compose, "op_to_te", faulty)
    failing = next(s for s in range(60) if "subtract" in spec_ops(_spec(s)) and check_spec(_spec(s)).kind == "mismatch")
    small = shrink_seed(failing, MAX_OPS, lambda sp: check_spec(sp).kind == "mismatch", budget=60)
    assert small is not None and "subtract" in spec_ops(small)
    # at most one composite's worth (layer_norm_decomposed is 7 ops, shrunk as one choice)
    assert len(small["ops"]) <= 7 < len(_spec(failing)["ops"]), small
    assert check_spec(small).variant == "tvmfuse"


def test_a_flaky_failure_keeps_its_first_outcome(monkeypatch):
    """A graph that fails once and passes on re-check is recorded with the first failure's detail,
    marked flaky (the 10,000-graph campaign recorded two such as a bare "ok")."""
    from tvmfuse.fuzz import campaign
    from tvmfuse.fuzz.check import Outcome

    calls = []

    def once(spec, *args, **kwargs):
        calls.append(spec)
        return Outcome(False, "mismatch", "tvmfuse", "boom") if len(calls) == 1 else Outcome(True)

    monkeypatch.setattr(campaign, "check_spec", once)
    monkeypatch.setattr(campaign, "shrink_seed", lambda *a, **k: None)
    s = campaign.run(minutes=0.0005, seed=1, max_ops=3)
    assert s.failures, "the first failure was not recorded"
    f = s.failures[0]
    assert (f["kind"], f["variant"]) == ("mismatch", "tvmfuse")
    assert f["detail"] == "flaky (passed on re-check): boom"


# ---------------------------------------------------------------------------- large shapes
LARGE_SEEDS = (4, 7)  # Winograd; a 1x1 conv as a matmul beside a streamed relu


def test_large_graphs_take_each_cpu_rewrite_and_match():
    """--shapes large: a handful of graphs whose tvmfuse builds take Winograd, the 1x1 conv as a
    matmul and streaming stores, each checked against a reference built with the rewrites off."""
    from tvmfuse.fuzz import generate_large
    from tvmfuse.fuzz.rewrites import REWRITES

    took = collections.Counter()
    for seed in LARGE_SEEDS:
        spec = generate_large(RandomSource(seed))
        assert spec["reference_cpu"] == {"winograd": 0, "conv1x1_matmul_fill": 0, "streaming_stores": 0}
        out = check_spec(spec)
        assert out.ok, f"large seed {seed}: {out}\nspec: {json.dumps(spec)}"
        took.update(k for k in REWRITES if out.rewrites[k])
    assert set(took) == set(REWRITES), took


def test_the_large_reference_takes_no_rewrite_and_overrides_are_restored():
    import tvmfuse
    from schedules import targets
    from tvmfuse.fuzz import generate_large
    from tvmfuse.fuzz.large import cpu_overrides
    from tvmfuse.fuzz.rewrites import StreamWatch, taken

    spec = generate_large(RandomSource(7))  # a 1x1 conv and a 5 MiB relu
    before = dict(targets.cpu_table())
    for cpu, expect in ((spec["cpu"], 1), ({**spec["cpu"], **spec["reference_cpu"]}, 0)):
        watch = StreamWatch()
        with cpu_overrides(cpu):
            built = tvmfuse.build(to_module(spec), "llvm", "none", instruments=[watch])
        got = taken(built, spec, watch)
        assert (got["conv1x1_matmul"] > 0, got["streaming_stores"] > 0) == (bool(expect), bool(expect)), got
    assert targets.cpu_table() == before


def test_a_graph_over_the_time_limit_is_stopped_and_reported(tmp_path):
    """scripts/fuzz.py --graph-timeout: the child is killed, the graph reported with its seed, and
    the campaign goes on from the next seed."""
    from tvmfuse.fuzz.supervise import supervise

    s = supervise(["--max-ops", "2", "--shapes", "small"], minutes=3, seed=3, max_ops=2, shapes="small",
                  graph_timeout=0.01, log_path=str(tmp_path / "log.jsonl"), max_timeouts=2)
    assert [t["seed"] for t in s.timeouts] == [3, 4] and s.timeouts[0]["what"] == "timeout"
    assert s.timeouts[0]["spec"] == generate(RandomSource(3), 2)


def test_summaries_merge_and_render():
    from tvmfuse.fuzz.campaign import Summary
    from tvmfuse.fuzz.record import document, markdown

    a, b = Summary("random", 0, 2, shapes="large"), Summary("random", 9, 2, shapes="large")
    a.graphs, b.graphs, a.rewrites["winograd"], b.rewrites["winograd"] = 3, 4, 1, 2
    b.timeouts.append({"seed": 11, "spec_id": "x", "what": "timeout", "seconds": 31.0})
    a.merge(b)
    assert (a.graphs, a.rewrites["winograd"], a.seed, len(a.timeouts)) == (7, 3, 0, 1)
    text = markdown(document(a, "scripts/fuzz.py --shapes large", {"stream_output_pct": 1}))
    assert "| graphs whose tvmfuse build took: Winograd F(m x m, 3x3) | 3 |" in text and "seed 11" in text
