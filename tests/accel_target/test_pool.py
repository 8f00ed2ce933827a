"""accel's thread pool (`accel_target.pool`, issue 19): the libraries accel builds and loads
run their parallel loops on it, a kernel finishes without workers that never get a core,
and the results are the bits of TVM's pool.

References: PyTorch's outputs (to tolerance); TVM's own pool (``ACCEL_POOL=tvm``) and the
model's first output (to the bit).
"""

import multiprocessing
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax

import accel_target
from accel_target import pool
from tests.accel_target.test_reliability import ConvConvPoolLinear
from tests.helpers import assert_close


def _convs():
    """conv -> conv -> pool -> linear: its kernels share one launch, whose tasks meet at barriers."""
    torch.manual_seed(0)
    return ConvConvPoolLinear().eval(), torch.randn(1, 3, 32, 32)


def _dense():
    """One dense layer: a launch of its own, no barrier."""
    torch.manual_seed(1)
    return nn.Linear(512, 512).eval(), torch.randn(64, 512)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (library path, input, PyTorch's output)."""
    root = tmp_path_factory.mktemp("pool")
    out = {}
    for name, make in (("convs", _convs), ("dense", _dense)):
        model, x = make()
        with torch.no_grad():
            ref = model(x).numpy()
        library = str(root / f"{name}.so")
        accel_target.save(accel_target.build(accel_target.from_torch(model, (x,))), library)
        out[name] = (library, x.numpy(), ref)
    return out


def _run_elsewhere(code: str, *args: str, **env: str) -> None:
    subprocess.run([sys.executable, "-c", code, *args], check=True, env={**os.environ, **env}, cwd=os.getcwd())


def test_built_model_runs_on_accel_pool():
    """relax.VirtualMachine over what `build` returns launches accel's pool, not TVM's."""
    model, x = _convs()
    executable = accel_target.build(accel_target.from_torch(model, (x,)))
    before = pool.stats()["launches"]
    vm = relax.VirtualMachine(executable, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x.numpy())).numpy()
    with torch.no_grad():
        assert_close(out, model(x).numpy())
    assert pool.stats()["launches"] > before


def test_loaded_model_runs_on_accel_pool(saved):
    library, x, ref = saved["dense"]
    model = accel_target.load(library)
    assert model.pool == "accel"
    before = pool.stats()["launches"]
    assert_close(model(x).numpy(), ref)
    assert pool.stats()["launches"] > before


@pytest.mark.parametrize("name", ["convs", "dense"])
def test_kernels_finish_without_their_workers(saved, name):
    """With every worker kept off its core (`pool.workers_held`), the calling thread runs
    every task: the call ends, with the bits of a call the workers helped with."""
    library, x, _ = saved[name]
    model = accel_target.load(library)
    first = model(x).numpy()  # the kernels whose tasks meet at barriers are known from here on
    before = pool.stats()
    with pool.workers_held():
        held = model(x).numpy()
    after = pool.stats()
    assert np.array_equal(held, first)
    assert after["launches"] > before["launches"]
    assert after["tasks_by_workers"] == before["tasks_by_workers"]


def test_tvm_pool_on_request_gives_the_same_bits(saved, tmp_path):
    """``ACCEL_POOL=tvm`` leaves a loaded library on TVM's pool, with the same results."""
    code = (
        "import sys, numpy as np, accel_target\n"
        "from accel_target import pool\n"
        "model = accel_target.load(sys.argv[1])\n"
        "assert model.pool == 'tvm', model.pool\n"
        "np.save(sys.argv[3], model(np.load(sys.argv[2])).numpy())\n"
        "assert pool.stats()['launches'] == 0\n"
    )
    for name, (library, x, _) in saved.items():
        np.save(tmp_path / "x.npy", x)
        _run_elsewhere(code, library, str(tmp_path / "x.npy"), str(tmp_path / "out.npy"), ACCEL_POOL="tvm")
        assert np.array_equal(np.load(tmp_path / "out.npy"), accel_target.load(library)(x).numpy()), name


def _call_in_child(library, x, queue):
    queue.put(accel_target.load(library)(x).numpy())


def test_forked_child_runs_models_after_its_parent(saved):
    """A child forked after its parent used the pool (whose workers it does not inherit)
    starts workers of its own."""
    library, x, _ = saved["convs"]
    first = accel_target.load(library)(x).numpy()
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_call_in_child, args=(library, x, queue))
    child.start()
    out = queue.get(timeout=120)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert np.array_equal(out, first)


def test_without_a_c_compiler_models_run_on_tvm_pool_with_a_warning(saved, tmp_path):
    """No compiler for pool.c (``CC`` names none, nothing cached): the model loads and runs
    on TVM's pool, and a warning names the file."""
    code = (
        "import sys, warnings, numpy as np, accel_target\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    model = accel_target.load(sys.argv[1])\n"
        "assert model.pool == 'tvm', model.pool\n"
        "assert any('pool.c did not compile' in str(w.message) for w in caught), [str(w.message) for w in caught]\n"
        "np.save(sys.argv[3], model(np.load(sys.argv[2])).numpy())\n"
    )
    library, x, ref = saved["dense"]
    np.save(tmp_path / "x.npy", x)
    env = {"CC": str(tmp_path / "no-such-compiler"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    _run_elsewhere(code, library, str(tmp_path / "x.npy"), str(tmp_path / "out.npy"), **env)
    assert_close(np.load(tmp_path / "out.npy"), ref)
