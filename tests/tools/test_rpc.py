"""Remote devices through TVM's RPC tracker: a tracker and two servers of one key on
127.0.0.1, started once for the module; load, run, bench and tune through them; one server
killed in the middle of a tune, which finishes on the other.

Every process binds 127.0.0.1 only, on ports free when it starts; each leads a process group
of its own (the server's forked session processes included), which the module's finalizer
kills. A server registers only after it has imported TVM twice, so they start once.
"""

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import accel_target
from accel_target.runtime import remote
from accel_target.tools import cli, tuner

pytest.importorskip("tornado", reason="TVM's RPC tracker needs tornado: pip install accel-tvm[rpc]")
pytestmark = pytest.mark.slow

HOST = "127.0.0.1"
KEY = "accel-test"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _start(args: list[str], log) -> subprocess.Popen:
    """`python -m ARGS` leading a process group of its own, one thread for TVM's runtime."""
    return subprocess.Popen(
        [sys.executable, "-m", *args],
        env=dict(os.environ, TVM_NUM_THREADS="1"),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` is alive (not a zombie), from /proc."""
    for name in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            stat = open(f"/proc/{name}/stat").read()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == pgid and fields[0] not in "ZX":
                return True
    return False


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the process group `proc` leads, and wait (5 s at most) until none of it is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    deadline = time.monotonic() + 5
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _busy(servers: list) -> list:
    """The servers in a session now: a forked session process besides the server and its worker."""
    counts = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, ValueError):
            stat = open(f"/proc/{name}/stat").read()
            fields = stat[stat.rindex(")") + 2 :].split()
            if fields[0] not in "ZX":
                counts[int(fields[2])] = counts.get(int(fields[2]), 0) + 1
    return [s for s in servers if counts.get(s.pid, 0) > 2]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    """(Device of the two servers, [server processes]); all killed when the module ends."""
    logs = tmp_path_factory.mktemp("rpc_logs")
    procs = []
    request.addfinalizer(lambda: [_kill(p) for p in procs])
    port = _free_port()
    with open(logs / "tracker.log", "wb") as log:
        procs.append(
            _start(["tvm.exec.rpc_tracker", "--host", HOST, "--port", str(port), "--port-end", str(port + 1)], log)
        )
    servers = []
    for i in range(2):
        own = _free_port()
        args = [
            "--tracker",
            f"{HOST}:{port}",
            "--key",
            KEY,
            "--host",
            HOST,
            "--port",
            str(own),
            "--port-end",
            str(own + 1),
        ]
        with open(logs / f"server{i}.log", "wb") as log:
            servers.append(_start(["tvm.exec.rpc_server", *args], log))
    procs.extend(servers)
    device = remote.Device(HOST, port, KEY, wait=60)
    deadline = time.monotonic() + 120
    while True:
        with contextlib.suppress(remote.TrackerUnavailable):
            if device.status()["free"] == 2:
                break
        assert time.monotonic() < deadline, f"servers not registered after 120 s; logs in {logs}"
        assert all(p.poll() is None for p in procs), f"a process exited; logs in {logs}"
        time.sleep(0.5)
    return device, servers


class Small(torch.nn.Module):
    """A 3x3 conv, a pointwise conv, pooling and a linear layer: two convs to tune."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2, self.fc = (
            torch.nn.Conv2d(3, 16, 3, padding=1),
            torch.nn.Conv2d(16, 16, 1),
            torch.nn.Linear(16, 4),
        )

    def forward(self, x):
        y = torch.relu(self.c2(torch.relu(self.c1(x))))
        return self.fc(y.mean((2, 3)))


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """(directory, the model, its input): Small saved as small.pt2, built with separate weights
    and saved as small.so, the input as x.npy."""
    d = tmp_path_factory.mktemp("rpc")
    torch.manual_seed(0)
    model, x = Small().eval(), torch.randn(1, 3, 16, 16)
    torch.export.save(torch.export.export(model, (x,)), d / "small.pt2")
    np.save(d / "x.npy", x.numpy())
    accel_target.save(accel_target.build(accel_target.from_torch(model, (x,)), weights="separate"), d / "small.so")
    return d, model, x


def accel_tvm(*args, cwd):
    """accel-tvm ARGS run by `cli.main` in this process: (exit code, stdout, stderr)."""
    stdout, stderr, before = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = cli.main([str(a) for a in args])
    finally:
        os.chdir(before)
    return code, stdout.getvalue(), stderr.getvalue()


def test_a_tracker_that_does_not_answer_is_a_one_line_error(small):
    """TVM's connect_tracker would retry for 60 s: the error names HOST:PORT at once."""
    d, _, _ = small
    with socket.socket() as reserved:  # bound, never listening: connections are refused
        reserved.bind((HOST, 0))
        port = reserved.getsockname()[1]
        started = time.monotonic()
        code, _, err = accel_tvm("run", "small.so", "--input", "x.npy", "--rpc", f"{HOST}:{port}", "--key", KEY, cwd=d)
        assert code == 1 and time.monotonic() - started < 10
        assert err.strip().splitlines()[-1] == f"accel-tvm: error: no RPC tracker at {HOST}:{port}: connection refused"
        with pytest.raises(remote.TrackerUnavailable, match=f"no RPC tracker at {HOST}:{port}"):
            accel_target.load(d / "small.so", remote=remote.Device(HOST, port, KEY))
    code, _, err = accel_tvm("run", "small.so", "--input", "x.npy", "--rpc", "nowhere", "--key", KEY, cwd=d)
    assert code == 1 and "'nowhere' is not HOST:PORT" in err


def test_load_runs_on_the_device_and_checks_inputs_as_locally(cluster, small):
    device, _ = cluster
    d, model, x = small
    local = accel_target.load(d / "small.so")
    on_device = accel_target.load(d / "small.so", remote=device)
    assert on_device.session is not None and "remote" in str(on_device.device)
    assert str(on_device.weights[0].device) == str(on_device.device)  # the weights were read there
    np.testing.assert_allclose(on_device(x.numpy()).numpy(), local(x).numpy(), rtol=1e-5, atol=1e-6)
    assert all(t > 0 for t in on_device.times_ms(x.numpy(), number=2, repeat=2))
    with pytest.raises(ValueError, match=r"input 0 \(x\): expected shape \[1, 3, 16, 16\], given \[1, 3, 16, 15\]"):
        on_device(np.zeros((1, 3, 16, 15), "float32"))
    with pytest.raises(ValueError, match="expected a tensor on remote"):
        on_device(local.check_inputs([x.numpy()])[0])  # a tensor on this host
    del on_device  # the session ends with its last object: the server is free again


def test_a_tuple_result_comes_back_as_a_tuple(cluster, tmp_path):
    class Two(torch.nn.Module):
        def forward(self, x):
            return x * 2, x.sum(1)

    x = torch.randn(2, 3)
    accel_target.save(accel_target.build(accel_target.from_torch(Two(), (x,))), tmp_path / "two.so")
    device, _ = cluster
    doubled, summed = accel_target.load(tmp_path / "two.so", remote=device.session())(x.numpy())
    np.testing.assert_allclose(doubled.numpy(), x.numpy() * 2)
    np.testing.assert_allclose(summed.numpy(), x.numpy().sum(1), rtol=1e-6)


def test_run_and_bench_commands_on_the_device(cluster, small):
    device, _ = cluster
    d, model, x = small
    rpc = ["--rpc", f"{device.host}:{device.port}", "--key", KEY]
    code, out, err = accel_tvm("run", "small.so", "--input", "x.npy", "--output", "y.npy", "--repeat", "3", *rpc, cwd=d)
    assert code == 0, err
    assert f"(1 threads on '{KEY}' at {device.host}:{device.port})" in out
    np.testing.assert_allclose(np.load(d / "y.npy"), model(x).detach().numpy(), rtol=1e-4, atol=1e-5)
    code, out, err = accel_tvm("bench", "small.pt2", "--vs", "tvm,torch", "--repeat", "2", "--json", *rpc, cwd=d)
    assert code == 0, err
    results = json.loads(out)
    assert [r["runtime"] for r in results["results"]] == ["accel", "stock TVM"] and results["threads"] == 1
    assert all(r["ms"] > 0 for r in results["results"]) and "skipping torch" in err


def test_a_library_compiled_for_the_device_cpu_runs_there(cluster, small):
    """--mtriple/--mcpu/--mattr/--num-cores name the device's CPU, --cc the compiler that links
    for it: here an AVX2-only x86-64 CPU (every host that runs the tests has AVX2)."""
    device, _ = cluster
    d, model, x = small
    cross = ["--mtriple", "x86_64-linux-gnu", "--mcpu", "haswell", "--mattr", "+avx2,+fma", "--num-cores", "1"]
    code, out, err = accel_tvm("compile", "small.pt2", "-o", "haswell.so", *cross, "--cc", "gcc", "--json", cwd=d)
    assert code == 0, err
    assert json.loads(out)["files"] == ["haswell.so"]
    rpc = ["--rpc", f"{device.host}:{device.port}", "--key", KEY]
    code, out, err = accel_tvm("run", "haswell.so", "--input", "x.npy", "--output", "y_haswell.npy", *rpc, cwd=d)
    assert code == 0, err
    np.testing.assert_allclose(np.load(d / "y_haswell.npy"), model(x).detach().numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None, reason="no aarch64 cross compiler")
def test_a_library_for_an_aarch64_device_is_linked_for_it(cluster, small):
    """Cross-compiled for a 64-bit Arm CPU and linked by its compiler: an aarch64 ELF, which
    the x86-64 servers here refuse with an error naming the library."""
    device, _ = cluster
    d, _, _ = small
    cross = ["--mtriple", "aarch64-linux-gnu", "--mcpu", "cortex-a72", "--mattr", "+neon", "--num-cores", "4"]
    code, _, err = accel_tvm("compile", "small.pt2", "-o", "arm.so", *cross, "--cc", "aarch64-linux-gnu-gcc", cwd=d)
    assert code == 0, err
    header = (d / "arm.so").read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183  # EM_AARCH64
    rpc = ["--rpc", f"{device.host}:{device.port}", "--key", KEY]
    code, _, err = accel_tvm("run", "arm.so", "--input", "x.npy", *rpc, cwd=d)
    assert code == 1 and "the remote device cannot load" in err and "arm.so" in err, err


def test_tune_on_two_servers_survives_one_killed(cluster, small, monkeypatch):
    """Measurements on both servers at once; the server of the first measurement killed once
    its session is open, as the measurement starts (not raced against it, which a loaded CI
    host can lose): that measurement is tried again on the other server, and the tune
    finishes. Runs last: the module has one server after it."""
    device, servers = cluster
    d, model, x = small
    said, killed = [], []
    measure = tuner.time_libraries

    def first_measurement_killed(libraries, session, **kwargs):
        if not killed:  # (the first call only)
            deadline = time.monotonic() + 10
            while not _busy(servers) and time.monotonic() < deadline:
                time.sleep(0.02)
            killed.append((_busy(servers) or servers)[0])
            _kill(killed[0])
        return measure(libraries, session, **kwargs)

    monkeypatch.setattr(tuner, "time_libraries", first_measurement_killed)
    mod = accel_target.from_torch(model, (x,))
    db = d / "tuned.json"
    tuned = accel_target.tune(mod, db, limit=3, number=1, remote=device, parallel=2, timeout=60, progress=said.append)
    assert killed and len(tuned.entries) == len(json.loads(db.read_text())) == 2
    assert any("trying again on another server" in line for line in said), said
    executable = accel_target.build(mod, tuning_db=db)
    np.testing.assert_allclose(executable(x.numpy()).numpy(), model(x).detach().numpy(), rtol=1e-4, atol=1e-5)
