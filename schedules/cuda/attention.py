"""cuda.Attention: a fused attention group as one flash-attention CUDA kernel.

Takes a PrimFunc carrying `tvmfuse.attention` (fusion/match_attention.py), declining otherwise:
  - a thread block per (batch x head, block of `attn_query_rows` query rows), one thread per row;
  - for each tile of `attn_key_tile` keys: the K and V tiles loaded into shared memory by the whole
    block (coalesced along D), then each thread scores its row against the tile (its Q row in
    registers), applies the score steps, and does the online softmax: the tile's max, the
    accumulator rescaled by exp(m_old - m_new) once per tile, P·V accumulated from shared memory;
  - the output divided by the row sum once. Ragged rows and keys are clamped on load, masked to
    probability 0 and not written.
Global traffic is O(N·d): Q, K, V and the mask read once per row block, O written once.
"""
from __future__ import annotations

from ..attention import NEG, cdiv, index, kernel, minus1, mul, preamble, read_spec, signature, steps
from ..rule import ScheduleRule
from ..targets import CUDA


def _row_blocks(spec, rows: int):
    """(rows per block, query blocks, the block's query-block and head expressions of bx). Short
    queries (decode) take one warp's worth of rows; bx divides by constants where it can."""
    if isinstance(spec.sq, int):
        rows = min(rows, max(CUDA["warp"], -(-spec.sq // CUDA["warp"]) * CUDA["warp"]))
    nq = cdiv(spec.sq, rows)
    if isinstance(spec.bh, int):
        return rows, nq, f"bx // {spec.bh}", f"bx % {spec.bh}"
    return rows, nq, f"bx % {nq}", f"bx // {nq}"


def kernel_source(spec, rows: int, keys: int) -> str:
    sq, sk, d, dv = spec.sq, spec.sk, spec.d, spec.dv
    rows, nq, qb, bh = _row_blocks(spec, rows)
    nk, sk1 = cdiv(sk, keys), minus1(sk)
    row = f"T.min({qb} * {rows} + tx, {minus1(sq)})"
    kload = -(-keys * d // rows)
    vload = -(-keys * dv // rows)
    key = f"T.min(jb * {keys} + j, {sk1})"
    score = steps(spec, "sc[j]", bh, row, key)
    return f'''
@T.prim_func
def main({signature(spec)}):
    T.func_attr({{"global_symbol": "main", "tirx.noalias": True}})
{preamble(spec)}    bx = T.launch_thread("blockIdx.x", {mul(spec.bh, nq)})
    tx = T.launch_thread("threadIdx.x", {rows})
    ks = T.decl_buffer(({keys}, {d}), "float32", scope="shared")
    vs = T.decl_buffer(({keys}, {dv}), "float32", scope="shared")
    qr = T.decl_buffer(({d},), "float32", scope="local")
    acc = T.decl_buffer(({dv},), "float32", scope="local")
    sc = T.decl_buffer(({keys},), "float32", scope="local")
    r = T.decl_buffer((4,), "float32", scope="local")
    for c in T.unroll({d}):
        qr[c] = {index(spec, "q", bh, row, "c")}
    for e in T.unroll({dv}):
        acc[e] = T.float32(0)
    r[0] = {NEG}
    r[1] = T.float32(0)
    for jb in range({nk}):
        for u in range({kload}):
            if u * {rows} + tx < {keys * d}:
                ks[(u * {rows} + tx) // {d}, (u * {rows} + tx) % {d}] = {index(spec, "k", bh, f"T.min(jb * {keys} + (u * {rows} + tx) // {d}, {sk1})", f"(u * {rows} + tx) % {d}")}
        for u in range({vload}):
            if u * {rows} + tx < {keys * dv}:
                vs[(u * {rows} + tx) // {dv}, (u * {rows} + tx) % {dv}] = {index(spec, "v", bh, f"T.min(jb * {keys} + (u * {rows} + tx) // {dv}, {sk1})", f"(u * {rows} + tx) % {dv}")}
        T.tvm_storage_sync("shared")
        r[2] = r[0]
        for j in T.unroll({keys}):
            sc[j] = T.float32(0)
            for c in T.unroll({d}):
                sc[j] = sc[j] + qr[c] * ks[j, c]
            sc[j] = T.if_then_else(jb * {keys} + j < {sk}, {score}, {NEG})
            r[2] = T.max(r[2], sc[j])
        r[3] = T.exp(r[0] - r[2])
        r[1] = r[1] * r[3]
        for e in T.unroll({dv}):
            acc[e] = acc[e] * r[3]
        for j in T.unroll({keys}):
            sc[j] = T.if_then_else(jb * {keys} + j < {sk}, T.exp(sc[j] - r[2]), T.float32(0))
            r[1] = r[1] + sc[j]
            for e in T.unroll({dv}):
                acc[e] = acc[e] + sc[j] * vs[j, e]
        r[0] = r[2]
        T.tvm_storage_sync("shared")
    if {qb} * {rows} + tx < {sq}:
        for e in T.unroll({dv}):
            {index(spec, "out", bh, f"{qb} * {rows} + tx", "e")} = acc[e] / r[1]
'''


def split_kernel_source(spec, rows: int, keys: int, split: int) -> str:
    """The kernel with the keys of each query row split over `split` threads: thread (s, r) of a
    block runs the online softmax of row r over key tiles s, s + split, s + 2 split, ... (its own
    running max, sum and accumulator), and the block merges the `split` partial states of a row at
    the end (m = max m_s, l = sum l_s exp(m_s - m), o = sum acc_s exp(m_s - m) / l), each thread
    writing dv / split of the row's outputs. A thread per row leaves most of a GPU idle at batch 1
    (12 heads x 2048 rows are 24,576 threads); split ways as many fill it. The K/V tiles of the
    `split` groups are loaded by the whole block into one shared buffer, which the merge reuses."""
    sq, sk, d, dv = spec.sq, spec.sk, spec.d, spec.dv
    rows, nq, qb, bh = _row_blocks(spec, rows)
    threads = rows * split
    nk, sk1 = cdiv(sk, keys), minus1(sk)
    row = f"T.min({qb} * {rows} + r_, {minus1(sq)})"
    kv = split * keys * (d + dv)
    smem = max(kv, split * rows * (dv + 2))
    kload, vload = -(-split * keys * d // threads), -(-split * keys * dv // threads)
    tile = f"(jb * {split} + s_)"
    key = f"T.min({tile} * {keys} + j, {sk1})"
    score = steps(spec, "sc[j]", bh, row, key)
    return f'''
@T.prim_func
def main({signature(spec)}):
    T.func_attr({{"global_symbol": "main", "tirx.noalias": True}})
{preamble(spec)}    bx = T.launch_thread("blockIdx.x", {mul(spec.bh, nq)})
    tx = T.launch_thread("threadIdx.x", {threads})
    sm = T.decl_buffer(({smem},), "float32", scope="shared")
    ks = T.decl_buffer(({split}, {keys}, {d}), "float32", data=sm.data, scope="shared")
    vs = T.decl_buffer(({split}, {keys}, {dv}), "float32", data=sm.data, elem_offset={split * keys * d}, scope="shared")
    cb = T.decl_buffer(({split}, {rows}, {dv + 2}), "float32", data=sm.data, scope="shared")
    qr = T.decl_buffer(({d},), "float32", scope="local")
    acc = T.decl_buffer(({dv},), "float32", scope="local")
    sc = T.decl_buffer(({keys},), "float32", scope="local")
    r = T.decl_buffer((4,), "float32", scope="local")
    r_ = tx % {rows}
    s_ = tx // {rows}
    for c in T.unroll({d}):
        qr[c] = {index(spec, "q", bh, row, "c")}
    for e in T.unroll({dv}):
        acc[e] = T.float32(0)
    r[0] = {NEG}
    r[1] = T.float32(0)
    for jb in range({cdiv(nk, split)}):
        for u in range({kload}):
            if u * {threads} + tx < {split * keys * d}:
                ks[(u * {threads} + tx) // {keys * d}, (u * {threads} + tx) % {keys * d} // {d}, (u * {threads} + tx) % {d}] = {index(spec, "k", bh, f"T.min((jb * {split} + (u * {threads} + tx) // {keys * d}) * {keys} + (u * {threads} + tx) % {keys * d} // {d}, {sk1})", f"(u * {threads} + tx) % {d}")}
        for u in range({vload}):
            if u * {threads} + tx < {split * keys * dv}:
                vs[(u * {threads} + tx) // {keys * dv}, (u * {threads} + tx) % {keys * dv} // {dv}, (u * {threads} + tx) % {dv}] = {index(spec, "v", bh, f"T.min((jb * {split} + (u * {threads} + tx) // {keys * dv}) * {keys} + (u * {threads} + tx) % {keys * dv} // {dv}, {sk1})", f"(u * {threads} + tx) % {dv}")}
        T.tvm_storage_sync("shared")
        r[2] = r[0]
        for j in T.unroll({keys}):
            sc[j] = T.float32(0)
            for c in T.unroll({d}):
                sc[j] = sc[j] + qr[c] * ks[s_, j, c]
            sc[j] = T.if_then_else({tile} * {keys} + j < {sk}, {score}, {NEG})
            r[2] = T.max(r[2], sc[j])
        r[3] = T.exp(r[0] - r[2])
        r[1] = r[1] * r[3]
        for e in T.unroll({dv}):
            acc[e] = acc[e] * r[3]
        for j in T.unroll({keys}):
            sc[j] = T.if_then_else({tile} * {keys} + j < {sk}, T.exp(sc[j] - r[2]), T.float32(0))
            r[1] = r[1] + sc[j]
            for e in T.unroll({dv}):
                acc[e] = acc[e] + sc[j] * vs[s_, j, e]
        r[0] = r[2]
        T.tvm_storage_sync("shared")
{_merge_source(spec, bh, qb, rows, split)}'''


def _merge_source(spec, bh: str, qb: str, rows: int, split: int) -> str:
    """The split kernel's end (TVMScript lines after the key loop): each thread's partial state (m,
    l, acc) to shared memory, then the `split` states of a row merged (m = max m_s, l = sum l_s
    exp(m_s - m)), each thread writing its dv / split of the row's outputs."""
    dv, per = spec.dv, spec.dv // split
    return f'''    cb[s_, r_, 0] = r[0]
    cb[s_, r_, 1] = r[1]
    for e in T.unroll({dv}):
        cb[s_, r_, e + 2] = acc[e]
    T.tvm_storage_sync("shared")
    r[2] = {NEG}
    for g in T.unroll({split}):
        r[2] = T.max(r[2], cb[g, r_, 0])
    r[1] = T.float32(0)
    for g in T.unroll({split}):
        r[1] = r[1] + cb[g, r_, 1] * T.exp(cb[g, r_, 0] - r[2])
    if {qb} * {rows} + r_ < {spec.sq}:
        for e in T.unroll({per}):
            r[3] = T.float32(0)
            for g in T.unroll({split}):
                r[3] = r[3] + cb[g, r_, s_ * {per} + e + 2] * T.exp(cb[g, r_, 0] - r[2])
            {index(spec, "out", bh, f"{qb} * {rows} + r_", f"s_ * {per} + e")} = r[3] / r[1]
'''


def _split_fits(spec, rows: int, keys: int, split: int) -> bool:
    words = max(split * keys * (spec.d + spec.dv), split * rows * (spec.dv + 2))
    return split > 1 and spec.dv % split == 0 and words * 4 <= CUDA["attn_shared_bytes"]


class Attention(ScheduleRule):
    name = "cuda.Attention"

    def apply(self, func, target):
        spec = read_spec(func)
        if spec is None:
            return None
        if max(spec.d, spec.dv) > CUDA["attn_max_head_dim"]:
            return None  # a row's Q and accumulator would not fit a thread's registers
        rows, keys, split = CUDA["attn_split_rows"], CUDA["attn_split_key_tile"], CUDA["attn_key_split"]
        if _split_fits(spec, rows, keys, split):
            return kernel(split_kernel_source(spec, rows, keys, split), spec)
        keys = CUDA["attn_key_tile"]
        if keys * (spec.d + spec.dv) * 4 > CUDA["attn_shared_bytes"]:
            return None  # the tiles would not fit shared memory
        return kernel(kernel_source(spec, CUDA["attn_query_rows"], keys), spec)
