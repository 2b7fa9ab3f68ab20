"""Checks of chapter 14's exercises (notebooks/14_flash_attention), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are ``torch.logsumexp``/``softmax`` over the whole row, torch's
``scaled_dot_product_attention`` with the dense mask, the book's HBM access counts and
``flash_attention_masked``, and torch's ``flex_attention`` with its ``BlockMask``.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F

from llmbook.inference.flash import attention_hbm_accesses
from llmbook.workbench.checks import raises

F64 = torch.float64


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def _gap(a: torch.Tensor, b: torch.Tensor) -> str:
    return f"{float((a - b).abs().max()):.3g}" if a.shape == b.shape else f"shape {tuple(a.shape)}"


def exercise_1_merge_lse_states(solutions) -> None:
    s, v = 4 * _randn(3, 2, 17, seed=1), _randn(3, 17, 5, seed=2)
    parts = []
    for j0, j1 in ((0, 6), (6, 17)):
        parts.append((torch.logsumexp(s[..., j0:j1], -1), torch.softmax(s[..., j0:j1], -1)
                      @ v[..., j0:j1, :]))
    L, out = solutions.merge_lse_states(*parts)
    want_L, want_out = torch.logsumexp(s, -1), torch.softmax(s, -1) @ v
    assert torch.allclose(L, want_L, atol=1e-13, rtol=0), (
        f"expected the merged log-sum-exp to be that of the whole row (to 1e-13), off by {_gap(L, want_L)}")
    assert torch.allclose(out, want_out, atol=1e-13, rtol=0), (
        f"expected the merged output to be softmax(s) @ v over the whole row (to 1e-13), off by "
        f"{_gap(out, want_out)}")
    empty = (torch.full((3, 2), float("-inf"), dtype=F64), torch.zeros(3, 2, 5, dtype=F64))
    L2, O2 = solutions.merge_lse_states(empty, parts[0])
    assert torch.equal(L2, parts[0][0]) and torch.allclose(O2, parts[0][1], atol=1e-15, rtol=0), (
        "expected merging an empty state (L = -inf) with a state to return that state exactly, "
        f"off by {_gap(L2, parts[0][0])} in L and {_gap(O2, parts[0][1])} in the output")


def exercise_2_split_kv_attention(solutions) -> None:
    q, k, v = _randn(2, 1, 16, seed=3), _randn(2, 50, 16, seed=4), _randn(2, 50, 8, seed=5)
    want = F.scaled_dot_product_attention(q, k, v)
    for n_splits in (1, 3, 7, 50):
        out = solutions.split_kv_attention(q, k, v, n_splits)
        assert torch.allclose(out, want, atol=1e-13, rtol=0), (
            f"n_splits = {n_splits}: expected torch's scaled_dot_product_attention (to 1e-13), "
            f"off by {_gap(out, want)}")
        with raises(ValueError, match="n_splits", what="split_kv_attention with 51 splits of 50 keys"):
            solutions.split_kv_attention(q, k, v, 51)


def exercise_3_min_sram_for_saving(solutions) -> None:
    sram = solutions.min_sram_for_saving(4096, 64, 10.0)
    counts = attention_hbm_accesses(4096, 64, sram)
    smaller = attention_hbm_accesses(4096, 64, sram // 2)
    assert counts["standard"] >= 10 * counts["flash"], (
        f"expected a 10x saving in HBM accesses with {sram} elements of SRAM, got "
        f"{counts['standard'] / counts['flash']:.3f}x")
    assert smaller["standard"] < 10 * smaller["flash"], (
        f"expected less than a 10x saving with half of it, {sram // 2} (the answer is the smallest "
        f"power of two), got {smaller['standard'] / smaller['flash']:.3f}x")
    assert sram & (sram - 1) == 0 and sram == 131072, (
        f"expected the power of two 131072, got {sram}")
    with raises(ValueError, match="out of reach", what="min_sram_for_saving(64, 16, 1000.0)"):
        solutions.min_sram_for_saving(64, 16, 1000.0)


def exercise_4_sliding_window_flash(solutions) -> None:
    for T, window, block in ((50, 9, 8), (64, 16, 16), (40, 1, 8), (33, 40, 8)):
        q, k, v = _randn(2, T, 8, seed=6), _randn(2, T, 8, seed=7), _randn(2, T, 8, seed=8)
        out, tiles = solutions.sliding_window_flash(q, k, v, window, block)
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        mask = (j <= i) & (j > i - window)
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        case = f"T = {T}, window = {window}, block = {block}"
        assert torch.allclose(out, want, atol=1e-13, rtol=0), (
            f"{case}: expected torch's attention with the sliding-window mask (to 1e-13), "
            f"off by {_gap(out, want)}")
        n_blocks = math.ceil(T / block)
        causal = n_blocks * (n_blocks + 1) // 2
        assert tiles <= causal, f"{case}: expected at most the {causal} causal tiles, got {tiles}"
        if window <= block:
            assert tiles <= 2 * n_blocks, (  # the diagonal tile and at most one to its left
                f"{case}: expected at most 2 tiles per row of blocks, {2 * n_blocks}, got {tiles}")


def exercise_5_prefix_lm_mask_mod(solutions) -> None:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from llmbook.inference.flash import flash_attention_masked

    T = 64
    for prefix in (0, 20, 37):
        mask_mod = solutions.prefix_lm_mask_mod(prefix)
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        dense = torch.ones(T, T, dtype=torch.bool).tril()
        dense[:, :prefix] = True  # the prompt is seen by every query, in both directions
        q, k, v = _randn(1, 2, T, 8, seed=9), _randn(1, 2, T, 8, seed=10), _randn(1, 2, T, 8, seed=11)
        blocks: dict[str, int] = {}
        out = flash_attention_masked(q, k, v, mask_mod, 16, 16, blocks=blocks)
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
        assert torch.allclose(out, want, atol=1e-12, rtol=0), (
            f"prefix = {prefix}: expected the book's masked FlashAttention with your mask_mod to "
            f"equal torch's attention with the dense prefix-LM mask (to 1e-12), off by {_gap(out, want)}")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            block_mask = create_block_mask(mask_mod, None, None, T, T, device="cpu", BLOCK_SIZE=16)
            flex = flex_attention(q, k, v, block_mask=block_mask)
        assert torch.allclose(flex, out, atol=1e-12, rtol=0), (
            f"prefix = {prefix}: expected torch's flex_attention with your mask_mod to agree (to "
            f"1e-12), off by {_gap(flex, out)}")
        partial, full = int(block_mask.kv_num_blocks.sum()), int(block_mask.full_kv_num_blocks.sum())
        assert blocks["partial"] == partial, (
            f"prefix = {prefix}: expected {partial} partial blocks as flex's BlockMask, got {blocks['partial']}")
        assert blocks["full"] == full, (
            f"prefix = {prefix}: expected {full} full blocks as flex's BlockMask, got {blocks['full']}")
        got = mask_mod(torch.tensor(0), torch.tensor(0), i, j)
        assert torch.equal(got, dense), (
            f"prefix = {prefix}: expected mask_mod(b, h, i, j) on the grid to be the dense "
            f"prefix-LM mask, it differs at {int((got != dense).sum())} places")
    with raises(ValueError, match="prefix", what="prefix_lm_mask_mod(-1)"):
        solutions.prefix_lm_mask_mod(-1)
