"""build(weights="separate"), save and load: the weights beside a code-only library,
against PyTorch's output and the embedded build's; the signature's shapes, symbolic
dimensions checked by name."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import tvm

import accel_target
from accel_target.runtime import signature
from tests.helpers import assert_close, run_executable
from tests.models.zoo import make


@pytest.fixture(scope="module")
def cnn():
    model, x, _ = make("residual_cnn")
    with torch.no_grad():
        ref = model(x).numpy()
    return accel_target.from_torch(model, (x,)), x.numpy(), ref


@pytest.fixture(scope="module")
def separate(cnn):
    return accel_target.build(cnn[0], weights="separate")


@pytest.fixture(scope="module")
def embedded(cnn):
    return accel_target.build(cnn[0])


def test_weights_become_trailing_inputs(cnn, separate):
    _, x, ref = cnn
    weights = separate.weights
    assert len(weights) >= 6  # every conv's packed kernel and bias, the head's weight and bias
    vm = tvm.relax.VirtualMachine(separate, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x), *weights).numpy()
    assert_close(out, ref)
    # the weights are no longer inside: main needs them
    with pytest.raises(tvm.error.InternalError, match=rf"main expects {1 + len(weights)} arguments"):
        vm["main"](tvm.runtime.tensor(x))


def test_same_kernels_as_embedded(cnn, separate, embedded):
    _, x, ref = cnn
    assert embedded.weights is None
    assert_close(run_executable(embedded, x), ref)
    assert accel_target.report(separate).kernels.calls == accel_target.report(embedded).kernels.calls


def test_save_and_load_in_fresh_process_with_runtime_only(cnn, separate, tmp_path):
    _, x, ref = cnn
    written = accel_target.save(separate, tmp_path / "cnn.so")
    assert written == [str(tmp_path / "cnn.so"), str(tmp_path / "cnn.so.params")]
    np.save(tmp_path / "x.npy", x)
    # the loading recipe of accel_target/runtime/deploy.py, with TVM's runtime library alone
    code = textwrap.dedent(
        """
        import sys, numpy as np, tvm
        from tvm.runtime.vm import VirtualMachine
        lib = tvm.runtime.load_module("cnn.so")
        params = tvm.runtime.load_param_dict_from_file("cnn.so.params")
        weights = [params[f"w{i}"] for i in range(len(params))]
        vm = VirtualMachine(lib, tvm.cpu())
        np.save("y.npy", vm["main"](tvm.runtime.tensor(np.load("x.npy")), *weights).numpy())
        assert not any(m.split(".")[0] in ("accel_target", "strategy", "topi_accel") for m in sys.modules)
        """
    )
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1")
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, env=env)
    assert_close(np.load(tmp_path / "y.npy"), ref)
    assert_close(accel_target.load(tmp_path / "cnn.so")(tvm.runtime.tensor(x)).numpy(), ref)


def test_embedded_save_removes_a_stale_weights_file(cnn, embedded, tmp_path):
    _, x, ref = cnn
    (tmp_path / "m.so.params").write_bytes(b"stale")
    assert accel_target.save(embedded, tmp_path / "m.so") == [str(tmp_path / "m.so")]
    assert not (tmp_path / "m.so.params").exists()
    assert_close(accel_target.load(tmp_path / "m.so")(tvm.runtime.tensor(x)).numpy(), ref)


def test_load_errors(separate, tmp_path):
    with pytest.raises(FileNotFoundError, match="library .*nothere.so' does not exist"):
        accel_target.load(tmp_path / "nothere.so")
    accel_target.save(separate, tmp_path / "m.so")
    tvm.runtime.save_param_dict_to_file(
        {"conv.weight": tvm.runtime.tensor(np.zeros(3, "float32"))}, str(tmp_path / "m.so.params")
    )
    with pytest.raises(ValueError, match="holds conv.weight; expected the weights w0..w0"):
        accel_target.load(tmp_path / "m.so")


def test_a_loaded_model_takes_a_0d_input(tmp_path):
    """A 0-d input reaches the model 0-d (made 1-d, the VM refused it)."""

    class Scale(torch.nn.Module):
        def forward(self, x, s):
            return x * s

    x, s = torch.randn(2, 3), torch.tensor(1.5)
    accel_target.save(accel_target.build(accel_target.from_torch(Scale(), (x, s))), tmp_path / "scale.so")
    out = accel_target.load(tmp_path / "scale.so")(x.numpy(), s.numpy())
    np.testing.assert_array_equal(out.numpy(), (x * s).numpy())


class _EmptyTokens(torch.nn.Module):
    """ViTMAE's mask tokens without a mask: a weight repeated 0 times, concatenated."""

    def __init__(self):
        super().__init__()
        self.token = torch.nn.Parameter(torch.randn(1, 1, 4))

    def forward(self, x):
        return torch.cat([x, self.token.repeat(1, 9 - x.shape[1], 1)], dim=1) * 2


def test_a_constant_of_no_element_runs_and_loads(tmp_path):
    """TVM saves a constant of no element in a library but cannot load it back: made at run
    time instead, the model runs (in-process through a library too) and loads."""
    model, x = _EmptyTokens().eval(), torch.randn(1, 9, 4)
    with torch.no_grad():
        expected = model(x).numpy()
    executable = accel_target.build(accel_target.from_torch(model, (x,)))
    assert_close(run_executable(executable, x.numpy()), expected)
    accel_target.save(executable, tmp_path / "empty.so")
    assert_close(accel_target.load(tmp_path / "empty.so")(x.numpy()).numpy(), expected)


def test_unknown_weights_mode(cnn):
    with pytest.raises(ValueError, match="weights='inside' is not supported; supported: embedded, separate"):
        accel_target.build(cnn[0], weights="inside")


# --- the signature's shapes: fixed sizes, symbolic dimensions by name, expressions of them ---

X = signature.TensorSpec("x", ("n", "n", 4), "float32")  # a square batch of rows: n twice in one input
Y = signature.TensorSpec("y", ("n * 2", 4), "float32")  # an expression of n, as TVM prints it
OLD = signature.TensorSpec("z", (None, 4), "float32")  # a symbolic dimension as older signatures wrote it

# (given shapes of x and y, words of the error; None: accepted)
SHAPE_CASES = [
    ([(3, 3, 4), (6, 4)], None),
    ([(1, 1, 4), (2, 4)], None),
    ([(3, 4, 4), (6, 4)], ["input 0 (x)", "dimension 1 (n) is 4, but its dimension 0 gave n = 3"]),
    (
        [(3, 3, 4), (7, 4)],
        ["input 1 (y)", "expected shape [n * 2, 4]", "dimension 0 (n * 2) is 7; with n = 3 it must be 6"],
    ),
    (
        [(3, 3, 5), (6, 4)],
        ["expected shape [n, n, 4] (n: any size from 1)", "dimension 2 is 5; the model fixes it at 4"],
    ),
    ([(3, 3), (6, 4)], ["given [3, 3]: 2 dimensions, the model takes 3"]),
    ([(0, 0, 4), (0, 4)], ["dimension 0 (n) is 0: a symbolic dimension takes sizes from 1"]),
]


@pytest.mark.parametrize("shapes,words", SHAPE_CASES, ids=range(len(SHAPE_CASES)))
def test_symbolic_dimensions_are_checked_by_name(shapes, words):
    if words is None:
        signature.check_shapes(shapes, [X, Y])
        return
    with pytest.raises(ValueError) as err:
        signature.check_shapes(shapes, [X, Y])
    for word in words:
        assert word in str(err.value)


def test_unnamed_symbolic_dimension_takes_any_size():
    signature.check_shapes([(5, 4)], [OLD])
    assert OLD.describe() == "z: float32 [?, 4]"


def test_signature_shapes_parse_and_round_trip():
    """The executable's own check prints the shape (TVMScript); the signature keeps names and
    expressions as strings, ints as ints, and reads back what it wrote."""
    spec = signature._spec_of_check("x", "(batch, seq * 2, T.max(a, b), 16), ", "float32")
    assert spec == signature.TensorSpec("x", ("batch", "seq * 2", "T.max(a, b)", 16), "float32")
    assert signature._spec_of_check("s", "(5,), ", "int64").shape == (5,)
    assert signature._spec_of_check("r", "ndim=4, ", "float32").shape is None
    assert signature._spec_from_json(spec.to_dict(), "input 0") == spec
    for shape in (["batch", ""], [1.5], "N"):
        with pytest.raises(ValueError, match="input 0 has shape"):
            signature._spec_from_json({"name": "x", "shape": shape, "dtype": "float32"}, "input 0")
