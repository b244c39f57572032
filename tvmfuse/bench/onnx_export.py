"""A PyTorch module as ONNX for the ONNX Runtime peer and the suite's ONNX import:
`_export_onnx(module, arrays)` (bytes, or a file path with external weights past protobuf's 2 GiB),
`load_exported(source)` (an onnx.ModelProto of either)."""
from __future__ import annotations


class _stderr_to_devnull:
    """The exporters print whole graphs to file descriptors 1 and 2 when they fail; the reason is
    kept from the exception instead."""

    def __enter__(self):
        import os
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = [os.dup(1), os.dup(2)]
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)

    def __exit__(self, *exc):
        import os
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in zip((1, 2), self.saved):
            os.dup2(saved, fd)
            os.close(saved)
        return False


PROTOBUF_LIMIT = 2 << 30  # bytes: one serialized protobuf message at most (a model's weights inline)


def _export_onnx(module, arrays, to_file: bool | None = None) -> tuple[bytes | str | None, str]:
    """The module as ONNX: the TorchScript exporter, else the dynamo one; (None, why) when neither
    can export it. A model under PROTOBUF_LIMIT comes back as bytes; a bigger one (BLOOM-560m's
    2.2 GB of weights) is written to a file in a temporary folder with its weights as external data
    (protobuf cannot hold it in one message) and comes back as the file's path, which onnx.load and
    ONNX Runtime both take. to_file: force one way (None: by the parameters' size)."""
    import io
    import warnings

    import torch

    if to_file is None:
        to_file = sum(p.numel() * p.element_size() for p in module.parameters()) >= PROTOBUF_LIMIT * 0.95
    names = [f"input_{i}" for i in range(len(arrays))]
    errors = []
    for dynamo in (False, True):
        dest = _onnx_path() if to_file else io.BytesIO()
        try:
            with warnings.catch_warnings(), torch.no_grad(), _stderr_to_devnull():
                warnings.simplefilter("ignore")
                # the dynamo exporter writes opset 18 (converted down to 17, its Split kept
                # opset 18's num_outputs: an invalid model for ONNX Runtime)
                torch.onnx.export(module, tuple(torch.from_numpy(a) for a in arrays), dest, input_names=names,
                                  output_names=["output"], opset_version=18 if dynamo else 17, dynamo=dynamo,
                                  **({"external_data": True} if to_file and dynamo else {}))
            return (dest if to_file else dest.getvalue()), ""
        except Exception as err:  # each exporter fails in its own way; the row says how
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            errors.append(f"{'dynamo' if dynamo else 'TorchScript'} exporter: {first[:160]}")
    return None, "ONNX export failed (" + "; ".join(errors) + ")"


def _onnx_path() -> str:
    """A fresh model.onnx path in a temporary folder removed when the process exits."""
    import atexit
    import os
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="tvmfuse-onnx-")
    atexit.register(shutil.rmtree, folder, True)
    return os.path.join(folder, "model.onnx")


def load_exported(source):
    """onnx.ModelProto of what _export_onnx returned (bytes, or a path with external data)."""
    import onnx

    return onnx.load_from_string(source) if isinstance(source, bytes) else onnx.load(source)
