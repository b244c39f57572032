"""Helpers shared by the schedule rules: vector lanes, inlining, loop scheduling, stage shapes."""
from __future__ import annotations

import numpy as np
import tvm
from tvm.s_tir.dlight.analysis import normalize_prim_func

from .row_chain import is_output, reduction_operands, vars_in
from .targets import CPU


def lanes(dtype_bits: int) -> int:
    return max(1, min(CPU["max_vector_lanes"], CPU["vector_bytes"] * 8 // dtype_bits))


def extent(sch, loop):
    ext = sch.get(loop).extent
    return int(ext) if isinstance(ext, tvm.tirx.IntImm) else None


def inline_injective(sch, keep=None):
    """compute_inline every non-output spatial block that allows it and that `keep(sch, info)`
    (default: the CPU's `_costly_to_recompute`) does not hold back; repeat until none changes.
    Returns the block infos left, or None when the function cannot be normalised."""
    keep = _costly_to_recompute if keep is None else keep
    infos = normalize_prim_func(sch)
    if infos is None:
        return None
    # Always inline the first block (program order) that allows it, as a fresh scan would; but
    # scan from the start only as far back as an inline can have changed: a block's own state
    # (its consumers, its body) changes only when a consumer or producer of it is inlined, and its
    # consumers come after it. So after inlining block k, resume at k's earliest producer.
    # Normalising after every inline instead took 11 minutes on a horizontally joined optimizer
    # step of 1332 ops.
    i = 0
    while i < len(infos):
        info = infos[i]
        if not (info.is_injective() and not is_output(sch, info.block_rv) and not keep(sch, info)):
            i += 1
            continue
        producers = [sch.get_sref(b) for b in sch.get_producers(info.block_rv)]  # srefs: stable across edits
        try:
            sch.compute_inline(info.block_rv)
        except tvm.s_tir.ScheduleError:  # compute_inline refused this block: keep it a stage
            i += 1
            continue
        except TypeError as err:  # TVM's simplifier met int32 and int64 indices in one
            # expression (a reshape's producer inlined into a conv: tests/test_fuzz.py seeds
            # 14, 52, 145, 156). compute_inline replaces the tree only once it succeeded, so
            # the schedule is as before: the block stays a stage of its own.
            if "mismatched types" not in str(err):
                raise
            i += 1
            continue
        del infos[i]
        earlier = [j for j in range(i) if any(sch.get_sref(infos[j].block_rv).same_as(p) for p in producers)]
        i = min(earlier, default=i)
    return normalize_prim_func(sch)


def single_reduction(sch, inline_views=True):
    """Inline the injective stages; (block infos, the one reduction's info) or None when the
    function does not have exactly one reduction (the shape of a matmul or conv group). With
    `inline_views` False, a reshape read by the reduction stays a stage too (_costly_to_recompute)."""
    infos = inline_injective(sch, keep=None if inline_views else _keep_views)
    reductions = [i for i in infos or [] if is_reduction(sch, i.block_rv)]
    return (infos, reductions[0]) if len(reductions) == 1 else None


_IF_THEN_ELSE = tvm.ir.Op.get("prim.if_then_else")


def _costly_to_recompute(sch, info, inline_views=True):
    """Stages kept as in-kernel buffers instead of inlined:
    - a pure copy (transpose, reshape) or a padding read by a reduction: inlined, the matmul
      would read its operand with strides and the conv would test the border on every multiply
      (but a transposed row operand A of a matmul is inlined: `_reads_as_transposed_rows`);
      materialised, it is a packed operand. Not a copy that moves nothing (`_is_view`: a reshape
      that drops a unit axis or merges contiguous ones): kept, it was a copy of the operand in a
      buffer of its own per call (a transformer's [1, 128, 768] -> [128, 768] before every
      projection, 10% of GPT-J's matmul time), unless `inline_views` is False (cpu.Matmul when
      pad_einsum needs the operand read at plain indices)
    - a stage read by several consumers that calls a transcendental (exp in softmax): inlining
      would evaluate it once per consumer"""
    consumers = sch.get_consumers(info.block_rv)
    body = sch.get(info.block_rv).body
    value = body.value if isinstance(body, tvm.tirx.BufferStore) else None
    is_copy = isinstance(value, tvm.ir.TensorLoad)  # what tirx.BufferLoad builds in 0.27
    is_pad = isinstance(value, tvm.ir.Call) and value.op.same_as(_IF_THEN_ELSE)
    if (is_copy or is_pad) and any(is_reduction(sch, c) for c in consumers):
        if inline_views and is_copy and all(_reads_as_transposed_rows(sch, c, body) for c in consumers):
            return False
        return not (inline_views and is_copy and _is_view(sch.get(info.block_rv), body))
    if len(consumers) < 2:
        return False
    return any(f"T.{name}(" in str(body) for name in CPU["costly_intrinsics"])


def _reads_as_transposed_rows(sch, consumer, store) -> bool:
    """Whether `consumer` is a matmul (two operands reduced) that reads the copy `store` (dst[.., a, b]
    = src[.., b, a], a transpose of the last two axes) as its row operand A[.., i, k] (k reduced and
    last, i spatial). Inlined, A is read as src[.., k, i]: the micro-kernel's rows of one k are then
    adjacent floats (one cache line), where the copy costs a pass over A per call (an attention
    backward's P^T @ dO: a [16, 128, 128] transpose). znver4, 2 threads, interleaved: a weight
    gradient dY^T @ X of 512 tokens, 1024 x 256, 1.56 -> 1.39 ms; P^T @ dO 0.217 -> 0.181 ms."""
    if not is_reduction(sch, consumer) or operands_of_reduction(sch, consumer) != 2:
        return False
    dst_idx, src_idx = list(store.indices), list(store.value.indices)
    if len(dst_idx) < 2 or len(src_idx) != len(dst_idx):
        return False
    if not (src_idx[-1].same_as(dst_idx[-2]) and src_idx[-2].same_as(dst_idx[-1])) or \
            any(not a.same_as(b) for a, b in zip(src_idx[:-2], dst_idx[:-2])):
        return False
    block = sch.get(consumer)
    ivs = block.iter_vars
    if len(ivs) < 3 or [int(iv.iter_type) for iv in ivs[-3:]] != [0, 0, 2]:
        return False  # not [.., i, j, k] (x^T @ g with one column has no j: a column reduction)
    reads = [r for r in block.reads if r.source.same_as(store.buffer)]
    if len(reads) != 1 or len(reads[0].region) < 2:
        return False
    last, second = (vars_in(rg.min) for rg in (reads[0].region[-1], reads[0].region[-2]))
    if last != {ivs[-1].var.name} or second != {ivs[-3].var.name}:
        return False
    # columns N of at least a vector; fewer, the tile would pad them (and the copy's rows read whole win)
    n = ivs[-2].dom.extent
    return isinstance(n, tvm.tirx.IntImm) and int(n) >= lanes(block_bits(sch, consumer))


def _keep_views(sch, info):
    """_costly_to_recompute, and a view read by a reduction is kept as well."""
    return _costly_to_recompute(sch, info, inline_views=False)


def _flat_index(indices, shape):
    flat = 0
    for i, n in zip(indices, shape):
        flat = flat * n + i
    return flat


def _is_view(block, store) -> bool:
    """Whether a copy `store` (dst[w] = src[r]) writes each element at the same flat offset it
    reads it from: a reshape of a contiguous buffer, which moves nothing."""
    from tvm.sym import Analyzer

    src, dst = store.value.source, store.buffer
    ana = Analyzer()
    for iv in block.iter_vars:
        ana.bind(iv.var, iv.dom)
    try:
        read = _flat_index(store.value.indices, src.shape)
        write = _flat_index(store.indices, dst.shape)
        return bool(ana.can_prove_equal(read, write))
    except (TypeError, AttributeError, tvm.TVMError):  # int32 and int64 indices mixed: not provably a view
        return False


def store_views_in_producers(sch) -> None:
    """reverse_compute_inline every output block that only copies one in-kernel stage to the
    output at the same flat offset (`_is_view`: a reshape such as [1, 56, 56, 96] -> [3136, 96]
    after a layer norm), so the producer stores into the output directly and keeps its own loops.
    Inlined the other way (the producer into the copy), the rows of the chain would be the reshape's
    (3136 over 96) while its reductions' are (1, 56, 56): row_chain.analyze finds no common row and
    the kernel went to cpu.Fallback, 1.7x slower on ConvNeXt. A block TVM refuses to move stays."""
    for info in normalize_prim_func(sch) or []:
        block = sch.get(info.block_rv)
        store = block.body
        if not (isinstance(store, tvm.tirx.BufferStore) and isinstance(store.value, tvm.ir.TensorLoad)):
            continue
        producers = sch.get_producers(info.block_rv)
        if not is_output(sch, info.block_rv) or len(producers) != 1:
            continue
        if len(sch.get_consumers(producers[0])) != 1:
            continue  # the stage is read by others too (a BatchNorm's mean, output and subtracted): it stays
        if _is_view(block, store):
            try:
                sch.reverse_compute_inline(info.block_rv)
            except tvm.s_tir.ScheduleError:
                continue


def operands_of_reduction(sch, block_rv) -> int:
    """row_chain.reduction_operands of the block: 2 for a matmul or conv, 1 for a row sum."""
    return reduction_operands(sch.get(block_rv))


def is_reduction(sch, block_rv):
    return any(int(iv.iter_type) == 2 for iv in sch.get(block_rv).iter_vars)  # 2 = CommReduce


def block_bits(sch, block_rv):
    writes = sch.get(block_rv).writes
    return tvm.runtime.DataType(str(writes[0].source.dtype)).bits if writes else 32


def schedule_spatial(sch, info):
    schedule_spatial_block(sch, info.block_rv)


def schedule_spatial_block(sch, block_rv):
    """A spatial block: a transposing copy in tiles, else every loop fused, parallel outer and
    vectorized inner where the extent allows."""
    loops = sch.get_loops(block_rv)
    if not loops:  # a 0-d output (the divide of a full mean): nothing to parallelise
        return
    if 0 in (extent(sch, lp) for lp in loops):  # an empty output (a slice of width 0): nothing runs,
        return  # and fuse would fold the zero extent into a division by zero
    if tile_transpose(sch, block_rv, loops):
        return
    n = lanes(block_bits(sch, block_rv))
    ivs = sch.get(block_rv).iter_vars
    row = int(ivs[-1].dom.extent) if ivs and isinstance(ivs[-1].dom.extent, tvm.tirx.IntImm) else None
    if len(loops) == 1 and row and row % n and (extent(sch, loops[0]) or 1) % row == 0 and row < extent(sch, loops[0]):
        loops = list(sch.split(loops[0], [None, row]))  # normalisation fused the rows: split them again
    last = extent(sch, loops[-1])
    if len(loops) > 1 and last and last % n and n <= last <= 32 * n:
        # the innermost extent is no multiple of the vector (a padded row of 114): fusing every loop
        # would split rows mid-vector, an int64 division per lane (a 64x114x114 padding took 3 ms)
        outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        if (extent(sch, outer) or CPU["min_parallel_extent"]) >= CPU["min_parallel_extent"]:
            sch.parallel(outer)
        sch.vectorize(loops[-1])
        return
    if len(loops) > 1 and last and last >= n and any(extent(sch, lp) is None for lp in loops[:-1]):
        # a symbolic outer extent (the rows of a padded operand copy, a dynamic batch or sequence):
        # fused with the static row it could only run as scalars, an index division per element;
        # rows in parallel, each row vectorized
        outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        sch.parallel(outer)
        if last % n == 0:
            sch.vectorize(sch.split(loops[-1], [None, n])[1])
        return
    # loop_partition's wrapper blocks declare no reads or writes, so a block that is partitioned
    # hides its writes from later schedule steps: only a block nothing else in the kernel reads
    # (an output) is partitioned; a ragged intermediate keeps the plain parallel loop
    tail_ok = not sch.get_consumers(block_rv)
    if tail_ok and len(loops) > 1 and last and last % n and last > 32 * n:
        # a wide row that is no multiple of the vector (771 columns, a vocabulary of 50257): fused,
        # every element would be a scalar with an index division; rows in parallel, each row whole
        # vectors and then a scalar tail of last % n
        outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        if (extent(sch, outer) or CPU["min_parallel_extent"]) >= CPU["min_parallel_extent"]:
            sch.parallel(outer)
        _vector_body_scalar_tail(sch, loops[-1], last, n)
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    ext = extent(sch, fused)
    if ext is not None and ext >= n * CPU["min_parallel_extent"] and (ext % n == 0 or tail_ok):
        if ext % n:  # a ragged total (a 1-d tensor of 1001): whole vectors in parallel, a scalar tail
            fused = sch.loop_partition(fused, [ext - ext % n, None], preserve_unit_iters=False)[0]
        outer, inner = sch.split(fused, [None, n])
        sch.parallel(outer)
        sch.vectorize(inner)
    elif ext is None or ext >= CPU["min_parallel_extent"]:
        sch.parallel(fused)


def _vector_body_scalar_tail(sch, loop, ext, n):
    """`loop` (extent `ext`, no multiple of `n`) as whole vectors of n lanes, then ext % n scalars."""
    body = sch.loop_partition(loop, [ext - ext % n, None], preserve_unit_iters=False)[0]
    sch.vectorize(sch.split(body, [None, n])[1])


def tile_transpose(sch, block_rv, loops) -> bool:
    """A copy whose innermost output index is not the input's innermost one (a transpose) is done
    in square tiles: the tile's input lines stay in L1 while its output rows are written whole,
    vectorized. Row by row, every load would touch a new cache line. Returns whether it applied."""
    block = sch.get(block_rv)
    body = block.body
    if not (isinstance(body, tvm.tirx.BufferStore) and isinstance(body.value, tvm.ir.TensorLoad)):
        return False
    if len(loops) < 2 or len(block.reads) != 1:
        return False
    src = [rg.min for rg in block.reads[0].region]
    inner = block.iter_vars[-1].var
    last_src = src[-1] if src else None
    if last_src is None or last_src.same_as(inner) or not any(i.same_as(inner) for i in src):
        return False
    t = CPU["transpose_tile"]
    a, b = loops[-2], loops[-1]
    if (extent(sch, a) or 0) % t or (extent(sch, b) or 0) % t:
        return False
    a0, a1 = sch.split(a, [None, t])
    b0, b1 = sch.split(b, [None, t])
    sch.reorder(a0, b0, a1, b1)
    outer = [*loops[:-2], a0, b0]
    sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    sch.vectorize(b1)
    return True


def schedule_reduction(sch, info):
    """A reduction no specific rule took (pooling windows): its leading spatial loops fused and
    parallel; when its reduction loops all follow them and the innermost spatial extent allows, that
    spatial loop moves inside the reduction loops as a vector (every output keeps its own
    reduction order: only which outputs advance together changes)."""
    kinds = info.dom_kind()
    loops = info.get_loops()
    lead = [lp for lp, k in zip(loops, kinds) if k == "S"]
    if kinds[: len(lead)] != "S" * len(lead) or not lead:
        return  # spatial loops not leading: leave it serial rather than reorder the math
    reds = loops[len(lead):]
    inner = lead[-1] if reds and (len(lead) >= 2 or _column_reduction(sch, info.block_rv, lead[-1])) else None
    n = extent(sch, inner) if inner is not None else None
    bits = block_bits(sch, info.block_rv)
    v = lanes(bits)
    w = v
    while n and w > 1 and n % w:  # the widest power of two dividing the row, up to a vector
        w //= 2
    if n and w < v and w >= max(4, v // 2):  # 56 on AVX-512: vectors of 8, not one of 56
        v = w
    # else a row that is no multiple of half a vector is one vector only up to 4 ymm registers:
    # wider (56 lanes of 16) made LLVM spill 100 vectors (max pool on AVX-512)
    if len(lead) == 1 and n and not (n % v == 0 and n > v):
        inner = n = None  # one spatial loop: vectorized only when vector chunks of it can run in parallel
    if n and n >= v and (n % v == 0 or n * bits <= 4 * 256):
        outer = lead[:-1]
        if n % v == 0 and n > v:
            outer_w, inner = sch.split(inner, [None, v])
            outer = outer + [outer_w]
        sch.reorder(*outer, *reds, inner)
        fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    else:
        fused, inner = (sch.fuse(*lead) if len(lead) > 1 else lead[0]), None
    ext = extent(sch, fused)
    if ext is None or ext >= CPU["min_parallel_extent"]:
        sch.parallel(fused)  # (before the init is split off: parallel checks the whole reduction)
    if inner is not None:
        sch.vectorize(inner)
        sch.decompose_reduction(info.block_rv, reds[0])


def _column_reduction(sch, block_rv, loop) -> bool:
    """Whether `loop` (a block's only spatial loop) walks the innermost index of every buffer the
    block reads: a sum over rows (a bias gradient, sum(x, axis=0)), whose columns are contiguous and
    take vector lanes, each lane summing its own column."""
    block = sch.get(block_rv)
    var = next((iv.var for iv in block.iter_vars if int(iv.iter_type) == 0), None)
    if var is None or not block.reads or not all(r.region for r in block.reads):
        return False
    from .row_chain import read_indices

    return all(var.name in last for _used, last in read_indices(block))


def pack_at_build_time(sch, block_rv) -> bool:
    """Mark a packing copy of a parameter that is a constant at every call (the function's
    `tvmfuse.constant_params`, from passes/prepack_weights.MarkConstantParams) as a layout-rewrite
    preprocess: PrepackWeights splits it out and folds it at build time. Returns whether it did."""
    func = sch.mod["main"]
    marked = func.attrs.get("tvmfuse.constant_params") if func.attrs else None
    if not marked:
        return False
    params = [func.params[int(i)] for i in marked]  # 0.27: the params are the buffers
    if not any(r.source.same_as(p) for r in sch.get(block_rv).reads for p in params):
        return False
    sch.annotate(block_rv, "meta_schedule.layout_rewrite_preproc", True)
    sch.annotate(sch.get_sblock("root"), "tvmfuse.prepack", True)  # what PrepackWeights looks for
    return True


def uniform_index_dtype(func):
    """`func` with one index dtype: itself when its buffer shapes and loop and iteration variables
    agree already; narrowed to int32 (TVM's ForceNarrowIndexToInt32) when they mix int32 and int64
    (a TOPI stage that indexes in int32, a conv1d, fused with int64 ones), since the primitives that
    build a buffer from both (pad_einsum's padded copy, then transform_layout on it) raise on the
    mix; None when narrowing could change the math: a symbolic shape or a scalar parameter, a
    buffer of 2^31 elements or more, a buffer that holds integers."""
    import tvm_ffi

    buffers, dtypes = list(func.params), set()

    def block(b):
        buffers.extend(b.alloc_buffers)
        dtypes.update(str(iv.var.ty) for iv in b.iter_vars)
        return b

    def loop(f):
        dtypes.add(str(f.loop_var.ty))
        return f

    tvm_ffi.structural_map(func.body, [(tvm.s_tir.SBlock, block), (tvm.tirx.For, loop)], order="post")
    shapes = [getattr(b, "shape", None) for b in buffers]
    dtypes.update(str(d.ty) for shape in shapes if shape is not None for d in shape)
    if len(dtypes) <= 1:
        return func
    floats = all(b.ty.dtype.matches_code(tvm.runtime.DataTypeCode.FLOAT, tvm.runtime.DataTypeCode.BFLOAT)
                 for b, shape in zip(buffers, shapes) if shape is not None)
    if not floats or any(s is None or not all(isinstance(d, tvm.tirx.IntImm) for d in s) for s in shapes):
        return None
    if any(int(np.prod([int(d) for d in s], dtype=np.int64)) >= 2**31 for s in shapes):
        return None
    return tvm.tirx.transform.ForceNarrowIndexToInt32()(tvm.IRModule({"main": func}))["main"]
