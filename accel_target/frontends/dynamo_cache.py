"""The disk cache of ``torch.compile(backend="accel")``: one folder per built graph, named by a
key over the graph, its constants, its input shapes and layouts, the build's options, the
target and accel's version (its sources, TVM's and PyTorch's versions), so that a second process
compiling the same graph loads the library instead of building it.

A folder holds what `accel_target.save` writes for a build with ``weights="separate"``:
``model.so`` (code only), ``model.so.params`` (the folded, packed weights) and
``model.so.json`` (the signature and report). It appears whole or not at all: it is written
under a scratch name and renamed (two processes that build the same graph at once both build;
the first rename wins, the other's folder is dropped).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tempfile

LIBRARY = "model.so"
_SOURCE_PACKAGES = ("accel_target", "topi_accel", "strategy")


def cache_dir(option: str | None) -> str:
    """The cache's folder: the backend's ``cache_dir`` option, else ``$ACCEL_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/accel_target/dynamo`` (``~/.cache`` without XDG_CACHE_HOME)."""
    if option:
        return os.fspath(option)
    if os.environ.get("ACCEL_CACHE_DIR"):
        return os.environ["ACCEL_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "accel_target", "dynamo")


@functools.cache
def accel_version() -> str:
    """accel as far as a build depends on it: the sources of accel_target, topi_accel and strategy
    (the package's version number does not change with them), TVM's and PyTorch's versions, and
    the host's target and machine."""
    import torch
    import tvm

    import accel_target

    digest = hashlib.sha256(f"{tvm.__version__} {torch.__version__}".encode())
    root = os.path.dirname(os.path.dirname(os.path.abspath(accel_target.__file__)))
    for package in _SOURCE_PACKAGES:
        for folder, subfolders, files in os.walk(os.path.join(root, package)):
            subfolders.sort()
            for name in sorted(files):
                if name.endswith((".py", ".c")):
                    with open(os.path.join(folder, name), "rb") as source:
                        digest.update(name.encode() + source.read())
    digest.update(f"{tvm.target.Target('accel')} {accel_target.machine()}".encode())
    return digest.hexdigest()


def add_tensor(digest, tensor) -> None:
    """Hash a tensor's dtype, shape and bytes into `digest`."""
    import torch

    t = tensor.detach().cpu().contiguous()
    digest.update(f"{t.dtype} {tuple(t.shape)}".encode())
    if t.numel():
        digest.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))


def new_key(tuning_db: str | None):
    """A sha256 started with accel's version and the tuning database's bytes (when there is one)."""
    digest = hashlib.sha256(accel_version().encode())
    if tuning_db and os.path.isfile(tuning_db):
        with open(tuning_db, "rb") as db:
            digest.update(db.read())
    return digest


def load_cached(folder: str):
    """The model saved in `folder`, or None when there is none (a broken entry is removed)."""
    import accel_target

    library = os.path.join(folder, LIBRARY)
    if not os.path.isfile(library):
        return None
    try:
        return accel_target.load(library, check_finite=False)
    except Exception:  # noqa: BLE001  (stale or truncated: built again)
        shutil.rmtree(folder, ignore_errors=True)
        return None


def store(executable, folder: str):
    """Save `executable` (built with ``weights="separate"``) as `folder`, atomically; the model
    loaded from there."""
    import accel_target

    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".building-", dir=parent)
    try:
        accel_target.save(executable, os.path.join(scratch, LIBRARY))
        try:
            os.rename(scratch, folder)
        except OSError:  # another process stored the same graph first: theirs is as good
            pass
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return accel_target.load(os.path.join(folder, LIBRARY), check_finite=False)


__all__ = ["LIBRARY", "accel_version", "add_tensor", "cache_dir", "load_cached", "new_key", "store"]
