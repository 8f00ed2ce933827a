"""``torch.compile(model, backend="accel")`` (accel_target/frontends/dynamo.py), against eager
PyTorch: layouts, symbolic sizes, graph breaks, fallbacks, the disk cache across processes."""

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import accel_target
from accel_target.frontends import dynamo
from tests.helpers import assert_close

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def fresh_dynamo(tmp_path_factory, monkeypatch):
    """Each test starts from no compiled frames (dynamo's automatic dynamic would carry over
    between tests), with this module's own disk cache."""
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "accel_dynamo_cache"))
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def capturing(**options):
    """A backend that is accel's, keeping what it returned (for its report) in ``.compiled``."""

    def backend(gm, example_inputs):
        compiled = dynamo.accel_backend(gm, example_inputs, **options)
        backend.compiled.append(compiled)
        return compiled

    backend.compiled = []
    return backend


def stats_since(before: dict) -> dict:
    return {key: dynamo.STATS[key] - before.get(key, 0) for key in ("compiles", "builds", "cache_hits", "fallbacks")}


class CNN(nn.Module):
    """conv-bn-relu x2, then logits and the feature map (eager returns it channels-last)."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.c2, self.b2 = nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)))
        return self.fc(y.mean((2, 3))), y


def make_cnn() -> nn.Module:
    torch.manual_seed(0)
    model = CNN().eval()
    for bn in (model.b1, model.b2):
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    return model.to(memory_format=torch.channels_last)


def cnn_input() -> torch.Tensor:
    return torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)).to(memory_format=torch.channels_last)


def test_cnn_channels_last_in_and_out_without_layout_transforms():
    """Channels-last in: read as NHWC (no transform); the feature map out channels-last as in
    eager (an NHWC result viewed as NCHW); convs and the dense on accel kernels; the weights are
    constants folded and packed at build time (main takes the image only, the weights beside)."""
    model, x, backend = make_cnn(), cnn_input(), capturing()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        logits, features = compiled(x)
        ref_logits, ref_features = model(x)
    assert_close(logits.numpy(), ref_logits.numpy())
    assert_close(features.contiguous().numpy(), ref_features.contiguous().numpy())
    assert features.stride() == ref_features.stride()  # channels-last, as eager's
    (run,) = backend.compiled
    assert run.layouts == ("NHWC", "NHWC")
    report = accel_target.report(run.accel_model)
    assert report.kernels.activation_transforms == 0
    assert report.kernels.weight_transforms == 0
    kernels = [r.kernel for r in report.rows if r.op in ("relax.nn.conv2d", "relax.matmul")]
    assert kernels == ["conv2d_nhwc_ohwi.accel", "conv2d_nhwc_ohwi.accel", "dense_kn.accel"]
    assert [spec.name for spec in run.accel_model.inputs] == ["l_x__nhwc"]


class Block(nn.Module):
    """A pre-norm transformer block with scaled_dot_product_attention (causal or not)."""

    def __init__(self, dim=32, heads=4, causal=False):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 64), nn.GELU(), nn.Linear(64, dim))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal).transpose(1, 2).reshape(b, t, d)
        x = x + self.out(a)
        return x + self.ff(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(causal=True), Block()])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def test_transformer_dynamic_builds_once_for_every_length():
    """dynamic=True: batch and sequence symbolic in one build (a causal mask of symbolic size
    too), right at four lengths; every product on an accel kernel."""
    torch.manual_seed(0)
    model, backend, before = Transformer().eval(), capturing(), dict(dynamo.STATS)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for batch, length in ((2, 5), (3, 16), (2, 33), (4, 64)):
            x = torch.randn(batch, length, 32)
            assert_close(compiled(x).numpy(), model(x).numpy())
    assert stats_since(before) == {"compiles": 1, "builds": 1, "cache_hits": 0, "fallbacks": 0}
    rows = [r for r in accel_target.report(backend.compiled[0].accel_model).rows if r.op == "relax.matmul"]
    assert len(rows) == 12 and all(r.kind == "accel" for r in rows), [(r.inputs, r.reason) for r in rows]


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.up, self.down = nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        y = self.up(y) if x.sum() > 0 else self.down(y)  # data-dependent: a graph break
        return self.fc(y.mean((2, 3)))


def test_data_dependent_branch_graph_break():
    """Each graph around the break is built on its own; both branches right."""
    torch.manual_seed(0)
    model, before = Branchy().eval(), dict(dynamo.STATS)
    compiled = torch.compile(model, backend="accel")
    x = torch.randn(1, 3, 8, 8)
    x = x - x.mean() + 0.1
    with torch.no_grad():
        for sign in (1, -1):
            assert_close(compiled(sign * x).numpy(), model(sign * x).numpy())
    stats = stats_since(before)
    assert stats["compiles"] >= 2 and stats["builds"] == stats["compiles"] and stats["fallbacks"] == 0


class Bessel(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return self.b(torch.special.i0e(self.a(x)))  # aten.special_i0e: no converter


def test_declined_op_runs_in_pytorch_with_one_warning():
    torch.manual_seed(0)
    model = Bessel().eval()
    compiled = torch.compile(model, backend="accel")
    x = torch.randn(2, 5, 8)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert torch.equal(compiled(x), model(x))
    ours = [str(w.message) for w in caught if w.category is dynamo.AccelFallbackWarning]
    assert len(ours) == 1 and "i0e" in ours[0], ours


def test_training_mode_batch_norm_falls_back_and_updates_its_statistics():
    """A graph that mutates (batch norm's running statistics) is refused by import_program: it
    runs in PyTorch, which updates the statistics as eager does."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    twin = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    twin.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad(), pytest.warns(dynamo.AccelFallbackWarning, match="mutates buffer"):
        out = torch.compile(model, backend="accel")(x)
    with torch.no_grad():
        assert torch.allclose(out, twin(x), atol=1e-6)
    assert torch.allclose(model[1].running_mean, twin[1].running_mean)


def test_weights_changed_after_compiling_run_in_pytorch():
    """Folded weights are checked each call: one changed in place since runs in PyTorch (warned);
    grad mode with a parameter that requires grad runs in PyTorch too (accel is inference only)."""
    torch.manual_seed(0)
    model = nn.Linear(8, 8).eval()
    compiled = torch.compile(model, backend="accel")
    x = torch.randn(2, 8)
    with torch.no_grad():
        assert_close(compiled(x).numpy(), model(x).numpy())
        model.weight.mul_(2)
        with pytest.warns(dynamo.AccelFallbackWarning, match="changed after compiling"):
            assert torch.equal(compiled(x), model(x))
    torch._dynamo.reset()
    with pytest.warns(dynamo.AccelFallbackWarning, match="inference only"):
        out = torch.compile(model, backend="accel")(x)
    assert out.requires_grad and torch.equal(out, model(x))


def test_unknown_option_is_an_error():
    compiled = torch.compile(nn.Linear(4, 4), backend="accel", options={"input_layuot": "NHWC"})
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="unknown option"):
        compiled(torch.randn(2, 4))


_CHILD = """
import json, sys
import torch
from torch._dynamo.backends.registry import lookup_backend
backend = lookup_backend("accel")  # through the entry point
found = {"module": backend.__module__}
from tests.frontends.test_dynamo import cnn_input, make_cnn
with torch.no_grad():
    torch.compile(make_cnn(), backend="accel")(cnn_input())
from accel_target.frontends.dynamo import STATS
print(json.dumps({**found, **STATS}))
"""


def test_backend_found_by_entry_point_and_cache_reused_by_another_process():
    """A second process compiling the same graph loads the built library from the disk cache
    (no build); PyTorch finds "accel" through the package's entry point, with no import of ours."""
    before = dict(dynamo.STATS)
    with torch.no_grad():
        torch.compile(make_cnn(), backend="accel")(cnn_input())
    assert stats_since(before)["compiles"] == 1
    child = subprocess.run(
        [sys.executable, "-c", _CHILD], cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=600
    )
    assert child.returncode == 0, child.stderr[-3000:]
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result["module"] == "accel_target.frontends.dynamo"
    assert result.get("cache_hits") == 1 and result.get("builds", 0) == 0, result


class _Block(nn.Module):
    """A layer that dynamo compiles once for every instance: a graph break in its forward."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        torch._dynamo.graph_break()
        return torch.relu(self.linear(x))


def test_one_graph_called_with_each_layers_weights_builds_for_each():
    """dynamo compiles the block's forward once and calls it with each block's weights: each set
    is built on first sight (no fallback), and each block computes with its own weights."""
    torch.manual_seed(0)
    model = nn.Sequential(*(_Block() for _ in range(3))).eval()
    x = torch.randn(2, 8)
    builds = dynamo.STATS["builds"] + dynamo.STATS["cache_hits"]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", dynamo.AccelFallbackWarning)
        compiled = torch.compile(model, backend="accel")
        for _ in range(2):
            assert_close(compiled(x).numpy(), model(x).numpy())
    assert dynamo.STATS["builds"] + dynamo.STATS["cache_hits"] - builds == 3


class _OfBuffersAlone(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.tensor([3.0, 4.0]))

    def forward(self, x):
        return self.scale * 2  # x unread: a graph of the buffer alone (EnCodec's padding sizes)


def test_a_graph_of_weights_alone_returns_a_new_tensor_each_call():
    """A graph computed from folded weights alone returns the VM's constant (a TVM tensor): each
    call gets a copy as a torch tensor, which the caller may change without changing the next."""
    compiled = torch.compile(_OfBuffersAlone().eval(), backend="accel")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", dynamo.AccelFallbackWarning)
        first = compiled(torch.randn(2))
        assert isinstance(first, torch.Tensor) and first.tolist() == [6.0, 8.0]
        first.add_(1)
        assert compiled(torch.randn(2)).tolist() == [6.0, 8.0]
