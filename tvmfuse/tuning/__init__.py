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
from .tune import TuneResult, tune

__all__ = ["tune", "TuneResult", "apply_logs", "curves", "merge", "target_key"]
