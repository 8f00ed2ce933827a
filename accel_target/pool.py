"""accel's thread pool (``pool.c``) in place of TVM's, for the libraries accel loads.

A library TVM builds calls the thread pool through two function pointers it exports,
``__TVMBackendParallelLaunch`` and ``__TVMBackendParallelBarrier``, which TVM's loader sets
to TVM's pool when it opens the library. `install` points them at accel's pool instead
(``pool.c`` says how it differs: a worker that another library's thread keeps off its core
delays no kernel). The library itself is unchanged: loaded by TVM alone, it runs on TVM's
pool.

``pool.c`` is compiled once per source version with TVM's C compiler driver
(`tvm.support.cc`, the one `export_library` uses) into ``$XDG_CACHE_HOME/accel_target``
(``~/.cache/accel_target``); ``CC`` names the compiler (default ``gcc``). ``ACCEL_POOL=tvm``
keeps TVM's pool.
"""

from __future__ import annotations

import _ctypes
import contextlib
import ctypes
import functools
import hashlib
import os
import tempfile
import warnings

from tvm.support import cc

SOURCE = os.path.join(os.path.dirname(__file__), "pool.c")
LAUNCH, BARRIER = "__TVMBackendParallelLaunch", "__TVMBackendParallelBarrier"
POINTERS = {LAUNCH: "accel_parallel_launch", BARRIER: "accel_parallel_barrier"}


def available() -> bool:
    """Whether libraries get accel's pool: ``ACCEL_POOL`` is not ``tvm`` and ``pool.c``
    compiles and loads here (where it does not, a warning says so, once)."""
    return os.environ.get("ACCEL_POOL", "accel") != "tvm" and _library_or_warning() is not None


@functools.cache
def library() -> ctypes.CDLL:
    """accel's pool, compiled on first use."""
    with open(SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "accel_target")
    path = os.path.join(cache, f"pool-{digest}.so")
    if not os.path.isfile(path):
        os.makedirs(cache, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as scratch:
            built = os.path.join(scratch, "pool.so")
            cc.create_shared(built, [SOURCE], options=["-O2", "-pthread"], cc=os.environ.get("CC", "gcc"))
            os.replace(built, path)  # atomic: processes compiling at once each write a whole file
    return ctypes.CDLL(path)


@functools.cache
def _library_or_warning() -> ctypes.CDLL | None:
    """`library`, or None and a warning (once) if it does not compile or load here."""
    try:
        return library()
    except (RuntimeError, OSError) as err:
        warnings.warn(f"accel pool: {SOURCE} did not compile or load ({err}); kernels run on TVM's pool", stacklevel=3)
        return None


def install(path: str | os.PathLike) -> bool:
    """Point the loaded library at `path` (loaded by `tvm.runtime.load_module`) at accel's
    pool; False if it has no pool pointers, `ACCEL_POOL` is ``tvm`` or the pool does not
    compile here (no C compiler: a warning says so)."""
    if not available():
        return False
    try:
        handle = ctypes.CDLL(os.path.abspath(path), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:  # not loaded under this name: nothing to point elsewhere
        return False
    try:
        slots = {}
        for pointer in POINTERS:  # a library without barriers has no barrier pointer
            with contextlib.suppress(ValueError):
                slots[pointer] = ctypes.c_void_p.in_dll(handle, pointer)
        if LAUNCH not in slots:
            return False
        for pointer, slot in slots.items():
            slot.value = ctypes.cast(getattr(library(), POINTERS[pointer]), ctypes.c_void_p).value
        return True
    finally:  # the reference RTLD_NOLOAD took: TVM's module alone keeps the library loaded
        _ctypes.dlclose(handle._handle)


STATS = ("launches", "launches_alone", "tasks_by_caller", "tasks_by_workers")


def stats() -> dict[str, int]:
    """The pool's counters since the process started: launches; launches run as one task on
    the launching thread (another thread's launch had the workers, or a task launched);
    tasks run by launching threads; tasks run by the workers."""
    values = (ctypes.c_long * len(STATS))()
    library().accel_pool_stats(values)
    return dict(zip(STATS, values, strict=True))


@contextlib.contextmanager
def workers_held():
    """Launches within this block do not tell the workers, as if other libraries' threads
    kept every worker off its core (for tests: a kernel whose tasks meet at barriers must
    have run once before, as `pool.c` says)."""
    library().accel_pool_hold(1)
    try:
        yield
    finally:
        library().accel_pool_hold(0)
