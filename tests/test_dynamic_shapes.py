"""Symbolic shapes (issue 18): a graph with a symbolic batch or sequence fuses to the launch count
of its static build, its kernels take the real schedule rules (not cpu.Fallback), and one build
matches numpy at several sizes."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R, tirx as T

import tvmfuse
from tvmfuse import pipeline
from tvmfuse.relax_utils import SymDim, dims, planning_bytes, NOMINAL_EXTENT

F32 = "float32"
SIZES = (1, 7, 64, 301)  # a single row, a ragged tile, a whole number of tiles, a prime-ish count


def _rules(compiled):
    """The rule of every kernel call of main (a kernel shared by several layers counts per call)."""
    return sorted(r for r in compiled.rules() if r != "-")


def _static(mod, **values):
    return relax.transform.BindSymbolicVars(values)(mod)


@I.ir_module
class Mlp:  # the Linear -> ReLU -> Linear -> softmax -> +x -> LayerNorm, symbolic batch
    @R.function
    def main(x: R.Tensor(("n", 64), "float32"), w1: R.Tensor((64, 128), "float32"),
             w2: R.Tensor((128, 64), "float32"), g: R.Tensor((64,), "float32"), b: R.Tensor((64,), "float32")):
        n = T.int64()
        with R.dataflow():
            h = R.nn.relu(R.matmul(x, w1))
            y = R.matmul(h, w2)
            s = R.nn.softmax(y, axis=-1)
            o = R.nn.layer_norm(R.add(s, x), g, b, axes=[-1])
            R.output(o)
        return o


def _mlp_ref(x, w1, w2, g, b):
    y = np.maximum(x @ w1, 0) @ w2
    e = np.exp(y - y.max(-1, keepdims=True))
    r = e / e.sum(-1, keepdims=True) + x
    return (r - r.mean(-1, keepdims=True)) / np.sqrt(r.var(-1, keepdims=True) + 1e-5) * g + b


def _mlp_weights(rng):
    return [(rng.standard_normal((64, 128)) * 0.1).astype(F32), (rng.standard_normal((128, 64)) * 0.1).astype(F32),
            rng.standard_normal(64).astype(F32), rng.standard_normal(64).astype(F32)]


def test_mlp_symbolic_batch_fuses_like_static_and_matches_at_every_size():
    rng = np.random.default_rng(0)
    weights = _mlp_weights(rng)
    dyn = tvmfuse.build(Mlp, "llvm", "tvmfuse")
    static = tvmfuse.build(_static(Mlp, n=64), "llvm", "tvmfuse")
    assert dyn.launches == static.launches == 3  # matmul+relu | matmul | softmax+add+layer_norm
    assert dyn.launches < tvmfuse.build(Mlp, "llvm", "none").launches
    assert "cpu.Fallback" not in _rules(dyn), _rules(dyn)
    assert _rules(dyn) == _rules(static)
    for n in SIZES:
        x = rng.standard_normal((n, 64)).astype(F32)
        np.testing.assert_allclose(dyn(x, *weights), _mlp_ref(x, *weights), rtol=1e-4, atol=1e-4)


@I.ir_module
class Block:  # a transformer layer's ops around attention, symbolic sequence s
    @R.function
    def main(x: R.Tensor((1, "s", 64), "float32"), wq: R.Tensor((64, 64), "float32"),
             wk: R.Tensor((64, 64), "float32"), wv: R.Tensor((64, 64), "float32"),
             w1: R.Tensor((64, 256), "float32"), w2: R.Tensor((256, 64), "float32"),
             g: R.Tensor((64,), "float32"), b: R.Tensor((64,), "float32")):
        s = T.int64()
        with R.dataflow():
            q = R.permute_dims(R.reshape(R.matmul(x, wq), R.shape([1, s, 4, 16])), [0, 2, 1, 3])
            k = R.permute_dims(R.reshape(R.matmul(x, wk), R.shape([1, s, 4, 16])), [0, 2, 3, 1])
            v = R.permute_dims(R.reshape(R.matmul(x, wv), R.shape([1, s, 4, 16])), [0, 2, 1, 3])
            p = R.nn.softmax(R.multiply(R.matmul(q, k), R.const(0.25, "float32")), axis=-1)
            a = R.reshape(R.permute_dims(R.matmul(p, v), [0, 2, 1, 3]), R.shape([1, s, 64]))
            h = R.nn.layer_norm(R.add(a, x), g, b, axes=[-1])
            f = R.matmul(R.nn.gelu(R.matmul(h, w1)), w2)
            o = R.nn.layer_norm(R.add(f, h), g, b, axes=[-1])
            R.output(o)
        return o


def _block_ref(x, wq, wk, wv, w1, w2, g, b):
    from math import erf

    def ln(r):
        return (r - r.mean(-1, keepdims=True)) / np.sqrt(r.var(-1, keepdims=True) + 1e-5) * g + b

    s = x.shape[1]
    heads = lambda t: t.reshape(1, s, 4, 16).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = heads(x @ wq), heads(x @ wk), heads(x @ wv)
    sc = q @ k.transpose(0, 1, 3, 2) * 0.25
    e = np.exp(sc - sc.max(-1, keepdims=True))
    a = ((e / e.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(1, s, 64)
    h = ln(a + x)
    u = h @ w1
    gelu = 0.5 * u * (1 + np.vectorize(erf)(u / np.sqrt(2)).astype(F32))
    return ln(gelu @ w2 + h)


@pytest.mark.parametrize("attention", [False, True])
def test_transformer_block_symbolic_sequence(attention):
    """Both builds take the same path and launch alike, with or without the flash-attention kernel
    (with it, the symbolic build's attention is one kernel over the symbolic sequence too)."""
    rng = np.random.default_rng(1)
    ws = [(rng.standard_normal(sh) * 0.2).astype(F32) for sh in [(64, 64)] * 3 + [(64, 256), (256, 64)]]
    ws += [rng.standard_normal(64).astype(F32), rng.standard_normal(64).astype(F32)]
    dyn = tvmfuse.build(Block, "llvm", "tvmfuse", attention=attention)
    static = tvmfuse.build(_static(Block, s=128), "llvm", "tvmfuse", attention=attention)
    assert dyn.launches == static.launches
    assert dyn.launches < tvmfuse.build(Block, "llvm", "tvm").launches
    assert "cpu.Fallback" not in _rules(dyn), _rules(dyn)
    assert _rules(dyn).count("cpu.Attention") == (1 if attention else 0)
    for s in (1, 7, 33, 128):
        x = rng.standard_normal((1, s, 64)).astype(F32)
        np.testing.assert_allclose(dyn(x, *ws), _block_ref(x, *ws), rtol=1e-3, atol=1e-3)


def test_symdim_equality_is_provable_equality():
    n, m = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("n", "int64")  # same name, another variable
    tn = relax.TensorType([n * 2, 64], F32)
    assert dims(tn) == dims(relax.TensorType([n + n, 64], F32))
    assert dims(tn) != dims(relax.TensorType([m * 2, 64], F32))
    assert dims(tn) != (128, 64) and SymDim(n) != NOMINAL_EXTENT
    assert planning_bytes(tn) == 2 * NOMINAL_EXTENT * 64 * 4


def test_a_merge_needing_an_unprovable_equality_is_refused():
    """softmax over x's n rows, a column sum, then softmax over y's m rows: n = m may not hold,
    so no two of the reductions share a loop; the refusals name the spaces."""
    n, m = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("m", "int64")

    def module(rows_y):
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType((n, 8), F32))
        y = relax.Var("y", relax.TensorType((rows_y, 8), F32))
        with bb.function("main", [x, y]):
            with bb.dataflow():
                col = bb.emit(R.sum(bb.emit(R.nn.softmax(x, axis=-1)), axis=[0], keepdims=True))
                out = bb.emit_output(R.nn.softmax(bb.emit(R.add(y, col)), axis=-1))
            bb.emit_func_output(out)
        return bb.get()

    plan = pipeline.plan(module(m)).plan
    reasons = [r.reason for r in plan.refused]
    assert any("different spaces" in r and "[m]" in r and "n" in r for r in reasons), reasons
    assert len(tvmfuse.build(module(m), "llvm", "tvmfuse").call_sites()) == 3  # nothing stitched across
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((5, 8)).astype(F32), rng.standard_normal((3, 8)).astype(F32)
    e = np.exp(x - x.max(-1, keepdims=True))
    z = y + (e / e.sum(-1, keepdims=True)).sum(0, keepdims=True)
    ez = np.exp(z - z.max(-1, keepdims=True))
    np.testing.assert_allclose(tvmfuse.build(module(m), "llvm", "tvmfuse")(x, y), ez / ez.sum(-1, keepdims=True),
                               rtol=1e-5, atol=1e-6)


def test_bert_tiny_symbolic_sequence_imports_fuses_and_matches_torch():
    """transformers BERT with torch.export Dim on the sequence: its position-id slice infers
    min(s, 256), which tighten_shapes simplifies under the Dim's range; one build runs every
    length, its layers fused as in the static build (one flash-attention kernel per layer over the
    symbolic sequence), and a length outside the range is a clear InputError."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from torch.export import Dim

    from tvmfuse.zoo import models
    from tvmfuse.errors import InputError

    torch.manual_seed(0)
    m = models._bert_module()
    ids = torch.randint(0, 100, (1, 16))
    mod = tvmfuse.from_torch(m, (ids,), dynamic_shapes={"input_ids": {1: Dim("seq", min=2, max=256)}})
    dyn = tvmfuse.build(mod, "llvm", "tvmfuse")
    static = tvmfuse.build(tvmfuse.from_torch(m, (ids,)), "llvm", "tvmfuse")
    # every layer fuses as in the static build, and so does the embedding lookup (take is a gather
    # in both); the one kernel more is the attention mask, which the symbolic build computes at run
    # time over the symbolic length (arange ... where) and the static build folds to a constant
    mask = [k for k in dyn.call_sites() if "arange" in k]
    assert len(mask) == 1 and not [k for k in static.call_sites() if "arange" in k], mask
    assert dyn.launches == static.launches + 1, (dyn.call_sites(), static.call_sites())
    rules = _rules(dyn)
    assert "cpu.Fallback" not in rules, rules
    assert rules.count("cpu.Attention") == 2 == _rules(static).count("cpu.Attention"), rules
    for s in (2, 16, 77, 128):
        x = torch.randint(0, 100, (1, s))
        with torch.no_grad():
            ref = m(x).numpy()
        np.testing.assert_allclose(dyn(x.numpy()), ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(InputError, match=r"outside its declared range \[2, 256\]"):
        dyn(np.zeros((1, 300), "int64"))


# ------------------------------------------------------------------ tighten_shapes (golden)
def _sliced_module():
    """x[1, n, 4] + pos[:, :n] of a constant [1, 8, 4] table: the slice infers min(n, 8)."""
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((1, n, 4), F32))
    table = relax.const(np.arange(32, dtype=F32).reshape(1, 8, 4))
    with bb.function("main", [x]):
        with bb.dataflow():
            pos = bb.emit(R.strided_slice(table, [1], [0], [n]), name_hint="pos")
            out = bb.emit_output(R.add(x, pos), name_hint="out")
        bb.emit_func_output(out)
    return bb.get(), n


def test_tighten_shapes_golden_and_must_not_fire():
    from tvmfuse.frontends.tighten_shapes import tighten

    mod, n = _sliced_module()
    before = mod["main"].body.blocks[0].bindings
    assert "min" in str(before[0].var.ty) and "ndim=3" in str(before[1].var.ty)  # the shape is lost
    after = tighten(mod, {"n": (1, 8)})
    binds = after["main"].body.blocks[0].bindings
    assert [b.value.op.name for b in binds] == ["relax.strided_slice", "relax.reshape", "relax.add"]
    assert dims(binds[1].var.ty) == (1, SymDim(n), 4)  # pos: [1, n, 4] by the range n <= 8
    assert dims(binds[2].var.ty) == (1, SymDim(n), 4)  # and so the add's result, no longer ndim=3
    x = np.ones((1, 5, 4), F32)
    table = np.arange(32, dtype=F32).reshape(1, 8, 4)
    np.testing.assert_array_equal(tvmfuse.build(after, "llvm", "tvmfuse")(x), x + table[:, :5])
    # must not fire: no ranges, a range that proves nothing (n may exceed 8), a static module
    for ranges in ({}, {"m": (1, 8)}, {"n": (1, 100)}):
        assert tighten(mod, ranges).same_as(mod), ranges
    static = relax.transform.BindSymbolicVars({"n": 5})(mod)
    assert tighten(static, {"n": (1, 8)}).same_as(static)


def test_bert_tiny_symbolic_sequence_compiles_for_cuda_with_no_host_fallback():
    """CUDA with a symbolic sequence: every kernel is a GPU kernel (compiles here; runs where there is
    a GPU), the matmuls take dlight's rule and each layer's attention one flash kernel."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from torch.export import Dim

    from tvmfuse.zoo import models

    torch.manual_seed(0)
    m = models._bert_module()
    mod = tvmfuse.from_torch(m, (torch.randint(0, 100, (1, 16)),),
                             dynamic_shapes={"input_ids": {1: Dim("seq", min=2, max=256)}})
    c = tvmfuse.build(mod, "cuda", "tvmfuse")
    assert c.host_fallbacks() == []
    rules = _rules(c)
    assert rules.count("cuda.Attention") == 2 and c.kernels_per_func()["fused_attention"] == 1
    assert rules.count("dlight.gpu.Matmul") >= 8, rules


@I.ir_module
class Doubled:  # after the concat, every shape is 2 * n: no buffer of the fused group binds n itself
    @R.function
    def main(x: R.Tensor(("n", 8), "float32")):
        with R.dataflow():
            c = R.concat([x, x], axis=0)
            y = R.sum(R.add(c, R.const(1.0, "float32")), axis=[1], keepdims=True)
            z = R.rsqrt(R.add(y, R.const(100.0, "float32")))
            R.output(z)
        return z


def test_a_group_whose_shapes_only_hold_2n_takes_n_as_a_scalar_parameter():
    """Found by fuzzing: "variables (n,) are used, but are not passed in as API arguments". The
    group's PrimFunc takes n after its tensors and the call passes it, as legalization does."""
    c = tvmfuse.build(Doubled, "llvm", "tvmfuse", max_group_size=2)  # concat apart from the rest
    scalar = [gv.name_hint for gv, f in c.mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)
              and any(not hasattr(p, "shape") for p in f.params)]
    assert scalar, "no fused kernel takes n"
    for n in (1, 3, 6):
        x = np.random.default_rng(n).standard_normal((n, 8)).astype(F32)
        c2 = np.concatenate([x, x])
        np.testing.assert_allclose(c(x), 1 / np.sqrt((c2 + 1).sum(1, keepdims=True) + 100), rtol=1e-5)


@I.ir_module
class MatmulConcat:  # the matmul tile covers n rows, the epilogue 2n: a join would leave n unwritten
    @R.function
    def main(x: R.Tensor(("n", 16), "float32"), w: R.Tensor((16, 16), "float32"),
             y: R.Tensor(("n", 16), "float32")):
        with R.dataflow():
            z = R.concat([R.matmul(x, w), y], axis=0)
            R.output(z)
        return z


def test_a_matmul_with_a_symbolic_concat_epilogue_writes_every_row():
    c = tvmfuse.build(MatmulConcat, "llvm", "tvmfuse")
    rng = np.random.default_rng(3)
    w = rng.standard_normal((16, 16)).astype(F32)
    for n in (5, 40, 100):
        x, y = rng.standard_normal((n, 16)).astype(F32), rng.standard_normal((n, 16)).astype(F32)
        np.testing.assert_allclose(c(x, w, y), np.concatenate([x @ w, y]), rtol=1e-5, atol=1e-5)


@I.ir_module
class ConcatAttention:  # a prefix of 3 cached keys/values ahead of n new ones: every seq dim is n + 3
    @R.function
    def main(q: R.Tensor((1, 2, "n", 16), "float32"), k: R.Tensor((1, 2, "n", 16), "float32"),
             v: R.Tensor((1, 2, "n", 16), "float32"), pk: R.Tensor((1, 2, 3, 16), "float32"),
             pv: R.Tensor((1, 2, 3, 16), "float32")):
        with R.dataflow():
            kk = R.concat([pk, k], axis=2)
            vv = R.concat([pv, v], axis=2)
            s = R.multiply(R.matmul(q, R.permute_dims(kk, [0, 1, 3, 2])), R.const(0.25, "float32"))
            o = R.matmul(R.nn.softmax(s, axis=-1), vv)
            R.output(o)
        return o


def test_attention_over_a_compound_symbolic_dim_is_one_kernel_and_matches():
    """Keys of length n + 3 (a concat with a prefix): the flash kernel takes n as a scalar
    parameter and writes the extent as `n + 3` (found by fuzzing, seed 41903's neighbourhood)."""
    c = tvmfuse.build(ConcatAttention, "llvm", "tvmfuse")
    assert any(g.kind == "flash attention" for g in c.plan.groups), [(g.names, g.te_refused) for g in c.plan.groups]
    assert "cpu.Attention" in _rules(c) and "cpu.Fallback" not in _rules(c), _rules(c)
    rng = np.random.default_rng(5)
    pk, pv = (rng.standard_normal((1, 2, 3, 16)).astype(F32) for _ in range(2))
    for n in (1, 6, 70):
        q, k, v = (rng.standard_normal((1, 2, n, 16)).astype(F32) for _ in range(3))
        kk, vv = np.concatenate([pk, k], 2), np.concatenate([pv, v], 2)
        s = q @ kk.transpose(0, 1, 3, 2) * 0.25
        e = np.exp(s - s.max(-1, keepdims=True))
        np.testing.assert_allclose(c(q, k, v, pk, pv), e / e.sum(-1, keepdims=True) @ vv, rtol=1e-4, atol=1e-5)


def test_a_group_that_computes_with_a_size_takes_it_as_a_parameter():
    """A fused kernel whose values (not shapes) use a symbolic size, as shape_to_tensor does: the
    size becomes a scalar parameter of the kernel (FuseGroupsTE._compute_vars). Without it the
    kernel used an undefined variable and the build failed (GPT-2 under torch.compile(dynamic=True))."""
    from tvm import tirx

    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType([n], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            size = relax.op.reshape(relax.op.shape_to_tensor(relax.ShapeExpr([n])), ())
            # no tensor of the group has the bare n in its shape: only the computed value uses it
            out = bb.emit_output(relax.op.add(relax.const(np.ones(3, "float32")), relax.op.astype(size, "float32")))
        bb.emit_func_output(out)
    c = tvmfuse.build(bb.get(), "llvm", "tvmfuse")
    assert c.launches == 1
    for m in (3, 7):
        np.testing.assert_allclose(c(np.ones(m, "float32")), np.full(3, m + 1.0))


def test_gpt2_exported_with_a_symbolic_sequence_builds_and_matches():
    """GPT-2's mask code slices on axis -1 with a symbolic bound; TVM's legalizer handed the negative
    axis to topi's dynamic slice, which rejected it (frontends.common._nonnegative_slice_axes)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from torch.export import Dim

    from tvmfuse.zoo import models

    m = models._gpt2_module()
    mod = tvmfuse.from_torch(m, (torch.randint(0, 100, (1, 16)),),
                             dynamic_shapes={"input_ids": {1: Dim("seq", min=2, max=256)}})
    c = tvmfuse.build(mod, "llvm", "tvmfuse")
    for s in (5, 40):
        x = torch.randint(0, 100, (1, s))
        with torch.no_grad():
            np.testing.assert_allclose(c(x.numpy()), m(x).numpy(), rtol=1e-4, atol=1e-4)
