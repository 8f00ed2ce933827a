"""AVX2 figures on an AVX-512 host: CPUID that reports an AVX2 CPU, for a while (cpuid_cap.c).

    with cpuid_cap.avx2():
        import onnxruntime  # its MLAS picks its AVX2 / FMA kernels, for good

A library that picks its kernels from CPUID when it loads keeps what it picked; the rest of
the process (TVM's LLVM, PyTorch, whatever installs its own SIGSEGV handler afterwards) runs
with CPUID as it is. PyTorch has switches of its own (`AVX2_ENV`), and accel a target
(``{"tag": "accel", "mcpu": "haswell"}``); ONNX Runtime reads CPUID and has none.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import subprocess
import tempfile

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpuid_cap.c")
# what PyTorch reads to stay on AVX2: oneDNN (convolutions), ATen's own kernels, MKL (its
# matrix products: BERT-2L 17.4 ms with the first two alone, 26.3 with MKL held too)
AVX2_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def _library() -> ctypes.CDLL:
    with open(SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"accel-cpuid-cap-{digest}.so")
    if not os.path.exists(path):
        built = f"{path}.{os.getpid()}"
        subprocess.run([os.environ.get("CC", "gcc"), "-O2", "-shared", "-fPIC", SOURCE, "-o", built], check=True)
        os.replace(built, path)
    return ctypes.CDLL(path)


@contextlib.contextmanager
def avx2():
    """Within the block, CPUID in this thread (and in threads it starts, for good) reports no
    AVX-512, AVX-VNNI or AMX. Raises RuntimeError where Linux cannot make CPUID fault (no
    CPUID faulting on this CPU or hypervisor)."""
    library = _library()
    if library.accel_cpuid_cap_avx2() != 0:
        raise RuntimeError("cpuid_cap: this CPU or kernel has no CPUID faulting (arch_prctl ARCH_SET_CPUID)")
    try:
        yield
    finally:
        library.accel_cpuid_uncap()
