"""Default CUDA schedules: TVM's dlight GPU rules, in the order of the CUDA table, Fallback last."""
from __future__ import annotations

from tvm.s_tir import dlight as dl

from .targets import CUDA


def rules():
    return [getattr(dl.gpu, name)() for name in CUDA["rules"]]
