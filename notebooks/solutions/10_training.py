"""Reference solutions to the exercises of notebooks/10_training (checked by tests/test_solutions_10.py)."""

from __future__ import annotations

import sympy as sp
import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from llmbook.text.data import MarkovSource
from llmbook.text.functional import cross_entropy
from llmbook.training.memory import activation_elements_per_layer_symbolic
from llmbook.training.optim import clip_grad_norm_, set_lr
from llmbook.training.train import get_batch

# ---------------------------------------------------------------- exercise 1


def tokens_and_epochs(steps: int, batch_size: int, context_length: int,
                      num_tokens: int) -> tuple[int, float]:
    """Exercise 1: tokens processed (steps * B * T) and passes over ``num_tokens`` of data."""
    for name, v in (("steps", steps), ("batch_size", batch_size),
                    ("context_length", context_length), ("num_tokens", num_tokens)):
        if not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    seen = steps * batch_size * context_length
    return seen, seen / num_tokens


# ---------------------------------------------------------------- exercise 2


def _entropy(p: Tensor) -> float:
    p = p[p > 0]
    return float(-(p * p.log()).sum())


def prefix_entropies(source: MarkovSource) -> list[float]:
    """H(X_0..X_j) for j = 0..k-1 (joint entropies of the first j + 1 tokens).

    The stationary distribution over contexts is the joint law of k consecutive tokens,
    an array of shape (V,) * k with the oldest token first; summing out the oldest
    tokens leaves the joint law of the most recent ones, which by stationarity is that
    of X_0..X_j.
    """
    v, k = source.vocab_size, source.order
    joint = source.stationary.reshape((v,) * k)  # pi(x_0, ..., x_{k-1})
    return [_entropy(joint.sum(dim=tuple(range(k - 1 - j)))) if j < k - 1 else _entropy(joint)
            for j in range(k)]


def per_position_floor(source: MarkovSource, context_length: int) -> list[float]:
    """Exact lowest expected loss at each position t = 0..T-1 of a window.

    Position t predicts x_{t+1} from x_0..x_t: H(X_0..X_{t+1}) - H(X_0..X_t) while
    t + 1 < k, and the entropy rate H once t + 1 >= k.
    """
    if not isinstance(context_length, int) or context_length <= 0:
        raise ValueError(f"context_length must be a positive int, got {context_length!r}")
    joint = prefix_entropies(source)
    H = source.entropy_rate()
    return [joint[t + 1] - joint[t] if t + 1 < source.order else H
            for t in range(context_length)]


def window_floor(source: MarkovSource, context_length: int) -> float:
    """Exercise 2: the floor of the loss averaged over a window of T positions."""
    floors = per_position_floor(source, context_length)
    return sum(floors) / len(floors)


# ---------------------------------------------------------------- exercise 3


def accumulated_train_step(model: nn.Module, optimizer: Optimizer, x: Tensor, y: Tensor,
                           lr: float, micro_batches: int,
                           grad_clip: float | None = None) -> Tensor:
    """Exercise 3: one update from ``micro_batches`` slices of the batch (B must divide).

    The full-batch loss is the mean over B * T positions; with equal slices it is the
    mean of the slices' means, so each slice's loss is divided by ``micro_batches``
    before ``backward`` and the accumulated gradient equals the full-batch gradient.
    Returns the full-batch loss.
    """
    B = x.shape[0]
    if micro_batches <= 0 or B % micro_batches:
        raise ValueError(f"micro_batches={micro_batches} must divide the batch size B={B}")
    set_lr(optimizer, lr)
    optimizer.zero_grad(set_to_none=True)
    total = None
    for xs, ys in zip(x.chunk(micro_batches), y.chunk(micro_batches), strict=True):
        loss = cross_entropy(model(xs), ys) / micro_batches  # (B/m, T, V) -> ()
        loss.backward()  # gradients add up in .grad
        total = loss.detach() if total is None else total + loss.detach()
    if grad_clip is not None:
        clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return total


# ---------------------------------------------------------------- exercise 4


@torch.no_grad()
def per_position_loss(model: nn.Module, tokens: Tensor, context_length: int,
                      num_windows: int, generator: torch.Generator | None = None) -> Tensor:
    """Exercise 4: the model's mean loss at each position, shape (T,)."""
    was_training = model.training
    model.eval()
    x, y = get_batch(tokens, num_windows, context_length, generator=generator)
    nll = cross_entropy(model(x), y, reduction="none")  # (num_windows, T)
    model.train(was_training)
    return nll.mean(0)  # (T,)


# ---------------------------------------------------------------- exercise 5


def korthikanti_activation_bytes() -> dict[str, sp.Expr]:
    """Exercise 5: the activation bytes of one 16-bit transformer layer with dropout, per
    operation, as counted by Korthikanti et al. (2022), section 4.1.

    s sequence, b batch, h hidden size, a heads; activations 2 bytes, dropout masks 1 byte;
    LayerNorm and GELU are fused kernels that save only their input; d_ff = 4h.
    """
    s, b, h, a = sp.symbols("s b h a", positive=True, integer=True)
    act, mask = 2, 1  # bytes per element
    terms = {
        "attention: QKV input": act * s * b * h,
        "attention: Q and K for Q K^T": 2 * act * s * b * h,
        "attention: softmax output": act * a * s**2 * b,
        "attention: softmax dropout mask": mask * a * s**2 * b,
        "attention: dropped-out weights and V for A V": act * a * s**2 * b + act * s * b * h,
        "attention: output projection input": act * s * b * h,
        "attention: output dropout mask": mask * s * b * h,
        "MLP: first linear input": act * s * b * h,
        "MLP: GELU input (4h wide)": act * s * b * 4 * h,
        "MLP: second linear input (4h wide)": act * s * b * 4 * h,
        "MLP: dropout mask": mask * s * b * h,
        "two LayerNorms: their inputs": 2 * act * s * b * h,
    }
    terms["total"] = sp.expand(sum(terms.values()))
    return terms


def book_block_bytes_16bit() -> sp.Expr:
    """Exercise 5: the book's GPT-2 block (chapter 10's count) with 2-byte activations."""
    count = activation_elements_per_layer_symbolic()
    b, s, h, f = sp.symbols("b s h f", positive=True, integer=True)
    return sp.expand((2 * count["floats"] + count["mask bytes"]).subs(f, 4 * h))


# ---------------------------------------------------------------- exercise 6


def z_loss_gradient(logits: Tensor) -> Tensor:
    """Exercise 6: the gradient of ``z_loss(logits)``, 2 log Z softmax(z) / n, (..., V) -> (..., V)."""
    if not isinstance(logits, Tensor) or not logits.is_floating_point() or logits.ndim < 1:
        raise TypeError("logits must be a floating tensor of shape (..., V)")
    n = logits[..., 0].numel()
    if n == 0 or logits.shape[-1] == 0:
        raise ValueError("logits has no positions or an empty vocabulary axis")
    return 2 * torch.logsumexp(logits, -1, keepdim=True) * torch.softmax(logits, -1) / n


def logit_shift_for_zero_z(logits: Tensor) -> Tensor:
    """Exercise 6: the shift c = -log Z per position (shape (...)) that makes the z-loss 0."""
    if not isinstance(logits, Tensor) or not logits.is_floating_point() or logits.ndim < 1:
        raise TypeError("logits must be a floating tensor of shape (..., V)")
    if logits.shape[-1] == 0:
        raise ValueError("logits has an empty vocabulary axis")
    return -torch.logsumexp(logits, -1)


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))
