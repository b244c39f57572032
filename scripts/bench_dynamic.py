#!/usr/bin/env python
"""BERT or GPT-2 with a symbolic sequence, built once, against static builds and torch.compile(dynamic=True)
(see tvmfuse/bench/dynamic.py; the same as `scripts/bench.py --dynamic`)."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if __name__ == "__main__":
    from tvmfuse.bench import dynamic as bench_dynamic

    sys.exit(bench_dynamic.main())
