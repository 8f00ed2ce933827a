"""What accel does to an ExportedProgram before TVM's importer reads it: our decomposition
table, and PyTorch-computed constants for what depends on no input.

- Decompositions: PyTorch's default table but for ``scaled_dot_product_attention``,
  which stays one node (its decomposition fails to re-trace GPT-2 at batch 2, and
  hides the two products of attention behind broadcasts and reshapes), and for
  ``nn.Unfold`` / ``nn.Fold`` into non-overlapping patches (kernel = stride, no padding or
  dilation, the size a multiple of the kernel: MobileViT-v2's patches), which are a reshape
  and a permute, not PyTorch's gather / scatter-add over index arrays: the layout passes carry
  reshapes and permutes, so such a block runs in NHWC with one transpose each way; and
  ``nn.RReLU`` in eval mode, which PyTorch's table leaves as it is, as the leaky ReLU it then is.
- Input-independent subgraphs (a decoder's causal mask, built from ``arange``,
  ``diff``, ``cumsum`` and broadcast indexing; Llama's rotary cos/sin tables) are
  computed by PyTorch itself at import and enter the module as constants. TVM's
  importer mistranslates some of those ops (``cumsum`` of a bool keeps the bool
  type, so the mask is wrong and does not compile) and lacks others.
- A program that mutates a buffer or an input (a batch norm in training mode updating its
  running statistics, an in-place op on an input) is refused: TVM's importer returns the
  user outputs only and would drop the mutation silently.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tvm import relax

from strategy.layout import array_constant

from .errors import UnsupportedModelError

# Input kinds of an ExportedProgram whose values are fixed at export and bound as
# constants by the importer (parameters stay out: they may be kept as inputs).
_FIXED_INPUT_KINDS = ("BUFFER", "CONSTANT_TENSOR")

Converter = Callable[[Any, Any], relax.Expr]


def decompositions() -> dict:
    """PyTorch's default decomposition table without scaled_dot_product_attention, with
    im2col / col2im as a reshape and a permute where the patches tile the image, and RReLU in
    eval mode (see the module docstring)."""
    import torch

    table = torch.export.default_decompositions()
    table.pop(torch.ops.aten.scaled_dot_product_attention.default, None)
    for op, tiled in ((torch.ops.aten.im2col.default, _unfold_tiles), (torch.ops.aten.col2im.default, _fold_tiles)):
        table[op] = _when_tiling(tiled, table[op])
    table[torch.ops.aten.rrelu_with_noise_functional.default] = _rrelu_in_eval
    return table


def _rrelu_in_eval(x, noise, lower=1.0 / 8, upper=1.0 / 3, training=False, generator=None):
    """nn.RReLU in eval mode: a leaky ReLU of slope (lower + upper) / 2, as PyTorch defines it
    (the noise is left as it was). In training mode the slope is random: the op stays, and the
    importer names it."""
    import torch

    if training:
        return NotImplemented
    return torch.nn.functional.leaky_relu(x, (lower + upper) / 2), noise.clone()


def _tiling(size, kernel_size, dilation, padding, stride) -> bool:
    """Patches of `kernel_size` that tile a static `size` exactly, without overlap or gaps."""
    return (
        list(dilation) == [1, 1]
        and list(padding) == [0, 0]
        and list(stride) == list(kernel_size)
        and all(isinstance(n, int) and n % k == 0 for n, k in zip(size, kernel_size))
    )


def _when_tiling(tiled: Callable, general: Callable) -> Callable:
    """An im2col / col2im decomposition: `tiled` where the patches tile the image, else `general`."""

    def decompose(input, *args):
        size = input.shape[-2:] if len(args) == 4 else args[0]  # im2col's image, col2im's output_size
        return tiled(input, *args) if _tiling(size, *args[-4:]) else general(input, *args)

    return decompose


def _unfold_tiles(image, kernel_size, dilation, padding, stride):
    """[..., C, H, W] -> [..., C*kh*kw, (H/kh)*(W/kw)], channel-major, row-major patches."""
    (kh, kw), (h, w) = kernel_size, image.shape[-2:]
    *lead, c = image.shape[:-2]
    tiles = image.reshape(*lead, c, h // kh, kh, w // kw, kw)
    n = len(lead)
    tiles = tiles.permute(*range(n), n, n + 2, n + 4, n + 1, n + 3)
    return tiles.reshape(*lead, c * kh * kw, (h // kh) * (w // kw))


def _fold_tiles(columns, output_size, kernel_size, dilation, padding, stride):
    """The inverse of `_unfold_tiles` (no patch overlaps another, so nothing is summed)."""
    (kh, kw), (h, w) = kernel_size, output_size
    *lead, ckk, _ = columns.shape
    n = len(lead)
    tiles = columns.reshape(*lead, ckk // (kh * kw), kh, kw, h // kh, w // kw)
    tiles = tiles.permute(*range(n), n, n + 3, n + 1, n + 4, n + 2)
    return tiles.reshape(*lead, ckk // (kh * kw), h, w)


def decomposed(program):
    """`program` with our decompositions run (functional: in-place ops and batch norm's update
    of its running statistics show as mutations in its signature); a program that mutates a
    buffer or an input raises UnsupportedModelError naming them."""
    program = program.run_decompositions(decompositions())
    signature = program.graph_signature
    buffers = sorted(signature.buffers_to_mutate.values())
    inputs = sorted(signature.user_inputs_to_mutate.values())
    if buffers or inputs:
        what = ", ".join([*(f"buffer {b}" for b in buffers), *(f"input {i}" for i in inputs)])
        raise UnsupportedModelError(
            f"accel: the program mutates {what} (a module in training mode, or an in-place op on an input); "
            "accel builds inference programs that change nothing: call model.eval(), or copy the input first"
        )
    return program


def _fixed_inputs(program) -> dict:
    """{placeholder name: tensor} of the buffers and lifted constants of `program`."""
    values = {}
    for spec in program.graph_signature.input_specs:
        if spec.kind.name not in _FIXED_INPUT_KINDS:
            continue
        value = program.constants.get(spec.target)
        values[spec.arg.name] = value if value is not None else program.state_dict[spec.target]
    return values


def _is_static_tensors(value) -> bool:
    """A tensor, or a tuple/list of tensors, with concrete shapes."""
    import torch

    if isinstance(value, (tuple, list)):
        return len(value) > 0 and all(_is_static_tensors(v) for v in value)
    return isinstance(value, torch.Tensor) and all(isinstance(d, int) for d in value.shape)


def _may_fold(node, known: dict) -> bool:
    """A pure op whose every input is known and whose result someone uses."""
    import torch

    if node.op != "call_function" or not node.users:
        return False
    if torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
        return False
    if getattr(node.target, "namespace", None) == "quantized_decomposed":
        return False  # q/dq stay in the graph: accel_target.passes.quantize makes integer kernels of them
    return all(arg in known for arg in node.all_input_nodes) and _is_static_tensors(node.meta.get("val"))


def input_independent_values(program, unconvertible: Callable[[str], bool] | None = None) -> dict:
    """{fx node: PyTorch value} for every op of `program` that depends on no user input
    and no parameter, computed by PyTorch (shapes are static at export).

    With `unconvertible` (the parameters are constants of the module), also for every op that
    depends on no user input but on parameters, where ``unconvertible(op name)`` says no
    converter has the op: a ViT resizing its position embeddings to the input's patch grid
    with an antialiased bicubic filter, which TVM cannot import, gets the resized table. The
    parameter-only ops under such an op are computed for it and not kept."""
    import torch

    fixed = _fixed_inputs(program)
    known = {node: fixed[node.name] for node in program.graph.nodes if node.op == "placeholder" and node.name in fixed}
    params = _parameters(program) if unconvertible is not None else {}
    derivable = {node for node in program.graph.nodes if node.name in params or node in known}
    folded = {}

    def value(node):  # a derivable node's value; the parameter-only ones computed on the way are dropped
        if node in known:
            return known[node]
        if node.op == "placeholder":
            return params[node.name]
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), value)
        return node.target(*args, **kwargs)

    with torch.no_grad():
        for node in program.graph.nodes:
            if _may_fold(node, known):
                known[node] = folded[node] = value(node)
                derivable.add(node)
            elif unconvertible is not None and _may_fold(node, derivable):
                derivable.add(node)
                if unconvertible(node.target.__name__):
                    folded[node] = value(node)
    return folded


def _parameters(program) -> dict:
    """{placeholder name: tensor} of the parameters of `program`."""
    return {
        spec.arg.name: program.state_dict[spec.target]
        for spec in program.graph_signature.input_specs
        if spec.kind.name == "PARAMETER"
    }


def as_relax(value) -> relax.Expr:
    """A relax constant (or tuple of constants) holding a PyTorch value."""
    import torch

    if isinstance(value, (tuple, list)):
        return relax.Tuple([as_relax(v) for v in value])
    if value.is_complex():  # carried as (real, imaginary) pairs (accel_target/frontends/torch_complex.py)
        value = torch.view_as_real(value)
    value = value.detach().contiguous()
    if value.dtype == torch.bfloat16:  # (numpy's is ml_dtypes', which PyTorch does not convert to)
        import ml_dtypes

        return array_constant(value.view(torch.int16).numpy().view(ml_dtypes.bfloat16))
    return array_constant(value.numpy())


def folding(stock: Converter | None, name: str, folded: dict) -> Converter:
    """`name`'s converter: a constant for a folded node, the given converter otherwise."""

    def convert(node, importer):
        if node in folded:
            return as_relax(folded[node])
        if stock is None:
            raise NotImplementedError(f"accel: the torch importer has no converter for {name}")
        return stock(node, importer)

    return convert


__all__ = ["as_relax", "decomposed", "decompositions", "folding", "input_independent_values"]
