"""Checks of chapter 13's exercises (notebooks/13_kv_cache), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are worked numbers (Llama 3 70B's and Llama 2 7B's caches and FLOPs, DeepSeek-V2's
2.25 heads, an H100's roofline), the book's ``flops_shares`` and a real ``PagePool``.
"""

from __future__ import annotations

import math

from llmbook.training.pretrained import RECIPES
from llmbook.transformer.model import TransformerConfig
from llmbook.transformer.sizing import flops_shares
from llmbook.workbench.checks import raises


def exercise_1_max_batch(solutions) -> None:
    gib = 2**30
    # Llama 3 70B: 2 * 80 * 8192 * 8 * 128 * 2 bytes = 2.5 GiB per sequence -> 16 in 40 GiB
    gqa = solutions.max_batch(40 * gib, 80, 8, 128, 8192)
    assert gqa == 16, f"expected 16 sequences of 2.5 GiB in 40 GiB (Llama 3 70B, 8 KV heads), got {gqa}"
    mha = solutions.max_batch(40 * gib, 80, 64, 128, 8192)
    assert mha == 2, f"expected 2 sequences of 20 GiB in 40 GiB (64 KV heads), got {mha}"
    short = solutions.max_batch(40 * gib - 1, 80, 8, 128, 8192)
    assert short == 15, f"expected 15 sequences in one byte under 40 GiB, got {short}"
    with raises(ValueError, match="budget", what="max_batch with a budget of -1 bytes"):
        solutions.max_batch(-1, 80, 8, 128, 8192)


def exercise_2_attention_crossover(solutions) -> None:
    for config in (TransformerConfig(**RECIPES["text"]["model"]), TransformerConfig.llama_style()):
        T = solutions.attention_crossover(config)
        shares, before = flops_shares(config, T), flops_shares(config, T - 1)
        scores, rest = shares["attention_scores"], shares["total"] - shares["attention_scores"]
        assert scores >= rest, (
            f"d_model = {config.d_model}: expected the attention scores to reach the rest's FLOPs "
            f"at T = {T}, got {scores:,} < {rest:,}")
        scores, rest = before["attention_scores"], before["total"] - before["attention_scores"]
        assert scores < rest, (
            f"d_model = {config.d_model}: expected the attention scores below the rest's FLOPs "
            f"at T - 1 = {T - 1} (T is the first length where they are not), got {scores:,} >= {rest:,}")


def exercise_2_attention_crossover_values(solutions) -> None:
    # Llama 2 7B: 2N = 2 (32 * 4 * 4096^2 + 32 * 3 * 4096 * 11008 + 32000 * 4096)
    # = 13,214,154,752; attention per key 4 * 32 * 4096 = 524,288; the ratio is exactly 25,204
    T = solutions.attention_crossover(TransformerConfig.llama_style())
    assert T == 25_204, f"expected 13,214,154,752 / 524,288 = 25,204 for Llama 2 7B, got {T}"


def exercise_3_mla_equivalent_kv_heads(solutions) -> None:
    v2 = solutions.mla_equivalent_kv_heads(512, 64, 128)
    assert v2 == 2.25, f"expected DeepSeek-V2's (512 + 64) / 256 = 2.25 heads, got {v2!r}"
    plain = solutions.mla_equivalent_kv_heads(256, 0, 128)
    assert plain == 1.0, f"expected a 256-wide latent without RoPE part = 1 head of 128, got {plain!r}"


def exercise_4_receptive_field(solutions) -> None:
    for L, W, T in ((1, 3, 20), (2, 3, 20), (3, 4, 30), (4, 2, 9), (2, 8, 10)):
        expected = min(solutions.receptive_field(L, W), T)
        got = solutions.reachable_positions(L, W, T)
        assert got == expected, (
            f"L = {L}, W = {W}, T = {T}: expected the mask product to reach "
            f"min(receptive_field, T) = {expected} positions, got {got}")


def exercise_5_decode_tokens_per_second_on_the_roofline(solutions) -> None:
    N, b, peak, bw = 6.74e9, 2, 989e12, 3.35e12  # Llama 2 7B in bf16 on an H100 SXM
    # B = 1: reading 13.48 GB at 3.35 TB/s takes 4.024 ms -> 248.5 tokens/s
    one = solutions.decode_tokens_per_second(N, 1, b, peak, bw)
    assert abs(one - 248.5) <= 0.1, f"expected 248.5 tokens/s at B = 1 (to 0.1), got {one!r}"
    B_star = solutions.roofline_batch(b, peak, bw)
    assert abs(B_star - 295.22) <= 0.01, f"expected the roofline batch 295.22 (to 0.01), got {B_star!r}"
    # memory-bound below B*: throughput grows linearly; compute-bound above: it stays at peak / 2N
    hundred = solutions.decode_tokens_per_second(N, 100, b, peak, bw)
    assert math.isclose(hundred, 100 * one, rel_tol=1e-6, abs_tol=1e-12), (
        f"expected 100 times the B = 1 throughput at B = 100 (memory-bound), {100 * one!r}, got {hundred!r}")
    flat = peak / (2 * N)
    for B in (296, 1000, 4096):
        got = solutions.decode_tokens_per_second(N, B, b, peak, bw)
        assert math.isclose(got, flat, rel_tol=1e-6, abs_tol=1e-12), (
            f"expected peak / 2N = {flat!r} tokens/s at B = {B} (compute-bound), got {got!r}")
    below = solutions.decode_tokens_per_second(N, 295, b, peak, bw)
    want = 295 * bw / (b * N)
    assert below < flat and math.isclose(below, want, rel_tol=1e-6, abs_tol=1e-12), (
        f"expected B = 295 to be memory-bound, 295 bw / (b N) = {want!r} < {flat!r}, got {below!r}")
    with raises(ValueError, match="batch", what="decode_tokens_per_second with batch 0"):
        solutions.decode_tokens_per_second(N, 0, b, peak, bw)


def exercise_6_pages_with_prefix_against_a_page_pool(solutions) -> None:
    import torch

    from llmbook.inference.kvcache import PagedKVCache, PagePool

    for lengths, prefix_len, page_size in (([1000] * 8, 600, 16), ([13, 9, 30], 9, 4),
                                           ([5, 5], 0, 3), ([8, 12], 8, 4)):
        pool = PagePool(n_layers=1, n_kv_heads=1, d_head=1, num_pages=1000, page_size=page_size)
        prompt = PagedKVCache(pool)
        if prefix_len:
            prompt.update(0, torch.zeros(1, 1, prefix_len, 1), torch.zeros(1, 1, prefix_len, 1))
            prompt.advance(prefix_len)
        for T in lengths:
            child = PagedKVCache.from_prefix(prompt, prefix_len)
            child.update(0, torch.zeros(1, 1, T - prefix_len, 1), torch.zeros(1, 1, T - prefix_len, 1))
        used = 1000 - pool.num_free
        got = solutions.pages_with_prefix(lengths, prefix_len, page_size)
        assert got == used, (
            f"lengths {lengths}, prefix {prefix_len}, pages of {page_size}: expected the {used} "
            f"pages a real PagePool allocates, got {got}")
    with raises(ValueError, match="prefix_len", what="pages_with_prefix([3], 5, 4) (prefix longer than a sequence)"):
        solutions.pages_with_prefix([3], 5, 4)


def exercise_6_pages_with_prefix_worked_example(solutions) -> None:
    # 8 x 1000 tokens, prompt 600, pages of 16: 38 prompt pages (37 full, shared) + 8 x (63 - 37)
    shared = solutions.pages_with_prefix([1000] * 8, 600, 16)
    assert shared == 38 + 8 * 26 == 246, f"expected 38 + 8 x 26 = 246 pages, got {shared}"
    alone = solutions.pages_with_prefix([1000] * 8, 0, 16)
    assert alone == 8 * 63 == 504, f"expected 8 x 63 = 504 pages without a shared prefix, got {alone}"
