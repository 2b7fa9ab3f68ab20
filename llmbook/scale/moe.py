"""Mixture-of-experts layers: routing, load balancing, capacity and token dropping.

Introduced in notebooks/21_mixture_of_experts. A mixture-of-experts (MoE) layer replaces
the feed-forward layer of a transformer block by N feed-forward *experts* and a *router*
that sends each token to k of them (Shazeer et al., 2017, "Outrageously Large Neural
Networks: The Sparsely-Gated Mixture-of-Experts Layer"):

    z = W_r x                          router logits, (N,)
    s = softmax(z)   (or sigmoid(z))   router scores, (N,)
    S = top_k(s + b)                   the k selected experts (b: a balancing bias, often 0)
    g_i = s_i / sum_{j in S} s_j       gate weights of the selected experts (renormalised)
    y = sum_{i in S} g_i E_i(x)  (+ shared experts that every token uses)

Each expert E_i is the book's SwiGLU (chapter 6). A token pays for k experts, the model
holds N of them: parameters grow with N at a fixed cost per token.

Contents:

* :func:`route` - scores, top-k selection (with an optional selection-only bias) and gates;
* :func:`expert_load_fractions`, :func:`load_balancing_loss` - the Switch Transformer's
  auxiliary loss alpha N sum_i f_i P_i (Fedus, Zoph & Shazeer, 2021, "Switch Transformers:
  Scaling to Trillion Parameter Models with Simple and Efficient Sparsity", eq. 4-6);
* :func:`router_z_loss` - ST-MoE's penalty on the size of the router logits (Zoph et al.,
  2022, "ST-MoE: Designing Stable and Transferable Sparse Expert Models", eq. 5);
* :func:`expert_capacity`, :func:`capacity_keep_mask`, :func:`expected_drop_fraction` -
  a fixed buffer per expert, the tokens that overflow it, and how many overflow under
  uniform routing (exact binomial expectation);
* :func:`update_expert_bias` - auxiliary-loss-free balancing (Wang et al., 2024,
  "Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts"; DeepSeek-AI, 2024,
  "DeepSeek-V3 Technical Report", section 2.1.2);
* :func:`all_to_all_bytes` - the traffic of expert parallelism;
* :func:`gate_jacobian_symbolic`, :func:`router_gradient`, :func:`lm_router_gradients` - why a top-1 gate renormalised
  over its one expert gives the router no gradient from the language-model loss;
* :class:`MoELayer` - the layer, with optional shared experts (Dai et al., 2024,
  "DeepSeekMoE: Towards Ultimate Expert Specialization in Mixture-of-Experts Language
  Models"), a Qwen2-MoE-style sigmoid gate on the shared expert, capacity and bias.

Loaders for Hugging Face's Mixtral, Qwen2-MoE and DeepSeek-V3 MoE blocks:
:func:`from_hf_moe_block`.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from llmbook.transformer.layers import SwiGLU
from llmbook.validation import (
    check_finite,
    check_floating_tensor,
    check_positive_int,
    check_positive_number,
    check_same_dtype,
)

__all__ = [
    "MoELayer",
    "Routing",
    "all_to_all_bytes",
    "capacity_keep_mask",
    "expected_drop_fraction",
    "expert_capacity",
    "expert_load_fractions",
    "from_hf_moe_block",
    "gate_jacobian_symbolic",
    "load_balancing_loss",
    "route",
    "lm_router_gradients",
    "router_gradient",
    "router_z_loss",
    "update_expert_bias",
]

SCORES = ("softmax", "sigmoid")


# ---------------------------------------------------------------- validation


def _check_logits(router_logits: object, name: str = "router_logits") -> Tensor:
    z = check_floating_tensor(router_logits, name)
    if z.ndim != 2 or z.shape[1] == 0:
        raise ValueError(f"{name} must have shape (n_tokens, num_experts), got {tuple(z.shape)}")
    return check_finite(z, name, allow_inf=True)  # -inf: an expert masked out


def _check_top_k(top_k: object, num_experts: int) -> int:
    k = check_positive_int("top_k", top_k)
    if k > num_experts:
        raise ValueError(f"top_k={k} exceeds the number of experts num_experts={num_experts}")
    return k


def _check_indices(indices: object, num_experts: int) -> Tensor:
    if not isinstance(indices, Tensor) or indices.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"indices must be an integer torch.Tensor, got "
                        f"{indices.dtype if isinstance(indices, Tensor) else type(indices).__name__}")
    if indices.ndim != 2:
        raise ValueError(f"indices must have shape (n_tokens, top_k), got {tuple(indices.shape)}")
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= num_experts):
        raise ValueError(f"expert indices must lie in [0, {num_experts - 1}], got "
                         f"[{int(indices.min())}, {int(indices.max())}]")
    return indices


def _check_route_options(normalize: object, bias: object, num_experts: int) -> None:
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool, got {normalize!r} ({type(normalize).__name__})")
    if bias is not None:
        check_finite(check_floating_tensor(bias, "bias"), "bias")
        if bias.shape != (num_experts,):
            raise ValueError(f"bias must have shape (num_experts,) = ({num_experts},), got "
                             f"{tuple(bias.shape)}")


# ---------------------------------------------------------------- routing


class Routing(NamedTuple):
    """What a router decides for n tokens: ``weights`` (n, k) gate values, ``indices``
    (n, k) the chosen experts (best first) and ``scores`` (n, N) all router scores."""

    weights: Tensor
    indices: Tensor
    scores: Tensor


def route(router_logits: Tensor, top_k: int, score: str = "softmax", normalize: bool = True,
          bias: Tensor | None = None, scaling: float = 1.0) -> Routing:
    """Top-k routing of n tokens over N experts.

    ``score`` turns the logits z (n, N) into scores s: "softmax" (Shazeer et al., 2017;
    Mixtral, Qwen2-MoE) or "sigmoid" (DeepSeek-V3). The k experts with the largest
    ``s + bias`` are selected; ``bias`` (N,) changes *only the selection* (auxiliary-loss-free
    balancing): the gates are gathered from the unbiased s, renormalised to sum to 1 over
    the selected experts when ``normalize`` (Mixtral; Qwen2-MoE's ``norm_topk_prob``), and
    multiplied by ``scaling`` (DeepSeek-V3's ``routed_scaling_factor``).
    Shapes: (n, N) -> weights (n, k), indices (n, k), scores (n, N).
    """
    z = _check_logits(router_logits)
    n_experts = z.shape[1]
    k = _check_top_k(top_k, n_experts)
    if score not in SCORES:
        raise ValueError(f"unknown score={score!r}; choose one of {list(SCORES)}")
    scaling = check_positive_number("scaling", scaling)
    _check_route_options(normalize, bias, n_experts)
    s = torch.softmax(z, dim=-1) if score == "softmax" else torch.sigmoid(z)  # (n, N)
    choice = s
    if bias is not None:
        choice = s + bias.to(s.dtype)  # (n, N), used for the selection only
    indices = torch.topk(choice, k, dim=-1).indices  # (n, k), best first
    weights = s.gather(1, indices)  # (n, k), from the unbiased scores
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return Routing(weights * scaling, indices, s)


def expert_load_fractions(indices: Tensor, num_experts: int) -> Tensor:
    """f_i: the fraction of the n k token-to-expert assignments that go to expert i.

    ``indices`` (n, k) as returned by :func:`route`; returns (N,) float64, summing to 1
    (for k = 1, Switch's "fraction of tokens dispatched to expert i").
    """
    num_experts = check_positive_int("num_experts", num_experts)
    idx = _check_indices(indices, num_experts)
    if idx.numel() == 0:
        raise ValueError("indices is empty: no assignments to count")
    counts = torch.bincount(idx.reshape(-1), minlength=num_experts)  # (N,)
    return counts.to(torch.float64) / idx.numel()


def load_balancing_loss(router_logits: Tensor, top_k: int, alpha: float = 1.0,
                        score: str = "softmax") -> Tensor:
    """The Switch Transformer's auxiliary loss alpha N sum_i f_i P_i (Fedus et al., 2021, eq. 4).

    f_i is the fraction of assignments routed to expert i (:func:`expert_load_fractions`
    of the top-k choice; a count, so no gradient flows through it) and
    P_i = (1/n) sum_x s_i(x) the mean router probability of expert i (differentiable).
    Under perfectly uniform routing f_i = P_i = 1/N and the loss equals alpha, for every N
    and k. ``router_logits`` (n, N) -> scalar.

    Hugging Face's ``load_balancing_loss_func`` (Mixtral, Qwen2-MoE, OLMoE) takes a tuple
    of per-layer logits, pools their tokens, and counts f_i per *token* (summing to k, not
    1): it equals ``top_k * load_balancing_loss(torch.cat(layers), top_k)``.
    """
    z = _check_logits(router_logits)
    alpha = check_positive_number("alpha", alpha)
    n_experts = z.shape[1]
    r = route(z, top_k, score=score)
    f = expert_load_fractions(r.indices, n_experts).to(z.dtype)  # (N,), no gradient
    p = r.scores.mean(dim=0)  # (N,)
    return alpha * n_experts * (f * p).sum()


def router_z_loss(router_logits: Tensor) -> Tensor:
    """ST-MoE's router z-loss (Zoph et al., 2022, eq. 5): (1/n) sum_x (log sum_j e^{z_j(x)})^2.

    It keeps the router logits small, where the exponentials of the softmax are well
    conditioned (the paper scales it by 1e-3). Its gradient for one token is
    2 lse(z) softmax(z) / n. ``router_logits`` (n, N) -> scalar.
    """
    z = _check_logits(router_logits)
    if z.shape[0] == 0:
        raise ValueError("router_logits has no tokens")
    return torch.logsumexp(z, dim=-1).pow(2).mean()


# ---------------------------------------------------------------- capacity


def expert_capacity(num_tokens: int, num_experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert: ceil(capacity_factor * k * n / N) (Fedus et al., 2021, eq. 3, for k = 1;
    GShard's rule, Lepikhin et al., 2020, for k = 2).

    With capacity factor 1 the n k assignments exactly fill N experts if they are spread
    evenly; a factor above 1 leaves slack for uneven routing.
    """
    n = check_positive_int("num_tokens", num_tokens)
    n_experts = check_positive_int("num_experts", num_experts)
    k = _check_top_k(top_k, n_experts)
    cf = check_positive_number("capacity_factor", capacity_factor)
    return math.ceil(Fraction(repr(cf)) * k * n / n_experts)  # 1.1 as 11/10, not its binary value


def capacity_keep_mask(indices: Tensor, num_experts: int, capacity: int) -> Tensor:
    """Which assignments fit: (n, k) bool, False for those dropped because the expert is full.

    Experts take assignments first come, first served, in *slot-major* order: every token's
    first choice (in token order), then every token's second choice, and so on, as GShard
    does for its second expert (Lepikhin et al., 2020, Algorithm 1), so that a token loses
    its second expert before any token loses its first. A dropped assignment contributes
    nothing; the token's residual connection carries it past the layer.
    """
    n_experts = check_positive_int("num_experts", num_experts)
    idx = _check_indices(indices, n_experts)
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise ValueError(f"capacity must be a non-negative int, got {capacity!r}")
    order = idx.t().reshape(-1)  # (k n,) slot-major
    one_hot = F.one_hot(order, n_experts)  # (k n, N)
    position = (one_hot.cumsum(0) * one_hot).sum(-1) - 1  # (k n,) place in the expert's queue
    return (position < capacity).reshape(idx.shape[1], idx.shape[0]).t()  # (n, k)


def expected_drop_fraction(num_tokens: int, num_experts: int, top_k: int, capacity: int) -> float:
    """Expected fraction of the n k assignments dropped when routing is uniform, exactly.

    If each token picks k distinct experts uniformly at random, the load of one expert is
    X ~ Binomial(n, k/N), of which (X - C)^+ overflow a capacity C. By symmetry the expected
    dropped fraction is N E[(X - C)^+] / (n k), with
    E[(X - C)^+] = sum_{x > C} (x - C) binom(n, x) p^x (1 - p)^(n - x), summed in float64
    (the binomial probabilities in log space).
    """
    n = check_positive_int("num_tokens", num_tokens)
    n_experts = check_positive_int("num_experts", num_experts)
    k = _check_top_k(top_k, n_experts)
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise ValueError(f"capacity must be a non-negative int, got {capacity!r}")
    p = k / n_experts
    log_p, log_q = math.log(p), math.log1p(-p) if p < 1 else -math.inf
    overflow = 0.0
    for x in range(capacity + 1, n + 1):  # binomial pmf in log space: no overflow for large n
        log_pmf = math.lgamma(n + 1) - math.lgamma(x + 1) - math.lgamma(n - x + 1) + x * log_p
        log_pmf += (n - x) * log_q if n > x else 0.0
        overflow += (x - capacity) * math.exp(log_pmf)
    return n_experts * overflow / (n * k)


# ---------------------------------------------------------------- auxiliary-loss-free balancing


def update_expert_bias(bias: Tensor, counts: Tensor, rate: float) -> Tensor:
    """One step of auxiliary-loss-free balancing (Wang et al., 2024, Algorithm 1):
    b_i <- b_i + rate * sign(mean(c) - c_i).

    ``counts`` (N,) are the assignments each expert received in the last batch; an
    overloaded expert's bias goes down, an underloaded one's up, each by ``rate``
    (DeepSeek-V3's bias update speed gamma). Returns the new bias (N,).
    """
    bias = check_floating_tensor(bias, "bias")
    if not isinstance(counts, Tensor) or counts.shape != bias.shape or bias.ndim != 1:
        raise ValueError(f"counts must be a tensor of the bias's shape {tuple(bias.shape)}, got "
                         f"{tuple(counts.shape) if isinstance(counts, Tensor) else type(counts).__name__}")
    rate = check_positive_number("rate", rate)
    c = counts.to(bias.dtype)
    return bias + rate * torch.sign(c.mean() - c)


# ---------------------------------------------------------------- expert parallelism


def all_to_all_bytes(num_tokens: int, d_model: int, top_k: int = 1, bytes_per_value: int = 2,
                     ep_size: int | None = None) -> int | float:
    """Bytes an MoE layer's forward pass moves in expert parallelism: 2 n k d b.

    With the experts spread over ``ep_size`` devices, each of the n tokens' k copies (d
    values of b bytes) is sent to its expert's device (*dispatch* all-to-all) and its output
    sent back (*combine* all-to-all): 2 n k d b bytes per layer, the backward pass moving
    as much again. Under uniform routing a fraction 1/ep_size of the copies stays on its
    own device; with ``ep_size`` the result counts only the (ep - 1)/ep that cross.
    """
    n = check_positive_int("num_tokens", num_tokens)
    d = check_positive_int("d_model", d_model)
    k = check_positive_int("top_k", top_k)
    b = check_positive_int("bytes_per_value", bytes_per_value)
    total = 2 * n * k * d * b
    if ep_size is None:
        return total
    ep = check_positive_int("ep_size", ep_size)
    return total * (ep - 1) / ep


# ---------------------------------------------------------------- the router's gradient


def gate_jacobian_symbolic(num_experts: int, top_k: int, score: str = "softmax",
                           normalize: bool = True) -> Any:
    """SymPy: d g / d z, the (k, N) Jacobian of the gates with respect to the router logits.

    The selection S = top_k(s) is piecewise constant in z, so its derivative is zero almost
    everywhere and the gradient reaches z only through the gate values g. Without loss of
    generality S is the first k experts. With ``normalize`` and k = 1 the gate is
    s_1 / s_1 = 1 whatever z is: the Jacobian is zero and the router's weights W_r get no
    gradient from any loss computed from the layer's output y = sum_i g_i E_i(x).
    """
    import sympy as sp

    n = check_positive_int("num_experts", num_experts)
    k = _check_top_k(top_k, n)
    if score not in SCORES:
        raise ValueError(f"unknown score={score!r}; choose one of {list(SCORES)}")
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool, got {normalize!r}")
    z = sp.symbols(f"z0:{n}", real=True)
    if score == "softmax":
        s = [sp.exp(zi) / sum(sp.exp(zj) for zj in z) for zi in z]
    else:
        s = [1 / (1 + sp.exp(-zi)) for zi in z]
    g = [s[i] / sum(s[:k]) if normalize else s[i] for i in range(k)]
    return sp.simplify(sp.Matrix(g).jacobian(sp.Matrix(z)))


def router_gradient(layer: nn.Module, x: Tensor, grad_output: Tensor) -> Tensor:
    """The gradient of <y, grad_output> with respect to the router's weight W_r (N, d), where
    y = layer(x): what a loss with dL/dy = ``grad_output`` (a language-model loss's) sends to
    the router, auxiliary losses excluded. Zeros where autograd finds no path (a renormalised
    top-1 gate). ``layer`` is an :class:`MoELayer`; x (..., d), grad_output shaped like y.
    """
    if not isinstance(layer, MoELayer):
        raise TypeError(f"layer must be an MoELayer, got {type(layer).__name__}")
    x = check_floating_tensor(x, "x")
    grad_output = check_floating_tensor(grad_output, "grad_output")
    y = layer(x)
    if grad_output.shape != y.shape:
        raise ValueError(f"grad_output must have the output's shape {tuple(y.shape)}, got {tuple(grad_output.shape)}")
    (grad,) = torch.autograd.grad(y, layer.router.weight, grad_output, allow_unused=True,
                                  materialize_grads=True)
    return grad


def lm_router_gradients(model: nn.Module, ids: Tensor, top_k: int, normalize: bool,
                        balance_alpha: float = 0.0, z_loss: float = 0.0) -> list[Tensor]:
    """dL/dW_r of every :class:`MoELayer` router in ``model`` under a given gate rule.

    ``model`` maps token ids (B, T) to next-token logits (B, T, V) (a language model);
    L is the cross-entropy of ids[:, 1:] given ids[:, :-1], plus ``balance_alpha`` times each
    layer's :func:`load_balancing_loss` and ``z_loss`` times its :func:`router_z_loss`. Every
    MoE layer is switched to ``top_k`` and ``normalize`` for the call and restored after; no
    weight changes. Returns one (N, d) gradient per layer (zeros where autograd finds no path).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    layers = [m for m in model.modules() if isinstance(m, MoELayer)]
    if not layers:
        raise ValueError("model has no MoELayer")
    if not isinstance(ids, Tensor) or ids.ndim != 2 or ids.shape[1] < 2 or ids.is_floating_point():
        raise ValueError(f"ids must be an integer tensor (B, T) with T >= 2, got {ids!r:.60}")
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool, got {normalize!r}")
    for name, value in (("balance_alpha", balance_alpha), ("z_loss", z_loss)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    saved = [(m.top_k, m.normalize) for m in layers]
    try:
        for m in layers:
            m.top_k, m.normalize = _check_top_k(top_k, m.num_experts), normalize
        logits = model(ids[:, :-1])  # (B, T-1, V)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        for m in layers:
            if balance_alpha:
                loss = loss + load_balancing_loss(m.router_logits, m.top_k, balance_alpha)
            if z_loss:
                loss = loss + z_loss * router_z_loss(m.router_logits)
        return list(torch.autograd.grad(loss, [m.router.weight for m in layers], allow_unused=True,
                                        materialize_grads=True))
    finally:
        for m, (k, norm) in zip(layers, saved, strict=True):
            m.top_k, m.normalize = k, norm


# ---------------------------------------------------------------- the layer


class MoELayer(nn.Module):
    """A mixture-of-experts feed-forward layer: (..., d) -> (..., d).

    Submodules: ``router`` (nn.Linear(d, N), no bias), ``experts`` (N book
    :class:`~llmbook.transformer.layers.SwiGLU` of width ``d_ff``), optionally
    ``shared_expert`` (a SwiGLU of width ``shared_d_ff`` that every token uses: DeepSeekMoE's
    shared experts, merged into one, as DeepSeek-V2/V3 and Qwen2-MoE do) and
    ``shared_expert_gate`` (nn.Linear(d, 1): Qwen2-MoE scales the shared expert by
    sigmoid(w^T x)); buffer ``expert_bias`` (N,) when ``expert_bias=True`` (used by
    :func:`route` for selection only, updated by :func:`update_expert_bias`).

    Routing follows :func:`route` (``score``, ``normalize``, ``scaling``). With a
    ``capacity_factor`` each expert takes at most :func:`expert_capacity` assignments of
    the n tokens of the call and drops the rest (:func:`capacity_keep_mask`).

    After each call the layer keeps, for the losses and for plots, ``router_logits``
    (n, N), ``expert_indices`` (n, k) and ``keep`` (n, k) bool of the tokens it saw
    (flattened over the leading dimensions). Parameters: d N + 3 N d d_ff (+ shared).
    """

    def __init__(self, d_model: int, d_ff: int, num_experts: int, top_k: int, *,
                 score: str = "softmax", normalize: bool = True, scaling: float = 1.0,
                 shared_d_ff: int | None = None, shared_expert_gate: bool = False,
                 expert_bias: bool = False, capacity_factor: float | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.d_ff = check_positive_int("d_ff", d_ff)
        self.num_experts = check_positive_int("num_experts", num_experts)
        self.top_k = _check_top_k(top_k, num_experts)
        if score not in SCORES:
            raise ValueError(f"unknown score={score!r}; choose one of {list(SCORES)}")
        self.score, self.normalize = score, bool(normalize)
        self.scaling = check_positive_number("scaling", scaling)
        self.capacity_factor = None if capacity_factor is None else \
            check_positive_number("capacity_factor", capacity_factor)
        self.router = nn.Linear(d_model, num_experts, bias=False, dtype=dtype)  # W_r (N, d)
        self.experts = nn.ModuleList(SwiGLU(d_model, d_ff, dtype=dtype) for _ in range(num_experts))
        self.shared_expert = None if shared_d_ff is None else \
            SwiGLU(d_model, check_positive_int("shared_d_ff", shared_d_ff), dtype=dtype)
        if shared_expert_gate and self.shared_expert is None:
            raise ValueError("shared_expert_gate=True needs a shared expert (give shared_d_ff)")
        self.shared_expert_gate = nn.Linear(d_model, 1, bias=False, dtype=dtype) \
            if shared_expert_gate else None
        if expert_bias:
            self.register_buffer("expert_bias", torch.zeros(num_experts, dtype=dtype or torch.float32))
        else:
            self.expert_bias = None
        self.router_logits: Tensor | None = None
        self.expert_indices: Tensor | None = None
        self.keep: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        x = check_floating_tensor(x, "x")
        if x.ndim == 0 or x.shape[-1] != self.d_model:
            raise ValueError(f"MoELayer expects input of shape (..., {self.d_model}), got {tuple(x.shape)}")
        check_same_dtype(x, "x", self.router.weight, "the layer's weights")
        h = x.reshape(-1, self.d_model)  # (n, d)
        logits = self.router(h)  # (n, N)
        r = route(logits, self.top_k, self.score, self.normalize, self.expert_bias, self.scaling)
        weights, indices = r.weights, r.indices  # (n, k) each
        keep = torch.ones_like(indices, dtype=torch.bool)
        if self.capacity_factor is not None and h.shape[0] > 0:
            cap = expert_capacity(h.shape[0], self.num_experts, self.top_k, self.capacity_factor)
            keep = capacity_keep_mask(indices, self.num_experts, cap)  # (n, k)
        out = torch.zeros_like(h)  # (n, d)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where((indices == e) & keep)  # the assignments expert e serves
            if token.numel() == 0:
                continue
            y = expert(h[token]) * weights[token, slot, None]  # (n_e, d)
            out.index_add_(0, token, y)
        if self.shared_expert is not None:
            shared = self.shared_expert(h)  # (n, d)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(h)) * shared
            out = out + shared
        self.router_logits, self.expert_indices, self.keep = logits, indices.detach(), keep
        return out.reshape(x.shape)

    def dropped_fraction(self) -> float:
        """The fraction of the last call's n k assignments that were dropped."""
        if self.keep is None:
            raise ValueError("the layer has not been called yet")
        return 1.0 - float(self.keep.float().mean())

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, top_k={self.top_k}, score={self.score!r}, "
                f"normalize={self.normalize}, capacity_factor={self.capacity_factor}")


# ---------------------------------------------------------------- Hugging Face loaders


def from_hf_moe_block(block: nn.Module, config: Any) -> MoELayer:
    """An :class:`MoELayer` holding the weights of a Hugging Face MoE block.

    Supported (transformers 5.x, which stores the experts as fused 3-D parameters
    ``experts.gate_up_proj`` (N, 2 d_ff, d), the gate projection's rows first, and
    ``experts.down_proj`` (N, d, d_ff)):

    * ``MixtralSparseMoeBlock``: softmax, renormalised top-k, ``gate.weight`` (N, d);
    * ``Qwen2MoeSparseMoeBlock``: softmax, renormalised if ``config.norm_topk_prob``, a shared
      expert ``shared_expert.{gate,up,down}_proj`` with a sigmoid ``shared_expert_gate``;
    * ``DeepseekV3MoE`` with ``n_group = topk_group = 1``: sigmoid scores, the selection bias
      ``gate.e_score_correction_bias``, ``routed_scaling_factor``, a shared expert of width
      ``n_shared_experts * moe_intermediate_size``. (Group-limited routing is not modelled.)
    """
    kind = type(block).__name__
    known = ("MixtralSparseMoeBlock", "Qwen2MoeSparseMoeBlock", "DeepseekV3MoE")
    if kind not in known:
        raise TypeError(f"from_hf_moe_block does not know {kind}; expected one of {list(known)}")
    w13, w2 = block.experts.gate_up_proj, block.experts.down_proj  # (N, 2 f, d), (N, d, f)
    n_experts, two_f, d = w13.shape
    f = two_f // 2
    kw: dict[str, Any] = {}
    if kind == "MixtralSparseMoeBlock":
        top_k = config.num_experts_per_tok
    elif kind == "Qwen2MoeSparseMoeBlock":
        top_k = config.num_experts_per_tok
        kw = dict(normalize=bool(config.norm_topk_prob),
                  shared_d_ff=block.shared_expert.gate_proj.weight.shape[0], shared_expert_gate=True)
    else:  # DeepseekV3MoE
        if getattr(config, "n_group", 1) != 1 or getattr(config, "topk_group", 1) != 1:
            raise ValueError("from_hf_moe_block models DeepSeek-V3 routing only with "
                             f"n_group = topk_group = 1, got {config.n_group}, {config.topk_group}")
        top_k = config.num_experts_per_tok
        kw = dict(score="sigmoid", normalize=bool(config.norm_topk_prob),
                  scaling=float(config.routed_scaling_factor), expert_bias=True,
                  shared_d_ff=block.shared_experts.gate_proj.weight.shape[0])
    layer = MoELayer(d, f, n_experts, top_k, dtype=w13.dtype, **kw)
    with torch.no_grad():
        layer.router.weight.copy_(block.gate.weight)
        for e, expert in enumerate(layer.experts):
            expert.gate_proj.weight.copy_(w13[e, :f])
            expert.up_proj.weight.copy_(w13[e, f:])
            expert.down_proj.weight.copy_(w2[e])
        shared = getattr(block, "shared_expert", None) or getattr(block, "shared_experts", None)
        if shared is not None:
            for name in ("gate_proj", "up_proj", "down_proj"):
                getattr(layer.shared_expert, name).weight.copy_(getattr(shared, name).weight)
        if layer.shared_expert_gate is not None:
            layer.shared_expert_gate.weight.copy_(block.shared_expert_gate.weight)
        if layer.expert_bias is not None:
            layer.expert_bias = block.gate.e_score_correction_bias.detach().clone().to(w13.dtype)
    return layer

