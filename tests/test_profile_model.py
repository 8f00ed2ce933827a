"""benchmarks/profile_model.py: each kernel's time in the model (and, --again, called again at
once); --onnxruntime: ONNX Runtime's node profile, and its nodes set beside accel's kernels by
shapes."""

import importlib.util
import pathlib

import numpy as np
import torch
import tvm
from tvm import relax

import accel_target
from accel_target import launches

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("profile_model", ROOT / "benchmarks" / "profile_model.py")
profile_model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(profile_model)


def test_every_kernel_is_timed_in_the_model_and_again_at_once():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 8, 1))
    x = torch.randn(1, 3, 12, 12)
    with launches.disabled():  # as profile_model builds: every kernel a VM call of its own
        executable = accel_target.build(accel_target.from_torch(model.eval(), (x,)))
    vm = relax.VirtualMachine(executable, tvm.cpu())
    inputs = [tvm.runtime.tensor(x.numpy())]
    once = profile_model.kernel_times(vm, inputs, calls=3)
    twice = profile_model.kernel_times(vm, inputs, calls=3, again=True)
    convs = [name for name in twice if "conv2d" in name]
    assert len(convs) == 2, sorted(twice)
    assert set(once) == set(twice) and all(k.again is None for k in once.values()), once
    for name in convs:
        assert twice[name].calls == 1 and twice[name].us > 0 and twice[name].again > 0, twice[name]
    # the first conv reads the NCHW image as it is (ReadInputNCHW); the second NHWC, channels last
    assert sorted(twice[name].shapes[0] for name in convs) == [(1, 3, 12, 12), (1, 12, 12, 16)], twice
    # the instrument is gone afterwards: main runs as before and gives PyTorch's result
    np.testing.assert_allclose(vm["main"](*inputs).numpy(), model(x).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_onnxruntime_profile_names_each_node_with_its_shapes_and_time():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(16 * 36, 5))
    nodes = profile_model.onnxruntime_node_times(model.eval(), torch.randn(1, 3, 6, 6), threads=1, runs=5)
    by_op = {op: (inputs, outputs, us) for op, inputs, outputs, us in nodes}
    assert by_op["Conv"][0][0] == [1, 3, 6, 6] and by_op["Conv"][1] == [[1, 16, 6, 6]], nodes
    assert by_op["Gemm"][1] == [[1, 5]], nodes
    assert by_op["Conv"][2] > 0 and all(us >= 0 for _, _, _, us in nodes), nodes  # (whole us: a copy may take 0)


def test_nodes_sit_beside_the_kernels_of_their_shapes_nchw_read_as_nhwc():
    time = profile_model.KernelTime
    kernels = {
        "fused_conv_a": time(300.0, 2, [(1, 7, 7, 512), (16, 3, 3, 512, 32), (1, 7, 7, 512)]),
        "fused_dense": time(50.0, 1, [(1, 2048), (16, 2048, 64), (1000,), (1, 1000)]),
        "vm.builtin.alloc_tensor": time(9.0, 40, []),
    }
    nodes = [
        ("Conv", [[1, 512, 7, 7], [512, 512, 3, 3]], [[1, 512, 7, 7]], 140.0),
        ("Conv", [[1, 512, 7, 7], [512, 512, 3, 3]], [[1, 512, 7, 7]], 130.0),
        ("Gemm", [[1, 2048], [1000]], [[1, 1000]], 80.0),
        ("MaxPool", [[1, 64, 112, 112]], [[1, 64, 56, 56]], 20.0),
    ]
    rows = profile_model.beside_onnxruntime(kernels, nodes)
    assert rows == [
        ((1, 7, 7, 512), (1, 7, 7, 512), 300.0, ["fused_conv_a x2"], 270.0, ["Conv", "Conv"]),
        ((1, 2048), (1, 1000), 50.0, ["fused_dense x1"], 80.0, ["Gemm"]),
        ((1, 112, 112, 64), (1, 56, 56, 64), 0.0, [], 20.0, ["MaxPool"]),
    ]
