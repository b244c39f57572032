"""No cliffs on ragged extents, and build-time constant work.

- Matmul, batch matmul and conv with extents no tile divides (primes 13, 77, 1001; GPT-2's 50257
  vocabulary) are taken by their real rule, never cpu.Fallback, and stay numerically right.
- The CPU constants come from the target's ISA (AVX-512 vs AVX2), not from one CPU.
- FoldBatchNorm: golden before/after IR, numerics, and the cases where it must not fire.
- MarkConstantParams / PrepackWeights: a constant weight's packing runs at build time (the kernel
  reads the packed constant, launches unchanged); a non-constant weight is packed in the kernel.
"""
import re

import numpy as np
import pytest
import tvm
from tvm import relax

import tvmfuse
from schedules.targets import cpu_table
from tvmfuse.passes.fold_batch_norm import FoldBatchNorm
from tvmfuse.passes.prepack_weights import PREPROC
from conftest import real_model

RNG = np.random.default_rng(7)


def _rules(c):
    return {gv.name_hint: str(f.attrs["tvmfuse.rule"]) for gv, f in c.mod.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and "tvmfuse.rule" in f.attrs}


def _matmul_module(a_shape, b_shape, const_b=None, bias=False):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(a_shape, "float32"))
    params = [x]
    if const_b is None:
        w = relax.Var("w", relax.TensorType(b_shape, "float32"))
        params.append(w)
    else:
        w = relax.const(const_b)
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w))
            if bias:
                y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(y, relax.const(np.ones(b_shape[-1], "float32"))))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("shape", [(300, 771), (16, 50257), (40009,), (3, 7, 1001)])
def test_ragged_elementwise_rows_are_vectorized_with_a_scalar_tail(shape):
    """An elementwise op whose rows are no multiple of the vector and too wide to unroll (771, a
    vocabulary of 50257), or a 1-d extent (40009, prime): whole vectors in parallel and a scalar
    tail, not a scalar loop with an index division per element; numerics against numpy."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.multiply(x, relax.const(0.5, "float32"))))
        bb.emit_func_output(out)
    with tvmfuse.config.override(cpu={"min_parallel_work": 0}):  # 3x7x1001 is small enough to run serially
        compiled = tvmfuse.build(bb.get(), "llvm", "tvmfuse")
    (name, func), = [(gv.name_hint, f) for gv, f in compiled.mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)
                     and f.attrs and "tvmfuse.rule" in f.attrs]
    text = func.script()
    assert str(func.attrs["tvmfuse.rule"]) == "cpu.Injective" and "T.vectorized" in text and "T.parallel" in text, text
    xv = RNG.standard_normal(shape).astype("float32")
    np.testing.assert_array_equal(compiled(xv), np.maximum(xv * 0.5, 0))


@pytest.mark.parametrize("m,k,n", [(13, 77, 1001), (7, 64, 50257), (1, 13, 77), (5, 3, 10), (197, 64, 13)])
def test_ragged_matmul_takes_the_matmul_rule(m, k, n):
    x, w = RNG.standard_normal((m, k)).astype("float32"), RNG.standard_normal((k, n)).astype("float32")
    c = tvmfuse.build(_matmul_module((m, k), (k, n)), "llvm", "tvmfuse")
    assert set(_rules(c).values()) == {"cpu.Matmul"}
    np.testing.assert_allclose(c(x, w), x @ w, rtol=1e-4, atol=1e-4)


def test_ragged_matmul_with_a_constant_weight_and_an_epilogue():
    m, k, n = 13, 77, 1001
    x, w = RNG.standard_normal((m, k)).astype("float32"), RNG.standard_normal((k, n)).astype("float32")
    c = tvmfuse.build(_matmul_module((m, k), (k, n), const_b=w, bias=True), "llvm", "tvmfuse")
    assert set(_rules(c).values()) == {"cpu.Matmul"} and c.launches == 1
    np.testing.assert_allclose(c(x), np.maximum(x @ w + 1, 0), rtol=1e-4, atol=1e-4)


def test_ragged_batch_matmul_takes_the_matmul_rule():
    b, m, k, n = 3, 13, 77, 29
    x, w = RNG.standard_normal((b, m, k)).astype("float32"), RNG.standard_normal((b, k, n)).astype("float32")
    c = tvmfuse.build(_matmul_module((b, m, k), (b, k, n)), "llvm", "tvmfuse")
    assert set(_rules(c).values()) == {"cpu.Matmul"}
    np.testing.assert_allclose(c(x, w), x @ w, rtol=1e-4, atol=1e-4)


def _conv_module(cin, cout, hw, k, stride=1):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, cin, hw, hw), "float32"))
    w = relax.Var("w", relax.TensorType((cout, cin, k, k), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(bb.emit(
                relax.op.nn.conv2d(x, w, strides=stride, padding=k // 2))))
        bb.emit_func_output(out)
    return bb.get()


def _conv_ref(x, w, stride):
    import torch

    return torch.relu(torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=stride,
                                                 padding=w.shape[-1] // 2)).numpy()


@pytest.mark.parametrize("cin,cout,hw,k,stride", [(3, 16, 13, 3, 1), (8, 16, 7, 1, 1), (16, 32, 13, 3, 2),
                                                  (4, 16, 23, 7, 2)])
def test_ragged_conv_takes_the_conv_rule(cin, cout, hw, k, stride):
    x = RNG.standard_normal((1, cin, hw, hw)).astype("float32")
    w = RNG.standard_normal((cout, cin, k, k)).astype("float32")
    c = tvmfuse.build(_conv_module(cin, cout, hw, k, stride), "llvm", "tvmfuse")
    # a 1x1 conv on 7-wide rows runs as a matmul over its pixels where the conv tile is wider than
    # 7/0.7 columns (AVX2: passes/conv1x1_matmul.py), else as a conv; never in the fallback
    real = {"cpu.Conv2D", "cpu.Injective"} | ({"cpu.Matmul"} if (k, hw) == (1, 7) else set())
    assert set(_rules(c).values()) <= real, _rules(c)
    np.testing.assert_allclose(c(x, w), _conv_ref(x, w, stride), rtol=1e-4, atol=1e-4)


def test_cpu_constants_follow_the_isa():
    avx512 = cpu_table(tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"}))
    avx2 = cpu_table(tvm.target.Target({"kind": "llvm", "mcpu": "znver3"}))
    assert (avx512["vector_bytes"], avx512["vector_registers"]) == (64, 32)
    assert (avx2["vector_bytes"], avx2["vector_registers"]) == (32, 16)
    # the micro-kernel's accumulators plus its B vectors and the A broadcast fit the registers
    for t in (avx512, avx2):
        assert t["mm_rows"] * t["mm_col_vectors"] + t["mm_col_vectors"] + 1 <= t["vector_registers"]


def _vector_spills(asm: str) -> int:
    """Float vectors stored to the stack (spills, and local arrays) in x86 assembly, in the
    kernels (not in TVM's own `__tvm_*` helpers, whose error path saves a register or two)."""
    n, helper = 0, False
    for line in asm.splitlines():
        label = re.match(r"^([A-Za-z_][\w.]*):", line)
        if label:
            helper = label.group(1).startswith("__tvm")
        n += not helper and bool(re.search(r"vmov[au]p[sd]\s+%[yz]mm\d+, -?\d*\(%rsp", line))
    return n


def _pool_module():
    x = relax.Var("x", relax.TensorType((1, 64, 112, 112), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.max_pool2d(x, (3, 3), (2, 2), (1, 1, 1, 1)))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("mcpu", ["znver3", "znver4", "skylake-avx512"])
@pytest.mark.parametrize("module", ["conv3x3", "max_pool"])
def test_hot_kernels_keep_their_tiles_in_registers(mcpu, module, monkeypatch):
    """No cliff from one ISA's registers: ResNet-50's 3x3 conv at 56x56 as a direct conv (its tile:
    2 channel vectors x conv_columns accumulators; Winograd off, which would take it) and its max
    pool (a 56-wide row of 16-lane vectors) compile without a vector spill on AVX2 and AVX-512.
    Measured on znver4: 2 x 14 accumulators spilled 47 vectors per conv (44-127 GFLOP/s against
    200 at 2 x 8), and the pool's one 56-lane vector 100."""
    target = {"kind": "llvm", "mcpu": mcpu, "num-cores": 2}
    monkeypatch.setenv("TVMFUSE_CPU_WINOGRAD", "0")
    mod = _conv_module(64, 64, 56, 3, 1) if module == "conv3x3" else _pool_module()
    c = tvmfuse.build(mod, target, "tvmfuse")
    assert _vector_spills(c.executable.mod.imports[0].inspect_source("asm")) == 0


def test_a_schedule_for_another_cpu_uses_that_cpus_vectors():
    """Cross-compiling for AVX-512 from any host: the micro-kernel is 16 lanes wide."""
    mod = _matmul_module((16, 64), (64, 64))
    prepared = tvmfuse.prepare(mod, {"kind": "llvm", "mcpu": "skylake-avx512"}, "tvmfuse")
    (func,) = [f for _, f in prepared.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert re.search(r"T\.vectorized\((T\.int64\()?32\)", func.script())  # NR = 2 vectors of 16 lanes


# ------------------------------------------------------------------ FoldBatchNorm
def _conv_bn_module(stats_const=True, extra_use=False, channel_axis_const=True):
    c = 4
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32"))
    params = [x]
    w = relax.const(RNG.standard_normal((c, 3, 3, 3)).astype("float32"))
    shape = (1, c, 1, 1) if channel_axis_const else (1, 1, 1, 8)
    mean = relax.const(RNG.standard_normal(shape).astype("float32"))
    if not stats_const:
        mean = relax.Var("mean", relax.TensorType(shape, "float32"))
        params.append(mean)
    scale = relax.const(RNG.uniform(0.5, 1.5, shape).astype("float32"))
    beta = relax.const(RNG.standard_normal(shape).astype("float32"))
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
            a = bb.emit(relax.op.subtract(y, mean))
            b = bb.emit(relax.op.divide(a, scale))
            d = bb.emit(relax.op.add(b, beta))
            out = bb.emit_output(relax.op.nn.relu(d))
            if extra_use:
                out = bb.emit_output(relax.Tuple([out, y]))  # the conv's own output is needed too
        bb.emit_func_output(out)
    return bb.get()


def _ops(mod):
    return [bd.value.op.name for blk in mod["main"].body.blocks for bd in blk.bindings
            if isinstance(bd.value, relax.Call)]


def test_fold_batch_norm_golden():
    before = _conv_bn_module()
    after = FoldBatchNorm(before)
    # Expected, written out: conv2d with W / scale, one bias add of (0 - mean) / scale + beta, in
    # the order the links are absorbed
    blk = before["main"].body.blocks[0]
    conv, sub, div, add = (bd.value for bd in blk.bindings[:4])
    w, mean, scale, beta = (e.value.numpy() for e in (conv.args[1], sub.args[1], div.args[1], add.args[1]))
    inv = (1 / scale.reshape(-1)).astype("float32")
    bias = ((np.zeros(4, "float32") - mean.reshape(-1)) * inv + beta.reshape(-1)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const((w * inv.reshape(-1, 1, 1, 1)).astype("float32")),
                                           padding=1))
            d = bb.emit(relax.op.add(y, relax.const(bias.reshape(1, -1, 1, 1))))
            out = bb.emit_output(relax.op.nn.relu(d))
        bb.emit_func_output(out)
    tvm.ir.assert_structural_equal(after["main"], bb.get()["main"])
    x_np = RNG.standard_normal((1, 3, 8, 8)).astype("float32")
    import torch

    y = torch.nn.functional.conv2d(torch.from_numpy(x_np), torch.from_numpy(w), padding=1).numpy()
    ref = np.maximum((y - mean) / scale + beta, 0)
    np.testing.assert_allclose(tvmfuse.build(after, "llvm", "none")(x_np), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["stats_not_constant", "intermediate_used_twice", "const_not_per_channel"])
def test_fold_batch_norm_must_not_fire(case):
    mod = _conv_bn_module(stats_const=case != "stats_not_constant", extra_use=case == "intermediate_used_twice",
                          channel_axis_const=case != "const_not_per_channel")
    after = FoldBatchNorm(mod)
    ops = _ops(after)
    assert "relax.subtract" in ops, ops  # the chain's first link stays: nothing may be folded past it


def test_resnet_tiny_has_no_batch_norm_arithmetic_left():
    w = real_model("resnet-tiny")
    mod = tvmfuse.prepare(w.mod, "llvm", "none")
    names = [gv.name_hint for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert not [n for n in names if n.startswith(("subtract", "divide", "multiply"))], names
    x = w.inputs()
    np.testing.assert_allclose(tvmfuse.build(w.mod, "llvm", "tvmfuse")(*x), w.reference(*x), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ weight pre-packing
def _prepared_funcs(mod):
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


def test_constant_weight_is_packed_at_build_time():
    m, k, n = 16, 64, 100
    w = RNG.standard_normal((k, n)).astype("float32")
    c = tvmfuse.build(_matmul_module((m, k), (k, n), const_b=w), "llvm", "tvmfuse")
    assert c.launches == 1
    (func,) = _prepared_funcs(c.mod).values()
    assert PREPROC not in func.script()  # the packing stage left the kernel ...
    packed = [p for p in func.params if len(p.shape) == 3]  # ... which reads the packed constant
    assert len(packed) == 1 and int(packed[0].shape[1]) == k
    assert int(packed[0].shape[0]) * int(packed[0].shape[2]) >= n  # padded to whole panels
    x = RNG.standard_normal((m, k)).astype("float32")
    np.testing.assert_allclose(c(x), x @ w, rtol=1e-4, atol=1e-4)


def test_non_constant_weight_is_packed_in_the_kernel():
    m, k, n = 16, 64, 64
    c = tvmfuse.build(_matmul_module((m, k), (k, n)), "llvm", "tvmfuse")
    (func,) = _prepared_funcs(c.mod).values()
    assert all(len(p.shape) == 2 for p in func.params)  # x, w, out: no packed parameter
    assert "_global" in func.script()  # the in-kernel packing copy


def test_a_weight_that_is_also_an_output_is_returned_unpacked():
    m, k, n = 8, 32, 48
    w = RNG.standard_normal((k, n)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    wc = relax.const(w)
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, wc))
            out = bb.emit_output(relax.Tuple([y, wc]))
        bb.emit_func_output(out)
    c = tvmfuse.build(bb.get(), "llvm", "tvmfuse")
    xv = RNG.standard_normal((m, k)).astype("float32")
    y, w_out = c(xv)
    np.testing.assert_allclose(y, xv @ w, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(w_out, w)


def test_a_ragged_block_that_another_block_reads_is_not_partitioned():
    """loop_partition's wrapper blocks declare no reads or writes, so a partitioned block would
    hide its writes from the schedule steps after it (a later join could move its reader ahead of
    it). schedule_spatial_block splits only a block nothing else reads: here A (read by B) keeps
    one loop, B gets its vector body and scalar tail; both are right."""
    from tvm import s_tir, te

    from schedules.common import schedule_spatial_block
    from schedules.targets import for_target

    x = te.placeholder((6, 771), "float32", name="x")
    a = te.compute((6, 771), lambda i, j: x[i, j] * 2.0, name="A")
    b = te.compute((6, 771), lambda i, j: a[i, j] + x[i, j], name="B")
    sch = s_tir.Schedule(te.create_prim_func([x, a, b]))
    with for_target(tvm.target.Target("llvm")):
        schedule_spatial_block(sch, sch.get_sblock("A"))
        schedule_spatial_block(sch, sch.get_sblock("B"))
    text = sch.mod["main"].script()
    partitions = re.findall(r'sblock\("(\w+)_partition"\)', text)
    assert partitions and all(p.startswith("B_") for p in partitions), (partitions, text)  # B only
    lib = tvm.compile(sch.mod, target="llvm")
    xv = RNG.standard_normal((6, 771)).astype("float32")
    outs = [tvm.runtime.tensor(np.zeros((6, 771), "float32")) for _ in range(2)]
    lib["main"](tvm.runtime.tensor(xv), *outs)
    np.testing.assert_allclose(outs[0].numpy(), xv * 2, rtol=1e-6)
    np.testing.assert_allclose(outs[1].numpy(), xv * 3, rtol=1e-6)
