"""Per-target schedule constants, one table per target kind. Nothing inline in the rules.

The CPU table is derived from the llvm target the rules schedule for (its `mcpu`, so the host's
CPU for "llvm"): vector width and register count from the ISA, the matmul micro-kernel sized to
the registers (the entries and their derivation: cpu/constants.py). `CPU` reads the table of the target being scheduled (`for_target`, which
`apply_rules` enters), the host's outside of it; it is per thread and per build. Overrides of
its entries (TVMFUSE_CPU_<KEY>, `tvmfuse.config.override(cpu=...)`) are owned, parsed and
validated by tvmfuse/config.py; `cpu_table` applies those in force each time it is called.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Mapping
from functools import lru_cache

from .cpu.constants import COMMON, ISA, SCHEMA as CPU_SCHEMA, derived  # noqa: F401 (CPU_SCHEMA: re-exported)


def _has(feature: str, target) -> bool:
    """Whether llvm knows `feature` on `target` (False for a feature of another arch). No error is
    caught here: a table derived from a failed query would be silently wrong."""
    from tvm.target import codegen

    return bool(codegen.target_has_features(feature, target))


@lru_cache(maxsize=None)
def _isa_table(mcpu: str, mattr: tuple) -> dict:
    """The table the ISA of (mcpu, mattr) gives, before any override (cached: a pure function)."""
    import tvm

    spec = {"kind": "llvm", "mcpu": mcpu}
    if mattr:
        spec["mattr"] = list(mattr)
    target = tvm.target.Target(spec)
    vbytes, regs = next(((b, r) for f, b, r in ISA if _has(f, target)), (16, 16))
    return {**COMMON, **derived(vbytes, regs, _has("sse2", target))}


def cpu_table(target=None) -> dict:
    """The CPU constants for `target` (a tvm Target; None: the host): the ISA's table with the
    overrides in force applied (tvmfuse/config.py owns them: TVMFUSE_CPU_<KEY>, override(cpu=...)),
    read at each call. A new dict each call: change entries with config.override, not in place."""
    from tvm.target import codegen

    from tvmfuse.config import cpu_overrides  # tvmfuse sits above schedules: read at call time

    attrs = target.attrs if target is not None and target.kind.name == "llvm" else {}
    mcpu = str(attrs.get("mcpu") or codegen.llvm_get_system_cpu())
    return {**_isa_table(mcpu, tuple(str(a) for a in attrs.get("mattr") or ())), **cpu_overrides()}


def target_cores() -> int:
    """The cores the kernels of the target being scheduled run on: its num-cores (every target
    tvmfuse.target.resolve makes has it), else tvmfuse.target.num_cores() (the one count of the host)."""
    t = _TARGET.get()
    n = t.attrs.get("num-cores") if t is not None and t.kind.name == "llvm" else None
    if n:
        return int(n)
    from tvmfuse.target import num_cores as host_cores

    return host_cores()


_TARGET: contextvars.ContextVar = contextvars.ContextVar("tvmfuse_target", default=None)
_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("tvmfuse_cpu_table", default=None)


@contextlib.contextmanager
def for_target(target):
    """Within: `CPU` holds the constants of `target` (llvm; any other kind keeps the host's)."""
    token = _ACTIVE.set(cpu_table(target) if target is not None and target.kind.name == "llvm" else None)
    token_t = _TARGET.set(target)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
        _TARGET.reset(token_t)


class _ActiveTable(Mapping):
    """The CPU table of the target being scheduled (see `for_target`), else the host's."""

    def _table(self) -> dict:
        return _ACTIVE.get() or cpu_table()

    def __getitem__(self, key):
        return self._table()[key]

    def __iter__(self):
        return iter(self._table())

    def __len__(self):
        return len(self._table())


CPU = _ActiveTable()

CUDA = {
    # in order; RowReduction is tvmfuse's, the others are dlight's
    "rules": ("TensorCoreMatmul", "Matmul", "GEMV", "RowReduction", "Reduction", "GeneralReduction", "Fallback"),
    # tensor-core matmuls (cuda/tensor_core.py): a thread block is tc_warps x tc_warps warps, each
    # warp tc_frags x tc_frags 16x16 accumulator fragments, a K step of tc_k_frags x 16; copies to
    # and from shared memory tc_vector elements per thread
    "tc_warps": 4,
    "tc_frags": 2,
    "tc_k_frags": 4,
    "tc_vector": 4,
    # dlight's float32 (SIMT) Matmul: 8 x 8 threads of 4 x 4 outputs, a 32 x 32 tile; its shared-memory
    # fetch of 32 rows x 8 K is one vector of 4 per thread, a warp's load whole rows (cuda.CoalescedMatmul)
    "simt_matmul": {"block_size_x": 8, "block_size_y": 8, "vthread_x": 1, "vthread_y": 1, "micro_size_x": 4,
                    "micro_size_y": 4, "micro_size_k": 8, "vector_size": 4, "unroll": 256, "use_shared": True,
                    "storage_align": True, "inner_x": False},
    "warp": 32,
    "row_threads": 256,  # threads per row of a row-reduction chain (a thread block per row)
    "stray_threads": 256,  # threads per block for a stage a rule left without threads (cuda.bind_stray_loops)
    "full_reduction_threads": 1024,  # one thread block for a group of full (0-d) reductions
    "attn_query_rows": 64,  # flash attention (cuda/attention.py): threads (query rows) per block ...
    "attn_key_tile": 32,  # ... keys per shared-memory K/V tile
    "attn_shared_bytes": 48 * 1024,  # ... static shared memory a block may take (else the rule declines)
    "attn_max_head_dim": 128,  # ... head dims held in a thread's registers (Q row and accumulator)
    # the keys of a query row split over this many threads (cuda_attention.split_kernel_source;
    # 1: the thread-per-row kernel above), with these rows per block and keys per K/V tile
    "attn_key_split": 4,
    "attn_split_rows": 32,
    "attn_split_key_tile": 16,
}
