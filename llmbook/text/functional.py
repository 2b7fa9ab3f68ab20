"""Softmax, log-softmax, log-sum-exp, cross-entropy and perplexity, built from torch ops.

Introduced in notebooks/03_language_modelling. A language model turns a vector of
logits :math:`z \\in \\mathbb{R}^V` into probabilities with the softmax

.. math::  p_i = \\frac{e^{z_i}}{\\sum_j e^{z_j}},

and is trained by minimising the cross-entropy :math:`-\\log p_y` of the observed token
:math:`y`, averaged over tokens (in nats, since log is natural). Both are computed
through the log-sum-exp :math:`\\operatorname{LSE}(z) = m + \\log \\sum_j e^{z_j - m}` with
:math:`m = \\max_j z_j`, which never overflows (every exponent is at most 0) and never
takes the log of zero (one term is exactly 1). The gradient of the mean cross-entropy
over N tokens is :math:`(p - y)/N`, with y the one-hot target.

Everything here is differentiable by autograd and is checked against ``torch.softmax``,
``torch.log_softmax`` and ``torch.nn.functional.cross_entropy`` in the tests.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "cross_entropy",
    "log_softmax",
    "logsumexp",
    "perplexity",
    "perplexity_from_loss",
    "softmax",
]

_INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _check_floating(x: torch.Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")


def _check_dim(x: torch.Tensor, dim: int) -> int:
    """Return ``dim`` as a non-negative axis of ``x``, or raise naming ``dim`` and the rank."""
    if not isinstance(dim, int):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    if x.ndim == 0:
        raise ValueError("expected a tensor with at least one dimension, got a 0-d tensor")
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f"dim={dim} is out of range for a tensor with {x.ndim} dimensions "
                         f"(shape {tuple(x.shape)}); valid dims are {-x.ndim}..{x.ndim - 1}")
    return dim % x.ndim


def _safe_max(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Max along ``dim`` (kept), with rows that are all ``-inf`` shifted by 0 instead."""
    m = x.detach().amax(dim=dim, keepdim=True)
    # The shift is a constant for autograd: the result does not depend on it.
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


def logsumexp(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """``log(sum(exp(x), dim))`` computed as ``m + log(sum(exp(x - m)))`` with ``m = max x``.

    ``x`` has any shape; the result drops ``dim`` unless ``keepdim``. Rows that are all
    ``-inf`` give ``-inf`` (the log of an empty sum), as ``torch.logsumexp`` does.
    """
    _check_floating(x, "x")
    dim = _check_dim(x, dim)
    m = _safe_max(x, dim)  # (..., 1, ...)
    out = m + torch.log(torch.exp(x - m).sum(dim=dim, keepdim=True))
    return out if keepdim else out.squeeze(dim)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``exp(x_i) / sum_j exp(x_j)`` along ``dim``, shifted by the max for stability.

    ``x`` has any shape; the result has the same shape and sums to 1 along ``dim``.
    """
    _check_floating(x, "x")
    dim = _check_dim(x, dim)
    e = torch.exp(x - _safe_max(x, dim))  # every exponent <= 0, the largest is exactly 1
    return e / e.sum(dim=dim, keepdim=True)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``x_i - logsumexp(x)`` along ``dim``: the log of :func:`softmax` without forming it.

    Stays finite where ``softmax`` underflows to 0: ``log_softmax([0, -1e4])`` is
    ``[0, -1e4]``, while ``log(softmax(...))`` would give ``[0, -inf]``.
    """
    _check_floating(x, "x")
    dim = _check_dim(x, dim)
    # Subtract the max before anything else: (x - m) is exact for the largest entries,
    # whereas x - logsumexp(x) would lose the low bits of a large logsumexp in float32.
    shifted = x - _safe_max(x, dim)
    return shifted - torch.log(torch.exp(shifted).sum(dim=dim, keepdim=True))


def _check_targets(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> None:
    _check_floating(logits, "logits")
    if not isinstance(targets, torch.Tensor):
        raise TypeError(f"targets must be a torch.Tensor, got {type(targets).__name__}")
    if targets.dtype not in _INTEGER_DTYPES:
        raise TypeError(f"targets must be an integer tensor (token ids), got dtype {targets.dtype}")
    if logits.ndim == 0 or tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"logits of shape {tuple(logits.shape)} need targets of shape "
                         f"{tuple(logits.shape[:-1])} (logits without the last, vocabulary "
                         f"axis), got targets of shape {tuple(targets.shape)}")
    vocab_size = logits.shape[-1]
    bad = (targets != ignore_index) & ((targets < 0) | (targets >= vocab_size))
    if bad.any():
        value = int(targets[bad][0])
        raise ValueError(f"target {value} is out of range for a vocabulary of V = {vocab_size} "
                         f"(valid ids 0..{vocab_size - 1}, or ignore_index = {ignore_index})")


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100,
                  reduction: str = "mean") -> torch.Tensor:
    """Mean negative log-likelihood ``-log softmax(z)[y]`` of integer targets, in nats.

    Args:
        logits: ``(..., V)`` floating tensor of unnormalised scores z.
        targets: ``(...)`` integer tensor of token ids in ``[0, V)``, the same leading
            shape as ``logits``; positions equal to ``ignore_index`` do not count.
        ignore_index: target value to skip (PyTorch's default ``-100``).
        reduction: ``"mean"`` (over counted positions), ``"sum"`` or ``"none"`` (shape
            ``(...)``, zero at ignored positions).

    Equals ``torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))``.
    """
    _check_targets(logits, targets, ignore_index)
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    keep = targets != ignore_index  # (...)
    safe = torch.where(keep, targets, torch.zeros_like(targets)).long()  # valid index everywhere
    logp = log_softmax(logits, dim=-1)  # (..., V)
    nll = -logp.gather(-1, safe.unsqueeze(-1)).squeeze(-1)  # (...)
    nll = torch.where(keep, nll, torch.zeros_like(nll))
    if reduction == "none":
        return nll
    if reduction == "sum":
        return nll.sum()
    count = int(keep.sum())
    if count == 0:
        raise ValueError(f"no target to average over: all {targets.numel()} targets are "
                         f"ignore_index = {ignore_index} (or there are none)")
    return nll.sum() / count


def perplexity(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """``exp(cross_entropy(logits, targets))``: the model's effective branching factor.

    A model that is uniform over V tokens has perplexity exactly V.
    """
    return torch.exp(cross_entropy(logits, targets, ignore_index=ignore_index))


def perplexity_from_loss(loss: float | torch.Tensor) -> float | torch.Tensor:
    """``exp(loss)`` for a mean cross-entropy already computed, in nats per token."""
    if isinstance(loss, torch.Tensor):
        return torch.exp(loss)
    if not math.isfinite(loss) or loss < 0:
        raise ValueError(f"a mean cross-entropy must be finite and >= 0, got {loss!r}")
    return math.exp(loss)
