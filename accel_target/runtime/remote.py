"""Remote devices through TVM's RPC tracker: where `load(path, remote=...)` runs a saved model,
and where `accel-tvm run|bench|tune --rpc HOST:PORT --key KEY` run and time.

A device is a TVM RPC server registered at a TVM RPC tracker under a key, both TVM's own
programs (their tracker needs ``pip install accel-tvm[rpc]``: tornado and psutil)::

    python -m tvm.exec.rpc_tracker --host 127.0.0.1 --port 9190
    python -m tvm.exec.rpc_server --tracker 127.0.0.1:9190 --key mybox --host 127.0.0.1

A `Device` names one such key at one tracker; each `Device.session` is a session on one free
server of the key: the tracker hands a server to one session at a time, and takes it back
when every object of the session (its modules, tensors, VirtualMachines) is dropped.

A server runs whatever library a session sends it: the commands here bind to 127.0.0.1, and
a server or tracker listening on a network is its owner's explicit choice.

What a session needs, and TVM does not do for it: the library and its weights are uploaded
and loaded on the device (`upload_module`, `load_weights`: the weights file is read there,
not copied tensor by tensor); inputs go to the device before the call; a tuple result comes
back as an opaque handle, read with the device's own array functions (`fetch`). Two of TVM's
waits are bounded here: ``tvm.rpc.connect_tracker`` retries a refused connection for 60 s
and then raises a bare error (`check_tracker` fails at once, naming HOST:PORT), and
``TrackerSession.request`` blocks forever for a key no server has (`request` fails at once,
and waits at most ``Device.wait`` seconds for a busy one).
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass

from tvm import rpc
from tvm.rpc import base
from tvm.rpc.base import TrackerCode

# seconds to wait for the tracker to answer the handshake or a summary
TRACKER_TIMEOUT = 5.0
# sessions to try when the server the tracker named is gone before we reach it
CONNECT_ATTEMPTS = 3


class TrackerUnavailable(ConnectionError):
    """No TVM RPC tracker answers at HOST:PORT; the message is one line naming HOST:PORT."""


class NoFreeDevice(TimeoutError):
    """No server of the key is registered, or none became free in time."""


def parse_address(text: str) -> tuple[str, int]:
    """("host", port) of "HOST:PORT"; a ValueError naming `text` otherwise."""
    host, _, port = str(text).rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"RPC tracker address {text!r} is not HOST:PORT (e.g. 127.0.0.1:9190)")
    return host, int(port)


def _open(host: str, port: int, timeout: float) -> socket.socket:
    """A socket to the tracker at host:port after TVM's handshake; TrackerUnavailable if none answers."""
    where = f"{host}:{port}"
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except ConnectionRefusedError:
        raise TrackerUnavailable(f"no RPC tracker at {where}: connection refused") from None
    except OSError as err:
        raise TrackerUnavailable(f"cannot reach the RPC tracker at {where}: {err.strerror or err}") from None
    try:
        sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
        answer = base.recvall(sock, 4)
    except (OSError, RuntimeError):
        answer = b""
    if len(answer) != 4 or struct.unpack("<i", answer)[0] != base.RPC_TRACKER_MAGIC:
        sock.close()
        raise TrackerUnavailable(f"{where} does not answer as a TVM RPC tracker within {timeout:g} s")
    return sock


def check_tracker(host: str, port: int, timeout: float = TRACKER_TIMEOUT) -> None:
    """Raise TrackerUnavailable at once unless a TVM RPC tracker answers at host:port."""
    _open(host, port, timeout).close()


def _summary(sock: socket.socket) -> dict:
    base.sendjson(sock, [TrackerCode.SUMMARY])
    code, summary = base.recvjson(sock)
    if code != TrackerCode.SUCCESS:
        raise RuntimeError(f"the RPC tracker answered a summary with {code}")
    return summary


def _status(summary: dict, key: str) -> dict:
    registered = sum(1 for s in summary["server_info"] if s["key"] == f"server:{key}")
    queue = summary["queue_info"].get(key, {"free": 0, "pending": 0})
    return {"registered": registered, "free": queue["free"], "pending": queue["pending"]}


@dataclass(frozen=True)
class Device:
    """The servers registered under `key` at the RPC tracker `host`:`port`.

    wait: seconds `session` waits for one of them to be free (None: as long as it takes).
    session_timeout: seconds the server gives each session before it ends it (0: no limit);
        a call still running then raises tvm.error.RPCSessionTimeoutError.
    """

    host: str
    port: int
    key: str
    wait: float | None = None
    session_timeout: float = 0

    @classmethod
    def parse(cls, address: str, key: str, **options) -> Device:
        """The Device of "HOST:PORT" and `key` (`options`: wait, session_timeout)."""
        if not key:
            raise ValueError(f"a remote device at {address} needs the key its servers registered under")
        return cls(*parse_address(address), key, **options)

    def __str__(self) -> str:
        return f"'{self.key}' at {self.host}:{self.port}"

    def status(self) -> dict:
        """{"registered": servers of the key, "free": those not in a session, "pending": requests waiting}."""
        with _open(self.host, self.port, TRACKER_TIMEOUT) as sock:
            return _status(_summary(sock), self.key)

    def session(self) -> rpc.RPCSession:
        """A session on a free server of the key (`request`)."""
        return request(self)


def _ask(device: Device) -> tuple[str, int, str]:
    """(url, port, match key) of a server the tracker gives `device`'s key, waiting at most device.wait."""
    where = f"{device.host}:{device.port}"
    with _open(device.host, device.port, TRACKER_TIMEOUT) as sock:
        sock.settimeout(TRACKER_TIMEOUT)
        status = _status(_summary(sock), device.key)
        if status["registered"] == 0:
            raise NoFreeDevice(f"no RPC server with key '{device.key}' is registered at the tracker {where}")
        sock.settimeout(device.wait)
        base.sendjson(sock, [TrackerCode.REQUEST, device.key, "", 1])
        try:
            code, value = base.recvjson(sock)
        except TimeoutError:
            # the tracker drops the request once this connection is closed
            raise NoFreeDevice(
                f"no '{device.key}' server at {where} became free within {device.wait:g} s "
                f"({status['registered']} registered, all busy)"
            ) from None
    if code != TrackerCode.SUCCESS:
        raise RuntimeError(f"the RPC tracker at {where} answered a request for '{device.key}' with {code}")
    return tuple(value)


def request(device: Device) -> rpc.RPCSession:
    """A session on a free server of `device`'s key: like ``TrackerSession.request``, but a
    NoFreeDevice at once when no server has the key, and after ``device.wait`` seconds when all
    are busy; a server that went away between the tracker's answer and the connection is
    replaced by another."""
    error = None
    for _ in range(CONNECT_ATTEMPTS):
        url, port, match = _ask(device)
        try:
            return rpc.connect(url, port, match, device.session_timeout)
        except (RuntimeError, OSError) as err:
            error = err
    raise ConnectionError(f"could not open a session on {device}: {error}")


def session_of(remote) -> rpc.RPCSession:
    """An RPC session for `remote`: a Device (a new session on one of its servers) or a session."""
    if isinstance(remote, Device):
        return remote.session()
    if isinstance(remote, rpc.RPCSession):
        return remote
    raise TypeError(
        f"accel remote: expected an accel_target.runtime.remote.Device or a tvm.rpc.RPCSession, "
        f"given {type(remote).__name__}"
    )


def upload_module(session: rpc.RPCSession, path: str):
    """`path` (a library) uploaded to the session's folder and loaded there; a RuntimeError
    naming the library when the device cannot load it (built for another CPU, say)."""
    session.upload(path)
    try:
        return session.load_module(os.path.basename(path))
    except Exception as err:
        lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
        raise RuntimeError(
            f"accel load: the remote device cannot load {path!r} ({lines[-1] if lines else type(err).__name__}); "
            f"was it built for that device's CPU (--mtriple, --mcpu) and linked by its compiler (--cc)?"
        ) from None


def load_weights(session: rpc.RPCSession, path: str, count: int) -> list:
    """The tensors w0 .. w{count-1} of the weights file `path` (TVM's parameter format, as
    `save` writes it), uploaded and read on the device; a ValueError naming a missing one."""
    session.upload(path)
    where = session.get_function("tvm.rpc.server.workpath")(os.path.basename(path))
    # the loaded Map comes back as a handle: it is read with the device's own functions
    params = session.get_function("runtime.LoadParamsFromFile")(where)
    size = int(session.get_function("ffi.MapSize")(params))
    if size != count:
        raise ValueError(f"accel load: {path!r} holds {size} weights; the model takes {count}")
    get = session.get_function("ffi.MapGetItem")
    try:
        return [get(params, f"w{i}") for i in range(count)]
    except Exception as err:
        raise ValueError(
            f"accel load: {path!r} does not hold the weights w0..w{count - 1} that accel_target.save writes: "
            f"{str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__}"
        ) from None


def fetch(session: rpc.RPCSession, result):
    """What main returned on the device as the local VM returns it: a Tensor as it is, a tuple
    (a handle over RPC) as a tuple of the device's Tensors, nested tuples alike."""
    if type(result).__name__ != "RPCObjectRef":  # (TVM registers the class from C++ only)
        return result
    size = int(session.get_function("ffi.ArraySize")(result))
    item = session.get_function("ffi.ArrayGetItem")
    return tuple(fetch(session, item(result, i)) for i in range(size))


def threads(session: rpc.RPCSession) -> int:
    """Threads of the device's TVM runtime pool."""
    return int(session.get_function("runtime.NumThreads")())
