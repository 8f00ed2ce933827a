"""Keras applications as tf2onnx exports them (tests/models/keras_zoo.py: committed skeletons,
seeded weights) through accel_target.from_onnx and build, against ONNX Runtime on the same
model. Their input is NHWC already: the default build, with no layout argument, and no
transpose left at run time."""

import os

import numpy as np
import onnx
import pytest
import torch

import accel_target
from tests.helpers import assert_close, run_executable
from tests.models import keras_zoo
from tests.models.onnx_in_torch import OnnxGraph
from tests.models.test_hf_zoo import check_kernels, own_transposes, transpose_kernels

MAX_BYTES = 1 << 20  # a committed skeleton's size, at most
# runtime transposes, at most: tf2onnx's Transposes (NHWC <-> NCHW around each conv, or moved
# to the graph's input) all fold away into the NHWC kernels. An entry allows a model more, until
# the layout clean-up learns what it needs.
ALLOWED_TRANSPOSES: dict[str, int] = {}


def _onnxruntime(model, x: np.ndarray) -> np.ndarray:
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {session.get_inputs()[0].name: x})
    assert np.isfinite(out).all() and out.std() > 0
    return out


@pytest.mark.parametrize("name", list(keras_zoo.KERAS))
def test_keras_skeleton_is_small_and_holds_no_weight(name):
    assert os.path.getsize(keras_zoo.path(name)) < MAX_BYTES
    skeleton = onnx.load(keras_zoo.path(name))
    [x] = [i for i in skeleton.graph.input if i.name not in {t.name for t in skeleton.graph.initializer}]
    assert [d.dim_value for d in x.type.tensor_type.shape.dim] == [1, keras_zoo.SIZE, keras_zoo.SIZE, 3]
    stripped = [t for t in skeleton.graph.initializer if t.doc_string == keras_zoo.STRIPPED]
    assert len(stripped) >= sum(n.op_type == "Conv" for n in skeleton.graph.node)
    assert all(not t.raw_data and not t.float_data for t in stripped)
    # filled: every stripped initializer gets data of its dims and dtype, the same for a seed
    filled, again = keras_zoo.load(name), keras_zoo.load(name)
    onnx.checker.check_model(filled)
    for tensor, twin in zip(filled.graph.initializer, again.graph.initializer):
        array = onnx.numpy_helper.to_array(tensor)
        assert np.isfinite(array).all() and np.array_equal(array, onnx.numpy_helper.to_array(twin))
    assert [list(t.dims) for t in filled.graph.initializer] == [list(t.dims) for t in skeleton.graph.initializer]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(keras_zoo.KERAS))
def test_keras_model_builds_and_matches_onnxruntime(name):
    model, x = keras_zoo.load(name), keras_zoo.example_input(name)
    expected = _onnxruntime(model, x)
    mod = accel_target.from_onnx(model)
    executable = accel_target.build(mod)
    assert_close(run_executable(executable, x), expected)
    report = check_kernels(executable)
    assert any(r.op == "relax.nn.conv2d" for r in report.rows)
    assert own_transposes(mod) > 0  # (what is asked of the layout clean-up)
    assert report.kernels.activation_transforms <= ALLOWED_TRANSPOSES.get(name, 0), transpose_kernels(report)
    assert report.kernels.weight_transforms == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", list(keras_zoo.KERAS))
def test_keras_model_run_by_pytorch_ops_matches_onnxruntime(name):
    """onnx_in_torch.OnnxGraph, the benchmarks' PyTorch form of these models (benchmarks/zoo_models.py)."""
    model, x = keras_zoo.load(name), keras_zoo.example_input(name)
    with torch.no_grad():
        out = OnnxGraph(model).eval()(torch.from_numpy(x)).numpy()
    assert_close(out, _onnxruntime(model, x))
