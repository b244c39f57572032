"""tvmfuse: operator fusion, default schedules and measurement on Apache TVM Relax."""
from .target import bound_spinning as _bound_spinning, use_all_cores as _use_all_cores

_use_all_cores()  # before any TVM kernel runs: TVM's default thread pool is half the cores on x86
_bound_spinning()  # ... and its idle workers spin ~75 ms after every call, taking the cores

from . import workloads
from .build import Compiled, build, prepare
from .classify import classify
from .compare import Comparison, compare
from .errors import FrontendError, TvmfuseError
from .frontends import from_onnx, from_relay_text, from_torch, load, load_model
from .runtime import Measurement, measure
from .tuning import tune

__all__ = ["workloads", "build", "prepare", "Compiled", "classify", "compare", "Comparison",
           "measure", "Measurement", "TvmfuseError", "FrontendError", "from_torch", "from_onnx",
           "from_relay_text", "load", "load_model", "tune"]

try:  # the custom fusion API (tvmfuse.passes)
    from .passes.api import explain, fuse  # noqa: F401

    __all__ += ["fuse", "explain"]
except ImportError:  # pragma: no cover
    pass
