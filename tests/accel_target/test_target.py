"""Target("accel"): tag, host CPU, AVX-512 code, variants, thread pool, idempotent import."""

import importlib
import os
import subprocess
import sys

import pytest
import tvm
from tvm import relax
from tvm.target import codegen

import accel_target
import topi_accel
from accel_target import target as target_module
from tests.helpers import ISAS, assert_close, matmul_module, rand, run_relax, runs_here, single_op_module


def test_tag_is_llvm_with_accel_keys_and_host_cpu():
    target = tvm.target.Target("accel")
    assert target.kind.name == "llvm"
    assert list(target.keys)[:2] == ["accel", "cpu"]
    assert target.attrs["mcpu"] == accel_target.host_cpu() != "native"
    assert codegen.llvm_is_valid_cpu(target.attrs["mcpu"], codegen.llvm_get_system_triple())
    assert accel_target.is_accel(target) and not accel_target.is_accel(tvm.target.Target("llvm"))


def _kernel_asm(target):
    target = tvm.target.Target(target)
    with target:
        geo = topi_accel.conv2d_geometry((1, 8, 8, 16), (32, 3, 3, 16), 1, 1)
        cfg = topi_accel.conv2d_config(geo)
    mod = tvm.IRModule({"main": topi_accel.conv2d_nhwc_ohwi_func(geo, cfg)})
    return tvm.tirx.build(mod, target).inspect_source("asm")


# the vector registers and FMA each ISA's kernels must use (compiled, not run: any host)
REGISTERS = {"avx512": ("zmm", True), "avx2": ("ymm", True), "sse": ("xmm", False)}
WIDER = {"zmm": [], "ymm": ["zmm"], "xmm": ["ymm", "zmm"]}


@pytest.mark.parametrize("isa", ISAS)
def test_kernels_use_the_vectors_of_their_isa(isa):
    asm = _kernel_asm(ISAS[isa])
    register, fma = REGISTERS[isa]
    assert register in asm and not any(wider in asm for wider in WIDER[register])
    assert ("vfmadd" in asm) == fma


def test_host_tag_uses_the_widest_vectors_of_the_host():
    widest = next((isa for isa in ISAS if runs_here(ISAS[isa])), "sse")
    register, _ = REGISTERS[widest]
    asm = _kernel_asm("accel")
    assert register in asm and not any(wider in asm for wider in WIDER[register])


def test_derived_avx2_variant_uses_256_bit_vectors():
    asm = _kernel_asm({"tag": "accel", "mcpu": "skylake-avx512", "mattr": ["-avx512f"]})
    assert "zmm" not in asm and "ymm" in asm


def test_derived_single_core_variant_has_no_parallel_loop():
    target = tvm.target.Target({"tag": "accel", "num-cores": 1})
    assert accel_target.is_accel(target)
    with target:
        cfg = topi_accel.dense_config(64, 64)
    assert "T.parallel" not in topi_accel.dense_kn_func(64, 64, 64, cfg).script()


def test_single_core_variant_keeps_whole_models_serial():
    # conv2d -> max_pool2d: neither the accel kernel nor TVM's pool gets a parallel loop, and the
    # conv keeps its padded copy (the TVM-kernel schedule must not take it for one of its own)
    x, w = rand(1, 3, 16, 16), rand(8, 3, 3, 3)
    mod = single_op_module(
        lambda x, w: relax.op.nn.max_pool2d(relax.op.nn.conv2d(x, w, padding=1), 2, 2), {"x": x}, {"w": w}
    )
    text = accel_target.optimize(mod, target={"tag": "accel", "num-cores": 1}).script()
    assert "T.parallel" not in text and "conv2d_nhwc_ohwi_pad" in text


def test_import_changes_no_environment_and_no_pool_of_tvms():
    """``import accel_target`` writes no environment variable, and TVM's own pool keeps the
    size TVM gives it (half the hardware threads, or TVM_NUM_THREADS)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TVM_")}
    code = (
        "import os, tvm; before = dict(os.environ); n = tvm.get_global_func('runtime.NumThreads')()\n"
        "import accel_target\n"
        "assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())\n"
        "assert tvm.get_global_func('runtime.NumThreads')() == n\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


@pytest.mark.parametrize(("setting", "threads"), [(None, None), ("1", 1), ("3", 3)])
def test_accel_threads_are_every_core_unless_chosen(monkeypatch, setting, threads):
    if setting is None:
        monkeypatch.delenv("TVM_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("TVM_NUM_THREADS", setting)
    assert accel_target.num_threads() == (threads or accel_target.host_cores())


def test_importing_twice_is_harmless():
    import strategy
    import strategy.conv2d
    import strategy.dense

    for module in (strategy.conv2d, strategy.dense, strategy, accel_target):
        importlib.reload(module)
    x, w = rand(3, 8), rand(8, 4)
    with accel_target.recording() as log:
        assert_close(run_relax(matmul_module(x, w, True), [x]), x @ w)
    assert [d.implementation for d in log] == ["dense_kn.accel"]
    assert [i.name for i in strategy.implementations("relax.matmul")] == [
        "strassen.accel",
        "batch_dense_kn.accel",
        "dense_kn.accel",
        "batch_matmul_kn.accel",
        "dense_kn_int8.accel",
    ]


# /proc/cpuinfo flags -> the x86-64 level the tag falls back to when LLVM does not know the CPU
CPU_LEVEL_CASES = [
    (set(), "x86-64"),
    ({"sse4_1", "sse4_2", "ssse3", "popcnt"}, "x86-64-v2"),
    ({"sse4_1", "sse4_2", "ssse3", "popcnt", "avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe"}, "x86-64-v3"),
    (
        {
            "avx",
            "avx2",
            "fma",
            "bmi1",
            "bmi2",
            "f16c",
            "movbe",
            "avx512f",
            "avx512bw",
            "avx512cd",
            "avx512dq",
            "avx512vl",
        },
        "x86-64-v4",
    ),
    ({"avx", "fma"}, "x86-64"),  # AVX without AVX2: no level above the baseline
]


@pytest.mark.parametrize("flags, level", CPU_LEVEL_CASES)
def test_unknown_host_cpu_falls_back_to_the_level_its_flags_allow(flags, level):
    assert target_module._cpu_level(flags) == level


V3_FLAGS = CPU_LEVEL_CASES[2][0]
V4_FLAGS = CPU_LEVEL_CASES[3][0]


@pytest.mark.parametrize(
    "named, flags, expected",
    [
        ("znver4", V3_FLAGS, "x86-64-v3"),  # a Zen 4 VM with AVX-512 hidden
        ("icelake-server", V3_FLAGS, "x86-64-v3"),  # an Ice Lake VM likewise
        ("athlon-xp", V3_FLAGS, "x86-64-v3"),  # an AMD CPU reporting an Intel model
        ("haswell", V4_FLAGS, "x86-64-v4"),  # a model LLVM knows older than the CPU
        ("znver3", V3_FLAGS, "znver3"),  # name and flags agree
        ("znver4", V4_FLAGS, "znver4"),
        ("znver4", set(), "znver4"),  # no /proc/cpuinfo: the name is all there is
    ],
)
def test_host_cpu_name_is_kept_only_where_the_flags_allow_its_isa(monkeypatch, caplog, named, flags, expected):
    monkeypatch.setattr(target_module.codegen, "llvm_get_system_cpu", lambda: named)
    monkeypatch.setattr(target_module, "_host_flags", lambda: set(flags))
    with caplog.at_level("WARNING", logger="accel_target.target"):
        assert target_module.host_cpu() == expected
    assert (f"LLVM names the host CPU {named!r}" in caplog.text) == (expected != named)
    # what the tag then compiles for has AVX-512 exactly where the flags have it
    has_avx512 = codegen.llvm_cpu_has_features(["avx512f"], tvm.target.Target({"kind": "llvm", "mcpu": expected}))
    assert bool(has_avx512) == ("avx512f" in flags or not flags)


def test_host_without_avx2_gets_sse_kernels_and_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(target_module, "host_cpu", lambda: "x86-64-v2")
    try:
        with caplog.at_level("WARNING", logger="accel_target.target"):
            target_module.register()
        assert "has no AVX2" in caplog.text and "128-bit SSE" in caplog.text
        assert topi_accel.cpu_knobs(tvm.target.Target("accel")).lanes == 4
        x, w = rand(4, 24), rand(24, 40)
        assert_close(run_relax(matmul_module(x, w, True), [x]), x @ w)
    finally:
        monkeypatch.undo()
        target_module.register()
    assert tvm.target.Target("accel").attrs["mcpu"] == accel_target.host_cpu()
