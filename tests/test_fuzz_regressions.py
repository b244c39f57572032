"""Replays every shrunk fuzz failure saved under tests/regressions/ (scripts/fuzz.py
--save-regressions writes them): the spec is rebuilt, run unfused / stock / tvmfuse, and compared.

A file's "xfail" (a reason) marks a failure that is known and not fixed yet: strict, so a fix shows.
"""
import glob
import json
import os

import pytest

from tvmfuse.fuzz import check_spec

FILES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "regressions", "*.json")))


def _case(path):
    with open(path) as f:
        doc = json.load(f)
    marks = [pytest.mark.xfail(strict=True, reason=doc["xfail"])] if doc.get("xfail") else []
    return pytest.param(doc, id=os.path.basename(path)[:-5], marks=marks)


@pytest.mark.parametrize("doc", [_case(p) for p in FILES])
def test_saved_fuzz_failure_stays_fixed(doc):
    out = check_spec(doc["spec"])
    assert out.ok, f"{doc['id']} ({doc['found_by']}; originally: {doc['failure']}): now {out}"
