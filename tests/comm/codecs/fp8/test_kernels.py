import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from scalesgd.comm.codecs.fp8 import kernels as fp8

finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


def torch_bytes(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-fp8.MAX, fp8.MAX).to(torch.float8_e5m2).view(torch.uint8)


@settings(max_examples=200, deadline=None)
@given(arrays(np.float32, st.integers(1, 300), elements=finite32), st.floats(1e-3, 1e3))
def test_encode_is_torchs_cast_of_the_clamped_value(values, scale):
    x = torch.from_numpy(values)
    s = torch.tensor(scale, dtype=torch.float32)
    assert torch.equal(fp8.encode(x, s), torch_bytes(x * s))


@settings(max_examples=200, deadline=None)
@given(arrays(np.float32, st.integers(1, 300), elements=finite32))
def test_encode_never_gives_inf_or_nan_for_finite_input(values):
    out = fp8.decode(fp8.encode(torch.from_numpy(values), 1e30))
    assert torch.isfinite(out).all()
    assert out.abs().max() <= fp8.MAX


def test_saturation_and_the_edges_of_the_range():
    x = torch.tensor([1e38, -1e38, 57344.0, 61439.0, 1e-10, -1e-10, -0.0, 0.0,
                      2.0 ** -16, 2.0 ** -15, 3 * 2.0 ** -16, 2.0 ** -17 * 1.01])
    b = fp8.encode(x)
    assert b.tolist() == [0x7B, 0xFB, 0x7B, 0x7B, 0x00, 0x80, 0x80, 0x00, 0x01, 0x02, 0x03, 0x01]
    back = fp8.decode(b)
    assert back[:3].tolist() == [57344.0, -57344.0, 57344.0]
    assert math.copysign(1.0, back[6].item()) == -1.0  # negative zero survives


@settings(max_examples=200, deadline=None)
@given(st.floats(2.0 ** -16, 57344.0), st.booleans(), st.floats(0.01, 100.0))
def test_round_trip_within_half_a_step(magnitude, negative, scale):
    x = torch.tensor([-magnitude if negative else magnitude], dtype=torch.float32) / scale
    back = fp8.decode(fp8.encode(x, scale), scale)
    v = abs(x.item()) * scale
    step = 2.0 ** (max(math.floor(math.log2(v)), -14) - 2)  # spacing of e5m2 at v (subnormals: 2^-16)
    assert abs(back.item() - x.item()) * scale <= step / 2 * (1 + 1e-6)


def test_saturating_add_never_overflows():
    a = fp8.encode(torch.tensor([57344.0, -57344.0, 40000.0, 1.0, -3.0]))
    b = fp8.encode(torch.tensor([57344.0, -57344.0, 40000.0, 2.0, 3.0]))
    assert fp8.decode(fp8.add_(a, b)).tolist() == [57344.0, -57344.0, 57344.0, 3.0, 0.0]


def test_sum_rows_is_the_scaled_sum_rounded_once():
    rows = torch.tensor([[1.0, 2.0, 57344.0], [3.0, 1.5, 57344.0]])
    out = fp8.decode(fp8.sum_rows(fp8.encode(rows), 0.5))
    assert out.tolist() == [2.0, 1.75, 57344.0]


def test_relative_encode_and_decode_undo_each_other():
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(1000, generator=gen)
    w = (torch.rand(1000, generator=gen) + 0.1) * torch.randn(1000, generator=gen).sign()
    eps, scale = torch.tensor(1e-5), torch.full((1000,), 4.0)
    b = fp8.encode_relative(g, w, eps, scale)
    assert torch.equal(b, torch_bytes(g / (w.abs() + eps) * scale))
    back = fp8.decode_relative(b, w, eps, scale)
    assert torch.allclose(back, g, rtol=0.13, atol=1e-6)


COMPILED_CHECK = """
import os
import torch
from scalesgd.comm.codecs.fp8 import kernels as fp8
device = os.environ["CHECK_DEVICE"]
assert fp8.kernel_mode() == "compiled", fp8.kernel_mode()
g = torch.Generator().manual_seed(0)
x = torch.randn(100_003, generator=g) * 10.0 ** torch.randint(-12, 12, (100_003,), generator=g)
x[:6] = torch.tensor([1e38, -1e38, -0.0, 1e-9, 2.0 ** -16, 60000.0])
w = torch.randn(x.numel(), generator=g)
s = torch.rand(x.numel(), generator=g) + 0.5
eps = torch.tensor(1e-5)
x, w, s, eps = (t.to(device) for t in (x, w, s, eps))
compiled, eager = fp8.KERNELS.table(), fp8._EAGER


def same(name, out, *args):
    a, b = out.clone(), out.clone()
    stats_a, stats_b = compiled[name](a, *args), eager[name](b, *args)
    assert torch.equal(a, b), name
    if stats_a is not None:  # the encoders' max and flush count, from the same pass
        assert all(torch.equal(p.float(), q.float()) for p, q in zip(stats_a, stats_b)), (name, stats_a, stats_b)
    return a


u8 = torch.zeros(x.numel(), dtype=torch.uint8, device=device)
b = same("encode", u8, x, s)
same("decode", torch.zeros(x.numel(), device=device), b, s)
r = same("encode_relative", u8, x, w, eps, s)
same("decode_relative", torch.zeros(x.numel(), device=device), r, w, eps, s)
mask = torch.zeros(x.numel(), dtype=torch.bool, device=device)
assert same("clipped", mask, x, s).any() and not same("clipped", mask, x, s).all()
same("clipped_relative", mask, x, w, eps, s)
c = fp8.encode(torch.randn(x.numel(), generator=g).to(device) * 3e4, s)
same("add", b, c)
same("sum_rows", u8, [b, c, r], torch.tensor(0.5, device=device))
print("same bytes")
"""


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_compiled_kernels_give_the_eager_bytes(device):
    """On a GPU the table in use runs the eager kernels (the compiled ones were slower there and rounded differently):
    this holds it to eager's bytes whatever it dispatches to."""
    env = dict(os.environ, SCALESGD_FP8_KERNELS="auto", CHECK_DEVICE=device)
    done = subprocess.run([sys.executable, "-c", COMPILED_CHECK], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "same bytes" in done.stdout


def test_encoding_reports_the_largest_value_and_exactly_the_values_flushed_to_zero():
    tiny = 2.0 ** -17
    above = torch.nextafter(torch.tensor(tiny), torch.tensor(1.0)).item()  # the next float32: rounds up to 2^-16
    x = torch.tensor([tiny, -tiny, above, 2.0 ** -16, 0.0, 1e-30, -3.0, 7e4], dtype=torch.float32)
    out = torch.empty(x.numel(), dtype=torch.uint8)
    top, flushed = fp8.encode_stats(x, out, 1.0)
    assert torch.equal(out, torch_bytes(x))
    assert top == 7e4  # above 57344: something saturated
    assert flushed == int((((out & fp8.MAGNITUDE) == 0) & (x != 0)).sum()) == 3  # ±2^-17 and 1e-30
    w = torch.full_like(x, 3.0)
    top, flushed = fp8.encode_stats(x, out, 2.0, w, 1.0)  # relative: x/(|w|+1)·2 = x/2
    assert torch.equal(out, torch_bytes(x / 2)) and top == 3.5e4 and flushed == 5
    x[1] = math.nan
    assert math.isnan(fp8.encode_stats(x, out, 1.0)[0])
    x[1] = -math.inf
    assert fp8.encode_stats(x, out, 1.0)[0] == math.inf
    assert fp8.encode(torch.empty(0)).numel() == 0


def test_an_unknown_kernel_mode_is_named():
    with pytest.raises(ValueError, match="SCALESGD_FP8_KERNELS='fast'"):
        fp8.kernel_table("fast")


@pytest.mark.parametrize("mode, every_step, compiles", [
    ("auto", True, True), ("auto", False, False), ("compiled", False, True), ("eager", True, False),
])
def test_the_kernels_compile_only_for_a_codec_that_exchanges_every_step_unless_told(monkeypatch, mode, every_step,
                                                                                  compiles):
    """A periodic run's rounds call the kernels H× less often than the compile's 6–26 s pay back: auto leaves them
    eager there, and compiles for the first codec that exchanges every step."""
    monkeypatch.setenv(fp8.MODE_VARIABLE, mode)
    kernels, resolved = fp8._Kernels(), []

    def resolve(asked):
        resolved.append(asked)
        kernels.mode = "compiled"
        return {"compiled": True}

    monkeypatch.setattr(kernels, "_resolve", resolve)
    assert kernels.prepare(every_step) == ("compiled" if compiles else "eager")
    assert (kernels.table() == {"compiled": True}) is compiles and resolved == ([mode] if compiles else [])
    if mode == "auto" and not every_step:  # a per-step codec built later in the process compiles then
        assert kernels.prepare(True) == "compiled" and resolved == ["auto"]
    monkeypatch.setenv(fp8.MODE_VARIABLE, "fast")
    with pytest.raises(ValueError, match="SCALESGD_FP8_KERNELS='fast'"):
        kernels.prepare(every_step)
