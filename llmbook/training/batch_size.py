"""Batch size: gradient accumulation, the gradient noise scale, the steps–examples trade-off.

Introduced in notebooks/10b_batch_size. A step of size B averages B per-example gradients;
how large B should be is a question about the *noise* in that average. The pieces:

* :func:`accumulate_gradients` / :func:`accumulated_train_step`: the gradient of a large
  batch computed as the sum of the gradients of K micro-batches. With padding (targets
  equal to ``ignore_index``) the micro-batches hold different numbers of tokens n_k, and
  the loss of the whole batch, sum of token losses / N with N = sum_k n_k, is
  sum_k (n_k / N) mean_k: each micro-batch mean weighted by its share of the tokens. The
  naive (1/K) sum_k mean_k weights a short micro-batch as much as a long one and is a
  different (wrong) objective unless all n_k are equal;
* :func:`global_batch_size`: B_eff = B_micro x accumulation x data-parallel degree; tensor
  and pipeline parallel ranks share one batch, so they do not multiply it;
* :func:`noise_scale` (exact, from G, Sigma and optionally the Hessian H) and the
  estimators of McCandlish et al. (2018, "An Empirical Model of Large-Batch Training",
  arXiv:1812.06162): E|G_B|^2 = |G|^2 + tr(Sigma)/B, so two batch sizes give unbiased
  estimates of |G|^2 and tr(Sigma) (:func:`unbiased_noise_estimates`, their Appendix A)
  and of B_simple = tr(Sigma)/|G|^2 (their section 2); :func:`microbatch_noise_estimate`
  applies them to K micro-batch gradients of one step;
* :func:`linear_regression_gradient_moments`: a problem whose G and Sigma are known in
  closed form, to test the estimators on;
* :func:`steps_to_target` and :func:`fit_steps_examples_tradeoff`: steps S and examples
  E = B S to reach a target loss, and the fit of (S/S_min - 1)(E/E_min - 1) = 1
  (McCandlish et al., 2018), which is the straight line S = S_min + E_min / B in 1/B;
* :class:`BatchSizeExperiment`: the chapter's measured runs, a tiny GPT-2-style
  ``TransformerLM`` trained with the book's AdamW on an order-1 Markov source of known
  entropy rate (:meth:`~BatchSizeExperiment.experiment_data`,
  :meth:`~BatchSizeExperiment.train_run`, :meth:`~BatchSizeExperiment.noise_point`).
  ``data/make_batch_size.py`` drives it; the notebook re-runs a piece of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from llmbook.text.data import MarkovSource
from llmbook.text.functional import cross_entropy
from llmbook.training.optim import AdamW, clip_grad_norm_, cosine_schedule, gradient_vector, set_lr
from llmbook.training.train import get_batch, param_groups, train_step
from llmbook.transformer.model import TransformerConfig, TransformerLM
from llmbook.validation import (
    check_array,
    check_nonnegative_number,
    check_positive_int,
    check_positive_number,
)

__all__ = [
    "BatchSizeExperiment",
    "ExperimentData",
    "NoiseEstimate",
    "TradeoffFit",
    "accumulate_gradients",
    "accumulated_train_step",
    "fit_steps_examples_tradeoff",
    "global_batch_size",
    "linear_regression_gradient_moments",
    "microbatch_noise_estimate",
    "noise_scale",
    "steps_to_target",
    "unbiased_noise_estimates",
]

WEIGHTINGS = ("tokens", "naive")


# ---------------------------------------------------------------- accumulation


def _check_micro_batches(micro_batches: object) -> list[tuple[Tensor, Tensor]]:
    if not isinstance(micro_batches, Sequence) or isinstance(micro_batches, str | bytes):
        raise TypeError(f"micro_batches must be a sequence of (x, y) pairs, got "
                        f"{type(micro_batches).__name__}")
    if len(micro_batches) == 0:
        raise ValueError("micro_batches must hold at least one (x, y) pair, got none")
    out = []
    for k, pair in enumerate(micro_batches):
        if not isinstance(pair, tuple | list) or len(pair) != 2 or \
                not all(isinstance(t, Tensor) for t in pair):
            raise TypeError(f"micro_batches[{k}] must be an (x, y) pair of tensors, got {pair!r}")
        x, y = pair
        if x.shape != y.shape or x.ndim != 2:
            raise ValueError(f"micro_batches[{k}]: x and y must both be (B_k, T), got "
                             f"{tuple(x.shape)} and {tuple(y.shape)}")
        out.append((x, y))
    return out


def accumulate_gradients(model: nn.Module, micro_batches: Sequence[tuple[Tensor, Tensor]],
                         weighting: str = "tokens", ignore_index: int = -100) -> Tensor:
    """Zero the gradients, then accumulate those of a batch split into micro-batches.

    ``micro_batches`` is a list of ``(x, y)``, each ``(B_k, T)`` (the B_k may differ);
    targets equal to ``ignore_index`` (padding) carry no loss. With n_k counted targets
    in micro-batch k and N = sum_k n_k:

    * ``weighting="tokens"`` (right): backward of (sum of token losses of k) / N per
      micro-batch, so the accumulated gradient is that of the whole batch's mean token
      loss, sum_k (n_k / N) mean_k;
    * ``weighting="naive"``: backward of mean_k / K, the mean of micro-batch means, which
      equals the former only when all n_k are equal.

    Only one micro-batch's activations are alive at a time: that is the point of
    accumulation. Returns the weighted loss (a detached scalar) whose gradient is now in
    ``.grad``. Introduced in notebooks/10b_batch_size.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {list(WEIGHTINGS)}, got {weighting!r}")
    pairs = _check_micro_batches(micro_batches)
    counts = [int((y != ignore_index).sum()) for _, y in pairs]  # n_k, known before any forward
    if any(n == 0 for n in counts):
        raise ValueError(f"every micro-batch needs a counted target; target counts per "
                         f"micro-batch: {counts}")
    total = sum(counts)  # N
    model.zero_grad(set_to_none=True)
    loss_value = torch.zeros(())
    for (x, y), n in zip(pairs, counts, strict=True):
        token_losses = cross_entropy(model(x), y, ignore_index=ignore_index, reduction="sum")
        part = token_losses / total if weighting == "tokens" else token_losses / n / len(pairs)
        part.backward()
        loss_value = loss_value + part.detach()  # in the model's dtype
    return loss_value


def accumulated_train_step(model: nn.Module, optimizer: Optimizer,
                           micro_batches: Sequence[tuple[Tensor, Tensor]], lr: float,
                           grad_clip: float | None = None, weighting: str = "tokens",
                           ignore_index: int = -100) -> tuple[Tensor, Tensor | None]:
    """One optimiser update from accumulated micro-batch gradients; returns (loss, norm).

    :func:`accumulate_gradients`, then clipping of the global norm (chapter 9) and the
    step, as :func:`llmbook.training.train.train_step` does for one batch: with the
    micro-batches of a batch and ``weighting="tokens"`` the update is that of the batch.
    """
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    set_lr(optimizer, lr)
    loss = accumulate_gradients(model, micro_batches, weighting, ignore_index)
    norm = clip_grad_norm_(model.parameters(), grad_clip) if grad_clip is not None else None
    optimizer.step()
    return loss, norm


def global_batch_size(micro_batch_size: int, accumulation_steps: int, world_size: int,
                      tensor_parallel: int = 1, pipeline_parallel: int = 1) -> int:
    """Sequences per optimiser step: B_micro x accumulation x data-parallel degree.

    The ``world_size`` devices form a grid dp x tp x pp; the tp ranks of a tensor-parallel
    group hold slices of the same layers and the pp ranks of a pipeline hold successive
    layers of the same model, so each of those groups processes *one* stream of
    micro-batches. Only the dp = world_size / (tp x pp) replicas see different data.
    (In a pipeline the accumulation steps are its micro-batches.)
    """
    micro = check_positive_int("micro_batch_size", micro_batch_size)
    accum = check_positive_int("accumulation_steps", accumulation_steps)
    world = check_positive_int("world_size", world_size)
    tp = check_positive_int("tensor_parallel", tensor_parallel)
    pp = check_positive_int("pipeline_parallel", pipeline_parallel)
    if world % (tp * pp):
        raise ValueError(f"world_size={world} is not a multiple of tensor_parallel x "
                         f"pipeline_parallel = {tp} x {pp}")
    return micro * accum * (world // (tp * pp))


# ---------------------------------------------------------------- the noise scale


def noise_scale(G: object, Sigma: object, H: object | None = None) -> float:
    """B_noise = tr(H Sigma) / (G^T H G), or B_simple = tr(Sigma) / |G|^2 when ``H`` is None.

    ``G`` is the true gradient, ``(P,)``; ``Sigma`` the covariance of one example's
    gradient, ``(P, P)``; ``H`` the Hessian, ``(P, P)``. McCandlish et al. (2018), section 2:
    the batch size at which the optimal step reaches half its noise-free size.
    With H = h I the two are equal.
    """
    g = check_array("G", G, 1)
    s = check_array("Sigma", Sigma, 2)
    if s.shape != (g.size, g.size):
        raise ValueError(f"Sigma must be ({g.size}, {g.size}) for G of shape {g.shape}, "
                         f"got {s.shape}")
    if H is None:
        num, den = float(np.trace(s)), float(g @ g)
    else:
        h = check_array("H", H, 2)
        if h.shape != s.shape:
            raise ValueError(f"H must be {s.shape}, got {h.shape}")
        num, den = float(np.trace(h @ s)), float(g @ h @ g)
    if den <= 0:
        raise ValueError(f"the noise scale needs G^T H G > 0, got {den}")
    return num / den


def unbiased_noise_estimates(norm_sq_small: float, norm_sq_big: float, b_small: float,
                             b_big: float) -> tuple[float, float]:
    """Unbiased estimates (|G|^2, tr Sigma) from squared gradient norms at two batch sizes.

    Since E|G_B|^2 = |G|^2 + tr(Sigma) / B (independent examples), solving the two
    equations for B_small < B_big gives (McCandlish et al., 2018, Appendix A)

        |G|^2   ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
        tr Sigma ~ (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)

    each unbiased because it is linear in the squared norms. Either can come out negative
    on one sample; average many before taking the ratio.
    """
    b_small = check_positive_number("b_small", b_small)
    b_big = check_positive_number("b_big", b_big)
    if not b_big > b_small:
        raise ValueError(f"b_big must exceed b_small, got b_small={b_small}, b_big={b_big}")
    for name, v in (("norm_sq_small", norm_sq_small), ("norm_sq_big", norm_sq_big)):
        if isinstance(v, bool) or not isinstance(v, int | float | np.floating) or \
                not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {name}={v!r}")
    g_sq = (b_big * norm_sq_big - b_small * norm_sq_small) / (b_big - b_small)
    trace = (norm_sq_small - norm_sq_big) / (1 / b_small - 1 / b_big)
    return float(g_sq), float(trace)


@dataclass(frozen=True)
class NoiseEstimate:
    """|G|^2 and tr(Sigma) estimated at one point, and their ratio B_simple (in examples)."""

    grad_sq: float
    trace_sigma: float

    @property
    def b_simple(self) -> float:
        return self.trace_sigma / self.grad_sq


def microbatch_noise_estimate(grads: Tensor | np.ndarray, micro_batch_size: int) -> NoiseEstimate:
    """Estimate |G|^2 and tr(Sigma) from the gradients of K micro-batches at one point.

    ``grads`` is ``(K, P)``: row k is the mean gradient of micro-batch k, of
    ``micro_batch_size`` = b independent examples. Then B_small = b with |G_small|^2 the
    mean of the K squared norms, and B_big = K b with |G_big|^2 the squared norm of the
    mean row (the accumulated gradient): :func:`unbiased_noise_estimates`. The tr(Sigma)
    estimate equals b times the trace of the rows' unbiased sample covariance.
    """
    g = check_array("grads", grads, 2)
    k = g.shape[0]
    if k < 2:
        raise ValueError(f"grads needs at least 2 micro-batch gradients (rows), got {k}")
    b = check_positive_int("micro_batch_size", micro_batch_size)
    small = float(np.mean(np.sum(g * g, axis=1)))
    mean = g.mean(axis=0)  # (P,)
    big = float(mean @ mean)
    return NoiseEstimate(*unbiased_noise_estimates(small, big, b, k * b))


def linear_regression_gradient_moments(w: object, w_star: object,
                                       noise_std: float) -> tuple[np.ndarray, np.ndarray]:
    """True gradient G ``(P,)`` and per-example covariance Sigma ``(P, P)`` of a regression.

    Examples x ~ N(0, I_P), y = x . w_star + e with e ~ N(0, noise_std^2); loss
    l(w) = (x . w - y)^2 / 2, gradient x (x . d - e) with d = w - w_star. Gaussian fourth
    moments, E[x x^T A x x^T] = A + A^T + tr(A) I, give
    G = d and Sigma = d d^T + (|d|^2 + noise_std^2) I, so tr Sigma = (P + 1)|d|^2 + P sigma^2.
    The Hessian is I, so B_noise = B_simple here.
    """
    w_arr, ws = check_array("w", w, 1), check_array("w_star", w_star, 1)
    if w_arr.shape != ws.shape:
        raise ValueError(f"w and w_star must have the same shape, got {w_arr.shape} and {ws.shape}")
    if isinstance(noise_std, bool) or not isinstance(noise_std, int | float) or \
            not math.isfinite(noise_std) or noise_std < 0:
        raise ValueError(f"noise_std must be a finite number >= 0, got noise_std={noise_std!r}")
    d = w_arr - ws
    sigma = np.outer(d, d) + (d @ d + noise_std**2) * np.eye(d.size)
    return d, sigma


# ---------------------------------------------------------------- steps and examples


def steps_to_target(steps: object, losses: object, target: float) -> float:
    """The first step at which a loss curve reaches ``target``, interpolated; inf if never.

    ``steps`` increasing ``(n,)`` and ``losses`` ``(n,)`` (evaluations of the loss after
    those steps). Between the last point above the target and the first at or below it
    the crossing is found by linear interpolation in log(step) (the points are usually
    spaced geometrically), or linearly if the earlier step is 0.
    """
    s, lo = check_array("steps", steps, 1), check_array("losses", losses, 1)
    if s.shape != lo.shape or s.size == 0:
        raise ValueError(f"steps and losses must be non-empty and of one shape, got "
                         f"{s.shape} and {lo.shape}")
    if np.any(np.diff(s) <= 0) or s[0] < 0:
        raise ValueError("steps must be >= 0 and strictly increasing")
    if isinstance(target, bool) or not isinstance(target, int | float) or not math.isfinite(target):
        raise ValueError(f"target must be a finite number, got target={target!r}")
    below = np.nonzero(lo <= target)[0]
    if below.size == 0:
        return math.inf
    i = int(below[0])
    if i == 0:
        return float(s[0])
    s0, s1, l0, l1 = s[i - 1], s[i], lo[i - 1], lo[i]
    frac = (l0 - target) / (l0 - l1)  # in (0, 1]
    if frac == 1:
        return float(s1)
    if s0 == 0:
        return float(s0 + frac * (s1 - s0))
    return float(math.exp(math.log(s0) + frac * (math.log(s1) - math.log(s0))))


@dataclass(frozen=True)
class TradeoffFit:
    """S_min and E_min of (S/S_min - 1)(E/E_min - 1) = 1, and B_crit = E_min / S_min."""

    s_min: float
    e_min: float
    relative_rms: float

    @property
    def b_crit(self) -> float:
        return self.e_min / self.s_min

    def steps(self, batch_size: object) -> np.ndarray:
        """S(B) = S_min (1 + B_crit / B) = S_min + E_min / B."""
        return self.s_min + self.e_min / np.asarray(batch_size, dtype=np.float64)

    def examples(self, batch_size: object) -> np.ndarray:
        """E(B) = B S(B) = E_min (1 + B / B_crit)."""
        return np.asarray(batch_size, dtype=np.float64) * self.steps(batch_size)


def fit_steps_examples_tradeoff(batch_sizes: object, steps: object) -> TradeoffFit:
    """Fit S = S_min + E_min / B to (batch size, steps to target) pairs.

    With E = B S, McCandlish et al.'s (S/S_min - 1)(E/E_min - 1) = 1 is equivalent to
    S = S_min + E_min / B: linear in (S_min, E_min). The fit minimises the squared
    *relative* errors sum_i ((S_min + E_min/B_i - S_i) / S_i)^2, still a linear least-squares
    problem, so that a run of 2000 steps and one of 20 count alike. Needs at least two
    distinct batch sizes; returns the fit and its relative RMS error.
    """
    b, s = check_array("batch_sizes", batch_sizes, 1), check_array("steps", steps, 1)
    if b.shape != s.shape:
        raise ValueError(f"batch_sizes and steps must have one shape, got {b.shape} and {s.shape}")
    if np.any(b <= 0) or np.any(s <= 0):
        raise ValueError("batch_sizes and steps must be positive (drop runs that never reached "
                         "the target)")
    if np.unique(b).size < 2:
        raise ValueError(f"need at least two distinct batch sizes, got {np.unique(b).tolist()}")
    design = np.stack([np.ones_like(b), 1 / b], axis=1) / s[:, None]  # (n, 2), rows / S_i
    coef, *_ = np.linalg.lstsq(design, np.ones_like(s), rcond=None)
    rms = float(np.sqrt(np.mean((design @ coef - 1) ** 2)))
    return TradeoffFit(float(coef[0]), float(coef[1]), rms)


# ---------------------------------------------------------------- the chapter's experiment


@dataclass(frozen=True)
class ExperimentData:
    """What every run of a :class:`BatchSizeExperiment` shares.

    ``entropy_rate`` is the source's exact entropy rate H (nats/token), the floor of the
    loss; ``tokens`` the training stream ``(num_train_tokens,)``; ``x_val`` and ``y_val``
    the fixed validation windows and their next-token targets, both ``(val_windows, context)``.
    """

    entropy_rate: float
    tokens: Tensor
    x_val: Tensor
    y_val: Tensor


def _check_int_ge(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {name}={value}")
    return int(value)


def _check_betas(name: str, betas: object) -> tuple[float, float]:
    if not isinstance(betas, tuple | list) or len(betas) != 2:
        raise TypeError(f"{name} must be a pair (beta1, beta2), got {betas!r}")
    out = tuple(check_nonnegative_number(name, b) for b in betas)
    if not all(b < 1 for b in out):
        raise ValueError(f"{name} must lie in [0, 1), got {name}={betas!r}")
    return out  # type: ignore[return-value]


@dataclass(frozen=True)
class BatchSizeExperiment:
    """Chapter 10b's measured runs: steps to a target loss at several batch sizes.

    A GPT-2-style :class:`~llmbook.transformer.model.TransformerLM` (``d_model``,
    ``n_layers``, ``n_heads``, exact GELU, windows of ``context`` tokens) is trained by
    :func:`llmbook.training.train.train_step` with the book's AdamW (no weight decay,
    ``betas``, global-norm clipping at ``grad_clip``) on an order-``source_order``
    :class:`~llmbook.text.data.MarkovSource` whose entropy rate H is the exact floor of
    the loss. A run evaluates the loss of fixed validation windows on a geometric grid of
    ``eval_points`` steps and can stop once it reaches the target H + ``target_excess``;
    at each evaluation it can also estimate |G|^2 and tr(Sigma) from
    ``noise_micro_batches`` fresh micro-batches of ``noise_micro_batch`` windows
    (McCandlish et al., 2018, arXiv:1812.06162, Appendix A, via
    :func:`microbatch_noise_estimate`). Every random draw has its own seeded generator,
    so a run is a deterministic function of the fields on one machine and thread count.
    """

    vocab_size: int = 16
    source_order: int = 1
    concentration: float = 0.2
    source_seed: int = 0
    sample_seed: int = 0
    num_train_tokens: int = 500_000
    num_val_tokens: int = 50_000
    val_windows: int = 1024
    d_model: int = 32
    n_layers: int = 1
    n_heads: int = 4
    context: int = 8
    lr: float = 1e-2
    warmup_steps: int = 10
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    target_excess: float = 0.10
    eval_points: int = 40
    noise_micro_batch: int = 8
    noise_micro_batches: int = 16
    model_seed: int = 0
    batch_seed: int = 1
    noise_seed: int = 2
    val_seed: int = 9

    def __post_init__(self) -> None:
        for name in ("vocab_size", "source_order", "num_train_tokens", "num_val_tokens",
                     "val_windows", "d_model", "n_layers", "n_heads", "context", "eval_points",
                     "noise_micro_batch"):
            check_positive_int(name, getattr(self, name))
        for name in ("source_seed", "sample_seed", "warmup_steps", "model_seed", "batch_seed", "noise_seed",
                     "val_seed"):
            _check_int_ge(name, getattr(self, name), 0)
        _check_int_ge("noise_micro_batches", self.noise_micro_batches, 2)
        for name in ("concentration", "lr", "grad_clip", "target_excess"):
            check_positive_number(name, getattr(self, name))
        object.__setattr__(self, "betas", _check_betas("betas", self.betas))
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not a multiple of n_heads={self.n_heads}")
        if min(self.num_train_tokens, self.num_val_tokens) <= self.context:
            raise ValueError(f"num_train_tokens and num_val_tokens must exceed context="
                             f"{self.context}")

    def source_spec(self) -> dict[str, Any]:
        """The keyword arguments of the :class:`~llmbook.text.data.MarkovSource`."""
        return {"vocab_size": self.vocab_size, "order": self.source_order,
                "concentration": self.concentration, "seed": self.source_seed}

    def model_config(self) -> TransformerConfig:
        """GPT-2 style at the experiment's size, with the exact (erf) GELU."""
        return TransformerConfig.gpt2_style(vocab_size=self.vocab_size, d_model=self.d_model,
                                            n_layers=self.n_layers, n_heads=self.n_heads,
                                            max_seq_len=self.context, activation="gelu")

    def make_model(self) -> TransformerLM:
        """A freshly initialised model (the same weights every call: seed ``model_seed``)."""
        return TransformerLM(self.model_config(),
                             generator=torch.Generator().manual_seed(self.model_seed))

    def experiment_data(self) -> ExperimentData:
        """The source's entropy rate, the training tokens and the fixed validation windows."""
        source = MarkovSource(**self.source_spec())
        tokens, val_tokens = source.train_val(self.num_train_tokens, self.num_val_tokens,
                                            seed=self.sample_seed)
        x_val, y_val = get_batch(val_tokens, self.val_windows, self.context,
                                 generator=torch.Generator().manual_seed(self.val_seed))
        return ExperimentData(source.entropy_rate(), tokens, x_val, y_val)

    def target(self, data: ExperimentData) -> float:
        """The target loss H + ``target_excess`` (nats/token)."""
        if not isinstance(data, ExperimentData):
            raise TypeError(f"data must be an ExperimentData, got {type(data).__name__}")
        return data.entropy_rate + self.target_excess

    def warmup_constant(self, step: int) -> float:
        """The sweep's learning rate at 0-based ``step``: lr (step + 1) / W up to W, then lr.

        The first update already has lr / W (unlike :func:`cosine_schedule`, whose warmup
        starts at 0); ``warmup_steps`` = 0 means constant lr from the start.
        """
        step = _check_int_ge("step", step, 0)
        if self.warmup_steps == 0:
            return self.lr
        return self.lr * min(1.0, (step + 1) / self.warmup_steps)

    def cosine_recipe(self, warmup_steps: int, final_lr_fraction: float,
                      total_steps: int) -> Callable[[int], float]:
        """A schedule for :meth:`train_run`: linear warmup from 0, cosine to a fraction of lr.

        :func:`llmbook.training.optim.cosine_schedule` with peak ``lr`` and floor
        ``final_lr_fraction x lr`` at ``total_steps``: the recipe choices of claim C12.
        """
        warmup_steps = _check_int_ge("warmup_steps", warmup_steps, 0)
        total_steps = check_positive_int("total_steps", total_steps)
        final = check_nonnegative_number("final_lr_fraction", final_lr_fraction)
        if warmup_steps > total_steps:
            raise ValueError(f"warmup_steps={warmup_steps} exceeds total_steps={total_steps}")
        lr = self.lr

        def schedule(step: int) -> float:
            return cosine_schedule(step, lr, final * lr, warmup_steps, total_steps)

        return schedule

    def eval_steps(self, steps: int) -> list[int]:
        """The (1-based) steps after which a run of ``steps`` evaluates: a geometric grid."""
        steps = check_positive_int("steps", steps)
        grid = {int(round(s)) for s in np.geomspace(1, steps, self.eval_points)}
        return sorted(grid | {steps})

    def noise_point(self, model: nn.Module, tokens: Tensor,
                    generator: torch.Generator) -> NoiseEstimate:
        """|G|^2 and tr(Sigma) at the model's current parameters, in windows.

        Gradients (float64) of ``noise_micro_batches`` fresh micro-batches of
        ``noise_micro_batch`` windows drawn from ``tokens`` with ``generator``, reduced by
        :func:`microbatch_noise_estimate`. The parameters are not changed and the gradients
        are cleared afterwards.
        """
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if not isinstance(tokens, Tensor) or tokens.ndim != 1:
            raise TypeError("tokens must be a 1-D tensor of token ids")
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        rows = []
        for _ in range(self.noise_micro_batches):
            x, y = get_batch(tokens, self.noise_micro_batch, self.context, generator=generator)
            model.zero_grad(set_to_none=True)
            cross_entropy(model(x), y).backward()
            rows.append(gradient_vector(model).double())
        model.zero_grad(set_to_none=True)
        return microbatch_noise_estimate(torch.stack(rows), self.noise_micro_batch)

    def train_run(self, data: ExperimentData, batch_size: int, steps: int,
                  lr_at: Callable[[int], float] | None = None,
                  betas: tuple[float, float] | None = None, stop_at: float | None = None,
                  noise: bool = False) -> dict[str, list]:
        """Train a fresh model for up to ``steps`` updates of ``batch_size`` windows.

        ``lr_at(step)`` gives the learning rate of 0-based update ``step`` (default
        :meth:`warmup_constant`); ``betas`` overrides the experiment's. After each step of
        :meth:`eval_steps` the validation loss is recorded, with a :meth:`noise_point` if
        ``noise``, and the run stops there once the loss is <= ``stop_at``. Returns
        ``{"steps": [...], "val_loss": [...], "train_loss": [...] (every step, 5 decimals),
        "noise": [{"grad_sq", "trace_sigma"}, ...] (empty unless noise)}``.
        """
        if not isinstance(data, ExperimentData):
            raise TypeError(f"data must be an ExperimentData, got {type(data).__name__}")
        batch_size = check_positive_int("batch_size", batch_size)
        grid = set(self.eval_steps(steps))
        lr_at = self.warmup_constant if lr_at is None else lr_at
        if not callable(lr_at):
            raise TypeError(f"lr_at must be a callable step -> learning rate, got "
                            f"{type(lr_at).__name__}")
        betas = self.betas if betas is None else _check_betas("betas", betas)
        if stop_at is not None:
            if isinstance(stop_at, bool) or not isinstance(stop_at, int | float) or \
                    not math.isfinite(stop_at):
                raise ValueError(f"stop_at must be a finite number or None, got stop_at={stop_at!r}")
        if not isinstance(noise, bool):
            raise TypeError(f"noise must be a bool, got {type(noise).__name__}")
        model = self.make_model()
        opt = AdamW(param_groups(model, 0.0), lr=self.lr, betas=betas)
        batches = torch.Generator().manual_seed(self.batch_seed)
        noise_gen = torch.Generator().manual_seed(self.noise_seed)
        out: dict[str, list] = {"steps": [], "val_loss": [], "train_loss": [], "noise": []}
        for step in range(1, steps + 1):
            x, y = get_batch(data.tokens, batch_size, self.context, generator=batches)
            loss, _ = train_step(model, opt, x, y, lr_at(step - 1), self.grad_clip)
            out["train_loss"].append(round(float(loss), 5))
            if step in grid:
                with torch.no_grad():
                    val = float(cross_entropy(model(data.x_val), data.y_val))
                out["steps"].append(step)
                out["val_loss"].append(val)
                if noise:
                    est = self.noise_point(model, data.tokens, noise_gen)
                    out["noise"].append({"grad_sq": est.grad_sq, "trace_sigma": est.trace_sigma})
                if stop_at is not None and val <= stop_at:
                    break
        return out
