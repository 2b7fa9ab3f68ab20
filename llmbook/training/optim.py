"""Optimisers, a learning-rate schedule and gradient clipping: SGD, Adam, AdamW, cosine, clip.

Introduced in notebooks/09_optimisers. Training moves the parameters theta against the
gradient g of the loss; this module holds the update rules a language model is trained
with, written with plain tensor operations so that each line is one line of the paper:

* :class:`SGD`: stochastic gradient descent with heavy-ball momentum (Polyak, 1964,
  "Some methods of speeding up the convergence of iteration methods"), Nesterov's variant
  in the form of Sutskever et al. (2013, "On the importance of initialization and momentum
  in deep learning"), and an L2 penalty folded into the gradient;
* :class:`Adam` (Kingma & Ba, 2015, "Adam: A Method for Stochastic Optimization",
  Algorithm 1): bias-corrected moving averages of g and g^2; ``weight_decay`` adds
  lambda * theta to the gradient (an L2 penalty);
* :class:`AdamW` (Loshchilov & Hutter, 2019, "Decoupled Weight Decay Regularization",
  Algorithm 2): the same moments, with the decay applied to theta directly,
  theta <- theta - lr * lambda * theta, outside the adaptive rescaling;
* :func:`cosine_schedule`: linear warmup then cosine decay (Loshchilov & Hutter, 2017,
  "SGDR: Stochastic Gradient Descent with Warm Restarts"; the warmup as in Goyal et al.,
  2017, "Accurate, Large Minibatch SGD"), and :func:`set_lr` to apply it;
* :func:`wsd_schedule`: warmup, a stable plateau at the peak rate, then a short linear
  decay (the warmup-stable-decay schedule of Hu et al., 2024, "MiniCPM");
* :func:`clip_grad_norm_`: rescale all gradients together when their global L2 norm
  exceeds a threshold (Pascanu et al., 2013, "On the difficulty of training recurrent
  neural networks").

The optimisers are ``torch.optim.Optimizer`` subclasses: parameter groups, ``zero_grad``,
``state_dict`` and ``load_state_dict`` are PyTorch's. Their state uses PyTorch's key names
(``momentum_buffer``; ``step``, ``exp_avg``, ``exp_avg_sq``) and their arithmetic follows
``torch.optim``'s single-tensor code path operation by operation, so the two produce the
same parameters and a checkpoint moves between them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

__all__ = [
    "SGD", "Adam", "AdamW", "clip_grad_norm_", "cosine_schedule", "gradient_vector", "set_lr", "wsd_schedule",
]

Params = Iterable[Tensor] | Iterable[dict[str, Any]]


# ---------------------------------------------------------------- validation


def _check_number(
    name: str, value: object, low: float = 0.0, high: float | None = None, high_open: bool = False
) -> float:
    """A real number in [low, high] (or [low, high) when ``high_open``), else an error."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {name}={value}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {name}={value}")
    if high is not None and (value >= high if high_open else value > high):
        bracket = ")" if high_open else "]"
        raise ValueError(f"{name} must lie in [{low}, {high}{bracket}, got {name}={value}")
    return float(value)


def _check_betas(betas: object) -> tuple[float, float]:
    if not isinstance(betas, tuple | list) or len(betas) != 2:
        raise ValueError(f"betas must be a pair (beta1, beta2), got betas={betas!r}")
    return (
        _check_number("beta1", betas[0], 0.0, 1.0, high_open=True),
        _check_number("beta2", betas[1], 0.0, 1.0, high_open=True),
    )


def _check_sgd_group(group: dict[str, Any]) -> None:
    _check_number("lr", group["lr"])
    momentum = _check_number("momentum", group["momentum"])
    dampening = _check_number("dampening", group["dampening"], 0.0, 1.0)
    _check_number("weight_decay", group["weight_decay"])
    if group["nesterov"] and (momentum <= 0 or dampening != 0):
        raise ValueError(
            f"Nesterov momentum needs momentum > 0 and dampening = 0, got "
            f"momentum={momentum}, dampening={dampening}"
        )


def _check_adam_group(group: dict[str, Any]) -> None:
    _check_number("lr", group["lr"])
    _check_betas(group["betas"])
    _check_number("eps", group["eps"])
    _check_number("weight_decay", group["weight_decay"])


def _run_closure(closure: Callable[[], Tensor] | None) -> Tensor | None:
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


# ---------------------------------------------------------------- SGD


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, Nesterov momentum and an L2 penalty.

    For each parameter theta with gradient g, per step (PyTorch's conventions):

        g <- g + lambda * theta                                (weight_decay = lambda)
        b <- g at the first step, then b <- mu * b + (1 - tau) * g   (momentum mu, dampening tau)
        d <- g + mu * b if nesterov else b                     (d = g when mu = 0)
        theta <- theta - lr * d

    With tau = 0 the buffer b is a sum of past gradients with weights mu^k, so a constant
    gradient g is followed at the speed lr * g / (1 - mu): momentum multiplies the step size
    by 1 / (1 - mu) (10 for mu = 0.9). Parameters of any shape; the state per parameter is
    ``momentum_buffer`` (same shape), only when mu > 0.
    """

    def __init__(
        self,
        params: Params,
        lr: float,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "dampening": dampening,
            "weight_decay": weight_decay,
            "nesterov": bool(nesterov),
        }
        _check_sgd_group(defaults)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (PyTorch's method), then check its hyperparameters."""
        super().add_param_group(param_group)
        _check_sgd_group(self.param_groups[-1])

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """One update of every parameter that has a gradient; returns ``closure()`` if given."""
        loss = _run_closure(closure)
        for group in self.param_groups:
            lr, mu, tau = group["lr"], group["momentum"], group["dampening"]
            lam, nesterov = group["weight_decay"], group["nesterov"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                d = p.grad
                if lam != 0:
                    d = d.add(p, alpha=lam)  # gradient of L + lambda/2 |theta|^2
                if mu != 0:
                    state = self.state[p]
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = state["momentum_buffer"] = d.clone()
                    else:
                        buf.mul_(mu).add_(d, alpha=1 - tau)  # b = mu b + (1 - tau) g
                    d = d.add(buf, alpha=mu) if nesterov else buf
                p.add_(d, alpha=-lr)
        return loss


# ---------------------------------------------------------------- Adam and AdamW


class Adam(Optimizer):
    """Adam (Kingma & Ba, 2015, Algorithm 1), with weight decay as an L2 penalty.

    For each parameter theta with gradient g, at step t = 1, 2, ...:

        g     <- g + lambda * theta                 (weight_decay = lambda; AdamW differs here)
        m     <- beta1 * m + (1 - beta1) * g        (first moment, m_0 = 0)
        v     <- beta2 * v + (1 - beta2) * g^2      (second moment, v_0 = 0)
        m_hat =  m / (1 - beta1^t),   v_hat = v / (1 - beta2^t)     (bias correction)
        theta <- theta - lr * m_hat / (sqrt(v_hat) + eps)

    The bias corrections undo the pull of m_0 = v_0 = 0 toward zero: for gradients with a
    constant mean, E[m_t] = (1 - beta1^t) E[g] (derived in the notebook). As in
    ``torch.optim.Adam``, the correction of m is folded into the step size and eps is added
    to sqrt(v) / sqrt(1 - beta2^t). All operations are elementwise: theta, g, m, v share
    one shape. State per parameter: ``step`` (a float32 scalar tensor, as PyTorch keeps it),
    ``exp_avg`` = m, ``exp_avg_sq`` = v.
    """

    decoupled_weight_decay = False  # AdamW sets True

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        defaults = {
            "lr": lr,
            "betas": tuple(betas) if isinstance(betas, list) else betas,
            "eps": eps,
            "weight_decay": weight_decay,
        }
        _check_adam_group(defaults)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (PyTorch's method), then check its hyperparameters."""
        super().add_param_group(param_group)
        _check_adam_group(self.param_groups[-1])

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """One update of every parameter that has a gradient; returns ``closure()`` if given."""
        loss = _run_closure(closure)
        for group in self.param_groups:
            lr, (beta1, beta2) = group["lr"], group["betas"]
            eps, lam = group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t = state["step"].item()
                m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad
                if lam != 0:
                    if self.decoupled_weight_decay:
                        p.mul_(1 - lr * lam)  # AdamW: theta <- theta - lr lambda theta
                    else:
                        g = g.add(p, alpha=lam)  # Adam: L2 penalty in the gradient
                m.lerp_(g, 1 - beta1)  # m + (1 - beta1)(g - m) = beta1 m + (1 - beta1) g
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)  # beta2 v + (1 - beta2) g^2
                bias_correction1 = 1 - beta1**t
                bias_correction2 = 1 - beta2**t
                denom = (v.sqrt() / bias_correction2**0.5).add_(eps)  # sqrt(v_hat) + eps
                p.addcdiv_(m, denom, value=-lr / bias_correction1)  # - lr m_hat / denom
        return loss


class AdamW(Adam):
    """AdamW (Loshchilov & Hutter, 2019, Algorithm 2): Adam with decoupled weight decay.

    The moments m, v and the bias corrections are Adam's, computed from the raw gradient g;
    the decay acts on the parameters directly, before the Adam step:

        theta <- theta - lr * lambda * theta
        theta <- theta - lr * m_hat / (sqrt(v_hat) + eps)

    so every weight shrinks by the same factor (1 - lr * lambda) per step, whatever its
    gradient history. With Adam's L2 penalty the term lambda * theta is divided by
    sqrt(v_hat) + eps like the rest of the gradient, and weights with large gradients are
    decayed less. ``lr * lambda`` (not lambda alone) multiplies theta, as in
    ``torch.optim.AdamW``, so a learning-rate schedule scales the decay too. The default
    ``weight_decay`` is 1e-2, PyTorch's. Shapes and state as :class:`Adam`.
    """

    decoupled_weight_decay = True

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


# ---------------------------------------------------------------- learning-rate schedule


def _check_step_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {name}={value}")
    return value


def cosine_schedule(
    step: int, max_lr: float, min_lr: float, warmup_steps: int, total_steps: int
) -> float:
    """The learning rate at ``step`` of a linear warmup followed by a cosine decay.

    With s = step, W = warmup_steps, N = total_steps:

        lr(s) = max_lr * s / W                                              for s < W,
        lr(s) = min_lr + (max_lr - min_lr) / 2 * (1 + cos(pi (s - W) / (N - W)))  for W <= s <= N,
        lr(s) = min_lr                                                      for s > N.

    The warmup starts at **zero**: lr(0) = 0, lr(W) = max_lr, and the function is continuous
    in s (the same warmup as Hugging Face ``get_cosine_schedule_with_warmup``). The first
    update with lr(0) = 0 does not move the parameters but does fill Adam's moment
    estimates. Then the rate falls along half a cosine period to min_lr at s = N, with zero
    slope at both ends of the decay, and stays there. W = 0 means no warmup; W = N means
    warmup only (min_lr from s = N on). Steps count optimiser updates from 0.
    """
    step = _check_step_int("step", step)
    warmup_steps = _check_step_int("warmup_steps", warmup_steps)
    total_steps = _check_step_int("total_steps", total_steps)
    max_lr = _check_number("max_lr", max_lr)
    min_lr = _check_number("min_lr", min_lr)
    if warmup_steps > total_steps:
        raise ValueError(
            f"warmup_steps={warmup_steps} > total_steps={total_steps}: "
            f"a warmup longer than the schedule"
        )
    if min_lr > max_lr:
        raise ValueError(f"min_lr={min_lr} must not exceed max_lr={max_lr}")
    if step < warmup_steps:
        return max_lr * step / warmup_steps
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)  # in [0, 1)
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def wsd_schedule(
    step: int, max_lr: float, min_lr: float, warmup_steps: int, decay_steps: int, total_steps: int
) -> float:
    """The learning rate at ``step`` of warmup, a stable plateau, then a linear decay.

    With s = step, W = warmup_steps, D = decay_steps, N = total_steps and S = N - D the
    start of the decay (W <= S):

        lr(s) = max_lr * s / W                                  for s < W,
        lr(s) = max_lr                                          for W <= s < S,
        lr(s) = max_lr - (max_lr - min_lr) * (s - S) / D        for S <= s <= N,
        lr(s) = min_lr                                          for s > N.

    The warmup-stable-decay schedule of Hu et al. (2024, "MiniCPM"), who allow any
    decreasing function in the decay phase; this one is linear. Unlike the cosine, the
    plateau does not depend on N, so a run can be continued from any step of the plateau
    and decayed when wanted. Continuous: lr(0) = 0, lr(W) = lr(S) = max_lr, lr(N) = min_lr.
    """
    step = _check_step_int("step", step)
    warmup_steps = _check_step_int("warmup_steps", warmup_steps)
    decay_steps = _check_step_int("decay_steps", decay_steps)
    total_steps = _check_step_int("total_steps", total_steps)
    max_lr = _check_number("max_lr", max_lr)
    min_lr = _check_number("min_lr", min_lr)
    if warmup_steps + decay_steps > total_steps:
        raise ValueError(
            f"warmup_steps={warmup_steps} + decay_steps={decay_steps} > total_steps={total_steps}: "
            f"the phases overlap"
        )
    if min_lr > max_lr:
        raise ValueError(f"min_lr={min_lr} must not exceed max_lr={max_lr}")
    decay_start = total_steps - decay_steps
    if step < warmup_steps:
        return max_lr * step / warmup_steps
    if step < decay_start:
        return max_lr
    if step >= total_steps:
        return min_lr
    return max_lr - (max_lr - min_lr) * (step - decay_start) / decay_steps


def set_lr(optimizer: Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group of ``optimizer`` to ``lr``.

    Call it before each ``optimizer.step()`` with ``cosine_schedule(step, ...)``. Any
    ``torch.optim.Optimizer`` works (the book's and PyTorch's).
    """
    if not isinstance(optimizer, Optimizer):
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    lr = _check_number("lr", lr)
    for group in optimizer.param_groups:
        group["lr"] = lr


# ---------------------------------------------------------------- gradient clipping


def gradient_vector(model_or_params: nn.Module | Iterable[Tensor]) -> Tensor:
    """Every parameter's ``.grad`` flattened and joined into one vector, shape ``(P,)``.

    Takes a module (its ``parameters()``, in registration order) or an iterable of
    tensors; parameters without a gradient (``.grad is None``: frozen, or unused by the
    last backward) are skipped, so the vector is the gradient of what was trained. Raises
    ``ValueError`` when no parameter has a gradient.
    """
    params = model_or_params.parameters() if isinstance(model_or_params, nn.Module) else model_or_params
    grads = []
    for p in params:
        if not isinstance(p, Tensor):
            raise TypeError(f"model_or_params must be an nn.Module or tensors, found {type(p).__name__}")
        if p.grad is not None:
            grads.append(p.grad.reshape(-1))
    if not grads:
        raise ValueError("no parameter has a gradient: call backward() first")
    return torch.cat(grads)


@torch.no_grad()
def clip_grad_norm_(
    parameters: Tensor | Iterable[Tensor],
    max_norm: float,
    eps: float = 1e-6,
    error_if_nonfinite: bool = False,
) -> Tensor:
    """Rescale gradients in place so that their global L2 norm is at most about ``max_norm``.

    The global norm treats all gradients as one long vector,
    ||g|| = sqrt(sum_p ||g_p||^2) (parameters whose ``.grad`` is None are skipped). Every
    gradient is multiplied by min(1, max_norm / (||g|| + eps)): nothing changes when
    ||g|| <= max_norm, otherwise the direction is kept and the norm becomes
    max_norm * ||g|| / (||g|| + eps), just under max_norm. Returns ||g|| before clipping
    as a scalar tensor (0 when no parameter has a gradient), as
    ``torch.nn.utils.clip_grad_norm_`` does.

    A non-finite norm (a NaN or inf gradient) raises ``RuntimeError`` when
    ``error_if_nonfinite``; otherwise, like PyTorch's default, the gradients are multiplied
    by the non-finite factor and become NaN, which a training loop can detect and skip.
    """
    max_norm = _check_number("max_norm", max_norm)
    eps = _check_number("eps", eps)
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    norms = torch.stack([torch.linalg.vector_norm(g) for g in grads])  # (number of tensors,)
    total_norm = torch.linalg.vector_norm(norms)  # () the norm of all gradients together
    if error_if_nonfinite and not torch.isfinite(total_norm):
        raise RuntimeError(
            f"the total gradient norm is {total_norm.item()}, so it cannot be "
            f"clipped; pass error_if_nonfinite=False to scale by it anyway"
        )
    scale = torch.clamp(max_norm / (total_norm + eps), max=1.0)  # () in [0, 1]
    for g in grads:
        g.mul_(scale)
    return total_norm
