"""Tensor cores and layouts on CUDA, compile-only (no GPU: nvcc and ptxas compile the generated CUDA C).

- A half-precision matmul group (bias, GELU, residual add, cast) is ONE kernel, scheduled by
  cuda.TensorCoreMatmul (schedules/cuda/tensor_core.py), with tensor-core MMA instructions
  (`wmma.mma.sync`) in its PTX and no local-memory spills in `ptxas -v`'s report, for sm_80 and
  sm_90, at a ragged token count (197) and a short one (16).
- A float16 BERT (ToMixedPrecision of a tiny transformers BertModel): every matmul kernel is on
  tensor cores, none spills.
- A float16 GPT-2 (build(dtype="float16"), a prime vocabulary, 20 tokens): the same, its fused QKV
  (one matmul, three outputs) and its masked scores included.
- float32 keeps dlight's SIMT matmul.
- BERT in float32 with its weights passed in (what the GPU benchmark builds) has no transpose-only
  kernel on CUDA: each transposed weight is read as stored by its matmul (layout_prologue), and
  the same fused graph, built for llvm, matches PyTorch.
The PTX and the ptxas report come from tvmfuse.kernel_source.cuda_ptx (nvcc -ptx, ptxas -v).
"""
import re
import shutil

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, s_tir

import tvmfuse
from tvmfuse.kernel_source import cuda_kernels, cuda_ptx

pytestmark = pytest.mark.skipif(not (shutil.which("nvcc") and shutil.which("ptxas")), reason="needs nvcc and ptxas")

ARCHS = ("sm_80", "sm_90")
MATMUL_RULES = ("cuda.TensorCoreMatmul", "dlight.gpu.Matmul", "dlight.gpu.GEMV")
TC = "cuda.TensorCoreMatmul"
_BUILDS = {}


def _target(arch):
    return {"kind": "cuda", "arch": arch}


def linear_gelu_residual(dtype, tokens, k=128, n=192, stored_kn=False):
    """main(x, w, b, r) = gelu(cast(x @ wᵀ accumulated in float32) + b) + r, in `dtype`; w [n, k]
    is passed in (a Linear's weight as stored), so its transpose is part of the group; with
    `stored_kn`, w is [k, n] and read as it is (GPT-2's Conv1D)."""
    x = relax.Var("x", relax.TensorType((1, tokens, k), dtype))
    w = relax.Var("w", relax.TensorType((k, n) if stored_kn else (n, k), dtype))
    b = relax.Var("b", relax.TensorType((n,), dtype))
    r = relax.Var("r", relax.TensorType((1, tokens, n), dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, b, r]):
        with bb.dataflow():
            wt = w if stored_kn else bb.emit(relax.op.permute_dims(w, [1, 0]))
            acc = relax.op.matmul(x, wt, out_dtype="float32") if dtype != "float32" else relax.op.matmul(x, wt)
            mm = bb.emit(relax.op.astype(bb.emit(acc), dtype))
            act = bb.emit(relax.op.nn.gelu(bb.emit(relax.op.add(mm, b))))
            out = bb.emit_output(relax.op.add(act, r))
        bb.emit_func_output(out)
    return bb.get()


def _kernel_map(c):
    """{kernel name in the CUDA source: (its PrimFunc, the rule that scheduled it)}."""
    rules = {gv.name_hint: str(f.attrs.get("tvmfuse.rule")) for gv, f in c.mod.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None}
    out = {}
    for k in cuda_kernels(c.source()):
        func = re.sub(r"_kernel(_\d+)?$", "", k)
        out[k] = (func, rules.get(func))
    return out


def _compiled(c, arch):
    key = (c.source(), arch)
    if key not in _BUILDS:
        _BUILDS[key] = cuda_ptx(c.source(), arch)
    return _BUILDS[key]


def _assert_no_spills(stats):
    spilled = {k: s for k, s in stats.items() if s.get("spill_stores") or s.get("spill_loads")}
    assert not spilled, f"local-memory spills: {spilled}"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tokens", [197, 16])
def test_half_matmul_group_is_one_tensor_core_kernel(arch, tokens):
    c = tvmfuse.build(linear_gelu_residual("float16", tokens), _target(arch), "tvmfuse")
    kernels = _kernel_map(c)
    assert c.launches == 1 and len(kernels) == 1, kernels  # transpose, bias, GELU, residual, cast: fused
    (name, (func, rule)), = kernels.items()
    assert rule == TC
    ptx, stats = _compiled(c, arch)
    mma = [line for line in ptx[name].splitlines() if "mma.sync" in line]
    assert mma and all(".f16" in line or "f32.f32" in line for line in mma), mma[:2]
    assert "erf" in c.source()  # GELU in the kernel's store to global memory
    _assert_no_spills(stats)


@pytest.mark.parametrize("n,stored_kn", [(50257, False), (768, True)])
def test_ragged_vocabulary_and_kn_weights_on_tensor_cores(n, stored_kn):
    """GPT-2's LM head (50257 words: the last tile padded) and its Conv1D weights stored [K, N]."""
    c = tvmfuse.build(linear_gelu_residual("float16", 20, k=64, n=n, stored_kn=stored_kn), _target("sm_90"),
                      "tvmfuse")
    kernels = _kernel_map(c)
    assert c.launches == 1 and [r for _, r in kernels.values()] == [TC]
    ptx, stats = _compiled(c, "sm_90")
    assert all("mma.sync" in body for body in ptx.values())
    _assert_no_spills(stats)


def test_bfloat16_matmul_group_uses_bf16_tensor_cores():
    c = tvmfuse.build(linear_gelu_residual("bfloat16", 197), _target("sm_80"), "tvmfuse")
    kernels = _kernel_map(c)
    assert c.launches == 1 and [r for _, r in kernels.values()] == [TC]
    ptx, stats = _compiled(c, "sm_80")
    body = next(iter(ptx.values()))
    assert re.search(r"wmma\.mma\.sync\.\S*bf16", body)
    _assert_no_spills(stats)


def test_float32_matmul_keeps_simt():
    c = tvmfuse.build(linear_gelu_residual("float32", 197), _target("sm_80"), "tvmfuse")
    assert [r for _, r in _kernel_map(c).values()] == ["dlight.gpu.Matmul"]
    ptx, stats = _compiled(c, "sm_80")
    assert not any("mma" in body for body in ptx.values())


def test_the_rule_declines_what_it_does_not_fit():
    from schedules.cuda.tensor_core import TensorCoreMatmul

    def primfunc(dtype):
        mod = relax.transform.LegalizeOps()(linear_gelu_residual(dtype, 32))
        return next(f for gv, f in mod.functions_items() if "matmul" in gv.name_hint)

    rule = TensorCoreMatmul()
    sm80, sm75 = tvm.target.Target(_target("sm_80")), tvm.target.Target(_target("sm_75"))
    assert rule.apply(primfunc("float32"), sm80) is None  # float32: the SIMT matmul's
    assert rule.apply(primfunc("bfloat16"), sm75) is None  # bf16 tensor cores start at sm_80
    assert rule.apply(primfunc("float16").with_attr("dlight.do_not_tensorize", True), sm80) is None
    assert rule.apply(primfunc("float16"), sm80) is not None


def test_a_matmul_read_by_two_output_stages_stores_both():
    """GPT-2's fused QKV: one matmul, several outputs read from it. Each output stores its part of
    the warp's tile from shared memory (well-formed TIR: TVM's reverse_compute_inline would take
    one of them into the store and leave the other reading a buffer nothing declares); dlight's
    SIMT Matmul, which stores through one epilogue, declines such a group."""
    from tvm import te

    from schedules.cuda.rules import CoalescedMatmul, DlightRule
    from schedules.cuda.tensor_core import TensorCoreMatmul

    a = te.placeholder((64, 64), "float16", name="a")
    w = te.placeholder((64, 128), "float16", name="w")
    k = te.reduce_axis((0, 64), name="k")
    mm = te.compute((64, 128), lambda i, j: te.sum(a[i, k].astype("float32") * w[k, j].astype("float32"), axis=k))
    first = te.compute((64, 64), lambda i, j: mm[i, j].astype("float16"), name="first")
    second = te.compute((64, 64), lambda i, j: mm[i, j + 64].astype("float16"), name="second")
    func = te.create_prim_func([a, w, first, second])
    sm80 = tvm.target.Target(_target("sm_80"))
    out = TensorCoreMatmul().apply(func, sm80)
    assert out is not None and s_tir.analysis.verify_well_formed(out)
    assert {"first", "second"} <= set(_thread_bound_blocks(out))
    assert DlightRule(CoalescedMatmul(), inline_first=True).apply(func, sm80) is None
    one = te.create_prim_func([a, w, te.compute((64, 128), lambda i, j: mm[i, j].astype("float16"))])
    assert TensorCoreMatmul().apply(one, sm80) is not None


@pytest.mark.parametrize("tokens,heads,head_dim", [(20, 2, 32), (128, 12, 64)])
def test_qkv_outputs_are_stored_once_from_the_warps_own_tile(tokens, heads, head_dim):
    """No GPU here, so the index arithmetic of the QKV store is checked by enumeration: every
    element of Q, Kᵀ and V is written exactly once (a ragged token count included), from an element
    of the shared-memory tile that the same thread block and warp stored from its accumulator."""
    from tvm import te

    from schedules.cuda.tensor_core import TensorCoreMatmul

    e = heads * head_dim
    a = te.placeholder((tokens, e), "float16", name="a")
    w = te.placeholder((e, 3 * e), "float16", name="w")
    k = te.reduce_axis((0, e), name="k")
    mm = te.compute((tokens, 3 * e),
                    lambda i, j: te.sum(a[i, k].astype("float32") * w[k, j].astype("float32"), axis=k))
    shapes = {"q": (heads, tokens, head_dim), "kt": (heads, head_dim, tokens), "v": (heads, tokens, head_dim)}
    q = te.compute(shapes["q"], lambda h, t, d: mm[t, h * head_dim + d].astype("float16"), name="q")
    kt = te.compute(shapes["kt"], lambda h, d, t: mm[t, e + h * head_dim + d].astype("float16"), name="kt")
    v = te.compute(shapes["v"], lambda h, t, d: mm[t, 2 * e + h * head_dim + d].astype("float16"), name="v")
    out = TensorCoreMatmul().apply(te.create_prim_func([a, w, q, kt, v]), tvm.target.Target(_target("sm_80")))
    assert out is not None and s_tir.analysis.verify_well_formed(out)
    blocks = _realized_blocks(out)
    loops, acc = next(b for name, b in blocks.items() if name.endswith("wmma.accumulator_o"))
    env = _grid(loops)
    rows, cols = (_eval(x, env) * 16 for x in acc.iter_values[1:])
    owner = np.full((rows.max() + 16, cols.max() + 16), -1)  # which block and warp stored each element
    for r, c in np.ndindex(16, 16):
        owner[rows + r, cols + c] = _warp_id(loops, env)
    for name, shape in shapes.items():
        loops, rz = blocks[name]
        env = _grid(loops)
        bind = {iv.var.name: _eval(x, env) for iv, x in zip(rz.block.iter_vars, rz.iter_values)}
        on = np.broadcast_to(_eval(rz.predicate, env), env[loops[0][0].name].shape).astype(bool)
        count = np.zeros(shape, np.int64)
        np.add.at(count, tuple(np.broadcast_to(_eval(i, bind), on.shape)[on] for i in rz.block.body.indices), 1)
        assert (count == 1).all(), name
        loads = []
        tvm_ffi.structural_walk(rz.block.body.value, (tvm.ir.TensorLoad, loads.append))
        tile = next(ld for ld in loads if "shared" in ld.source.name)
        r, c = (np.broadcast_to(_eval(i, bind), on.shape)[on] for i in tile.indices[-2:])
        assert (owner[r, c] == _warp_id(loops, env)[on]).all(), name


def _warp_id(loops, env):
    """One number per (blockIdx.z, blockIdx.x, blockIdx.y, threadIdx.y): the four outer loops."""
    out = np.zeros_like(env[loops[0][0].name])
    for var, ext in loops[:4]:
        out = out * ext + env[var.name]
    return out


def _realized_blocks(func):
    """{block name: ([(loop var, extent)] around it, its SBlockRealize)}."""
    out = {}

    def walk(node, loops):
        if isinstance(node, tvm.tirx.For):
            walk(node.body, loops + [(node.loop_var, int(node.extent))])
        elif isinstance(node, s_tir.SBlockRealize):
            out[node.block.name_hint] = (loops, node)
            walk(node.block.body, loops)
        elif isinstance(node, tvm.tirx.SeqStmt):
            for st in node.seq:
                walk(st, loops)
        elif hasattr(node, "body"):
            walk(node.body, loops)

    walk(func.body, [])
    return out


def _grid(loops):
    """Every combination of the loops' values: {loop var name: array}."""
    idx = np.indices([ext for _, ext in loops]).reshape(len(loops), -1)
    return {var.name: idx[i] for i, (var, _) in enumerate(loops)}


def _eval(expr, env):
    """An index expression over arrays of loop values (floordiv/floormod as Python's // and %)."""
    ops = {tvm.tirx.Add: np.add, tvm.tirx.Sub: np.subtract, tvm.tirx.Mul: np.multiply,
           tvm.tirx.FloorDiv: np.floor_divide, tvm.tirx.FloorMod: np.mod, tvm.tirx.LT: np.less,
           tvm.tirx.LE: np.less_equal, tvm.tirx.EQ: np.equal, tvm.tirx.And: np.logical_and}
    if isinstance(expr, (int, tvm.tirx.IntImm)):
        return np.int64(int(expr))
    if isinstance(expr, tvm.tirx.Var):
        return env[expr.name]
    return ops[type(expr)](_eval(expr.a, env), _eval(expr.b, env))


def _thread_bound_blocks(func):
    """Names of the blocks of `func` inside a thread-bound loop."""
    names = []

    def loop(node):
        if node.kind == tvm.tirx.ForKind.THREAD_BINDING:
            tvm_ffi.structural_walk(node.body, (s_tir.SBlock, lambda b: names.append(b.name_hint)))

    tvm_ffi.structural_walk(func.body, (tvm.tirx.For, loop))
    return names


def _bert(hidden=64, layers=2, heads=2, params="constants"):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import BertConfig

    from tvmfuse.zoo import models

    cfg = BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=2 * hidden, vocab_size=100, attn_implementation="eager")
    module = models._bert_module(cfg)
    ids = np.random.default_rng(0).integers(0, 100, size=(1, 20)).astype("int64")  # 20: a ragged tile
    out = tvmfuse.from_torch(module, (torch.from_numpy(ids),), params=params)
    return module, ids, out


@pytest.fixture(scope="module")
def bert_fp16():
    _, _, mod = _bert()
    return relax.transform.ToMixedPrecision(out_dtype="float32")(mod)


@pytest.mark.parametrize("arch", ARCHS)
def test_float16_bert_every_matmul_kernel_on_tensor_cores(bert_fp16, arch):
    c = tvmfuse.build(bert_fp16, _target(arch), "tvmfuse")
    assert c.host_fallbacks() == []
    kernels = _kernel_map(c)
    matmuls = {k: rule for k, (_, rule) in kernels.items() if rule in MATMUL_RULES}
    assert set(matmuls.values()) == {TC}, matmuls
    # two layers of Q, K, V, output, FFN-in and FFN-out projections (kernels shared between layers)
    funcs = {kernels[k][0] for k in matmuls}
    assert len(funcs) >= 4 and sum(name in funcs for name in c.call_sites()) >= 2 * 6, kernels
    ptx, stats = _compiled(c, arch)
    assert all("mma.sync" in ptx[k] for k in matmuls)
    assert not any("mma" in ptx[k] for k in kernels if k not in matmuls)
    _assert_no_spills(stats)


def _gpt2(vocab):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import GPT2Config

    from tvmfuse.zoo import models

    cfg = GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=vocab, n_positions=256, use_cache=False,
                     bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    ids = np.random.default_rng(0).integers(0, vocab, size=(1, 20)).astype("int64")  # 20: a ragged tile
    return tvmfuse.from_torch(models._gpt2_module(cfg), (torch.from_numpy(ids),))


@pytest.fixture(scope="module")
def gpt2_prime_vocab():
    return _gpt2(1009)  # a prime: the LM head's last tile of words is padded


@pytest.mark.parametrize("arch", ARCHS)
def test_float16_gpt2_every_matmul_kernel_on_tensor_cores(gpt2_prime_vocab, arch):
    """GPT-2 in float16 (build(dtype=...)): its fused QKV (one matmul split into three outputs, each
    reshaped and transposed) and its scores (the causal mask, an output of the same group, added in
    the epilogue) are tensor-core kernels like every other matmul, every function well-formed."""
    from test_half_precision import cast_only_kernels

    c = tvmfuse.build(gpt2_prime_vocab, _target(arch), "tvmfuse", dtype="float16")
    assert c.host_fallbacks() == []
    assert cast_only_kernels(c) == []
    for gv, f in c.mod.functions_items():
        if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and f.attrs.get("tvmfuse.rule"):
            assert s_tir.analysis.verify_well_formed(f, assert_mode=False), gv.name_hint
    kernels = _kernel_map(c)
    matmuls = {func for func, rule in kernels.values() if rule in MATMUL_RULES}
    assert {rule for func, rule in kernels.values() if func in matmuls} == {TC}, kernels
    # two layers of QKV, scores, weighted values, output, FFN-in and FFN-out, and the LM head
    assert sum(name in matmuls for name in c.call_sites()) == 2 * 6 + 1, kernels
    ptx, stats = _compiled(c, arch)
    assert {kernels[k][0] for k in ptx if "mma.sync" in ptx[k]} == matmuls
    _assert_no_spills(stats)


def test_float32_gpt2_builds_with_every_function_well_formed(gpt2_prime_vocab):
    """float32 GPT-2 on CUDA: dlight's Matmul, which stored the fused QKV's three outputs through one
    epilogue (ill-formed TIR, a build error), declines that group; a later rule schedules it."""
    c = tvmfuse.build(gpt2_prime_vocab, _target("sm_90"), "tvmfuse")
    assert c.host_fallbacks() == []
    for gv, f in c.mod.functions_items():
        if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and f.attrs.get("tvmfuse.rule"):
            assert s_tir.analysis.verify_well_formed(f, assert_mode=False), gv.name_hint
    assert TC not in {rule for _, rule in _kernel_map(c).values()}


def transpose_only(func) -> bool:
    """Whether a PrimFunc only permutes data: every store copies a load whose indices are the
    store's index variables in another order (no arithmetic, no gather, no reshape)."""
    stores = []

    def visit(store):
        stores.append(store)

    tvm_ffi.structural_walk(func.body, (tvm.tirx.BufferStore, visit))
    if not stores:
        return False

    def permuted(store):
        load = store.value
        if not isinstance(load, tvm.ir.TensorLoad) or not all(isinstance(i, tvm.tirx.Var) for i in load.indices):
            return False
        if not all(isinstance(i, tvm.tirx.Var) for i in store.indices) or len(load.indices) != len(store.indices):
            return False
        src, dst = [i.name for i in load.indices], [i.name for i in store.indices]
        return sorted(src) == sorted(dst) and src != dst

    return all(permuted(s) for s in stores)


def _transpose_kernels(c):
    """The kernel functions main calls that only permute data."""
    return sorted({name for name in c.call_sites() if transpose_only(c.mod[name])})


@pytest.fixture(scope="module")
def bert_fp32_weights_in():
    return _bert(hidden=128, params="inputs")


def test_float32_bert_has_no_transpose_only_kernel(bert_fp32_weights_in):
    _, _, (mod, params) = bert_fp32_weights_in
    c = tvmfuse.build(mod, _target("sm_90"), "tvmfuse")
    assert c.host_fallbacks() == []
    assert _transpose_kernels(c) == []
    # the detector finds them where the knob keeps each transposed weight a kernel of its own
    off = tvmfuse.build(mod, _target("sm_90"), "tvmfuse", layout_prologue=False)
    assert len(_transpose_kernels(off)) >= 3  # the QKV/output, FFN-in and FFN-out weight shapes


def test_the_fused_bert_graph_matches_torch_on_llvm(bert_fp32_weights_in):
    """The CUDA build's fused groups, built for llvm (the plan does not depend on the target): the
    transposed weights read inside their matmuls give PyTorch's output."""
    torch = pytest.importorskip("torch")
    module, ids, (mod, params) = bert_fp32_weights_in
    cpu = tvmfuse.build(mod, "llvm", "tvmfuse")
    gpu = tvmfuse.build(mod, _target("sm_90"), "tvmfuse")
    assert sorted(cpu.call_sites()) == sorted(gpu.call_sites())
    assert _transpose_kernels(cpu) == []
    out = cpu(ids, *params)
    with torch.inference_mode():
        ref = module(torch.from_numpy(ids)).numpy()
    np.testing.assert_allclose(out[0] if isinstance(out, tuple) else out, ref, rtol=1e-4, atol=1e-4)
