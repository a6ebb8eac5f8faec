"""VGG-16 as the CIFAR variant with BN that the network-bound benchmarks train: its layers and its parameters."""

from torch import nn

from scalesgd.models import build_model


def test_vgg16_has_thirteen_convolutions_each_followed_by_bn_and_no_residual_block():
    model = build_model("vgg16", 10, 3)
    layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.BatchNorm2d))]
    convs = [m for m in layers if isinstance(m, nn.Conv2d)]
    assert len(convs) == 13 and [c.out_channels for c in convs] == [64, 64, 128, 128, 256, 256, 256, 512, 512, 512,
                                                                    512, 512, 512]
    assert all(isinstance(after, nn.BatchNorm2d) for before, after in zip(layers, layers[1:])
               if isinstance(before, nn.Conv2d))
    assert not [m for m in model.modules() if hasattr(m, "last_bn")]  # zero-γ has nothing to do here
