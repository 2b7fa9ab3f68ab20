"""The exercise solutions of notebooks/13_kv_cache hold."""


import pytest
from solution_loader import load_solutions

from llmbook.training.pretrained import RECIPES
from llmbook.transformer.model import TransformerConfig
from llmbook.transformer.sizing import flops_shares

solutions = load_solutions("13_kv_cache")


def test_max_batch() -> None:
    gib = 2**30
    # Llama 3 70B: 2 * 80 * 8192 * 8 * 128 * 2 bytes = 2.5 GiB per sequence -> 16 in 40 GiB
    assert solutions.max_batch(40 * gib, 80, 8, 128, 8192) == 16
    assert solutions.max_batch(40 * gib, 80, 64, 128, 8192) == 2  # MHA: 20 GiB each
    assert solutions.max_batch(40 * gib - 1, 80, 8, 128, 8192) == 15
    with pytest.raises(ValueError, match="budget"):
        solutions.max_batch(-1, 80, 8, 128, 8192)


@pytest.mark.parametrize("config", [
    TransformerConfig(**RECIPES["text"]["model"]),
    TransformerConfig.llama_style(),
])
def test_attention_crossover(config: TransformerConfig) -> None:
    T = solutions.attention_crossover(config)
    rest = lambda t: flops_shares(config, t)["total"] - flops_shares(config, t)["attention_scores"]  # noqa: E731
    assert flops_shares(config, T)["attention_scores"] >= rest(T)
    assert flops_shares(config, T - 1)["attention_scores"] < rest(T - 1)


def test_attention_crossover_values() -> None:
    # Llama 2 7B: 2N = 2 (32 * 4 * 4096^2 + 32 * 3 * 4096 * 11008 + 32000 * 4096)
    # = 13,214,154,752; attention per key 4 * 32 * 4096 = 524,288; the ratio is exactly 25,204
    assert solutions.attention_crossover(TransformerConfig.llama_style()) == 25_204


def test_mla_equivalent_kv_heads() -> None:
    assert solutions.mla_equivalent_kv_heads(512, 64, 128) == 2.25  # DeepSeek-V2's figure
    assert solutions.mla_equivalent_kv_heads(256, 0, 128) == 1.0


@pytest.mark.parametrize(("L", "W", "T"), [(1, 3, 20), (2, 3, 20), (3, 4, 30), (4, 2, 9), (2, 8, 10)])
def test_receptive_field(L: int, W: int, T: int) -> None:
    expected = min(solutions.receptive_field(L, W), T)
    assert solutions.reachable_positions(L, W, T) == expected


def test_decode_tokens_per_second_on_the_roofline() -> None:
    N, b, peak, bw = 6.74e9, 2, 989e12, 3.35e12  # Llama 2 7B in bf16 on an H100 SXM
    # B = 1: reading 13.48 GB at 3.35 TB/s takes 4.024 ms -> 248.5 tokens/s
    assert solutions.decode_tokens_per_second(N, 1, b, peak, bw) == pytest.approx(248.5, abs=0.1)
    B_star = solutions.roofline_batch(b, peak, bw)
    assert B_star == pytest.approx(295.22, abs=0.01)
    # memory-bound below B*: throughput grows linearly; compute-bound above: it stays at peak / 2N
    assert solutions.decode_tokens_per_second(N, 100, b, peak, bw) == pytest.approx(
        100 * solutions.decode_tokens_per_second(N, 1, b, peak, bw))
    flat = peak / (2 * N)
    for B in (296, 1000, 4096):
        assert solutions.decode_tokens_per_second(N, B, b, peak, bw) == pytest.approx(flat)
    below = solutions.decode_tokens_per_second(N, 295, b, peak, bw)
    assert below < flat and below == pytest.approx(295 * bw / (b * N))
    with pytest.raises(ValueError, match="batch"):
        solutions.decode_tokens_per_second(N, 0, b, peak, bw)


@pytest.mark.parametrize("lengths,prefix_len,page_size", [([1000] * 8, 600, 16), ([13, 9, 30], 9, 4),
                                                          ([5, 5], 0, 3), ([8, 12], 8, 4)])
def test_pages_with_prefix_against_a_page_pool(lengths, prefix_len, page_size) -> None:
    import torch

    from llmbook.inference.kvcache import PagedKVCache, PagePool

    pool = PagePool(n_layers=1, n_kv_heads=1, d_head=1, num_pages=1000, page_size=page_size)
    prompt = PagedKVCache(pool)
    if prefix_len:
        prompt.update(0, torch.zeros(1, 1, prefix_len, 1), torch.zeros(1, 1, prefix_len, 1))
        prompt.advance(prefix_len)
    for T in lengths:
        child = PagedKVCache.from_prefix(prompt, prefix_len)
        child.update(0, torch.zeros(1, 1, T - prefix_len, 1), torch.zeros(1, 1, T - prefix_len, 1))
    assert solutions.pages_with_prefix(lengths, prefix_len, page_size) == 1000 - pool.num_free
    with pytest.raises(ValueError, match="prefix_len"):
        solutions.pages_with_prefix([3], 5, 4)


def test_pages_with_prefix_worked_example() -> None:
    # 8 x 1000 tokens, prompt 600, pages of 16: 38 prompt pages (37 full, shared) + 8 x (63 - 37)
    assert solutions.pages_with_prefix([1000] * 8, 600, 16) == 38 + 8 * 26 == 246
    assert solutions.pages_with_prefix([1000] * 8, 0, 16) == 8 * 63 == 504
