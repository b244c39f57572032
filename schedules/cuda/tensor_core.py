"""cuda.TensorCoreMatmul: a half-precision matmul (and the fused group around it) on tensor cores.

TVM's WMMA tensorization, as dlight's `MatmulTensorization` (tvm/s_tir/dlight/gpu/matmul.py)
writes it, with what tvmfuse's groups need on top:
  - any input dtype of `TENSOR_CORE_DTYPES` (float16; bfloat16 on sm_80+, with its WMMA intrinsics
    registered here, TVM 0.27 has float16/int8 ones only), accumulating in float32 (or in float16
    when the graph asks for a float16 accumulator);
  - every size: dlight tensorizes only extents above 64, here the operands are padded
    (`pad_einsum`) to the tile, so a ragged extent (197 tokens, a 50257-word vocabulary) costs
    the padding of its last tile, and the tile's rows shrink with a short M (a 16-token batch);
  - the group's prologue (a transposed weight, a reshape, a cast) is inlined into the
    shared-memory fetch of its operand, the epilogue (bias, GELU, residual add, cast, reshape)
    into the store from the accumulator: one kernel;
  - a matmul read by several output stages (GPT-2's fused QKV split into three, each reshaped
    and transposed) stores each of them from the warp's tile in shared memory, its part of the
    tile only (predicated); an output stage outside the matmul's chain that the epilogue also
    reads (GPT-2's causal mask, added to the scores) is recomputed in the epilogue;
  - a decline instead of an assertion: a group this schedule does not fit (no single reduction,
    not an einsum, an epilogue stage that will not inline, an output reading the result in
    several places such as a rotation) returns None and the next rule gets it.
The tile constants are in targets.CUDA ("tc_*"). The PTX of such a kernel holds
`wmma.mma.sync` (tensor-core MMA) instructions; tests/test_cuda_tensor_cores.py checks them and
that ptxas reports no local-memory spills.
"""
from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir import ScheduleError
from tvm.s_tir.dlight.gpu.matmul import (auto_inline_producers, check_sm_version,
                                        get_index_map, get_reduction_blocks)

from ..common import is_reduction
from ..row_chain import is_output
from ..rule import ScheduleRule
from .inline import inlined
from ..targets import CUDA

# input dtype -> (the smallest sm that has its WMMA, its short name in TVM's intrinsic names)
TENSOR_CORE_DTYPES = {"float16": (70, "f16"), "bfloat16": (80, "bf16")}
MICRO = 16  # the WMMA fragment: 16x16x16


class TensorCoreMatmul(ScheduleRule):
    name = "cuda.TensorCoreMatmul"

    def apply(self, func, target):
        if target.kind.name != "cuda" or "dlight.do_not_tensorize" in (func.attrs or {}):
            return None
        func = inlined(func, keep=_cast_into_matmul)
        sch = s_tir.Schedule(func)
        reductions = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
        if reductions is None or get_index_map(sch.get(reductions[0])) is None:
            return None
        dtypes = _dtypes(sch.get(reductions[0]))
        sm = check_sm_version(str(target.attrs.get("arch", "")))
        if dtypes is None or sm < TENSOR_CORE_DTYPES[dtypes[0]][0]:
            return None
        _recompute_side_outputs(sch, reductions[0])
        return _schedule(sch, reductions[0], *dtypes)


def _cast_into_matmul(sch, info) -> bool:
    """Whether a stage casts an operand of the matmul (ToMixedPrecision's float32 activation cast
    to float16 before a matmul): kept a stage, so the matmul reads the cast type, what WMMA takes,
    and the cast is inlined into the operand's copy to shared memory (_fetch_to_shared)."""
    block = sch.get(info.block_rv)
    if len(block.writes) != 1 or not any(is_reduction(sch, c) for c in sch.get_consumers(info.block_rv)):
        return False
    out = str(block.writes[0].source.dtype)
    return any(str(r.source.dtype) != out for r in block.reads)


def _recompute_side_outputs(sch, matmul) -> None:
    """A stage outside the matmul's chain that writes an output of the group and feeds its epilogue
    too (GPT-2's causal mask: `where(tril, 0, -inf)` kept as an output for the next layer and added
    to the scores) gives the epilogue a second producer, which reverse_compute_inline refuses. Its
    value is recomputed in the epilogue instead (an injective stage: a few index comparisons), and
    the stage stays, writing the output alone."""
    chain = {sch.get(b).name_hint for b in [matmul] + _descendants(sch, matmul)}
    for rv in sch.get_child_blocks(get_root_block(sch)):
        name = sch.get(rv).name_hint
        readers = [c for c in sch.get_consumers(rv) if sch.get(c).name_hint in chain]
        if name in chain or not readers or not is_output(sch, rv) or is_reduction(sch, rv):
            continue
        sch.cache_write(rv, 0, "global", consumer_blocks=readers)  # rv now writes a copy the
        try:  # readers and the output's own stage read, and is inlined into both
            sch.compute_inline(rv)
        except ScheduleError:
            continue


def _dtypes(block):
    """(input dtype, accumulator dtype) of a matmul block WMMA computes, else None: both operands
    of one dtype of TENSOR_CORE_DTYPES, accumulated in float32 (or float16 for float16 inputs)."""
    ins = {str(r.source.dtype) for r in block.reads if not r.source.same_as(block.writes[0].source)}
    if len(block.writes) != 1 or len(ins) != 1:
        return None
    a, out = ins.pop(), str(block.writes[0].source.dtype)
    if a not in TENSOR_CORE_DTYPES or out not in ("float32", a) or (a == "bfloat16" and out != "float32"):
        return None
    return a, out


def _tiles(sch, block):
    """(i_factors, j_factors, k_factors) for the normalised block [batch, i, j, k]: the rows of a
    tile shrink for a short M so little of it is padding (warps along i: 4, 2 or 1)."""
    m = sch.get(block).iter_vars[1].dom.extent
    warps_i = CUDA["tc_warps"]
    if isinstance(m, tirx.IntImm):
        while warps_i > 1 and warps_i * CUDA["tc_frags"] * MICRO // 2 >= int(m):
            warps_i //= 2
    return ([None, 1, warps_i, CUDA["tc_frags"]], [1, None, CUDA["tc_warps"], CUDA["tc_frags"]],
            [None, CUDA["tc_k_frags"]])


def _schedule(sch, block, in_dtype, out_dtype):
    """dlight's MatmulTensorization schedule (see the module docstring), on `block`."""
    sch.transform_layout(sch.reindex(block, ("read", 0)), ("write", 0), get_index_map(sch.get(block))[1])
    sch.transform_layout(sch.reindex(block, ("read", 1)), ("write", 0), get_index_map(sch.get(block))[2])
    index_maps = get_index_map(sch.get(block))
    sch.transform_layout(sch.reindex(block, ("write", 0)), ("read", 0), index_maps[3])
    sch.transform_block_layout(block, index_maps[0])
    i_f, j_f, k_f = _tiles(sch, block)
    sch.pad_einsum(block, [1, MICRO * i_f[2] * i_f[3], MICRO * j_f[2] * j_f[3], MICRO * k_f[1]])

    batch, i, j, k = sch.get_loops(block)
    i, i_inner = sch.split(i, factors=[None, MICRO])
    j, j_inner = sch.split(j, factors=[None, MICRO])
    k, k_inner = sch.split(k, factors=[None, MICRO])
    sch.reorder(i, j, k, i_inner, j_inner, k_inner)
    block_inner, block_outer = block, sch.blockize(i_inner)
    i0, i1, i2, i3 = sch.split(i, factors=i_f)
    j0, j1, j2, j3 = sch.split(j, factors=j_f)
    k0, k1 = sch.split(k, k_f)
    sch.annotate(k0, "software_pipeline_order", [0, 3, 1, 4, 5, 2, 6])
    sch.annotate(k0, "software_pipeline_stage", [0, 0, 0, 0, 0, 1, 1])
    sch.annotate(k1, "software_pipeline_order", [0, 1, 2])
    sch.annotate(k1, "software_pipeline_stage", [0, 0, 1])
    sch.reorder(i0, j0, i1, j1, j2, i2, k0, k1, i3, j3)
    sch.bind(batch, "blockIdx.z")
    sch.bind(sch.fuse(i0, j0), "blockIdx.x")
    sch.bind(sch.fuse(i1, j1), "blockIdx.y")
    thread_y = sch.fuse(j2, i2)
    sch.bind(thread_y, "threadIdx.y")
    warps = i_f[2] * j_f[2]

    for idx in (0, 1):  # operand tiles to shared memory; the prologue is inlined into the fetch
        _fetch_to_shared(sch, block_outer, idx, k0, warps)
    a_frag = sch.cache_read(block_outer, 0, "wmma.matrix_a")
    b_frag = sch.cache_read(block_outer, 1, "wmma.matrix_b")
    sch.compute_at(a_frag, k1)
    sch.compute_at(b_frag, k1)
    # the accumulator's way to global memory (where the epilogue runs): dynamic shared memory like
    # the operands', but a float32 tile smaller than theirs goes to static shared memory: TVM 0.27
    # merges the dynamic buffers and then fails to lower a float32 WMMA store into a float16 one
    # ("tvm_access_ptr element type must match the source buffer")
    stage = "shared" if out_dtype == "float32" and i_f[2] < CUDA["tc_warps"] else "shared.dyn"
    to_global = sch.cache_write(block_outer, 0, stage)
    sch.storage_align(to_global, 0, -2, 16, 4)
    store = sch.cache_write(block_outer, 0, "wmma.accumulator")
    sch.reverse_compute_at(store, thread_y)
    sch.reverse_compute_at(to_global, thread_y)
    _split_16x16(sch, store)
    init = sch.get_child_blocks(sch.decompose_reduction(block_outer, k0))[0]

    names = _intrinsics(in_dtype, out_dtype, stage)
    for frag, key in ((a_frag, "load_a"), (b_frag, "load_b")):
        io, jo, inner = _split_16x16(sch, frag)
        sch.unroll(io)
        sch.unroll(jo)
        sch.tensorize(inner, names[key])
    sch.tensorize(sch.get_loops(init)[-2], names["init"])
    sch.tensorize(sch.get_loops(store)[-2], names["store"])
    sch.tensorize(sch.get_loops(block_inner)[-3], names["compute"])

    _inline_epilogue(sch, to_global)  # the epilogue, into the store to global memory
    sinks = sch.get_consumers(to_global)
    if not sinks:
        _bind_lanes(sch, to_global, thread_y)
    elif any(sch.get_consumers(sink) for sink in sinks):
        return None  # an epilogue stage left outside the kernel: not this rule's schedule
    elif not all(_reads_one_element(sch, sink, to_global) for sink in sinks):
        return None  # an output reading the result in several places (a rotation): other warps' parts
    else:  # several outputs (GPT-2's QKV split in three): each stores its part of the warp's tile,
        for sink in sinks:  # reading it from shared memory; a part outside the tile is predicated off
            sch.reverse_compute_at(sink, thread_y)
        sch.compute_inline(to_global)
        for sink in sinks:
            _bind_lanes(sch, sink, thread_y)
    _bind_side_stages(sch)
    return sch.mod["main"]


def _inline_epilogue(sch, store):
    """The stages after `store` inlined: every intermediate one into its readers, then the one
    reader of `store`, if it has one, into the store, as long as something changes. The reader is
    taken into the store only while it is the store's only one: TVM 0.27's reverse_compute_inline
    does not check that, and inlining one of several outputs (GPT-2's QKV split into three) into
    the store leaves the others reading a buffer nothing declares (ill-formed TIR)."""
    changed = True
    while changed:
        changed = False
        for block in _descendants(sch, store):
            try:
                sch.compute_inline(block)
                changed = True
            except ScheduleError:
                continue
        consumers = sch.get_consumers(store)
        if len(consumers) == 1:
            try:
                sch.reverse_compute_inline(consumers[0])
                changed = True
            except ScheduleError:
                pass


def _descendants(sch, block) -> list:
    out = []
    for c in sch.get_consumers(block):
        out += [c] + _descendants(sch, c)
    return out


def _reads_one_element(sch, block, producer) -> bool:
    """Whether `block` reads what `producer` writes once per iteration, one element: then
    reverse_compute_at at the warp's loop gives it the iterations whose element the warp holds."""
    buf = sch.get(producer).writes[0].source
    regions = [r for r in sch.get(block).reads if r.source.same_as(buf)]
    return len(regions) == 1 and all(isinstance(rg.extent, tirx.IntImm) and int(rg.extent) == 1
                                     for rg in regions[0].region)


def _bind_side_stages(sch) -> None:
    """The group's stages outside the matmul's loops (an output _recompute_side_outputs left to
    write alone) each get their own threads: a kernel of its own in the function."""
    for rv in sch.get_child_blocks(get_root_block(sch)):
        loops = sch.get_loops(rv)
        if not loops or any(sch.get(lp).kind == tirx.ForKind.THREAD_BINDING for lp in loops):
            continue
        bx, tx = sch.split(sch.fuse(*loops), [None, CUDA["stray_threads"]])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")


def _bind_lanes(sch, block, warp_loop):
    """The loops of `block` below the warp's loop fused and spread over the warp's lanes, in vectors."""
    loops = sch.get_loops(block)
    at = [sch.get(lp).same_as(sch.get(warp_loop)) for lp in loops].index(True)
    fused = sch.fuse(*loops[at + 1:])
    _, tx, vec = sch.split(fused, factors=[None, CUDA["warp"], CUDA["tc_vector"]])
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(vec)


def _fetch_to_shared(sch, block, idx, k0, warps):
    """The operand's tile copied to shared memory ([rows, K] there), its producers inlined into
    the copy, a warp's lanes along the axis the source stores contiguously: K for an activation or
    a weight read as stored ([N, K]), the rows for a weight stored [K, N] (a transpose folded at
    build time)."""
    read = sch.cache_read(block, idx, "shared.dyn")
    sch.compute_at(read, k0)
    auto_inline_producers(sch, read)
    loops = sch.get_loops(read)[-2:]
    if _rows_contiguous(sch.get(read)):
        sch.reorder(loops[1], loops[0])
        loops = loops[::-1]
    fused = sch.fuse(*loops)
    _, ty, tx, vec = sch.split(fused, factors=[None, warps, CUDA["warp"], CUDA["tc_vector"]])
    sch.bind(tx, "threadIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.vectorize(vec)
    sch.storage_align(read, 0, axis=-2, factor=16, offset=8)
    sch.annotate(read, "tirx.manifest_shared_memory_local_stage", 1)
    sch.annotate(read, "double_buffer_scope", 0)
    return read


def _rows_contiguous(copy) -> bool:
    """Whether the global buffer a shared-memory copy [row, k] reads is contiguous along `row`: its
    last index uses the row variable and not the K one (the largest operand read, if several)."""
    row, k = (iv.var for iv in copy.iter_vars[-2:])
    reads = [r for r in copy.reads if r.source.scope() == "global"]
    if not reads:
        return False
    src = max(reads, key=lambda r: len(r.region))
    last = src.region[-1].min
    used = []
    tvm_ffi.structural_walk(last, (tirx.Var, used.append))
    return any(v.same_as(row) for v in used) and not any(v.same_as(k) for v in used)


def _split_16x16(sch, block):
    """Split the block's two innermost loops by 16 and order them (io, jo, ii, ji): (io, jo, ii)."""
    i, j = sch.get_loops(block)[-2:]
    io, ii = sch.split(i, factors=[None, MICRO])
    jo, ji = sch.split(j, factors=[None, MICRO])
    sch.reorder(io, jo, ii, ji)
    return io, jo, ii


def _intrinsics(in_dtype, out_dtype, stage) -> dict:
    """The WMMA intrinsic names for (in_dtype, out_dtype), operands from shared.dyn, B transposed
    ([N, K], a torch Linear's weight as stored), the accumulator stored to `stage`; bfloat16's
    are registered on first use."""
    from tvm.s_tir.tensor_intrin.cuda import get_wmma_intrin_group

    if in_dtype == "float16":
        return get_wmma_intrin_group("shared.dyn", stage, "float16", out_dtype, trans_b=True)
    return {**_bf16_intrinsics(), "store": f"wmma_store_16x16x16_f32_{stage.replace('.', '_')}"}


def _bf16_intrinsics() -> dict:
    """TVM's WMMA intrinsic generators instantiated for bfloat16 inputs (float32 accumulator; the
    fill and store of a float32 accumulator are TVM's own)."""
    from tvm.s_tir import TensorIntrin
    from tvm.s_tir.tensor_intrin import cuda as tc

    names = {"load_a": "tvmfuse_wmma_load_16x16x16_bf16_a_shared_dyn",
             "load_b": "tvmfuse_wmma_load_16x16x16_bf16_b_trans_shared_dyn",
             "compute": "tvmfuse_wmma_sync_16x16x16_bf16bf16f32_trans",
             "init": "wmma_fill_16x16x16_f32"}
    if TensorIntrin.get(names["compute"], allow_missing=True) is None:
        TensorIntrin.register(names["load_a"], *tc.get_wmma_load_intrin(16, 16, 16, "bfloat16", "shared.dyn",
                                                                        False, False))
        TensorIntrin.register(names["load_b"], *tc.get_wmma_load_intrin(16, 16, 16, "bfloat16", "shared.dyn",
                                                                        True, True))
        TensorIntrin.register(names["compute"], *tc.get_wmma_sync_intrin(16, 16, 16, "bfloat16", "float32", True))
    return names
