"""Uniform quantisation of tensors: absmax and zero-point, per tensor, channel or group.

Introduced in notebooks/15_quantisation. A b-bit uniform quantiser stores a tensor as
integers q and a step Δ (the *scale*): x ≈ Δ (q - z). Two ways to pick Δ and z:

* **absmax** (symmetric): Δ = max|x| / (2^(b-1) - 1), z = 0, q in [-(2^(b-1) - 1), 2^(b-1) - 1];
* **zero-point** (asymmetric, "min-max"): the range [min(x, 0), max(x, 0)] is split into
  2^b - 1 steps, Δ = (max - min) / (2^b - 1), z = round(-min / Δ), q in [0, 2^b - 1]
  (the range always contains 0, so that 0 is represented exactly).

Either statistic can be taken over the whole tensor (``dim=None``), over every slice along
one dimension (``dim=k``: one scale per channel k), or over groups of ``group_size``
consecutive entries of the last dimension (the input dimension of a weight of shape
(d_out, d_in): one scale per output row and group). Rounding to the nearest level leaves an
error |e| <= Δ/2 for every value inside the range, and for values spread evenly over a step
a mean squared error of Δ²/12.

Also here: :func:`int8_matmul` (integer products accumulated in int32, as integer matrix
units do), :func:`int8_matmul_decomposed` (LLM.int8()'s outlier columns in float),
:func:`accumulator_overflow_length`, :class:`QuantLinear` (a linear layer with
quantised weights and optionally int8 activations), :func:`nf4_levels`, the 4-bit
NormalFloat code book of Dettmers et al. (2023, "QLoRA: Efficient Finetuning of Quantized
LLMs"), and the roofline of weight-only quantised decoding: :func:`stored_bits_per_weight`
and :func:`roofline`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "QuantLinear",
    "QuantizedTensor",
    "accumulator_overflow_length",
    "dequantize",
    "fake_quantize",
    "int8_matmul",
    "int8_matmul_decomposed",
    "nf4_levels",
    "nf4_offset",
    "quantize_absmax",
    "quantize_nf4",
    "quantize_zeropoint",
    "roofline",
    "stored_bits_per_weight",
]


@dataclass(frozen=True)
class QuantizedTensor:
    """Integer codes and the numbers that turn them back into reals: x ≈ scale (q - zero).

    ``q`` has the shape of the original tensor (int32, values in the code range);
    ``scale`` and ``zero`` broadcast against ``q`` after ``q`` is viewed in blocks: for
    layout "tensor" they are scalars (shape ()); for "channel" they keep a size-1 axis
    everywhere except ``dim``; for "group" they have shape (..., n_groups, 1) and ``q`` is
    viewed as (..., n_groups, group_size). ``zero`` is 0 for absmax.
    """

    q: Tensor
    scale: Tensor
    zero: Tensor
    bits: int
    layout: str  # "tensor", "channel" or "group"
    dim: int | None = None
    group_size: int | None = None

    @property
    def shape(self) -> torch.Size:
        return self.q.shape


def _check_args(x: object, bits: object, dim: object, group_size: object) -> Tensor:
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating-point torch.Tensor, got "
                        f"{x.dtype if isinstance(x, Tensor) else type(x).__name__}")
    if x.ndim == 0 or x.numel() == 0:
        raise ValueError(f"x must have at least one dimension and one entry, got shape "
                         f"{tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise ValueError("x contains NaN or infinite values")
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be an int in 2..8, got {bits!r}")
    if dim is not None and group_size is not None:
        raise ValueError(f"give dim (per channel) or group_size (group-wise), not both: "
                         f"dim={dim}, group_size={group_size}")
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int)
                            or not -x.ndim <= dim < x.ndim):
        raise ValueError(f"dim must be an int in [{-x.ndim}, {x.ndim}) for shape "
                         f"{tuple(x.shape)}, got {dim!r}")
    if group_size is not None:
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
            raise ValueError(f"group_size must be a positive int, got {group_size!r}")
        if x.shape[-1] % group_size:
            raise ValueError(f"group_size={group_size} must divide the last dimension of x, "
                             f"shape {tuple(x.shape)}")
    return x


def _blocks(x: Tensor, dim: int | None, group_size: int | None) -> tuple[Tensor, tuple[int, ...]]:
    """View x in blocks and name the axes a block's statistic reduces over."""
    if group_size is not None:
        xb = x.reshape(*x.shape[:-1], x.shape[-1] // group_size, group_size)  # (..., G, gs)
        return xb, (-1,)
    if dim is not None:
        dim = dim % x.ndim
        return x, tuple(i for i in range(x.ndim) if i != dim)
    return x, tuple(range(x.ndim))


def _layout(dim: int | None, group_size: int | None) -> str:
    return "group" if group_size is not None else "channel" if dim is not None else "tensor"


def quantize_absmax(x: Tensor, bits: int, dim: int | None = None,
                    group_size: int | None = None) -> QuantizedTensor:
    """Symmetric (absmax) quantisation: Δ = max|x| / (2^(b-1) - 1), q = round(x / Δ).

    ``x`` (any shape), ``bits`` in 2..8; statistic per tensor (``dim=None``), per slice
    along ``dim``, or per group of ``group_size`` along the last dimension. A block that is
    all zero gets Δ = 1 (its codes are 0). Returns a :class:`QuantizedTensor`.
    """
    x = _check_args(x, bits, dim, group_size)
    qmax = 2 ** (bits - 1) - 1
    xb, axes = _blocks(x, dim, group_size)
    amax = xb.abs().amax(dim=axes, keepdim=dim is not None or group_size is not None)
    scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
    q = torch.clamp(torch.round(xb / scale), -qmax, qmax).to(torch.int32).reshape(x.shape)
    return QuantizedTensor(q, scale, torch.zeros_like(scale), bits, _layout(dim, group_size),
                           dim, group_size)


def quantize_zeropoint(x: Tensor, bits: int, dim: int | None = None,
                       group_size: int | None = None) -> QuantizedTensor:
    """Asymmetric (zero-point) quantisation of the range [min(x, 0), max(x, 0)].

    Δ = (max - min) / (2^b - 1), z = round(-min / Δ) (an integer in [0, 2^b - 1]),
    q = clamp(round(x / Δ) + z, 0, 2^b - 1); blocks as in :func:`quantize_absmax`.
    """
    x = _check_args(x, bits, dim, group_size)
    levels = 2**bits - 1
    xb, axes = _blocks(x, dim, group_size)
    keep = dim is not None or group_size is not None
    lo = xb.amin(dim=axes, keepdim=keep).clamp(max=0)
    hi = xb.amax(dim=axes, keepdim=keep).clamp(min=0)
    scale = torch.where(hi > lo, (hi - lo) / levels, torch.ones_like(hi))
    zero = torch.round(-lo / scale)
    q = torch.clamp(torch.round(xb / scale) + zero, 0, levels).to(torch.int32).reshape(x.shape)
    return QuantizedTensor(q, scale, zero, bits, _layout(dim, group_size), dim, group_size)


def dequantize(qt: QuantizedTensor) -> Tensor:
    """The real values scale (q - zero), in the dtype of the scale and the shape of q."""
    if not isinstance(qt, QuantizedTensor):
        raise TypeError(f"dequantize expects a QuantizedTensor, got {type(qt).__name__}")
    q = qt.q.to(qt.scale.dtype)
    if qt.layout == "group":
        gs = qt.group_size
        qb = q.reshape(*q.shape[:-1], q.shape[-1] // gs, gs)  # (..., G, gs)
        return (qt.scale * (qb - qt.zero)).reshape(q.shape)
    return qt.scale * (q - qt.zero)


def fake_quantize(x: Tensor, bits: int, dim: int | None = None, group_size: int | None = None,
                  symmetric: bool = False) -> Tensor:
    """Quantise and dequantise at once (round-to-nearest, "RTN"): same shape and dtype as x."""
    quant = quantize_absmax if symmetric else quantize_zeropoint
    return dequantize(quant(x, bits, dim, group_size))


# ---------------------------------------------------------------- integer matmul


def accumulator_overflow_length(acc_bits: int, bits: int = 8) -> int:
    """The smallest number of terms K whose worst-case sum of b-bit products overflows a
    signed ``acc_bits`` accumulator: K = floor((2^(acc-1) - 1) / (2^(b-1) - 1)^2) + 1.

    With symmetric codes |q| <= 2^(b-1) - 1 = 127 for int8 each product is at most
    127² = 16129: an int16 accumulator overflows at K = 3, an int32 one at K = 133 145.
    """
    for name, v in (("acc_bits", acc_bits), ("bits", bits)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 2:
            raise ValueError(f"{name} must be an int >= 2, got {v!r}")
    qmax = 2 ** (bits - 1) - 1
    return (2 ** (acc_bits - 1) - 1) // (qmax * qmax) + 1


def _wrap(x: Tensor, acc_bits: int) -> Tensor:
    """Two's-complement wrap-around of integers to ``acc_bits`` bits."""
    half = 2 ** (acc_bits - 1)
    return torch.remainder(x + half, 2 * half) - half


def int8_matmul(a_q: QuantizedTensor, b_q: QuantizedTensor, acc_bits: int = 32) -> Tensor:
    """y = A Bᵀ from absmax codes: integer products summed in an ``acc_bits`` accumulator,
    then one multiplication by the scales.

    ``a_q``: activations (M, K), per tensor or per row (``dim=0``, "per token");
    ``b_q``: weights (N, K), per tensor or per output row (``dim=0``); both symmetric
    (zero = 0) with at most 8 bits. Returns float (M, N):
    y[m, n] = s_a[m] s_b[n] Σ_k q_a[m, k] q_b[n, k]. The sum is computed in int64 and
    wrapped to ``acc_bits`` (two's complement) after every term, which is what a narrow
    hardware accumulator does; with 32 bits and K < 133 145 no wrap ever happens and
    the result equals the float product of the dequantised matrices.
    """
    for name, t in (("a_q", a_q), ("b_q", b_q)):
        if not isinstance(t, QuantizedTensor):
            raise TypeError(f"{name} must be a QuantizedTensor, got {type(t).__name__}")
        if t.q.ndim != 2 or t.layout == "group" or (t.layout == "channel" and t.dim % 2 != 0):
            raise ValueError(f"{name} must be 2-D, quantised per tensor or per row (dim=0), "
                             f"got shape {tuple(t.q.shape)}, layout {t.layout}, dim {t.dim}")
        if bool((t.zero != 0).any()):
            raise ValueError(f"{name} must be symmetric (absmax, zero = 0)")
    if a_q.q.shape[1] != b_q.q.shape[1]:
        raise ValueError(f"inner dimensions differ: a {tuple(a_q.q.shape)}, b {tuple(b_q.q.shape)}")
    if acc_bits not in (16, 32):
        raise ValueError(f"acc_bits must be 16 or 32, got {acc_bits!r}")
    qa, qb = a_q.q.to(torch.int64), b_q.q.to(torch.int64)
    if acc_bits == 32 and qa.shape[1] < accumulator_overflow_length(32, max(a_q.bits, b_q.bits)):
        acc = (qa @ qb.T).to(torch.int32)  # (M, N): exact, no term can wrap
    else:
        products = qa[:, None, :] * qb[None, :, :]  # (M, N, K)
        acc = torch.zeros(products.shape[:2], dtype=torch.int64)
        for k in range(products.shape[2]):
            acc = _wrap(acc + products[:, :, k], acc_bits)  # (M, N)
    sa = a_q.scale.reshape(-1, 1) if a_q.layout == "channel" else a_q.scale  # (M, 1) or ()
    sb = b_q.scale.reshape(1, -1) if b_q.layout == "channel" else b_q.scale  # (1, N) or ()
    return acc.to(sa.dtype) * sa * sb  # (M, N)


def int8_matmul_decomposed(x: Tensor, w: Tensor, threshold: float = 6.0) -> tuple[Tensor, Tensor]:
    """LLM.int8()'s mixed-precision decomposition (Dettmers et al., 2022, section 3.2).

    ``x`` (M, K) activations, ``w`` (N, K) weights. The input channels (columns of x) in
    which any |x| >= ``threshold`` are the outlier dimensions O; their part of the product,
    x[:, O] w[:, O]^T, is computed in float (16-bit in the paper), and the rest with int8
    vector-wise quantisation: absmax per row of x[:, ~O] (per token) and per row of w[:, ~O]
    (per output channel), summed in int32 (:func:`int8_matmul`). Returns (y (M, N) float,
    the boolean mask O (K,)). ``threshold=inf`` is plain W8A8; ``threshold=0`` all float.
    Introduced in notebooks/15_quantisation (section 15.18).
    """
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, Tensor) or not t.is_floating_point() or t.ndim != 2:
            raise ValueError(f"{name} must be a 2-D floating tensor, got "
                             f"{tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"inner dimensions differ: x {tuple(x.shape)}, w {tuple(w.shape)}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not threshold >= 0:
        raise ValueError(f"threshold must be a number >= 0, got {threshold!r}")
    outlier = (x.abs() >= threshold).any(0)  # (K,)
    y = x[:, outlier] @ w[:, outlier].T  # (M, N): the float part
    if bool((~outlier).any()):
        xs, ws = x[:, ~outlier], w[:, ~outlier]
        y = y + int8_matmul(quantize_absmax(xs, 8, dim=0), quantize_absmax(ws, 8, dim=0)).to(y.dtype)
    return y, outlier


class QuantLinear(nn.Module):
    """A linear layer y = x Wᵀ + b whose weight is stored quantised.

    Build it with :meth:`from_linear`. With ``act_bits=None`` the forward dequantises the
    weight and runs a float matmul (weight-only quantisation, the common case for LLM
    inference, where the bottleneck is reading the weights); with ``act_bits=8`` each
    token's activations are quantised absmax per row and multiplied with int32
    accumulation (:func:`int8_matmul`, "W8A8"), which needs per-channel symmetric weights.
    Shapes: (..., d_in) -> (..., d_out).
    """

    def __init__(self, weight_q: QuantizedTensor, bias: Tensor | None,
                 act_bits: int | None = None) -> None:
        super().__init__()
        if act_bits is not None and (weight_q.layout == "group" or bool((weight_q.zero != 0).any())):
            raise ValueError("int8 activations need symmetric weights per tensor or per channel")
        self.weight_q = weight_q
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.act_bits = act_bits
        self.out_features, self.in_features = weight_q.q.shape

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int, group_size: int | None = None,
                    symmetric: bool = True, act_bits: int | None = None) -> QuantLinear:
        """Quantise ``linear.weight`` (d_out, d_in) per output channel (``group_size=None``)
        or in groups of ``group_size`` input columns."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach()
        quant = quantize_absmax if symmetric else quantize_zeropoint
        wq = quant(w, bits, dim=0 if group_size is None else None, group_size=group_size)
        return cls(wq, linear.bias, act_bits)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x must end in d_in={self.in_features}, got {tuple(x.shape)}")
        if self.act_bits is None:
            return F.linear(x, dequantize(self.weight_q).to(x.dtype), self.bias)
        x2 = x.reshape(-1, self.in_features)  # (N, d_in)
        xq = quantize_absmax(x2, self.act_bits, dim=0)
        y = int8_matmul(xq, self.weight_q).to(x.dtype)  # (N, d_out)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


# ---------------------------------------------------------------- NF4


def nf4_offset() -> float:
    """QLoRA's offset 1 - δ with δ = (1/32 + 1/30) / 2: the outermost quantile used.

    The normal quantile function is infinite at 0 and 1, so the extreme levels sit at
    quantile 1 - δ, half-way between the quantiles 1 - 1/32 and 1 - 1/30 that 16
    levels on one side and 15 on the other would give: 0.96770833...
    """
    return 1 - 0.5 * (1 / 32 + 1 / 30)


def nf4_levels() -> Tensor:
    """The 16 levels of 4-bit NormalFloat (Dettmers et al., 2023, QLoRA, section 3).

    Levels are quantiles of N(0, 1), asymmetric so that 0 is exact: 8 positive levels at
    the quantiles linspace(1 - δ, 1/2, 9)[:-1], 7 negative ones at minus the quantiles
    linspace(1 - δ, 1/2, 8)[:-1], and 0; divided by the largest, so they span [-1, 1].
    Returned sorted, float64, shape (16,).
    """
    normal = torch.distributions.Normal(torch.tensor(0.0, dtype=torch.float64),
                                        torch.tensor(1.0, dtype=torch.float64))
    offset = nf4_offset()
    positive = normal.icdf(torch.linspace(offset, 0.5, 9, dtype=torch.float64)[:-1])  # (8,)
    negative = -normal.icdf(torch.linspace(offset, 0.5, 8, dtype=torch.float64)[:-1])  # (7,)
    levels = torch.cat([positive, torch.zeros(1, dtype=torch.float64), negative])
    return torch.sort(levels / levels.max()).values  # (16,)


def quantize_nf4(x: Tensor, group_size: int = 64) -> Tensor:
    """Fake-quantise x to NF4 in groups of ``group_size`` along the last dimension: each
    group is divided by its absmax and every value snapped to the nearest NF4 level."""
    x = _check_args(x, 4, None, group_size)
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // group_size, group_size)  # (..., G, gs)
    amax = xb.abs().amax(-1, keepdim=True)
    amax = torch.where(amax > 0, amax, torch.ones_like(amax))
    levels = nf4_levels().to(x.dtype)
    idx = ((xb / amax)[..., None] - levels).abs().argmin(-1)  # (..., G, gs)
    return (levels[idx] * amax).reshape(x.shape)


# ---------------------------------------------------------------- roofline


def stored_bits_per_weight(bits: int | None, group_size: int | None = None,
                           scale_bits: int = 16, zero_bits: int | None = None) -> float:
    """Bits stored (and read) per weight: b for the code plus, per group of ``group_size``
    weights, a ``scale_bits`` scale and a ``zero_bits`` zero point (or minimum):
    b + (scale_bits + zero_bits) / g.

    ``zero_bits=None`` is a b-bit zero point (the book's zero-point codes, section 15.1);
    ``zero_bits=0`` a symmetric code (ggml's Q4_0, Q8_0); ``zero_bits=16`` a float16 minimum
    (ggml's Q4_1). ``bits=None`` is an unquantised weight of ``scale_bits`` bits (16:
    float16/bfloat16); ``group_size=None`` leaves out the per-row scale (one per d_in weights,
    negligible). The same accounting as :func:`llmbook.inference.gptq.model_memory_bytes`.
    Introduced in notebooks/15_quantisation (section 15.9).
    """
    if isinstance(scale_bits, bool) or not isinstance(scale_bits, int) or scale_bits <= 0:
        raise ValueError(f"scale_bits must be a positive int, got {scale_bits!r}")
    if zero_bits is not None and (isinstance(zero_bits, bool) or not isinstance(zero_bits, int)
                                  or zero_bits < 0):
        raise ValueError(f"zero_bits must be None or a non-negative int, got {zero_bits!r}")
    if bits is None:
        return float(scale_bits)
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 16:
        raise ValueError(f"bits must be None or an int in 1..16, got {bits!r}")
    if group_size is None:
        return float(bits)
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
        raise ValueError(f"group_size must be None or a positive int, got {group_size!r}")
    return bits + (scale_bits + (bits if zero_bits is None else zero_bits)) / group_size


def roofline(flops: float, bytes_moved: float, peak_flops: float,
             bandwidth: float) -> dict[str, float | str]:
    """The roofline bound of a kernel (Williams, Waterman & Patterson, 2009, "Roofline: An
    Insightful Visual Performance Model for Multicore Architectures").

    A kernel doing ``flops`` operations and moving ``bytes_moved`` bytes on a machine with
    ``peak_flops`` FLOP/s and ``bandwidth`` bytes/s takes at least
    max(flops / peak_flops, bytes_moved / bandwidth). Returns ``intensity`` (FLOP/byte),
    ``balance`` (peak_flops / bandwidth, FLOP/byte), ``time`` (s, the bound) and ``bound``:
    "memory" if the intensity is below the balance point, else "compute".
    """
    for name, v in (("flops", flops), ("bytes_moved", bytes_moved), ("peak_flops", peak_flops),
                    ("bandwidth", bandwidth)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
            raise ValueError(f"{name} must be a positive number, got {v!r}")
    intensity, balance = flops / bytes_moved, peak_flops / bandwidth
    return {"intensity": intensity, "balance": balance,
            "time": max(flops / peak_flops, bytes_moved / bandwidth),
            "bound": "memory" if intensity < balance else "compute"}
