"""Peer baselines for the zoo: each workload written as an ONNX graph, run by ONNX Runtime.

Contract: `onnx_model(workload)` returns an `onnx.ModelProto` computing the same outputs as the
workload from the same inputs (every tensor, weights included, a graph input, as in the zoo), or
None for a workload that has no ONNX form here (the SGD step). `OrtRunner(workload, threads)`
wraps an ONNX Runtime session with every graph optimization on. Both need the `onnx` extra.
"""
from __future__ import annotations

import numpy as np

_OPSET = 20  # Gelu; every Reduce* takes its axes as an input


def _graph(w, nodes, outputs, consts=()):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    dt = {"float32": TensorProto.FLOAT}
    ins = [helper.make_tensor_value_info(n, dt[d], list(s)) for n, s, d in w.input_specs]
    ret = w.mod["main"].ret_ty
    shapes = [[int(d) for d in t.shape] for t in (ret.fields if hasattr(ret, "fields") else [ret])]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, s) for o, s in zip(outputs, shapes)]
    inits = [numpy_helper.from_array(np.asarray(v), name=k) for k, v in consts]
    g = helper.make_graph([helper.make_node(*n[:3], **(n[3] if len(n) > 3 else {})) for n in nodes],
                          w.name, ins, outs, inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", _OPSET)])
    onnx.checker.check_model(model)
    return model


_LAST = ("last", np.array([-1], dtype="int64"))
_EPS5 = ("eps5", np.array(1e-5, dtype="float32"))
_EPS6 = ("eps6", np.array(1e-6, dtype="float32"))


def _bias_relu_dropout(w):
    return _graph(w, [("Add", ["x", "bias"], ["a"]), ("Relu", ["a"], ["y"])], ["y"])


def _conv_relu_bn_add(w):
    return _graph(w, [("Conv", ["x", "w"], ["c"], {"pads": [1, 1, 1, 1]}), ("Relu", ["c"], ["r"]),
                      ("BatchNormalization", ["r", "gamma", "beta", "mean", "var"], ["b"], {"epsilon": 1e-5}),
                      ("Add", ["b", "x"], ["y"])], ["y"])


def _softmax_chain(w):
    return _graph(w, [("Add", ["x", "y"], ["a"]), ("Relu", ["a"], ["r"]),
                      ("Softmax", ["r"], ["s"], {"axis": -1}), ("Mul", ["s", "y"], ["o"])], ["o"])


def _softmax_decomposed(w):
    return _graph(w, [("ReduceMax", ["x", "last"], ["m"]), ("Sub", ["x", "m"], ["d"]), ("Exp", ["d"], ["e"]),
                      ("ReduceSum", ["e", "last"], ["s"]), ("Div", ["e", "s"], ["o"])], ["o"], [_LAST])


def _layernorm_decomposed(w):
    return _graph(w, [("ReduceMean", ["x", "last"], ["mu"]), ("Sub", ["x", "mu"], ["d"]),
                      ("Mul", ["d", "d"], ["d2"]), ("ReduceMean", ["d2", "last"], ["var"]),
                      ("Add", ["var", "eps5"], ["ve"]), ("Sqrt", ["ve"], ["sd"]), ("Reciprocal", ["sd"], ["r"]),
                      ("Mul", ["d", "r"], ["n"]), ("Mul", ["n", "gamma"], ["g"]), ("Add", ["g", "beta"], ["o"])],
                  ["o"], [_LAST, _EPS5])


def _rmsnorm_residual(w):
    return _graph(w, [("Add", ["x", "residual"], ["s"]), ("Mul", ["s", "s"], ["s2"]),
                      ("ReduceMean", ["s2", "last"], ["ms"]), ("Add", ["ms", "eps6"], ["me"]),
                      ("Sqrt", ["me"], ["rt"]), ("Reciprocal", ["rt"], ["inv"]), ("Mul", ["s", "inv"], ["n"]),
                      ("Mul", ["n", "weight"], ["y"])], ["s", "y"], [_LAST, _EPS6])


def _multi_reduce(w):
    keep = {"keepdims": 0}
    return _graph(w, [("Abs", ["x"], ["a"]), ("ReduceMax", ["a"], ["amax"], keep), ("ReduceMean", ["x"], ["mean"], keep),
                      ("Mul", ["x", "x"], ["sq"]), ("ReduceMean", ["sq"], ["msq"], keep)], ["amax", "mean", "msq"])


def _mlp_block(w):
    return _graph(w, [("MatMul", ["x", "w1"], ["m1"]), ("Add", ["m1", "b1"], ["a1"]), ("Gelu", ["a1"], ["g"]),
                      ("MatMul", ["g", "w2"], ["m2"]), ("Add", ["m2", "b2"], ["a2"]), ("Add", ["a2", "x"], ["y"])],
                  ["y"])


def _attention(w):
    (_, (b, s, dm), _) = w.input_specs[0]
    h = w.meta["heads"]
    dh = dm // h
    shape = ("heads", np.array([b, s, h, dh], dtype="int64"))
    back = ("merged", np.array([b, s, dm], dtype="int64"))
    scale = ("scale", np.array(1.0 / np.sqrt(dh), dtype="float32"))
    nodes = []
    for t in ("q", "k", "v"):
        nodes += [("Reshape", [t, "heads"], [t + "r"]), ("Transpose", [t + "r"], [t + "h"], {"perm": [0, 2, 1, 3]})]
    nodes += [("Transpose", ["kh"], ["kt"], {"perm": [0, 1, 3, 2]}), ("MatMul", ["qh", "kt"], ["sc"]),
              ("Mul", ["sc", "scale"], ["ss"]), ("Softmax", ["ss"], ["p"], {"axis": -1}),
              ("MatMul", ["p", "vh"], ["o"]), ("Transpose", ["o"], ["ot"], {"perm": [0, 2, 1, 3]}),
              ("Reshape", ["ot", "merged"], ["y"])]
    return _graph(w, nodes, ["y"], [shape, back, scale])


_BUILDERS = {f.__name__[1:]: f for f in (_bias_relu_dropout, _conv_relu_bn_add, _softmax_chain,
                                          _softmax_decomposed, _layernorm_decomposed, _rmsnorm_residual,
                                          _multi_reduce, _mlp_block, _attention)}


def onnx_model(workload):
    """The workload as an ONNX model, or None when it has no ONNX form here."""
    build = _BUILDERS.get(workload.name)
    return build(workload) if build else None


class OrtRunner:
    """An ONNX Runtime session for a workload, `threads` intra-op threads, all graph optimizations."""

    def __init__(self, workload, threads: int):
        import onnxruntime as ort

        model = onnx_model(workload)
        if model is None:
            raise ValueError(f"workload {workload.name!r} has no ONNX form in tvmfuse.baselines")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        self.names = [n for n, _, _ in workload.input_specs]

    def __call__(self, *arrays):
        out = self.session.run(None, dict(zip(self.names, arrays)))
        return out[0] if len(out) == 1 else tuple(out)
