"""ImageNet-style ResNet-50 v1.5 (bottleneck blocks, stride on the 3x3 conv)."""

from __future__ import annotations

from torch import Tensor, nn

from scalesgd.models.blocks import shortcut


class Bottleneck(nn.Module):
    """1x1-3x3-1x1 bottleneck with expansion 4 and a projection shortcut when the shape changes."""

    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int = 1) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(width, width, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.relu2 = nn.ReLU()
        self.conv3 = nn.Conv2d(width, out_ch, kernel_size=1, bias=False)
        self.last_bn = nn.BatchNorm2d(out_ch)
        self.relu3 = nn.ReLU()
        self.shortcut = shortcut(in_ch, out_ch, stride)

    def forward(self, x: Tensor) -> Tensor:
        """Add the bottleneck branch to the shortcut and apply the final ReLU."""
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.relu2(self.bn2(self.conv2(out)))
        out = self.last_bn(self.conv3(out))
        return self.relu3(out + self.shortcut(x))


class ResNet50(nn.Module):
    """ResNet-50 with [3, 4, 6, 3] bottleneck stages, the model of the large-minibatch ImageNet results."""

    def __init__(self, num_classes: int = 1000, in_channels: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        stages = []
        in_ch = 64
        for width, depth, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            blocks = []
            for i in range(depth):
                blocks.append(Bottleneck(in_ch, width, stride if i == 0 else 1))
                in_ch = width * Bottleneck.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Map an (N, C, H, W) batch to (N, num_classes) logits."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def resnet50(num_classes: int = 1000, in_channels: int = 3) -> ResNet50:
    """Build a ResNet-50 v1.5 for the given number of classes and input channels."""
    return ResNet50(num_classes, in_channels)
