"""accel: a layout-specialised Apache TVM target (NHWC/OHWI conv, [in, out] dense)."""

from setuptools import find_packages, setup

setup(
    name="accel-tvm",
    version="0.1.0",
    description="Apache TVM target whose kernels want NHWC activations, OHWI conv weights and [in, out] dense weights",
    packages=find_packages(include=["accel_target*", "topi_accel*", "strategy*"]),
    package_data={"accel_target.runtime": ["pool.c"]},  # compiled on first use (accel_target/runtime/pool.py)
    python_requires=">=3.10",
    install_requires=["apache-tvm==0.27.*", "numpy", "scipy"],
    extras_require={
        "test": ["pytest", "pytest-xdist", "hypothesis", "ruff==0.17.6"],
        # torch must be exactly 2.13.0: any other spec pulls CUDA wheels
        # torchao: PT2E quantization (prepare_pt2e / convert_pt2e, X86InductorQuantizer); its wheel
        # requires no torch version, so torch stays 2.13.0 (pip install --no-deps torchao==0.18.* alone)
        # timm: the test zoo's CNNs and hybrids (PyPI's torchvision, which it imports, is a CUDA
        # build: tests/torchvision_shim.py lets it load beside the CPU torch)
        "models": [
            "torch==2.13.0",
            "onnx",
            "onnxruntime",
            "matplotlib",
            "transformers==5.23.0",
            "torchao==0.18.*",
            "timm==1.0.31",
        ],
        # remote devices (accel_target.runtime.remote): TVM's RPC tracker imports tornado, and
        # its Tracker/Server.terminate use psutil; apache-tvm installs neither
        "rpc": ["tornado", "psutil"],
        # benchmarks/ (pytest-benchmark tests; run.py, report.py)
        "bench": ["pytest", "pytest-benchmark", "torch==2.13.0", "onnx", "onnxruntime"],
    },
    entry_points={
        "console_scripts": ["accel-tvm = accel_target.tools.cli:main"],
        # torch.compile(model, backend="accel"): PyTorch lists the names of this group and
        # imports a backend's module only where that backend is asked for
        "torch_dynamo_backends": ["accel = accel_target.frontends.dynamo:accel_backend"],
    },
)
