"""tvmfuse: operator fusion, default schedules and measurement on Apache TVM Relax.

Importing tvmfuse changes nothing in the process: no environment variable, no patch, no
registration (tests/test_import_side_effects.py). What builds and runs need (TVM's thread pool
settings, the "tvmfuse" TIR pipeline) is set up on first use, by `tvmfuse.install.install_once`.
`tune` (MetaSchedule, the tuning workers) is loaded when first used.
"""
from .zoo import workloads
from .build import Compiled, build, prepare
from .fusion.classify import classify
from .runtime.compare import Comparison, compare
from .errors import FrontendError, TvmfuseError
from .frontends import from_onnx, from_relay_text, from_torch
from .loader import load, load_model
from .runtime.metrics import Measurement, measure

__all__ = ["workloads", "build", "prepare", "Compiled", "classify", "compare", "Comparison",
           "measure", "Measurement", "TvmfuseError", "FrontendError", "from_torch", "from_onnx",
           "from_relay_text", "load", "load_model", "tune"]

try:  # the custom fusion API (tvmfuse.passes)
    from .fusion.api import explain, fuse  # noqa: F401

    __all__ += ["fuse", "explain"]
except ImportError:  # pragma: no cover
    pass


def __getattr__(name):  # PEP 562: names loaded on first access
    if name == "tune":
        from .tuning import autotune as tune

        globals()["tune"] = tune
        return tune
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
