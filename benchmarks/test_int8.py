"""Quantized models at batch 1: the models of tests/models/classic.py exported to ONNX and quantized
with ONNX Runtime's quantize_static as a user would (tests/models/quantized_onnx.py: QDQ,
per-channel int8 weights, uint8 activations, 7-bit weights (reduce_range) so that ONNX Runtime's
u8s8 kernels do not saturate on a CPU without VNNI, random calibration data; BERT: its MatMul and
Gemm layers only). accel (``from_onnx`` of the QDQ file) against ONNX Runtime on the same file,
both fed NCHW."""

import functools

import pytest
from contenders import Case

from tests.models import classic
from tests.models.classic import MODELS, make


def _model(name: str):
    model, x = make(name)
    return model, (x,)


CASES = [
    Case(
        name,
        functools.partial(_model, name),
        quantize=("MatMul", "Gemm") if name.startswith("bert") else (),
        source=classic.__file__,
    )
    for name in MODELS
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_int8(measure, case):
    measure(case)
