"""The CPU schedule constants: the entries every ISA shares, and those its vector registers give.

Pure data, no imports: `schedules/targets.py` builds the table of an llvm target from these
(`cpu_table`), and tvmfuse/config.py checks overrides of its entries against `SCHEMA`.
"""
from __future__ import annotations

COMMON = {
    "max_vector_lanes": 16,
    "min_parallel_extent": 2,  # parallelise a loop only when it has at least this many iterations
    # a kernel whose stores (every loop counted, lanes and reduction updates included) number under
    # this many per runtime thread runs serially: a parallel launch wakes and joins the pool's
    # workers, which costs more than splitting such work saves (cpu/small_kernels.py). znver4, 2
    # threads, y = 2x + 1 over n floats (scripts/parallel_launch.py, results/cpu/parallel-launch-*):
    # back to back, parallel wins from 16384 stores (1.6 against 2.0 us); after 2 ms idle the
    # workers sleep and a parallel call costs 27-53 us, serial winning up to 262144 (32 us). A
    # compiled graph's first kernel after Python (a training step's) pays the idle cost.
    "min_parallel_work": 16384,
    "vector_math": True,  # float32 exp/erf as TVM's fast_exp/fast_erf (they vectorize; libm expf/erff do not)
    "reduction_chunks": 64,  # a full (scalar) reduction is cut into this many parallel chunks ...
    "reduction_accumulators": 4,  # ... reduced into this many vector registers each (one would chain every add)
    "reduction_block": 2048,  # ... swept block by block (8 KiB of float32: every sibling re-reads it from L1)
    # a column reduction (a bias gradient: sum over rows) runs its columns in parallel stripes when
    # every core gets at least `column_stripe_min` vectors of them (a stripe at most
    # `column_stripe_max` vectors: its accumulators stay in L1); narrower, its rows are cut into
    # cores x `column_row_chunks` parallel chunks of partial rows
    "column_stripe_min": 2,
    "column_stripe_max": 32,
    "column_row_chunks": 2,
    "row_accumulators": 2,  # a row reduction's partials: vector registers (more cost a longer per-row final sum)
    "row_partials_tree": 16,  # ... and its partials summed to this many in vector form before the serial sum (0: off)
    "transpose_tile": 16,  # a transposing copy is done in square tiles of this side
    "mm_col_vectors": 2,  # micro-kernel width NR in vector registers: MR x NR/lanes accumulators
    "conv_out_channels": 8,  # conv2d tile: output channels (a broadcast weight each) ...
    "conv_rows": 2,  # ... x output rows ...
    "conv_min_vector": 4,  # ... x a vector of output columns at least this wide
    # a conv with at most this many reduction steps (in channels x kernel) writes its NCHW rows
    # from a column tile rather than transposing a channel tile (cpu_conv._prefer_columns). znver4,
    # interleaved A/B: 16->96 at 112x112 0.44 -> 0.25 ms, 24->144 at 56x56 0.17 -> 0.13; 64->64
    # at 56x56 within 8%; 256->64 18% slower as columns
    "conv_column_max_reduction": 32,
    "conv_oc_vectors": 2,  # channel-vector conv tile: vector registers of output channels ...
    # ... and at most this many accumulators in all: LLVM keeps a step's column broadcasts live
    # beside them, so 32 registers do not hold 2 x 14 (znver4: 47 vectors spilled per 3x3 conv,
    # 44-127 GFLOP/s); 2 x 8 spills none (about 200 GFLOP/s on the same shapes)
    "conv_max_accumulators": 16,
    # a 1x1 conv whose rows fill less than this % of the conv tile's columns runs as a matmul over
    # its pixels (passes/conv1x1_matmul.py; AVX2: 7-wide rows fill 58%, 14-wide 78%)
    "conv1x1_matmul_fill": 70,
    # Winograd F(m x m, 3x3) for 3x3 stride-1 convs (passes/winograd.py), on
    # maps at least this wide, with the tile m (of these) that does the fewest multiply-adds, whose
    # transformed weight ((m+2)²/9 of W) is at most this many MiB
    "winograd": 1,
    "winograd_min_map": 7,
    "winograd_tiles": (4, 2),
    "winograd_max_weight_mib": 16,
    # ... and for a weight that is an input (transformed on every call): at least this many FLOPs
    # saved per byte that transform and the packing of its result move. A saved multiply-add costs
    # about 4 ps at 200+ GFLOP/s and a byte from memory 25-30 ps at 35-40 GB/s (2 cores): 16 is
    # twice that break-even (zoo's 64ch 56x56: 90, ResNet's 128ch 28x28: 23, 256ch 14x14: 5-8)
    "winograd_runtime_flops_per_byte": 16,
    # streaming (non-temporal) stores, x86 (passes/streaming_stores.py): a kernel whose working
    # set is at least this % of the last-level cache streams each output of at least this %
    # (an output that is a small part of a large working set, a gather's rows, stays cached)
    "stream_working_set_pct": 100,
    "stream_output_pct": 25,
    "pool_max_window": 64,  # cpu.Pool: window elements unrolled per output vector (3x3, 7x7)
    "attn_row_vectors": 2,  # flash attention (cpu/attention.py): query rows as vector lanes, per score tile
    "attn_row_groups": 4,  # ... tiles of query rows per task (its Qᵀ copy is shared by all keys);
    # fewer where the tasks would not keep every core busy (cpu_attention: >= 4 tasks per core)
    "attn_keys": 32,  # ... keys per online-softmax step (one rescale of the accumulator each)
    "attn_out_vectors": 2,  # ... P·V: accumulator chunk per query row, in vector registers
    # stages calling these are not inlined into several consumers (recompute costs more than a re-read)
    "costly_intrinsics": ("exp", "log", "tanh", "erf", "sigmoid", "pow", "sqrt", "rsqrt"),
}

# What the ISA gives: vector register width in bytes and the number of vector registers.
ISA = (  # (llvm feature, vector_bytes, vector_registers), first match wins
    ("avx512f", 64, 32),
    ("avx2", 32, 16),
    ("avx", 32, 16),
    ("neon", 16, 32),
    ("sse2", 16, 16),
)


def derived(vbytes: int, regs: int, x86: bool) -> dict:
    """The entries that follow from the ISA: vector width, registers, x86 or not."""
    return dict(
        vector_bytes=vbytes,  # the ISA's vector register width
        # x86: a kernel whose working set is over the last-level cache writes its outputs with
        # streaming (non-temporal) stores (passes/streaming_stores.py)
        streaming_stores=int(x86),
        # the vector exp of x - rowmax(x) without the overflow edge (cpu/vector_math.py): with 32
        # registers a softmax kernel is 20-30% faster; with AVX2's 16, LLVM unrolls the shorter
        # loop 4x and spills 21 vectors, 10-17% slower (AVX2 code on znver4): off there
        exp_row_max_shortcut=int(regs >= 32),
        vector_registers=regs,
        # micro-kernel height MR: MR x mm_col_vectors accumulators, plus the B vectors and the A
        # broadcast, fit the registers (AVX-512: 8 x 2 of 32; AVX2: 4 x 2 of 16, measured best)
        mm_rows=8 if regs >= 32 else 4,
        # ... or as few as this where that pads at least 5% of M fewer rows (cpu_matmul.row_tile)
        mm_rows_min=6 if regs >= 32 else 3,
        # ... x this many output columns: an accumulator per (column, channel vector), plus the
        # weight vectors and the input broadcast, fit the registers, up to conv_max_accumulators
        # (AVX2 2 x 6, AVX-512 2 x 8). Measured on AVX2 over ResNet-50's convs: 57 GFLOP/s with
        # 1 x 14, 84 with 2 x 6.
        conv_columns=min((regs - COMMON["conv_oc_vectors"] - 1) // COMMON["conv_oc_vectors"],
                         COMMON["conv_max_accumulators"] // COMMON["conv_oc_vectors"]),
        # flash attention: attn_key_unroll keys x attn_row_vectors score accumulators in registers
        # for QK, attn_pv_rows rows x attn_out_vectors accumulators for P·V (like the matmul's MR)
        attn_key_unroll=8 if regs >= 32 else 4,
        attn_pv_rows=8 if regs >= 32 else 4,
    )


def _kind(value):
    if isinstance(value, (bool, int)):
        return type(value)
    return "ints" if all(isinstance(v, int) for v in value) else "strs"


# Every key of the CPU table and the kind of value it takes (bool, int, "ints" or "strs": a tuple):
# what tvmfuse/config.py validates TVMFUSE_CPU_<KEY> and override(cpu=...) against.
SCHEMA = {k: _kind(v) for k, v in {**COMMON, **derived(16, 16, False)}.items()}
