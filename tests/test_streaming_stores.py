"""StreamingStores (tvmfuse/passes/streaming_stores.py): which kernels are marked and why not, the
lowered TIR after the rewrite (streaming stores, a chunk per core ending in sfence, a fence
before the return), the machine code, and numerics, whole and ragged widths, every variant."""
import numpy as np
import pytest
import tvm
from tvm import relax, s_tir, te

import tvmfuse
import tvmfuse.runtime.roofline
from schedules.targets import cpu_table
from tvmfuse.passes.streaming_stores import STREAM_ATTR, MarkStreamingStores, register_pipeline, stream_outputs

X86 = bool(cpu_table().get("streaming_stores"))
needs_x86 = pytest.mark.skipif(not X86, reason="streaming stores are x86 only")
MIB = 1 << 20


def _bias_relu(n, m):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, m), "float32"))
    b = relax.Var("b", relax.TensorType((m,), "float32"))
    with bb.function("main", [x, b]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.relu(relax.op.add(x, b)))
        bb.emit_func_output(y)
    return bb.get()


def _te_func(n, m, out_of=lambda x: te.compute(x.shape, lambda i, j: x[i, j] + 1.0, name="y")):
    x = te.placeholder((n, m), "float32", name="x")
    return te.create_prim_func([x, out_of(x)])


def test_marks_outputs_of_a_working_set_over_the_cache():
    """[512, 512] in and out: 2 MiB. Over a 1 MiB cache its output is streamed; under a 4 MiB one
    nothing is; an output under stream_output_pct of the cache (a row sum) is not."""
    table = {**cpu_table(), "streaming_stores": 1}
    func = _te_func(512, 512)
    assert [b.name for b in stream_outputs(func, 1 * MIB, table)] == ["y"]
    assert "fits the 4 MiB cache" in stream_outputs(func, 4 * MIB, table)
    def row_sum(x):
        k = te.reduce_axis((0, 512), "k")
        return te.compute((512,), lambda i: te.sum(x[i, k], axis=k), name="s")

    rowsum = _te_func(512, 512, row_sum)
    assert "no large float32 output" in stream_outputs(rowsum, 1 * MIB, table)


def test_must_not_fire_on_symbolic_shapes_read_back_outputs_or_without_x86():
    n = tvm.tirx.Var("n", "int64")
    table = {**cpu_table(), "streaming_stores": 1}
    assert "symbolic" in stream_outputs(_te_func(n, 512), 1, table)

    def read_back(x):  # y = x + 1, then z = y * 2 reads y: y is read back, z is streamed
        y = te.compute(x.shape, lambda i, j: x[i, j] + 1.0, name="y")
        return y, te.compute(x.shape, lambda i, j: y[i, j] * 2.0, name="z")

    x = te.placeholder((512, 512), "float32", name="x")
    y, z = read_back(x)
    func = te.create_prim_func([x, y, z])
    sch = s_tir.Schedule(func)  # not inlined: y is an output the second stage reads
    assert [b.name for b in stream_outputs(sch.mod["main"], 1 * MIB, table)] == ["z"]
    mod = tvm.IRModule({"main": _te_func(512, 512)})
    assert MarkStreamingStores({**table, "streaming_stores": 0}, 1 * MIB)(mod).same_as(mod)
    assert MarkStreamingStores(table, None)(mod).same_as(mod)  # cache size unknown
    marked = MarkStreamingStores(table, 1 * MIB)(mod)["main"]
    assert list(marked.attrs[STREAM_ATTR]) == ["tvmfuse_stream_out0"] and marked.params[1].name == "tvmfuse_stream_out0"


def test_an_output_named_like_a_buffer_it_reads_is_still_streamed():
    """Names are not unique: GPT-2's LM head reads its reshaped input "T_reshape" and writes its
    reshaped output "T_reshape". The output is judged by identity (not read back) and renamed."""
    table = {**cpu_table(), "streaming_stores": 1}
    x = te.placeholder((512, 512), "float32", name="x")
    r = te.compute((512, 512), lambda i, j: x[i, j] * 2.0, name="T_reshape")
    y = te.compute((512, 512), lambda i, j: r[i, j] + 1.0, name="T_reshape")
    func = s_tir.Schedule(te.create_prim_func([x, y])).mod["main"]
    assert [b.name for b in stream_outputs(func, 1 * MIB, table)] == ["T_reshape"]
    marked = MarkStreamingStores(table, 1 * MIB)(tvm.IRModule({"main": func}))["main"]
    assert marked.params[1].name == "tvmfuse_stream_out0" and "T_reshape" in marked.script()


@needs_x86
def test_the_lowered_function_streams_and_fences_per_task():
    """After the "tvmfuse" TIR pipeline: every whole-vector store of y is a tvmfuse_stream call, the
    parallel loop is one chunk per core (3 here) each ending in sfence, and one more fence closes
    the compute scope (before MakePackedAPI's return)."""
    seen = {}

    @tvm.instrument.pass_instrument
    class Grab:
        def run_after_pass(self, mod, info):
            if info.name == "tvmfuse.StreamStores":
                seen["mod"] = mod

    lanes = cpu_table()["vector_bytes"] // 4
    x = te.placeholder((512, 544), "float32", name="x")  # 544: whole vectors of 8 and of 16
    y = te.compute((512, 544), lambda i, j: x[i, j] + 1.0, name="y")
    sch = s_tir.Schedule(te.create_prim_func([x, y]))
    i, j = sch.get_loops(sch.get_sblock("y"))
    _, j1 = sch.split(j, [None, lanes])
    sch.parallel(i)
    sch.vectorize(j1)
    target = tvm.target.Target({"kind": "llvm", "num-cores": 3})
    with tvm.transform.PassContext(instruments=[Grab()]):
        lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr(STREAM_ATTR, ["y"])}), target=target,
                          tir_pipeline=register_pipeline())
    text = seen["mod"]["main"].script()
    assert text.count(f'"tvmfuse_stream_f32x{lanes}"') == 1 and text.count('"tvmfuse_sfence"') == 2, text
    assert "for stream_task in T.parallel(3):" in text and "pragma_import_llvm" in text
    xs = np.random.default_rng(0).standard_normal((512, 544)).astype("float32")
    out = tvm.runtime.tensor(np.zeros((512, 544), "float32"))
    lib["main"](tvm.runtime.tensor(xs), out)
    np.testing.assert_array_equal(out.numpy(), xs + 1.0)


@needs_x86
@pytest.mark.parametrize("fusion", ["none", "tvm", "tvmfuse"])
@pytest.mark.parametrize("n,m", [(512, 512), (300, 771)])
def test_a_build_streams_its_large_outputs_and_stays_exact(n, m, fusion, monkeypatch):
    """tvmfuse.build with the cache size patched to 512 KiB: relu(x + b) is written with vmovntps
    (whole rows, 512 wide, and ragged ones, 771 wide, whose unaligned vectors take the plain store)
    and the output is bit-exact; at the real cache size the same small build streams nothing."""
    rng = np.random.default_rng(n)
    xv, bv = rng.standard_normal((n, m)).astype("float32"), rng.standard_normal(m).astype("float32")
    plain = tvmfuse.build(_bias_relu(n, m), "llvm", fusion)
    monkeypatch.setattr(tvmfuse.runtime.roofline, "last_level_cache_bytes", lambda: 512 * 1024)
    streamed = tvmfuse.build(_bias_relu(n, m), "llvm", fusion)
    asm = streamed.executable.mod.imports[0].inspect_source("asm")
    assert "vmovntps" in asm and "sfence" in asm
    assert "vmovntps" not in plain.executable.mod.imports[0].inspect_source("asm")
    np.testing.assert_array_equal(streamed(xv, bv), np.maximum(xv + bv, 0))
    np.testing.assert_array_equal(plain(xv, bv), np.maximum(xv + bv, 0))


@needs_x86
def test_rmsnorm_streams_only_the_output_it_does_not_read_back(monkeypatch, caplog):
    """The zoo's rmsnorm_residual: the kernel writes s = x + r and reads it back for the norm, so
    only y is streamed (logged); both outputs match numpy."""
    import logging

    from tvmfuse.zoo import workloads

    monkeypatch.setattr(tvmfuse.runtime.roofline, "last_level_cache_bytes", lambda: 64 * 1024)
    w = workloads.get("rmsnorm_residual", "small")
    with caplog.at_level(logging.INFO, logger="tvmfuse.fusion"):
        compiled = tvmfuse.build(w.mod, "llvm", "tvmfuse")
    lines = [r.message for r in caplog.records if "streaming stores" in r.message]
    assert len(lines) == 1 and "T_multiply" in lines[0] and "T_add" not in lines[0], lines
    ins = w.inputs()
    for got, ref in zip(compiled(*ins), w.reference(*ins)):
        np.testing.assert_allclose(got, ref, rtol=w.rtol, atol=w.atol)
