"""Optimisers practitioners use now: Muon, Adafactor and Lion.

Introduced in notebooks/09_optimisers (section "Optimisers practitioners use now"); the
classic ones (SGD, Adam, AdamW) and the schedules are in :mod:`llmbook.training.optim`.

* :func:`newton_schulz` and :class:`Muon` (Jordan et al., 2024, "Muon: An optimizer for
  hidden layers in neural networks"): momentum on a weight matrix, then the momentum is
  replaced by an approximately orthogonal matrix with the same singular vectors, found by
  a quintic Newton–Schulz iteration. Follows ``torch.optim.Muon`` operation by operation
  (its defaults: lr 1e-3, weight_decay 0.1, momentum 0.95, Nesterov, 5 steps of the
  coefficients (3.4445, -4.7750, 2.0315) in bfloat16, the learning rate scaled by
  sqrt(max(1, rows / columns))).
* :class:`Adafactor` (Shazeer & Stern, 2018, "Adafactor: Adaptive Learning Rates with
  Sublinear Memory Cost"; factored second moments, relative steps, update clipping): the second moment of an
  (n, m) matrix is stored as n row and m column averages, the step is relative to the
  weight's RMS. Follows ``torch.optim.Adafactor`` (no first moment, beta2_t = 1 - t^-0.8,
  relative step min(lr, 1/sqrt(t)), eps1 the dtype's machine epsilon squared as a floor
  on the variance estimate, eps2 = 1e-3, decoupled weight decay).
* :class:`Lion` (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms"):
  the sign of an interpolation between the momentum and the gradient; one
  state tensor per parameter (Adam keeps two).

Two harnesses compare optimisers: :func:`race_with_peer` runs one of these and its
PyTorch counterpart on the same random gradients and reports how far apart they end;
:func:`least_squares_run` trains a matrix least-squares problem under the WSD schedule
(:func:`~llmbook.training.optim.wsd_schedule`) and returns the loss curve.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from llmbook.training.optim import (
    Params,
    _check_betas,
    _check_number,
    _run_closure,
    set_lr,
    wsd_schedule,
)

__all__ = ["MUON_COEFFICIENTS", "Adafactor", "Lion", "Muon", "PeerRace", "least_squares_run", "newton_schulz",
           "race_with_peer"]

#: The quintic's coefficients (a, b, c) of Jordan et al. (2024), torch.optim.Muon's default.
MUON_COEFFICIENTS: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)


# ---------------------------------------------------------------- Muon


def newton_schulz(
    matrix: Tensor,
    steps: int = 5,
    coefficients: tuple[float, float, float] = MUON_COEFFICIENTS,
    eps: float = 1e-7,
    dtype: torch.dtype = torch.bfloat16,
) -> Tensor:
    """Newton–Schulz orthogonalisation of a matrix, shape (n, m) -> (n, m), in ``dtype``.

    X <- G / max(||G||_F, eps) (transposed first when n > m, so that X X^T is the smaller
    Gram matrix), then ``steps`` times X <- a X + (b A + c A^2) X with A = X X^T. If
    G = U diag(s) V^T, every step maps each singular value x to p(x) = a x + b x^3 + c x^5
    and keeps U and V, so the result is U diag(p^k(s / ||G||_F)) V^T. With the cubic
    (1.5, -0.5, 0) p^k(x) -> 1 for x in (0, sqrt(3)) and the result tends to U V^T; the
    quintic of Jordan et al. (2024) grows small singular values faster and leaves them
    scattered around 1 (between about 0.5 and 1.5 by their account). The operations are torch.optim.Muon's (so bfloat16 gives its exact
    numbers); ``dtype=torch.float64`` gives the polynomial to rounding.
    """
    if not isinstance(matrix, Tensor) or matrix.ndim != 2:
        raise ValueError(f"matrix must be a 2-D tensor, got {getattr(matrix, 'shape', type(matrix).__name__)}")
    if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps < 100:
        raise ValueError(f"steps must be an int in [0, 100), got steps={steps!r}")
    if not isinstance(coefficients, tuple | list) or len(coefficients) != 3:
        raise ValueError(f"coefficients must be three numbers (a, b, c), got {coefficients!r}")
    a, b, c = (_check_number(n, v, low=-math.inf) for n, v in zip("abc", coefficients, strict=True))
    eps = _check_number("eps", eps)
    x = matrix.to(dtype)
    tall = matrix.size(0) > matrix.size(1)
    if tall:
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T  # (small, small)
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)  # b A + c A^2
        x = torch.addmm(x, poly, x, beta=a)  # a X + (b A + c A^2) X
    return x.T if tall else x


def _muon_lr_ratio(adjust_lr_fn: str | None, shape: torch.Size) -> float:
    rows, cols = shape[0], shape[1]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return math.sqrt(max(1, rows / cols))
    return 0.2 * math.sqrt(max(rows, cols))  # "match_rms_adamw" (Liu et al., 2025)


def _check_muon_group(group: dict[str, Any]) -> None:
    _check_number("lr", group["lr"])
    _check_number("weight_decay", group["weight_decay"])
    _check_number("momentum", group["momentum"], 0.0, 1.0, high_open=True)
    if group["adjust_lr_fn"] not in (None, "original", "match_rms_adamw"):
        raise ValueError(
            f"adjust_lr_fn must be None, 'original' or 'match_rms_adamw', got {group['adjust_lr_fn']!r}"
        )
    for p in group["params"]:
        if p.ndim != 2:
            raise ValueError(f"Muon takes 2-D parameters (weight matrices) only, got shape {tuple(p.shape)}")


class Muon(Optimizer):
    """Muon (Jordan et al., 2024): orthogonalised momentum for 2-D weights (n, m).

    Per step, for a weight W with gradient G (torch.optim.Muon's arithmetic):

        B <- mu B + (1 - mu) G                          (B_0 = 0)
        M <- (1 - mu) G + mu B if nesterov else B
        O <- newton_schulz(M)                           (about U V^T of M = U S V^T)
        W <- (1 - lr lambda) W - lr r O,    r = sqrt(max(1, n / m))

    torch's docstring writes the buffer as a sum, B <- mu B + G, and the Nesterov input as
    G + mu B; its code (followed here) keeps the average, (1 - mu) times that sum, so the
    input M is (1 - mu) times the docstring's. Newton-Schulz divides M by its norm first, so
    the two give the same update but for the eps in that division.

    Every singular direction of the momentum moves by about the same amount, however small
    its singular value: the update's spectral norm is about lr r whatever the gradient's
    size. Only for matrices; embeddings, gains and biases go to AdamW (Jordan et al.).
    ``ns_dtype`` is the iteration's float type (bfloat16 as in torch; float64 for exact
    arithmetic). State per parameter: ``momentum_buffer`` (n, m).
    """

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = MUON_COEFFICIENTS,
        eps: float = 1e-7,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
        ns_dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        defaults = {
            "lr": lr, "weight_decay": weight_decay, "momentum": momentum, "nesterov": bool(nesterov),
            "ns_coefficients": tuple(ns_coefficients), "eps": eps, "ns_steps": ns_steps,
            "adjust_lr_fn": adjust_lr_fn, "ns_dtype": ns_dtype,
        }
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (PyTorch's method), then check its hyperparameters and shapes."""
        super().add_param_group(param_group)
        _check_muon_group(self.param_groups[-1])

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """One update of every parameter that has a gradient; returns ``closure()`` if given."""
        loss = _run_closure(closure)
        for group in self.param_groups:
            lr, lam, mu = group["lr"], group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - mu)  # mu B + (1 - mu) G
                update = p.grad.lerp(buf, mu) if group["nesterov"] else buf
                update = newton_schulz(update, group["ns_steps"], group["ns_coefficients"],
                                       group["eps"], group["ns_dtype"])
                p.mul_(1 - lr * lam)
                p.add_(update, alpha=-lr * _muon_lr_ratio(group["adjust_lr_fn"], p.shape))
        return loss


# ---------------------------------------------------------------- Adafactor


def _check_adafactor_group(group: dict[str, Any]) -> None:
    _check_number("lr", group["lr"])
    _check_number("beta2_decay", group["beta2_decay"], low=-math.inf, high=0.0)
    eps = group["eps"]
    if not isinstance(eps, tuple | list) or len(eps) != 2:
        raise ValueError(f"eps must be a pair (eps1 or None, eps2), got eps={eps!r}")
    if eps[0] is not None:
        _check_number("eps1", eps[0])
    _check_number("eps2", eps[1])
    _check_number("d", group["d"], low=1.0)
    _check_number("weight_decay", group["weight_decay"])


class Adafactor(Optimizer):
    """Adafactor (Shazeer & Stern, 2018) as torch.optim.Adafactor computes it.

    For a parameter X (shape (..., n, m)) with gradient G at step t = 1, 2, ...:

        beta2_t = 1 - t^beta2_decay           (beta2_decay = -0.8)
        rho_t = min(lr, 1 / sqrt(t)),  alpha_t = max(eps2, RMS(X)) rho_t
        X <- (1 - lr lambda) X                 (decoupled weight decay, PyTorch's addition)
        R <- lerp(R, mean_cols(G^2), 1 - beta2_t)    (..., n, 1)
        C <- lerp(C, mean_rows(G^2), 1 - beta2_t)    (..., 1, m)
        V = R C / mean(R)                      (rank-one estimate of E[G^2])
        U = G / sqrt(max(V, eps1^2)),  X <- X - alpha_t U / max(1, RMS(U) / d)

    A vector keeps the full V (lerp of G^2). State per parameter: ``step``, then ``row_var``
    and ``col_var`` (n + m numbers per matrix instead of Adam's 2 n m) or ``variance``.
    Differences from the paper: eps1 (None = the dtype's machine epsilon) is a
    floor on V, not 1e-30 added to G^2; the paper has no weight decay; no first moment
    (beta1 = 0, as the paper recommends).
    """

    def __init__(
        self,
        params: Params,
        lr: float = 1e-2,
        beta2_decay: float = -0.8,
        eps: tuple[float | None, float] = (None, 1e-3),
        d: float = 1.0,
        weight_decay: float = 0.0,
    ) -> None:
        defaults = {"lr": lr, "beta2_decay": beta2_decay, "eps": tuple(eps) if isinstance(eps, list) else eps,
                    "d": d, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (PyTorch's method), then check its hyperparameters."""
        super().add_param_group(param_group)
        _check_adafactor_group(self.param_groups[-1])

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """One update of every parameter that has a gradient; returns ``closure()`` if given."""
        loss = _run_closure(closure)
        for group in self.param_groups:
            lr, lam, d = group["lr"], group["weight_decay"], group["d"]
            eps1, eps2 = group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g, state = p.grad, self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    if g.dim() > 1:
                        state["row_var"] = g.new_zeros((*g.shape[:-1], 1))
                        state["col_var"] = g.new_zeros((*g.shape[:-2], 1, g.shape[-1]))
                    else:
                        state["variance"] = torch.zeros_like(g, memory_format=torch.preserve_format)
                e1 = torch.finfo(p.dtype).eps if eps1 is None else eps1
                state["step"] += 1
                t = state["step"].item()
                one_minus_beta2 = t ** group["beta2_decay"]
                alpha = max(eps2, p.norm(2).item() / (p.numel() ** 0.5)) * min(lr, 1 / (t**0.5))
                if lam != 0:
                    p.mul_(1 - lr * lam)
                if g.dim() > 1:
                    row, col = state["row_var"], state["col_var"]
                    row.lerp_(torch.norm(g, dim=-1, keepdim=True).square_().div_(g.size(-1)), one_minus_beta2)
                    col.lerp_(torch.norm(g, dim=-2, keepdim=True).square_().div_(g.size(-2)), one_minus_beta2)
                    v_hat = row @ col  # (..., n, m)
                    v_hat.div_(row.mean(dim=-2, keepdim=True).clamp_(min=e1))
                else:
                    state["variance"].lerp_(g * g, one_minus_beta2)
                    v_hat = state["variance"].clone()
                update = v_hat.clamp_(min=e1 * e1).rsqrt_().mul_(g)
                denom = max(1.0, update.norm(2).item() / ((update.numel() ** 0.5) * d))  # update clipping
                p.add_(update, alpha=-alpha / denom)
        return loss


# ---------------------------------------------------------------- Lion


def _check_lion_group(group: dict[str, Any]) -> None:
    _check_number("lr", group["lr"])
    _check_betas(group["betas"])
    _check_number("weight_decay", group["weight_decay"])


class Lion(Optimizer):
    """Lion (Chen et al., 2023): the sign of an interpolated momentum.

    For a parameter theta with gradient g (any shape), per step:

        c     = beta1 m + (1 - beta1) g
        theta <- theta (1 - lr lambda) - lr sign(c)
        m     <- beta2 m + (1 - beta2) g          (m_0 = 0)

    Every coordinate moves by exactly lr (0 where c = 0) plus the decay, so the update's
    RMS is lr: Chen et al. use a learning rate 3-10 times smaller than AdamW's and a
    weight decay as much larger. Defaults are theirs: lr 1e-4, betas (0.9, 0.99). State per
    parameter: ``exp_avg`` = m only (Adam keeps m and v).
    """

    def __init__(
        self,
        params: Params,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
    ) -> None:
        defaults = {"lr": lr, "betas": tuple(betas) if isinstance(betas, list) else betas,
                    "weight_decay": weight_decay}
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (PyTorch's method), then check its hyperparameters."""
        super().add_param_group(param_group)
        _check_lion_group(self.param_groups[-1])

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """One update of every parameter that has a gradient; returns ``closure()`` if given."""
        loss = _run_closure(closure)
        for group in self.param_groups:
            lr, (beta1, beta2), lam = group["lr"], group["betas"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                m = state["exp_avg"]
                direction = m.lerp(p.grad, 1 - beta1).sign_()  # sign(beta1 m + (1 - beta1) g)
                p.mul_(1 - lr * lam).add_(direction, alpha=-lr)
                m.lerp_(p.grad, 1 - beta2)
        return loss


# ---------------------------------------------------------------- comparing optimisers


class PeerRace(NamedTuple):
    """The result of :func:`race_with_peer`."""

    max_abs_diff: float  # max |theta_ours - theta_ref| over all parameters after the run
    optimizer: Optimizer  # ours, with its state after the run
    params: list[nn.Parameter]  # ours, after the run
    max_move: float  # max |theta_ours - theta_0|: how far the run moved (0 means it tested nothing)


def _check_make(name: str, make: object) -> Callable[..., Optimizer]:
    if not callable(make):
        raise TypeError(f"{name} must be a callable that returns an optimizer, got {type(make).__name__}")
    return make


def _check_float_dtype(dtype: object) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    return dtype


def race_with_peer(
    make_ours: Callable[[list[nn.Parameter]], Optimizer],
    make_ref: Callable[[list[nn.Parameter]], Optimizer],
    shapes: Sequence[Sequence[int]],
    steps: int = 20,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> PeerRace:
    """Run two optimisers side by side on the same gradients; how far apart do they end?

    Introduced in notebooks/09_optimisers (section "Optimisers practitioners use now"),
    where it checks :class:`Muon` and :class:`Adafactor` against ``torch.optim.Muon`` and
    ``torch.optim.Adafactor``. One generator (``seed``) draws the start, a tensor of each
    shape in ``shapes`` (e.g. ``[(7, 12), (12, 5)]``: non-square on purpose), and then, at
    each of ``steps`` steps, for each parameter in turn, a gradient
    g = noise + theta_ours (noise ~ N(0, 1), shape of the parameter), given to both
    optimisers. ``make_ours`` and ``make_ref`` build the optimisers from a list of
    parameters. Returns a :class:`PeerRace`: the largest absolute difference of the
    parameters at the end (0.0 when the two follow the same arithmetic), our optimizer and
    parameters (to inspect their state), and the largest distance our parameters moved.
    """
    make_ours = _check_make("make_ours", make_ours)
    make_ref = _check_make("make_ref", make_ref)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got steps={steps!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    dtype = _check_float_dtype(dtype)
    if isinstance(shapes, str) or not isinstance(shapes, Sequence) or not shapes or not all(
            isinstance(s, Sequence) and len(s) >= 1 and all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in s) for s in shapes):
        raise ValueError(f"shapes must be a non-empty list of shapes of positive ints, got {shapes!r}")
    gen = torch.Generator().manual_seed(seed)
    start = [torch.randn(*s, dtype=dtype, generator=gen) for s in shapes]
    ours = [nn.Parameter(w.clone()) for w in start]
    ref = [nn.Parameter(w.clone()) for w in start]
    opt_ours, opt_ref = make_ours(ours), make_ref(ref)
    for _ in range(steps):
        for p, q in zip(ours, ref, strict=True):
            p.grad = torch.randn(p.shape, dtype=dtype, generator=gen) + p.detach()  # noise + theta
            q.grad = p.grad.clone()
        opt_ours.step()
        opt_ref.step()
    diff = max((p - q).abs().max().item() for p, q in zip(ours, ref, strict=True))
    moved = max((p - w).abs().max().item() for p, w in zip(ours, start, strict=True))
    return PeerRace(diff, opt_ours, ours, moved)


def least_squares_run(
    make: Callable[[list[nn.Parameter], float], Optimizer],
    lr: float,
    inputs: Tensor,
    targets: Tensor,
    start: Tensor,
    steps: int,
    warmup_steps: int = 20,
    decay_steps: int = 60,
    min_lr: float | None = None,
) -> Tensor:
    """Train W on L(W) = ||W X - Y||_F^2 / (2N) with an optimizer and the WSD schedule.

    Introduced in notebooks/09_optimisers (section "Optimisers practitioners use now"), where
    AdamW, Muon, Adafactor and Lion race on one badly scaled problem. ``inputs`` X is
    (d_in, N), ``targets`` Y is (d_out, N), ``start`` W_0 is (d_out, d_in). ``make(params, lr)``
    builds the optimizer; before step s its rate is set to
    ``wsd_schedule(s, lr, min_lr, warmup_steps, decay_steps, steps)``, with ``min_lr = lr / 10``
    unless given. The gradient
    is written out, (W X - Y) X^T / N, so no autograd graph is built. Returns the loss
    *before* each step, a float64 tensor of shape (steps,) (entry 0 is L(W_0)).
    """
    make = _check_make("make", make)
    lr = _check_number("lr", lr)
    min_lr = lr / 10 if min_lr is None else _check_number("min_lr", min_lr)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got steps={steps!r}")
    for name, t in (("inputs", inputs), ("targets", targets), ("start", start)):
        if not isinstance(t, Tensor) or t.ndim != 2 or not t.is_floating_point():
            raise ValueError(f"{name} must be a 2-D floating-point tensor, got "
                             f"{tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}")
    if targets.shape[1] != inputs.shape[1] or start.shape != (targets.shape[0], inputs.shape[0]):
        raise ValueError(f"inputs (d_in, N), targets (d_out, N) and start (d_out, d_in) do not fit: got "
                         f"{tuple(inputs.shape)}, {tuple(targets.shape)} and {tuple(start.shape)}")
    w = nn.Parameter(start.clone())
    opt = make([w], lr)
    n = inputs.shape[1]
    losses = torch.empty(steps, dtype=torch.float64)
    for step in range(steps):
        set_lr(opt, wsd_schedule(step, lr, min_lr, warmup_steps, decay_steps, steps))
        residual = w.detach() @ inputs - targets  # (d_out, N)
        w.grad = residual @ inputs.T / n  # (d_out, d_in): the gradient of the loss, by hand
        opt.step()
        losses[step] = 0.5 * residual.square().sum().item() / n
    return losses
