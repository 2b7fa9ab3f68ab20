"""Chapter 13's claims about the KV cache: equal outputs, FLOPs per token, memory."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from llmbook.inference.attention_variants import (
    decode_step_flops,
    generation_flops,
    kv_cache_bytes_per_token,
    mla_cache_bytes_per_token,
)
from llmbook.inference.kvcache import KVCache, kv_cache_bytes
from llmbook.inference.sampling import generate
from llmbook.training.pretrained import book_model
from llmbook.transformer.model import TransformerConfig, TransformerLM
from llmbook.transformer.sizing import flops_per_token


def small_config(**overrides) -> TransformerConfig:
    kw = dict(vocab_size=40, d_model=24, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32,
              fused_attention=False)
    kw.update(overrides)
    return TransformerConfig.llama_style(**kw)


def test_book_model_cache_equals_recompute() -> None:
    model, _ = book_model("text")
    prompt = torch.tensor([[5, 17, 300, 42]])
    cached = generate(model, prompt, 40, temperature=0, use_cache=True)
    plain = generate(model, prompt, 40, temperature=0, use_cache=False)
    assert torch.equal(cached, plain)
    seq = cached[:, :30]
    with torch.no_grad():
        full = model(seq)  # (1, 30, V)
        cache = KVCache.for_model(model, 1)
        steps = [model(seq[:, :6], cache=cache)]
        steps += [model(seq[:, t:t + 1], cache=cache) for t in range(6, 30)]
    # float32 round-off, relative to logits that reach |z| ~ 15 on this model
    assert (torch.cat(steps, 1) - full).abs().max() < 1e-6 * full.abs().max() * 10


@pytest.mark.parametrize("overrides", [{}, {"n_kv_heads": 1}, {"n_kv_heads": 4, "d_head": 10}])
def test_cache_step_flops_match_flop_counter(overrides) -> None:
    config = small_config(**overrides)
    model = TransformerLM(config).eval()
    ids = torch.randint(0, 40, (1, 11))
    with torch.no_grad():
        cache = KVCache.for_model(model, 1)
        model(ids[:, :10], cache=cache)
        with FlopCounterMode(display=False) as counter:
            model(ids[:, 10:], cache=cache)  # one token attending to T_k = 11 keys
        cached = counter.get_total_flops()
        with FlopCounterMode(display=False) as counter:
            model(ids)  # recompute all 11 tokens
        recomputed = counter.get_total_flops()
    assert cached == decode_step_flops(config, 11, use_cache=True)
    assert recomputed == decode_step_flops(config, 11, use_cache=False)
    assert recomputed == 11 * cached


def test_generation_flops_closed_forms() -> None:
    config = small_config()
    P, n = 3, 6
    prefill = P * flops_per_token(config, P)
    with_cache = prefill + sum(flops_per_token(config, t) for t in range(P + 1, P + n))
    without = prefill + sum(t * flops_per_token(config, t) for t in range(P + 1, P + n))
    assert generation_flops(config, P, n, use_cache=True) == with_cache
    assert generation_flops(config, P, n, use_cache=False) == without
    # the ratio grows about linearly in the length
    r1 = generation_flops(config, 1, 8, False) / generation_flops(config, 1, 8, True)
    r2 = generation_flops(config, 1, 16, False) / generation_flops(config, 1, 16, True)
    assert 1.7 < r2 / r1 < 2.1


@pytest.mark.parametrize(("L", "B", "H", "H_kv", "d_h", "T", "dtype"), [
    (2, 1, 4, 4, 8, 16, torch.float32),
    (3, 2, 6, 2, 5, 9, torch.float64),
    (1, 3, 8, 1, 4, 7, torch.bfloat16),
])
def test_kv_memory_formula_equals_tensors(L, B, H, H_kv, d_h, T, dtype) -> None:
    cache = KVCache(L, B, H_kv, T, d_h, dtype=dtype)
    real = sum(t.numel() * t.element_size() for t in (*cache.keys, *cache.values))
    element = torch.empty((), dtype=dtype).element_size()
    assert real == 2 * L * B * T * H_kv * d_h * element
    assert real == B * T * kv_cache_bytes_per_token(L, H_kv, d_h, dtype)
    config = TransformerConfig(vocab_size=10, d_model=H * d_h, n_layers=L, n_heads=H,
                               n_kv_heads=H_kv, max_seq_len=T)
    assert real == kv_cache_bytes(config, B, T, dtype)


def test_published_shapes() -> None:
    fp16 = torch.float16
    # Llama 2 7B (Touvron et al., 2023): 32 layers, 32 KV heads of 128
    assert kv_cache_bytes_per_token(32, 32, 128, fp16) * 4096 == 2 * 2**30
    # Llama 3 70B (Dubey et al., 2024): 80 layers, 8 KV heads of 128 -> 1.25 GiB at 4k
    assert kv_cache_bytes_per_token(80, 8, 128, fp16) * 4096 == 1.25 * 2**30
    # Qwen2-0.5B (Yang et al., 2024): 24 layers, 2 KV heads of 64
    assert kv_cache_bytes_per_token(24, 2, 64, fp16) == 12_288
    # DeepSeek-V2: 60 layers, d_c = 512, d_R = 64 -> 576 elements per layer and token
    assert mla_cache_bytes_per_token(60, 512, 64, fp16) == 60 * 576 * 2
    # ... versus 2 * 128 * 128 = 32768 for MHA with its 128 heads of 128
    ratio = kv_cache_bytes_per_token(60, 128, 128, fp16) / mla_cache_bytes_per_token(60, 512, 64, fp16)
    assert ratio == pytest.approx(32768 / 576)


def test_cost_errors() -> None:
    config = small_config()
    with pytest.raises(ValueError, match="position"):
        decode_step_flops(config, 0, use_cache=True)
    with pytest.raises(ValueError, match="new_tokens"):
        generation_flops(config, 4, 0, use_cache=True)
    with pytest.raises(TypeError, match="dtype"):
        kv_cache_bytes_per_token(2, 2, 8, dtype="fp16")
    with pytest.raises(ValueError, match="d_rope"):
        mla_cache_bytes_per_token(2, 8, d_rope=-1)
