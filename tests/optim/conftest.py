"""What the optimizer tests share: a step that must not read a tensor value on the host."""

import pytest
import torch


@pytest.fixture
def no_host_sync(monkeypatch):
    """Any tensor value read on the host (item, bool, float, int, tolist, numpy) raises."""
    def refuse(self, *args, **kwargs):
        raise AssertionError("host synchronisation inside step()")

    def install():
        for name in ("item", "__bool__", "__float__", "__int__", "__index__", "tolist", "numpy"):
            monkeypatch.setattr(torch.Tensor, name, refuse)
    return install
