"""Reference solutions to the exercises of notebooks/13_kv_cache."""

from __future__ import annotations

import math

import torch

from llmbook.inference.attention_variants import sliding_window_mask
from llmbook.transformer.model import TransformerConfig
from llmbook.transformer.sizing import flops_per_token


def max_batch(budget_bytes: int, n_layers: int, n_kv_heads: int, d_head: int, seq_len: int,
              bytes_per_element: int = 2) -> int:
    """Exercise 1: the largest B with 2 L B T H_kv d_h bytes <= budget."""
    per_sequence = 2 * n_layers * seq_len * n_kv_heads * d_head * bytes_per_element
    if per_sequence <= 0 or budget_bytes < 0:
        raise ValueError(f"need positive shapes and a budget >= 0, got per-sequence "
                         f"{per_sequence} bytes and budget {budget_bytes}")
    return budget_bytes // per_sequence


def attention_crossover(config: TransformerConfig) -> int:
    """Exercise 2: the smallest T with 4 L H d_h T >= 2 N in a cached step.

    2 N is the T-independent part of ``flops_per_token``: F(0) = F(T) - 4 L H d_h T.
    """
    per_key = 4 * config.n_layers * config.n_heads * config.d_head
    two_n = flops_per_token(config, 1) - per_key
    return math.ceil(two_n / per_key)


def mla_equivalent_kv_heads(d_latent: int, d_rope: int, d_head: int) -> float:
    """Exercise 3: H_kv with 2 H_kv d_h = d_c + d_R."""
    return (d_latent + d_rope) / (2 * d_head)


def receptive_field(n_layers: int, window: int) -> int:
    """Exercise 4: positions the last token can reach through L window-W layers: L(W-1)+1."""
    return n_layers * (window - 1) + 1


def reachable_positions(n_layers: int, window: int, T: int) -> int:
    """Exercise 4: compose the window mask L times (boolean matrix product); count the
    positions reachable from the last query."""
    mask = sliding_window_mask(T, T, window).to(torch.int64)  # (T, T)
    reach = torch.eye(T, dtype=torch.int64)
    for _ in range(n_layers):
        reach = ((mask @ reach) > 0).to(torch.int64)  # one more layer of attention
    return int(reach[-1].sum())


def decode_tokens_per_second(n_params: float, batch: int, bytes_per_param: float,
                             peak_flops: float, bandwidth: float) -> float:
    """Exercise 5: tokens/s of a decode step on the roofline, weights only.

    One step reads every weight once (b N bytes) and does 2 N FLOPs per sequence:
    t = max(2 N B / peak, b N / bandwidth); the batch emits B tokens in that time.
    """
    for name, value in (("n_params", n_params), ("batch", batch), ("bytes_per_param", bytes_per_param),
                        ("peak_flops", peak_flops), ("bandwidth", bandwidth)):
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")
    seconds = max(2 * n_params * batch / peak_flops, bytes_per_param * n_params / bandwidth)
    return batch / seconds


def roofline_batch(bytes_per_param: float, peak_flops: float, bandwidth: float) -> float:
    """Exercise 5: the batch at which 2 N B / peak = b N / bandwidth: B* = b peak / (2 bandwidth)."""
    return bytes_per_param * peak_flops / (2 * bandwidth)


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))


def pages_with_prefix(lengths: list[int], prefix_len: int, page_size: int) -> int:
    """Exercise 6: pages in use when requests share the pages of a common prompt.

    The prompt's cache holds ceil(S / P) pages. Each request shares its floor(S / P) full
    pages; the partly filled last page of the prompt (if S is not a multiple of P) is
    copied when the request first writes into it, so the request owns
    ceil(T / P) - floor(S / P) pages of its own.
    """
    if page_size < 1 or prefix_len < 0 or any(t < prefix_len for t in lengths):
        raise ValueError(f"need page_size >= 1 and every length >= prefix_len >= 0, got "
                         f"page_size={page_size}, prefix_len={prefix_len}, lengths={lengths}")
    shared = prefix_len // page_size
    return -(-prefix_len // page_size) + sum(-(-t // page_size) - shared for t in lengths)
