"""VGG-16 with BatchNorm, CIFAR variant: a deep non-residual baseline."""

from __future__ import annotations

from torch import Tensor, nn

VGG16_CONFIG: tuple[int | str, ...] = (
    64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M",
)


def _make_features(config: tuple[int | str, ...], in_channels: int) -> nn.Sequential:
    """Turn a VGG layer config into conv3x3-BN-ReLU layers and ceil-mode 2x2 max pools."""
    layers: list[nn.Module] = []
    ch = in_channels
    for item in config:
        if item == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2, ceil_mode=True))
        else:
            out_ch = int(item)
            layers += [
                nn.Conv2d(ch, out_ch, kernel_size=3, padding=1, bias=False),
                nn.BatchNorm2d(out_ch),
                nn.ReLU(),
            ]
            ch = out_ch
    return nn.Sequential(*layers)


class VGG(nn.Module):
    """VGG feature stack, global average pool and a three-layer MLP head ending in `fc`."""

    def __init__(
        self, config: tuple[int | str, ...], num_classes: int = 10, in_channels: int = 3
    ) -> None:
        super().__init__()
        self.features = _make_features(config, in_channels)
        width = [c for c in config if c != "M"][-1]
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(int(width), 512),
            nn.ReLU(),
            nn.Linear(512, 512),
            nn.ReLU(),
        )
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Map an (N, C, H, W) batch to (N, num_classes) logits."""
        x = self.avgpool(self.features(x)).flatten(1)
        return self.fc(self.classifier(x))


def vgg16(num_classes: int = 10, in_channels: int = 3) -> VGG:
    """Build VGG-16-BN (CIFAR variant) for the given number of classes and input channels."""
    return VGG(VGG16_CONFIG, num_classes, in_channels)
