"""build(weights="separate"), save and load: the weights beside a code-only library,
against PyTorch's output and the embedded build's."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import tvm

import accel_target
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
    # the loading recipe of accel_target/deploy.py, with TVM's runtime library alone
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


def test_unknown_weights_mode(cnn):
    with pytest.raises(ValueError, match="weights='inside' is not supported; supported: embedded, separate"):
        accel_target.build(cnn[0], weights="inside")
