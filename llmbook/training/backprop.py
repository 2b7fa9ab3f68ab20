"""Backward passes derived by hand: linear, softmax, cross-entropy, LayerNorm, GELU, attention.

Introduced in notebooks/08_backpropagation. Each function is a pure function of quantities
saved from (or recomputed like) the forward pass and of the upstream gradient
G = dL/d(output) of a scalar loss L; it returns dL/d(inputs), the vector-Jacobian product
J^T G, without ever forming the Jacobian J. In the notebook every formula is derived in
SymPy and every function equals ``torch.autograd`` to 1e-10 in float64.

Conventions: the linear layer is PyTorch's ``nn.Linear``, y = x W^T + b with W of shape
(d_out, d_in). Leading (batch) dimensions are allowed wherever the forward pass allows them;
parameter gradients are summed over them, because a parameter shared by every position
receives the sum of the gradients of its uses.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from llmbook.transformer.attention import attention_weights

__all__ = [
    "attention_backward",
    "cross_entropy_backward",
    "gelu_backward",
    "layer_norm_backward",
    "linear_backward",
    "softmax_backward",
]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_TANH_CUBIC = 0.044715


def _check_floating(x: object, name: str, min_ndim: int = 1) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape "
                         f"{tuple(x.shape)}")
    return x


def _check_same_shape(a: Tensor, b: Tensor, name_a: str, name_b: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{name_a} and {name_b} must have the same shape, got "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")


def linear_backward(x: Tensor, W: Tensor, grad_out: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of y = x W^T + b (``nn.Linear``) given G = dL/dy.

    Shapes: x (..., d_in), W (d_out, d_in), grad_out G (..., d_out). With X and G flattened
    to (N, d_in) and (N, d_out) over the leading dimensions:

        dL/dx = G W            (..., d_in)
        dL/dW = G^T X          (d_out, d_in)
        dL/db = sum_n G_n      (d_out,)

    (In the y = X W layout, W of shape (d_in, d_out), the same rule reads dL/dW = X^T G and
    dL/dX = G W^T.) The bias does not enter any gradient, so it is not an argument.
    """
    _check_floating(x, "x")
    _check_floating(W, "W", min_ndim=2)
    _check_floating(grad_out, "grad_out")
    if W.ndim != 2:
        raise ValueError(f"W must have shape (d_out, d_in), got {tuple(W.shape)}")
    d_out, d_in = W.shape
    if x.shape[-1] != d_in:
        raise ValueError(f"x has last dimension {x.shape[-1]} but W of shape {tuple(W.shape)} "
                         f"needs d_in = {d_in}")
    if grad_out.shape != (*x.shape[:-1], d_out):
        raise ValueError(f"grad_out must have shape {(*x.shape[:-1], d_out)} (x's leading "
                         f"dimensions, then d_out), got {tuple(grad_out.shape)}")
    X = x.reshape(-1, d_in)  # (N, d_in)
    G = grad_out.reshape(-1, d_out)  # (N, d_out)
    grad_x = grad_out @ W  # (..., d_in)
    grad_W = G.T @ X  # (d_out, d_in)
    grad_b = G.sum(dim=0)  # (d_out,)
    return grad_x, grad_W, grad_b


def softmax_backward(p: Tensor, grad_p: Tensor) -> Tensor:
    """dL/dz for p = softmax(z) along the last dimension, given p and g = dL/dp.

    The Jacobian is diag(p) - p p^T (symmetric), so J^T g = p * (g - <g, p>): O(V) work per
    row instead of O(V^2). Shapes: p, grad_p (..., V) -> (..., V). Every output row sums to
    zero, because softmax does not change when a constant is added to z.
    """
    _check_floating(p, "p")
    _check_floating(grad_p, "grad_p")
    _check_same_shape(p, grad_p, "p", "grad_p")
    inner = (grad_p * p).sum(dim=-1, keepdim=True)  # (..., 1): <g, p>
    return p * (grad_p - inner)  # (..., V)


def cross_entropy_backward(logits: Tensor, targets: Tensor, ignore_index: int = -100) -> Tensor:
    """dL/dz for the mean cross-entropy L = (1/N) sum_n -log softmax(z_n)[y_n].

    The gradient is (p - y) / N per position, with p = softmax(z), y the one-hot target and
    N the number of targets that are not ``ignore_index`` (ignored positions get 0), as
    ``torch.nn.functional.cross_entropy`` with ``reduction="mean"``. Shapes: logits
    (..., V) floating, targets (...) integer -> (..., V).
    """
    _check_floating(logits, "logits")
    if not isinstance(targets, Tensor) or targets.is_floating_point() or targets.is_complex() \
            or targets.dtype == torch.bool:
        raise TypeError(f"targets must be an integer tensor of token ids, got "
                        f"{getattr(targets, 'dtype', type(targets).__name__)}")
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"logits of shape {tuple(logits.shape)} need targets of shape "
                         f"{tuple(logits.shape[:-1])}, got {tuple(targets.shape)}")
    V = logits.shape[-1]
    keep = targets != ignore_index  # (...)
    bad = keep & ((targets < 0) | (targets >= V))
    if bad.any():
        raise ValueError(f"target {int(targets[bad][0])} is out of range for V = {V} "
                         f"(valid ids 0..{V - 1}, or ignore_index = {ignore_index})")
    N = int(keep.sum())
    if N == 0:
        raise ValueError("no target to average over: every target is ignore_index")
    p = torch.softmax(logits, dim=-1)  # (..., V)
    y = torch.nn.functional.one_hot(torch.where(keep, targets, 0).long(), V).to(p.dtype)
    return (p - y) * keep.unsqueeze(-1) / N  # (..., V)


def layer_norm_backward(x: Tensor, gamma: Tensor, eps: float,
                        grad_out: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of y = gamma * x_hat + beta, x_hat = (x - mu) / s, s = sqrt(var + eps).

    Shapes: x, grad_out (..., d); gamma (d,). With g' = gamma * G and bars for means over
    the d features,

        dL/dx     = (g' - mean(g') - x_hat * mean(g' * x_hat)) / s     (..., d)
        dL/dgamma = sum over positions of G * x_hat                    (d,)
        dL/dbeta  = sum over positions of G                            (d,)

    the vector-Jacobian product of chapter 6's Jacobian diag(gamma) P / s, P symmetric.
    """
    _check_floating(x, "x")
    _check_floating(gamma, "gamma")
    _check_floating(grad_out, "grad_out")
    d = x.shape[-1]
    if gamma.shape != (d,):
        raise ValueError(f"gamma must have shape ({d},) to match x {tuple(x.shape)}, got "
                         f"{tuple(gamma.shape)}")
    _check_same_shape(x, grad_out, "x", "grad_out")
    if not (isinstance(eps, int | float) and not isinstance(eps, bool) and eps > 0):
        raise ValueError(f"eps must be a positive number, got {eps!r}")
    mu = x.mean(dim=-1, keepdim=True)  # (..., 1)
    s = ((x - mu).pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()  # (..., 1)
    x_hat = (x - mu) / s  # (..., d)
    g = gamma * grad_out  # (..., d)
    grad_x = (g - g.mean(dim=-1, keepdim=True)
              - x_hat * (g * x_hat).mean(dim=-1, keepdim=True)) / s  # (..., d)
    grad_gamma = (grad_out * x_hat).reshape(-1, d).sum(dim=0)  # (d,)
    grad_beta = grad_out.reshape(-1, d).sum(dim=0)  # (d,)
    return grad_x, grad_gamma, grad_beta


def gelu_backward(x: Tensor, grad_out: Tensor, approximate: str = "none") -> Tensor:
    """dL/dx for y = GELU(x) (elementwise), given G = dL/dy.

    * exact: GELU'(x) = Phi(x) + x phi(x), phi the standard normal density;
    * ``"tanh"``: with u = sqrt(2/pi) (x + c x^3), c = 0.044715,
      GELU_tanh'(x) = (1 + tanh u)/2 + x/2 (1 - tanh^2 u) sqrt(2/pi) (1 + 3 c x^2).

    Shapes: x, grad_out (...) -> (...).
    """
    _check_floating(x, "x", min_ndim=0)
    _check_floating(grad_out, "grad_out", min_ndim=0)
    _check_same_shape(x, grad_out, "x", "grad_out")
    if approximate == "none":
        cdf = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
        pdf = torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        return grad_out * (cdf + x * pdf)
    if approximate == "tanh":
        t = torch.tanh(_SQRT_2_OVER_PI * (x + _GELU_TANH_CUBIC * x.pow(3)))
        du = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_TANH_CUBIC * x * x)
        return grad_out * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)
    raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")


def attention_backward(q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor,
                       is_causal: bool = False,
                       scale: float | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of O = softmax(S) V, S = scale * Q K^T (+ causal mask), given dO = dL/dO.

    Shapes: q (..., T_q, d_k), k (..., T_k, d_k), v (..., T_k, d_v), grad_out (..., T_q, d_v),
    equal leading dimensions; ``scale`` defaults to 1/sqrt(d_k); ``is_causal`` is top-left
    aligned as in :func:`llmbook.transformer.attention.scaled_dot_product_attention`. The attention
    matrix A is recomputed from q and k (as FlashAttention's backward does), then

        dV = A^T dO,   dA = dO V^T,   dS = A * (dA - rowsum(dA * A)),
        dQ = scale dS K,   dK = scale dS^T Q.

    Masked entries have A = 0, so dS is 0 there and no gradient leaks into the future.
    Returns (dQ, dK, dV) with the shapes of (q, k, v).
    """
    for name, t in (("q", q), ("k", k), ("v", v), ("grad_out", grad_out)):
        _check_floating(t, name, min_ndim=2)
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2] \
            or not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise ValueError(f"need q (..., T_q, d_k), k (..., T_k, d_k), v (..., T_k, d_v) with "
                         f"equal leading dimensions, got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    expected = (*q.shape[:-1], v.shape[-1])
    if grad_out.shape != expected:
        raise ValueError(f"grad_out must have the output's shape {expected} (..., T_q, d_v), "
                         f"got {tuple(grad_out.shape)}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    A = attention_weights(q, k, is_causal=is_causal, scale=scale)  # (..., T_q, T_k)
    grad_v = A.transpose(-2, -1) @ grad_out  # (..., T_k, d_v)
    grad_A = grad_out @ v.transpose(-2, -1)  # (..., T_q, T_k)
    grad_S = softmax_backward(A, grad_A)  # (..., T_q, T_k): A * (dA - rowsum(dA * A))
    grad_q = scale * grad_S @ k  # (..., T_q, d_k)
    grad_k = scale * grad_S.transpose(-2, -1) @ q  # (..., T_k, d_k)
    return grad_q, grad_k, grad_v
