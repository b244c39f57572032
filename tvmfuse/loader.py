"""`load_model(spec, size)` (`tvmfuse.load`): the one loader every entry point uses (scripts/tune.py
--model, bench, report, `tvmfuse graph`); a `Workload` (tvmfuse/zoo/workload.py: `name`, `mod`,
`inputs()`, `reference(*inputs)` or None, `rtol`, `atol`, `flops`, `memory_bound`). It sits above
the zoo and the models: it imports both, neither imports it.

SPEC is, in this order:
  a zoo workload name        tvmfuse.zoo.workloads (numpy reference)
  a real model name          tvmfuse.zoo.models: bert-tiny, gpt2-tiny, resnet-tiny, bert-tiny-onnx
  FILE.onnx                  from_onnx; inputs random (ints in [0, 8)); reference: onnxruntime
  FILE.txt / FILE.relay      from_relay_text; meta[relay.Constant] values from FILE.npz beside it
                             (np.savez order), else from the text's #[metadata] section, else
                             deterministic random; reference: None (the unfused build is the reference)
  FILE.py                    run as a script; it defines either
                               model (torch.nn.Module) and example_inputs (tuple of tensors)
                               [and dynamic_shapes]: imported with from_torch, reference: eager;
                             or
                               mod (a Relax IRModule with "main") [and inputs: list of arrays or a
                               function returning one, reference: function of the inputs]
"""
from __future__ import annotations

import os
import runpy

import numpy as np
import tvm

from .zoo import models, workloads
from .errors import FrontendError, UnknownWorkloadError
from .zoo.workload import Workload
from .frontends.common import input_specs, random_inputs, read_path
from .frontends.from_onnx import from_onnx, load_onnx
from .frontends.from_torch import from_torch
from .frontends.relay_text import from_relay_text

SUFFIXES = (".onnx", ".txt", ".relay", ".py")


def _is_file_spec(spec: str) -> bool:
    return spec.endswith(SUFFIXES) or os.sep in spec or os.path.exists(spec)


def load_model(spec, size: str = "small", batch: int = 1):
    """Resolve SPEC (see the module docstring) to a workload-like object: THE loader (`tvmfuse.load`)
    every entry point uses (scripts/tune.py, bench, report, `tvmfuse report`/`graph`). `batch` sets
    a real model's batch (tvmfuse.zoo.models); the zoo's workloads and model files have their own."""
    spec = os.fspath(spec)
    if batch != 1 and spec not in models.names():
        raise UnknownWorkloadError(f"batch {batch} asked of {spec!r}: only the real models ({', '.join(models.names())}) "
                                   "take a batch; the zoo's workloads and model files bring their own shapes")
    if spec in workloads.names():
        return workloads.get(spec, size)
    if spec in models.names():
        return models.get(spec, size, batch)
    if not _is_file_spec(spec):
        raise UnknownWorkloadError(
            f"unknown workload {spec!r}; known workloads: {', '.join(workloads.names())}; real models: "
            f"{', '.join(models.names())}; or a model file ({', '.join(SUFFIXES)})")
    path = read_path(spec, "--model", SUFFIXES)
    name = os.path.basename(path)
    if path.endswith(".onnx"):
        return _load_onnx(path, name)
    if path.endswith((".txt", ".relay")):
        return _load_relay(path, name)
    if path.endswith(".py"):
        return _load_py(path, name)
    raise FrontendError(f"--model {path}: unknown file type; use one of {', '.join(SUFFIXES)}")


def _load_onnx(path, name):
    import onnxruntime as ort

    model = load_onnx(path)
    mod = from_onnx(model)
    arrays = random_inputs(input_specs(mod))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]

    def reference(*inputs):
        outs = sess.run(None, dict(zip(names, inputs)))
        return outs[0] if len(outs) == 1 else tuple(outs)

    return Workload.imported(name, mod, arrays, reference, atol=1e-4, source="onnx (reference: onnxruntime)")


def _load_relay(path, name):
    side = os.path.splitext(path)[0] + ".npz"
    if os.path.isfile(side):
        with np.load(side) as z:
            constants = [z[f"arr_{i}"] for i in range(len(z.files))]
        mod, note = from_relay_text(path, constants=constants), f"constants from {os.path.basename(side)}"
    else:
        mod, note = from_relay_text(path, random_constants=True), "meta constants from #[metadata], else random"
    arrays = random_inputs(input_specs(mod))
    for (pname, _, _), a in zip(input_specs(mod), arrays):
        if pname.startswith("var") or pname.endswith("var"):  # batch-norm variances must be positive
            a[...] = np.abs(a) + 0.5
    return Workload.imported(name, mod, arrays, None, atol=1e-4, source="relay text", notes=[note])


def _load_py(path, name):
    try:
        ns = runpy.run_path(path, run_name="__tvmfuse_model__")
    except Exception as err:
        raise FrontendError(f"--model {path}: running the file failed: {type(err).__name__}: {err}") from err
    if "model" in ns and "example_inputs" in ns:
        return _from_torch_ns(ns, name)
    mods = [v for k, v in ns.items() if isinstance(v, tvm.IRModule) and "main" in [g.name_hint for g in v.get_global_vars()]]
    if "mod" in ns and isinstance(ns["mod"], tvm.IRModule):
        mods = [ns["mod"]]
    if not mods:
        raise FrontendError(f"--model {path}: the file defines neither `model` + `example_inputs` (torch) nor a "
                            "Relax IRModule `mod` with a 'main' function")
    mod = mods[0]
    inputs = ns.get("inputs")
    arrays = inputs() if callable(inputs) else inputs
    arrays = [np.asarray(a) for a in arrays] if arrays is not None else random_inputs(input_specs(mod))
    return Workload.imported(name, mod, arrays, ns.get("reference"), source="relax module")


def _from_torch_ns(ns, name):
    import torch

    module, ex = ns["model"], ns["example_inputs"]
    ex = (ex,) if isinstance(ex, torch.Tensor) else tuple(ex)
    mod = from_torch(module, ex, ns.get("dynamic_shapes"))
    arrays = [t.detach().numpy() for t in ex]

    def eager(*inputs):
        with torch.inference_mode():
            return module(*[torch.from_numpy(np.ascontiguousarray(a)) for a in inputs])

    def reference(*inputs):
        out = eager(*inputs)
        return out.numpy() if isinstance(out, torch.Tensor) else tuple(o.numpy() for o in out)

    return Workload.imported(name, mod, arrays, reference, atol=1e-4, eager=eager, source="torch.export")


load = load_model  # tvmfuse.load: the one loader (a zoo name, a real model or a model file)
