"""Per-target schedule constants, one table per target kind. Nothing inline in the rules."""

CPU = {
    "vector_bytes": 64,  # AVX-512 register width; the llvm target's mcpu decides what is emitted
    "min_parallel_extent": 2,  # parallelise a loop only when it has at least this many iterations
    "max_vector_lanes": 16,
    # stages calling these are not inlined into several consumers (recompute costs more than a re-read)
    "costly_intrinsics": ("exp", "log", "tanh", "erf", "sigmoid", "pow", "sqrt", "rsqrt"),
}

CUDA = {
    "rules": ("Matmul", "GEMV", "Reduction", "GeneralReduction", "Fallback"),  # dlight, in order
}
