"""Quantized ONNX files as a new user makes them, for the tests (tests/models/test_quantized.py)
and the benchmark (benchmarks/bench_int8.py): a torch model exported to ONNX and quantized with
ONNX Runtime's ``quantize_static`` (QDQ format, per-channel int8 weights, uint8 activations,
random calibration data)."""

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static


class RandomData(CalibrationDataReader):
    """`count` calibration batches of standard normal float32 data of `shape`, as input "x"."""

    def __init__(self, shape, count=8):
        rng = np.random.default_rng(1)
        self.batches = iter([{"x": rng.standard_normal(shape).astype("float32")} for _ in range(count)])

    def get_next(self):
        return next(self.batches, None)


def quantized_onnx(model, shape, path, reduce_range=True, count=8, **options) -> str:
    """`model` exported to ONNX (path / "float.onnx", input "x" of `shape`) and quantized as a new
    user would (QDQ, per-channel int8 weights, uint8 activations, `count` batches of random
    calibration; `options`: more of quantize_static's); the path of the quantized file
    (path / "qdq.onnx")."""
    float_path = str(path / "float.onnx")
    torch.onnx.export(model, (torch.randn(*shape),), float_path, dynamo=False, input_names=["x"])
    quantized = str(path / "qdq.onnx")
    quantize_static(
        float_path,
        quantized,
        RandomData(shape, count),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        reduce_range=reduce_range,
        weight_type=QuantType.QInt8,
        activation_type=QuantType.QUInt8,
        **options,
    )
    return quantized


def output_scale(path) -> float | None:
    """The scale of the DequantizeLinear that gives the model's output; None when another op
    gives it (a float output: a layer norm's)."""
    model = onnx.load(path)
    last = next(n for n in model.graph.node if n.output[0] == model.graph.output[0].name)
    if last.op_type != "DequantizeLinear":
        return None
    initializers = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return float(initializers[last.input[1]])
