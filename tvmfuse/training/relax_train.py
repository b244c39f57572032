"""`train_step(mod, num_params, loss=..., optimizer=...)`: one training step of a Relax model as
one Relax function, built by tvmfuse's pipeline.

Takes an IRModule whose `main(inputs..., params...)` returns one tensor (the last `num_params`
parameters are the trained ones). TVM's `relax.training.SetupTrainer` appends the loss
(`relax.training.loss`, e.g. MSELoss), differentiates it (`relax.transform.Gradient`) and adds the
optimizer's update (`relax.training.optimizer`: SGD, MomentumSGD, Adam); here its functions are
joined into one `main` and inlined, so the forward, the backward and the update are one dataflow
graph that tvmfuse plans and fuses as a whole:

    main(inputs..., params..., targets, *optim_state) -> (loss, *new params, *new optim_state)

`TrainStep` carries the module, the optimizer's initial state and the order of everything; its
`build(...)` is tvmfuse.build of that module, and `step(compiled, inputs, params, targets)` runs one
step, keeping the optimizer state. Gradients TVM 0.27 has no rule for (gelu, rsqrt, square) are
registered from gradients.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from ..errors import InputError
from ..relax_utils import GRAPH_LOCK
from . import gradients


@dataclass
class TrainStep:
    """A training step as one Relax module (see the module docstring)."""
    mod: tvm.IRModule
    num_inputs: int
    num_params: int
    state: list = field(default_factory=list)  # the optimizer state, numpy arrays, updated by step()

    def build(self, target="llvm", fusion: str = "tvmfuse", **kw):
        from ..build import build

        return build(self.mod, target, fusion, **kw)

    def step(self, compiled, inputs, params, targets):
        """One step: (loss, new params); the optimizer state advances."""
        out = compiled(*inputs, *params, targets, *self.state)
        loss, new_params, new_state = out[0], list(out[1:1 + self.num_params]), list(out[1 + self.num_params:])
        self.state = new_state
        return float(np.asarray(loss)), new_params


def _trainer(mod, num_params, loss, optimizer):
    main = mod["main"]
    if not isinstance(main.ret_ty, relax.TensorType):
        raise InputError(f"train_step: main must return one tensor (the prediction), it returns {main.ret_ty}")
    if not 0 < num_params <= len(main.params):
        raise InputError(f"train_step: num_params={num_params}, but main takes {len(main.params)} parameters")
    backbone = tvm.IRModule({"backbone": main.with_attr("global_symbol", "backbone")})
    backbone = backbone.with_attrs({"param_num": num_params, "state_num": 0})
    gradients.register()
    _numpy_dtype(optimizer)
    setup = relax.training.SetupTrainer(loss, optimizer, [main.ret_ty, main.ret_ty], legalize=False)
    return setup(backbone)


def _numpy_dtype(optimizer) -> None:
    """TVM 0.27's optimizers keep their dtype as a TVM dtype object, which Adam's init gives to
    numpy (ValueError: could not convert T.float32); keep it as its name instead."""
    if getattr(optimizer, "_tvmfuse_dtype_fixed", False):
        return
    set_dtype = optimizer._set_params_and_dtype

    def fixed(params):
        set_dtype(params)
        optimizer.dtype = str(optimizer.dtype)

    optimizer._set_params_and_dtype = fixed
    optimizer._tvmfuse_dtype_fixed = True


def train_step(mod: tvm.IRModule, num_params: int, *, loss, optimizer) -> TrainStep:
    """The step module of `mod` (main's last `num_params` parameters trained), with `loss` a
    relax.training.loss.Loss and `optimizer` a relax.training.optimizer.Optimizer (not yet
    initialized); see the module docstring."""
    with GRAPH_LOCK:
        trainer = _trainer(mod, num_params, loss, optimizer)
        adjoint, update = trainer["backbone_loss_adjoint"], trainer["optimizer"]
        n_in = len(adjoint.params) - num_params - 1
        fresh = [relax.Var(p.name, p.ty) for p in adjoint.params]
        states = [relax.Var(f"optim_state_{i}", ty) for i, ty in enumerate(update.params[2].ty.fields)]
        bb = relax.BlockBuilder()
        funcs = {name: trainer[name].without_attr("global_symbol") for name in ("backbone_loss_adjoint", "optimizer")}
        gvs = {name: bb.add_func(f, name) for name, f in funcs.items()}
        with bb.function("main", fresh + states):
            with bb.dataflow():
                res = bb.emit(relax.Call(gvs["backbone_loss_adjoint"], fresh))
                outs = [bb.emit(relax.TupleGetItem(res, 0))]
                grads = bb.emit(relax.TupleGetItem(res, 1))
                params = bb.emit(relax.Tuple(fresh[n_in:n_in + num_params]))
                new = bb.emit(relax.Call(gvs["optimizer"], [params, grads, bb.emit(relax.Tuple(states))]))
                for k, n in ((0, num_params), (1, len(states))):
                    part = bb.emit(relax.TupleGetItem(new, k))
                    outs += [bb.emit(relax.TupleGetItem(part, i)) for i in range(n)]
                out = bb.emit_output(relax.Tuple(outs))
            bb.emit_func_output(out)
        step = bb.get()
        step = relax.transform.InlinePrivateFunctions()(step)
        step = relax.transform.DeadCodeElimination(["main"])(step)
        step = relax.transform.CanonicalizeBindings()(step)
    init = [np.asarray(t.numpy()) for t in optimizer.state] if optimizer.state is not None else []
    return TrainStep(step, n_in, num_params, init)
