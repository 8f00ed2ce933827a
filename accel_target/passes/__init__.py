"""The Relax graph and kernel passes accel adds to TVM's, one pass per module.

Before the pipeline, on the model's signature (accel_target.build):

    io_layouts            convert_input_layout / convert_output_layout: NHWC image inputs and outputs

In pipeline order (accel_target.pipeline: graph_passes, legalize_passes, kernel_passes):

    widen                 WidenHalfTypes: float16 / bfloat16 models computed in float32, outputs rounded
    indexing              CheckIndexing: indices inside their tensors, or an error naming the op
    division              CheckDivisors: an integer division by zero an error naming the op, not SIGFPE
    quantize              QuantizeQDQ: quantize / dequantize graphs to integer conv2d / matmul + requantize
    whole_input_pooling   WholeInputPooling: a pooling whose window is its whole input, as a mean or max
    simplify_layouts      SimplifyLayouts: permutes cancelled or folded, ops made visible to ConvertLayout
    fold_numpy            FoldConstantNumpy: elementwise and shape ops on constants, folded in numpy
    constants             BindConstantSizes: shape variables known at compile time become numbers
    pad_as_conv           PadAsConv: NCHW zero pads as identity convs, through ConvertLayout
    fold_subgraphs        FoldConstantSubgraphs: whatever depends on constants alone, folded by one build
    fast_math             FastMath: float32 GELU, softmax, sigmoid, tanh, softplus, Mish as vector code
    read_input_nchw       ReadInputNCHW: the first conv reads the NCHW image, not its transpose
    microbatch            MicroBatch: a batch's leading layers run one sample at a time
    fold_views            FoldViews: batch matmuls read their operands' layout ops in place (before LegalizeOps)
    constants             ZeroConstants: x * 0.0, x / 0.0 as IEEE 754 computes them (before LegalizeOps)
    constants             NaNSafe: x != x of NaN, full of an infinity as TVM cannot get wrong (before LegalizeOps)
    constants             ShareConstants: equal tensor constants become one (after LegalizeOps)
    constants             EmptyConstantsAtRunTime: a constant of no element made by a kernel
    inplace               WriteInPlace: a kernel writes its output over a residual that dies with it

FoldConstantNumpy runs again after ConvertLayout, and with SimplifyLayouts once more after TVM's
FoldConstant.
`relax_util` holds the small Relax helpers several of them share.
"""
