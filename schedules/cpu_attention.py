"""cpu.Attention: a fused attention group as one flash-attention kernel for llvm.

Takes a PrimFunc carrying `tvmfuse.attention` (passes/match_attention.py) and writes its kernel
from the spec, declining (None) for anything else:
  - parallel over (batch x head, block of `attn_rows` query rows);
  - for each block of `attn_keys` keys: Kᵀ block copied once into a [D, keys] tile, scores
    Q_rows · Kᵀ_tile accumulated in registers (rows unrolled, keys vectorized), the score steps
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

import tvm

from .attention import NEG, index, read_spec, signature, steps
from .rule import ScheduleRule
from .targets import CPU


def kernel_source(spec, rows: int, keys: int, out_chunk: int) -> str:
    sq, sk, d, dv = spec.sq, spec.sk, spec.d, spec.dv
    nq, nk = -(-sq // rows), -(-sk // keys)
    chunk = next((c for c in (out_chunk, out_chunk // 2, 8, 4, 1) if c and dv % c == 0), 1)
    bh, q0 = f"t // {nq}", f"t % {nq} * {rows}"
    qrow, key = f"T.min({q0} + i, {sq - 1})", f"T.min(jb * {keys} + j, {sk - 1})"
    score = steps(spec, "s[i, j]", bh, qrow, key)
    return f'''
@T.prim_func
def main({signature(spec)}):
    T.func_attr({{"global_symbol": "main", "tirx.noalias": True}})
    for t in T.parallel({spec.bh * nq}):
        m = T.decl_buffer(({rows},), "float32", scope="local")
        l = T.decl_buffer(({rows},), "float32", scope="local")
        r = T.decl_buffer((3,), "float32", scope="local")
        acc = T.decl_buffer(({rows}, {dv}), "float32", scope="local")
        s = T.decl_buffer(({rows}, {keys}), "float32", scope="local")
        kt = T.decl_buffer(({d}, {keys}), "float32", scope="local")
        for i in range({rows}):
            m[i] = {NEG}
            l[i] = T.float32(0)
            for e in T.vectorized({dv}):
                acc[i, e] = T.float32(0)
        for jb in range({nk}):
            for j, c in T.grid({keys}, {d}):
                kt[c, j] = {index(spec, "k", bh, key, "c")}
            for i in range({rows}):
                for j in T.vectorized({keys}):
                    s[i, j] = T.float32(0)
            for c in range({d}):
                for i in T.unroll({rows}):
                    for j in T.vectorized({keys}):
                        s[i, j] = s[i, j] + {index(spec, "q", bh, qrow, "c")} * kt[c, j]
            for i in range({rows}):
                for j in T.vectorized({keys}):
                    s[i, j] = T.if_then_else(jb * {keys} + j < {sk}, {score}, {NEG})
                r[0] = m[i]
                for j in range({keys}):
                    r[0] = T.max(r[0], s[i, j])
                r[1] = T.exp(m[i] - r[0])
                for j in T.vectorized({keys}):
                    s[i, j] = T.if_then_else(jb * {keys} + j < {sk}, T.exp(s[i, j] - r[0]), T.float32(0))
                r[2] = T.float32(0)
                for j in range({keys}):
                    r[2] = r[2] + s[i, j]
                l[i] = l[i] * r[1] + r[2]
                m[i] = r[0]
                for e in T.vectorized({dv}):
                    acc[i, e] = acc[i, e] * r[1]
            for eo in range({dv // chunk}):
                for j in range({keys}):
                    for i in T.unroll({rows}):
                        for ei in T.vectorized({chunk}):
                            acc[i, eo * {chunk} + ei] = acc[i, eo * {chunk} + ei] + s[i, j] * {index(spec, "v", bh, key, f"eo * {chunk} + ei")}
        for i in range({rows}):
            if {q0} + i < {sq}:
                for e in T.vectorized({dv}):
                    {index(spec, "out", bh, f"{q0} + i", "e")} = acc[i, e] / l[i]
'''


class Attention(ScheduleRule):
    name = "cpu.Attention"

    def apply(self, func, target):
        spec = read_spec(func)
        if spec is None:
            return None
        lanes = CPU["vector_bytes"] // 4
        src = kernel_source(spec, CPU["attn_rows"], CPU["attn_key_vectors"] * lanes,
                            CPU["attn_out_vectors"] * lanes)
        out = tvm.script.from_source(src)
        return out.with_attr("tvmfuse.flops", spec.flops()).with_attr("tvmfuse.attention", func.attrs["tvmfuse.attention"])
