"""build(..., dtype="float16" | "bfloat16"): a float32 model computed in a half type
(passes/cast_to_half.py, the pipeline's "precision" phase).

Tolerances, per dtype, on |out - ref| <= atol * max|ref| + rtol * |ref| (the error of a half
computation scales with the magnitude of the values it passes through, so atol is relative to the
output's largest value):
  float16   rtol = atol = 1e-2: unit roundoff 2^-11 = 4.9e-4; activations are rounded once per op
            and the tiny models go through ~20 ops, so the error reaches a few roundoffs (observed
            at most 1.5e-3 of the scale): about 7x margin, 20 roundoffs;
  bfloat16  rtol = atol = 4e-2: unit roundoff 2^-8 = 3.9e-3 (observed at most 1e-2 of the scale):
            about 4x margin, 10 roundoffs.
Both stay far below what a float32-in-half bug gives (a softmax or norm summed in half, a weight
left uncast, a mask fill overflowing to -inf: errors of order 1 or NaN).
"""
import re
import shutil

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

import tvmfuse
from tvmfuse.errors import ConfigError
from tvmfuse.fusion.classify import ELEMENTWISE, INJECTIVE, classify
from tvmfuse.passes.cast_to_half import HALF_TOLERANCE, cast_to_half
from tvmfuse.zoo import models, workloads

TOL = HALF_TOLERANCE
HALF = ("float16", "bfloat16")
ZOO = ("mlp_block", "attention", "softmax_chain", "layernorm_decomposed", "rmsnorm_residual", "conv_relu_bn_add")
_BUILDS = {}


def _built(name, dtype, target="llvm"):
    key = (name, dtype, str(target))
    if key not in _BUILDS:
        w = models.get(name) if name in models.names() else workloads.get(name)
        _BUILDS[key] = (w, tvmfuse.build(w.mod, target, "tvmfuse", dtype=dtype))
    return _BUILDS[key]


def _assert_close(out, ref, dtype):
    outs = out if isinstance(out, (list, tuple)) else [out]
    refs = ref if isinstance(ref, (list, tuple)) else [ref]
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        o, r = np.asarray(o), np.asarray(r)
        assert o.dtype == np.float32  # main's outputs stay float32
        scale = float(np.abs(r).max())
        np.testing.assert_allclose(o, r, rtol=TOL[dtype], atol=TOL[dtype] * scale)


def _blocks(sch, block):
    out = []
    for child in sch.get_child_blocks(block):
        out += [sch.get(child)] + _blocks(sch, child)
    return out


VIEWS = {"astype", "reshape", "expand_dims", "squeeze", "flatten"}  # a cast and views of it: a cast alone


def cast_only_kernels(compiled) -> list:
    """Kernels called by main that only convert dtypes: a tvmfuse group whose ops are a cast and
    views (reshapes) of it; for a kernel without a group stamp (TVM's own fusion), one whose every
    store is a load with at least one dtype conversion and nothing else. A cast riding along with a
    transpose kernel is the transpose's kernel, not one of its own."""
    funcs = {gv.name_hint: f for gv, f in compiled.mod.functions_items() if isinstance(f, tirx.PrimFunc)}

    def bare(v):
        while isinstance(v, tirx.Cast):
            v = v.value
        return isinstance(v, tvm.ir.TensorLoad)

    bad = []
    for name in sorted(set(compiled.call_sites())):
        f = funcs[name]
        group = f.attrs.get("tvmfuse.group") if f.attrs is not None else None
        if group is not None:
            ops = set(str(group["ops"]).split(","))
            if "astype" in ops and ops <= VIEWS:
                bad.append(name)
            continue
        sch = tvm.s_tir.Schedule(f)
        stores = [b.body.value for b in _blocks(sch, sch.get_sblock("root")) if isinstance(b.body, tirx.BufferStore)]
        if stores and all(bare(v) for v in stores) and any(isinstance(v, tirx.Cast) for v in stores):
            bad.append(name)
    return bad


# ------------------------------------------------------------------------------ numerics (llvm)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", ZOO)
def test_zoo_workloads_in_half_match_float32(name, dtype):
    w, c = _built(name, dtype)
    xs = w.inputs()
    _assert_close(c(*xs), w.reference_fn(*xs), dtype)
    assert cast_only_kernels(c) == []


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", ["bert-tiny", "gpt2-tiny"])
def test_tiny_transformers_in_half_match_pytorch_float32(name, dtype):
    w, c = _built(name, dtype)
    xs = w.inputs()
    _assert_close(c(*xs), w.reference_fn(*xs), dtype)  # PyTorch eager, float32
    assert cast_only_kernels(c) == [], c.call_sites()


def test_the_check_finds_cast_kernels_where_they_are():
    """The check can fail: with every op its own kernel ("none") each cast is one, and TVM's stock
    FuseOps ("tvm") never fuses a producer into a matmul, so mlp_block's float32 inputs keep their
    cast kernels there; the tvmfuse planner takes them (the tests above)."""
    w = workloads.get("mlp_block")
    assert len(cast_only_kernels(tvmfuse.build(w.mod, "llvm", "none", dtype="float16"))) >= 3
    assert cast_only_kernels(tvmfuse.build(w.mod, "llvm", "tvm", dtype="float16"))


def test_half_builds_round_where_float32_does_not():
    """The option changes the arithmetic: a float16 build differs from the float32 one (by about
    its roundoff), and float16 and bfloat16 differ from each other."""
    w = workloads.get("mlp_block")
    xs = w.inputs()
    f32 = tvmfuse.build(w.mod, "llvm", "tvmfuse")(*xs)
    f16 = _built("mlp_block", "float16")[1](*xs)
    bf16 = _built("mlp_block", "bfloat16")[1](*xs)
    scale = float(np.abs(f32).max())
    assert 0 < np.abs(f16 - f32).max() < 1e-2 * scale
    assert np.abs(bf16 - f16).max() > 0


# ------------------------------------------------------------------------------ the graph's policy
def test_bert_graph_accumulates_in_float32_and_keeps_its_signature():
    w, c = _built("bert-tiny", "float16")
    main = c.planned["main"]
    assert [str(p.ty.dtype) for p in main.params] == ["int64"]
    assert str(main.ret_ty.dtype) == "float32"
    seen = {}
    for block in main.body.blocks:
        for bd in block.bindings:
            call = bd.value
            if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)):
                continue
            op = call.op.name
            args = [str(a.ty.dtype) for a in call.args if isinstance(a.ty, relax.TensorType)]
            seen[op] = seen.get(op, 0) + 1
            if op == "relax.matmul":  # half operands (the weights cast at build time), float32 sums
                assert args == ["float16", "float16"] and str(call.attrs.out_dtype) == "float32"
            if op in ("relax.nn.softmax", "relax.nn.layer_norm"):  # row statistics in float32
                assert args[0] == "float32" and str(bd.var.ty.dtype) == "float32"
            if op == "relax.take":  # the embedding table is a half constant
                assert args[0] == "float16"
    assert seen["relax.matmul"] >= 8 and seen["relax.nn.softmax"] == 2 and seen["relax.nn.layer_norm"] == 5


def _mask_module():
    """main(x) = softmax(x @ W + mask) with a float32-lowest mask fill (PyTorch's attention mask)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    w = np.random.default_rng(0).standard_normal((8, 8)).astype("float32")
    mask = np.where(np.tril(np.ones((4, 8))) > 0, 0.0, np.finfo(np.float32).min).astype("float32")
    with bb.function("main", [x]):
        with bb.dataflow():
            s = bb.emit(relax.op.matmul(x, relax.const(w)))
            s = bb.emit(relax.op.add(s, relax.const(mask)))
            out = bb.emit_output(relax.op.nn.softmax(s, axis=-1))
        bb.emit_func_output(out)
    return bb.get(), w, mask


def test_constants_are_cast_once_and_a_lowest_fill_stays_finite():
    mod, w, mask = _mask_module()
    out = cast_to_half(mod, "float16")
    consts = []
    relax.analysis.post_order_visit(out["main"], lambda e: consts.append(e) if isinstance(e, tvm.ir.expr.Constant)
                                    and "float" in str(e.ty.dtype) else None)
    assert sorted(str(c.ty.dtype) for c in consts) == ["float16", "float16"]  # W and the mask
    fill = min(float(c.value.numpy().min()) for c in consts)
    assert fill == -65504.0  # float16's lowest, not -inf (0 * -inf would be NaN downstream)
    x = np.random.default_rng(1).standard_normal((4, 8)).astype("float32")
    got = tvmfuse.build(mod, "llvm", "tvmfuse", dtype="float16")(x)
    s = x @ w + mask
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=TOL["float16"], atol=TOL["float16"])


def test_a_float32_input_cast_fuses_in_front_of_the_matmul():
    """mlp_block's inputs (x and the weights) are float32: each cast joins the matmul that reads
    it (fusion/profitability.py: a cast is no recomputation) instead of being a kernel."""
    _, c = _built("mlp_block", "float16")
    assert len(c.call_sites()) == 2 and all("matmul" in k for k in c.call_sites())
    assert c.rules() == ["cpu.Matmul", "cpu.Matmul"]


def test_casts_and_gathers_classify_as_fusable():
    mod, _, _ = _mask_module()
    by_op = {o.op: o.cls for o in classify(cast_to_half(mod, "bfloat16"))}
    assert by_op["relax.astype"] == ELEMENTWISE
    w = models.get("gpt2-tiny")
    assert {o.cls for o in classify(w.mod) if o.op == "relax.take"} == {INJECTIVE}


def test_unknown_dtype_is_refused():
    with pytest.raises(ConfigError, match="unknown dtype"):
        tvmfuse.build(workloads.get("mlp_block").mod, "llvm", "tvmfuse", dtype="float8")


def test_without_a_dtype_nothing_changes():
    w = workloads.get("softmax_chain")
    a = tvmfuse.prepare(w.mod, "llvm", "tvmfuse")
    b = tvmfuse.prepare(w.mod, "llvm", "tvmfuse", dtype=None)
    tvm.ir.assert_structural_equal(a, b)
    assert "astype" not in a["main"].script()


# ------------------------------------------------------------------------------ CUDA (compiled, not run)
CUDA = {"kind": "cuda", "arch": "sm_90"}


@pytest.mark.parametrize("name", ["mlp_block", "attention", "softmax_chain", "layernorm_decomposed"])
def test_cuda_half_zoo_builds_with_every_stage_on_the_device_and_no_cast_kernel(name):
    _, c = _built(name, "float16", CUDA)
    assert c.host_fallbacks() == []
    assert cast_only_kernels(c) == []
    assert "half" in c.source()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("dtype, ctype", [("float16", "half"), ("bfloat16", "nv_bfloat16")])
def test_cuda_half_bert_compiles_and_computes_in_half(dtype, ctype):
    from tvm.support import nvcc

    _, c = _built("bert-tiny", dtype, CUDA)
    src = c.source()
    assert c.host_fallbacks() == []
    assert cast_only_kernels(c) == []
    kernels = [ln for ln in src.splitlines() if "__global__" in ln and ln.rstrip().endswith(";")]
    matmuls = [k for k in kernels if "matmul" in k]
    called = {k for k in c.call_sites() if "matmul" in k}
    assert len(called) >= 5 and called <= {re.search(r"(\w+)_kernel\(", k).group(1) for k in matmuls}
    for k in kernels:  # every kernel moves half tensors (layer_norm's gamma and beta stay float32)
        assert f"{ctype}* __restrict__" in k, k
    for k in matmuls:  # and every matmul reads only half tensors
        assert "float* __restrict__" not in k, k
    with c.target:
        ptx = nvcc.compile_cuda(src, target_format="ptx", arch="sm_90", compiler="nvcc")
    assert b".target sm_90" in bytes(ptx)


def test_tuning_sees_the_kernels_of_the_half_build():
    """tvmfuse.tune(..., dtype=) extracts the PrimFuncs the half build's apply_tuning phase looks
    up (the same pipeline, the same Options), not the float32 ones."""
    import tvm_ffi
    from tvm.ir.instrument import pass_instrument

    from tvmfuse.target import resolve
    from tvmfuse.tuning.tasks import extract, fused_module

    @pass_instrument
    class AtApplyTuning:
        def __init__(self):
            self.mod = None

        def run_after_pass(self, mod, info):
            if info.name == "tvmfuse.mark_constants":
                self.mod = mod

    w = workloads.get("mlp_block")
    seen = AtApplyTuning()
    tvmfuse.build(w.mod, "llvm", "tvmfuse", dtype="float16", instruments=[seen])
    kernels = lambda tasks: {tvm_ffi.structural_hash(t.mod): t.weight for t in tasks}
    half = kernels(extract(fused_module(w.mod, resolve("llvm"), "tvmfuse", dtype="float16")))
    assert half == kernels(extract(seen.mod))
    assert half != kernels(extract(fused_module(w.mod, resolve("llvm"), "tvmfuse")))


@pytest.mark.parametrize("dtype", HALF)
def test_a_symbolic_sequence_builds_in_half_and_matches_at_every_size(dtype):
    """A transformer layer over a symbolic sequence (test_dynamic_shapes.Block): one half build,
    float32 inputs read by four consumers (each cast joins its own), checked at several lengths."""
    from test_dynamic_shapes import Block, _block_ref

    c = tvmfuse.build(Block, "llvm", "tvmfuse", dtype=dtype)
    assert cast_only_kernels(c) == []
    rng = np.random.default_rng(1)
    ws = [(rng.standard_normal(sh) * 0.2).astype("float32") for sh in [(64, 64)] * 3 + [(64, 256), (256, 64)]]
    ws += [rng.standard_normal(64).astype("float32"), rng.standard_normal(64).astype("float32")]
    for s in (1, 7, 33):
        x = rng.standard_normal((1, s, 64)).astype("float32")
        _assert_close(c(x, *ws), _block_ref(x, *ws), dtype)


def test_match_cast_and_average_pools_follow_the_policy():
    """A match_cast of a value now in half matches the half type; an average pool sums in float32."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    w = np.random.default_rng(0).standard_normal((4, 4, 3, 3)).astype("float32") * 0.3
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(w), padding=1))
            y = bb.match_cast(y, relax.TensorType((1, 4, 8, 8), "float32"))
            out = bb.emit_output(relax.op.nn.avg_pool2d(relax.op.nn.relu(y), pool_size=(2, 2), strides=(2, 2)))
        bb.emit_func_output(out)
    mod = bb.get()
    half = cast_to_half(mod, "float16")
    text = half["main"].script()
    (cast_line,) = [ln for ln in text.splitlines() if "R.match_cast(" in ln]
    assert cast_line.count('dtype="float16"') == 2, cast_line  # the var's type and the pattern
    pool = text.split("R.nn.avg_pool2d(")[1].split(",")[0]
    assert f'{pool}: R.Tensor((1, 4, 8, 8), dtype="float32")' in text  # the pool reads float32
    x_np = np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype("float32")
    ref = tvmfuse.build(mod, "llvm", "tvmfuse")(x_np)
    got = tvmfuse.build(mod, "llvm", "tvmfuse", dtype="float16")(x_np)
    np.testing.assert_allclose(got, ref, rtol=TOL["float16"], atol=TOL["float16"] * float(np.abs(ref).max()))
