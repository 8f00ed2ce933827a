"""accel's thread pool (``pool.c``) in place of TVM's, for the libraries accel builds and loads.

``pool.c`` says how it differs from TVM's: the calling thread runs the tasks that no worker
has started, so a worker that another library's busy thread keeps off its core delays no
kernel. `install` points a loaded library's parallel launch at it (accel_target.tvm_private);
the library itself is unchanged, and loaded by TVM alone it runs on TVM's pool.

``pool.c`` is compiled once per source version with TVM's C compiler driver
(`tvm.support.cc`, the one `export_library` uses) against the C headers TVM installs
(``c_backend_api.h``: the parallel launch's types), into ``$XDG_CACHE_HOME/accel_target``
(``~/.cache/accel_target``); ``CC`` names the compiler (default ``gcc``). ``ACCEL_POOL=tvm``
keeps TVM's pool.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import tempfile
import warnings

import tvm_ffi.libinfo
from tvm import libinfo
from tvm.support import cc

from .. import tvm_private

SOURCE = os.path.join(os.path.dirname(__file__), "pool.c")
STATS = ("launches", "launches_alone", "tasks_by_caller", "tasks_by_workers")
_LOGGER = logging.getLogger("accel")


def compile_flags() -> list[str]:
    """The C compiler's flags for ``pool.c``: optimized, threads, TVM's headers."""
    includes = (libinfo.find_include_path(), tvm_ffi.libinfo.find_include_path())
    return ["-O2", "-pthread", *(f"-I{path}" for path in includes)]


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
            cc.create_shared(built, [SOURCE], options=compile_flags(), cc=os.environ.get("CC", "gcc"))
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


def available() -> bool:
    """Whether libraries get accel's pool: ``ACCEL_POOL`` is not ``tvm`` and ``pool.c``
    compiles and loads here (where it does not, a warning says so, once)."""
    return os.environ.get("ACCEL_POOL", "accel") != "tvm" and _library_or_warning() is not None


def install(path: str | os.PathLike) -> bool:
    """Run the kernels of the loaded library `path` (loaded by `tvm.runtime.load_module`) on
    accel's pool; False where they stay on TVM's (the reason logged at debug level)."""
    if not available():
        return False
    launch = ctypes.cast(library().accel_parallel_launch, ctypes.c_void_p).value
    why_not = tvm_private.point_pool_at(path, launch)
    if why_not is not None:
        _LOGGER.debug("accel pool: %s stays on TVM's pool: %s", path, why_not)
    return why_not is None


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
    kept every worker off its core (for tests)."""
    library().accel_pool_hold(1)
    try:
        yield
    finally:
        library().accel_pool_hold(0)
