"""The model suite: 52 transformers architectures a user may bring, built offline from
their configs with random weights, each tried as a user would: imported (torch.export and ONNX),
built (fusion "tvm" and "tvmfuse"), checked against PyTorch eager, timed against ONNX Runtime,
torch eager and torch.compile (with and without freezing), and run through
torch.compile(backend="tvmfuse").

  archs     the table: encoders, decoders, encoder-decoders (encoder + one decoder step), vision
            transformers, hierarchical/windowed vision, CNNs (depthwise, squeeze-excitation, SiLU),
            audio encoders, small LLMs (GQA, RoPE, SwiGLU); a tiny and a full size of each
  runner    one model, every stage, one row (`python -m tvmfuse.suite.runner NAME --out ROW.json`)
  process   one process per model with a time limit: a crash or hang costs one row
  summary   pass rate per stage, geometric means, machine record; JSON and markdown

Weights: the model's own `_init_weights` (transformers' post_init: normal(0, initializer_range)),
then constant parameters spread by 2% and BatchNorm statistics randomised (archs._spread, as
tvmfuse.models does); every row checks it (row["init"]: no denormal activation anywhere, the
output's magnitude). CLI: scripts/suite.py; CI: tests/test_suite_tiny.py.
"""
