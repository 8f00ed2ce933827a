"""ONNX models with symbolic input dims (dim_param): from_onnx keeps them, one build runs at
every size against ONNX Runtime with every conv and matmul on an accel kernel, and a saved
model's signature names them, so that a call of a size it does not allow is a clear error."""

import json

import numpy as np
import onnx
import onnxruntime
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm import relax

import accel_target
from accel_target.runtime import deploy
from tests.helpers import assert_close, float_onnx_model

COVERED = {"relax.nn.conv2d", "relax.matmul"}
RNG = np.random.default_rng(0)


def _weight(name, *shape):
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.2).astype("float32"), name)


def cnn(batch="N", size: int = 16) -> onnx.ModelProto:
    """Strided conv + bias + ReLU, depthwise conv, global pooling, Gemm head on [batch, 3,
    size, size] images; `batch` an int or a dim_param."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], group=16),
        helper.make_node("GlobalAveragePool", ["c2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], transB=1),
    ]
    weights = [_weight("w1", 16, 3, 3, 3), _weight("b1", 16), _weight("w2", 16, 1, 3, 3), _weight("w3", 10, 16)]
    return float_onnx_model(nodes, {"x": [batch, 3, size, size]}, {"y": [batch, 10]}, [*weights, _weight("b3", 10)])


def attention() -> onnx.ModelProto:
    """One attention head and an output projection, an additive mask as a second input:
    x [batch, seq, 16], mask [batch, seq, seq] (both dims shared by the two inputs)."""
    scale = numpy_helper.from_array(np.array(0.25, "float32"), "scale")
    nodes = [
        *[helper.make_node("MatMul", ["x", f"w{p}"], [p]) for p in "qkv"],
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Add", ["ss", "mask"], ["sm"]),
        helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["a"]),
        helper.make_node("MatMul", ["a", "wo"], ["y"]),
    ]
    weights = [_weight(f"w{p}", 16, 16) for p in "qkvo"] + [scale]
    inputs = {"x": ["batch", "seq", 16], "mask": ["batch", "seq", "seq"]}
    return float_onnx_model(nodes, inputs, {"y": ["batch", "seq", 16]}, weights)


def _onnxruntime(model: onnx.ModelProto, feed: dict) -> np.ndarray:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


def _assert_all_on_accel(executable) -> None:
    rows = [r for r in accel_target.report(executable).rows if r.op in COVERED]
    assert rows and all(r.kind == "accel" for r in rows), [(r.op, r.inputs, r.reason) for r in rows]


def _symbolic(param) -> list:
    """A parameter's shape: ints, and the names of its shape variables."""
    return [int(d) if isinstance(d, tvm.tirx.IntImm) else d.name for d in param.ty.shape]


# --- import ---------------------------------------------------------------------------


def test_dim_params_stay_symbolic_and_shared():
    x, mask = accel_target.from_onnx(attention())["main"].params
    assert _symbolic(x) == ["batch", "seq", 16] and _symbolic(mask) == ["batch", "seq", "seq"]
    assert x.ty.shape[0].same_as(mask.ty.shape[0]) and mask.ty.shape[1].same_as(mask.ty.shape[2])


def test_unnamed_dims_get_a_variable_each():
    """TVM's importer makes every dim without size or name one variable (``[?, ?, 8]`` would
    take only equal sizes): from_onnx names each, and the model runs at unequal ones."""
    model = float_onnx_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": [None, None, 8]}, {"y": []}, [])
    model.graph.initializer.append(_weight("w", 8, 4))
    mod = accel_target.from_onnx(model)
    assert _symbolic(mod["main"].params[0]) == ["x_dim0", "x_dim1", 8]
    assert not model.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # the caller's model untouched
    executable = accel_target.build(mod)
    _assert_all_on_accel(executable)
    x = RNG.standard_normal((2, 5, 8)).astype("float32")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    assert_close(vm["main"](tvm.runtime.tensor(x)).numpy(), _onnxruntime(model, {"x": x}))


def test_shape_dict_fixes_symbolic_dims():
    (x,) = accel_target.from_onnx(cnn(), {"x": np.array([4, 3, 16, 16])})["main"].params
    assert _symbolic(x) == [4, 3, 16, 16]


# (shape_dict, words of the error)
SHAPE_DICT_ERRORS = [
    ({"y": [1, 3, 16, 16]}, ["shape_dict names 'y'", "its inputs: x"]),
    ({"x": [1, 3, 16]}, ["3 dims [1, 3, 16]", "the model's has 4: [N, 3, 16, 16]"]),
    ({"x": [1, 4, 16, 16]}, ["fixes its dim 1 at 3", "only its symbolic dims"]),
    ({"x": [0, 3, 16, 16]}, ["[0, 3, 16, 16]", "positive ints"]),
]


@pytest.mark.parametrize("shape_dict,words", SHAPE_DICT_ERRORS, ids=range(len(SHAPE_DICT_ERRORS)))
def test_shape_dict_errors(shape_dict, words):
    with pytest.raises(ValueError) as err:
        accel_target.from_onnx(cnn(), shape_dict)
    for word in words:
        assert word in str(err.value)


# --- one build, every size ----------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each model built once, saved with its signature and loaded back: (onnx model, loaded)."""
    d = tmp_path_factory.mktemp("symbolic_onnx")
    models = {}
    for name, make in [("cnn", cnn), ("attention", attention)]:
        model = make()
        executable = accel_target.build(accel_target.from_onnx(model))
        _assert_all_on_accel(executable)
        accel_target.save(executable, d / f"{name}.so")
        models[name] = (model, accel_target.load(d / f"{name}.so"))
    return models


def test_signature_names_the_symbolic_dims(saved):
    assert saved["cnn"][1].inputs == [deploy.TensorSpec("x", ("N", 3, 16, 16), "float32")]
    library = saved["attention"][1].library
    with open(library + ".json") as f:
        inputs = json.load(f)["inputs"]
    assert [i["shape"] for i in inputs] == [["batch", "seq", 16], ["batch", "seq", "seq"]]
    assert deploy.read_signature(library)["inputs"] == deploy.executable_inputs(tvm.runtime.load_module(library))


@pytest.mark.parametrize("batch", [1, 2, 7])  # 1, and a prime
def test_cnn_at_each_batch(saved, batch):
    model, loaded = saved["cnn"]
    x = RNG.standard_normal((batch, 3, 16, 16)).astype("float32")
    assert_close(loaded(x).numpy(), _onnxruntime(model, {"x": x}))


@pytest.mark.parametrize("batch,seq", [(1, 1), (1, 16), (2, 13), (3, 37)])  # 1s, primes
def test_attention_at_each_size(saved, batch, seq):
    model, loaded = saved["attention"]
    x = RNG.standard_normal((batch, seq, 16)).astype("float32")
    mask = np.where(RNG.random((batch, seq, seq)) < 0.2, -1e4, 0).astype("float32")
    assert_close(loaded(x, mask).numpy(), _onnxruntime(model, {"x": x, "mask": mask}))


# --- sizes the signature does not allow -----------------------------------------------------


def _zeros(*shape, dtype="float32"):
    return np.zeros(shape, dtype)


# (model, inputs, words of the error)
BAD_CALLS = [
    # a rank, a fixed dim, a dtype
    (
        "cnn",
        [_zeros(3, 16, 16)],
        ["input 0 (x)", "[N, 3, 16, 16] (N: any size from 1)", "3 dimensions, the model takes 4"],
    ),
    ("cnn", [_zeros(2, 3, 16, 15)], ["given [2, 3, 16, 15]", "dimension 3 is 15; the model fixes it at 16"]),
    ("cnn", [_zeros(2, 16, 16, 3)], ["dimension 1 is 16; the model fixes it at 3", "layout mismatch"]),
    ("cnn", [_zeros(2, 3, 16, 16, dtype="float64")], ["input 0 (x): expected dtype float32, given float64"]),
    # a symbolic dim of size 0 (the signature allows sizes from 1)
    ("cnn", [_zeros(0, 3, 16, 16)], ["dimension 0 (N) is 0", "takes sizes from 1"]),
    # a dim the two inputs share, of different sizes; an input missing
    (
        "attention",
        [_zeros(2, 5, 16), _zeros(3, 5, 5)],
        ["input 1 (mask)", "dimension 0 (batch) is 3, but input 0 (x) dimension 0 gave batch = 2"],
    ),
    (
        "attention",
        [_zeros(2, 5, 16), _zeros(2, 5, 6)],
        ["dimension 2 (seq) is 6, but input 0 (x) dimension 1 gave seq = 5"],
    ),
    (
        "attention",
        [_zeros(2, 5, 16)],
        ["takes 2 input(s) (x: float32 [batch, seq, 16], mask: float32 [batch, seq, seq])"],
    ),
]


@pytest.mark.parametrize("name,inputs,words", BAD_CALLS, ids=range(len(BAD_CALLS)))
def test_sizes_the_signature_does_not_allow(saved, name, inputs, words):
    with pytest.raises(ValueError) as err:
        saved[name][1](*inputs)
    for word in words:
        assert word in str(err.value)
