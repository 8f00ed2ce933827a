"""`accel_target.from_torch` (accel_target/frontends/pytorch.py) and what `import_program` checks
and converts for it, against PyTorch: dynamic_shapes, exported modules, mutations, slices to a
symbolic size."""

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax

import accel_target
from accel_target.frontends import UnsupportedModelError
from accel_target.frontends.torch_ops import import_program
from tests.helpers import assert_close


def _vm(mod) -> relax.VirtualMachine:
    return relax.VirtualMachine(accel_target.build(mod), tvm.cpu())


def _run(vm, *inputs: torch.Tensor) -> np.ndarray:
    return vm["main"](*[tvm.runtime.tensor(x.numpy()) for x in inputs]).numpy()


def test_dynamic_shapes_become_symbolic_dims_of_main():
    """dynamic_shapes goes to torch.export as it is: the Dim is a shape variable of main, its
    range in the function's attributes."""
    model = nn.Linear(8, 4).eval()
    batch = torch.export.Dim("batch", min=2, max=16)
    mod = accel_target.from_torch(model, (torch.randn(3, 8),), dynamic_shapes=({0: batch},))
    (x,) = mod["main"].params
    assert isinstance(x.ty.shape[0], tvm.tirx.Var) and int(x.ty.shape[1]) == 8
    name = str(x.ty.shape[0])
    assert int(mod["main"].attrs["tir_var_upper_bound"][name]) == 16
    vm = _vm(mod)
    for n in (2, 5):
        x = torch.randn(n, 8)
        with torch.no_grad():
            assert_close(_run(vm, x), model(x).numpy())


def test_module_of_an_exported_program_imports_as_it_is():
    """torch.export's ``.module()`` refuses eval() (so does PT2E's convert_pt2e): from_torch
    takes its mode as exported."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.ReLU()).eval()
    x = torch.randn(2, 8)
    exported = torch.export.export(model, (x,)).module()
    with pytest.raises(NotImplementedError):
        exported.eval()
    with torch.no_grad():
        assert_close(_run(_vm(accel_target.from_torch(exported, (x,))), x), model(x).numpy())


class Counting(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return x * 2


class InPlaceOnInput(nn.Module):
    def forward(self, x):
        x.mul_(2)
        return x + 1


@pytest.mark.parametrize(
    "model, what",
    [(Counting(), "mutates buffer calls"), (InPlaceOnInput(), "mutates input x")],
    ids=["buffer", "input"],
)
def test_program_that_mutates_is_refused(model, what):
    """TVM's importer would drop the mutation and return the outputs only: refused, named."""
    with pytest.raises(UnsupportedModelError, match=what):
        accel_target.from_torch(model, (torch.randn(2, 3),))


def test_training_mode_batch_norm_is_refused_by_import_program():
    """import_program itself refuses (torch.compile's backend reaches it without from_torch)."""
    with torch.no_grad():
        program = torch.export.export(nn.BatchNorm2d(3).train(), (torch.randn(2, 3, 4, 4),))
    with pytest.raises(UnsupportedModelError, match="mutates buffer num_batches_tracked, buffer running_mean"):
        import_program(program)


class Positions(nn.Module):
    """A [1, 16] position table sliced to the input's length, as BERT's position_ids."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.arange(16.0).reshape(1, 16))

    def forward(self, x):
        return x + self.table[:, : x.shape[1]]


def test_slice_to_a_symbolic_length_is_that_length_and_checked():
    """The slice has the input's length (not min(seq, 16)), so the add has a shape and lowers;
    a length beyond the export's range is an error at run time, not a read past the table."""
    seq = torch.export.Dim("seq", min=2, max=16)
    vm = _vm(accel_target.from_torch(Positions(), (torch.randn(2, 8),), dynamic_shapes=({1: seq},)))
    for length in (3, 16):
        x = torch.randn(2, length)
        assert_close(_run(vm, x), Positions()(x).numpy())
    with pytest.raises(RuntimeError, match=r"slice: an index known at run time is outside \[0, 16\)"):
        _run(vm, torch.randn(2, 20))


class RepeatKV(nn.Module):
    """transformers' repeat_kv: one key/value head expanded to two, with a symbolic sequence."""

    def forward(self, x):
        b, h, s, d = x.shape
        return x[:, :, None].expand(b, h, 2, s, d).reshape(b, h * 2, s, d) * 2.0


def test_broadcast_of_symbolic_shape_is_kept():
    """A broadcast_to whose shapes are both symbolic is not a no-op (SimplifyLayouts kept it only
    where the shapes are provably equal: grouped-query attention's repeat_kv)."""
    seq = torch.export.Dim("seq", min=2, max=64)
    vm = _vm(accel_target.from_torch(RepeatKV(), (torch.randn(2, 1, 8, 4),), dynamic_shapes=({2: seq},)))
    x = torch.randn(2, 1, 5, 4)
    assert_close(_run(vm, x), RepeatKV()(x).numpy())


class _AtenElu(nn.Module):
    """aten.elu with every argument: what SELU (scale) and CELU (input_scale) decompose to."""

    def forward(self, x):
        return torch.ops.aten.elu(x, 0.7, 1.3, 0.5)


@pytest.mark.parametrize(
    "model",
    [nn.SELU(), nn.ELU(), nn.ELU(alpha=0.3), nn.CELU(0.5), _AtenElu()],
    ids=["selu", "elu", "elu_alpha", "celu", "aten_elu"],
)
def test_elu_family_matches_pytorch(model):
    """TVM's elu converter drops scale and input_scale: its SELU was 5% small (0.29 off at x = 6)."""
    x = torch.linspace(-8, 8, 401).reshape(1, 401)
    executable = accel_target.build(accel_target.from_torch(model.eval(), (x,)))
    vm = relax.VirtualMachine(executable, tvm.cpu())
    assert_close(vm["main"](tvm.runtime.tensor(x.numpy())).numpy(), model(x).numpy())


class _Unfold(nn.Module):
    def __init__(self, fold: bool, kernel, **kwargs):
        super().__init__()
        self.fold, self.kernel, self.kwargs = fold, kernel, kwargs

    def forward(self, x):
        columns = nn.functional.unfold(x, self.kernel, **self.kwargs)
        if not self.fold:
            return columns
        return nn.functional.fold(columns * 2, x.shape[-2:], self.kernel, **self.kwargs)


@pytest.mark.parametrize(
    "fold, shape, kernel, kwargs, tiles",
    [
        (True, (2, 8, 6, 6), (3, 2), {"stride": (3, 2)}, True),  # MobileViT-v2's patches
        (False, (8, 6, 4), 2, {"stride": 2}, True),  # unbatched
        (True, (1, 8, 6, 4), 2, {}, False),  # overlapping: stride 1, the sum of each overlap
        (False, (1, 8, 7, 4), 2, {"stride": 2}, False),  # rows left over
        (True, (1, 4, 6, 6), 2, {"stride": 2, "padding": 1}, False),
    ],
    ids=["tiles", "unbatched_tiles", "overlapping", "rows_left_over", "padded"],
)
def test_unfold_and_fold_match_pytorch(fold, shape, kernel, kwargs, tiles):
    """Patches that tile the image are a reshape and a permute (no index arrays); any other
    unfold / fold is PyTorch's own decomposition."""
    model, x = _Unfold(fold, kernel, **kwargs), torch.randn(*shape)
    mod = accel_target.from_torch(model, (x,))
    gathers = {"relax.take", "relax.index_put", "relax.index_tensor"} & {
        str(call.op.name) for call in _calls(mod["main"]) if isinstance(call.op, tvm.ir.Op)
    }
    assert (not gathers) == tiles, gathers
    assert_close(_run(_vm(mod), x), model(x).numpy())


def _calls(func) -> list:
    found = []
    relax.analysis.post_order_visit(func, lambda e: found.append(e) if isinstance(e, relax.Call) else None)
    return found


def test_rrelu_in_eval_mode_is_its_leaky_relu():
    """nn.RReLU in eval mode is a leaky ReLU of slope (lower + upper) / 2 (the importer had no
    converter for rrelu_with_noise_functional: the model did not import)."""
    model, x = nn.RReLU(0.1, 0.3).eval(), torch.linspace(-8, 8, 401).reshape(1, 401)
    assert_close(_run(_vm(accel_target.from_torch(model, (x,))), x), model(x).numpy())


class BesselOfParameters(nn.Module):
    """i0e (a Bessel function) of a parameter table added to the input: an op of parameters only that TVM's
    importer lacks (as timm's ViT with ``dynamic_img_size`` had the antialiased bicubic resize of
    its position table)."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.rand(1, 8, 4, 4) * 1.8 - 0.9)

    def forward(self, x):
        return x + torch.special.i0e(self.table)


def test_an_op_of_parameters_only_that_no_converter_has_is_computed_by_pytorch():
    model, x = BesselOfParameters().eval(), torch.randn(2, 8, 4, 4)
    assert_close(_run(_vm(accel_target.from_torch(model, (x,))), x), model(x).detach().numpy())
    # kept as inputs, the parameters are not known at import: the op is named
    with pytest.raises(UnsupportedModelError, match="i0e"):
        accel_target.from_torch(model, (x,), keep_params_as_input=True)
