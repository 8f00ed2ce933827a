"""Target("accel"): a tag over the LLVM kind, keys ("accel", "cpu"), tuned for this host.

Variants need no edit of the package: a target dict that names the tag and
overrides what the schedules read, e.g.

    Target({"tag": "accel", "num-cores": 1})           # single-threaded kernels
    Target({"tag": "accel", "mattr": ["-avx512f"]})    # 256-bit (AVX2) tiles
    Target({"tag": "accel", "mcpu": "skylake-avx512"}) # another CPU

Every target whose keys contain "accel" gets the accel kernels.
"""

from __future__ import annotations

import functools
import logging
import os
import platform

import tvm
from tvm.target import codegen

from topi_accel import amx

TAG = "accel"
KEY = "accel"
logger = logging.getLogger(__name__)


def host_cores() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def host_cpu() -> str:
    """LLVM name of the host CPU.

    ``mcpu="native"`` is not valid for the conda triple TVM 0.27's LLVM 22
    uses, and LLVM then silently emits generic x86-64 code (no AVX at all),
    so the tag carries the detected name instead.

    LLVM names the CPU by its vendor, family and model, not by the features
    the CPU reports, so the name is kept only where its x86-64 level is the
    one the CPU's flags allow: a VM whose hypervisor hides AVX-512 may still be
    named after an AVX-512 CPU, and code for that name would stop at its first
    AVX-512 instruction. Otherwise the level stands
    in (x86-64-v3 there).
    """
    cpu = str(codegen.llvm_get_system_cpu())
    triple = str(codegen.llvm_get_system_triple())
    flags = _host_flags()
    level = _cpu_level(flags)
    if not (cpu and cpu != "generic" and codegen.llvm_is_valid_cpu(cpu, triple)):
        logger.warning("accel: LLVM does not know host CPU %r; using %s (from the CPU's flags)", cpu, level)
        return level
    named = named_cpu_level(cpu)
    if flags and named != level:  # (no flags to read, not Linux: the name is all there is)
        logger.warning("accel: LLVM names the host CPU %r (%s), but its flags allow %s; using that", cpu, named, level)
        return level
    return _with_amx(cpu)


# x86-64 micro-architecture levels by the /proc/cpuinfo flags they need, widest first
CPU_LEVELS = (
    ("x86-64-v4", {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}),
    ("x86-64-v3", {"avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe"}),
    ("x86-64-v2", {"sse4_1", "sse4_2", "ssse3", "popcnt"}),
)
# LLVM's names of the flags above that it names otherwise
LLVM_FEATURES = {"bmi1": "bmi", "sse4_1": "sse4.1", "sse4_2": "sse4.2"}


def named_cpu_level(cpu: str) -> str:
    """The widest x86-64 level whose features the LLVM CPU `cpu` has (plain x86-64 if none)."""
    target = tvm.target.Target({"kind": "llvm", "mcpu": cpu})
    for level, needed in CPU_LEVELS:
        if codegen.llvm_cpu_has_features([LLVM_FEATURES.get(flag, flag) for flag in needed], target):
            return level
    return "x86-64"


# The first LLVM CPU with AMX, and the /proc/cpuinfo flags of what LLVM may emit for it.
AMX_CPU = (
    "sapphirerapids",
    {"amx_tile", "amx_int8", "amx_bf16", "avx512_fp16", "avx512_bf16", "avx_vnni", "avx512_vnni"},
)


def _with_amx(cpu: str) -> str:
    """`cpu`, or the first LLVM CPU with AMX when the host has AMX (its flags, and Linux lends
    this process the tile registers) but LLVM's name for it lacks it: LLVM names the CPU by
    its model number, and a VM may report an older model than the features it lends."""
    name, flags = AMX_CPU
    if codegen.llvm_cpu_has_features(["amx-int8"], tvm.target.Target({"kind": "llvm", "mcpu": cpu})):
        return cpu
    if not flags <= _host_flags() or not amx.request_permission():
        return cpu
    return name


@functools.cache  # the host's flags do not change; the tag and AMX's check both read them
def _host_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            line = next((line for line in cpuinfo if line.startswith("flags")), "")
    except OSError:
        return frozenset()
    return frozenset(line.split(":", 1)[-1].split())


def _cpu_level(flags: frozenset[str]) -> str:
    """The widest x86-64 level whose features `flags` all has (plain x86-64 if none)."""
    return next((level for level, needed in CPU_LEVELS if needed <= flags), "x86-64")


def target_config() -> dict:
    """The dict the "accel" tag stands for on this host (AMX off where the CPU has it but
    Linux does not lend this process its registers: a tile instruction would fault)."""
    config = {"kind": "llvm", "keys": [KEY, "cpu"], "mcpu": host_cpu(), "num-cores": host_cores()}
    if amx.available(tvm.target.Target({"kind": "llvm", "mcpu": config["mcpu"]})) and not amx.request_permission():
        config["mattr"] = [f"-{feature}" for feature in amx.FEATURES]
    return config


def is_accel(target: tvm.target.Target | None) -> bool:
    """Whether `target` asks for the accel kernels."""
    return target is not None and KEY in [str(k) for k in target.keys]


def num_threads() -> int:
    """Threads accel's pool runs kernels on: ``TVM_NUM_THREADS`` where set, else every core
    this process may run on (runtime/pool.c reads the same)."""
    value = os.environ.get("TVM_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else host_cores()


def machine() -> str:
    """This machine, as the benchmark tables name it."""
    return f"{host_cpu()} ({platform.machine()}, {os.cpu_count()} cores)"


def register() -> None:
    """Register the "accel" tag (idempotent)."""
    config = target_config()
    tvm.target.register_tag(TAG, config, override=True)
    if not codegen.llvm_cpu_has_features(["avx2"], tvm.target.Target(TAG)):
        logger.warning(
            "accel: host CPU %s has no AVX2; the kernels use 128-bit SSE vectors: correct, "
            "but several times slower than on an AVX2 or AVX-512 host",
            config["mcpu"],
        )
