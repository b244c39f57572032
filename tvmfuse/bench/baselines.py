"""Peer baselines for the zoo: each workload written as an ONNX graph, run by ONNX Runtime.

Contract: `onnx_model(workload)` returns an `onnx.ModelProto` computing the same outputs as the
workload from the same inputs (every tensor, weights included, a graph input, as in the zoo), or
None for a workload that has no ONNX form here (the SGD step). `OrtRunner(workload, threads)`
wraps an ONNX Runtime session with every graph optimization on. Both need the `onnx` extra.
"""
from __future__ import annotations

import numpy as np

from .onnx_export import PROTOBUF_LIMIT, _export_onnx, _stderr_to_devnull, load_exported  # noqa: F401 (re-exported for callers)

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
    """An ONNX Runtime session for a workload, `threads` intra-op threads, all graph optimizations,
    on `device` ("cpu", or "cuda": the CUDA execution provider)."""

    def __init__(self, workload, threads: int, device: str = "cpu"):
        import onnxruntime as ort

        model = onnx_model(workload)
        if model is None:
            raise ValueError(f"workload {workload.name!r} has no ONNX form in tvmfuse.bench.baselines")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")  # sleep between runs
        provider = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}[device]
        self.session = ort.InferenceSession(model.SerializeToString(), opts, providers=[provider])
        self.names = [n for n, _, _ in workload.input_specs]
        self.device = device

    def bound(self, *arrays):
        """A zero-argument call running the session on `arrays` copied once to the session's device
        and outputs left there (IO binding): no host<->device copies in the call."""
        import onnxruntime as ort

        io = self.session.io_binding()
        values = [ort.OrtValue.ortvalue_from_numpy(a, self.device, 0) for a in arrays]
        for name, v in zip(self.names, values):
            io.bind_ortvalue_input(name, v)
        for o in self.session.get_outputs():
            io.bind_output(o.name, self.device)

        def call(io=io, values=values):  # `values` keeps the bound inputs alive
            self.session.run_with_iobinding(io)

        return call

    def __call__(self, *arrays):
        out = self.session.run(None, dict(zip(self.names, arrays)))
        return out[0] if len(out) == 1 else tuple(out)


# ---------------------------------------------------------------- PyTorch eager / torch.compile
def _torch_fns():
    import torch
    import torch.nn.functional as F

    def attention(w):
        (_, (b, s, dm), _) = w.input_specs[0]
        h = w.meta["heads"]
        dh = dm // h

        def f(q, k, v):
            th = lambda t: t.reshape(b, s, h, dh).permute(0, 2, 1, 3)
            p = torch.softmax(th(q) @ th(k).transpose(-1, -2) * (1.0 / dh ** 0.5), dim=-1)
            return (p @ th(v)).permute(0, 2, 1, 3).reshape(b, s, dm)

        return f

    def linear_regression_step(w):
        n = w.input_specs[0][1][0]

        def f(x, y, wt, bias):
            diff = x @ wt + bias - y
            g = diff * (2.0 / n)
            return (diff * diff).mean(), wt - 0.01 * (x.T @ g), bias - 0.01 * g.sum(0)

        return f

    def rms(x, r, wt):
        s = x + r
        return s, s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6) * wt

    def ln(x, g, b):
        mu = x.mean(-1, keepdim=True)
        d = x - mu
        return d * torch.rsqrt((d * d).mean(-1, keepdim=True) + 1e-5) * g + b

    def sm(x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)

    return {
        "bias_relu_dropout": lambda w: (lambda x, b: torch.relu(x + b)),
        "conv_relu_bn_add": lambda w: (lambda x, wt, g, be, mu, var: F.batch_norm(
            torch.relu(F.conv2d(x, wt, padding=1)), mu, var, g, be, False, 0.0, 1e-5) + x),
        "softmax_chain": lambda w: (lambda x, y: torch.softmax(torch.relu(x + y), -1) * y),
        "softmax_decomposed": lambda w: sm,
        "layernorm_decomposed": lambda w: ln,
        "rmsnorm_residual": lambda w: rms,
        "multi_reduce": lambda w: (lambda x: (x.abs().amax(), x.mean(), (x * x).mean())),
        "mlp_block": lambda w: (lambda x, w1, b1, w2, b2: F.gelu(x @ w1 + b1) @ w2 + b2 + x),
        "attention": attention,
        "linear_regression_step": linear_regression_step,
    }


def freezing_scope(on: bool = True):
    """Inductor's freezing (torch._inductor.config.freezing) for what compiles inside: the scope
    must hold torch.compile AND the first (compiling) call, under no_grad. Parameters become
    constants, folded and prepacked at compile time: the fair peer of a tvmfuse build, which bakes
    its weights in. Off: a null scope."""
    import contextlib

    if not on:
        return contextlib.nullcontext()
    import torch._inductor.config

    return torch._inductor.config.patch(freezing=True)


def torch_compile(fn, freezing: bool = False):
    """torch.compile(fn) (Inductor, default mode); with `freezing`, freezing is also the backend's
    own option. Call it, and the first call, inside freezing_scope(freezing). The option is what
    keeps the two apart: Dynamo keeps compiled graphs per code object and reuses one whose backend
    compares equal (same options), so under the scope alone a function or module compiled before
    in default mode got its default-mode graph back (0.0 s "compile" of the zoo's softmax_chain)."""
    import torch

    return torch.compile(fn, options={"freezing": True}) if freezing else torch.compile(fn)


class TorchRunner:
    """The workload in PyTorch, eager or through torch.compile (Inductor; with `freezing`, Inductor's
    freezing on); numpy in, numpy out. `compile_s` is the time of the first (compiling) call. On
    `device` "cuda" the inputs live on the GPU, and `run` returns with the work queued (synchronize
    to wait for it). `dtype` "float16"/"bfloat16": the floating-point inputs (the zoo's weights are
    inputs) cast to it, outputs back to float32."""

    def __init__(self, workload, threads: int, compiled: bool = False, device: str = "cpu", freezing: bool = False,
                 dtype: str = "float32"):
        import time

        import torch

        torch.set_num_threads(threads)
        fn = _torch_fns()[workload.name](workload)
        self.device, self.dtype = device, getattr(torch, dtype)
        self.args = [self._arg(a) for a in workload.inputs()]
        with freezing_scope(freezing):
            self.fn = torch_compile(fn, freezing) if compiled or freezing else fn
            t0 = time.perf_counter()
            with torch.no_grad():
                self.fn(*self.args)
        self.compile_s = time.perf_counter() - t0 if compiled or freezing else 0.0

    def _arg(self, a):
        import torch

        t = torch.from_numpy(a).to(self.device)
        return t.to(self.dtype) if t.is_floating_point() else t

    def run(self):
        import torch

        with torch.no_grad():
            return self.fn(*self.args)

    def __call__(self, *arrays):
        import torch

        with torch.no_grad():
            out = self.fn(*[self._arg(a) for a in arrays])
        return tuple(_to_numpy(o) for o in out) if isinstance(out, tuple) else _to_numpy(out)


def _to_numpy(t):
    """A torch output as numpy, floating point as float32 (a half peer's outputs)."""
    return (t.float() if t.is_floating_point() else t).cpu().numpy()


# ---------------------------------------------------------------- real models (tvmfuse.zoo.models)
def _ort_session(blob: bytes | str, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(blob, opts, providers=["CPUExecutionProvider"])


def model_peer(m, system: str, threads: int, device: str = "cpu", dtype: str = "float32"):
    """A real model's peer: (zero-argument call, seconds of its first call) or the reason it has
    none. "torch": eager; "torch.compile": Inductor on the module; "torch.compile+freezing": the
    same with Inductor's freezing (freezing_scope, no_grad); "torch.compile[tvmfuse]":
    tvmfuse's dynamo backend on the module; "onnxruntime": the module exported to ONNX (the model's
    own ONNX reference for an ONNX-imported model). On `device` "cuda" (torch peers only) the
    module and inputs are moved there and the call returns with the work queued; in a half `dtype`
    a copy of the module and the floating-point inputs are cast to it (the user's module is left
    as it was)."""
    import time

    x = m.inputs()
    if m.name.endswith("-onnx"):
        return ((lambda: m.reference(*x)), 0.0) if system == "onnxruntime" else "an ONNX model has no torch form"
    if m.module is None:
        return "no torch module"
    import torch

    if device != "cpu" and system == "onnxruntime":
        return "onnxruntime on CUDA is wired for the zoo only"
    if device == "cuda" and not torch.cuda.is_available():
        return f"torch {torch.__version__} has no CUDA here (torch.cuda.is_available() is False)"
    torch.set_num_threads(threads)
    half = getattr(torch, dtype) if dtype != "float32" else None
    args = [torch.from_numpy(a).to(device) for a in x]
    args = [a.to(half) if half is not None and a.is_floating_point() else a for a in args]
    module = m.module
    if half is not None or device != "cpu":
        import copy

        module = copy.deepcopy(module).to(device=device, dtype=half) if half is not None else (
            copy.deepcopy(module).to(device))
    if system == "onnxruntime":
        blob, why = _export_onnx(m.module, x)
        if blob is None:
            return why
        sess = _ort_session(blob, threads)
        feed = {i.name: a for i, a in zip(sess.get_inputs(), x)}
        return (lambda: sess.run(None, feed)[0]), 0.0
    freezing = system == "torch.compile+freezing"
    with freezing_scope(freezing):  # around the compile and its first call
        if system == "torch.compile[tvmfuse]":
            fn = torch.compile(module.eval(), backend="tvmfuse")
        else:
            fn = torch_compile(module.eval(), freezing) if system.startswith("torch.compile") else module

        def call():
            with torch.no_grad() if freezing else torch.inference_mode():
                out = fn(*args)
            return _to_numpy(out) if device == "cpu" and hasattr(out, "numpy") else out

        t0 = time.perf_counter()
        call()
    return call, (time.perf_counter() - t0 if system.startswith("torch.compile") else 0.0)
