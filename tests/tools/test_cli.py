"""accel-tvm: compile an ONNX file, load the library in a fresh process without our package,
compare with ONNX Runtime; every error case gives one line and exit 1.

Most commands run in this process, through `cli.main` with its output captured: a process of
their own would spend 3.5 s importing PyTorch and TVM each. The tests about the process itself
run in one: the console script, ``python -m accel_target`` (the module fixture's compile, an
error's exit code, --debug's traceback) and the library loaded without our package.
"""

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from accel_target.tools import cli
from tests.accel_target.test_symbolic_onnx import cnn

pytestmark = pytest.mark.slow


def accel_tvm_process(*args, cwd):
    """``python -m accel_target ARGS`` in `cwd`, a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "accel_target", *map(str, args)], cwd=cwd, capture_output=True, text=True
    )


def accel_tvm(*args, cwd):
    """accel-tvm ARGS in `cwd`, run by `cli.main` in this process; its exit code and what it
    printed, as from `accel_tvm_process`."""
    stdout, stderr, before = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = cli.main([str(a) for a in args])
            except SystemExit as exit_:  # argparse's usage errors
                code = exit_.code
    finally:
        os.chdir(before)
    return subprocess.CompletedProcess(args, code, stdout.getvalue(), stderr.getvalue())


def _onnx_cnn(path, batch=1):
    """test_symbolic_onnx's CNN on 32x32 images saved to `path`; `batch` an int or a dim_param."""
    onnx.save(cnn(batch, 32), path)
    return path


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    _onnx_cnn(d / "cnn.onnx")
    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype("float32")
    np.save(d / "x.npy", x)
    result = accel_tvm_process("compile", "cnn.onnx", "-o", "cnn.so", "--report", cwd=d)
    assert result.returncode == 0, result.stderr
    return d, result


def _onnxruntime_output(d):
    return onnxruntime.InferenceSession(str(d / "cnn.onnx")).run(None, {"x": np.load(d / "x.npy")})[0]


def test_compile_reports_and_writes_library(workdir):
    d, result = workdir
    assert (d / "cnn.so").is_file()
    kernels = [line.rsplit("  ", 1)[-1] for line in result.stdout.splitlines()]
    assert kernels.count("conv2d_nhwc_ohwi.accel") == 2 and kernels.count("dense_kn.accel") == 1
    assert "fused into conv2d_nhwc_ohwi.accel" in kernels  # the convs' bias and relu
    # none: the first conv reads the NCHW image as it is, and the model ends in a dense layer
    assert "runtime layout transforms: 0 of activations, 0 of weights" in result.stdout
    assert "[accel-tvm] building for accel" in result.stderr  # progress goes to stderr


def test_library_loads_in_fresh_process_without_our_package(workdir):
    d, _ = workdir
    code = textwrap.dedent(
        """
        import sys, numpy as np, tvm
        from tvm import relax
        vm = relax.VirtualMachine(tvm.runtime.load_module("cnn.so"), tvm.cpu())
        np.save("y_fresh.npy", vm["main"](tvm.runtime.tensor(np.load("x.npy"))).numpy())
        assert not any(m.split(".")[0] in ("accel_target", "strategy", "topi_accel") for m in sys.modules)
        """
    )
    subprocess.run([sys.executable, "-c", code], cwd=d, check=True)
    reference = _onnxruntime_output(d)
    np.testing.assert_allclose(np.load(d / "y_fresh.npy"), reference, rtol=1e-4, atol=1e-5)


def test_run_command(workdir):
    d, _ = workdir
    result = accel_tvm("run", "cnn.so", "--input", "x.npy", "--output", "y.npy", "--repeat", "3", cwd=d)
    assert result.returncode == 0, result.stderr
    assert "outputs: [1, 10]" in result.stdout and "ms per run" in result.stdout
    reference = _onnxruntime_output(d)
    np.testing.assert_allclose(np.load(d / "y.npy"), reference, rtol=1e-4, atol=1e-5)
    data = json.loads(accel_tvm("run", "cnn.so", "--input", "x.npy", "--json", cwd=d).stdout)
    assert data["outputs"] == [[1, 10]] and data["ms"] > 0


def _tensor_constants(library) -> int:
    """Tensors in the constant pool of a saved executable (its stats list a tensor by its
    shape, "[1, 3, 3, 16]", and a shape constant as "shapetuple[...]")."""
    stats = relax.VMExecutable(tvm.runtime.load_module(str(library))).stats()
    pool = next(line for line in stats.splitlines() if "Constant pool" in line)
    return len(re.findall(r"(?<![a-z])\[\d+(?:, \d+)*\]", pool))


def test_compile_with_separate_weights(workdir):
    d, _ = workdir
    result = accel_tvm("compile", "cnn.onnx", "-o", "sep.so", "--weights", "separate", "--json", cwd=d)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["files"] == ["sep.so", "sep.so.params"]
    # the weights left the library: its constant pool keeps shapes and strings, no tensors
    assert _tensor_constants(d / "cnn.so") >= 3 and _tensor_constants(d / "sep.so") == 0
    assert accel_tvm("run", "sep.so", "--input", "x.npy", "--output", "y_sep.npy", cwd=d).returncode == 0
    reference = _onnxruntime_output(d)
    np.testing.assert_allclose(np.load(d / "y_sep.npy"), reference, rtol=1e-4, atol=1e-5)


def test_report_json(workdir):
    d, _ = workdir
    result = accel_tvm("report", "cnn.onnx", "--input-layout", "NHWC", "--json", cwd=d)
    data = json.loads(result.stdout)
    kinds = {(op["op"], op["kind"]) for op in data["ops"]}
    assert ("relax.nn.conv2d", "accel") in kinds and ("relax.matmul", "accel") in kinds
    assert data["runtime"]["activation_transforms"] == 0 and data["runtime"]["weight_transforms"] == 0


def test_bench_table_and_plot(workdir):
    d, _ = workdir
    result = accel_tvm("bench", "cnn.onnx", "--vs", "tvm,onnxruntime", "--repeat", "3", "--plot", "bench.png", cwd=d)
    assert result.returncode == 0, result.stderr
    assert "accel" in result.stdout and "stock TVM" in result.stdout and "ONNX Runtime" in result.stdout
    assert "threads each" in result.stdout
    assert (d / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_tune_then_bench_with_and_without_the_tuned_configs(workdir):
    d, _ = workdir
    result = accel_tvm("tune", "cnn.onnx", "--db", "tuned.json", "--limit", "2", "--json", cwd=d)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["entries"] >= 1
    assert "accel-tvm bench cnn.onnx --vs '' --tuning-db tuned.json" in result.stderr
    result = accel_tvm("bench", "cnn.onnx", "--vs", "", "--tuning-db", "tuned.json", "--repeat", "3", "--json", cwd=d)
    assert result.returncode == 0, result.stderr
    rows = {r["runtime"]: r for r in json.loads(result.stdout)["results"]}
    assert sorted(rows) == ["accel", "accel, tuned"]
    assert rows["accel, tuned"]["ms"] > 0 and rows["accel, tuned"]["accel_speedup"] > 0
    missing = accel_tvm("bench", "cnn.onnx", "--vs", "", "--tuning-db", "nothere.json", cwd=d)
    _error(missing, "nothere.json", "does not exist")


def test_torch_export_program(tmp_path):
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4)
    ).eval()
    x = torch.randn(1, 3, 8, 8)
    torch.export.save(torch.export.export(model, (x,)), tmp_path / "m.pt2")
    np.save(tmp_path / "x.npy", x.numpy())
    assert accel_tvm("compile", "m.pt2", "-o", "m.so", cwd=tmp_path).returncode == 0
    assert accel_tvm("run", "m.so", "--input", "x.npy", "--output", "y.npy", cwd=tmp_path).returncode == 0
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), model(x).detach().numpy(), rtol=1e-4, atol=1e-5)
    result = accel_tvm("bench", "m.pt2", "--vs", "torch", "--repeat", "3", cwd=tmp_path)
    assert result.returncode == 0 and "PyTorch" in result.stdout


def _error(result, *words):
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("accel-tvm: error: ")
    for word in words:
        assert word in last
    return last


def test_error_missing_file(tmp_path):
    _error(accel_tvm_process("compile", "nothere.onnx", "-o", "x.so", cwd=tmp_path), "nothere.onnx", "does not exist")


def test_error_malformed_onnx(tmp_path):
    (tmp_path / "bad.onnx").write_bytes(b"this is not protobuf\xff")
    _error(accel_tvm("compile", "bad.onnx", "-o", "x.so", cwd=tmp_path), "bad.onnx", "not a valid ONNX model")


def test_error_unsupported_op(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Det", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), tmp_path / "det.onnx"
    )
    _error(accel_tvm("report", "det.onnx", cwd=tmp_path), "not supported", "Det")


def test_error_unknown_model_format(tmp_path):
    (tmp_path / "model.tflite").write_bytes(b"x")
    _error(accel_tvm("compile", "model.tflite", "-o", "x.so", cwd=tmp_path), "model.tflite", ".onnx", ".pt2")


def test_error_wrong_input_shape_and_dtype(workdir):
    d, _ = workdir
    np.save(d / "small.npy", np.zeros((1, 3, 30, 32), "float32"))
    np.save(d / "double.npy", np.zeros((1, 3, 32, 32), "float64"))
    _error(
        accel_tvm("run", "cnn.so", "--input", "small.npy", cwd=d), "expected shape [1, 3, 32, 32], given [1, 3, 30, 32]"
    )
    _error(accel_tvm("run", "cnn.so", "--input", "double.npy", cwd=d), "expected dtype float32, given float64")


def test_debug_shows_traceback(tmp_path):
    result = accel_tvm_process("compile", "nothere.onnx", "-o", "x.so", "--debug", cwd=tmp_path)
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_console_script_is_installed():
    exe = shutil.which("accel-tvm")
    assert exe is not None
    result = subprocess.run([exe, "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "compile" in result.stdout and "bench" in result.stdout


def _onnx_image_to_image(path):
    rng = np.random.default_rng(2)
    weights = [
        numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype("float32"), n)
        for n, s in [("w1", (8, 3, 3, 3)), ("b1", (8,)), ("w2", (4, 8, 1, 1))]
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "image_to_image",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 12])],
        weights,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)


def test_channels_last_in_and_out_has_no_transform(tmp_path):
    _onnx_image_to_image(tmp_path / "seg.onnx")
    x = np.random.default_rng(3).standard_normal((1, 3, 16, 12)).astype("float32")
    np.save(tmp_path / "x_nhwc.npy", x.transpose(0, 2, 3, 1))
    layouts = ["--input-layout", "NHWC", "--output-layout", "NHWC"]
    compiled = accel_tvm("compile", "seg.onnx", "-o", "seg.so", *layouts, "--json", cwd=tmp_path)
    assert compiled.returncode == 0, compiled.stderr
    assert json.loads(compiled.stdout)["report"]["runtime"]["activation_transforms"] == 0
    ran = accel_tvm("run", "seg.so", "--input", "x_nhwc.npy", "--output", "y.npy", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    session = onnxruntime.InferenceSession(str(tmp_path / "seg.onnx"), providers=["CPUExecutionProvider"])
    (reference,) = session.run(None, {"x": x})
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), reference.transpose(0, 2, 3, 1), rtol=1e-4, atol=1e-5)


# --- symbolic input dimensions (dim_param): one library, every size the signature allows ----


def test_symbolic_batch_compile_and_run(tmp_path):
    _onnx_cnn(tmp_path / "cnn.onnx", batch="N")
    compiled = accel_tvm("compile", "cnn.onnx", "-o", "cnn.so", cwd=tmp_path)
    assert compiled.returncode == 0, compiled.stderr
    assert "inputs: x: float32 [N, 3, 32, 32] (N: any size from 1)" in compiled.stdout
    assert json.loads((tmp_path / "cnn.so.json").read_text())["inputs"][0]["shape"] == ["N", 3, 32, 32]
    session = onnxruntime.InferenceSession(str(tmp_path / "cnn.onnx"), providers=["CPUExecutionProvider"])
    for batch in (1, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 32, 32)).astype("float32")
        np.save(tmp_path / "x.npy", x)
        ran = accel_tvm("run", "cnn.so", "--input", "x.npy", "--output", "y.npy", "--repeat", "2", cwd=tmp_path)
        assert ran.returncode == 0, ran.stderr
        assert f"outputs: [{batch}, 10]" in ran.stdout
        np.testing.assert_allclose(np.load(tmp_path / "y.npy"), session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    np.save(tmp_path / "rank3.npy", np.zeros((3, 32, 32), "float32"))
    np.save(tmp_path / "narrow.npy", np.zeros((2, 3, 32, 31), "float32"))
    expected = "input 0 (x): expected shape [N, 3, 32, 32] (N: any size from 1)"
    _error(
        accel_tvm("run", "cnn.so", "--input", "rank3.npy", cwd=tmp_path), expected, "3 dimensions, the model takes 4"
    )
    _error(accel_tvm("run", "cnn.so", "--input", "narrow.npy", cwd=tmp_path), expected, "dimension 3 is 31")


def test_inputs_sharing_a_symbolic_dimension(tmp_path):
    """x [batch, seq, 8] and mask [batch, seq]: both must give seq the same size."""
    weight = numpy_helper.from_array(np.random.default_rng(4).standard_normal((8, 4)).astype("float32"), "w")
    nodes = [
        helper.make_node("Unsqueeze", ["mask", "axis"], ["m"]),
        helper.make_node("Mul", ["x", "m"], ["xm"]),
        helper.make_node("MatMul", ["xm", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "masked",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])],
        [weight, numpy_helper.from_array(np.array([2], "int64"), "axis")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, tmp_path / "masked.onnx")
    compiled = accel_tvm("compile", "masked.onnx", "-o", "masked.so", "--json", cwd=tmp_path)
    assert compiled.returncode == 0, compiled.stderr
    data = json.loads(compiled.stdout)
    assert [i["shape"] for i in data["inputs"]] == [["batch", "seq", 8], ["batch", "seq"]]
    assert {op["kind"] for op in data["report"]["ops"] if op["op"] == "relax.matmul"} == {"accel"}
    rng = np.random.default_rng(5)
    x, mask = rng.standard_normal((2, 7, 8)).astype("float32"), (rng.random((2, 7)) > 0.3).astype("float32")
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "mask.npy", mask)
    np.save(tmp_path / "mask6.npy", mask[:, :6])
    ran = accel_tvm("run", "masked.so", "--input", "x.npy", "--input", "mask.npy", "--output", "y.npy", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    (reference,) = onnxruntime.InferenceSession(str(tmp_path / "masked.onnx")).run(None, {"x": x, "mask": mask})
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), reference, rtol=1e-4, atol=1e-5)
    _error(
        accel_tvm("run", "masked.so", "--input", "x.npy", "--input", "mask6.npy", cwd=tmp_path),
        "input 1 (mask)",
        "dimension 1 (seq) is 6, but input 0 (x) dimension 1 gave seq = 7",
        "every dimension named seq takes the same size",
    )


def test_symbolic_batch_channels_last_input(tmp_path):
    _onnx_cnn(tmp_path / "cnn.onnx", batch="N")
    compiled = accel_tvm("compile", "cnn.onnx", "-o", "cnn.so", "--input-layout", "NHWC", "--json", cwd=tmp_path)
    assert compiled.returncode == 0, compiled.stderr
    data = json.loads(compiled.stdout)
    assert data["inputs"] == [{"name": "x_nhwc", "shape": ["N", 32, 32, 3], "dtype": "float32"}]
    assert data["report"]["runtime"]["activation_transforms"] == 0
    x = np.random.default_rng(6).standard_normal((3, 3, 32, 32)).astype("float32")
    np.save(tmp_path / "x_nhwc.npy", x.transpose(0, 2, 3, 1))
    ran = accel_tvm("run", "cnn.so", "--input", "x_nhwc.npy", "--output", "y.npy", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    (reference,) = onnxruntime.InferenceSession(str(tmp_path / "cnn.onnx")).run(None, {"x": x})
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), reference, rtol=1e-4, atol=1e-5)
