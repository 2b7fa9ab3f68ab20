"""The exercise solutions of notebooks/14_flash_attention hold."""

import math

import pytest
import torch
import torch.nn.functional as F
from solution_loader import load_solutions

from llmbook.inference.flash import attention_hbm_accesses

solutions = load_solutions("14_flash_attention")

F64 = torch.float64


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def test_exercise_1_merge_lse_states():
    s, v = 4 * _randn(3, 2, 17, seed=1), _randn(3, 17, 5, seed=2)
    parts = []
    for j0, j1 in ((0, 6), (6, 17)):
        parts.append((torch.logsumexp(s[..., j0:j1], -1), torch.softmax(s[..., j0:j1], -1)
                      @ v[..., j0:j1, :]))
    L, out = solutions.merge_lse_states(*parts)
    assert torch.allclose(L, torch.logsumexp(s, -1), atol=1e-13, rtol=0)
    assert torch.allclose(out, torch.softmax(s, -1) @ v, atol=1e-13, rtol=0)
    empty = (torch.full((3, 2), float("-inf"), dtype=F64), torch.zeros(3, 2, 5, dtype=F64))
    L2, O2 = solutions.merge_lse_states(empty, parts[0])
    assert torch.equal(L2, parts[0][0]) and torch.allclose(O2, parts[0][1], atol=1e-15, rtol=0)


@pytest.mark.parametrize("n_splits", [1, 3, 7, 50])
def test_exercise_2_split_kv_attention(n_splits):
    q, k, v = _randn(2, 1, 16, seed=3), _randn(2, 50, 16, seed=4), _randn(2, 50, 8, seed=5)
    out = solutions.split_kv_attention(q, k, v, n_splits)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v), atol=1e-13, rtol=0)
    with pytest.raises(ValueError, match="n_splits"):
        solutions.split_kv_attention(q, k, v, 51)


def test_exercise_3_min_sram_for_saving():
    sram = solutions.min_sram_for_saving(4096, 64, 10.0)
    counts = attention_hbm_accesses(4096, 64, sram)
    smaller = attention_hbm_accesses(4096, 64, sram // 2)
    assert counts["standard"] >= 10 * counts["flash"]
    assert smaller["standard"] < 10 * smaller["flash"]
    assert sram & (sram - 1) == 0 and sram == 131072
    with pytest.raises(ValueError, match="out of reach"):
        solutions.min_sram_for_saving(64, 16, 1000.0)


@pytest.mark.parametrize("T,window,block", [(50, 9, 8), (64, 16, 16), (40, 1, 8), (33, 40, 8)])
def test_exercise_4_sliding_window_flash(T, window, block):
    q, k, v = _randn(2, T, 8, seed=6), _randn(2, T, 8, seed=7), _randn(2, T, 8, seed=8)
    out, tiles = solutions.sliding_window_flash(q, k, v, window, block)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    mask = (j <= i) & (j > i - window)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                          atol=1e-13, rtol=0)
    n_blocks = math.ceil(T / block)
    assert tiles <= n_blocks * (n_blocks + 1) // 2
    if window <= block:
        assert tiles <= 2 * n_blocks  # the diagonal tile and at most one to its left


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("prefix", [0, 20, 37])
def test_exercise_5_prefix_lm_mask_mod(prefix):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from llmbook.inference.flash import flash_attention_masked

    T = 64
    mask_mod = solutions.prefix_lm_mask_mod(prefix)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    dense = torch.ones(T, T, dtype=torch.bool).tril()
    dense[:, :prefix] = True  # the prompt is seen by every query, in both directions
    q, k, v = _randn(1, 2, T, 8, seed=9), _randn(1, 2, T, 8, seed=10), _randn(1, 2, T, 8, seed=11)
    blocks = {}
    out = flash_attention_masked(q, k, v, mask_mod, 16, 16, blocks=blocks)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, attn_mask=dense),
                          atol=1e-12, rtol=0)
    block_mask = create_block_mask(mask_mod, None, None, T, T, device="cpu", BLOCK_SIZE=16)
    assert torch.allclose(flex_attention(q, k, v, block_mask=block_mask), out, atol=1e-12, rtol=0)
    assert blocks["partial"] == int(block_mask.kv_num_blocks.sum())
    assert blocks["full"] == int(block_mask.full_kv_num_blocks.sum())
    assert torch.equal(mask_mod(torch.tensor(0), torch.tensor(0), i, j), dense)
    with pytest.raises(ValueError, match="prefix"):
        solutions.prefix_lm_mask_mod(-1)
