"""`Workload`: one model to build, check against a reference and time. The one type behind the zoo
(tvmfuse.zoo.workloads: Relax graphs written op by op, numpy references), the real models
(tvmfuse.zoo.models: imported from PyTorch or ONNX, the framework's references) and model files
(`tvmfuse.load`). Everything downstream (bench, report, tuning, the GPU check, the CLI) reads it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..runtime.roofline import graph_flops


@dataclass(eq=False)
class Workload:
    name: str
    mod: object  # tvm.IRModule with a Relax "main"
    input_specs: list  # [(name, shape, dtype)] of main's inputs (shape None where symbolic)
    reference_fn: Callable | None = None  # inputs -> expected output(s); None: no reference
    size: str = "-"  # the shape set it was made at (the zoo's and the models' "small", "bench", ...)
    rtol: float = 1e-4
    atol: float = 1e-5
    arrays: list | None = None  # fixed inputs (a real model's); None: drawn from input_specs
    seed: int = 0  # the draw's seed
    positive: tuple = ()  # inputs drawn positive (batch-norm variances)
    meta: dict = field(default_factory=dict)  # shape facts a baseline needs (attention: heads)
    flops: int | None = None  # matmul/conv FLOPs (x 2 multiply-adds); None or 0: bound by memory
    reduction_heavy: bool = False  # its time goes to row reductions (softmax, norms)
    zoo: bool = False  # a zoo graph (tvmfuse.zoo.workloads): no framework behind it, numpy peers
    eager: Callable | None = None  # a real model's framework forward on numpy inputs (timing)
    module: object = None  # the torch.nn.Module it came from (the peers' torch.compile / ONNX export)
    source: str = ""  # where it came from ("torch.export", "relay text", ...)
    notes: list = field(default_factory=list)

    @classmethod
    def imported(cls, name, mod, arrays, reference_fn=None, **kw) -> "Workload":
        """A model imported by a frontend, with its inputs: the specs are the arrays' shapes under
        main's parameter names, and its FLOPs are counted from the graph (roofline.graph_flops)."""
        arrays = [np.asarray(a) for a in arrays]
        specs = [(p.name, tuple(a.shape), str(a.dtype)) for p, a in zip(mod["main"].params, arrays)]
        kw.setdefault("flops", graph_flops(mod))
        return cls(name, mod, specs, reference_fn, arrays=arrays, **kw)

    @property
    def memory_bound(self) -> bool:
        """Bound by memory traffic: no matmul/conv FLOPs to speak of (the roofline is bytes)."""
        return not self.flops

    def inputs(self) -> list[np.ndarray]:
        """Deterministic inputs: the same arrays on every call and every machine (fresh copies)."""
        if self.arrays is not None:
            return [np.array(a, copy=True) for a in self.arrays]
        rng = np.random.default_rng(self.seed)
        out = []
        for name, shape, dtype in self.input_specs:
            a = rng.standard_normal(shape).astype(dtype)
            if name in self.positive:
                a = np.abs(a) + 0.5
            out.append(a)
        return out

    def reference(self, *inputs):
        """The expected output(s) for `inputs`; None when it has no reference (the unfused build is)."""
        return None if self.reference_fn is None else self.reference_fn(*inputs)
