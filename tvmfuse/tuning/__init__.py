"""Auto-scheduling with MetaSchedule + XGBoost, durable tuning logs, merge, curves, RPC helpers.

  tune(mod, target, fusion, trials=, time_budget=, logs=, rpc=)   tune.py
  build(..., tuning_logs=PATH) -> apply_logs                        apply.py
  <logs>/<target key>/ database_*.json + tasks.json                 database.py, decisions.py, keys.py
  merge([A, B], C), curves(logs, target)                            merge.py, curves.py
  tracker / server / runner helpers                                 rpc.py
"""
from .apply import apply_logs
from .curves import curves
from .keys import target_key
from .merge import merge

__all__ = ["tune", "TuneResult", "apply_logs", "curves", "merge", "target_key"]


def __getattr__(name):
    """`tune` and `TuneResult`, imported when first asked for: autotune.py is a client of the pipeline
    (tasks.py runs it), and pipeline.py imports apply.py from this package, so importing them here
    would import the pipeline back into itself."""
    if name in ("tune", "TuneResult"):
        import importlib

        module = importlib.import_module(".autotune", __name__)
        globals().update(tune=module.tune, TuneResult=module.TuneResult)  # the function, not the module
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
