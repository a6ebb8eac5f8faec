"""CIFAR-style ResNet (He et al. 2016): 6n+2 layers of basic blocks, option-B shortcuts."""

from __future__ import annotations

from torch import Tensor, nn

from scalesgd.models.blocks import shortcut


def _conv3x3(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    """3x3 convolution with padding 1 and no bias, because a BatchNorm always follows it."""
    return nn.Conv2d(in_ch, out_ch, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers plus an identity or projection shortcut, the unit a CIFAR ResNet stacks."""

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_ch, out_ch, stride)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.relu1 = nn.ReLU()
        self.conv2 = _conv3x3(out_ch, out_ch)
        self.last_bn = nn.BatchNorm2d(out_ch)
        self.relu2 = nn.ReLU()
        self.shortcut = shortcut(in_ch, out_ch, stride)

    def forward(self, x: Tensor) -> Tensor:
        """Add the residual branch to the shortcut and apply the final ReLU."""
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.last_bn(self.conv2(out))
        return self.relu2(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet of three stages (16/32/64 channels) sized for small images such as CIFAR or 8x8 digits."""

    def __init__(self, n: int, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        if n < 1:
            raise ValueError(f"blocks per stage must be >= 1, got {n}")
        self.conv1 = _conv3x3(in_channels, 16)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU()
        stages = []
        in_ch = 16
        for out_ch, stride in ((16, 1), (32, 2), (64, 2)):
            blocks = []
            for i in range(n):
                blocks.append(BasicBlock(in_ch, out_ch, stride if i == 0 else 1))
                in_ch = out_ch
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Map an (N, C, H, W) batch to (N, num_classes) logits."""
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(self.avgpool(x).flatten(1))


def resnet8(num_classes: int = 10, in_channels: int = 3) -> CifarResNet:
    """ResNet-8 (n=1): the small default model for the 8x8 digits dataset."""
    return CifarResNet(1, num_classes, in_channels)


def resnet20(num_classes: int = 10, in_channels: int = 3) -> CifarResNet:
    """ResNet-20 (n=3): the standard CIFAR-10 baseline depth."""
    return CifarResNet(3, num_classes, in_channels)


def resnet56(num_classes: int = 10, in_channels: int = 3) -> CifarResNet:
    """ResNet-56 (n=9): a deeper CIFAR ResNet for testing depth-sensitive behaviour."""
    return CifarResNet(9, num_classes, in_channels)
