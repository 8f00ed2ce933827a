"""What from_onnx fills in where TVM's ONNX importer fails (accel_target/onnx_quant.py): shapes
that the graph computes from fixed sizes, ConstantOfShape of a scalar, Resize's coordinates at
scales whose products are not whole (onnx_resize.py). References: numpy, onnx's reference
evaluator. (Whole models exported so: tests/models/test_hf_zoo.py.)"""

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


def _resize_model(scales: list[float], shape: list[int], **attributes):
    out = [int(np.floor(n * s)) for n, s in zip(shape, scales)]
    scale_tensor = helper.make_tensor("scales", TensorProto.FLOAT, [len(scales)], scales)
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], **attributes)
    return float_onnx_model([node], {"x": shape}, {"y": out}, initializers=[scale_tensor])


RESIZES = [
    ("nearest", "asymmetric", "floor"),
    ("nearest", "half_pixel", "round_prefer_floor"),
    ("nearest", "pytorch_half_pixel", "round_prefer_ceil"),
    ("nearest", "asymmetric", "ceil"),
    ("linear", "pytorch_half_pixel", None),
    ("linear", "half_pixel", None),
    ("linear", "asymmetric", None),
]


@pytest.mark.parametrize("mode, coordinates, nearest", RESIZES, ids=["-".join(filter(None, r)) for r in RESIZES])
@pytest.mark.parametrize("scales", [[1, 1, 1.75, 2.25], [1, 1, 0.625, 0.375]], ids=["up", "down"])
def test_resize_at_scales_whose_products_are_not_whole_maps_coordinates_as_onnx(mode, coordinates, nearest, scales):
    """TVM's converter mapped coordinates by in / out sizes where ONNX divides by the scale.
    (Scales exact in binary: no coordinate falls within float32's rounding of a bound, where
    onnx's reference, in float64, and float32 runtimes part.)"""
    from onnx.reference import ReferenceEvaluator

    attributes = {"mode": mode, "coordinate_transformation_mode": coordinates}
    model = _resize_model(scales, [1, 2, 9, 7], **attributes, **({"nearest_mode": nearest} if nearest else {}))
    x = np.random.default_rng(0).standard_normal([1, 2, 9, 7]).astype("float32")
    np.testing.assert_allclose(_run(model, x), ReferenceEvaluator(model).run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_antialias_when_upscaling_is_the_plain_resize(mode):
    """antialias filters only a downscaling: upscaled, the plain resize (ONNX's reference)."""
    from onnx.reference import ReferenceEvaluator

    model = _resize_model([1, 1, 2, 1.5], [1, 2, 5, 6], mode=mode, antialias=1)
    model.opset_import[0].version = 18
    x = np.random.default_rng(0).standard_normal([1, 2, 5, 6]).astype("float32")
    np.testing.assert_allclose(_run(model, x), ReferenceEvaluator(model).run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode, align_corners", [("nearest", None), ("bilinear", False), ("bilinear", True)])
def test_pytorch_interpolate_by_a_scale_factor_exported_to_onnx_matches_pytorch(mode, align_corners):
    """F.interpolate(scale_factor=1.7) exported: Resize with nearest/asymmetric/floor,
    linear/pytorch_half_pixel or linear/align_corners (from the sizes: TVM's converter)."""
    import io

    import torch

    class Interpolate(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.interpolate(x, scale_factor=1.7, mode=mode, align_corners=align_corners)

    x = torch.randn(1, 2, 5, 6)
    exported = io.BytesIO()
    torch.onnx.export(Interpolate(), (x,), exported, dynamo=False, opset_version=17)
    ours = _run(onnx.load_from_string(exported.getvalue()), x.numpy())
    np.testing.assert_allclose(ours, Interpolate()(x).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "attributes, match",
    [
        ({"mode": "cubic"}, "mode='cubic' with scales .*1.7"),
        ({"mode": "linear", "antialias": 1, "scales": [1, 1, 1.7, 0.5]}, "antialias=1 when downscaling"),
        ({"mode": "linear", "keep_aspect_ratio_policy": "not_larger"}, "keep_aspect_ratio_policy=not_larger"),
    ],
    ids=["cubic", "antialias", "aspect-ratio"],
)
def test_a_resize_tvm_would_compute_otherwise_is_refused_by_name(attributes, match):
    scales = attributes.pop("scales", [1, 1, 1.7, 2.3])
    model = _resize_model(scales, [1, 2, 9, 7], **attributes)
    model.opset_import[0].version = 18
    with pytest.raises(accel_target.frontends.UnsupportedModelError, match=match):
        accel_target.from_onnx(model)


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_celu_matches_onnx_reference(alpha):
    """Celu (F.celu exported), which TVM's frontend does not convert."""
    from onnx.reference import ReferenceEvaluator

    node = helper.make_node("Celu", ["x"], ["y"], alpha=alpha)
    model = float_onnx_model([node], {"x": [2, 9]}, {"y": [2, 9]})
    x = np.linspace(-6, 3, 18, dtype="float32").reshape(2, 9)
    np.testing.assert_allclose(_run(model, x), ReferenceEvaluator(model).run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


_NAN, _INF = np.nan, np.inf
_EDGES = np.array([[1.0, -2.0, 0.0, -0.0, _NAN, _INF], [-_INF, 2.5, -2.5, 0.5, 1.5, -0.5]], "float32")
_TIES = np.array([[3.0, 1.0, 3.0, 0.0, 3.0, 1.0], [_NAN, 1.0, _NAN, 2.0, 0.0, 2.0]], "float32")
_K3 = onnx.numpy_helper.from_array(np.array([3], "int64"), "k")
_DEPTH = onnx.numpy_helper.from_array(np.array(4, "int64"), "d")
_VALUES = onnx.numpy_helper.from_array(np.array([0.5, 2.0], "float32"), "v")  # TVM's gave float64


def _typed_model(node, x: np.ndarray, outputs: dict, initializers=()):
    """One node of input x, outputs {name: TensorProto type}, shapes left to shape inference."""
    value = lambda name, kind: helper.make_tensor_value_info(name, kind, None)  # noqa: E731
    kind = TensorProto.FLOAT if x.dtype == np.float32 else TensorProto.INT64
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", kind, x.shape)], [], list(initializers))
    graph.output.extend(value(n, t) for n, t in outputs.items())
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    for output, known in zip(model.graph.output, inferred.graph.output, strict=True):
        output.CopyFrom(known)
    return model


@pytest.mark.parametrize(
    "node, x, outputs, initializers",
    [
        # NaN above every number, equal values in index order (TVM's: a NaN anywhere)
        (helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1), _TIES, {"v": 1, "i": 7}, [_K3]),
        (helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=0), _TIES, {"v": 1, "i": 7}, [_K3]),
        (helper.make_node("Sign", ["x"], ["y"]), _EDGES, {"y": 1}, []),  # NaN (TVM's: 0)
        (helper.make_node("IsInf", ["x"], ["y"], detect_positive=0), _EDGES, {"y": 9}, []),  # (TVM's: both)
        (helper.make_node("IsInf", ["x"], ["y"], detect_negative=0), _EDGES, {"y": 9}, []),
        (helper.make_node("ThresholdedRelu", ["x"], ["y"], alpha=0.5), _EDGES, {"y": 1}, []),  # -inf: 0 (NaN)
        (
            helper.make_node("OneHot", ["x", "d", "v"], ["y"]),
            np.array([0, -1, 3], "int64"),
            {"y": 1},
            [_DEPTH, _VALUES],
        ),
        (helper.make_node("Unique", ["x"], ["y", "i", "inv", "n"]), _TIES[:1], {"y": 1, "i": 7, "inv": 7, "n": 7}, []),
    ],
    ids=[
        "topk-nan-ties",
        "topk-smallest",
        "sign-nan",
        "isinf-negative",
        "isinf-positive",
        "thresholded-relu",
        "onehot-dtype",
        "unique-2d",
    ],
)
def test_ops_tvm_computes_otherwise_match_onnx_reference(node, x, outputs, initializers):
    """Ops TVM's ONNX frontend computes otherwise than ONNX defines them (onnx_ops.py): values
    and dtypes as onnx's reference evaluator gives them."""
    from onnx.reference import ReferenceEvaluator

    model = _typed_model(node, x, outputs, initializers)
    vm = relax.VirtualMachine(accel_target.build(accel_target.from_onnx(model)), tvm.cpu())
    ours = vm["main"](tvm.runtime.tensor(x))
    ours = [o.numpy() for o in ours] if len(outputs) > 1 else [ours.numpy()]
    for mine, theirs in zip(ours, ReferenceEvaluator(model).run(None, {"x": x}), strict=True):
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("auto_pad", ["NOTSET", "SAME_UPPER", "SAME_LOWER"])
def test_conv_transpose_to_an_output_shape_matches_pytorch_cropped_as_onnx_says(auto_pad):
    """The pads ConvTranspose's output_shape implies: the full output (15 x 15 here) less one
    row, taken from the end for SAME_UPPER, from the start otherwise (TVM's converter ignored
    output_shape: 15 x 15)."""
    import torch

    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 2, 3, 3)).astype("float32")
    node = helper.make_node(
        "ConvTranspose",
        ["x", "w"],
        ["y"],
        kernel_shape=[3, 3],
        strides=[2, 2],
        output_shape=[14, 15],
        auto_pad=auto_pad,
    )
    model = float_onnx_model([node], {"x": [1, 3, 7, 7]}, {"y": [1, 2, 14, 15]}, [onnx.numpy_helper.from_array(w, "w")])
    x = rng.standard_normal((1, 3, 7, 7)).astype("float32")
    full = torch.nn.functional.conv_transpose2d(torch.from_numpy(x), torch.from_numpy(w), stride=2).numpy()
    start = 0 if auto_pad == "SAME_UPPER" else 1
    np.testing.assert_allclose(_run(model, x), full[:, :, start : start + 14, :], rtol=1e-5, atol=1e-5)


def test_an_op_version_a_later_opset_deprecated_imports():
    """GroupNormalization-18 (scale and bias per group), which onnx's checker calls deprecated
    but exporters write and ONNX Runtime runs."""
    x = np.random.default_rng(0).standard_normal((2, 6, 4, 4)).astype("float32")
    scale, bias = np.array([1.0, 2.0, 0.5], "float32"), np.array([0.0, 1.0, -1.0], "float32")
    initializers = [onnx.numpy_helper.from_array(v, n) for n, v in (("s", scale), ("b", bias))]
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3, epsilon=1e-5)
    model = float_onnx_model([node], {"x": [2, 6, 4, 4]}, {"y": [2, 6, 4, 4]}, initializers)
    model.opset_import[0].version = 18
    groups = x.reshape(2, 3, -1)
    normal = (groups - groups.mean(-1, keepdims=True)) / np.sqrt(groups.var(-1, keepdims=True) + 1e-5)
    expected = (normal * scale[:, None] + bias[:, None]).reshape(x.shape)
    np.testing.assert_allclose(_run(model, x), expected, rtol=1e-5, atol=1e-5)
