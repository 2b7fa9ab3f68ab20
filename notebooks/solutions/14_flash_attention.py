"""Reference solutions to the exercises of notebooks/14_flash_attention (checked by
tests/test_solutions_14.py)."""

from __future__ import annotations

import math

import torch

from llmbook.inference.flash import attention_hbm_accesses, merge_softmax_states, softmax_state

# ---------------------------------------------------------------- exercise 1


def merge_lse_states(a: tuple[torch.Tensor, torch.Tensor],
                     b: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 1: merge two *normalised* partial results (L, O) of disjoint key blocks.

    A block summarised by its log-sum-exp L = m + log l (...) and its normalised output
    O = o / l (..., d_v) has l = e^(L - m) and o = l O; substituting into the merge rule and
    dividing by the merged l gives

        L = log(e^L1 + e^L2),   O = e^(L1 - L) O1 + e^(L2 - L) O2,

    a convex combination of the two outputs (the weights are each block's share of the
    softmax mass). ``torch.logaddexp`` keeps the first formula finite; an empty block
    (L = -inf) gets weight 0.
    """
    (L1, O1), (L2, O2) = a, b
    L = torch.logaddexp(L1, L2)  # (...)
    L_safe = torch.where(torch.isneginf(L), torch.zeros_like(L), L)
    w1, w2 = torch.exp(L1 - L_safe), torch.exp(L2 - L_safe)  # sum to 1
    return L, w1.unsqueeze(-1) * O1 + w2.unsqueeze(-1) * O2


# ---------------------------------------------------------------- exercise 2


def split_kv_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       n_splits: int) -> torch.Tensor:
    """Exercise 2: attention of a few queries over a long KV cache, split along the keys.

    q (..., T_q, d), k (..., T_k, d), v (..., T_k, d_v). The keys are cut into ``n_splits``
    contiguous chunks; each chunk's (L, O) is computed independently (on a GPU, by a
    different program: this is the idea of split-KV "flash decoding", which keeps the GPU
    busy when T_q is 1), and the chunks are merged with :func:`merge_lse_states`.
    """
    T_k = k.shape[-2]
    if not 1 <= n_splits <= T_k:
        raise ValueError(f"n_splits must be in [1, T_k={T_k}], got {n_splits}")
    scale = 1.0 / math.sqrt(q.shape[-1])
    edges = [round(i * T_k / n_splits) for i in range(n_splits + 1)]
    state = None
    for j0, j1 in zip(edges, edges[1:], strict=False):
        s = scale * q @ k[..., j0:j1, :].transpose(-2, -1)  # (..., T_q, chunk)
        L = torch.logsumexp(s, dim=-1)
        out = torch.softmax(s, dim=-1) @ v[..., j0:j1, :]  # (..., T_q, d_v)
        state = (L, out) if state is None else merge_lse_states(state, (L, out))
    return state[1]


# ---------------------------------------------------------------- exercise 3


def min_sram_for_saving(T: int, d: int, ratio: float) -> int:
    """Exercise 3: the smallest SRAM (a power of two, in elements) at which the tiled forward
    moves at most 1/ratio of the standard algorithm's HBM traffic, per
    :func:`llmbook.inference.flash.attention_hbm_accesses`. Starts at 4 d, the least that works."""
    sram = 1 << (4 * d - 1).bit_length()  # the smallest power of two >= 4 d
    while True:
        counts = attention_hbm_accesses(T, d, sram)
        if counts["standard"] >= ratio * counts["flash"]:
            return sram
        if counts["block_q"] >= T:  # one query block already: no larger SRAM helps
            raise ValueError(f"a saving of {ratio}x is out of reach for T={T}, d={d}")
        sram *= 2


# ---------------------------------------------------------------- exercise 4


def sliding_window_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                         block: int = 16) -> tuple[torch.Tensor, int]:
    """Exercise 4: tiled causal attention where query i sees keys i - window < j <= i.

    q, k, v (..., T, d). Tiles whose keys all lie outside every row's window are skipped:
    for the query block [i0, i1) only key blocks overlapping [i0 - window + 1, i1) are
    visited. Returns the output and the number of tiles visited, which grows like
    T (window / block + 1) / block instead of T^2 / (2 block^2).
    """
    T = q.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    outs, tiles = [], 0
    for i0 in range(0, T, block):
        i1 = min(i0 + block, T)
        first = max(0, i0 - window + 1) // block * block
        m = torch.full(q[..., i0:i1, 0].shape, float("-inf"), dtype=q.dtype)
        ell = torch.zeros_like(m)
        o = torch.zeros(*m.shape, v.shape[-1], dtype=q.dtype)
        for j0 in range(first, i1, block):
            j1 = min(j0 + block, T)
            tiles += 1
            s = scale * q[..., i0:i1, :] @ k[..., j0:j1, :].transpose(-2, -1)
            i = torch.arange(i0, i1)[:, None]
            j = torch.arange(j0, j1)[None, :]
            s = s.masked_fill(~((j <= i) & (j > i - window)), float("-inf"))
            # a row may have no key of its window in this tile: the state's -inf-safe merge
            m, ell, o = merge_softmax_states((m, ell, o), softmax_state(s, v[..., j0:j1, :]))
        outs.append(o / ell.unsqueeze(-1))
    return torch.cat(outs, dim=-2), tiles


# ---------------------------------------------------------------- exercise 5


def prefix_lm_mask_mod(prefix: int):
    """Exercise 5: the prefix-LM mask (Raffel et al., 2020) as a ``mask_mod``.

    Every query sees the whole prefix of ``prefix`` positions (bidirectional attention over
    the prompt) and, after it, attends causally: key j is visible to query i when j < prefix
    or j <= i. Usable by :func:`llmbook.inference.flash.flash_attention_masked` and by
    ``torch.nn.attention.flex_attention.create_block_mask``.
    """
    if isinstance(prefix, bool) or not isinstance(prefix, int) or prefix < 0:
        raise ValueError(f"prefix must be a non-negative int, got {prefix!r}")

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx < prefix) | (kv_idx <= q_idx)

    return mask_mod


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))
