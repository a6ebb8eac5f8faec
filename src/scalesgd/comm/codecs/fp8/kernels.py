"""e5m2 bytes for gradients: a saturating encode, decode and the saturating add of Oyama et al. 2020.

Every function has one eager torch definition. When `torch.compile` works here, the same
definitions are compiled once for the CPU (dynamic shapes, scales passed as tensors so no value is baked into
the graph) and fused into one pass over memory; the compiled and eager paths give identical bytes,
which the tests check. On a GPU the eager kernels run (see `_on_cpu_only`).
`SCALESGD_FP8_KERNELS=eager|compiled|auto` (default auto) picks the path.
"""

from __future__ import annotations

import os
import threading
import warnings

import torch

MAX = 57344.0  # largest finite e5m2 value
F8 = torch.float8_e5m2
ONE_CODE = 0x3C  # the byte of 1.0: flags travel as it, and any sum of them stays nonzero
MAGNITUDE = 0x7F  # a byte's bits without the sign
FLUSH = 2.0 ** -17  # nonzero values at most this small encode as zero
KERNEL_MODES = ("auto", "compiled", "eager")
MODE_VARIABLE = "SCALESGD_FP8_KERNELS"


def _asked(environ=os.environ) -> str:
    """The kernel path the environment asks for (auto where it says nothing)."""
    return environ.get(MODE_VARIABLE, "auto").strip() or "auto"


def environment_problem(environ=os.environ) -> str | None:
    """What is wrong with the kernel path asked for in the environment, or None: checked when a command starts."""
    return _problem(_asked(environ))


def _problem(mode: str) -> str | None:
    """One line naming `mode` and the paths accepted, where it is not one of them."""
    return None if mode in KERNEL_MODES else f"{MODE_VARIABLE}={mode!r}: choose from {', '.join(KERNEL_MODES)}"


def _as_tensor(value, like: torch.Tensor) -> torch.Tensor:
    """Scales travel as float32 tensors: a Python float would be baked into a compiled graph."""
    if isinstance(value, torch.Tensor):
        return value.to(device=like.device, dtype=torch.float32)
    return torch.tensor(float(value), device=like.device, dtype=torch.float32)


# --- the definitions (eager) ------------------------------------------------------------------------
# Each kernel writes into a caller's buffer: a fresh output would cost more than the arithmetic (new
# memory is page-faulted in; the fused kernels reach 2–4× the throughput of the allocating form).

def _to_bytes(x: torch.Tensor) -> torch.Tensor:
    """Clamp then cast: torch's own cast turns out-of-range values into inf, Oyama et al. saturate."""
    return x.clamp(-MAX, MAX).to(F8).view(torch.uint8)


def _from_bytes(b: torch.Tensor) -> torch.Tensor:
    return b.view(F8).to(torch.float32)


def _stats(v):
    """(max |v| — NaN or inf when some value is not finite —, how many nonzero values flushed to zero) of the scaled
    values v: computed in the encoding pass, where they cost a third of it (separate passes cost 20× more).
    e5m2's smallest subnormal is 2^-16, so exactly the nonzero |v| ≤ 2^-17 round to zero (the tie goes to even)."""
    magnitude = v.abs()
    return magnitude.amax(), ((magnitude <= FLUSH) & (magnitude > 0)).sum(dtype=torch.int32)


def _encode(out, x, scale):
    v = x.to(torch.float32) * scale
    b = _to_bytes(v)
    out.copy_(b)
    return _stats(v)


def _encode_relative(out, g, w, eps, scale):
    v = g.to(torch.float32) / (w.to(torch.float32).abs() + eps) * scale
    b = _to_bytes(v)
    out.copy_(b)
    return _stats(v)


def _decode(out, b, scale):
    out.copy_(_from_bytes(b) / scale)


def _decode_relative(out, b, w, eps, scale):
    out.copy_(_from_bytes(b) / scale * (w.to(torch.float32).abs() + eps))


def _clipped(out, x, scale):
    out.copy_((x.to(torch.float32) * scale).abs() > MAX)


def _clipped_relative(out, g, w, eps, scale):
    out.copy_((g.to(torch.float32) / (w.to(torch.float32).abs() + eps) * scale).abs() > MAX)


def _add(into, b):
    into.copy_(_to_bytes(_from_bytes(into) + _from_bytes(b)))


def _sum_rows(out, rows, post):
    total = _from_bytes(rows[0])
    for row in rows[1:]:  # unrolled per row count when compiled: 6× faster than a sum over dim 0
        total = total + _from_bytes(row)
    out.copy_(_to_bytes(total * post))


_EAGER = {"encode": _encode, "decode": _decode, "encode_relative": _encode_relative,
          "decode_relative": _decode_relative, "clipped": _clipped, "clipped_relative": _clipped_relative,
          "add": _add, "sum_rows": _sum_rows}


# --- choosing the path ------------------------------------------------------------------------------

class _Kernels:
    """The functions in use: eager until a codec that exchanges every step is built, then resolved once per process
    (compiling took 26 s a process from a cold cache and 6 s warm on this project's 2-core CPU, which a periodic
    exchange's few calls do not pay back; `SCALESGD_FP8_KERNELS=eager`: never, `compiled`: for every codec)."""

    def __init__(self):
        self._table: dict | None = None
        self.mode = ""
        self._lock = threading.Lock()

    def table(self) -> dict:
        """The resolved kernels, or the eager ones where no codec asked for more."""
        return _EAGER if self._table is None else self._table

    def prepare(self, every_step: bool = True) -> str:
        """Resolve the kernels for a codec being built (`every_step`: it exchanges every step, so auto compiles);
        'compiled' or 'eager', the path its exchanges take."""
        mode = _asked()
        problem = _problem(mode)
        if problem:
            raise ValueError(problem)
        if self._table is None and (mode == "compiled" or mode == "auto" and every_step):
            with self._lock:
                if self._table is None:
                    self._table = self._resolve(mode)
        return self.mode or "eager"

    def _resolve(self, mode: str) -> dict:
        if mode not in KERNEL_MODES:
            raise ValueError(f"{MODE_VARIABLE}={mode!r}: choose from {', '.join(KERNEL_MODES)}")
        if mode == "eager":
            self.mode = "eager"
            return dict(_EAGER)
        try:
            table = {name: _on_cpu_only(torch.compile(fn, dynamic=True), fn) for name, fn in _EAGER.items()}
            _warm(table)
        except Exception as err:  # no compiler, unsupported device …: the eager path gives the same bytes
            if mode == "compiled":
                raise
            warnings.warn(f"torch.compile unavailable for the fp8 kernels ({type(err).__name__}); using eager torch")
            self.mode = "eager"
            return dict(_EAGER)
        self.mode = "compiled"
        return table


def _on_cpu_only(compiled, eager):
    """The compiled kernel for CPU tensors, the eager one for a GPU's. Measured on an H200 (torch 2.11): the compiled
    encode, its statistics fused into one dynamic-shape reduction, ran at 0.6 GB/s against eager's 206 GB/s, and its
    division is not IEEE-rounded, so decode's floats differed from eager's; eager CUDA kernels run at 200-500 GB/s."""
    def kernel(out, *args):
        return (eager if out.is_cuda else compiled)(out, *args)
    return kernel


def _warm(table: dict) -> None:
    """Compile the kernels as the codec calls them (per-element scales, distinct buffers) right now (a machine the
    compiler cannot serve falls back to eager here, not mid-run)."""
    x, w = torch.linspace(-3, 3, 37), torch.linspace(1, 2, 37)
    scale, eps = torch.full_like(x, 2.0), torch.tensor(1e-5)
    b, r = torch.empty(37, dtype=torch.uint8), torch.empty(37, dtype=torch.uint8)
    back, mask = torch.empty(37), torch.empty(37, dtype=torch.bool)
    table["encode"](b, x, scale)
    table["decode"](back, b, scale)
    table["encode_relative"](r, x, w, eps, scale)
    table["decode_relative"](back, r, w, eps, scale)
    table["clipped"](mask, x, scale)
    table["clipped_relative"](mask, x, w, eps, scale)
    table["add"](b, r)
    table["sum_rows"](b, [r, r.clone()], torch.tensor(0.5))


KERNELS = _Kernels()


def kernel_table(mode: str) -> dict:
    """The kernels of one path ('compiled' or 'eager'), whatever this process uses: for comparisons."""
    return _Kernels()._resolve(mode)


def kernel_mode(every_step: bool = True) -> str:
    """'compiled' or 'eager': which path this process uses, resolved for a codec that exchanges every step (or,
    `every_step` False, every H steps) if not done yet."""
    return KERNELS.prepare(every_step)


# --- the public functions ---------------------------------------------------------------------------

def _bytes_like(x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    return torch.empty(x.shape, dtype=torch.uint8, device=x.device) if out is None else out


def encode(x: torch.Tensor, scale=1.0, out: torch.Tensor | None = None) -> torch.Tensor:
    """The e5m2 bytes (uint8) of x·scale, rounded to nearest-even, saturated to ±57344."""
    out = _bytes_like(x, out)
    if x.numel():
        KERNELS.table()["encode"](out, x, _as_tensor(scale, x))
    return out


def encode_stats(x: torch.Tensor, out: torch.Tensor, scale, w: torch.Tensor | None = None,
                 eps=0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Write the bytes of v = x·scale (with `w`, of the relative v = x/(|w|+eps)·scale) into `out`; return, from the
    same pass, max |v| (above 57344: something saturated; NaN or inf: something was not finite) and the int32 count
    of nonzero values flushed to zero. `x` must not be empty."""
    if w is None:
        return KERNELS.table()["encode"](out, x, _as_tensor(scale, x))
    return KERNELS.table()["encode_relative"](out, x, w, _as_tensor(eps, x), _as_tensor(scale, x))


def decode(b: torch.Tensor, scale=1.0, out: torch.Tensor | None = None) -> torch.Tensor:
    """float32 values of e5m2 bytes `b`, divided by `scale`."""
    out = torch.empty(b.shape, device=b.device) if out is None else out
    KERNELS.table()["decode"](out, b, _as_tensor(scale, b))
    return out


def encode_relative(g: torch.Tensor, w: torch.Tensor, eps, scale, out: torch.Tensor | None = None) -> torch.Tensor:
    """Bytes of g/(|w|+eps)·scale: Oyama et al.'s relative data, in one pass."""
    out = _bytes_like(g, out)
    if g.numel():
        KERNELS.table()["encode_relative"](out, g, w, _as_tensor(eps, g), _as_tensor(scale, g))
    return out


def decode_relative(b: torch.Tensor, w: torch.Tensor, eps, scale, out: torch.Tensor | None = None) -> torch.Tensor:
    """decode(b, scale)·(|w|+eps): back from relative data to a gradient."""
    out = torch.empty(b.shape, device=b.device) if out is None else out
    KERNELS.table()["decode_relative"](out, b, w, _as_tensor(eps, w), _as_tensor(scale, w))
    return out


def clipped(x: torch.Tensor, scale, w: torch.Tensor | None = None, eps=0.0,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """Where encode saturates: |x·scale| > 57344 (with `w`, x is relative data: |x/(|w|+eps)·scale|)."""
    out = torch.empty(x.shape, dtype=torch.bool, device=x.device) if out is None else out
    if w is None:
        KERNELS.table()["clipped"](out, x, _as_tensor(scale, x))
    else:
        KERNELS.table()["clipped_relative"](out, x, w, _as_tensor(eps, x), _as_tensor(scale, x))
    return out


def add_(into: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """into ← Oyama et al.'s fp8 + fp8: decode both, add in float32, encode with saturation (never inf)."""
    KERNELS.table()["add"](into, b)
    return into


def sum_rows(parts: torch.Tensor, post, out: torch.Tensor | None = None) -> torch.Tensor:
    """Bytes of (Σ over rows of decoded `parts`, first to last)·post: the intra-node sum, rounded once."""
    out = _bytes_like(parts[0], out)
    KERNELS.table()["sum_rows"](out, list(parts), _as_tensor(post, parts))
    return out
