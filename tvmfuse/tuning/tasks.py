"""The pipeline client of tuning: the fused module whose PrimFuncs are the tuning tasks.

Contract
- `fused_module(mod, target, fusion)` runs the pipeline (pipeline.py, the phases `tvmfuse.build`
  runs, with the options a build of the same arguments has: `Options.for_target`) through
  "mark_constants", the module its "apply_tuning" phase queries, so the PrimFuncs are exactly the
  ones the build will look up in the database.
- `extract`, `Task`, `tuning_form`, `normalize`: the pure TIR side, in tir_form.py.
"""
from __future__ import annotations

import tvm

from .. import pipeline
from .tir_form import Task, extract, normalize, own_attrs, tuning_form, without_own_attrs  # noqa: F401


def fused_module(mod: tvm.IRModule, target: tvm.target.Target, fusion: str, knobs: dict | None = None,
                 buckets: dict | None = None, dtype: str | None = None):
    """`buckets` and `dtype` as for `tvmfuse.build`: each bucket's static kernels become tasks of
    their own, so their records are kept per bucket; a half build's kernels are its own tasks."""
    if buckets:
        from ..passes.shape_buckets import add_buckets

        mod = add_buckets(mod, buckets)
    opts = pipeline.Options.for_target(target, fusion, dtype=dtype, **(knobs or {}))
    with opts.target, tvm.transform.PassContext(opt_level=3):
        return pipeline.run(mod, opts, until="mark_constants").mod
