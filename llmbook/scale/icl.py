"""In-context linear regression, and a linear self-attention layer that is one step of gradient descent.

Introduced in notebooks/24_induction_heads (section 24.6). von Oswald et al. (2023),
"Transformers Learn In-Context by Gradient Descent", construct the weights of one linear
self-attention (LSA) layer whose output on a prompt of regression examples is the prediction of
one gradient-descent step on those examples, and find that an LSA layer trained on such prompts
learns exactly that. The claim holds under conditions that this module makes explicit:

* the prompt is N context tokens e_i = (x_i, y_i) in R^(d+1) and a query token e_q = (x_q, 0);
* the attention is *linear*: no softmax, no normalisation; the query attends to the N context
  tokens: e_q <- e_q + sum_i P W_V e_i (W_K e_i)^T (W_Q e_q);
* gradient descent starts from w_0 = 0 on L(w) = 1/(2N) sum_i (w^T x_i - y_i)^2 with learning
  rate eta, and the prediction is read from the query's y-slot with a minus sign;
* one layer is one step.

This module provides

* :func:`regression_prompts` - tasks w ~ N(0, I_d), inputs x ~ U(-1, 1)^d, laid out as tokens;
* :func:`gd_prediction` - one gradient step from w_0 = 0 (autograd), then w_1^T x_q;
* :func:`gd_construction` - von Oswald et al.'s weights W_K, W_Q, W_V, P for a given eta;
* :class:`LinearSelfAttention` - the layer, with :meth:`~LinearSelfAttention.predict`;
* :func:`optimal_learning_rate` - the eta that minimises the expected one-step error for this
  data (the value a trained layer should find);
* :func:`effective_weights` - the product of the layer's weights that its predictions depend on
  (P W_V and W_K^T W_Q enter only through it);
* :func:`train_lsa` - a few seconds of Adam on fresh prompts.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from llmbook.validation import (
    check_finite,
    check_floating_tensor,
    check_positive_int,
    check_positive_number,
)

__all__ = [
    "LinearSelfAttention",
    "effective_weights",
    "gd_construction",
    "gd_prediction",
    "optimal_learning_rate",
    "regression_prompts",
    "train_lsa",
]


def regression_prompts(batch_size: int, n_context: int, dim: int, generator: torch.Generator,
                       dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """Prompts of in-context linear regression: ``(tokens, target)``.

    Each row draws a task w ~ N(0, I_d) and N + 1 inputs x ~ U(-1, 1)^d (von Oswald et al.,
    2023, section 4), with y = w^T x and no noise. ``tokens`` (B, N + 1, d + 1): rows 0..N-1
    are (x_i, y_i), row N is the query (x_q, 0); ``target`` (B,) is w^T x_q.
    """
    B = check_positive_int("batch_size", batch_size)
    N = check_positive_int("n_context", n_context)
    d = check_positive_int("dim", dim)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    w = torch.randn(B, d, generator=generator, dtype=dtype)  # (B, d)
    x = 2 * torch.rand(B, N + 1, d, generator=generator, dtype=dtype) - 1  # (B, N + 1, d)
    y = torch.einsum("bnd,bd->bn", x, w)  # (B, N + 1)
    tokens = torch.cat([x, y[..., None]], dim=-1)  # (B, N + 1, d + 1)
    tokens[:, -1, -1] = 0.0  # the query's y is unknown
    return tokens, y[:, -1]


def _check_tokens(tokens: object, dim: int | None = None) -> Tensor:
    tokens = check_finite(check_floating_tensor(tokens, "tokens"), "tokens")
    if tokens.ndim != 3 or tokens.shape[1] < 2 or tokens.shape[2] < 2:
        raise ValueError(f"tokens must have shape (B, N + 1, d + 1) with N >= 1 and d >= 1, "
                         f"got {tuple(tokens.shape)}")
    if dim is not None and tokens.shape[2] != dim + 1:
        raise ValueError(f"tokens must have d + 1 = {dim + 1} features, got {tokens.shape[2]}")
    return tokens


def gd_prediction(tokens: Tensor, eta: float) -> Tensor:
    """The prediction w_1^T x_q of one gradient step from w_0 = 0: (B, N + 1, d + 1) -> (B,).

    L(w) = 1/(2N) sum_i (w^T x_i - y_i)^2 over the context tokens, w_1 = w_0 - eta grad L(w_0),
    the gradient taken by autograd (not by the closed form eta/N sum_i y_i x_i, so that it can
    be checked against it).
    """
    tokens = _check_tokens(tokens)
    eta = check_positive_number("eta", eta)
    x, y, x_q = tokens[:, :-1, :-1], tokens[:, :-1, -1], tokens[:, -1, :-1]  # (B, N, d), (B, N), (B, d)
    with torch.enable_grad():
        w0 = torch.zeros(x_q.shape, dtype=tokens.dtype, requires_grad=True)  # (B, d)
        loss = 0.5 * ((torch.einsum("bnd,bd->bn", x, w0) - y) ** 2).mean(1).sum()  # sum over tasks
        (grad,) = torch.autograd.grad(loss, w0)
    w1 = w0.detach() - eta * grad  # (B, d)
    return (w1 * x_q).sum(-1)  # (B,)


def gd_construction(dim: int, eta: float, n_context: int,
                    dtype: torch.dtype = torch.float64) -> dict[str, Tensor]:
    """von Oswald et al.'s (2023, Proposition 1) weights, w_0 = 0: each (d + 1, d + 1).

    W_K = W_Q = [[I_d, 0], [0, 0]] (keys and queries read x only), W_V = [[0, 0], [0, -1]]
    (the value is -y_i in the y-slot), P = eta / N I. The query's y-slot becomes
    -eta/N sum_i y_i x_i^T x_q = -w_1^T x_q.
    """
    d = check_positive_int("dim", dim)
    eta = check_positive_number("eta", eta)
    N = check_positive_int("n_context", n_context)
    kq = torch.zeros(d + 1, d + 1, dtype=dtype)
    kq[:d, :d] = torch.eye(d, dtype=dtype)
    v = torch.zeros(d + 1, d + 1, dtype=dtype)
    v[d, d] = -1.0
    return {"W_K": kq.clone(), "W_Q": kq.clone(), "W_V": v,
            "P": eta / N * torch.eye(d + 1, dtype=dtype)}


class LinearSelfAttention(nn.Module):
    """One linear self-attention layer (von Oswald et al., 2023, eq. 4), the query's update only.

    e_q <- e_q + sum_{i < N} P W_V e_i (W_K e_i)^T (W_Q e_q): attention without softmax, the
    query (the last token) attending to the N context tokens. ``tokens`` (B, N + 1, d + 1) ->
    the updated query (B, d + 1); :meth:`predict` reads the prediction -(y-slot), (B,).
    Weights start N(0, ``init_std``^2) (or from :func:`gd_construction` via ``weights``).
    """

    def __init__(self, dim: int, init_std: float = 0.1, generator: torch.Generator | None = None,
                 weights: dict[str, Tensor] | None = None, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        check_positive_number("init_std", init_std)
        n = dim + 1
        for name in ("W_K", "W_Q", "W_V", "P"):
            if weights is not None:
                if name not in weights or tuple(weights[name].shape) != (n, n):
                    raise ValueError(f"weights must hold {name} of shape ({n}, {n})")
                value = weights[name].to(dtype).clone()
            else:
                value = init_std * torch.randn(n, n, generator=generator, dtype=dtype)
            setattr(self, name, nn.Parameter(value))

    def forward(self, tokens: Tensor) -> Tensor:
        """The query token after the layer: (B, N + 1, d + 1) -> (B, d + 1)."""
        tokens = _check_tokens(tokens, self.dim)
        context, query = tokens[:, :-1], tokens[:, -1]  # (B, N, d + 1), (B, d + 1)
        keys = context @ self.W_K.T  # (B, N, d + 1)
        values = context @ (self.P @ self.W_V).T  # (B, N, d + 1)
        scores = torch.einsum("bnk,bk->bn", keys, query @ self.W_Q.T)  # (B, N): no softmax
        return query + torch.einsum("bn,bnk->bk", scores, values)  # (B, d + 1)

    def predict(self, tokens: Tensor) -> Tensor:
        """The layer's prediction for the query, minus its y-slot: (B, N + 1, d + 1) -> (B,)."""
        return -self(tokens)[:, -1]


def effective_weights(weights: dict[str, Tensor] | nn.Module) -> Tensor:
    """M[a, b, k] = (P W_V)[d, a] (W_K^T W_Q)[b, k] for k < d: (d + 1, d + 1, d).

    The prediction is -sum_i sum_{a,b,k} e_i^a e_i^b x_q^k M[a, b, k], so two layers with the
    same M predict the same on every prompt; M is unchanged by P W_V -> c P W_V,
    W_K^T W_Q -> W_K^T W_Q / c and by any invertible change of basis inside W_K, W_Q. It is the
    part of the weights that training can determine. Takes a :class:`LinearSelfAttention` or a
    dict from :func:`gd_construction`.
    """
    get = (lambda n: getattr(weights, n)) if isinstance(weights, nn.Module) else weights.__getitem__
    pv = get("P") @ get("W_V")  # (d + 1, d + 1)
    kq = get("W_K").T @ get("W_Q")  # (d + 1, d + 1)
    d = pv.shape[0] - 1
    return torch.einsum("a,bk->abk", pv[d], kq[:, :d])  # (d + 1, d + 1, d)


def optimal_learning_rate(dim: int, n_context: int) -> float:
    """The eta minimising E[(w_1^T x_q - w^T x_q)^2] for :func:`regression_prompts` data.

    With S = 1/N sum_i x_i x_i^T, one step gives w_1 = eta S w; the error is
    E[x_q^T x_q] / d * E|(eta S - I) w|^2, minimised at eta* = tr E[S] / tr E[S^2]. For
    x ~ U(-1, 1)^d, E[x_j^2] = 1/3, E[x_j^4] = 1/5, so E[S] = I/3 and
    E[S^2] = ((1/5 + (d - 1)/9) / N + (N - 1) / (9 N)) I (derived in notebooks/24 with SymPy).
    """
    d = check_positive_int("dim", dim)
    N = check_positive_int("n_context", n_context)
    second = (1 / 5 + (d - 1) / 9) / N + (N - 1) / (9 * N)
    return (1 / 3) / second


def train_lsa(dim: int, n_context: int, steps: int = 800, batch_size: int = 1024, lr: float = 2e-2,
              init_std: float = 0.1, seed: int = 0) -> tuple[LinearSelfAttention, list[float]]:
    """Train a :class:`LinearSelfAttention` on fresh :func:`regression_prompts` batches (float64).

    Adam on the mean squared error of :meth:`~LinearSelfAttention.predict` against w^T x_q,
    the learning rate decaying linearly from ``lr`` to 0 (so that the last steps average out the
    noise of the batches), one thread; returns the layer (eval mode) and the loss of every step.
    """
    steps = check_positive_int("steps", steps)
    batch_size = check_positive_int("batch_size", batch_size)
    check_positive_number("lr", lr)
    g = torch.Generator().manual_seed(seed)
    layer = LinearSelfAttention(dim, init_std=init_std, generator=g)
    opt = torch.optim.Adam(layer.parameters(), lr=lr)
    decay = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1 - step / steps)
    losses = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(steps):
            tokens, target = regression_prompts(batch_size, n_context, dim, g)
            loss = ((layer.predict(tokens) - target) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            decay.step()
            losses.append(float(loss.detach()))
    finally:
        torch.set_num_threads(threads)
    return layer.eval(), losses
