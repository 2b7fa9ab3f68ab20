"""Norms and feed-forward layers: LayerNorm, RMSNorm, GELU, SiLU, the MLP and SwiGLU.

Introduced in notebooks/06_norms_ffn. A transformer block is two residual sub-layers,
``x + F(norm(x))``: one mixes positions (attention, chapter 4), the other transforms each
position on its own (the feed-forward layer built here). This module holds the pieces
that are not attention:

* :class:`LayerNorm` (Ba, Kiros & Hinton, 2016, "Layer Normalization"):
  y = gamma * (x - mu) / sqrt(sigma^2 + eps) + beta over the last dimension;
* :class:`RMSNorm` (Zhang & Sennrich, 2019, "Root Mean Square Layer Normalization"):
  y = g * x / sqrt(mean(x^2) + eps), no centring and no bias (Llama, Qwen2);
* :func:`layer_norm_jacobian`, :func:`rms_norm_jacobian`: their Jacobians in closed form;
* :func:`gelu` (Hendrycks & Gimpel, 2016, "Gaussian Error Linear Units (GELUs)"), exact and
  with the tanh approximation of GPT-2; :func:`tanh_cdf_error`, the error of that approximation's
  normal CDF; :func:`silu` / :func:`swish`;
* :class:`MLP`: GPT-2's feed-forward layer, proj(act(fc(x)));
* :class:`SwiGLU` (Shazeer, 2020, "GLU Variants Improve Transformer"):
  down_proj(SiLU(gate_proj(x)) * up_proj(x)), Llama's feed-forward layer;
* :func:`mlp_parameter_count`, :func:`swiglu_parameter_count`, :func:`swiglu_hidden_size`:
  parameter counts and Llama's rule for choosing d_ff.

Parameter and submodule names follow PyTorch (``weight``, ``bias``) and Hugging Face Llama
(``gate_proj``, ``up_proj``, ``down_proj``), so state dicts map one to one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from llmbook.validation import check_positive_int

__all__ = [
    "ACTIVATIONS",
    "MLP",
    "LayerNorm",
    "RMSNorm",
    "SwiGLU",
    "gelu",
    "get_activation",
    "layer_norm_jacobian",
    "mlp_parameter_count",
    "rms_norm_jacobian",
    "silu",
    "swiglu_hidden_size",
    "swiglu_parameter_count",
    "swish",
    "tanh_cdf_error",
]

# The constants of the tanh approximation of GELU: sqrt(2/pi) and 0.044715.
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_TANH_CUBIC = 0.044715


# ---------------------------------------------------------------- validation


def _check_eps(eps: object, allow_zero: bool = False) -> float:
    """eps as a float: positive and finite, or also 0 when ``allow_zero``."""
    if isinstance(eps, bool) or not isinstance(eps, int | float):
        raise TypeError(f"eps must be a float, got {eps!r} ({type(eps).__name__})")
    if allow_zero:
        if not (eps >= 0 and math.isfinite(eps)):
            raise ValueError(f"eps must be a non-negative finite number, got eps={eps}")
    elif not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be a positive finite number, got eps={eps}")
    return float(eps)


def _check_input(x: object, d: int, who: str) -> Tensor:
    """x must be a floating tensor whose last dimension is d."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{who} expects a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{who} expects a floating-point tensor, got dtype {x.dtype}")
    if x.ndim == 0 or x.shape[-1] != d:
        raise ValueError(f"{who} expects input of shape (..., {d}), got {tuple(x.shape)}")
    return x


def _check_floating(x: object, who: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{who} expects a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{who} expects a floating-point tensor, got dtype {x.dtype}")
    return x


# ---------------------------------------------------------------- norms


class LayerNorm(nn.Module):
    """Layer normalisation over the last dimension (Ba, Kiros & Hinton, 2016).

    For each vector x in R^d (the last dimension; all others are batch dimensions)

        mu = mean(x),   sigma^2 = mean((x - mu)^2)   (the biased variance),
        y  = gamma * (x - mu) / sqrt(sigma^2 + eps) + beta,

    with the learned gain ``weight`` = gamma (d,), initialised to 1, and shift ``bias`` =
    beta (d,), initialised to 0 (absent when ``bias=False``). The same computation as
    ``torch.nn.LayerNorm(d, eps)``, written with plain tensor operations.
    ``eps=0`` is accepted, as by PyTorch: it is the bare definition that hand-worked
    examples use, and a constant input then gives 0/0 = nan.
    Shapes: (..., d) -> (..., d).
    """

    def __init__(
        self, d: int, eps: float = 1e-5, bias: bool = True, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__()
        self.d = check_positive_int("d", d)
        self.eps = _check_eps(eps, allow_zero=True)
        self.weight = nn.Parameter(torch.ones(d, dtype=dtype))  # gamma (d,)
        self.bias = nn.Parameter(torch.zeros(d, dtype=dtype)) if bias else None  # beta (d,)

    def forward(self, x: Tensor) -> Tensor:
        x = _check_input(x, self.d, "LayerNorm")
        mu = x.mean(dim=-1, keepdim=True)  # (..., 1)
        var = (x - mu).pow(2).mean(dim=-1, keepdim=True)  # (..., 1), biased
        x_hat = (x - mu) * torch.rsqrt(var + self.eps)  # (..., d)
        y = x_hat * self.weight
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"d={self.d}, eps={self.eps}, bias={self.bias is not None}"


class RMSNorm(nn.Module):
    """Root-mean-square normalisation over the last dimension (Zhang & Sennrich, 2019).

        r = sqrt(mean(x^2) + eps),   y = g * x / r,

    with the learned gain ``weight`` = g (d,), initialised to 1. No mean is subtracted and
    there is no bias: RMSNorm keeps LayerNorm's re-scaling invariance and drops its
    re-centring. The default ``eps`` = 1e-6 is ``LlamaRMSNorm``'s, the ``rms_norm_eps`` of
    the first Llama and of Qwen2; Llama 2's checkpoints use 1e-5.

    Precision, as Hugging Face ``LlamaRMSNorm`` (Llama, Qwen2): x / r is computed in float32
    for float16 and bfloat16 inputs, cast back to the input dtype, and only then multiplied
    by the weight. For float32 inputs this is the plain formula; float64 inputs are kept in
    float64 (Llama's module would round them to float32). Shapes: (..., d) -> (..., d).
    """

    def __init__(self, d: int, eps: float = 1e-6, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.d = check_positive_int("d", d)
        self.eps = _check_eps(eps)
        self.weight = nn.Parameter(torch.ones(d, dtype=dtype))  # g (d,)

    def forward(self, x: Tensor) -> Tensor:
        x = _check_input(x, self.d, "RMSNorm")
        input_dtype = x.dtype
        h = x.to(torch.promote_types(input_dtype, torch.float32))  # at least float32
        mean_square = h.pow(2).mean(dim=-1, keepdim=True)  # (..., 1)
        h = h * torch.rsqrt(mean_square + self.eps)  # (..., d)
        return self.weight * h.to(input_dtype)

    def extra_repr(self) -> str:
        return f"d={self.d}, eps={self.eps}"


def layer_norm_jacobian(x: Tensor, weight: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """The Jacobian dy/dx of LayerNorm at x, in closed form.

    With sigma = sqrt(var(x) + eps) and x_hat = (x - mu) / sigma,

        dy/dx = diag(gamma) / sigma * (I - 1 1^T / d - x_hat x_hat^T / d),

    which is exact for every eps > 0 (the bias beta does not enter). Its null space holds
    the vector 1 (shifting x changes nothing); x itself is annihilated only as eps -> 0.
    Shapes: x (..., d), weight (d,) or None (all ones) -> (..., d, d), entry [i, j] = dy_i/dx_j.
    """
    x = _check_floating(x, "layer_norm_jacobian")
    if x.ndim == 0:
        raise ValueError("layer_norm_jacobian expects input of shape (..., d), got a 0-d tensor")
    d = x.shape[-1]
    eps = _check_eps(eps)
    gamma = x.new_ones(d) if weight is None else _check_input(weight, d, "weight")
    mu = x.mean(dim=-1, keepdim=True)  # (..., 1)
    sigma = ((x - mu).pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()  # (..., 1)
    x_hat = (x - mu) / sigma  # (..., d)
    eye = torch.eye(d, dtype=x.dtype, device=x.device)  # (d, d)
    inner = eye - 1.0 / d - x_hat.unsqueeze(-1) * x_hat.unsqueeze(-2) / d  # (..., d, d)
    return gamma.unsqueeze(-1) * inner / sigma.unsqueeze(-1)  # (..., d, d)


def rms_norm_jacobian(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """The Jacobian dy/dx of RMSNorm at x, in closed form.

    With r = sqrt(mean(x^2) + eps),

        dy/dx = diag(g) / r * (I - x x^T / (d r^2)),

    exact for every eps > 0. As eps -> 0 it annihilates x (scaling x changes nothing).
    Shapes: x (..., d), weight (d,) or None (all ones) -> (..., d, d), entry [i, j] = dy_i/dx_j.
    """
    x = _check_floating(x, "rms_norm_jacobian")
    if x.ndim == 0:
        raise ValueError("rms_norm_jacobian expects input of shape (..., d), got a 0-d tensor")
    d = x.shape[-1]
    eps = _check_eps(eps)
    g = x.new_ones(d) if weight is None else _check_input(weight, d, "weight")
    r2 = x.pow(2).mean(dim=-1, keepdim=True) + eps  # (..., 1)
    eye = torch.eye(d, dtype=x.dtype, device=x.device)  # (d, d)
    inner = eye - x.unsqueeze(-1) * x.unsqueeze(-2) / (d * r2.unsqueeze(-1))  # (..., d, d)
    return g.unsqueeze(-1) * inner / r2.sqrt().unsqueeze(-1)  # (..., d, d)


# ---------------------------------------------------------------- activations


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """The Gaussian error linear unit, GELU(x) = x Phi(x) (Hendrycks & Gimpel, 2016).

    * ``approximate="none"``: exact, x Phi(x) = x/2 (1 + erf(x / sqrt 2));
    * ``approximate="tanh"``: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the form GPT-2
      uses (Hugging Face's ``gelu_new``); it differs from the exact GELU by less than 1e-3.

    The same values as ``torch.nn.functional.gelu(x, approximate=...)``. Shape preserved.
    """
    x = _check_floating(x, "gelu")
    if approximate == "none":
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
    if approximate == "tanh":
        return 0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + _GELU_TANH_CUBIC * x.pow(3))))
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


def tanh_cdf_error(x: Tensor, c: float = _GELU_TANH_CUBIC) -> Tensor:
    """The error of the tanh form of the normal CDF inside GELU_tanh: Phi_tanh(x; c) - Phi(x).

    Phi_tanh(x; c) = (1 + tanh(sqrt(2/pi) (x + c x^3))) / 2, so that GELU_tanh(x) = x Phi_tanh(x;
    0.044715) (Hendrycks & Gimpel, 2016) and GELU_tanh - GELU = x times this error. It is odd in
    x; ``c`` (default GPT-2's 0.044715, the constant that makes its largest value over the line
    smallest, notebooks/06_norms_ffn) is any finite real number. Shape preserved.
    """
    x = _check_floating(x, "tanh_cdf_error")
    if isinstance(c, bool) or not isinstance(c, int | float) or not math.isfinite(c):
        raise ValueError(f"tanh_cdf_error: c must be a finite real number, got c={c!r}")
    cdf = 0.5 * (1 + torch.erf(x / math.sqrt(2)))
    return 0.5 * (1 + torch.tanh(_SQRT_2_OVER_PI * (x + c * x**3))) - cdf


def swish(x: Tensor, beta: float = 1.0) -> Tensor:
    """Swish, x sigmoid(beta x) (Ramachandran, Zoph & Le, 2017, "Searching for Activation
    Functions"); beta = 1 is SiLU. Shape preserved."""
    x = _check_floating(x, "swish")
    return x * torch.sigmoid(beta * x)


def silu(x: Tensor) -> Tensor:
    """The sigmoid linear unit, SiLU(x) = x sigmoid(x) (Hendrycks & Gimpel, 2016; Elfwing et
    al., 2018), the gate of SwiGLU: :func:`swish` with beta = 1.

    Computed by PyTorch's single fused kernel ``torch.nn.functional.silu`` rather than as
    x * sigmoid(x) in two operations: the same function (the tests check it against
    :func:`swish`), but faster, and its backward keeps one tensor instead of two.
    """
    x = _check_floating(x, "silu")
    return F.silu(x)


def _gelu_exact(x: Tensor) -> Tensor:
    return gelu(x, "none")


def _gelu_tanh(x: Tensor) -> Tensor:
    return gelu(x, "tanh")


def _relu(x: Tensor) -> Tensor:
    return _check_floating(x, "relu").clamp_min(0.0)


# Activation names as Hugging Face configurations spell them ("gelu_new" is GPT-2's).
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": _gelu_exact,
    "gelu_tanh": _gelu_tanh,
    "gelu_new": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "relu": _relu,
    "silu": silu,
    "swish": silu,
}


def get_activation(name: str) -> Callable[[Tensor], Tensor]:
    """The activation function called ``name`` (a key of :data:`ACTIVATIONS`)."""
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


# ---------------------------------------------------------------- feed-forward layers


class MLP(nn.Module):
    """GPT-2's position-wise feed-forward layer: proj(act(fc(x))).

    ``fc`` = nn.Linear(d_model, d_ff) and ``proj`` = nn.Linear(d_ff, d_model), with biases
    unless ``bias=False``; ``activation`` names one of :data:`ACTIVATIONS` (GPT-2: the tanh
    GELU, d_ff = 4 d_model). Vaswani et al. (2017, "Attention Is All You Need") used ReLU.
    Shapes: (..., d_model) -> (..., d_ff) -> (..., d_model). Parameters:
    2 d_model d_ff (+ d_ff + d_model with biases).
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: str = "gelu_tanh",
        bias: bool = True,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.d_ff = check_positive_int("d_ff", d_ff)
        self.activation = activation
        self.act = get_activation(activation)
        self.fc = nn.Linear(d_model, d_ff, bias=bias, dtype=dtype)  # weight (d_ff, d_model)
        self.proj = nn.Linear(d_ff, d_model, bias=bias, dtype=dtype)  # weight (d_model, d_ff)

    def forward(self, x: Tensor) -> Tensor:
        x = _check_input(x, self.d_model, "MLP")
        h = self.act(self.fc(x))  # (..., d_ff)
        return self.proj(h)  # (..., d_model)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


class SwiGLU(nn.Module):
    """The gated feed-forward layer of Llama (Shazeer, 2020, "GLU Variants Improve Transformer"):

        SwiGLU(x) = W_down (SiLU(W_gate x) * W_up x),

    a GLU whose gate uses SiLU (Swish with beta = 1). Submodules ``gate_proj``, ``up_proj``
    (nn.Linear d_model -> d_ff) and ``down_proj`` (d_ff -> d_model), no biases by default, as
    Hugging Face's ``LlamaMLP``. Shapes: (..., d_model) -> (..., d_ff) -> (..., d_model).
    Parameters: 3 d_model d_ff; Llama picks d_ff near 2/3 * 4 d_model to match an MLP's
    8 d_model^2 (see :func:`swiglu_hidden_size`).
    """

    def __init__(
        self, d_model: int, d_ff: int, bias: bool = False, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.d_ff = check_positive_int("d_ff", d_ff)
        self.gate_proj = nn.Linear(d_model, d_ff, bias=bias, dtype=dtype)  # W_gate (d_ff, d_model)
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias, dtype=dtype)  # W_up (d_ff, d_model)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias, dtype=dtype)  # W_down (d_model, d_ff)

    def forward(self, x: Tensor) -> Tensor:
        x = _check_input(x, self.d_model, "SwiGLU")
        h = silu(self.gate_proj(x)) * self.up_proj(x)  # (..., d_ff)
        return self.down_proj(h)  # (..., d_model)


def mlp_parameter_count(d_model: int, d_ff: int, bias: bool = True) -> int:
    """Parameters of :class:`MLP`: 2 d_model d_ff weights, plus d_ff + d_model biases.

    GPT-2 small (d_model = 768, d_ff = 3072, biases): 4,722,432.
    """
    d_model = check_positive_int("d_model", d_model)
    d_ff = check_positive_int("d_ff", d_ff)
    return 2 * d_model * d_ff + ((d_ff + d_model) if bias else 0)


def swiglu_parameter_count(d_model: int, d_ff: int, bias: bool = False) -> int:
    """Parameters of :class:`SwiGLU`: 3 d_model d_ff weights, plus 2 d_ff + d_model biases.

    Llama 2 7B (d_model = 4096, d_ff = 11008, no biases): 135,266,304.
    """
    d_model = check_positive_int("d_model", d_model)
    d_ff = check_positive_int("d_ff", d_ff)
    return 3 * d_model * d_ff + ((2 * d_ff + d_model) if bias else 0)


def swiglu_hidden_size(
    d_model: int, multiple_of: int = 256, ffn_dim_multiplier: float | None = None
) -> int:
    """Llama's choice of d_ff for a SwiGLU layer of width d_model.

    Start from an MLP's 4 d_model, take 2/3 of it so that the three matrices hold as many
    parameters as the MLP's two, optionally scale by ``ffn_dim_multiplier``, and round up to
    a multiple of ``multiple_of`` (the rule of Meta's Llama reference code). Llama 7B:
    d_model = 4096 -> int(2/3 * 16384) = 10922 -> 11008.
    """
    d_model = check_positive_int("d_model", d_model)
    multiple_of = check_positive_int("multiple_of", multiple_of)
    hidden = int(2 * (4 * d_model) / 3)
    if ffn_dim_multiplier is not None:
        if not ffn_dim_multiplier > 0:
            raise ValueError(f"ffn_dim_multiplier must be positive, got {ffn_dim_multiplier}")
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)
