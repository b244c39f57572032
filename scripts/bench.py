#!/usr/bin/env python
"""Benchmark the zoo side by side (see tvmfuse/bench/cli.py; the same as `tvmfuse bench`)."""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    from tvmfuse.bench import cli as bench_cli

    bench_cli.quiet_runtimes()
    ap = argparse.ArgumentParser(description=bench_cli.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_cli.add_arguments(ap)
    return bench_cli.run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
