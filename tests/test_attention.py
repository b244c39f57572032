"""Fused attention (issue 16): recognition in every spelling, one kernel with an online softmax,
numerics against numpy and the frameworks, minimal bytes, and the cases that must not fire."""
import logging

import re

import numpy as np
import pytest
from tvm import relax
from tvm.relax import op as R

import tvmfuse
from tvmfuse.zoo import workloads
from tvmfuse.relax_utils import call_tir_sites
from tvmfuse.runtime.metrics import bytes_moved
from conftest import built_model, real_model


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


@pytest.mark.parametrize("seq, expected", [
    (197, (1, 40)),  # ViT: 224 rows in 32-row blocks instead of 256; 200 keys instead of 224
    (77, (1, 40)), (300, (2, 32)), (192, (2, 32)),
    (128, (4, 32)), (2048, (4, 32)), (1000, (4, 32)),  # must not move: no block pads less
])
def test_ragged_sequences_take_the_blocks_that_pad_least(seq, expected):
    from schedules.cpu.attention import least_padding

    assert least_padding(seq, 32, 4, seq, 8, 32) == expected
    assert least_padding("sym0", 32, 4, "sym1", 8, 32) == (4, 32)  # symbolic: the table's


@pytest.mark.parametrize("seq", [77, 197, 300])
@pytest.mark.parametrize("mask", [None, "causal"])
def test_the_blocks_chosen_for_ragged_sequences_are_right(seq, mask):
    w = workloads.attention_workload(1, seq, 12, 64, mask)  # 12 heads: every core busy at the table's blocks
    c = tvmfuse.build(w.mod, "llvm", "tvmfuse")
    assert c.launches == 1 and _rules(c) == {"fused_attention": "cpu.Attention"}
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


@pytest.mark.parametrize("name", ["bert-tiny", "gpt2-tiny", "bert-tiny-onnx", "llama-tiny"])
def test_real_models_get_one_attention_kernel_per_layer(name):
    m = real_model(name)  # tvmfuse.load(name), shared with the other files
    c = built_model(name, "tvmfuse")
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
    from tvmfuse.fusion import legality
    from tvmfuse.fusion.plan_fusion import DEFAULT_KNOBS, plan

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


@pytest.mark.parametrize("heads,dh,split", [(12, 64, True), (2, 6, False)])
def test_cuda_kernel_splits_a_rows_keys_over_threads_where_it_can(heads, dh, split):
    """The CUDA flash kernel runs `attn_key_split` threads per query row (partial softmax states
    merged in shared memory: 1.13-1.7x faster than a thread per row on an H200, right at every
    length, results/gpu/h200-2026-12-04-attention-split.md); a head dim the split does not divide
    keeps the thread-per-row kernel. Either way one kernel."""
    from schedules.targets import CUDA

    w = workloads.attention_workload(1, 77, heads, dh, "causal")
    c = tvmfuse.build(w.mod, "cuda", "tvmfuse")
    assert c.launches == 1 and c.kernels_per_func() == {"fused_attention": 1}
    threads = int(re.search(r"__launch_bounds__\((\d+)\) fused_attention_kernel", c.source()).group(1))
    if split:
        assert threads == CUDA["attn_split_rows"] * CUDA["attn_key_split"] and "sm_ptr" in c.source()
    else:
        assert threads <= CUDA["attn_query_rows"] and "sm_ptr" not in c.source()


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
    assert json.load(open(out))["machine"]["mcpu"] and "machine: " in table


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


def _grouped_query(b, h, g, s, dh, spelling="repeat_kv"):
    """Attention with h query heads on g key/value heads, K and V repeated as transformers'
    repeat_kv does (expand_dims, broadcast_to, reshape); `spelling` "tile": the kv heads repeated
    the other way round (g-major), which is not what repeat_kv means and must not fuse."""
    rep = h // g
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((b, h, s, dh), "float32"))
    k, v = (relax.Var(n, relax.TensorType((b, g, s, dh), "float32")) for n in "kv")

    def repeated(x):
        if spelling == "tile":  # [b, rep, g, s, dh]: head i reads kv head i % g
            e = bb.emit(R.broadcast_to(bb.emit(R.expand_dims(x, 1)), (b, rep, g, s, dh)))
        else:
            e = bb.emit(R.broadcast_to(bb.emit(R.expand_dims(x, 2)), (b, g, rep, s, dh)))
        return bb.emit(R.reshape(e, (b, h, s, dh)))

    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            sc = bb.emit(R.matmul(q, bb.emit(R.permute_dims(repeated(k), [0, 1, 3, 2]))))
            sc = bb.emit(R.multiply(sc, relax.const(dh ** -0.5, "float32")))
            o = bb.emit_output(bb.emit(R.matmul(bb.emit(R.nn.softmax(sc, axis=-1)), repeated(v))))
        bb.emit_func_output(o)
    return bb.get()


@pytest.mark.parametrize("h, g, s", [(4, 2, 16), (9, 3, 37), (6, 1, 7)])
def test_grouped_query_attention_is_one_kernel_reading_kv_unrepeated(h, g, s):
    b, dh = 1, 16
    rng = np.random.default_rng(0)
    q = rng.standard_normal((b, h, s, dh)).astype("float32")
    k, v = (rng.standard_normal((b, g, s, dh)).astype("float32") for _ in range(2))
    kr, vr = (np.repeat(x, h // g, axis=1) for x in (k, v))  # head i reads kv head i // (h / g)
    sc = q @ kr.transpose(0, 1, 3, 2) * dh ** -0.5
    e = np.exp(sc - sc.max(-1, keepdims=True))
    ref = (e / e.sum(-1, keepdims=True)) @ vr
    c = tvmfuse.build(_grouped_query(b, h, g, s, dh), "llvm", "tvmfuse")
    assert c.launches == 1 and _rules(c) == {"fused_attention": "cpu.Attention"}
    np.testing.assert_allclose(c(q, k, v), ref, rtol=1e-4, atol=1e-5)
    nbytes, _reads, writes = bytes_moved(c.mod)
    assert nbytes == 4 * (2 * b * h * s * dh + 2 * b * g * s * dh) and writes == 1  # K, V never repeated
    cu = tvmfuse.build(_grouped_query(b, h, g, s, dh), "cuda", "tvmfuse")
    assert cu.launches == 1 and cu.kernels_per_func() == {"fused_attention": 1}


def test_kv_heads_repeated_the_other_way_are_not_fused(caplog):
    with caplog.at_level(logging.INFO, logger="tvmfuse.fusion"):
        c = tvmfuse.build(_grouped_query(1, 4, 2, 8, 8, "tile"), "llvm", "tvmfuse")
    assert not _attention_kernels(c)
    assert "is not fused as attention" in caplog.text


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


def _symbolic_attention(heads=2, dh=16):
    """Attention over a symbolic batch b and sequence s, with a [b, 1, 1, s] additive mask."""
    from tvm.script import ir as I, relax as RS, tirx as T

    dm = heads * dh

    @I.ir_module
    class Mod:
        @RS.function
        def main(q: RS.Tensor(("b", "s", dm), "float32"), k: RS.Tensor(("b", "s", dm), "float32"),
                 v: RS.Tensor(("b", "s", dm), "float32"), mask: RS.Tensor(("b", 1, 1, "s"), "float32")):
            b, s = T.int64(), T.int64()
            with RS.dataflow():
                qh = RS.permute_dims(RS.reshape(q, RS.shape([b, s, heads, dh])), [0, 2, 1, 3])
                kt = RS.permute_dims(RS.reshape(k, RS.shape([b, s, heads, dh])), [0, 2, 3, 1])
                vh = RS.permute_dims(RS.reshape(v, RS.shape([b, s, heads, dh])), [0, 2, 1, 3])
                sc = RS.add(RS.multiply(RS.matmul(qh, kt), RS.const(dh ** -0.5, "float32")), mask)
                o = RS.matmul(RS.nn.softmax(sc, axis=-1), vh)
                out = RS.reshape(RS.permute_dims(o, [0, 2, 1, 3]), RS.shape([b, s, dm]))
                RS.output(out)
            return out

    def ref(q, k, v, mask):
        b, s, _ = q.shape
        th = lambda t: t.reshape(b, s, heads, dh).transpose(0, 2, 1, 3)  # noqa: E731
        sc = th(q) @ th(k).transpose(0, 1, 3, 2) * np.float32(dh ** -0.5) + mask
        e = np.exp(sc - sc.max(-1, keepdims=True))
        return ((e / e.sum(-1, keepdims=True)) @ th(v)).transpose(0, 2, 1, 3).reshape(b, s, dm)

    return Mod, ref


def test_symbolic_batch_and_sequence_is_one_kernel_at_every_size():
    """One build over a symbolic batch and sequence: one flash-attention kernel (llvm; CUDA
    compiles to one __global__), right at ragged sizes including 1 and a 1000-token sequence."""
    mod, ref = _symbolic_attention()
    c = tvmfuse.build(mod, "llvm", "tvmfuse")
    assert c.launches == 1 and _rules(c) == {"fused_attention": "cpu.Attention"}
    rng = np.random.default_rng(0)
    for b, s in ((1, 1), (2, 7), (1, 128), (1, 1000)):
        q, k, v = (rng.standard_normal((b, s, 32)).astype("float32") for _ in range(3))
        mask = np.where(rng.random((b, 1, 1, s)) < 0.2, -1e4, 0.0).astype("float32")
        np.testing.assert_allclose(c(q, k, v, mask), ref(q, k, v, mask), rtol=1e-4, atol=1e-5)
    cu = tvmfuse.build(mod, "cuda", "tvmfuse")
    assert cu.launches == 1 and cu.kernels_per_func() == {"fused_attention": 1}


def test_a_compound_symbolic_dim_is_one_attention_kernel():
    """Keys of `2 * s` (a concat of two halves): the kernel binds s from Q's buffer and writes the
    key extent as an expression of it (llvm runs it at three sizes; CUDA compiles one kernel)."""
    from tvm.script import ir as I, relax as RS, tirx as T

    @I.ir_module
    class Mod:
        @RS.function
        def main(q: RS.Tensor((1, 2, "s", 8), "float32"), k: RS.Tensor((1, 2, "s", 8), "float32"),
                 v: RS.Tensor((1, 2, "s", 8), "float32")):
            s = T.int64()
            with RS.dataflow():
                kk = RS.concat([k, k], axis=2)
                vv = RS.concat([v, v], axis=2)
                p = RS.nn.softmax(RS.matmul(q, RS.permute_dims(kk, [0, 1, 3, 2])), axis=-1)
                o = RS.matmul(p, vv)
                RS.output(o)
            return o

    c = tvmfuse.build(Mod, "llvm", "tvmfuse")
    assert len(_attention_kernels(c)) == 1, [(g.names, g.te_refused) for g in c.plan.groups]
    assert _rules(c)["fused_attention"] == "cpu.Attention"
    rng = np.random.default_rng(1)
    for s in (1, 5, 40):
        q, k, v = (rng.standard_normal((1, 2, s, 8)).astype("float32") for _ in range(3))
        kk, vv = np.concatenate([k, k], 2), np.concatenate([v, v], 2)
        sc = q @ kk.transpose(0, 1, 3, 2)
        e = np.exp(sc - sc.max(-1, keepdims=True))
        np.testing.assert_allclose(c(q, k, v), (e / e.sum(-1, keepdims=True)) @ vv, rtol=1e-4, atol=1e-5)
    cu = tvmfuse.build(Mod, "cuda", "tvmfuse")
    assert cu.kernels_per_func().get("fused_attention") == 1
