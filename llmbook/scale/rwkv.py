"""RWKV-4: attention-like mixing computed as an RNN (Peng et al., 2023, "RWKV: Reinventing
RNNs for the Transformer Era").

A block has two residual sub-layers, each fed a *token shift*, a per-channel mix of the
current and the previous token (:func:`token_shift`):

* **time mixing** (:class:`RWKVTimeMixing`): receptance r, key k, value v from the mixed
  input; per channel, the "WKV" operator (their eq. 14)

      wkv_t = (sum_{i<t} e^{-(t-1-i) w + k_i} v_i + e^{u + k_t} v_t)
              / (sum_{i<t} e^{-(t-1-i) w + k_i} + e^{u + k_t}),

  a softmax-like weighted average of past values with a weight that decays by e^{-w} per
  step, and a bonus u for the current token; output W_o (sigmoid(r) * wkv).
  :func:`wkv_parallel` evaluates the formula directly (O(T^2), overflows for large k);
  :func:`wkv_recurrent` carries a numerator, a denominator and the running maximum
  exponent, so that every exponential it takes is at most 1 (their Appendix; the CPU path of
  Hugging Face's implementation).
* **channel mixing** (:class:`RWKVChannelMixing`): sigmoid(r) * W_v relu(W_k x)^2.

:class:`RWKVLM` and :func:`rwkv_from_hf` use the parameter names of Hugging Face
``RwkvForCausalLM``, so its weights load directly.

Introduced in notebooks/23_beyond_attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from llmbook.transformer.layers import LayerNorm
from llmbook.validation import (
    check_finite,
    check_floating_tensor,
    check_nonempty,
    check_positive_int,
    check_positive_number,
    check_same_dtype,
    check_sequence,
    check_token_ids,
)

__all__ = [
    "RWKVBlock",
    "RWKVChannelMixing",
    "RWKVConfig",
    "RWKVLM",
    "RWKVTimeMixing",
    "rwkv_from_hf",
    "token_shift",
    "wkv_parallel",
    "wkv_recurrent",
]


def token_shift(x: Tensor) -> Tensor:
    """x shifted one step later in time: out[:, t] = x[:, t-1], out[:, 0] = 0.

    Shapes: (batch, T, d) -> (batch, T, d).
    """
    check_floating_tensor(x, "x")
    if x.ndim != 3:
        raise ValueError(f"token_shift expects (batch, T, d), got {tuple(x.shape)}")
    return torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)


def _check_wkv(w: object, u: object, k: object, v: object) -> None:
    for name, t in (("w", w), ("u", u), ("k", k), ("v", v)):
        check_finite(check_floating_tensor(t, name), name)
    for name, t in (("w", w), ("u", u), ("v", v)):
        check_same_dtype(t, name, k, "k")
    if k.ndim != 3 or v.shape != k.shape:
        raise ValueError(f"k and v must have the same shape (batch, T, d), got k {tuple(k.shape)} "
                         f"and v {tuple(v.shape)}")
    if k.shape[1] == 0:
        raise ValueError(f"k and v have no positions (T = 0), got shape {tuple(k.shape)}")
    if w.shape != (k.shape[-1],) or u.shape != (k.shape[-1],):
        raise ValueError(f"w and u must have shape (d,) = ({k.shape[-1]},), got w {tuple(w.shape)} "
                         f"and u {tuple(u.shape)}")
    if bool((w < 0).any()):
        raise ValueError(f"w must hold decay rates >= 0 (w < 0 makes old tokens grow), found {float(w.min())}")


def wkv_parallel(w: Tensor, u: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The WKV operator straight from its formula (Peng et al., eq. 14): O(T^2), unstabilised.

    ``w`` (d,) decay rates (the weight of token i at step t is e^{-(t-1-i) w}, so w > 0
    forgets), ``u`` (d,) the bonus of the current token, ``k``, ``v`` (batch, T, d) ->
    (batch, T, d). exp(k) overflows for large k (float64: k > 709): use :func:`wkv_recurrent`.
    """
    _check_wkv(w, u, k, v)
    T = k.shape[1]
    t = torch.arange(T, dtype=k.dtype)
    lag = t[:, None] - 1 - t[None, :]  # (T, T): t - 1 - i
    past = torch.exp(-lag[..., None] * w + k[:, None, :, :])  # (batch, T, T, d): e^{-(t-1-i)w + k_i}
    past = past * (lag >= 0)[None, :, :, None]  # keep i < t only
    now = torch.exp(u + k)  # (batch, T, d)
    num = (past * v[:, None, :, :]).sum(dim=2) + now * v
    den = past.sum(dim=2) + now
    return num / den


def wkv_recurrent(w: Tensor, u: Tensor, k: Tensor, v: Tensor,
                  return_state: bool = False) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
    """The WKV operator as a numerically stable RNN (the recurrence of RWKV-4's kernels).

    The state is (a, b, p): the numerator and denominator of eq. 14 over tokens i < t, both
    divided by e^p, where p is the largest exponent met so far. At step t, with
    q = max(p, u + k_t),

        wkv_t = (e^{p-q} a + e^{u+k_t-q} v_t) / (e^{p-q} b + e^{u+k_t-q}),

    then, with q' = max(p - w, k_t), the state moves one step (decay by e^{-w}, add token t):

        a <- e^{p-w-q'} a + e^{k_t-q'} v_t,   b <- e^{p-w-q'} b + e^{k_t-q'},   p <- q'.

    Every exponent is <= 0, so nothing overflows. Shapes as :func:`wkv_parallel`; with
    ``return_state`` also returns the final (a, b, p), each (batch, d).
    """
    _check_wkv(w, u, k, v)
    a = torch.zeros_like(k[:, 0])  # (batch, d)
    b = torch.zeros_like(k[:, 0])
    p = torch.full_like(k[:, 0], float("-inf"))
    out = []
    for t in range(k.shape[1]):
        kt, vt = k[:, t], v[:, t]
        q = torch.maximum(p, u + kt)
        e1, e2 = torch.exp(p - q), torch.exp(u + kt - q)
        out.append((e1 * a + e2 * vt) / (e1 * b + e2))
        q = torch.maximum(p - w, kt)
        e1, e2 = torch.exp(p - w - q), torch.exp(kt - q)
        a, b, p = e1 * a + e2 * vt, e1 * b + e2, q
    y = torch.stack(out, dim=1)
    return (y, (a, b, p)) if return_state else y


@dataclass
class RWKVConfig:
    """Sizes of an RWKV-4 model (Hugging Face's names in brackets): ``d_model``
    (hidden_size = attention_hidden_size), ``d_ff`` (intermediate_size; 4 d_model if None),
    ``n_layers`` (num_hidden_layers), ``eps`` (layer_norm_epsilon)."""

    vocab_size: int
    d_model: int = 64
    n_layers: int = 2
    d_ff: int | None = None
    eps: float = 1e-5
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers"):
            check_positive_int(name, getattr(self, name))
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model
        check_positive_int("d_ff", self.d_ff)
        check_positive_number("eps", self.eps)


def _mix(x: Tensor, shifted: Tensor, mu: Tensor) -> Tensor:
    """mu * x_t + (1 - mu) * x_{t-1}, per channel."""
    return x * mu + shifted * (1 - mu)


class RWKVTimeMixing(nn.Module):
    """RWKV-4 time mixing (Peng et al., eqs. 11-13 and 15). Shapes: (batch, T, d) -> (batch, T, d).

    ``time_decay`` is log w (w = exp(time_decay) > 0, as Hugging Face stores it),
    ``time_first`` is u; ``time_mix_*`` are the token-shift mixes mu (d,).
    """

    def __init__(self, d_model: int) -> None:
        super().__init__()
        d = check_positive_int("d_model", d_model)
        self.time_decay = nn.Parameter(torch.zeros(d))
        self.time_first = nn.Parameter(torch.zeros(d))
        self.time_mix_key = nn.Parameter(torch.full((d,), 0.5))
        self.time_mix_value = nn.Parameter(torch.full((d,), 0.5))
        self.time_mix_receptance = nn.Parameter(torch.full((d,), 0.5))
        self.key = nn.Linear(d, d, bias=False)
        self.value = nn.Linear(d, d, bias=False)
        self.receptance = nn.Linear(d, d, bias=False)
        self.output = nn.Linear(d, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        check_sequence(x, "x", self.key.in_features, self.key.weight)
        shifted = token_shift(x)
        k = self.key(_mix(x, shifted, self.time_mix_key))
        v = self.value(_mix(x, shifted, self.time_mix_value))
        r = torch.sigmoid(self.receptance(_mix(x, shifted, self.time_mix_receptance)))
        wkv = wkv_recurrent(torch.exp(self.time_decay), self.time_first, k, v)
        return self.output(r * wkv)


class RWKVChannelMixing(nn.Module):
    """RWKV-4 channel mixing (Peng et al., eqs. 17-19): sigmoid(r) * W_v relu(W_k x_k)^2.

    Shapes: (batch, T, d) -> (batch, T, d); the hidden width is ``d_ff``.
    """

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        d, f = check_positive_int("d_model", d_model), check_positive_int("d_ff", d_ff)
        self.time_mix_key = nn.Parameter(torch.full((d,), 0.5))
        self.time_mix_receptance = nn.Parameter(torch.full((d,), 0.5))
        self.key = nn.Linear(d, f, bias=False)
        self.receptance = nn.Linear(d, d, bias=False)
        self.value = nn.Linear(f, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        check_sequence(x, "x", self.key.in_features, self.key.weight)
        shifted = token_shift(x)
        k = torch.relu(self.key(_mix(x, shifted, self.time_mix_key))) ** 2  # (batch, T, d_ff)
        r = torch.sigmoid(self.receptance(_mix(x, shifted, self.time_mix_receptance)))
        return r * self.value(k)


class RWKVBlock(nn.Module):
    """x + TimeMix(LN(x)), then x + ChannelMix(LN(x)); the first block also normalises its
    input (``pre_ln``). Shapes: (batch, T, d) -> (batch, T, d)."""

    def __init__(self, config: RWKVConfig, first: bool = False) -> None:
        super().__init__()
        d = config.d_model
        self.pre_ln = LayerNorm(d, eps=config.eps) if first else None
        self.ln1 = LayerNorm(d, eps=config.eps)
        self.ln2 = LayerNorm(d, eps=config.eps)
        self.attention = RWKVTimeMixing(d)
        self.feed_forward = RWKVChannelMixing(d, config.d_ff)

    def forward(self, x: Tensor) -> Tensor:
        if self.pre_ln is not None:
            x = self.pre_ln(x)
        x = x + self.attention(self.ln1(x))
        return x + self.feed_forward(self.ln2(x))


class RWKVLM(nn.Module):
    """An RWKV-4 language model: embeddings, blocks, LayerNorm, head.

    ``forward(ids)``: token ids (batch, T) -> logits (batch, T, V). Parameter names follow
    Hugging Face ``RwkvModel`` (``ln_out`` uses eps 1e-5, as there).
    """

    def __init__(self, config: RWKVConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(RWKVBlock(config, first=i == 0) for i in range(config.n_layers))
        self.ln_out = LayerNorm(config.d_model, eps=1e-5)
        self.head = None if config.tie_embeddings else nn.Linear(config.d_model, config.vocab_size,
                                                                 bias=False)

    def forward(self, ids: Tensor) -> Tensor:
        check_nonempty(check_token_ids(ids, "ids", ndim=2, vocab_size=self.embeddings.num_embeddings), "ids")
        x = self.embeddings(ids)
        for block in self.blocks:
            x = block(x)
        x = self.ln_out(x)
        head = self.embeddings.weight if self.head is None else self.head.weight
        return x @ head.T


def rwkv_from_hf(hf_model: Any) -> RWKVLM:
    """An :class:`RWKVLM` with the configuration and weights of a Hugging Face
    ``RwkvForCausalLM`` (in the dtype of its weights). Models whose
    ``attention_hidden_size`` differs from ``hidden_size`` are not supported."""
    c = hf_model.config
    att = c.attention_hidden_size if c.attention_hidden_size is not None else c.hidden_size
    if att != c.hidden_size:
        raise ValueError(f"attention_hidden_size {att} != hidden_size {c.hidden_size} is not supported")
    if c.rescale_every > 0 and getattr(hf_model.rwkv, "layers_are_rescaled", False):
        raise ValueError("the Hugging Face model has rescaled its layers (it ran in eval mode with "
                         "rescale_every > 0): load the weights before running it, or set rescale_every=0")
    config = RWKVConfig(vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                        d_ff=c.intermediate_size, eps=c.layer_norm_epsilon,
                        tie_embeddings=bool(c.tie_word_embeddings))
    sd = {}
    for key, value in hf_model.state_dict().items():
        key = key.removeprefix("rwkv.")
        if ".time_mix_" in key:
            value = value.reshape(-1)  # (1, 1, d) -> (d,)
        sd[key] = value
    if config.tie_embeddings:
        sd.pop("head.weight", None)
    model = RWKVLM(config).to(sd["embeddings.weight"].dtype)
    model.load_state_dict(sd, strict=True)
    return model
