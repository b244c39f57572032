"""tvmfuse: operator fusion, default schedules and measurement on Apache TVM Relax."""
from . import workloads
from .errors import TvmfuseError
