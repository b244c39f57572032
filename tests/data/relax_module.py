"""Example `--model` file for scripts/tune.py: a Relax module (`mod`), its inputs and a reference.

    ./dev python scripts/tune.py --model tests/data/relax_module.py --size small
"""
import numpy as np
from tvm import relax
from tvm.relax import op as R

bb = relax.BlockBuilder()
x = relax.Var("x", relax.TensorType((8, 32), "float32"))
with bb.function("main", [x]):
    with bb.dataflow():
        e = bb.emit(R.exp(R.subtract(x, R.max(x, axis=-1, keepdims=True))))
        out = bb.emit_output(R.divide(e, R.sum(e, axis=-1, keepdims=True)))
    bb.emit_func_output(out)
mod = bb.get()


def inputs():
    return [np.random.default_rng(0).standard_normal((8, 32)).astype("float32")]


def reference(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)
