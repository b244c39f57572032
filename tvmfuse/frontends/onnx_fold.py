"""Shape computations folded before TVM's ONNX importer sees them (found by the model suite).

torch.onnx.export writes shape arithmetic into the graph: TF-"same" padding computed from the input's
Shape (MobileNetV1/V2, EfficientNet: TVM 0.27 "Dynamic pads are not supported yet"), masks built with
ConstantOfShape from a computed shape (RoFormer, ConvBERT: "broadcast_to expects the input shape to
have the number of ndim at least as the input"). With every input shape static, all of it is
constant. `fold(model)` runs onnxruntime's basic graph optimizations offline (constant folding,
Shape of a static tensor, redundant-node elimination, semantics-preserving fusions such as Pad into
Conv; standard ONNX ops out, ORT_ENABLE_BASIC) and returns the optimized ModelProto; from_onnx
retries with it when TVM's importer fails on a model whose inputs are all static.
"""
from __future__ import annotations

import os
import tempfile


def static_inputs(model) -> bool:
    inits = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        if not all(d.HasField("dim_value") and d.dim_value > 0 for d in vi.type.tensor_type.shape.dim):
            return False
    return True


def fold(model):
    """`model` (onnx.ModelProto) after onnxruntime's basic optimizations, as a ModelProto."""
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="tvmfuse-onnx-") as tmp:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.optimized_model_filepath = os.path.join(tmp, "folded.onnx")
        ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return onnx.load(opts.optimized_model_filepath)
