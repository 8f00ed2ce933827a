"""Small but real architectures, written in plain PyTorch, for the whole-model tests."""

import torch
from torch import nn


class ResidualCNN(nn.Module):
    """ResNet-style: BN after every conv, strided 1x1 projection shortcuts."""

    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.blocks = nn.ModuleList([self._block(16, 32, 2), self._block(32, 32, 1), self._block(32, 64, 2)])
        self.shortcuts = nn.ModuleList(
            [
                nn.Sequential(nn.Conv2d(16, 32, 1, stride=2, bias=False), nn.BatchNorm2d(32)),
                nn.Identity(),
                nn.Sequential(nn.Conv2d(32, 64, 1, stride=2, bias=False), nn.BatchNorm2d(64)),
            ]
        )
        self.head = nn.Linear(64, classes)

    @staticmethod
    def _block(cin, cout, stride):
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
        )

    def forward(self, x):
        x = self.stem(x)
        for block, shortcut in zip(self.blocks, self.shortcuts):
            x = torch.relu(block(x) + shortcut(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class DepthwiseSeparableCNN(nn.Module):
    """MobileNet-style: depthwise + pointwise convs, ReLU6, explicit padding, flatten into the classifier."""

    def __init__(self, classes=10):
        super().__init__()
        layers, cin = [nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU6()], 16
        for cout, stride in [(24, 1), (32, 2), (48, 2)]:
            layers += [
                nn.ZeroPad2d((1, 1, 1, 1)),
                nn.Conv2d(cin, cin, 3, stride=stride, groups=cin),
                nn.BatchNorm2d(cin),
                nn.ReLU6(),
                nn.Conv2d(cin, cout, 1),
                nn.BatchNorm2d(cout),
                nn.ReLU6(),
            ]
            cin = cout
        self.features = nn.Sequential(*layers)
        self.pool = nn.AvgPool2d(2)
        self.head = nn.Linear(48 * 2 * 2, classes)

    def forward(self, x):
        return self.head(torch.flatten(self.pool(self.features(x)), 1))


class ConvNeXtLike(nn.Module):
    """ConvNeXt-style blocks: depthwise 7x7, then channels-last LayerNorm + Linear MLP, permuted back."""

    def __init__(self, dim=32, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 4, stride=4)
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.pw1, self.pw2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.stem(x)
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.pw2(nn.functional.gelu(self.pw1(self.norm(y))))
        x = x + y.permute(0, 3, 1, 2)
        return self.head(x.mean(dim=(2, 3)))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 96), nn.GELU(), nn.Linear(96, 10))

    def forward(self, x):
        return self.net(x)


class Encoder(nn.Module):
    """One transformer encoder layer (self-attention + MLP, LayerNorm)."""

    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=128, dropout=0.0, batch_first=True)

    def forward(self, x):
        return self.layer(x)


def randomize_norms(model: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial BN/LN statistics and affine parameters, so folding them is really tested."""
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, (nn.BatchNorm2d, nn.LayerNorm)):
            module.weight.data = torch.rand(module.weight.shape, generator=gen) + 0.5
            module.bias.data = torch.rand(module.bias.shape, generator=gen) - 0.5
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean = torch.rand(module.running_mean.shape, generator=gen) - 0.5
            module.running_var = torch.rand(module.running_var.shape, generator=gen) + 0.5
    return model.eval()


# name -> (constructor, example input shape, is an image model)
MODELS = {
    "residual_cnn": (ResidualCNN, (1, 3, 32, 32), True),
    "depthwise_separable_cnn": (DepthwiseSeparableCNN, (2, 3, 32, 32), True),
    "convnext_like": (ConvNeXtLike, (1, 3, 32, 32), True),
    "mlp": (MLP, (4, 64), False),
    "transformer_encoder": (Encoder, (2, 16, 64), False),
}


def make(name: str, seed: int = 0):
    torch.manual_seed(seed)
    ctor, shape, image = MODELS[name]
    return randomize_norms(ctor(), seed), torch.randn(*shape), image


class LayoutOps(nn.Module):
    """Every layout-sensitive op family after convolutions: pooling (max, avg, adaptive), group norm,
    concat, pads (reflect, zero into a conv, zero of its own), resize, channel reductions, softmax
    over channels, elementwise and broadcast ops."""

    def __init__(self, classes=10):
        super().__init__()
        self.a = nn.Conv2d(3, 16, 3, padding=1)
        self.b = nn.Conv2d(16, 16, 3)
        self.norm = nn.GroupNorm(4, 32)
        self.c = nn.Conv2d(32, 24, 1)
        self.bias = nn.Parameter(torch.randn(1, 24, 1, 1))
        self.head = nn.Linear(24 * 4 * 4, classes)

    def forward(self, x):
        a = torch.sigmoid(self.a(x))
        b = nn.functional.max_pool2d(self.b(nn.functional.pad(a, (1, 1, 1, 1), mode="reflect")), 2)
        up = nn.functional.interpolate(b, scale_factor=2, mode="nearest")
        y = self.norm(torch.cat([a, up], dim=1))
        y = nn.functional.pad(y, (1, 0, 0, 1))  # absorbed into the next conv's padding
        y = nn.functional.pad(self.c(y), (0, 1, 1, 0))  # a pad of its own, converted to NHWC
        y = nn.functional.avg_pool2d(y, 2, ceil_mode=False) * self.bias
        y = y * torch.softmax(y, dim=1) + y.sum(dim=1, keepdim=True)
        y = nn.functional.adaptive_avg_pool2d(y, 4)
        return self.head(torch.flatten(y, 1))


MODELS["layout_ops"] = (LayoutOps, (1, 3, 16, 16), True)
