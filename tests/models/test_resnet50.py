"""ResNet-50 as Goyal et al. 2017 train it: v1.5 (the stride on the 3×3), Bottleneck blocks."""

from __future__ import annotations

from scalesgd.models import build_model


def test_resnet50_is_v1_5_stride_on_3x3():
    model = build_model("resnet50", 10, 3)
    first = model.layer2[0]
    assert first.conv1.stride == (1, 1)
    assert first.conv2.stride == (2, 2)
    assert first.conv2.kernel_size == (3, 3)
