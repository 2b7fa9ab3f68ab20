"""Tests of llmbook.inference.kvcache and the cache path of TransformerLM / MultiHeadAttention."""

import pytest
import torch

from llmbook.inference.kvcache import KVCache, kv_cache_bytes
from llmbook.inference.sampling import generate
from llmbook.transformer.model import TransformerConfig, TransformerLM

V = 37


pytestmark = pytest.mark.usefixtures("one_thread")


def _configs(fused: bool) -> list[TransformerConfig]:
    return [
        TransformerConfig.gpt2_style(vocab_size=V, d_model=48, n_layers=2, n_heads=4,
                                     max_seq_len=40, fused_attention=fused),
        TransformerConfig.llama_style(vocab_size=V, d_model=48, n_layers=3, n_heads=6,
                                      n_kv_heads=2, max_seq_len=40, fused_attention=fused),
    ]


def _model(config: TransformerConfig) -> TransformerLM:
    return TransformerLM(config, generator=torch.Generator().manual_seed(1)).eval()


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("which", [0, 1], ids=["gpt2", "llama_gqa"])
def test_cached_logits_equal_full_forward(fused: bool, which: int) -> None:
    model = _model(_configs(fused)[which])
    ids = torch.randint(0, V, (3, 23), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(ids)  # (3, 23, V)
        cache = KVCache.for_model(model, batch_size=3)
        pieces = [model(ids[:, a:b], cache=cache) for a, b in ((0, 7), (7, 8), (8, 13), (13, 23))]
    assert cache.length == 23
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("which", [0, 1], ids=["gpt2", "llama_gqa"])
def test_greedy_generation_identical_with_and_without_cache(which: int) -> None:
    model = _model(_configs(True)[which])
    prompt = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(3))
    a = generate(model, prompt, 30, temperature=0, use_cache=True)
    b = generate(model, prompt, 30, temperature=0, use_cache=False)
    assert a.shape == (2, 35)
    assert torch.equal(a, b)
    # sampled generation too: the same generator state gives the same tokens
    s1 = generate(model, prompt, 30, top_k=10, top_p=0.9, generator=torch.Generator().manual_seed(4))
    s2 = generate(model, prompt, 30, top_k=10, top_p=0.9, use_cache=False,
                  generator=torch.Generator().manual_seed(4))
    assert torch.equal(s1, s2)


def test_bytes_closed_form_matches_tensors() -> None:
    for config in _configs(True):
        for dtype in (torch.float32, torch.bfloat16):
            cache = KVCache(config.n_layers, 3, config.n_kv_heads, 29, config.d_head, dtype=dtype)
            assert cache.num_bytes() == kv_cache_bytes(config, 3, 29, dtype)
    c = _configs(True)[1]  # L=3, H_kv=2, d_head=8: 2*3*3*29*2*8*4
    assert kv_cache_bytes(c, 3, 29) == 2 * 3 * 3 * 29 * 2 * 8 * 4 == 33408


def test_update_returns_everything_cached_and_reset() -> None:
    cache = KVCache(n_layers=2, batch_size=2, n_kv_heads=3, max_seq_len=10, d_head=4)
    k1, v1 = torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 4)
    ka, va = cache.update(1, k1, v1)
    assert ka.shape == (2, 3, 6, 4) and torch.equal(ka, k1) and torch.equal(va, v1)
    cache.advance(6)
    k2 = torch.randn(2, 3, 1, 4)
    ka, _ = cache.append(1, k2, k2)
    assert ka.shape == (2, 3, 7, 4) and torch.equal(ka[:, :, :6], k1) and torch.equal(ka[:, :, 6:], k2)
    cache.advance(1)
    cache.truncate(3)
    assert cache.length == 3
    cache.reset()
    assert cache.length == 0
    assert "length=0/10" in repr(cache)


def test_positions_default_to_cache_length_for_rope() -> None:
    model = _model(_configs(True)[1])
    ids = torch.randint(0, V, (1, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        cache = KVCache.for_model(model, 1)
        model(ids[:, :4], cache=cache)
        explicit = KVCache.for_model(model, 1)
        model(ids[:, :4], cache=explicit)
        a = model(ids[:, 4:], cache=cache)
        b = model(ids[:, 4:], positions=torch.arange(4, 9), cache=explicit)
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_errors() -> None:
    model = _model(_configs(True)[0])
    cache = KVCache.for_model(model, batch_size=2, max_seq_len=12)
    with pytest.raises(ValueError, match="10 cached \\+ 5 new tokens = 15 exceed"):
        cache.length = 10
        model(torch.zeros(2, 5, dtype=torch.long), cache=cache)
    cache.reset()
    with pytest.raises(ValueError, match="does not fit this model and batch"):
        model(torch.zeros(3, 2, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="exceeds the model's context length"):
        KVCache.for_model(model, 1, max_seq_len=41)
    with pytest.raises(ValueError, match="layer must be"):
        cache.update(5, torch.zeros(2, 4, 1, 12), torch.zeros(2, 4, 1, 12))
    with pytest.raises(ValueError, match="must have shape \\(B, H_kv, T, d_head\\)"):
        cache.update(0, torch.zeros(2, 3, 1, 12), torch.zeros(2, 3, 1, 12))
    with pytest.raises(ValueError, match="do not fit"):
        cache.update(0, torch.zeros(2, 4, 13, 12), torch.zeros(2, 4, 13, 12))
    with pytest.raises(ValueError, match="length must be"):
        cache.truncate(1)
    with pytest.raises(ValueError, match="batch_size must be positive"):
        KVCache(1, 0, 1, 1, 1)
    with pytest.raises(ValueError, match="batch_size must be positive"):
        kv_cache_bytes(_configs(True)[0], 0, 3)


@pytest.mark.parametrize("fused", [True, False])
def test_attention_with_cache_and_padding_mask(fused: bool) -> None:
    from llmbook.transformer.attention import MultiHeadAttention

    torch.manual_seed(0)
    attn = MultiHeadAttention(24, n_heads=6, n_kv_heads=3, fused=fused).eval()
    x = torch.randn(2, 11, 24)
    pad = torch.ones(2, 1, 1, 11, dtype=torch.bool)
    pad[1, ..., :3] = False  # the second sequence is left-padded by 3
    with torch.no_grad():
        full = attn(x, mask=pad)  # (2, 11, 24)
        cache = KVCache(1, 2, 3, 11, 4)
        first = attn(x[:, :6], mask=pad[..., :6], cache=cache)
        cache.advance(6)
        rest = attn(x[:, 6:], mask=pad, cache=cache)  # 5 queries over T_k = 11 keys
    torch.testing.assert_close(torch.cat([first, rest], dim=1)[:, 3:], full[:, 3:], atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="does not broadcast"):
        cache.reset()
        attn(x[:, :4], mask=pad, cache=cache)  # mask for 11 keys, only 4 present
