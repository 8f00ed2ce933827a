"""Reliability of a loaded model (issue 19): calls from many threads, days of calls, bad
input at run time, a missing or edited signature file, the same bits every time.

References are PyTorch's outputs (to tolerance) and the model's own first output (to the
bit: the same executable on the same input must give exactly the same result).
"""

import gc
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax

import accel_target
from accel_target.runtime import deploy
from tests.helpers import assert_close
from tests.models.zoo import make


class ConvConvPoolLinear(nn.Module):
    """The model of the issue: conv -> conv -> pool -> linear."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2, self.fc = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 32, 3, padding=1), nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.c2(torch.relu(self.c1(x))))
        return self.fc(nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))


def _model(name):
    """(torch model, example input) of one of the models the tests mix."""
    if name == "ccpl":
        torch.manual_seed(0)
        return ConvConvPoolLinear().eval(), torch.randn(1, 3, 32, 32)
    model, x, _ = make(name)
    return model, x


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (library path, input, PyTorch's output, executable) of every model, saved:
    ccpl and mlp with their weights beside the library, residual_cnn with them inside."""
    root = tmp_path_factory.mktemp("reliability")
    out = {}
    for name, weights in (("ccpl", "separate"), ("mlp", "separate"), ("residual_cnn", "embedded")):
        model, x = _model(name)
        with torch.no_grad():
            ref = model(x).numpy()
        executable = accel_target.build(accel_target.from_torch(model, (x,)), weights=weights)
        library = str(root / f"{name}.so")
        accel_target.save(executable, library)
        out[name] = (library, x.numpy(), ref, executable)
    return out


@pytest.fixture(scope="module")
def loaded(saved):
    """name -> (Deployed model, input, its first output)."""
    out = {}
    for name, (library, x, ref, _) in saved.items():
        model = accel_target.load(library)
        first = model(x).numpy()
        assert_close(first, ref)
        out[name] = (model, x, first)
    return out


# --- concurrency -------------------------------------------------------------------------


def _hammer(workers: int, calls: int, call) -> list:
    """Run call(worker, k) for k < calls in `workers` threads at once; the errors they raised."""
    errors, start = [], threading.Barrier(workers)

    def work(worker):
        start.wait()
        try:
            for k in range(calls):
                call(worker, k)
        except Exception as err:
            errors.append(err)

    pool = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return errors


def test_one_deployed_model_shared_by_8_threads(loaded):
    """8 threads x 200 calls of one shared Deployed per model, models mixed: every output
    is bit for bit the single-threaded one (each thread runs on its own VirtualMachine)."""
    names = sorted(loaded)
    mismatches = []

    def call(worker, k):
        name = names[(worker + k) % len(names)]
        model, x, first = loaded[name]
        if not np.array_equal(model(x).numpy(), first):
            mismatches.append((worker, k, name))

    assert _hammer(8, 200, call) == []
    assert mismatches == []


def test_one_executable_from_build_shared_by_8_threads(saved, loaded):
    """The executable `build` returns, called as a model (``executable(x)``) by 8 threads x 100
    calls at once, embedded and separate weights mixed: every output is bit for bit the loaded
    model's, and a bad input is the same clear error."""
    names = sorted(saved)
    mismatches = []

    def call(worker, k):
        name = names[(worker + k) % len(names)]
        executable, (_, x, first) = saved[name][3], loaded[name]
        if not np.array_equal(executable(x).numpy(), first):
            mismatches.append((worker, k, name))

    assert _hammer(8, 100, call) == []
    assert mismatches == []
    with pytest.raises(ValueError, match=r"input 0 \(x\): expected shape \[1, 3, 32, 32\], given \[1, 3, 30, 32\]"):
        saved["ccpl"][3](x_ok[:, :, :30])


def test_one_vm_per_thread_over_one_executable(saved, loaded):
    """Threads that each make a relax.VirtualMachine of one executable (the recipe for
    plain TVM users) get the same bits too."""
    library, x, _, executable = saved["residual_cnn"]
    first = loaded["residual_cnn"][2]
    mismatches = []
    vms = {}

    def call(worker, k):
        vm = vms.setdefault(worker, relax.VirtualMachine(executable, tvm.cpu()))
        if not np.array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), first):
            mismatches.append((worker, k))

    assert _hammer(4, 50, call) == []
    assert mismatches == [] and len(vms) == 4


class QuantizableCNN(nn.Module):
    """Convs of 64 and 128 channels and a linear layer: quantized, their int8 kernels (AMX
    tiles on a host with them, vpdpbusd or vpmaddubsw elsewhere)."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 64, 3, padding=1), nn.Conv2d(64, 64, 3, padding=1)
        self.c3, self.fc = nn.Conv2d(64, 128, 1), nn.Linear(128, 10)

    def forward(self, x):
        x = torch.relu(self.c3(torch.relu(self.c2(torch.relu(self.c1(x))))))
        return self.fc(nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))


def test_int8_model_shared_by_8_threads(tmp_path):
    """A quantized model (ONNX Runtime's QDQ file), saved and loaded, called 8 x 100 times from
    8 threads at once: every output is bit for bit the first, which agrees with ONNX
    Runtime's int8 session within one quantization step."""
    pytest.importorskip("onnxruntime")
    import onnxruntime

    from tests.models.quantized_onnx import output_scale, quantized_onnx

    torch.manual_seed(0)
    shape = (1, 3, 16, 16)
    qdq = quantized_onnx(QuantizableCNN().eval(), shape, tmp_path, count=4)
    library = str(tmp_path / "qcnn.so")
    accel_target.save(accel_target.build(accel_target.from_onnx(qdq), weights="separate"), library)
    model = accel_target.load(library)
    x = np.random.default_rng(3).standard_normal(shape).astype("float32")
    first = model(x).numpy()
    expected = onnxruntime.InferenceSession(qdq, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.abs(first - expected).max() <= output_scale(qdq) * 1.001
    mismatches = []

    def call(worker, k):
        if not np.array_equal(model(x).numpy(), first):
            mismatches.append((worker, k))

    assert _hammer(8, 100, call) == []
    assert mismatches == []


def test_each_thread_gets_its_own_vm(loaded):
    model = loaded["ccpl"][0]
    seen = []
    _hammer(3, 1, lambda worker, k: seen.append(model.vm))
    assert len({id(vm) for vm in seen}) == 3 and model.vm is model.vm


# --- determinism -------------------------------------------------------------------------


def test_same_bits_across_calls_and_input_kinds(loaded):
    model, x, first = loaded["ccpl"]
    for value in (x, tvm.runtime.tensor(x), torch.from_numpy(x), np.asfortranarray(x)):
        for _ in range(20):
            assert np.array_equal(model(value).numpy(), first)


@pytest.mark.slow
def test_same_bits_across_thread_counts(saved, loaded, tmp_path):
    """TVM reads TVM_NUM_THREADS once, so each thread count runs in a process of its own
    (TVM caps it at the cores there are: 1 and 2 here)."""
    library, x, _, _ = saved["residual_cnn"]
    np.save(tmp_path / "x.npy", x)
    code = textwrap.dedent(f"""
        import sys, numpy as np, accel_target
        model = accel_target.load({library!r})
        np.save(sys.argv[1], model(np.load({str(tmp_path / "x.npy")!r})).numpy())
        assert accel_target.num_threads() == int(sys.argv[2])
    """)
    for count in sorted({1, min(2, accel_target.host_cores())}):
        out = tmp_path / f"y{count}.npy"
        env = dict(os.environ, TVM_NUM_THREADS=str(count))
        subprocess.run([sys.executable, "-c", code, str(out), str(count)], check=True, env=env, cwd=os.getcwd())
        assert np.array_equal(np.load(out), loaded["residual_cnn"][2]), f"TVM_NUM_THREADS={count}"


# --- soak --------------------------------------------------------------------------------


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.slow
def test_10000_calls_do_not_grow_memory(loaded):
    """Resident memory after 10,000 calls is within 8 MB of that after 1,000 (the calls
    allocate ~0.3 MB each: a leak of anything a call makes would add GBs)."""
    model, x, first = loaded["ccpl"]
    for _ in range(1000):
        model(x)
    gc.collect()
    before = _rss_mb()
    for _ in range(9000):
        model(x)
    gc.collect()
    assert _rss_mb() - before < 8
    assert np.array_equal(model(x).numpy(), first)


@pytest.mark.slow
def test_loading_and_dropping_100_times_does_not_grow_memory(saved):
    """load (library + signature + separate weights) and drop: after 100 rounds resident
    memory is within 16 MB of that after 10 (one round holds ~0.1 MB of weights and the
    library's code, so a leaked round per load would show)."""
    library, x, _, _ = saved["ccpl"]

    def round_trip():
        model = accel_target.load(library)
        model(x)
        _hammer(2, 1, lambda worker, k: model(x))  # thread VMs too

    for _ in range(10):
        round_trip()
    gc.collect()
    before = _rss_mb()
    for _ in range(90):
        round_trip()
    gc.collect()
    assert _rss_mb() - before < 16


# --- bad input at run time ---------------------------------------------------------------

x_ok = np.zeros((1, 3, 32, 32), "float32")
BAD_INPUTS = [
    # wrong dtype, rank, shape, count
    ((x_ok.astype("float64"),), ValueError, ["input 0 (x)", "expected dtype float32, given float64"]),
    ((x_ok.astype("int32"),), ValueError, ["input 0 (x)", "expected dtype float32, given int32"]),
    ((x_ok[0],), ValueError, ["input 0 (x)", "expected shape [1, 3, 32, 32], given [3, 32, 32]"]),
    ((x_ok[:, :, :30],), ValueError, ["input 0 (x)", "expected shape [1, 3, 32, 32], given [1, 3, 30, 32]"]),
    ((), ValueError, ["takes 1 input(s) (x: float32 [1, 3, 32, 32]), given 0"]),
    ((x_ok, x_ok), ValueError, ["takes 1 input(s)", "given 2"]),
    # channels-last data for an NCHW model
    ((np.zeros((1, 32, 32, 3), "float32"),), ValueError, ["given [1, 32, 32, 3]", "layout mismatch"]),
    # not an array at all, a Python number, a tensor numpy cannot read
    (("image.png",), ValueError, ["input 0 (x)", "expected dtype float32, given <U9"]),
    ((1.0,), ValueError, ["input 0 (x)", "expected dtype float32, given float64"]),
    (
        (torch.zeros(1, 3, 32, 32, requires_grad=True),),
        TypeError,
        ["input 0 (x)", "expected a tvm.runtime.Tensor or an array", "Tensor"],
    ),
    # NaN and Inf
    (
        (np.full((1, 3, 32, 32), np.nan, "float32"),),
        ValueError,
        ["input 0 (x)", "3072 NaN and 0 Inf", "check_finite=False"],
    ),
    (
        (tvm.runtime.tensor(np.where(np.arange(3072).reshape(1, 3, 32, 32) == 5, np.inf, 0).astype("float32")),),
        ValueError,
        ["input 0 (x)", "0 NaN and 1 Inf"],
    ),
]


@pytest.mark.parametrize("inputs,error,words", BAD_INPUTS, ids=lambda v: repr(v)[:40] if isinstance(v, list) else None)
def test_bad_input_is_a_clear_error(loaded, inputs, error, words):
    model, x, first = loaded["ccpl"]
    with pytest.raises(error) as err:
        model(*inputs)
    for word in words:
        assert word in str(err.value)
    assert np.array_equal(model(x).numpy(), first)  # and the model still works


class TokenClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(100, 32), nn.Linear(32, 4)

    def forward(self, ids):
        return self.head(torch.tanh(self.embed(ids)))


def test_token_ids_outside_the_vocabulary_are_an_error_in_every_thread(tmp_path):
    """An index known only at run time is checked by the model itself (accel_target/indexing.py):
    4 threads share a loaded model, every third call with a token id past the vocabulary; those
    raise an error naming the op and the range, the others give the first answer's bits."""
    torch.manual_seed(0)
    model, ids = TokenClassifier().eval(), torch.tensor([[3, 99, 0, 42]])
    library = str(tmp_path / "tokens.so")
    accel_target.save(accel_target.build(accel_target.from_torch(model, (ids,)), weights="separate"), library)
    loaded = accel_target.load(library)
    first = loaded(ids.numpy()).numpy()
    assert_close(first, model(ids).detach().numpy())
    bad, outcomes = np.array([[3, 100, 0, 42]]), []

    def call(worker, k):
        if k % 3 == 2:
            with pytest.raises(RuntimeError, match=r"take: .*outside \[-100, 100\) on axis 0 .*\[100, 32\]"):
                loaded(bad)
            outcomes.append("error")
        else:
            assert np.array_equal(loaded(ids.numpy()).numpy(), first)
            outcomes.append("same")

    assert _hammer(4, 30, call) == []
    assert outcomes.count("error") == 40 and outcomes.count("same") == 80


def test_non_contiguous_inputs_are_copied(loaded):
    """A transposed view holds other data than its base: the answer is that of its contents."""
    model, x, _ = loaded["ccpl"]
    base = np.ascontiguousarray(x.transpose(0, 1, 3, 2))
    view = base.transpose(0, 1, 3, 2)  # == x, not C-contiguous
    assert not view.flags.c_contiguous
    want = model(np.ascontiguousarray(view)).numpy()
    assert np.array_equal(model(view).numpy(), want)
    assert np.array_equal(model(torch.from_numpy(base).transpose(2, 3)).numpy(), want)


def test_nan_passes_through_unchecked_when_asked(saved):
    """check_finite=False: no check, no crash; the output is whatever the kernels make of it."""
    library, x, _, _ = saved["ccpl"]
    model = accel_target.load(library, check_finite=False)
    out = model(np.full_like(x, np.nan)).numpy()
    assert out.shape == (1, 10)


# --- the signature file ------------------------------------------------------------------


@pytest.fixture
def copy_of(saved, tmp_path):
    """A fresh copy of a saved model's files, to break."""

    def copy(name):
        library = saved[name][0]
        for suffix in ("", ".json", ".params"):
            if os.path.isfile(library + suffix):
                shutil.copyfile(library + suffix, tmp_path / f"{name}.so{suffix}")
        return str(tmp_path / f"{name}.so")

    return copy


def _edit_signature(library, edit):
    path = library + ".json"
    with open(path) as f:
        signature = json.load(f)
    edit(signature)
    with open(path, "w") as f:
        json.dump(signature, f)


def _set_input_shape(signature):
    signature["inputs"][0]["shape"] = [1, 3, 64, 64]


def _drop_weight(signature):
    signature["weights"].pop()


SIGNATURE_FAULTS = [
    # file missing, not JSON, not ours, malformed entries
    (
        lambda lib: os.remove(lib + ".json"),
        FileNotFoundError,
        ["ccpl.so.json", "does not exist", "save the model again"],
    ),
    (lambda lib: Path(lib + ".json").write_text("{not json"), ValueError, ["ccpl.so.json", "malformed"]),
    (lambda lib: Path(lib + ".json").write_text("[]"), ValueError, ["malformed", "accel-signature/1"]),
    (
        lambda lib: _edit_signature(lib, lambda s: s.update(inputs=[{"shape": "big"}])),
        ValueError,
        ["malformed", "input 0"],
    ),
    # edited to disagree with the library it sits beside
    (
        lambda lib: _edit_signature(lib, _set_input_shape),
        ValueError,
        ["lists inputs (x: float32 [1, 3, 64, 64])", "takes (x: float32 [1, 3, 32, 32])"],
    ),
    (lambda lib: _edit_signature(lib, _drop_weight), ValueError, ["holds 6 weights; the model takes 5"]),
    (
        lambda lib: _edit_signature(lib, lambda s: s.update(library_sha256="0" * 64)),
        ValueError,
        ["not written for", "ccpl.so"],
    ),
]


@pytest.mark.parametrize("fault,error,words", SIGNATURE_FAULTS)
def test_broken_signature_is_a_clear_error(copy_of, fault, error, words):
    library = copy_of("ccpl")
    fault(library)
    with pytest.raises(error) as err:
        accel_target.load(library)
    for word in words:
        assert word in str(err.value)


def test_signature_of_another_model_is_rejected(copy_of):
    ccpl, mlp = copy_of("ccpl"), copy_of("mlp")
    os.replace(mlp + ".json", ccpl + ".json")
    with pytest.raises(ValueError, match="not written for"):
        accel_target.load(ccpl)


def test_weights_of_the_wrong_shape_are_rejected(copy_of):
    """main checks none of the weights (a kernel would reject this one as "expected 5"): load names it."""
    library = copy_of("ccpl")
    params = dict(tvm.runtime.load_param_dict_from_file(library + ".params"))
    params["w0"] = tvm.runtime.tensor(np.zeros(3, "float32"))
    tvm.runtime.save_param_dict_to_file(params, library + ".params")
    wrong = r"weight w0 in .* is float32 \[3\]; the model takes w0: float32 \[1, 3, 3, 3, 16\]$"
    with pytest.raises(ValueError, match=wrong):
        accel_target.load(library)
    os.remove(library + ".params")
    with pytest.raises(FileNotFoundError, match="ccpl.so.params' does not exist; the model takes 6 weights"):
        accel_target.load(library)


def test_signature_matches_the_executable(saved):
    library, x, _, executable = saved["ccpl"]
    signature = deploy.read_signature(library)
    expected = [deploy.TensorSpec("x", (1, 3, 32, 32), "float32")]
    assert signature["inputs"] == deploy.executable_inputs(executable) == expected
    assert [w.shape for w in signature["weights"]] == [tuple(w.shape) for w in executable.weights]
