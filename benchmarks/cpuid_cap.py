"""An AVX2-only host, played by an AVX-512 one: CPUID reports no AVX-512, AVX-VNNI or AMX (cpuid_cap.c).

    python benchmarks/cpuid_cap.py [--patched | --qemu] python -m pytest tests

runs a command, and every process it starts, with cpuid_cap.c preloaded: CPUID reports a
Haswell, or a Zen 3 on an AMD host (LLVM names the host CPU by its model), without those
features, /proc/cpuinfo lacks their flags, so the "accel" tag resolves to an AVX2 CPU and
every library (numpy, PyTorch's oneDNN and MKL, ONNX Runtime's MLAS) picks the code it would
pick there. The command's exit status is this script's. Needs Linux's CPUID faulting (most
KVM guests and recent Intel CPUs); without it the command does not run (exit 70).

--patched does the same on a host without CPUID faulting (AMD): TVM, TVM FFI and ONNX Runtime
are imported from copies whose CPUID and XGETBV instructions ask the preload instead
(patched_env; made once, in the temporary directory, about 2 minutes), numpy, PyTorch and
glibc are held by their own switches; it stops (exit 1) unless TVM from its copy names an
AVX2 (x86-64-v3) CPU. Native speed, but nothing stops an AVX-512 instruction that reaches the CPU: that
is what --qemu adds.

--qemu runs the command's Python processes in QEMU's user-mode emulator instead
(qemu-x86_64, Debian's qemu-user; no CPUID faulting needed): its Haswell has no AVX-512
registers at all, so an AVX-512 instruction that reaches the CPU is an illegal-instruction
crash, as on a real AVX2-only host. `python` on the command's PATH, and sys.executable in
it, start QEMU, so every Python process it starts runs there too; other programs (the
compiler TVM links libraries with) run on the host. 7-13x slower: for tests, not
timings (a results header made there says so).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpuid_cap.c")
# PyTorch's own switches to stay on AVX2 (oneDNN's convolutions, ATen's kernels, MKL's matrix
# products) and OpenBLAS's (numpy's matrix products), set too: they hold each there whatever
# it reads from CPUID, which the preload answers only under CPUID faulting
AVX2_ENV = {
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "OPENBLAS_CORETYPE": "Haswell",
}
# glibc's string functions, which the dynamic loader chooses by CPUID before a preload can answer
GLIBC_AVX2 = "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD"
QEMU = "qemu-x86_64"
# QEMU's Haswell without the features its emulator lacks (it warns about each at every start)
QEMU_CPU = "Haswell-noTSX,-pcid,-x2apic,-tsc-deadline,-invpcid"


def _digest(path: str) -> str:
    """A short hash of the file `path`: what names the versions made from it."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def library_path() -> str:
    """The shared library built from cpuid_cap.c (built once per version of the source)."""
    path = os.path.join(tempfile.gettempdir(), f"accel-cpuid-cap-{_digest(SOURCE)}.so")
    if not os.path.exists(path):
        built = f"{path}.{os.getpid()}"
        command = [os.environ.get("CC", "gcc"), "-O2", "-shared", "-fPIC", SOURCE, "-o", built, "-ldl"]
        subprocess.run(command, check=True)
        os.replace(built, path)
    return path


def avx2_host_env(env: dict | None = None, mode: str = "1") -> dict:
    """`env` (default: this process's) for a process that runs as on an AVX2-only host: with
    CPUID faulting (`mode` "1"), or under QEMU ("qemu": cpuid_cap.c filters /proc/cpuinfo only)."""
    env = dict(os.environ if env is None else env, ACCEL_AVX2_HOST=mode, **AVX2_ENV)
    env["GLIBC_TUNABLES"] = ":".join(filter(None, [env.get("GLIBC_TUNABLES"), GLIBC_AVX2]))
    env["LD_PRELOAD"] = " ".join(filter(None, [library_path(), env.get("LD_PRELOAD")]))
    return env


# the packages --patched imports from patched copies: those with the code whose choices the
# tests check (TVM's LLVM names the host CPU, ONNX Runtime picks its kernels)
PATCHED = ("tvm", "tvm_ffi", "onnxruntime")
# what --patched checks first: the CPU TVM's LLVM names (by the CPUID the copy asks) and its
# x86-64 level, which must be AVX2's
NAMED_CPU = (
    "from tvm.target import codegen\n"
    "from accel_target.target import named_cpu_level\n"
    "cpu = str(codegen.llvm_get_system_cpu())\n"
    "print(cpu, named_cpu_level(cpu))\n"
)
# a library's CPUID and XGETBV, and the software interrupts that replace them (cpuid_cap.c)
PATCHES = {"cpuid": (b"\x0f\xa2", b"\xcd\xa2"), "xgetbv": (b"\x0f\x01\xd0", b"\xcd\xa3\x90")}


def _objdump(*args: str) -> str:
    return subprocess.run(["objdump", *args], stdout=subprocess.PIPE, text=True, check=True).stdout


def patch_library(path: str) -> int:
    """Replace every CPUID and XGETBV in the code of the shared library `path` (found by
    objdump's disassembly) by the interrupt cpuid_cap.c answers for it; how many."""
    sections = {}  # name -> (address, file offset), from objdump's section table
    for line in _objdump("-h", path).splitlines():
        fields = line.split()
        if len(fields) == 7 and fields[0].isdigit():
            sections[fields[1]] = (int(fields[3], 16), int(fields[5], 16))
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        section, count = None, 0
        for line in _objdump("-d", "--no-show-raw-insn", path).splitlines():
            if line.startswith("Disassembly of section "):
                section = line.split()[-1].rstrip(":")
            found = re.fullmatch(r"\s*([0-9a-f]+):\s+(cpuid|xgetbv)\s*", line)
            if found:
                address, offset = sections[section]
                at = int(found[1], 16) - address + offset
                old, new = PATCHES[found[2]]
                if data[at : at + len(old)] != old:
                    raise RuntimeError(f"cpuid_cap: {path} at {at:#x} is not the {found[2]} objdump shows")
                data[at : at + len(old)] = new
                count += 1
        f.seek(0)
        f.write(data)
    return count


def patched_package(name: str) -> str:
    """A directory holding a copy of the installed package `name` whose shared libraries ask
    cpuid_cap.c for CPUID and XGETBV (patch_library), for a process without CPUID faulting:
    put it first on PYTHONPATH (patched_env). Made once per version of the package and of
    this script, in the temporary directory."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"cpuid_cap: no installed package {name!r} to patch")
    # the distribution that installs it (apache-tvm installs tvm)
    version = importlib.metadata.version(importlib.metadata.packages_distributions().get(name, [name])[0])
    root = os.path.join(tempfile.gettempdir(), f"accel-avx2-{name}-{version}-{_digest(__file__)}")
    if not os.path.isdir(root):
        building = f"{root}.{os.getpid()}"
        shutil.copytree(spec.submodule_search_locations[0], os.path.join(building, name))
        for folder, _, files in os.walk(building):
            for file in files:
                if ".so" in file:
                    patch_library(os.path.join(folder, file))
        try:
            os.replace(building, root)
        except OSError:  # another process made it first
            shutil.rmtree(building)
    return root


def patched_env(*packages: str) -> dict:
    """Environment entries for a process that runs `packages` (patched_package, first on this
    process's PYTHONPATH) as on an AVX2-only host, on a host without CPUID faulting; numpy,
    which reads CPUID itself, is told to leave its AVX-512 loops (NPY_DISABLE_CPU_FEATURES
    takes only the ones it has). This process's preloads and glibc tunables are kept beside
    ours."""
    from numpy._core._multiarray_umath import __cpu_dispatch__

    env = avx2_host_env({k: os.environ[k] for k in ("GLIBC_TUNABLES", "LD_PRELOAD") if k in os.environ}, mode="patched")
    paths = [patched_package(name) for name in packages] + [os.environ.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    env["NPY_DISABLE_CPU_FEATURES"] = " ".join(f for f in __cpu_dispatch__ if f == "X86_V4" or f.startswith("AVX512"))
    return env


def qemu_env(root: str) -> dict:
    """The environment of a command whose Python runs under QEMU's Haswell: `root`/bin holds
    scripts named python, python3 and python3.N that start this interpreter in QEMU with
    argv[0] their own path, which Python takes for sys.executable; in a venv, `root` stands in
    for it (its pyvenv.cfg, a link to its lib), so the venv's packages are found."""
    qemu = shutil.which(QEMU)
    if qemu is None:
        raise SystemExit(f"cpuid_cap: --qemu needs {QEMU} on PATH (Debian: apt-get install qemu-user)")
    bin_dir = os.path.join(root, "bin")
    os.makedirs(bin_dir)
    script = f'#!/bin/sh\nexec {qemu} -cpu {QEMU_CPU} -0 "$0" {os.path.realpath(sys.executable)} "$@"\n'
    for name in ("python", "python3", f"python3.{sys.version_info.minor}"):
        path = os.path.join(bin_dir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(script)
        os.chmod(path, 0o755)
    if sys.prefix != sys.base_prefix:
        shutil.copy(os.path.join(sys.prefix, "pyvenv.cfg"), root)
        os.symlink(os.path.join(sys.prefix, "lib"), os.path.join(root, "lib"))
    env = avx2_host_env(mode="qemu")
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    return env


def note() -> str:
    """What a results header adds in a process that runs as on an AVX2-only host ("" elsewhere)."""
    mode = os.environ.get("ACCEL_AVX2_HOST")
    if mode == "qemu":
        return "; run under QEMU's user-mode Haswell (benchmarks/cpuid_cap.py --qemu): times are the emulator's"
    if mode != "1":
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
    if argv[0] == "--patched":
        env = dict(os.environ, **patched_env(*PATCHED))
        cpu = subprocess.run([sys.executable, "-c", NAMED_CPU], env=env, stdout=subprocess.PIPE, text=True).stdout
        if not cpu.endswith(" x86-64-v3\n"):
            raise SystemExit(f"cpuid_cap: TVM from the patched copy names the host {cpu.strip()!r}, not an AVX2 CPU")
        status = subprocess.run(argv[1:], env=env).returncode
    elif argv[0] != "--qemu":
        status = subprocess.run(argv, env=avx2_host_env()).returncode
    else:
        with tempfile.TemporaryDirectory(prefix="accel-qemu-") as root:
            status = subprocess.run(argv[1:], env=qemu_env(root)).returncode
    return 128 - status if status < 0 else status  # killed by a signal: as a shell reports it


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
