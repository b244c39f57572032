"""Per-target schedule constants, one table per target kind. Nothing inline in the rules."""

CPU = {
    "vector_bytes": 64,  # AVX-512 register width; the llvm target's mcpu decides what is emitted
    "min_parallel_extent": 2,  # parallelise a loop only when it has at least this many iterations
    "max_vector_lanes": 16,
    "vector_math": True,  # float32 exp/erf as TVM's fast_exp/fast_erf (they vectorize; libm expf/erff do not)
    "reduction_chunks": 64,  # a full (scalar) reduction is cut into this many parallel chunks ...
    "reduction_accumulators": 4,  # ... reduced into this many vector registers each (one would chain every add)
    "reduction_block": 2048,  # ... swept block by block (8 KiB of float32: every sibling re-reads it from L1)
    "row_accumulators": 2,  # a row reduction's partials: vector registers (more cost a longer per-row final sum)
    "row_partials_tree": 16,  # ... and its partials summed to this many in vector form before the serial sum (0: off)
    "transpose_tile": 16,  # a transposing copy is done in square tiles of this side
    "mm_rows": 8,  # matmul micro-kernel height MR (rows of A broadcast per k)
    "mm_col_vectors": 2,  # micro-kernel width NR in vector registers: MR x NR/lanes accumulators
    "conv_out_channels": 8,  # conv2d tile: output channels (a broadcast weight each) ...
    "conv_rows": 2,  # ... x output rows ...
    "conv_min_vector": 4,  # ... x a vector of output columns at least this wide
    "conv_columns": 14,  # channel-vector conv tile: output columns (one accumulator register each)
    # stages calling these are not inlined into several consumers (recompute costs more than a re-read)
    "costly_intrinsics": ("exp", "log", "tanh", "erf", "sigmoid", "pow", "sqrt", "rsqrt"),
}

CUDA = {
    # in order; RowReduction is tvmfuse's, the others are dlight's
    "rules": ("Matmul", "GEMV", "RowReduction", "Reduction", "GeneralReduction", "Fallback"),
    "warp": 32,
    "row_threads": 256,  # threads per row of a row-reduction chain (a thread block per row)
    "full_reduction_threads": 1024,  # one thread block for a group of full (0-d) reductions
}
