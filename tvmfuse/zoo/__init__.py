"""The workload zoo and the real models (tiny and full-size), one Workload type."""
