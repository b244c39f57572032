"""The measuring runtime: launches, bytes moved, peak memory, latency and per-kernel profiles
(metrics), side-by-side comparison of fusion variants (compare), roofline bounds (roofline)."""
from .metrics import (KernelCounter, Measurement, bytes_moved, dynamic_launches, format_roofline, kernel_names,
                      kernel_profile, latency, measure, planned_peak, roofline_view, unplanned_peak,
                      weighted_launches)

__all__ = ["KernelCounter", "Measurement", "bytes_moved", "dynamic_launches", "format_roofline", "kernel_names",
           "kernel_profile", "latency", "measure", "planned_peak", "roofline_view", "unplanned_peak",
           "weighted_launches"]
