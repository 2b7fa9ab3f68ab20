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


# ---------------------------------------------------------------- paged cache (Kwon et al., 2023)

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from llmbook.inference.kvcache import PagedKVCache, PagePool  # noqa: E402


def _stepped(model, ids, cache, prefill):
    """Logits of a prefill of ``prefill`` tokens and single-token steps after it."""
    with torch.no_grad():
        out = [model(ids[:, :prefill], cache=cache)]
        out += [model(ids[:, t:t + 1], cache=cache) for t in range(prefill, ids.shape[1])]
    return torch.cat(out, dim=1)


@settings(max_examples=12, deadline=None)
@given(page_size=st.integers(1, 9), prefill=st.integers(1, 20), batch=st.integers(1, 3))
def test_paged_cache_equals_contiguous_cache(page_size, prefill, batch):
    model = _model(_configs(False)[1])  # GQA, H = 6, H_kv = 2
    ids = torch.randint(0, V, (batch, 23), generator=torch.Generator().manual_seed(page_size))
    contiguous = _stepped(model, ids, KVCache.for_model(model, batch), prefill)
    pool = PagePool.for_model(model, num_pages=40, page_size=page_size)
    cache = PagedKVCache(pool, batch)
    paged = _stepped(model, ids, cache, prefill)
    assert torch.equal(paged, contiguous)  # the same numbers gathered: bitwise equal
    n_pages = -(-23 // page_size)
    assert [len(t) for t in cache.block_tables] == [n_pages] * batch
    assert pool.num_free == 40 - batch * n_pages
    cache.release()
    assert pool.num_free == 40 and all(r == 0 for r in pool.refs)


def test_page_pool_free_list_worked_example():
    pool = PagePool(n_layers=1, n_kv_heads=1, d_head=2, num_pages=3, page_size=4)
    a, b = pool.allocate(), pool.allocate()
    assert (a, b, pool.num_free) == (0, 1, 1)
    pool.share(a)
    pool.release(a)
    assert pool.refs[a] == 1 and pool.num_free == 1
    pool.release(a)
    assert pool.num_free == 2 and pool.allocate() == a  # the freed page is reused first
    pool.allocate()
    with pytest.raises(RuntimeError, match="full"):
        pool.allocate()
    with pytest.raises(ValueError, match="page"):
        pool.release(7)


def test_prefix_caching_shares_pages_and_equals_recomputation():
    model = _model(_configs(False)[1])
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, V, (1, 10), generator=g)
    tails = [torch.randint(0, V, (1, n), generator=g) for n in (5, 8)]
    pool = PagePool.for_model(model, num_pages=30, page_size=4)
    base = PagedKVCache(pool)
    with torch.no_grad():
        model(prefix, cache=base)  # positions 0..9: pages 0, 1 full, page 2 half
    for tail in tails:
        child = PagedKVCache.from_prefix(base, 10)
        assert child.block_tables[0] == base.block_tables[0]  # shared, nothing copied yet
        with torch.no_grad():
            got = model(tail, cache=child)  # only the tail runs
            want = model(torch.cat([prefix, tail], dim=1))[:, 10:]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert child.block_tables[0][:2] == base.block_tables[0][:2]  # full pages still shared
        assert child.block_tables[0][2] != base.block_tables[0][2]  # copy-on-write
    assert [pool.refs[p] for p in base.block_tables[0]] == [3, 3, 1]
    with torch.no_grad():  # the parent's half page was not overwritten by the children
        again = model(tails[0], cache=PagedKVCache.from_prefix(base, 10))
        torch.testing.assert_close(again, model(torch.cat([prefix, tails[0]], 1))[:, 10:],
                                   rtol=1e-5, atol=1e-5)


def test_paged_cache_bad_input():
    pool = PagePool(n_layers=2, n_kv_heads=2, d_head=4, num_pages=2, page_size=3)
    cache = PagedKVCache(pool, batch_size=1)
    with pytest.raises(TypeError, match="pool"):
        PagedKVCache("pool")
    with pytest.raises(ValueError, match="k must have shape"):
        cache.update(0, torch.zeros(1, 3, 2, 4), torch.zeros(1, 3, 2, 4))
    with pytest.raises(ValueError, match="layer"):
        cache.update(2, torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
    with pytest.raises(ValueError, match="max_seq_len=6"):
        cache.update(0, torch.zeros(1, 2, 7, 4), torch.zeros(1, 2, 7, 4))
    with pytest.raises(ValueError, match="length"):
        PagedKVCache.from_prefix(cache, 1)
    with pytest.raises(ValueError, match="page_size"):
        PagePool(1, 1, 1, 1, 0)


# ---------------------------------------------------------------- int8 cache

from llmbook.inference.kvcache import Int8KVCache, dequantize_kv_int8, quantize_kv_int8  # noqa: E402


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")  # the peer is deprecated
def test_quantize_kv_int8_worked_example_and_torch_peer():
    x = torch.tensor([[1.0, -2.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0]])
    q, s = quantize_kv_int8(x)
    assert s[:, 0].tolist() == pytest.approx([2.0 / 127, 1.0], rel=1e-7)
    assert q.tolist() == [[64, -127, 32, 0], [0, 0, 0, 0]]  # 63.5 -> 64, 31.75 -> 32
    # peer: torch's per-channel qint8 with the same scales (channels = tokens x heads)
    y = torch.randn(2, 3, 7, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    q, s = quantize_kv_int8(y)
    flat = y.reshape(-1, 16)
    peer = torch.quantize_per_channel(flat.float(), s.reshape(-1).float(), torch.zeros(flat.shape[0],
                                      dtype=torch.long), axis=0, dtype=torch.qint8)
    assert torch.equal(peer.int_repr().reshape(q.shape), q)
    with pytest.raises(TypeError, match="x must be"):
        quantize_kv_int8(torch.ones(3, dtype=torch.int32))
    with pytest.raises(TypeError, match="int8"):
        dequantize_kv_int8(q.float(), s)


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=4), scale=st.floats(1e-3, 1e3))
def test_int8_error_within_half_a_step(shape, scale):
    x = scale * torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape)),
                            dtype=torch.float64)
    q, s = quantize_kv_int8(x)
    err = (dequantize_kv_int8(q, s) - x).abs()
    assert bool((err <= s / 2 * (1 + 1e-12)).all())  # the bound absmax / 254 per vector
    assert bool((q.abs() <= 127).all())


def test_int8_cache_close_to_float_cache_and_smaller():
    model = _model(_configs(False)[1])
    ids = torch.randint(0, V, (2, 25), generator=torch.Generator().manual_seed(2))
    ref = _stepped(model, ids, KVCache.for_model(model, 2), 6)
    cache = Int8KVCache.for_model(model, 2)
    got = _stepped(model, ids, cache, 6)
    assert 0 < (got - ref).abs().max().item() < 1e-2
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
    c = model.config
    assert cache.num_bytes() == 2 * c.n_layers * 2 * c.n_kv_heads * c.max_seq_len * (c.d_head + 4)
    assert cache.keys[0].dtype == torch.int8


# ---------------------------------------------------------------- StreamingLLM (issue 27 round 2)

from llmbook.inference.attention_variants import sliding_window_mask  # noqa: E402
from llmbook.inference.kvcache import SinkKVCache, sink_window_mask  # noqa: E402


def test_sink_window_mask_worked_example_and_special_cases():
    m = sink_window_mask(6, 6, window=2, n_sink=1)
    assert m.int().tolist() == [[1, 0, 0, 0, 0, 0],
                                [1, 1, 0, 0, 0, 0],
                                [1, 1, 1, 0, 0, 0],
                                [1, 0, 1, 1, 0, 0],
                                [1, 0, 0, 1, 1, 0],
                                [1, 0, 0, 0, 1, 1]]
    assert torch.equal(sink_window_mask(5, 9, 3, 0, offset=4), sliding_window_mask(5, 9, 3, offset=4))
    assert torch.equal(sink_window_mask(7, 7, 7, 2), torch.ones(7, 7, dtype=torch.bool).tril())
    for bad, exc in (((3, 3, 0, 1), ValueError), ((3, 3, 2, -1), ValueError), ((3, 3, 2, 1.5), ValueError)):
        with pytest.raises(exc, match="window|n_sink"):
            sink_window_mask(*bad)


@settings(max_examples=20, deadline=None)
@given(T=st.integers(1, 25), W=st.integers(1, 8), S=st.integers(0, 5))
def test_sink_window_mask_row_counts(T, W, S):
    # row i sees min(i + 1, S + W) keys: the sinks and the window never overlap beyond that
    counts = sink_window_mask(T, T, W, S).sum(-1)
    assert counts.tolist() == [min(i + 1, S + W) for i in range(T)]


@pytest.mark.parametrize("which", [0, 1], ids=["gpt2", "llama_gqa"])
@pytest.mark.parametrize("window,n_sink,prefill", [(5, 2, 4), (3, 0, 1), (4, 3, 7)])
def test_sink_cache_decoding_equals_masked_full_pass(which, window, n_sink, prefill):
    model = _model(_configs(False)[which])
    ids = torch.randint(0, V, (2, 30), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(ids, mask=sink_window_mask(30, 30, window, n_sink))  # (2, 30, V)
        cache = SinkKVCache.for_model(model, 2, window, n_sink)
        steps = [model(ids[:, :prefill], cache=cache)]
        steps += [model(ids[:, t:t + 1], cache=cache) for t in range(prefill, 30)]
        causal = model(ids)
    assert cache.length == 30 and cache.keys[0].shape[2] == n_sink + window
    assert cache.num_bytes() == 2 * model.config.n_layers * 2 * model.config.n_kv_heads * \
        (n_sink + window) * model.config.d_head * 4
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
    assert (causal[:, -1] - full[:, -1]).abs().max() > 1e-3  # the eviction does change the output


def test_sink_cache_bad_input():
    cache = SinkKVCache(2, 1, 2, 4, window=3, n_sink=1, max_seq_len=50)
    with pytest.raises(ValueError, match="layer must be"):
        cache.update(2, torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
    with pytest.raises(ValueError, match=r"k must have shape"):
        cache.update(0, torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4))
    with pytest.raises(ValueError, match="one at a time"):
        cache.update(0, torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4))
    with pytest.raises(ValueError, match="n_sink"):
        SinkKVCache(2, 1, 2, 4, window=3, n_sink=-1, max_seq_len=50)
    with pytest.raises(ValueError, match="num_positions"):
        cache.advance(-1)
    full = SinkKVCache(1, 1, 1, 2, window=2, n_sink=1, max_seq_len=3)
    for _ in range(3):
        full.update(0, torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
        full.advance(1)
    with pytest.raises(ValueError, match="max_seq_len=3"):
        full.update(0, torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
