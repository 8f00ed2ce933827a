"""benchmarks/cpuid_cap.py on an AVX-512 host without CPUID faulting: a library whose CPUID and
XGETBV it patched reports an AVX2-only CPU, and ONNX Runtime patched so never runs AVX-512 code
(Linux's /proc/PID/task/TID/arch_status: when each thread last had AVX-512 state in use)."""

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import runs_here

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("cpuid_cap", ROOT / "benchmarks" / "cpuid_cap.py")
cpuid_cap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cpuid_cap)

pytestmark = [
    pytest.mark.skipif(not runs_here({"kind": "llvm", "mcpu": "skylake-avx512"}), reason="no AVX-512 here to hide"),
    pytest.mark.skipif(not shutil.which("objdump"), reason="patching a library needs objdump (binutils)"),
]

PROBE = r"""
#include <cpuid.h>
unsigned leaf7_ebx(void) { unsigned a, b, c, d; __cpuid_count(7, 0, a, b, c, d); return b; }
unsigned xcr0(void) { unsigned lo, hi; __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0)); return lo; }
unsigned vendor_ebx(void) { unsigned a, b, c, d; __cpuid(0, a, b, c, d); return b; }
unsigned signature(void) { unsigned a, b, c, d; __cpuid(1, a, b, c, d); return a; }
"""

READ_PROBES = """
import ctypes, json, sys
read = {}
for path in sys.argv[1:]:
    library = ctypes.CDLL(path)
    probes = [library.leaf7_ebx, library.xcr0, library.vendor_ebx, library.signature]
    for probe in probes:
        probe.restype = ctypes.c_uint
    read[path] = [probe() for probe in probes]
print(json.dumps(read))
"""

AVX512F = 1 << 16  # leaf 7 EBX
AVX2 = 1 << 5
# leaf 7 EBX's AVX-512 bits: F, DQ, IFMA, PF, ER, CD, BW, VL
AVX512_EBX = sum(1 << bit for bit in (16, 17, 21, 26, 27, 28, 30, 31))
AVX512_STATE = 0xE0  # XCR0: opmask, ZMM_Hi256, Hi16_ZMM
AMX_STATE = 0x60000  # XCR0: TILECFG, TILEDATA (an AMX host's; cleared too)
HIDDEN_STATE = AVX512_STATE | AMX_STATE
AMD = 0x68747541  # leaf 0 EBX: "Auth" of AuthenticAMD
# leaf 1 EAX, the model LLVM names the CPU by: Zen 3 (family 0x19, model 1) on an AMD host, else Haswell
SIGNATURES = {AMD: 0x00A00F11, None: 0x000306C3}


def test_patched_library_reports_an_avx2_only_cpu(tmp_path):
    source, original, patched = tmp_path / "probe.c", tmp_path / "probe.so", tmp_path / "patched.so"
    source.write_text(PROBE)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(source), "-o", str(original)], check=True)
    shutil.copy(original, patched)
    assert cpuid_cap.patch_library(str(patched)) == 4  # three CPUIDs, one XGETBV
    env = cpuid_cap.avx2_host_env(mode="patched")
    out = subprocess.run(
        [sys.executable, "-c", READ_PROBES, str(original), str(patched)],
        env=env,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    read = json.loads(out)
    (host_ebx, host_xcr0, host_vendor, _), (ebx, xcr0, vendor, signature) = read[str(original)], read[str(patched)]
    assert host_ebx & AVX512F and host_xcr0 & AVX512_STATE == AVX512_STATE
    assert not ebx & AVX512F and ebx & AVX2 and not xcr0 & HIDDEN_STATE
    assert ebx == host_ebx & ~AVX512_EBX and xcr0 | HIDDEN_STATE == host_xcr0 | HIDDEN_STATE  # nothing else
    assert vendor == host_vendor and signature == SIGNATURES.get(vendor, SIGNATURES[None]), hex(signature)


RUN_ORT = """
import glob, json, sys, time
import numpy as np, onnxruntime as ort
options = ort.SessionOptions()
options.intra_op_num_threads = 2
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
x = np.ones((1, 32, 28, 28), np.float32)
start = time.perf_counter()
while time.perf_counter() - start < 0.5:
    session.run(None, {"x": x})
since = (time.perf_counter() - start) * 1e3
last = []
for path in glob.glob("/proc/self/task/*/arch_status"):
    with open(path) as f:
        last.append(int(f.read().split()[-1]))
print(json.dumps({"onnxruntime": ort.__file__, "since_ms": since, "last_avx512_ms": last}))
"""


def _conv_model(path):
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.full((32, 32, 3, 3), 0.01, np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 32, 28, 28]) for n in ("x", "y")]
    graph = helper.make_graph([node], "conv", io[:1], io[1:], initializer=[weight])
    with open(path, "wb") as f:
        f.write(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())


@pytest.mark.skipif(not os.path.exists("/proc/self/arch_status"), reason="Linux reports no arch_status here")
def test_onnx_runtime_held_to_avx2_runs_no_avx512_code(tmp_path):
    pytest.importorskip("onnxruntime")
    model = tmp_path / "conv.onnx"
    _conv_model(model)

    def run(env) -> dict:
        out = subprocess.run(
            [sys.executable, "-c", RUN_ORT, str(model)],
            env={**os.environ, **env},
            check=True,
            stdout=subprocess.PIPE,
            text=True,
        ).stdout
        return json.loads(out)

    held = cpuid_cap.patched_env("onnxruntime")
    # the control: the same process with ONNX Runtime as installed, glibc and numpy held as above
    control = run({k: held[k] for k in ("GLIBC_TUNABLES", "NPY_DISABLE_CPU_FEATURES")})
    patched = run(held)
    assert patched["onnxruntime"].startswith(held["PYTHONPATH"].split(os.pathsep)[0] + os.sep)
    assert any(0 <= ms < control["since_ms"] for ms in control["last_avx512_ms"]), control
    assert all(ms == -1 or ms > patched["since_ms"] for ms in patched["last_avx512_ms"]), patched


def test_patched_env_keeps_the_callers_preloads_and_tunables(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/opt/caller/liballoc.so")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    env = cpuid_cap.patched_env()
    assert env["LD_PRELOAD"].split() == [cpuid_cap.library_path(), "/opt/caller/liballoc.so"]
    assert env["GLIBC_TUNABLES"].split(":") == ["glibc.malloc.arena_max=2", cpuid_cap.GLIBC_AVX2]
