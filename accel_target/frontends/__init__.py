"""Model import: PyTorch (torch.export: accel_target/frontends/pytorch.py; torch.compile:
accel_target/frontends/dynamo.py) and ONNX (accel_target/frontends/onnx.py), with errors that
say what is wrong; `load_model` reads a model file by its suffix (the CLI's way in)."""

from __future__ import annotations

import os

import tvm

from .errors import UnsupportedModelError
from .onnx import from_onnx
from .pytorch import from_exported_program_file, from_torch

MODEL_SUFFIXES = {".onnx": "ONNX", ".pt2": "torch.export program"}


def load_model(path) -> tvm.IRModule:
    """Import a model file by its suffix: .onnx (ONNX) or .pt2 (torch.export.save, a
    PT2E-quantized program too)."""
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix == ".onnx":
        return from_onnx(path)
    if suffix == ".pt2":
        return from_exported_program_file(path)
    known = ", ".join(f"{k} ({v})" for k, v in MODEL_SUFFIXES.items())
    raise ValueError(f"accel: cannot tell the format of {os.fspath(path)!r}; supported: {known}")


__all__ = [
    "MODEL_SUFFIXES",
    "UnsupportedModelError",
    "from_exported_program_file",
    "from_onnx",
    "from_torch",
    "load_model",
]
