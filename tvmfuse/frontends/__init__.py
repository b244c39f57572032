"""Frontends: models in, Relax out.

  from_torch(module, example_inputs, dynamic_shapes=None)   PyTorch eager, captured by torch.export
  from_onnx(path_or_model, shapes=None)                     ONNX files or ModelProtos
  from_relay_text(text_or_path)                             TVM Relay's text format (<= 0.19)

Each importer returns a normalized Relax IRModule (see common.normalize) and raises
tvmfuse.errors.FrontendError, naming what failed, where and how to fix it.
"""
from .from_onnx import from_onnx
from .from_torch import from_torch

from .relay_text import from_relay_text

__all__ = ["from_torch", "from_onnx", "from_relay_text"]
