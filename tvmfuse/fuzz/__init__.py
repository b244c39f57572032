"""Differential fuzzing of fusion: random graphs (gen.py and ops.py over graph.py; large.py for the
shapes the CPU rewrites take) as JSON-able specs (spec.py), built unfused, with stock fusion and
with tvmfuse fusion, and compared (check.py); the rewrites each build took (rewrites.py)."""
from .check import Outcome, check_spec, tolerance
from .gen import ALL_OPS, HypothesisSource, RandomSource, generate
from .large import generate_large
from .spec import make_inputs, spec_id, spec_ops, to_module

__all__ = ["generate", "generate_large", "RandomSource", "HypothesisSource", "ALL_OPS", "to_module", "make_inputs",
           "spec_id", "spec_ops", "check_spec", "Outcome", "tolerance"]
