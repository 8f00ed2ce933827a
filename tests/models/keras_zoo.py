"""Keras applications as tf2onnx exports them, without TensorFlow: committed skeletons, seeded weights.

A skeleton (tests/models/keras/NAME.onnx) is tf2onnx's graph of ``keras.applications.NAME``
(NHWC input ``input`` [1, SIZE, SIZE, 3], opset 17) with the data of every weight removed: each
such initializer keeps its name, dims and dtype, and its doc_string says ``STRIPPED``. The
graph's own constants stay as they are: an initializer of at most ``KEEP`` values (a clip bound,
an epsilon, a mean per colour, a shape, pads) or of an integer type. A few hundred kilobytes
each instead of tens of megabytes.

``load(name)`` fills the weights with seeded random values, scaled by their role so that the
activations stay finite and far from zero through some fifty layers: a Conv or MatMul weight
He-normal (variance 2 / fan-in), a bias or shift (Add, Sub) N(0, 0.1), a scale (Mul, Div, a
folded batch norm's) U(0.5, 1.5). ``example_input(name)`` is the input the application
expects: raw pixels in [0, 255] for those whose preprocessing is a layer of the model.

tests/models/make_keras_skeletons.py regenerates the skeletons (in a TensorFlow virtualenv);
it imports this module for the table and `strip`, so this module needs only numpy and onnx.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

FOLDER = Path(__file__).parent / "keras"
SIZE = 64  # input height and width
KEEP = 8  # an initializer of at most this many values is a constant of the graph: kept
STRIPPED = "STRIPPED by tests/models/keras_zoo.py: fill with keras_zoo.fill"


@dataclass(frozen=True)
class KerasApp:
    """One Keras application of the zoo."""

    family: str  # a few words: what kind of network it is
    raw_pixels: bool = False  # its preprocessing (Rescaling, Normalization) is in the model


KERAS = {
    "MobileNetV2": KerasApp("CNN: inverted residuals, depthwise, ReLU6"),
    "MobileNetV3Small": KerasApp("CNN: depthwise, squeeze-excite, hard swish", raw_pixels=True),
    "EfficientNetB0": KerasApp("CNN: depthwise, squeeze-excite, swish", raw_pixels=True),
    "ResNet50": KerasApp("CNN: bottlenecks, batch norm folded into the convs"),
    "DenseNet121": KerasApp("CNN: dense blocks (concatenations), batch norm as Mul/Add"),
    "ConvNeXtTiny": KerasApp("CNN: depthwise 7x7, layer norm and MLP over NHWC", raw_pixels=True),
    "NASNetMobile": KerasApp("CNN: searched cells of separable convs, pools and concatenations"),
}


def path(name: str) -> Path:
    return FOLDER / f"{name}.onnx"


def _is_weight(tensor) -> bool:
    """A float initializer of more than KEEP values."""
    from onnx import TensorProto

    floating = tensor.data_type in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16)
    return floating and int(np.prod(tensor.dims)) > KEEP


def strip(model):
    """`model` (an onnx.ModelProto, changed in place and returned) with the data of every weight
    removed: name, dims and dtype kept, `STRIPPED` in the doc_string."""
    for tensor in model.graph.initializer:
        if _is_weight(tensor):
            for field in ("raw_data", "float_data", "double_data", "int32_data"):
                tensor.ClearField(field)
            tensor.doc_string = STRIPPED
    return model


def _roles(graph) -> dict[str, tuple[str, int]]:
    """initializer name -> (op type, input index) of its first consumer."""
    roles: dict[str, tuple[str, int]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            roles.setdefault(name, (node.op_type, index))
    return roles


def _random(role: tuple[str, int], shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Values for a weight of `shape` used as input `role[1]` of a `role[0]` node."""
    op, index = role
    if op == "Conv" and index == 1:  # [out, in / groups, kh, kw]
        return rng.normal(0.0, np.sqrt(2.0 / np.prod(shape[1:])), shape)
    if op in ("MatMul", "Gemm") and index == 1 and len(shape) == 2:  # [in, out]
        return rng.normal(0.0, np.sqrt(2.0 / shape[0]), shape)
    if op in ("Mul", "Div"):
        return rng.uniform(0.5, 1.5, shape)
    return rng.normal(0.0, 0.1, shape)  # a bias, a shift


def fill(model, seed: int = 0):
    """`model`, a skeleton (changed in place and returned), with every stripped initializer
    given seeded random values (see the module's docstring)."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(seed)
    roles = _roles(model.graph)
    for tensor in model.graph.initializer:
        if tensor.doc_string != STRIPPED:
            continue
        if tensor.name not in roles:
            raise ValueError(f"keras_zoo: weight {tensor.name!r} feeds no node")
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        values = _random(roles[tensor.name], tuple(tensor.dims), rng).astype(dtype)
        tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))
    return model


def load(name: str, seed: int = 0):
    """The Keras application `name` (a key of KERAS) as an onnx.ModelProto: its committed
    skeleton, filled with seeded random weights."""
    import onnx

    if name not in KERAS:
        raise KeyError(f"keras_zoo: no application {name!r}; the zoo has {', '.join(KERAS)}")
    return fill(onnx.load(path(name)), seed)


def example_input(name: str, seed: int = 0) -> np.ndarray:
    """A seeded NHWC input [1, SIZE, SIZE, 3] for `name`: pixels in [0, 255] for an application
    that rescales its input itself, else N(0, 1)."""
    rng = np.random.default_rng(seed)
    shape = (1, SIZE, SIZE, 3)
    x = rng.uniform(0.0, 255.0, shape) if KERAS[name].raw_pixels else rng.normal(0.0, 1.0, shape)
    return x.astype("float32")
