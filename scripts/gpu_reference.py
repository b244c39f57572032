"""The run half of the GPU check (scripts/gpu_device.py): the cases' inputs, float64 references and
torch peers. Runtime-only: numpy and torch (where present), no TVM and nothing from the tvmfuse
package but bench/baselines.py's torch forms, loaded by file path.

  make_inputs / inputs_digest   - a case's inputs, as tvmfuse.zoo.workloads makes them, and their sha256
  attention_reference / zoo_reference - the float64 reference on the device (torch) or numpy
  compare                       - max abs/rel error, NaN and tolerance verdict
  torch_peers / model_peer      - the same computation in torch on the same device, timed beside TVM
"""
from __future__ import annotations

import importlib.util
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

from gpu_env import load_portable  # noqa: E402

inputs_digest = load_portable().inputs_digest  # the digest prepare recorded (tvmfuse/bench/gpu_portable.py)


def load_torch_forms():
    """tvmfuse/bench/baselines.py's torch forms of the zoo, {name: f(workload) -> fn}, loaded by path
    (importing the tvmfuse package would import the compiler)."""
    path = os.path.join(ROOT, "tvmfuse", "bench/baselines.py")
    spec = importlib.util.spec_from_file_location("tvmfuse_baselines_standalone", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._torch_fns()


def make_inputs(case, case_dir="."):
    """The case's inputs exactly as tvmfuse.zoo.workload.Workload.inputs() makes them; a model's as
    its input_gen says (stored in inputs_file, or tvmfuse.bench.gpu_cases.generated_weight)."""
    import numpy as np

    if "input_gen" in case:
        out = []
        with np.load(os.path.join(case_dir, case["inputs_file"])) as z:
            for g, (_name, shape, dtype) in zip(case["input_gen"], case["inputs"]):
                if g["rule"] == "stored":
                    out.append(z[g["key"]])
                else:  # "normal": the same expression as gpu_cases.generated_weight
                    out.append(np.random.default_rng(g["seed"]).standard_normal(tuple(shape), dtype=np.float32)
                               * np.float32(g["scale"]))
        return out
    rng = np.random.default_rng(case["seed"])
    out = []
    for name, shape, dtype in case["inputs"]:
        a = rng.standard_normal(tuple(shape)).astype(dtype)
        if name in case.get("positive", ()):
            a = np.abs(a) + 0.5
        out.append(a)
    return out


def compare(out, ref, rtol, atol) -> dict:
    """ok (allclose at rtol/atol, no NaN), max abs error, max error relative to max |ref|."""
    import numpy as np

    out = out if isinstance(out, tuple) else (out,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    if len(out) != len(ref):
        return {"ok": False, "why": f"{len(out)} outputs, expected {len(ref)}"}
    ok, max_abs, max_rel, nan = True, 0.0, 0.0, False
    for o, r in zip(out, ref):
        o, r = np.asarray(o, dtype="float64"), np.asarray(r, dtype="float64")
        if o.shape != r.shape:
            return {"ok": False, "why": f"shape {o.shape}, expected {r.shape}"}
        nan |= bool(np.isnan(o).any())
        d = float(np.abs(o - r).max()) if o.size else 0.0
        max_abs = max(max_abs, d)
        max_rel = max(max_rel, d / max(float(np.abs(r).max()) if r.size else 0.0, 1e-30))
        ok &= bool(np.allclose(o, r, rtol=rtol, atol=atol))
    return {"ok": ok and not nan, "max_abs": max_abs, "max_rel": max_rel, "nan": nan}


def attention_reference(case, inputs, torch, device):
    """softmax(Q·Kᵀ/sqrt(d) [causal: where(tril, ., -1e9)])·V on [b, s, h*d] inputs, heads split
    and merged as tvmfuse.zoo.workloads.attention_workload does, in float64."""
    import numpy as np

    a = case["attention"]
    b, s, h, d = a["batch"], a["seq"], a["heads"], a["head_dim"]
    if torch is not None:
        q, k, v = (torch.from_numpy(x).to(device=device, dtype=torch.float64) for x in inputs)
        th = lambda t: t.reshape(b, s, h, d).permute(0, 2, 1, 3)
        sc = th(q) @ th(k).transpose(-1, -2) * (1.0 / math.sqrt(d))
        if a["mask"] == "causal":
            tril = torch.ones(s, s, dtype=torch.bool, device=device).tril()
            sc = torch.where(tril, sc, torch.tensor(-1e9, dtype=torch.float64, device=device))
        o = torch.softmax(sc, dim=-1) @ th(v)
        return (o.permute(0, 2, 1, 3).reshape(b, s, h * d).cpu().numpy(),), f"torch float64 on {device}"
    q, k, v = (x.astype("float64") for x in inputs)
    th = lambda t: t.reshape(b, s, h, d).transpose(0, 2, 1, 3)
    sc = th(q) @ th(k).transpose(0, 1, 3, 2) / math.sqrt(d)
    if a["mask"] == "causal":
        sc = np.where(np.tril(np.ones((s, s), dtype=bool)), sc, -1e9)
    e = np.exp(sc - sc.max(-1, keepdims=True))
    o = (e / e.sum(-1, keepdims=True)) @ th(v)
    return (o.transpose(0, 2, 1, 3).reshape(b, s, h * d),), "numpy float64"


def zoo_reference(case, inputs, torch, device, forms):
    """The workload's torch form (tvmfuse.bench.baselines) in float64 on the device; None without torch."""
    if torch is None or forms is None or case.get("torch_form") not in forms:
        return None, "no torch form here"
    fn = forms[case["torch_form"]](_workload_view(case))
    with torch.no_grad():
        out = fn(*[torch.from_numpy(x).to(device=device, dtype=torch.float64) for x in inputs])
    out = out if isinstance(out, tuple) else (out,)
    return tuple(o.cpu().numpy() for o in out), f"torch float64 on {device}"


def _workload_view(case):
    from types import SimpleNamespace

    specs = [(n, tuple(s), d) for n, s, d in case["inputs"]]
    return SimpleNamespace(name=case["workload"], input_specs=specs, meta=case.get("meta", {}))


def torch_peers(case, inputs, torch, device, forms):
    """{name: (call, outputs as numpy, tolerance override or None)} or {name: why not}."""
    out = {}
    if torch is None:
        return {"torch": "torch is not installed"}
    if device == "cuda" and not torch.cuda.is_available():
        return {"torch": "torch.cuda.is_available() is False"}
    t = [torch.from_numpy(x).to(device) for x in inputs]

    def entry(fn, tol=None):
        def call():
            with torch.no_grad():
                return fn()
        res = call()
        res = res if isinstance(res, tuple) else (res,)
        return call, tuple(r.float().cpu().numpy() for r in res), tol

    if "model" in case:
        fn = model_peer(case, inputs, torch, device)
        if isinstance(fn, str):
            return {"torch": fn}
        ids = t[0]
        out["torch"] = entry(lambda: fn(ids))
        return out
    if "attention" not in case:
        if forms is None or case.get("torch_form") not in forms:
            return {"torch": "no torch form"}
        fn = forms[case["torch_form"]](_workload_view(case))
        out["torch"] = entry(lambda: fn(*t))
        return out
    a = case["attention"]
    b, s, h, d = a["batch"], a["seq"], a["heads"], a["head_dim"]
    causal = a["mask"] == "causal"
    heads = lambda x: x.view(b, s, h, d).transpose(1, 2)
    merge = lambda o: o.transpose(1, 2).reshape(b, s, h * d)
    F = torch.nn.functional
    if forms is not None and not causal:
        fn = forms["attention"](_workload_view(case))
        out["torch eager"] = entry(lambda: fn(*t))
    elif causal:
        tril = torch.ones(s, s, dtype=torch.bool, device=device).tril()

        def eager():
            sc = heads(t[0]) @ heads(t[1]).transpose(-1, -2) * (1.0 / math.sqrt(d))
            sc = torch.where(tril, sc, torch.tensor(-1e9, device=device))
            return merge(torch.softmax(sc, -1) @ heads(t[2]))
        out["torch eager"] = entry(eager)
    out["torch sdpa fp32"] = entry(lambda: merge(F.scaled_dot_product_attention(
        heads(t[0]), heads(t[1]), heads(t[2]), is_causal=causal)))
    if device == "cuda":
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            th = [x.half() for x in t]

            def flash():
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return merge(F.scaled_dot_product_attention(heads(th[0]), heads(th[1]), heads(th[2]),
                                                                is_causal=causal))
            out["torch sdpa fp16 flash"] = entry(flash, (1e-2, 1e-2))
        except Exception as err:  # no flash kernel for this GPU / build
            out["torch sdpa fp16 flash"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    return out


def model_peer(case, inputs, torch, device):
    """The BERT in transformers (if installed here) with the case's weights: f(ids) -> hidden
    states, or why not."""
    if "bert_config" not in case["model"]:
        return f"no torch form of {case['model']['name']}"
    try:
        from transformers import BertConfig, BertModel
    except ImportError:
        return "transformers is not installed here"
    bert = BertModel(BertConfig(**case["model"]["bert_config"])).eval()
    with torch.no_grad():
        for name, a in zip(case["module_names"], inputs[1:]):
            n = name[len("bert."):] if name.startswith("bert.") else name
            t = bert.get_parameter(n) if n in dict(bert.named_parameters()) else bert.get_buffer(n)
            t.copy_(torch.from_numpy(a))
    bert = bert.to(device)
    return lambda ids: bert(input_ids=ids).last_hidden_state
