"""Elementwise ops, reductions, scatters and distances that TVM's importer lacks, as PyTorch
computes them (accel_target/frontends/torch_math.py, torch_indexing.py), edge values included."""

import numpy as np
import pytest
import torch
from torch import nn

import accel_target
from accel_target.frontends import UnsupportedModelError
from tests.helpers import run_outputs


def _put(tensor, index, value):
    """tensor[index] = value on a copy (what ``x[idx] = v`` exports to: index_put)."""
    tensor = tensor.clone()
    tensor[index] = value
    return tensor


class Op(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


torch.manual_seed(0)
X, Y = torch.randn(3, 5), torch.randn(3, 5)
EDGE_A = torch.tensor([1.0, -2.0, 0.0, -0.0, np.nan, np.inf, -np.inf, 3e30, np.nan])
EDGE_B = torch.tensor([np.nan, 0.0, -0.0, -1.0, 2.0, np.nan, 1.0, 4e30, np.nan])
INTS, SHIFTS = torch.randint(-1000, 1000, (4, 6)), torch.randint(-3, 70, (4, 6))
SCAN_EDGES = torch.tensor([-np.inf, -np.inf, 1.0, -np.inf, 1000.0, 1000.0, np.nan, 2.0])
UNORDERED = torch.tensor([[0.0, np.nan, 1.0, -1.0, np.inf, 3.0], [np.inf, np.nan, -np.inf, 0.0, -0.0, np.nan]])
INDEX = torch.tensor([[0, 2, 1, 0, 2], [1, 1, 0, 2, 2], [2, 0, 0, 1, 1]])

# (id, function, inputs): exact where PyTorch's result is (NaN where it is NaN)
CASES = [
    # NaN where both are, the other where one is
    ("fmax", torch.fmax, (EDGE_A, EDGE_B)),
    ("fmin", torch.fmin, (EDGE_A, EDGE_B)),
    ("fmax-int", torch.fmax, (INTS, SHIFTS)),
    # no overflow below the result's, inf where either is infinite
    ("hypot", torch.hypot, (EDGE_A, EDGE_B)),
    # the sign bit: -0.0 and NaN's sign too
    ("copysign", torch.copysign, (EDGE_A, EDGE_B)),
    ("copysign-scalar", lambda a: torch.copysign(a, -1.0), (EDGE_A,)),
    ("signbit", torch.signbit, (EDGE_A,)),
    # shifts by a negative amount or by 64 or more: 0 (-1 for a right shift of a negative)
    ("lshift", lambda a, b: a << b, (INTS, SHIFTS)),
    ("rshift", lambda a, b: a >> b, (INTS, SHIFTS)),
    ("lshift-scalar", lambda a: a << 3, (INTS,)),
    ("var_mean", lambda a: torch.var_mean(a, 1, correction=0), (X,)),
    ("std_mean", lambda a: torch.std_mean(a, (0, 1), correction=2, keepdim=True), (X,)),
    ("var_mean-all", torch.var_mean, (X,)),
    ("var_mean-one-element", lambda a: torch.var_mean(a[:, :1], 1), (X,)),  # 0 / 0: NaN
    ("prod-dim", lambda a: torch.prod(a, 1), (X,)),
    ("prod-dim-int", lambda a: torch.prod(a % 5, 0, keepdim=True), (INTS,)),  # in int64
    # NaN sorts above +inf (TVM's kernels compared the floats: a NaN fell anywhere); -0.0 equals 0.0
    ("sort-nan", lambda a: torch.sort(a, 1), (UNORDERED,)),
    ("sort-descending-stable", lambda a: torch.sort(a, dim=1, descending=True, stable=True), (UNORDERED,)),
    ("argsort-stable", lambda a: torch.argsort(a, dim=1, stable=True), (UNORDERED,)),
    ("topk-nan", lambda a: torch.topk(a, 3, 1), (UNORDERED,)),
    ("kthvalue", lambda a: torch.kthvalue(a, 2, 1), (X,)),
    ("kthvalue-nan-keepdim", lambda a: torch.kthvalue(a[:1], 5, 1, keepdim=True), (UNORDERED,)),
    ("topk-smallest", lambda a: torch.topk(a[:1], 2, 1, largest=False), (UNORDERED,)),  # (a tie: either)
    # nonzero counts, NaN too; TVM's any.dim gave the largest value
    ("any", torch.any, (EDGE_A,)),
    ("any-dim", lambda a: torch.any(a - a.abs(), dim=0), (X,)),
    ("any-dims-keepdim", lambda a: torch.any(a > 1, dim=(0, 1), keepdim=True), (X,)),
    ("all", lambda a: torch.all(a.reshape(3, 3), dim=1), (EDGE_A,)),
    ("all-int", lambda a: torch.all(a % 3, dim=1), (INTS,)),
    # any strides over a contiguous tensor (TVM's converter: only a contiguous view's)
    ("as_strided-overlapping", lambda a: a.as_strided((2, 2, 5), (5, 5, 1)) * 1, (X,)),
    ("as_strided-offset-transposed", lambda a: a.as_strided((4, 3), (1, 4), 2) * 1, (X,)),
    ("as_strided-of-a-transpose", lambda a: a.t().as_strided((3, 4), (4, 1), 1) * 1, (X,)),
    ("scatter_add", lambda a: torch.zeros(3, 5).scatter_add(1, INDEX, a), (X,)),
    ("scatter_add-part", lambda a: torch.zeros(4, 6).scatter_add(0, INDEX[:2, :3], a), (X,)),
    ("scatter_reduce-amax", lambda a: torch.ones(3, 5).scatter_reduce(1, INDEX, a, "amax"), (X,)),
    ("scatter_reduce-prod", lambda a: torch.ones(3, 5).scatter_reduce(0, INDEX, a, "prod"), (X,)),
    ("cdist", torch.cdist, (X, Y)),
    ("cdist-p1-batched", lambda a, b: torch.cdist(a[None], b[None, :2], p=1), (X, Y)),
    ("cdist-p3", lambda a, b: torch.cdist(a, b, p=3), (X, Y)),
    ("cdist-inf", lambda a, b: torch.cdist(a, b, p=float("inf")), (X, Y)),
    ("cdist-p0", lambda a, b: torch.cdist(a.round(), b.round(), p=0), (X, Y)),
    # index_put on fewer axes than the tensor has: leading, after taken-whole axes, broadcast
    # indices, negative ones, duplicates accumulated; a boolean mask of one value
    ("index_put-rows", lambda a, b: a.index_put((torch.tensor([0, -1]),), b[:2]), (X, Y)),
    ("index_put-accumulate", lambda a, b: a.index_put((torch.tensor([0, 0, 2]),), b, accumulate=True), (X, Y)),
    ("index_put-columns", lambda a: _put(a, (slice(None), torch.tensor([1, 3])), 5.0), (X,)),
    (
        "index_put-middle",
        lambda a, b: _put(torch.stack([a, b, a], -1), (slice(None), torch.tensor([4, -1])), b[:, :1, None]),
        (X, Y),
    ),
    (
        "index_put-broadcast",
        lambda a: _put(a[None].expand(2, 3, 5), (torch.tensor([[0], [1]]), torch.tensor([2, 0, 1])), -1.0),
        (X,),
    ),
    ("index_put-mask", lambda a: _put(a, a < 0, 0.0), (X,)),
    ("index_put-row-mask", lambda a, b: _put(a, b[:, 0] > 0, -np.inf), (X, Y)),
    ("index_put-mask-accumulate", lambda a: a.index_put((a > 0,), torch.tensor(2.0), accumulate=True), (X,)),
    # scans: no overflow of exp (x 300), -inf before any number, NaN from where it is on;
    # cummax / cummin: ties at the later index, NaN the extremum once seen
    ("logcumsumexp", lambda a: torch.logcumsumexp(a * 300, 1), (X,)),
    ("logcumsumexp-edges", lambda a: torch.logcumsumexp(a, 0), (SCAN_EDGES,)),
    ("cummax", lambda a: torch.cummax(a.round(), 0), (X,)),
    ("cummin", lambda a: torch.cummin(a.round(), 1), (X,)),
    ("cummax-nan", lambda a: torch.cummax(a, 0), (SCAN_EDGES,)),
    ("cummin-int", lambda a: torch.cummin(a, 1), (SHIFTS,)),
    # equal values before or after, as asked
    ("searchsorted", lambda a: torch.searchsorted(torch.tensor([-1.0, 0.0, 0.0, 1.0]), a.round()), (X,)),
    ("searchsorted-right", lambda a: torch.searchsorted(torch.tensor([-1.0, 0.0, 1.0]), a.round(), right=True), (X,)),
    ("searchsorted-int32", lambda a: torch.searchsorted(torch.tensor([0.5]), a, out_int32=True, side="right"), (X,)),
    # a NaN goes after every element (TVM's bucketize put it first); rows of a sequence; a sorter
    ("searchsorted-nan", lambda a: torch.searchsorted(torch.tensor([-1.0, 0.0, 1.0]), a), (EDGE_A,)),
    ("bucketize-nan", lambda a: torch.bucketize(a, torch.tensor([-1.0, 0.0, 1.0]), right=True), (EDGE_A,)),
    ("searchsorted-rows", lambda s, a: torch.searchsorted(s.sort(1).values, a.round()), (X, Y)),
    ("searchsorted-rows-right", lambda s, a: torch.searchsorted(s.sort(1).values, a, side="right"), (X.round(), Y)),
    (
        "searchsorted-rows-nan",
        lambda s, a: torch.searchsorted(s.sort(1).values, a[:, :3]),
        (X, UNORDERED[:, :3].repeat(2, 1)[:3]),
    ),
    ("searchsorted-sorter", lambda s, a: torch.searchsorted(s, a, sorter=s.argsort(1), out_int32=True), (X, Y)),
    # PyTorch's rational guess and Newton steps: NaN outside [-1, 1], ±inf at ±1, exact near ±1
    ("erfinv", lambda a: torch.erfinv(a.tanh()), (X,)),
    (
        "erfinv-edges",
        torch.erfinv,
        (torch.tensor([1.0, -1.0, 0.0, -0.0, 2.0, np.nan, 0.9999999, -0.99999, 0.7, 0.7000001]),),
    ),
    # bins over the range given, or the data's (where min = max); the last bin closed
    ("histc", lambda a: torch.histc(a, 4, -1, 1), (torch.cat([X.ravel(), torch.tensor([-1.0, 1.0, 0.5, np.nan])]),)),
    ("histc-data-range", lambda a: torch.histc(a, 7), (X,)),
    ("histc-equal-bounds", lambda a: torch.histc(a, 3, 0.5, 0.5), (X,)),
]


@pytest.mark.parametrize("fn, inputs", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_op_matches_pytorch(fn, inputs):
    model = Op(fn).eval()
    expected = model(*inputs)
    expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
    outputs = run_outputs(accel_target.build(accel_target.from_torch(model, inputs)), *[x.numpy() for x in inputs])
    for ours, theirs in zip(outputs, expected, strict=True):
        theirs = theirs.numpy()
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, rtol=2e-6, atol=1e-6 * float(np.nanmax(np.abs(theirs), initial=1)))


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda a: torch.zeros(3, 5).scatter_reduce(1, INDEX, a, "mean"), "scatter_reduce.two with reduce='mean'"),
        (lambda a: torch.zeros(3, 5).scatter_reduce(1, INDEX, a, "sum", include_self=False), "include_self=False"),
        (lambda a: _put(torch.stack([a, a]), (torch.tensor([0]), slice(None), torch.tensor([2])), 1.0), "not adjacent"),
        (lambda a: a[:, ::2].as_strided((2, 2), (1, 2)) * 1, "as_strided.default .* does not fill its storage"),
    ],
)
def test_unsupported_variants_are_refused_by_name(fn, words):
    with pytest.raises(UnsupportedModelError, match=words):
        accel_target.from_torch(Op(fn).eval(), (X,))


class Bags(nn.Module):
    def __init__(self, mode, padding_idx=None, include_last_offset=False):
        super().__init__()
        self.bags = nn.EmbeddingBag(10, 4, mode=mode, padding_idx=padding_idx, include_last_offset=include_last_offset)

    def forward(self, indices, *rest):
        offsets, weights = (list(rest) + [None, None])[:2]
        return self.bags(indices, offsets, per_sample_weights=weights)


FIXED_BAGS = torch.tensor([[1, 2, 2, 9], [0, 3, 2, 2], [2, 2, 2, 2]])  # the last all padding when padding_idx=2
INDICES, OFFSETS = torch.tensor([4, 1, 7, 7, 0, 9, 3]), torch.tensor([0, 2, 2, 5])  # an empty bag


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize(
    "options, inputs",
    [
        ({}, (FIXED_BAGS,)),  # bags of 4: offsets made by PyTorch
        ({"padding_idx": 2}, (FIXED_BAGS,)),
        ({}, (INDICES, OFFSETS)),  # offsets as an input
        ({"include_last_offset": True}, (INDICES, torch.tensor([0, 2, 2, 7]))),
    ],
    ids=["fixed", "padding", "offsets", "last-offset"],
)
def test_embedding_bag_matches_pytorch(mode, options, inputs):
    torch.manual_seed(0)
    model = Bags(mode, **options).eval()
    executable = accel_target.build(accel_target.from_torch(model, inputs))
    assert accel_target.report(executable).declines == ()  # (TVM's searchsorted has a While loop)
    (ours,) = run_outputs(executable, *[x.numpy() for x in inputs])
    np.testing.assert_allclose(ours, model(*inputs).detach().numpy(), rtol=1e-6, atol=1e-6)


def test_embedding_bag_with_per_sample_weights_matches_pytorch():
    torch.manual_seed(0)
    model, inputs = Bags("sum").eval(), (INDICES, OFFSETS, torch.rand(7))
    (ours,) = run_outputs(accel_target.build(accel_target.from_torch(model, inputs)), *[x.numpy() for x in inputs])
    np.testing.assert_allclose(ours, model(*inputs).detach().numpy(), rtol=1e-6, atol=1e-6)


# results whose size depends on the data (torch.export's unbacked sizes)
DATA_DEPENDENT = [
    ("mask", lambda a: a[a > 0] * 2),
    ("mask-of-leading-axes", lambda a: a.reshape(3, 5, 1)[a > 0].sum(-1)),
    ("mask-on-an-inner-axis", lambda a: a[:, a[0] > 0] + 1),
    ("mask-and-index", lambda a: a[a[:, 0] > 0, 2]),
    ("mask-of-nothing", lambda a: a[a > 10]),
    ("nonzero", lambda a: torch.nonzero(a > 0.5)),
    ("argwhere", lambda a: torch.argwhere(a < 0)),
    ("masked_select-broadcast", lambda a: torch.masked_select(a, a[0] > 0)),
    ("constant-mask", lambda a: a[torch.tensor([True, False, True])]),
    ("put-rows", lambda a: _put(torch.zeros_like(a), a[:, 0] > 0, a[a[:, 0] > 0] * 3)),
    ("put-elements", lambda a: _put(a, a > 0, a[a > 0].exp())),
    ("put-broadcast-row", lambda a: _put(a, a[:, 0] > 0, torch.arange(5.0))),
    ("put-inner-axis", lambda a: _put(a, (slice(None), a[0] > 0), a[:, a[0] > 0] ** 2)),
    ("put-sum-of-two-reads", lambda a: _put(a, a > 0, a[a > 0] + a.flip(0)[a > 0])),  # Eq(u0, u1)
]


@pytest.mark.parametrize("fn", [c[1] for c in DATA_DEPENDENT], ids=[c[0] for c in DATA_DEPENDENT])
def test_result_whose_size_depends_on_the_data_matches_pytorch(fn):
    """One build serves inputs with different numbers of selected elements (read, or written:
    ``x[mask] = values``, a mixture of experts' rows)."""
    executable = accel_target.build(accel_target.from_torch(Op(fn).eval(), (X,)))
    for x in (X, torch.randn(3, 5), -X.abs()):
        (ours,) = run_outputs(executable, x.numpy())
        np.testing.assert_array_equal(ours, fn(x).numpy())


# sizes that the data's values give (repeat counts, the largest value, distinct values): one
# build, several inputs
COUNTED = [
    (
        "repeat_interleave",
        lambda a, r: a.repeat_interleave(r, dim=0) * 2,
        [(X, torch.tensor([2, 0, 3])), (X, torch.tensor([0, 0, 0]))],
    ),
    (
        "repeat_interleave-dim1",
        lambda a, r: a.repeat_interleave(r, dim=1),
        [(X, torch.tensor([1, 0, 2, 3, 1])), (X, torch.tensor([5, 0, 0, 0, 1]))],
    ),
    (
        "repeat_interleave-indices",
        lambda r: torch.repeat_interleave(r),
        [(torch.tensor([2, 0, 3]),), (torch.tensor([1, 1, 1]),)],
    ),
    (
        "repeat_interleave-output_size",
        lambda a, r: a.repeat_interleave(r, dim=0, output_size=5),
        [(X, torch.tensor([2, 0, 3])), (X, torch.tensor([1, 3, 1]))],
    ),
    # two sizes in one kernel after FuseOps (it moved a shape's match_cast after their uses)
    (
        "repeat_interleave-twice",
        lambda a, r: a.repeat_interleave(r, dim=0).mean(0) + a.repeat_interleave(r * 2, dim=0).mean(0),
        [(X, torch.tensor([2, 1, 3])), (X, torch.tensor([1, 0, 4]))],
    ),
    ("bincount", torch.bincount, [(torch.tensor([1, 3, 1, 0, 7]),), (torch.tensor([0, 0, 0, 1, 0]),)]),
    (
        "bincount-weights-minlength",
        lambda a, w: torch.bincount(a, w, minlength=6),
        [(torch.tensor([1, 3, 1]), torch.randn(3)), (torch.tensor([9, 0, 2]), torch.randn(3))],
    ),
    ("unique", torch.unique, [(torch.tensor([3, 1, 3, 7, 1]),), (torch.tensor([2, 2, 2, 2, 2]),)]),
    (
        "unique-nan-inverse-counts",
        lambda a: torch.unique(a, return_inverse=True, return_counts=True),
        [(EDGE_A,), (EDGE_B,)],
    ),
    (
        "unique_consecutive",
        lambda a: torch.unique_consecutive(a, return_inverse=True, return_counts=True),
        [(torch.tensor([[1, 1, 2], [2, 1, 1]]),), (torch.tensor([[5, 5, 5], [5, 5, 5]]),)],
    ),
    ("unique_consecutive-nan", lambda a: torch.unique_consecutive(a), [(EDGE_A,), (EDGE_B,)]),
]


@pytest.mark.parametrize("fn, given", [c[1:] for c in COUNTED], ids=[c[0] for c in COUNTED])
def test_result_sized_by_the_datas_values_matches_pytorch(fn, given):
    executable = accel_target.build(accel_target.from_torch(Op(fn).eval(), given[0]))
    assert accel_target.report(executable).declines == ()
    for inputs in given:
        expected = fn(*inputs)
        expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
        outputs = run_outputs(executable, *[x.numpy() for x in inputs])
        for ours, theirs in zip(outputs, expected, strict=True):
            assert ours.dtype == theirs.numpy().dtype
            np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "fn, good, bad, words",
    [
        (lambda r: torch.repeat_interleave(r), [2, 1], [2, -1], "repeat_interleave: a repeat count is negative"),
        (torch.bincount, [2, 1], [2, -1], "bincount: a value counted is negative"),
        (lambda a: torch.histc(a, 3), [2.0, 1.0], [2.0, np.nan], "histc: the data's range is not finite"),
        (lambda a: torch.histc(a, 3), [2.0, 1.0], [2.0, -np.inf], "histc: the data's range is not finite"),
    ],
    ids=["repeat_interleave", "bincount", "histc-nan", "histc-inf"],
)
def test_values_pytorch_refuses_fail_the_call(fn, good, bad, words):
    """What PyTorch raises for (a negative count, a range that is not finite) fails the call,
    never a number."""
    good, bad = torch.tensor(good), torch.tensor(bad)
    executable = accel_target.build(accel_target.from_torch(Op(fn).eval(), (good,)))
    with pytest.raises(RuntimeError):
        fn(bad)
    with pytest.raises(RuntimeError, match=words):
        run_outputs(executable, bad.numpy())


class Experts(nn.Module):
    """A mixture of experts' dispatch: the rows split by counts that the data gives."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

    def forward(self, x, counts):
        parts = x.split(counts.tolist())
        return torch.cat([expert(part) for expert, part in zip(self.experts, parts, strict=True)]) * 2


def test_split_by_sizes_the_data_gives_matches_pytorch_and_checks_their_sum():
    model, x = Experts().eval(), torch.randn(10, 8)
    executable = accel_target.build(accel_target.from_torch(model, (x, torch.tensor([3, 3, 4]))))
    for counts in ([3, 3, 4], [0, 0, 10], [5, 5, 0]):
        (ours,) = run_outputs(executable, x.numpy(), np.array(counts))
        np.testing.assert_allclose(ours, model(x, torch.tensor(counts)).detach().numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(Exception, match="match_cast"):  # PyTorch: "expects split_sizes to sum exactly to 10"
        run_outputs(executable, x.numpy(), np.array([3, 3, 3]))
