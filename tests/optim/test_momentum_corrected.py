"""SGD for gradients that carry their momentum: with the exchange's momentum added by hand it is torch's SGD."""

import pytest
import torch

from scalesgd.optim import MomentumCorrectedSGD


@pytest.mark.parametrize("nesterov", [False, True])
def test_fed_the_momentum_of_its_gradients_it_steps_as_torch_sgd_does(nesterov):
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(50, generator=gen) for _ in range(6)]
    a = torch.nn.Parameter(torch.randn(50, generator=gen))
    b = torch.nn.Parameter(a.detach().clone())
    reference = torch.optim.SGD([a], lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=nesterov)
    corrected = MomentumCorrectedSGD([b], lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=nesterov)
    u = torch.zeros(50)
    for g in grads:
        a.grad = g.clone()
        reference.step()
        u = 0.9 * u + g  # what the exchange sends with momentum correction and nothing masked
        b.grad = (g + 0.9 * u) if nesterov else u.clone()
        corrected.step()
    assert torch.allclose(a, b, atol=1e-6)
    assert "decay_momentum" in corrected.state_dict()["state"][0]  # resumes exactly


def test_without_decay_it_is_plain_sgd_on_what_it_is_given():
    p = torch.nn.Parameter(torch.ones(3))
    opt = MomentumCorrectedSGD([p], lr=0.5, momentum=0.9)
    for _ in range(2):
        p.grad = torch.ones(3)
        opt.step()
    assert torch.equal(p.detach(), torch.zeros(3))
    with pytest.raises(ValueError, match="must be >= 0"):
        MomentumCorrectedSGD([p], lr=-1.0)
