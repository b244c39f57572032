"""The ONNX Runtime baselines compute what the zoo workloads compute (else a ratio means nothing)."""
import numpy as np
import pytest

from tvmfuse import baselines, workloads

from conftest import assert_matches

pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("name", workloads.names())
def test_onnx_baseline_matches_the_reference(name):
    w = workloads.get(name)
    if baselines.onnx_model(w) is None:
        pytest.skip(f"{name} has no ONNX form (a training step)")
    x = w.inputs()
    assert_matches(baselines.OrtRunner(w, threads=1)(*x), w.reference(*x), 1e-3, 1e-4)


def test_workload_without_onnx_form_is_refused_clearly():
    with pytest.raises(ValueError, match="no ONNX form"):
        baselines.OrtRunner(workloads.get("linear_regression_step"), threads=1)


@pytest.mark.parametrize("name", workloads.names())
def test_torch_baseline_matches_the_reference(name):
    pytest.importorskip("torch")
    w = workloads.get(name)
    x = w.inputs()
    assert_matches(baselines.TorchRunner(w, threads=1)(*x), w.reference(*x), 1e-3, 1e-4)
