"""Regenerate the Keras skeletons tests/models/keras/NAME.onnx (tests/models/keras_zoo.py says what
a skeleton is and fills it). Needs TensorFlow, which the project's environment does not have: run
it in a virtualenv of its own, from the repository's root:

    python -m venv /tmp/tfenv
    /tmp/tfenv/bin/pip install tensorflow-cpu tf2onnx onnxruntime
    /tmp/tfenv/bin/python -m tests.models.make_keras_skeletons [NAME ...]   # default: all of KERAS

For each application: ``weights=None`` (random init), ``classifier_activation=None`` (logits),
every BatchNormalization's statistics and affine randomized (tf2onnx then folds real values,
never an identity it could drop), EfficientNet's Normalization layer given the ImageNet mean and
variance (unadapted it is the identity), exported by tf2onnx at opset 17 with an NHWC input
``input`` [1, SIZE, SIZE, 3]. The export is checked against Keras with ONNX Runtime (with its
weights still in) before `keras_zoo.strip` removes them. The versions of TensorFlow, Keras and
tf2onnx go into the file's metadata_props.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf2onnx  # noqa: E402

from tests.models import keras_zoo  # noqa: E402

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_VARIANCE = [0.229**2, 0.224**2, 0.225**2]
TOLERANCE = 1e-4  # ONNX Runtime against Keras: max |difference| / max |Keras|


@contextlib.contextmanager
def exportable_ops():
    """While tf2onnx traces, two Keras 3 ops as plain TF ops of the same math: a depthwise Conv2D
    (groups == channels) runs through a tf.function(jit_compile=True), which reaches tf2onnx as
    an opaque StatefulPartitionedCall, and exact GELU as Erfc, which tf2onnx cannot convert
    (ConvNeXt): here they are tf.nn.depthwise_conv2d and 0.5 x (1 + erf(x / sqrt 2))."""
    from keras.src.backend.tensorflow import nn as tf_nn

    conv, gelu = tf_nn.conv, tf_nn.gelu

    def depthwise_aware_conv(inputs, kernel, strides=1, padding="valid", data_format=None, dilation_rate=1):
        layout = keras.config.image_data_format() if data_format is None else data_format
        channels = inputs.shape[-1]
        if len(inputs.shape) == 4 and layout == "channels_last" and kernel.shape[-2] == 1 and channels not in (1, None):
            if kernel.shape[-1] == channels:  # [kh, kw, 1, channels]: one filter per channel
                strides = (strides,) * 2 if isinstance(strides, int) else tuple(strides)
                dilation = (dilation_rate,) * 2 if isinstance(dilation_rate, int) else tuple(dilation_rate)
                depthwise = tf.transpose(kernel, [0, 1, 3, 2])
                return tf.nn.depthwise_conv2d(inputs, depthwise, (1, *strides, 1), padding.upper(), dilations=dilation)
        return conv(inputs, kernel, strides, padding, data_format, dilation_rate)

    def erf_gelu(x, approximate=True):
        if approximate:
            return gelu(x, approximate)
        x = tf.convert_to_tensor(x)
        return 0.5 * x * (1.0 + tf.math.erf(x / math.sqrt(2.0)))

    tf_nn.conv, tf_nn.gelu = depthwise_aware_conv, erf_gelu
    try:
        yield
    finally:
        tf_nn.conv, tf_nn.gelu = conv, gelu


def _randomize_batch_norms(model, rng: np.random.Generator) -> None:
    """Every BatchNormalization's gamma, beta, moving mean and variance random (not 1, 0, 0, 1)."""
    draw = {
        "gamma": lambda shape: rng.uniform(0.5, 1.5, shape),
        "beta": lambda shape: rng.normal(0.0, 0.1, shape),
        "moving_mean": lambda shape: rng.normal(0.0, 0.1, shape),
        "moving_variance": lambda shape: rng.uniform(0.5, 1.5, shape),
    }
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            values = []
            for weight in layer.weights:
                kind = weight.name.split("/")[-1]
                values.append(draw[kind](tuple(weight.shape)) if kind in draw else weight.numpy())
            layer.set_weights([v.astype("float32") for v in values])


def _normalize_imagenet(model) -> None:
    """EfficientNet's Normalization layer: ImageNet's mean and variance (weights=None leaves it
    unadapted: mean 0, variance 1)."""
    for layer in model.layers:
        if isinstance(layer, keras.layers.Normalization):
            mean, variance, *rest = layer.get_weights()
            layer.set_weights(
                [np.reshape(IMAGENET_MEAN, mean.shape), np.reshape(IMAGENET_VARIANCE, variance.shape)] + rest
            )


def _check_with_onnxruntime(proto, model, name: str) -> float:
    """max |ONNX Runtime - Keras| / max |Keras| on the zoo's example input; raises above TOLERANCE."""
    import onnxruntime

    x = keras_zoo.example_input(name)
    expected = np.asarray(model(x, training=False))
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    actual = session.run(None, {"input": x})[0]
    error = float(np.abs(actual - expected).max() / np.abs(expected).max())
    if not error <= TOLERANCE:
        raise AssertionError(f"{name}: tf2onnx's export differs from Keras by {error:.2e} (> {TOLERANCE})")
    return error


def export(name: str) -> onnx.ModelProto:
    """The skeleton of keras.applications.`name` (weights checked, then stripped)."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    size = keras_zoo.SIZE
    model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classifier_activation=None)
    _randomize_batch_norms(model, np.random.default_rng(0))
    if name.startswith("EfficientNet"):
        _normalize_imagenet(model)
    spec = (tf.TensorSpec((1, size, size, 3), tf.float32, name="input"),)
    with exportable_ops():
        proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=17)
    # tf2onnx leaves an op it cannot convert in the graph as it is, with a warning only
    unknown = {n.op_type for n in proto.graph.node if n.domain in ("", "ai.onnx") and not onnx.defs.has(n.op_type)}
    if unknown:
        raise RuntimeError(f"{name}: tf2onnx left ops that ONNX does not define: {', '.join(sorted(unknown))}")
    error = _check_with_onnxruntime(proto, model, name)
    versions = {"tensorflow": tf.__version__, "keras": keras.__version__, "tf2onnx": tf2onnx.__version__}
    onnx.helper.set_model_props(proto, {**versions, "application": name, "onnxruntime_vs_keras": f"{error:.1e}"})
    proto.doc_string = f"keras.applications.{name}, weights stripped: tests/models/keras_zoo.py fills them"
    return keras_zoo.strip(proto)


def main(names: list[str]) -> None:
    keras_zoo.FOLDER.mkdir(exist_ok=True)
    for name in names or keras_zoo.KERAS:
        skeleton = export(name)
        onnx.save(skeleton, keras_zoo.path(name))
        print(f"{name}: {keras_zoo.path(name)} ({os.path.getsize(keras_zoo.path(name)) // 1024} KiB)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
