"""A Mamba-2 language model with a chunked (SSD) forward pass and constant-state decoding.

The block of Dao & Gu (2024, "Transformers are SSMs", section 7, Figure 6): one input
projection gives the gate z, the signal x, B, C (G groups of N) and one Delta per head;
x, B and C go through a short causal depthwise convolution and SiLU; the scalar-decay SSM of
:mod:`llmbook.scale.ssd` runs per head with a_t = exp(Delta_t A), input Delta_t x_t and a skip
D x_t; a gated, grouped RMSNorm norm(y * silu(z)) and the output projection finish.

Parameter names follow Hugging Face ``Mamba2ForCausalLM`` (:func:`mamba2_from_hf` loads its
state dict). Decoding (:meth:`Mamba2LM.step`) carries, per layer, a convolution state of the
last K - 1 inputs of the convolution and an SSM state (H, P, N): a fixed number of bytes
whatever the number of tokens seen (:func:`state_bytes`), where a KV cache grows by a fixed
amount per token.

Introduced in notebooks/23b_mamba2_ssd.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from llmbook.scale.ssd import ssd_chunked, ssd_recurrent, ssd_step
from llmbook.scale.ssm import CausalDepthwiseConv1d
from llmbook.transformer.layers import RMSNorm
from llmbook.validation import (
    check_nonempty,
    check_positive_int,
    check_positive_number,
    check_sequence,
    check_token_ids,
)

__all__ = ["GatedRMSNorm", "Mamba2Block", "Mamba2Config", "Mamba2LM", "Mamba2Mixer", "Mamba2State",
           "mamba2_from_hf", "state_bytes"]

Mamba2State = list[tuple[Tensor, Tensor]]
"""Per layer: (conv state (batch, K - 1, conv_dim), SSM state (batch, H, P, N))."""


@dataclass
class Mamba2Config:
    """Sizes of a Mamba-2 model (Hugging Face ``Mamba2Config`` names in brackets).

    ``d_model`` (hidden_size), ``n_layers`` (num_hidden_layers), ``d_state`` N (state_size),
    ``expand`` (E = expand * d_model channels), ``head_dim`` P (head_dim; H = E / P heads),
    ``n_groups`` G of B and C (n_groups, dividing H), ``d_conv`` (conv_kernel),
    ``chunk_size`` Q of the SSD algorithm, ``bias`` (use_bias), ``conv_bias`` (use_conv_bias).
    """

    vocab_size: int
    d_model: int = 64
    n_layers: int = 2
    d_state: int = 16
    expand: int = 2
    head_dim: int = 16
    n_groups: int = 1
    d_conv: int = 4
    chunk_size: int = 64
    bias: bool = False
    conv_bias: bool = True
    eps: float = 1e-5
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "d_state", "expand", "head_dim", "n_groups",
                     "d_conv", "chunk_size"):
            check_positive_int(name, getattr(self, name))
        check_positive_number("eps", self.eps)
        if self.d_inner % self.head_dim != 0:
            raise ValueError(f"head_dim={self.head_dim} must divide expand * d_model = {self.d_inner}")
        if self.n_heads % self.n_groups != 0:
            raise ValueError(f"n_groups={self.n_groups} must divide the number of heads {self.n_heads}")

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def n_heads(self) -> int:
        return self.d_inner // self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels through the convolution: x (E), B and C (G N each)."""
        return self.d_inner + 2 * self.n_groups * self.d_state


class GatedRMSNorm(nn.Module):
    """RMSNorm of y * silu(z) over groups of ``group_size`` channels, then a gain (Mamba-2).

    Computed in (at least) float32 as Hugging Face ``MambaRMSNormGated``. Shapes: y, z
    (..., d) -> (..., d).
    """

    def __init__(self, d: int, group_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.d, self.group_size = check_positive_int("d", d), check_positive_int("group_size", group_size)
        if d % group_size != 0:
            raise ValueError(f"group_size={group_size} must divide d={d}")
        self.eps = check_positive_number("eps", eps)
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, y: Tensor, z: Tensor) -> Tensor:
        dtype = y.dtype
        h = y.to(torch.promote_types(dtype, torch.float32))
        h = h * F.silu(z.to(h.dtype))
        g = h.unflatten(-1, (self.d // self.group_size, self.group_size))
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * g.flatten(-2).to(dtype)


class Mamba2Mixer(nn.Module):
    """The Mamba-2 mixer on (batch, T, d_model).

        z, xBC, dt = in_proj(h) split into E, E + 2 G N, H
        x, B, C    = silu(causal depthwise conv(xBC)) split into E, G N, G N
        Delta      = softplus(dt + dt_bias)                    (batch, T, H), one per head
        y          = SSD(x Delta, log a = Delta A, B, C) + D x,  A = -exp(A_log) (H,)
        out        = out_proj(GatedRMSNorm(y, z))

    ``method``: "chunked" (:func:`~llmbook.scale.ssd.ssd_chunked`) or "recurrent"
    (:func:`~llmbook.scale.ssd.ssd_recurrent`).
    """

    def __init__(self, config: Mamba2Config, method: str = "chunked") -> None:
        super().__init__()
        c = self.config = config
        if method not in ("chunked", "recurrent"):
            raise ValueError(f"method must be 'chunked' or 'recurrent', got {method!r}")
        self.method = method
        H = c.n_heads
        self.in_proj = nn.Linear(c.d_model, c.d_inner + c.conv_dim + H, bias=c.bias)
        self.conv1d = CausalDepthwiseConv1d(c.conv_dim, c.d_conv, bias=c.conv_bias)
        self.dt_bias = nn.Parameter(torch.zeros(H))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, H + 1, dtype=torch.float32)))
        self.D = nn.Parameter(torch.ones(H))
        self.norm = GatedRMSNorm(c.d_inner, c.d_inner // c.n_groups, eps=c.eps)
        self.out_proj = nn.Linear(c.d_inner, c.d_model, bias=c.bias)

    def _ssm_inputs(self, xBC: Tensor, dt: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(..., conv_dim), (..., H) after the convolution -> x (..., H, P), Delta, log a, B, C."""
        c = self.config
        x, B, C = F.silu(xBC).split([c.d_inner, c.n_groups * c.d_state, c.n_groups * c.d_state], dim=-1)
        delta = F.softplus(dt + self.dt_bias)  # (..., H)
        A = -torch.exp(self.A_log)  # (H,)
        x = x.unflatten(-1, (c.n_heads, c.head_dim))
        return (x, delta, delta * A, B.unflatten(-1, (c.n_groups, c.d_state)),
                C.unflatten(-1, (c.n_groups, c.d_state)))

    def forward(self, h: Tensor, return_state: bool = False) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]]:
        """(batch, T, d_model) -> (batch, T, d_model); with ``return_state`` also the decoding
        state after the last position (conv state, SSM state)."""
        check_sequence(h, "h", self.in_proj.in_features, self.in_proj.weight)
        c = self.config
        z, xBC, dt = self.in_proj(h).split([c.d_inner, c.conv_dim, c.n_heads], dim=-1)
        x, delta, log_a, B, C = self._ssm_inputs(self.conv1d(xBC), dt)
        xd = x * delta[..., None]
        if self.method == "chunked":
            y, ssm_state = ssd_chunked(xd, log_a, B, C, c.chunk_size)
        else:
            y, ssm_state = ssd_recurrent(xd, log_a, B, C)
        y = (y + self.D[:, None] * x).flatten(-2)  # (batch, T, E)
        out = self.out_proj(self.norm(y, z))
        if not return_state:
            return out
        padded = F.pad(xBC, (0, 0, c.d_conv - 1, 0))  # zeros before t = 0, as the convolution
        conv_state = padded[:, padded.shape[1] - (c.d_conv - 1):]  # its last K - 1 inputs
        return out, (conv_state, ssm_state)

    def init_state(self, batch_size: int, dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
        """Zero decoding state: conv (batch, K - 1, conv_dim), SSM (batch, H, P, N)."""
        c, batch_size = self.config, check_positive_int("batch_size", batch_size)
        dtype = dtype or self.in_proj.weight.dtype
        return (torch.zeros(batch_size, c.d_conv - 1, c.conv_dim, dtype=dtype),
                torch.zeros(batch_size, c.n_heads, c.head_dim, c.d_state, dtype=dtype))

    def step(self, h: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """One token: h (batch, d_model) and the state -> output (batch, d_model), new state.

        O(1) in the number of tokens seen: the convolution reads its K - 1 stored inputs and
        the new one, the SSM does one :func:`~llmbook.scale.ssd.ssd_step`.
        """
        c = self.config
        if not isinstance(h, Tensor) or h.ndim != 2 or h.shape[-1] != c.d_model:
            raise ValueError(f"h must have shape (batch, {c.d_model}), got "
                             f"{tuple(h.shape) if isinstance(h, Tensor) else type(h).__name__}")
        conv_state, ssm_state = state
        if conv_state.shape != (h.shape[0], c.d_conv - 1, c.conv_dim):
            raise ValueError(f"conv state must have shape {(h.shape[0], c.d_conv - 1, c.conv_dim)}, "
                             f"got {tuple(conv_state.shape)}")
        z, xBC, dt = self.in_proj(h).split([c.d_inner, c.conv_dim, c.n_heads], dim=-1)
        window = torch.cat([conv_state, xBC[:, None]], dim=1)  # (batch, K, conv_dim)
        conv = (window * self.conv1d.weight[:, 0].T).sum(1)
        if self.conv1d.bias is not None:
            conv = conv + self.conv1d.bias
        x, delta, log_a, B, C = self._ssm_inputs(conv, dt)
        y, ssm_state = ssd_step(ssm_state, x * delta[..., None], log_a, B, C)
        y = (y + self.D[:, None] * x).flatten(-2)
        return self.out_proj(self.norm(y, z)), (window[:, 1:], ssm_state)


class Mamba2Block(nn.Module):
    """h + mixer(RMSNorm(h)). Shapes: (batch, T, d) -> (batch, T, d)."""

    def __init__(self, config: Mamba2Config, method: str = "chunked") -> None:
        super().__init__()
        self.norm = RMSNorm(config.d_model, eps=config.eps)
        self.mixer = Mamba2Mixer(config, method)

    def forward(self, h: Tensor) -> Tensor:
        return h + self.mixer(self.norm(h))


class Mamba2LM(nn.Module):
    """Embeddings, ``n_layers`` :class:`Mamba2Block`, RMSNorm, LM head (names as ``Mamba2Model``).

    ``forward(ids)``: (batch, T) -> logits (batch, T, V). ``prefill(ids)`` also returns the
    decoding state; ``step(ids, state)`` takes one token per sequence (batch,) and returns
    logits (batch, V) and the next state.
    """

    def __init__(self, config: Mamba2Config, method: str = "chunked") -> None:
        super().__init__()
        self.config = config
        self.embeddings = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Mamba2Block(config, method) for _ in range(config.n_layers))
        self.norm_f = RMSNorm(config.d_model, eps=config.eps)
        self.lm_head = None if config.tie_embeddings else nn.Linear(config.d_model, config.vocab_size,
                                                                    bias=False)

    def _logits(self, h: Tensor) -> Tensor:
        head = self.embeddings.weight if self.lm_head is None else self.lm_head.weight
        return self.norm_f(h) @ head.T

    def forward(self, ids: Tensor) -> Tensor:
        check_nonempty(check_token_ids(ids, "ids", ndim=2, vocab_size=self.config.vocab_size), "ids")
        h = self.embeddings(ids)
        for layer in self.layers:
            h = layer(h)
        return self._logits(h)

    def prefill(self, ids: Tensor) -> tuple[Tensor, Mamba2State]:
        """The whole prompt at once (chunked): logits (batch, T, V) and the state after it."""
        check_nonempty(check_token_ids(ids, "ids", ndim=2, vocab_size=self.config.vocab_size), "ids")
        h, state = self.embeddings(ids), []
        for layer in self.layers:
            out, s = layer.mixer(layer.norm(h), return_state=True)
            h = h + out
            state.append(s)
        return self._logits(h), state

    def step(self, ids: Tensor, state: Mamba2State) -> tuple[Tensor, Mamba2State]:
        """One token per sequence: ``ids`` (batch,) -> logits (batch, V) and the next state."""
        check_token_ids(ids, "ids", ndim=1, vocab_size=self.config.vocab_size)
        if not isinstance(state, list) or len(state) != len(self.layers):
            raise ValueError(f"state must be a list of {len(self.layers)} per-layer (conv, ssm) pairs")
        h, new_state = self.embeddings(ids), []
        for layer, s in zip(self.layers, state, strict=True):
            out, s = layer.mixer.step(layer.norm(h), s)
            h = h + out
            new_state.append(s)
        return self._logits(h), new_state

    def init_state(self, batch_size: int) -> Mamba2State:
        """The zero state (no tokens seen) of every layer."""
        return [layer.mixer.init_state(batch_size) for layer in self.layers]


def state_bytes(state: Mamba2State) -> int:
    """Bytes held by a decoding state: the sum over layers of its two tensors."""
    if not isinstance(state, list) or not all(isinstance(s, tuple) and len(s) == 2 for s in state):
        raise TypeError("state must be a list of per-layer (conv state, ssm state) tuples")
    return sum(t.numel() * t.element_size() for s in state for t in s)


def mamba2_from_hf(hf_model: Any, method: str = "chunked") -> Mamba2LM:
    """A :class:`Mamba2LM` with the configuration and weights of a Hugging Face
    ``Mamba2ForCausalLM`` (in the dtype of its weights). Its ``time_step_limit`` must be
    (0, inf) (no clamp of Delta) and its activation SiLU."""
    c = hf_model.config
    if tuple(c.time_step_limit) != (0.0, math.inf) or c.hidden_act != "silu":
        raise ValueError(f"unsupported: time_step_limit={c.time_step_limit}, hidden_act={c.hidden_act!r}")
    config = Mamba2Config(vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                          d_state=c.state_size, expand=c.expand, head_dim=c.head_dim, n_groups=c.n_groups,
                          d_conv=c.conv_kernel, chunk_size=c.chunk_size, bias=c.use_bias,
                          conv_bias=c.use_conv_bias, eps=c.layer_norm_epsilon,
                          tie_embeddings=bool(c.tie_word_embeddings))
    if config.n_heads != c.num_heads:
        raise ValueError(f"num_heads {c.num_heads} != expand * hidden_size / head_dim = {config.n_heads}")
    sd = {k.removeprefix("backbone."): v for k, v in hf_model.state_dict().items()}
    if config.tie_embeddings:
        sd.pop("lm_head.weight", None)
    model = Mamba2LM(config, method).to(sd["embeddings.weight"].dtype)
    model.load_state_dict(sd, strict=True)
    return model
