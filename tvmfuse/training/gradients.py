"""Gradients (FPrimalGradient) of the Relax ops tvmfuse's workloads use and TVM 0.27's
`relax.transform.Gradient` lacks: gelu, rsqrt, square. Registered by train_step (register()), only where TVM
has none (a later TVM's own wins).

Each is `fn(orig_var, orig_call, output_grad, ctx) -> [input gradients]`, as in
tvm/relax/op/_op_gradient.py:
  gelu(x)  = x * Phi(x)        -> g * (Phi(x) + x * phi(x)),  Phi(x) = (1 + erf(x / sqrt 2)) / 2,
                                                              phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
  rsqrt(x) = y = x^(-1/2)      -> g * (-1/2) * y^3
  square(x)                    -> g * 2x
"""
from __future__ import annotations

import math

import tvm
from tvm import relax


def _const(v, like):
    return relax.const(v, like.ty.dtype)


def _gelu_grad(orig_var, orig_call, output_grad, ctx):
    x = orig_call.args[0]
    cdf = _const(0.5, x) * (_const(1.0, x) + relax.op.erf(x * _const(1 / math.sqrt(2.0), x)))
    pdf = relax.op.exp(_const(-0.5, x) * x * x) * _const(1 / math.sqrt(2 * math.pi), x)
    return [output_grad * (cdf + x * pdf)]


def _rsqrt_grad(orig_var, orig_call, output_grad, ctx):
    y = orig_var
    return [output_grad * _const(-0.5, y) * y * y * y]


def _square_grad(orig_var, orig_call, output_grad, ctx):
    x = orig_call.args[0]
    return [output_grad * _const(2.0, x) * x]


GRADIENTS = {"relax.nn.gelu": _gelu_grad, "relax.rsqrt": _rsqrt_grad, "relax.square": _square_grad}


def _has_gradient(name: str) -> bool:
    return tvm.ir.Op.get(name).get_attr("FPrimalGradient") is not None


def register() -> None:
    """Register each of GRADIENTS where TVM has none (idempotent)."""
    for name, fn in GRADIENTS.items():
        if not _has_gradient(name):
            tvm.ir.register_op_attr(name, "FPrimalGradient", fn)
