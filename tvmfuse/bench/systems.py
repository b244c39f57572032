"""The systems of the side-by-side benchmark: their names, which are peers, and what each one is.

Every table and ratio names its peer by `LABELS` (a bare "tvm" would say nothing to a reader
choosing between TVM and tvmfuse), and `legend(systems)` is the line under each table's header.
"""
from __future__ import annotations

TVM_SYSTEMS = ("none", "tvm", "tvmfuse")  # tvmfuse.build's fusion variants
TUNED = ("tvm+tuned", "tvmfuse+tuned")
VANILLA = "vanilla tvm"  # TVM alone: relax.build + dlight (tvmfuse.bench.baselines_tvm)
FREEZING = "torch.compile+freezing"  # Inductor with torch._inductor.config.freezing = True
PEERS = ("onnxruntime", "torch", "torch.compile", FREEZING)
BEST_PEERS = PEERS + (VANILLA,)  # what "tvmfuse vs best peer" takes the fastest of
BACKEND = "torch.compile[tvmfuse]"  # a real model's module through torch.compile(backend="tvmfuse")
SYSTEMS = TVM_SYSTEMS[:2] + (VANILLA,) + TVM_SYSTEMS[2:] + PEERS + (BACKEND, "numpy")

LABELS = {
    "none": "no fusion (tvmfuse schedules)",
    "tvm": "stock FuseOps (tvmfuse schedules)",
    "tvmfuse": "tvmfuse",
    VANILLA: "vanilla TVM (relax.build + dlight)",
    "tvm+tuned": "stock FuseOps (tvmfuse schedules), tuned",
    "tvmfuse+tuned": "tvmfuse, tuned",
    "onnxruntime": "ONNX Runtime",
    "torch": "torch eager",
    "torch.compile": "torch.compile (default mode)",
    FREEZING: "torch.compile (freezing)",
    BACKEND: "torch.compile[tvmfuse]",
    "numpy": "numpy",
}

_WHAT = {
    "none": "every op its own kernel, on tvmfuse's schedules",
    "tvm": "TVM's stock FuseOps + FuseTIR on tvmfuse's schedules, with its constant folding, Winograd and "
           "weight prepacking: measures fusion alone",
    "tvmfuse": "tvmfuse.build, untuned",
    VANILLA: "relax.build with TVM's default Relax pipeline and dlight's default schedules, untouched by "
             "tvmfuse (a kernel no dlight rule takes stays TVM's naive loop nest)",
    "tvm+tuned": "the tvm column with tuned records", "tvmfuse+tuned": "tvmfuse with tuned records",
    "onnxruntime": "all graph optimizations", "torch": "PyTorch eager",
    "torch.compile": "Inductor, default mode",
    FREEZING: "Inductor with freezing=True under no_grad: weights of a real model folded and prepacked "
              "like tvmfuse's (the zoo's weights are inputs: nothing to freeze)",
    BACKEND: "the module through torch.compile(backend='tvmfuse'), not a peer",
    "numpy": "the reference",
}


def label(system: str) -> str:
    return LABELS.get(system, system)


def legend(systems) -> str:
    """One line saying what each system of the table is."""
    return "Systems: " + "; ".join(f"**{s}** = {_WHAT[s]}" for s in systems if s in _WHAT) + "."
