"""torch's SGD (u-form) against the paper's v-form, with and without momentum correction (Remark 2)."""

import torch

M = 0.9


def gradient(w: torch.Tensor) -> torch.Tensor:
    """Gradient of a fixed quadratic bowl, so the update path depends on every earlier step."""
    a = torch.linspace(0.5, 2.0, w.numel())
    return a * (w - 1.0)


def rates():
    return [0.1] * 5 + [0.4] * 5 + [0.05] * 5  # two rate changes


def run_torch_sgd(w0):
    w = torch.nn.Parameter(w0.clone())
    opt = torch.optim.SGD([w], lr=0.1, momentum=M)
    for lr in rates():
        opt.param_groups[0]["lr"] = lr
        w.grad = gradient(w.detach())
        opt.step()
    return w.detach()


def run_v_form(w0, corrected: bool):
    w, v, prev = w0.clone(), torch.zeros_like(w0), rates()[0]
    for lr in rates():
        ratio = lr / prev if corrected else 1.0
        v = M * ratio * v + lr * gradient(w)
        w = w - v
        prev = lr
    return w


def test_u_form_equals_v_form_with_momentum_correction():
    w0 = torch.randn(16, dtype=torch.float64)
    assert torch.allclose(run_torch_sgd(w0), run_v_form(w0, corrected=True), rtol=1e-12, atol=1e-12)


def test_v_form_without_correction_differs_after_a_rate_change():
    w0 = torch.randn(16, dtype=torch.float64)
    assert not torch.allclose(run_torch_sgd(w0), run_v_form(w0, corrected=False), rtol=1e-6, atol=1e-6)
