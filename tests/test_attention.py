"""Fused attention (issue 16): recognition in every spelling, one kernel with an online softmax,
numerics against numpy and the frameworks, minimal bytes, and the cases that must not fire."""
import logging

import numpy as np
import pytest
from tvm import relax
from tvm.relax import op as R

import tvmfuse
from tvmfuse import workloads
from tvmfuse.relax_utils import call_tir_sites
from tvmfuse.runtime import bytes_moved


def _attention_kernels(c):
    return [g for g in c.plan.groups if g.kind == "flash attention"]


def _rules(c):
    return {gv.name_hint: str(f.attrs["tvmfuse.rule"]) for gv, f in c.mod.functions_items()
            if "attention" in gv.name_hint and f.attrs and "tvmfuse.rule" in f.attrs}


@pytest.mark.parametrize("mask", [None, "causal", "additive"])
def test_attention_is_one_kernel_and_matches_numpy(mask):
    w = workloads.attention_workload(1, 16, 2, 8, mask)
    c = tvmfuse.build(w.mod, "llvm", "tvmfuse")
    assert c.launches == 1 and len(_attention_kernels(c)) == 1
    assert _rules(c) == {"fused_attention": "cpu.Attention"}
    ins = w.inputs()
    np.testing.assert_allclose(c(*ins), w.reference(*ins), rtol=1e-4, atol=1e-5)
    cu = tvmfuse.build(w.mod, "cuda", "tvmfuse")  # compiles here; runs where there is a GPU
    assert cu.launches == 1 and cu.kernels_per_func() == {"fused_attention": 1}


@pytest.mark.parametrize("seq", [1, 7, 128, 1000])
@pytest.mark.parametrize("mask", [None, "causal", "additive"])
def test_ragged_sequence_lengths(seq, mask):
    w = workloads.attention_workload(1, seq, 2, 16, mask)
    c = tvmfuse.build(w.mod, "llvm", "tvmfuse")
    assert c.launches == 1 and _rules(c) == {"fused_attention": "cpu.Attention"}
    ins = w.inputs()
    np.testing.assert_allclose(c(*ins), w.reference(*ins), rtol=1e-4, atol=1e-5)


def test_head_dim_64_and_vit_tokens():
    w = workloads.attention_workload(2, 197, 3, 64, "additive")
    c = tvmfuse.build(w.mod, "llvm", "tvmfuse")
    ins = w.inputs()
    np.testing.assert_allclose(c(*ins), w.reference(*ins), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mask", [None, "additive", "causal"])
def test_bytes_moved_are_the_minimal_bytes(mask):
    w = workloads.attention_workload(1, 64, 4, 16, mask)
    c = tvmfuse.build(w.mod, "llvm", "tvmfuse")
    nbytes, reads, writes = bytes_moved(c.mod)
    minimal = sum(a.nbytes for a in w.inputs()) + w.reference(*w.inputs()).nbytes
    if mask == "causal":  # the where's condition, a [1, 1, S, S] bool constant, is read like any mask
        minimal += 64 * 64
    assert nbytes == minimal and writes == 1
    unfused = bytes_moved(tvmfuse.build(w.mod, "llvm", "tvmfuse", attention=False).mod)[0]
    assert unfused > nbytes + 2 * 4 * 64 * 64 * 4  # the [4, 64, 64] scores written and read back


@pytest.mark.parametrize("name", ["bert-tiny", "gpt2-tiny", "bert-tiny-onnx"])
def test_real_models_get_one_attention_kernel_per_layer(name):
    m = tvmfuse.load(name)
    c = tvmfuse.build(m.mod, "llvm", "tvmfuse")
    assert len(_attention_kernels(c)) == 2  # two layers
    assert set(_rules(c).values()) == {"cpu.Attention"}
    ins = m.inputs()
    out, ref = c(*ins), m.reference(*ins)
    for a, b in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
        np.testing.assert_allclose(a, b, rtol=m.rtol, atol=m.atol)


def test_the_knob_turns_it_off():
    w = workloads.get("attention")
    c = tvmfuse.build(w.mod, "llvm", "tvmfuse", attention=False)
    assert not _attention_kernels(c) and c.launches == 3


# ------------------------------------------------------------------------------ must not fire
def _scores_graph(softmax_axis=-1, scores_out=False):
    b, h, s, d = 1, 2, 8, 4
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(n, relax.TensorType((b, h, s, d), "float32")) for n in "qkv")
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            sc = bb.emit(R.matmul(q, bb.emit(R.permute_dims(k, [0, 1, 3, 2]))))
            p = bb.emit(R.nn.softmax(sc, axis=softmax_axis))
            o = bb.emit(R.matmul(p, v))
            outs = [bb.emit_output(o)] + ([bb.emit_output(sc)] if scores_out else [])
        bb.emit_func_output(relax.Tuple(outs) if scores_out else outs[0])
    return bb.get()


@pytest.mark.parametrize("case, why", [
    (dict(softmax_axis=2), "not the key axis"),
    (dict(scores_out=True), "scores would be written"),
])
def test_must_not_fire(case, why, caplog):
    mod = _scores_graph(**case)
    with caplog.at_level(logging.INFO, logger="tvmfuse.fusion"):
        c = tvmfuse.build(mod, "llvm", "tvmfuse")
    assert not _attention_kernels(c) and why in caplog.text
    assert "needs the whole output of the anchor" in tvmfuse.explain(c)  # the ordinary refusal stands
    ins = [np.random.default_rng(i).standard_normal((1, 2, 8, 4)).astype("float32") for i in range(3)]
    ref = tvmfuse.build(mod, "llvm", "none")(*ins)
    for a, b in zip(c(*ins) if case.get("scores_out") else (c(*ins),), ref if case.get("scores_out") else (ref,)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_the_group_is_legal_only_as_a_whole():
    """Legality's flash-attention rule covers exactly the matched ops: softmax with one matmul alone
    is still refused."""
    from tvmfuse.passes import legality
    from tvmfuse.passes.plan_fusion import DEFAULT_KNOBS, plan

    mod = tvmfuse.pipeline.fold_constants(workloads.get("attention").mod)
    p = plan(mod["main"].body.blocks[0], set(), DEFAULT_KNOBS)
    (members,) = [m for m in p.groups if m[0] in p.attention]
    assert legality.check(p.graph, set(members), DEFAULT_KNOBS) is None
    sm = next(i for i in members if p.graph.by_idx[i].op == "nn.softmax")
    mm = next(i for i in members if p.graph.by_idx[i].op == "matmul")
    assert legality.check(p.graph, {sm, mm}, DEFAULT_KNOBS)[0] == "anchor"


def test_cuda_compiles_to_one_kernel():
    w = workloads.attention_workload(1, 100, 2, 32, "additive")
    c = tvmfuse.build(w.mod, "cuda", "tvmfuse")
    assert c.launches == 1 and c.kernels_per_func() == {"fused_attention": 1}
    assert "__shared__" in c.source()


def test_bench_attention_script_runs(tmp_path, capsys):
    import importlib.util
    import json
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "bench_attention.py")
    spec = importlib.util.spec_from_file_location("bench_attention", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "a.json"
    assert mod.main(["--seqs", "9", "--heads", "2", "--head-dim", "8", "--rounds", "1", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| 9 |" in table and "speedup vs sdpa" in table and "| 1 / 3 / 7 | ok |" in table
    row = json.load(open(out))["rows"][0]
    assert set(row["ms"]) == {"tvmfuse", "tvmfuse-unfused", "tvm", "torch sdpa"} and all(row["ok"].values())


def test_a_fully_masked_row_and_an_infinite_fill():
    """transformers fill masks with finfo(float32).min: a row with every key masked still gets a
    softmax (uniform), as in numpy; a -inf fill in where() parses and masks."""
    b, s, h, dh = 1, 8, 2, 4
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((b, h, s, dh)).astype("float32") for _ in range(3))
    mask = np.zeros((b, 1, s, s), "float32")
    mask[:, :, 3, :] = np.finfo(np.float32).min  # row 3: every key masked
    tril = np.tril(np.ones((s, s), bool)).reshape(1, 1, s, s)

    def graph(kind):
        bb = relax.BlockBuilder()
        params = [relax.Var(n, relax.TensorType((b, h, s, dh), "float32")) for n in "qkv"]
        if kind == "add":
            params.append(relax.Var("m", relax.TensorType((b, 1, s, s), "float32")))
        with bb.function("main", params):
            with bb.dataflow():
                sc = bb.emit(R.matmul(params[0], bb.emit(R.permute_dims(params[1], [0, 1, 3, 2]))))
                sc = bb.emit(R.add(sc, params[3]) if kind == "add" else
                             R.where(relax.const(tril), sc, relax.const(float("-inf"), "float32")))
                o = bb.emit_output(bb.emit(R.matmul(bb.emit(R.nn.softmax(sc, axis=-1)), params[2])))
            bb.emit_func_output(o)
        return bb.get()

    def softmax_v(sc):
        e = np.exp(sc - sc.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ v

    for kind, args, ref in (("add", (q, k, v, mask), softmax_v(q @ k.transpose(0, 1, 3, 2) + mask)),
                            ("where", (q, k, v), softmax_v(np.where(tril, q @ k.transpose(0, 1, 3, 2), -np.inf)))):
        c = tvmfuse.build(graph(kind), "llvm", "tvmfuse")
        assert _rules(c) == {"fused_attention": "cpu.Attention"}, kind
        np.testing.assert_allclose(c(*args), ref, rtol=1e-4, atol=1e-5, err_msg=kind)


def test_an_operand_inside_the_match_is_refused():
    """add(scores, scores): the 'mask' is the score matrix itself; not an attention."""
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(n, relax.TensorType((1, 2, 8, 4), "float32")) for n in "qkv")
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            sc = bb.emit(R.matmul(q, bb.emit(R.permute_dims(k, [0, 1, 3, 2]))))
            o = bb.emit_output(bb.emit(R.matmul(bb.emit(R.nn.softmax(bb.emit(R.add(sc, sc)), axis=-1)), v)))
        bb.emit_func_output(o)
    c = tvmfuse.build(bb.get(), "llvm", "tvmfuse")
    assert not _attention_kernels(c)
