"""accel: a layout-specialised Apache TVM target (NHWC/OHWI conv, [in, out] dense)."""

from setuptools import find_packages, setup

setup(
    name="accel-tvm",
    version="0.1.0",
    description="Apache TVM target whose kernels want NHWC activations, OHWI conv weights and [in, out] dense weights",
    packages=find_packages(include=["accel_target*", "topi_accel*", "strategy*"]),
    package_data={"accel_target": ["pool.c"]},  # compiled on first use (accel_target/pool.py)
    python_requires=">=3.10",
    install_requires=["apache-tvm==0.27.*", "numpy", "scipy"],
    extras_require={
        "test": ["pytest", "pytest-xdist", "hypothesis", "ruff==0.17.6"],
        # torch must be exactly 2.13.0: any other spec pulls CUDA wheels
        "models": ["torch==2.13.0", "onnx", "onnxruntime", "matplotlib", "transformers==5.23.0"],
    },
    entry_points={"console_scripts": ["accel-tvm = accel_target.cli:main"]},
)
