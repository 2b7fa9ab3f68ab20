"""Reference solutions to the exercises of notebooks/23b_mamba2_ssd.

Checked by tests/test_solutions_23b.py.
"""

from __future__ import annotations

import torch
from torch import Tensor

from llmbook.inference.kvcache import kv_cache_bytes
from llmbook.scale.mamba2 import Mamba2Config
from llmbook.scale.ssd import ssd_chunked
from llmbook.transformer.model import TransformerConfig

# ---------------------------------------------------------------- exercise 1


def unnormalised_linear_attention(x: Tensor, B: Tensor, C: Tensor) -> Tensor:
    """y_t = sum_{s<=t} (C_t . B_s) x_s, i.e. y = tril(C B^T) x: the SSD with every a_t = 1
    (L becomes the causal mask of ones), and chapter 23.1's linear attention with
    phi(q) = C, phi(k) = B, v = x and no normaliser. Shapes: x (batch, T, H, P); B, C
    (batch, T, H, N), one group per head -> y (batch, T, H, P)."""
    T = x.shape[1]
    scores = torch.einsum("bthn,bshn->bhts", C, B) * torch.ones(T, T, dtype=x.dtype).tril()
    return torch.einsum("bhts,bshp->bthp", scores, x)


# ---------------------------------------------------------------- exercise 2


def streaming_ssd(x: Tensor, log_a: Tensor, B: Tensor, C: Tensor, piece: int,
                  chunk_size: int) -> tuple[Tensor, Tensor]:
    """Run :func:`ssd_chunked` on consecutive pieces of ``piece`` positions, each from the
    state the previous one left; return the concatenated outputs and the final state."""
    if piece < 1:
        raise ValueError(f"piece must be a positive length, got {piece}")
    state, ys = None, []
    for start in range(0, x.shape[1], piece):
        sl = slice(start, start + piece)
        y, state = ssd_chunked(x[:, sl], log_a[:, sl], B[:, sl], C[:, sl], chunk_size, initial_state=state)
        ys.append(y)
    return torch.cat(ys, dim=1), state


# ---------------------------------------------------------------- exercise 3


def mamba2_state_numbers(c: Mamba2Config, batch_size: int = 1) -> int:
    """Numbers in a decoding state: L B ((K - 1)(E + 2 G N) + H P N)."""
    return c.n_layers * batch_size * ((c.d_conv - 1) * c.conv_dim + c.n_heads * c.head_dim * c.d_state)


def breakeven_length(m2: Mamba2Config, tf: TransformerConfig, dtype: torch.dtype = torch.float32) -> int:
    """The smallest T at which a KV cache of ``tf`` holds more bytes than the state of ``m2``:
    2 L_tf T H_kv d_head > state bytes, so T = floor(state / per-token) + 1."""
    per_token = kv_cache_bytes(tf, 1, 1, dtype)
    state = mamba2_state_numbers(m2) * torch.empty((), dtype=dtype).element_size()
    return state // per_token + 1
