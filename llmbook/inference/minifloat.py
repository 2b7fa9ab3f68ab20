"""Small floating-point formats: FP8 (E4M3, E5M2), FP4 (E2M1) and MX block scaling.

A float with E exponent bits and M mantissa bits stores ±2^(e - bias) (1 + f / 2^M) for a
biased exponent e in 1..2^E - 1 (normal numbers) and ±2^(1 - bias) (f / 2^M) for e = 0
(subnormals), bias = 2^(E-1) - 1. The formats differ in what they reserve:

* ``"ieee"`` (E5M2; Micikevicius et al. (2022), "FP8 Formats for Deep Learning"): the top
  exponent holds infinities and NaNs, as in IEEE 754; largest finite (2 - 2^-M) 2^(2^E - 2 - bias).
* ``"fn"`` (E4M3 as ``torch.float8_e4m3fn``: finite and NaN only): only the all-ones code
  is NaN, so the top exponent holds numbers too; largest (2 - 2^(1-M)) 2^(2^E - 1 - bias).
* ``"none"`` (FP4 E2M1 of the OCP Microscaling spec, 2023): every code is a number; largest
  (2 - 2^-M) 2^(2^E - 1 - bias).

:func:`float_grid` lists the non-negative values of a format, :func:`round_to_float` rounds
to them (to nearest, ties to even, as ``Tensor.to(torch.float8_*)`` does), and
:func:`quantize_mx` / :func:`dequantize_mx` apply the OCP MX block scaling (Rouhani et al.
(2023), "Microscaling Data Formats for Deep Learning"): blocks of 32 elements share a scale
2^k stored as an 8-bit exponent (E8M0), k = floor(log2 max|x|) - emax of the element format,
and each element is rounded in its format with saturation. Introduced in
notebooks/15_quantisation (section 15.16).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from llmbook.validation import check_floating_tensor, check_positive_int

__all__ = ["E2M1", "E4M3", "E5M2", "FloatFormat", "dequantize_mx", "float_grid", "quantize_mx",
           "round_to_float"]

_SPECIALS = ("ieee", "fn", "none")


class FloatFormat(NamedTuple):
    """A small float: ``exp_bits`` E, ``man_bits`` M and which codes are reserved
    (``specials``: "ieee", "fn" or "none", see the module docstring)."""

    exp_bits: int
    man_bits: int
    specials: str

    @property
    def bias(self) -> int:
        return 2 ** (self.exp_bits - 1) - 1

    @property
    def max_exponent(self) -> int:
        """The unbiased exponent of the largest finite binade."""
        top = 2**self.exp_bits - 1 - self.bias
        return top - 1 if self.specials == "ieee" else top

    @property
    def max_value(self) -> float:
        mantissa = 2 - 2.0 ** (1 - self.man_bits) if self.specials == "fn" else 2 - 2.0**-self.man_bits
        return mantissa * 2.0**self.max_exponent

    @property
    def min_normal(self) -> float:
        return 2.0 ** (1 - self.bias)

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (1 - self.bias - self.man_bits)


E4M3 = FloatFormat(4, 3, "fn")  # torch.float8_e4m3fn
E5M2 = FloatFormat(5, 2, "ieee")  # torch.float8_e5m2
E2M1 = FloatFormat(2, 1, "none")  # OCP MX FP4


def _check_format(fmt: object) -> FloatFormat:
    if not isinstance(fmt, FloatFormat) or fmt.specials not in _SPECIALS or \
            not (isinstance(fmt.exp_bits, int) and 1 <= fmt.exp_bits <= 8) or \
            not (isinstance(fmt.man_bits, int) and 0 <= fmt.man_bits <= 10):
        raise ValueError(f"fmt must be a FloatFormat with exp_bits in 1..8, man_bits in 0..10 and "
                         f"specials in {_SPECIALS}, got {fmt!r}")
    return fmt


def float_grid(fmt: FloatFormat) -> Tensor:
    """Every non-negative finite value of ``fmt``, sorted, float64 of shape (n,): 0, the
    subnormals f 2^(1-bias-M) and the normal binades up to ``fmt.max_value``."""
    fmt = _check_format(fmt)
    step = fmt.min_subnormal
    values = [f * step for f in range(2**fmt.man_bits)]  # e = 0: zero and subnormals
    for e in range(1 - fmt.bias, fmt.max_exponent + 1):
        values += [2.0**e * (1 + f / 2**fmt.man_bits) for f in range(2**fmt.man_bits)]
    grid = torch.tensor(values, dtype=torch.float64)
    return grid[grid <= fmt.max_value]


def round_to_float(x: Tensor, fmt: FloatFormat, saturate: bool = True, ties: str = "even") -> Tensor:
    """``x`` rounded to the nearest value of ``fmt``; shape and dtype of ``x`` (computed in
    float64). A value half-way between two neighbours goes to the one with the even mantissa
    (``ties="even"``, IEEE 754's default and torch's casts) or to the smaller magnitude
    (``ties="toward_zero"``, what ggml's MXFP4 encoder does).

    Beyond the largest value: ``saturate=True`` clamps to ±max (what torch's cast to
    ``float8_e4m3fn`` does on the CPU); ``False`` gives ±inf from the midpoint between max
    and the next power of the spacing on (IEEE overflow, what the cast to ``float8_e5m2``
    does). NaN stays NaN.
    """
    x = check_floating_tensor(x, "x")
    fmt = _check_format(fmt)
    if ties not in ("even", "toward_zero"):
        raise ValueError(f"ties must be 'even' or 'toward_zero', got {ties!r}")
    xd = x.double()
    mag = xd.abs()
    # the binade of each value, floored at the subnormal range: spacing 2^(e - M)
    e = torch.floor(torch.log2(torch.where(mag > 0, mag, torch.ones_like(mag))))
    e = e.clamp(min=1 - fmt.bias)
    spacing = torch.exp2(e - fmt.man_bits)
    steps = mag / spacing
    # torch.round rounds half to even; ceil(t - 1/2) rounds half down (t >= 0)
    rounded = (torch.round(steps) if ties == "even" else torch.ceil(steps - 0.5)) * spacing
    top = fmt.max_value + 2.0 ** (fmt.max_exponent - fmt.man_bits) / 2  # midpoint above max
    if saturate:
        rounded = rounded.clamp(max=fmt.max_value)
    else:
        rounded = torch.where(mag >= top, torch.full_like(mag, float("inf")),
                              rounded.clamp(max=fmt.max_value))
    out = torch.copysign(rounded, xd)
    return torch.where(torch.isnan(xd), xd, out).to(x.dtype)


def quantize_mx(x: Tensor, fmt: FloatFormat = E2M1, block_size: int = 32,
                ties: str = "even") -> tuple[Tensor, Tensor]:
    """OCP MX block scaling of ``x`` (..., K) along its last dimension, K a multiple of
    ``block_size``: returns (exponents k (..., K / block_size) int32, elements (..., K) float64
    on ``fmt``'s grid) with x ≈ 2^k · element.

    k = floor(log2 max|x_block|) - fmt.max_exponent (the spec's shared scale, an E8M0 number,
    clamped to its range -127..127; an all-zero block gets k = -127); the elements are
    x / 2^k rounded to ``fmt`` with saturation and ``ties`` (see :func:`round_to_float`). For
    E2M1 with ``ties="toward_zero"`` this is ggml's MXFP4 encoder, bit for bit.
    """
    x = check_floating_tensor(x, "x")
    fmt = _check_format(fmt)
    block_size = check_positive_int("block_size", block_size)
    if x.ndim == 0 or x.shape[-1] % block_size:
        raise ValueError(f"the last dimension of x must be a multiple of block_size={block_size}, "
                         f"got shape {tuple(x.shape)}")
    blocks = x.double().reshape(*x.shape[:-1], -1, block_size)  # (..., K / B, B)
    amax = blocks.abs().amax(-1)  # (..., K / B)
    k = torch.where(amax > 0, torch.floor(torch.log2(torch.where(amax > 0, amax, 1.0))) - fmt.max_exponent,
                    torch.full_like(amax, -127.0)).clamp(-127, 127)
    elements = round_to_float(blocks / torch.exp2(k)[..., None], fmt, saturate=True, ties=ties)
    return k.to(torch.int32), elements.reshape(x.shape)


def dequantize_mx(exponents: Tensor, elements: Tensor, block_size: int = 32) -> Tensor:
    """2^k · element for the output of :func:`quantize_mx`: (..., K) float64."""
    block_size = check_positive_int("block_size", block_size)
    if elements.shape[:-1] != exponents.shape[:-1] or \
            elements.shape[-1] != exponents.shape[-1] * block_size:
        raise ValueError(f"elements (..., K) and exponents (..., K / {block_size}) do not match: "
                         f"{tuple(elements.shape)} and {tuple(exponents.shape)}")
    scale = torch.exp2(exponents.double()).repeat_interleave(block_size, dim=-1)
    return elements.double() * scale
