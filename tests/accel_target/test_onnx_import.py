"""What from_onnx fills in where TVM's ONNX importer fails (accel_target/onnx_quant.py): shapes
that the graph computes from fixed sizes, and ConstantOfShape of a scalar. References: numpy.
(Whole models exported so: tests/models/test_hf_zoo.py.)"""

import numpy as np
import pytest
import tvm
from tvm import relax

import accel_target
from tests.helpers import float_onnx_model

onnx = pytest.importorskip("onnx")
helper, TensorProto = onnx.helper, onnx.TensorProto


def _run(model, *inputs, shape_dict=None) -> np.ndarray:
    vm = relax.VirtualMachine(accel_target.build(accel_target.from_onnx(model, shape_dict)), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()


@pytest.mark.parametrize("shape", [[], [2, 3]])
def test_constant_of_shape_fills_any_shape_a_scalar_too(shape):
    value = helper.make_tensor("value", TensorProto.FLOAT, [1], [2.5])
    given = helper.make_tensor("s", TensorProto.INT64, [len(shape)], shape)
    model = float_onnx_model(
        [
            helper.make_node("Constant", [], ["s"], value=given),
            helper.make_node("ConstantOfShape", ["s"], ["c"], value=value),
            helper.make_node("Add", ["x", "c"], ["y"]),
        ],
        {"x": shape},
        {"y": shape},
    )
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    np.testing.assert_array_equal(_run(model, x), x + np.float32(2.5))


@pytest.mark.parametrize("sizes", ["in the model", "in shape_dict"])
def test_a_reshape_computed_from_the_input_shape_folds_at_fixed_sizes(sizes):
    """y = x.reshape(x.shape[0], x.shape[1] * x.shape[2]) through Shape, Slice, ReduceProd,
    Concat: a shape computed at run time for TVM's importer, known once the sizes are."""
    ints = lambda name, values: onnx.numpy_helper.from_array(np.array(values, "int64"), name)  # noqa: E731
    fixed = sizes == "in the model"
    model = float_onnx_model(
        [
            helper.make_node("Shape", ["x"], ["shape"]),
            helper.make_node("Slice", ["shape", "zero", "one"], ["batch"]),
            helper.make_node("Slice", ["shape", "one", "three"], ["rest"]),
            helper.make_node("ReduceProd", ["rest"], ["flat"], keepdims=1),
            helper.make_node("Concat", ["batch", "flat"], ["new_shape"], axis=0),
            helper.make_node("Reshape", ["x", "new_shape"], ["y"]),
        ],
        {"x": [2 if fixed else "n", 4, 6]},
        {"y": [2 if fixed else "n", 24]},
        [ints("zero", [0]), ints("one", [1]), ints("three", [3])],
    )
    x = np.random.default_rng(0).standard_normal((2, 4, 6)).astype("float32")
    shape_dict = None if fixed else {"x": [2, 4, 6]}
    np.testing.assert_array_equal(_run(model, x, shape_dict=shape_dict), x.reshape(2, 24))
