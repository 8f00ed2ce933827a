"""An AVX2-only host, played by an AVX-512 one: CPUID reports no AVX-512, AVX-VNNI or AMX (cpuid_cap.c).

    python benchmarks/cpuid_cap.py python -m pytest tests

runs a command, and every process it starts, with cpuid_cap.c preloaded: CPUID reports a
Haswell (LLVM names the host CPU by its model) without those features, /proc/cpuinfo lacks
their flags, so the "accel" tag resolves to an AVX2 CPU and every library (numpy, PyTorch's
oneDNN and MKL, ONNX Runtime's MLAS) picks the code it would pick there. The command's
exit status is this script's. Needs Linux's CPUID faulting (most KVM guests and recent
Intel CPUs); without it the command does not run (exit 70).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpuid_cap.c")
# PyTorch's own switches to stay on AVX2 (oneDNN's convolutions, ATen's kernels, MKL's matrix
# products), set too: they hold it there whatever it reads from CPUID
AVX2_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def library_path() -> str:
    """The shared library built from cpuid_cap.c (built once per version of the source)."""
    with open(SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"accel-cpuid-cap-{digest}.so")
    if not os.path.exists(path):
        built = f"{path}.{os.getpid()}"
        command = [os.environ.get("CC", "gcc"), "-O2", "-shared", "-fPIC", SOURCE, "-o", built, "-ldl"]
        subprocess.run(command, check=True)
        os.replace(built, path)
    return path


def avx2_host_env(env: dict | None = None) -> dict:
    """`env` (default: this process's) for a process that runs as on an AVX2-only host."""
    env = dict(os.environ if env is None else env, ACCEL_AVX2_HOST="1", **AVX2_ENV)
    env["LD_PRELOAD"] = " ".join(filter(None, [library_path(), env.get("LD_PRELOAD")]))
    return env


def note() -> str:
    """What a results header adds in a process that runs as on an AVX2-only host ("" elsewhere)."""
    if os.environ.get("ACCEL_AVX2_HOST") != "1":
        return ""
    return (
        "; run as on an AVX2-only host on this AVX-512 one (benchmarks/cpuid_cap.py: CPUID reports a Haswell "
        "without AVX-512, AVX-VNNI or AMX to every contender)"
    )


def main(argv: list[str]) -> int:
    """Run `argv` as on an AVX2-only host (see the module's docstring); its exit status."""
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    status = subprocess.run(argv, env=avx2_host_env()).returncode
    return 128 - status if status < 0 else status  # killed by a signal: as a shell reports it


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
