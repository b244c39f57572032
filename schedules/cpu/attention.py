"""cpu.Attention: a fused attention group as one flash-attention kernel for llvm.

Takes a PrimFunc carrying `tvmfuse.attention` (fusion/match_attention.py) and writes its kernel
from the spec, declining (None) for anything else:
  - parallel over (batch x head, block of `attn_row_groups` x `attn_rows` query rows);
  - for each block of `attn_key_vectors` vectors of keys: Kᵀ block copied once into a [D, keys]
    tile (shared by the block's rows), scores of `attn_rows` rows at a time accumulated in
    registers (rows unrolled, keys vectorized), the score steps
    (scale, mask, where) applied, then the online softmax: a running max and sum per query row,
    the accumulator rescaled by exp(m_old - m_new) (vectorized exp, lower_math);
  - P · V accumulated over Dv in chunks of `attn_out_vectors` vector registers per row;
  - the output divided by the row sums once, at the end.
Ragged extents (keys or rows not a multiple of the blocks, as in 197 or 1000 tokens) are handled by
clamping the loads and masking the padded keys to probability 0; padded rows are not written.
Global traffic is Q, K, V and the mask read once per row block and O written once: O(N·d), the
[Sq, Sk] scores never leave the tile. The math differs from the unfused graph only by
floating-point reassociation (the softmax sum and P·V accumulate block by block, rescaled).
"""
from __future__ import annotations

from ..attention import NEG, cdiv, index, kernel, minus1, mul, preamble, read_spec, signature, steps
from ..rule import ScheduleRule
from ..targets import CPU, target_cores

TASKS_PER_CORE = 4  # parallel tasks per core the query blocking keeps, where the sequence allows
from .vector_math import exp_nonpositive


def kernel_source(spec, row_vector: int, row_groups: int, keys: int, key_unroll: int, pv_rows: int,
                  out_chunk: int) -> str:
    """TVMScript of the kernel. Scores are kept keys-major, st[key, row], so the rows are the vector
    lanes: QK accumulates `key_unroll` keys x `row_vector` rows in registers from a Qᵀ tile made once
    per task (no per-block transpose of K: each K row is read as broadcast scalars), and the running
    max, the exp and the running sum of the online softmax are vertical vector operations."""
    sq, sk, d, dv = spec.sq, spec.sk, spec.d, spec.dv
    row_groups, keys = _blocks(spec, row_vector, row_groups, keys, key_unroll)
    block = row_vector * row_groups
    nq, nk = cdiv(sq, block), cdiv(sk, keys)
    sq1, sk1 = minus1(sq), minus1(sk)
    chunk = next((c for c in (out_chunk, out_chunk // 2, 8, 4, 1) if c and dv % c == 0), 1)
    pv_rows = pv_rows if block % pv_rows == 0 else 1
    if isinstance(spec.bh, int):  # heads innermost: every index divides by constants only
        bh, q0 = f"t % {spec.bh}", f"t // {spec.bh} * {block}"
    else:  # a symbolic batch: query blocks innermost (a symbolic sequence as well divides by nq)
        bh, q0 = f"t // {nq}", f"t % {nq} * {block}"
    key = f"T.min(jb * {keys} + j, {sk1})"
    kk = f"T.min(jb * {keys} + jg * {key_unroll} + jj, {sk1})"
    score = steps(spec, "st[j, i]", bh, f"T.min({q0} + i, {sq1})", key)
    return f'''
@T.prim_func
def main({signature(spec)}):
    T.func_attr({{"global_symbol": "main", "tirx.noalias": True}})
{preamble(spec)}    for t in T.parallel({mul(spec.bh, nq)}):
        m = T.decl_buffer(({block},), "float32", scope="local")
        l = T.decl_buffer(({block},), "float32", scope="local")
        mn = T.decl_buffer(({block},), "float32", scope="local")
        cr = T.decl_buffer(({block},), "float32", scope="local")
        acc = T.decl_buffer(({block}, {dv}), "float32", scope="local")
        st = T.decl_buffer(({keys}, {block}), "float32", scope="local")
        qt = T.decl_buffer(({d}, {block}), "float32", scope="local")
        sa = T.decl_buffer(({key_unroll}, {row_vector}), "float32", scope="local")
        pa = T.decl_buffer(({pv_rows}, {chunk}), "float32", scope="local")
        for i, c in T.grid({block}, {d}):
            qt[c, i] = {index(spec, "q", bh, f"T.min({q0} + i, {sq1})", "c")}
        for i in T.vectorized({block}):
            m[i] = {NEG}
            l[i] = T.float32(0)
        for i, e in T.grid({block}, {dv}):
            acc[i, e] = T.float32(0)
        for jb in range({nk}):
            for g in range({row_groups}):
                for jg in range({keys // key_unroll}):
                    for jj in T.unroll({key_unroll}):
                        for i in T.vectorized({row_vector}):
                            sa[jj, i] = T.float32(0)
                    for c in range({d}):
                        for jj in T.unroll({key_unroll}):
                            for i in T.vectorized({row_vector}):
                                sa[jj, i] = sa[jj, i] + {index(spec, "k", bh, kk, "c")} * qt[c, g * {row_vector} + i]
                    for jj in T.unroll({key_unroll}):
                        for i in T.vectorized({row_vector}):
                            st[jg * {key_unroll} + jj, g * {row_vector} + i] = sa[jj, i]
            for j in range({keys}):
                for i in T.vectorized({block}):
                    st[j, i] = T.if_then_else(jb * {keys} + j < {sk}, {score}, {NEG})
            for i in T.vectorized({block}):
                mn[i] = m[i]
            for j in range({keys}):
                for i in T.vectorized({block}):
                    mn[i] = T.max(mn[i], st[j, i])
            for i in T.vectorized({block}):
                cr[i] = T.exp(m[i] - mn[i])
                m[i] = mn[i]
                l[i] = l[i] * cr[i]
            for j in range({keys}):
                for i in T.vectorized({block}):
                    st[j, i] = T.if_then_else(jb * {keys} + j < {sk}, T.exp(st[j, i] - mn[i]), T.float32(0))
                    l[i] = l[i] + st[j, i]
{_pv_source(spec, bh, key, block, keys, chunk, pv_rows)}        for i in range({block}):
            if {q0} + i < {sq}:
                for e in T.vectorized({dv}):
                    {index(spec, "out", bh, f"{q0} + i", "e")} = acc[i, e] / l[i]
'''


def _blocks(spec, row_vector: int, row_groups: int, keys: int, key_unroll: int) -> tuple:
    """(row groups, keys per block): short queries (decode) take one group, halved further until
    every core has `TASKS_PER_CORE` tasks (12 heads on 16 cores); keys a multiple of `key_unroll`;
    then the blocks that pad least (least_padding)."""
    sq = spec.sq
    if isinstance(sq, int):  # short queries (decode): one group
        row_groups = max(1, min(row_groups, -(-sq // row_vector)))
        while row_groups > 1 and isinstance(spec.bh, int) and \
                spec.bh * -(-sq // (row_vector * row_groups)) < TASKS_PER_CORE * target_cores():
            row_groups //= 2  # smaller query blocks: enough tasks for every core (12 heads on 16 cores)
    keys = max(key_unroll, keys // key_unroll * key_unroll)
    return least_padding(sq, row_vector, row_groups, spec.sk, key_unroll, keys)


def _pv_source(spec, bh: str, key: str, block: int, keys: int, chunk: int, pv_rows: int) -> str:
    """The kernel's P·V step (TVMScript lines inside the key-block loop): `pv_rows` rows x a
    `chunk` of the output columns in registers, the accumulator rescaled by the block's
    correction cr as it is loaded, then each key's probabilities times its V row added."""
    return f'''            for g in range({block // pv_rows}):
                for eo in range({spec.dv // chunk}):
                    for i in T.unroll({pv_rows}):
                        for ei in T.vectorized({chunk}):
                            pa[i, ei] = acc[g * {pv_rows} + i, eo * {chunk} + ei] * cr[g * {pv_rows} + i]
                    for j in range({keys}):
                        for i in T.unroll({pv_rows}):
                            for ei in T.vectorized({chunk}):
                                pa[i, ei] = pa[i, ei] + st[j, g * {pv_rows} + i] * {index(spec, "v", bh, key, f"eo * {chunk} + ei")}
                    for i in T.unroll({pv_rows}):
                        for ei in T.vectorized({chunk}):
                            acc[g * {pv_rows} + i, eo * {chunk} + ei] = pa[i, ei]
'''


def least_padding(sq, row_vector: int, row_groups: int, sk, key_unroll: int, keys: int) -> tuple:
    """(row groups, keys per block) for static extents that are not multiples of the blocks (197
    ViT tokens, 300, 1000): the blocks that pad the fewest rows and keys, so a ragged sequence does
    not pay for up to a whole block of padded work per head.

    Rows: `row_groups` row tiles, halved down to 1 (ties: the larger block, fewer Qᵀ copies; 3
    tiles measured slower than 2 or 1 at 77 and 192 tokens). Keys: `keys`, or one `key_unroll`
    more or fewer where that pads at least 5% fewer keys (smaller blocks cost a rescale each,
    larger ones outgrow L1: at 1000 tokens 40-key blocks, which pad none, ran 5% slower than
    32-key blocks, which pad 24). znver4, 12 heads x 64, interleaved: 197 tokens 1.40 -> 0.79 ms
    (32-row blocks, 40 keys), 300 tokens 3.15 -> 1.78 ms (64-row blocks), 77 tokens 0.29 -> 0.15
    ms; unchanged where the table's blocks divide the sequence (128, 512, 2048). Symbolic extents
    keep the table's."""
    if isinstance(sq, int):
        groups = [row_groups >> n for n in range(row_groups.bit_length()) if row_groups >> n]
        row_groups = min(groups, key=lambda g: -(-sq // (row_vector * g)) * row_vector * g)
    if isinstance(sk, int):
        padded = lambda k: -(-sk // k) * k
        best = min((keys + key_unroll, keys - key_unroll), key=padded)
        if best >= key_unroll and padded(best) <= 0.95 * padded(keys):
            keys = best
    return row_groups, keys


class Attention(ScheduleRule):
    name = "cpu.Attention"

    def apply(self, func, target):
        spec = read_spec(func)
        if spec is None:
            return None
        lanes = CPU["vector_bytes"] // 4
        src = kernel_source(spec, CPU["attn_row_vectors"] * lanes, CPU["attn_row_groups"], CPU["attn_keys"],
                            CPU["attn_key_unroll"], CPU["attn_pv_rows"], CPU["attn_out_vectors"] * lanes)
        out = kernel(src, spec)
        # every exp here is of x - (a running max) <= 0: the fast exp without its overflow edge
        return exp_nonpositive(out) if CPU["vector_math"] else out
