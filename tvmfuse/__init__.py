"""tvmfuse: operator fusion, default schedules and measurement on Apache TVM Relax."""
from . import workloads
from .build import Compiled, build, prepare
from .classify import classify
from .compare import Comparison, compare
from .errors import TvmfuseError
from .runtime import Measurement, measure

__all__ = ["workloads", "build", "prepare", "Compiled", "classify", "compare", "Comparison",
           "measure", "Measurement", "TvmfuseError"]

try:  # the custom fusion API (tvmfuse.passes)
    from .passes.api import explain, fuse  # noqa: F401

    __all__ += ["fuse", "explain"]
except ImportError:  # pragma: no cover
    pass
