"""Per-target schedule constants, one table per target kind. Nothing inline in the rules."""

CPU = {
    "vector_bytes": 64,  # AVX-512 register width; the llvm target's mcpu decides what is emitted
    "min_parallel_extent": 2,  # parallelise a loop only when it has at least this many iterations
    "max_vector_lanes": 16,
    "reduction_chunks": 64,  # a full (scalar) reduction is cut into this many parallel chunks
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
