"""The benchmark: tvmfuse's variants against ONNX Runtime, PyTorch eager, torch.compile
(default and frozen) and vanilla TVM, with roofline views."""
