"""TE computes and s_tir schedules of the accel kernels, one op family per file.

Pure TE/TIR: nothing here knows about Relax, strategies or models.
"""

from . import conv2d_int8, dense_int8, tuning, views  # noqa: F401  (int8 kernels: topi_accel.conv2d_int8, .dense_int8)
from .conv1d import (
    conv1d_config,
    conv1d_geometry,
    conv1d_kernel_pack_map,
    conv1d_nwc_owi,
    conv1d_nwc_owi_func,
    schedule_conv1d_nwc_owi,
)
from .conv2d import (
    Conv2DConfig,
    Conv2DGeometry,
    conv2d_geometry,
    conv2d_nhwc_ohwi,
    conv2d_nhwc_ohwi_func,
    kernel_pack_map,
    nchw_data_reason,
    schedule_conv2d_nhwc_ohwi,
)
from .conv2d_configs import conv2d_candidates, conv2d_config, conv2d_key, tune_conv2d
from .dense import (
    DenseConfig,
    batch_dense_kn,
    batch_dense_kn_func,
    batch_matmul_config,
    batch_matmul_kn,
    batch_matmul_kn_func,
    check_dense,
    dense_config,
    dense_kn,
    dense_kn_func,
    schedule_dense_kn,
    weight_pack_map,
)
from .epilogue import contains_accel_kernel, inline_epilogue
from .generic import parallelize
from .knobs import CPUKnobs, cpu_knobs
from .strassen import strassen_combine_func, strassen_lefts_func
from .tir_passes import stacktiles  # noqa: F401
from .tir_passes.prefetch import insert_prefetches
from .tir_passes.wholetiles import whole_tiles
from .views import View
from .winograd import (
    WinogradConfig,
    conv2d_winograd,
    conv2d_winograd_func,
    schedule_conv2d_winograd,
    transform_kernel,
    winograd_condition,
    winograd_config,
)

__all__ = [
    "View",
    "batch_dense_kn",
    "batch_dense_kn_func",
    "batch_matmul_config",
    "batch_matmul_kn",
    "batch_matmul_kn_func",
    "CPUKnobs",
    "Conv2DConfig",
    "Conv2DGeometry",
    "conv1d_config",
    "conv1d_geometry",
    "conv1d_kernel_pack_map",
    "conv1d_nwc_owi",
    "conv1d_nwc_owi_func",
    "schedule_conv1d_nwc_owi",
    "DenseConfig",
    "check_dense",
    "insert_prefetches",
    "conv2d_candidates",
    "conv2d_config",
    "conv2d_key",
    "conv2d_geometry",
    "conv2d_nhwc_ohwi",
    "conv2d_nhwc_ohwi_func",
    "cpu_knobs",
    "dense_config",
    "dense_kn",
    "dense_kn_func",
    "contains_accel_kernel",
    "inline_epilogue",
    "kernel_pack_map",
    "nchw_data_reason",
    "parallelize",
    "whole_tiles",
    "schedule_conv2d_nhwc_ohwi",
    "schedule_dense_kn",
    "strassen_combine_func",
    "strassen_lefts_func",
    "tune_conv2d",
    "tuning",
    "weight_pack_map",
    "WinogradConfig",
    "conv2d_winograd",
    "conv2d_winograd_func",
    "schedule_conv2d_winograd",
    "transform_kernel",
    "winograd_condition",
    "winograd_config",
]
