"""`training_workload(w, optimizer=...)`: one training step of a workload, as a Workload.

The step is `train_step(w.mod, n, loss=MSELoss(reduction="mean"), optimizer=...)` (relax_train.py)
with `n` the workload's trainable parameters: main's last `n` inputs, from `w.meta["trainable"]` or
the `num_params` argument. Its inputs are the workload's inputs, a fixed regression target of the
output's shape (seeded) and the optimizer's initial state, so everything that measures a Workload
(tvmfuse.compare, scripts/tune.py --train, the report) measures a training step: launches, bytes
moved, peak memory and latency of forward, backward and update together. It has no numpy reference:
the unfused build is the reference, as for any model without one.
"""
from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..zoo.workload import Workload
from .relax_train import train_step

OPTIMIZERS = ("sgd", "momentum", "adam")


def make_optimizer(name: str, lr: float = 1e-2):
    """A relax.training optimizer by name (sgd, momentum with 0.9, adam)."""
    from tvm.relax.training.optimizer import SGD, Adam, MomentumSGD

    makers = {"sgd": lambda: SGD(lr), "momentum": lambda: MomentumSGD(lr, 0.9), "adam": lambda: Adam(lr)}
    if name not in makers:
        raise InputError(f"unknown optimizer {name!r}; use one of {', '.join(OPTIMIZERS)}")
    return makers[name]()


def trainable(w: Workload) -> int | None:
    """How many of main's last inputs `w` trains (its meta's "trainable"), None when it says not."""
    return w.meta.get("trainable")


def training_workload(w: Workload, optimizer: str = "sgd", num_params: int | None = None,
                      lr: float = 1e-2) -> Workload:
    """The training step of `w` (see the module docstring)."""
    from tvm.relax.training.loss import MSELoss

    n = num_params or trainable(w)
    if not n:
        raise InputError(f"{w.name}: which inputs are its trainable parameters is not known; pass num_params "
                         f"(scripts/tune.py --train-params N: main's last N inputs are trained)")
    step = train_step(w.mod, n, loss=MSELoss(reduction="mean"), optimizer=make_optimizer(optimizer, lr))
    arrays = w.inputs()
    out = w.reference(*arrays)
    if out is None:
        out_shape = [int(d) for d in w.mod["main"].ret_ty.shape]
    else:
        out_shape = np.asarray(out).shape
    target = np.random.default_rng(w.seed + 1).standard_normal(out_shape).astype("float32")
    inputs = arrays + [target] + [np.array(s, copy=True) for s in step.state]
    name = f"{w.name} train[{optimizer}]"
    return Workload.imported(name, step.mod, inputs, None, size=w.size, rtol=max(w.rtol, 1e-4),
                             atol=max(w.atol, 1e-5), source="train_step", meta={"trainable": n})
