"""Sliding-window masks, the rolling cache, and multi-head latent attention (llmbook.inference.attention_variants)."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.inference.attention_variants import (
    LatentCache,
    MultiHeadLatentAttention,
    RollingKVCache,
    deepseek_v3_attention,
    latent_decode,
    sliding_window_decode,
    sliding_window_mask,
)
from llmbook.transformer.attention import (
    MultiHeadAttention,
    causal_mask,
    scaled_dot_product_attention,
)
from llmbook.transformer.positional import rope_matrix

# ---------------------------------------------------------------- sliding window


def brute_force_window(T_q: int, T_k: int, window: int, offset: int) -> torch.Tensor:
    mask = torch.zeros(T_q, T_k, dtype=torch.bool)
    for i in range(T_q):
        for j in range(T_k):
            mask[i, j] = 0 <= (i + offset) - j < window
    return mask


def test_sliding_window_worked_example() -> None:
    got = sliding_window_mask(4, 6, window=2, offset=2).int().tolist()
    assert got == [[0, 1, 1, 0, 0, 0],
                   [0, 0, 1, 1, 0, 0],
                   [0, 0, 0, 1, 1, 0],
                   [0, 0, 0, 0, 1, 1]]


@settings(max_examples=60, deadline=None)
@given(T_q=st.integers(1, 9), T_k=st.integers(1, 9), window=st.integers(1, 10),
       offset=st.integers(-3, 8))
def test_sliding_window_equals_brute_force(T_q: int, T_k: int, window: int, offset: int) -> None:
    assert torch.equal(sliding_window_mask(T_q, T_k, window, offset),
                       brute_force_window(T_q, T_k, window, offset))


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 12), window=st.integers(1, 14))
def test_sliding_window_properties(T: int, window: int) -> None:
    mask = sliding_window_mask(T, T, window)
    assert torch.equal(mask & causal_mask(T), mask)  # never sees the future
    assert mask.sum(-1).tolist() == [min(i + 1, window) for i in range(T)]
    if window >= T:
        assert torch.equal(mask, causal_mask(T))


def test_sliding_window_attention_matches_torch_sdpa() -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 7, 5, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, 11, 5, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, 11, 4, generator=g, dtype=torch.float64)
    mask = sliding_window_mask(7, 11, window=3, offset=4)
    ours = scaled_dot_product_attention(q, k, v, mask=mask)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(ours, theirs, atol=1e-12, rtol=0)


@pytest.mark.parametrize(("n_heads", "n_kv_heads", "window", "T"),
                         [(4, 2, 3, 10), (2, 2, 1, 5), (6, 1, 4, 4), (4, 4, 16, 9)])
def test_rolling_cache_equals_windowed_recompute(n_heads, n_kv_heads, window, T) -> None:
    torch.manual_seed(0)
    attn = MultiHeadAttention(24, n_heads, n_kv_heads).double()
    x = torch.randn(2, T, 24, dtype=torch.float64)
    full = attn(x, mask=sliding_window_mask(T, T, window))
    rolled = sliding_window_decode(attn, x, window)
    assert rolled.shape == (2, T, 24)
    assert torch.allclose(rolled, full, atol=1e-12, rtol=0)


def test_rolling_cache_memory_is_constant() -> None:
    cache = RollingKVCache(2, 1, 2, window=4, d_head=8)
    before = cache.num_bytes()
    assert before == 2 * 2 * 1 * 2 * 4 * 8 * 4
    k = torch.ones(1, 2, 1, 8)
    for t in range(9):
        for layer in range(2):
            _, _, filled = cache.update(layer, k * t, k * t)
        cache.advance()
    assert cache.num_bytes() == before
    assert filled.all()
    # slots hold positions 8, 5, 6, 7 (slot p mod 4)
    assert cache.keys[0][0, 0, :, 0].tolist() == [8.0, 5.0, 6.0, 7.0]


def test_sliding_window_errors() -> None:
    with pytest.raises(ValueError, match="window"):
        sliding_window_mask(3, 3, 0)
    with pytest.raises(TypeError, match="offset"):
        sliding_window_mask(3, 3, 2, offset=1.5)
    cache = RollingKVCache(1, 1, 2, window=3, d_head=4)
    with pytest.raises(ValueError, match=r"shape \(1, 2, 1, 4\)"):
        cache.update(0, torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 2, 4))
    with pytest.raises(ValueError, match="d_model=24"):
        sliding_window_decode(MultiHeadAttention(24, 4), torch.zeros(1, 3, 20), 2)


# ---------------------------------------------------------------- multi-head latent attention


def test_mla_naive_equals_explicit_formula() -> None:
    torch.manual_seed(1)
    m = MultiHeadLatentAttention(20, 3, 6, 5, dtype=torch.float64)
    x = torch.randn(2, 7, 20, dtype=torch.float64)
    c = x @ m.kv_down.weight.T  # (B, T, d_c)
    q = (x @ m.q_proj.weight.T).view(2, 7, 3, 6).transpose(1, 2)
    k = (c @ m.k_up.weight.T).view(2, 7, 3, 6).transpose(1, 2)
    v = (c @ m.v_up.weight.T).view(2, 7, 3, 6).transpose(1, 2)
    z = scaled_dot_product_attention(q, k, v, mask=causal_mask(7))
    expected = z.transpose(1, 2).reshape(2, 7, 18) @ m.o_proj.weight.T
    assert torch.allclose(m(x), expected, atol=1e-12, rtol=0)


@settings(max_examples=25, deadline=None)
@given(B=st.integers(1, 3), T=st.integers(1, 8), H=st.integers(1, 4), d_h=st.integers(1, 6),
       d_c=st.integers(1, 7), seed=st.integers(0, 10_000))
def test_mla_absorbed_equals_naive(B: int, T: int, H: int, d_h: int, d_c: int, seed: int) -> None:
    torch.manual_seed(seed)
    m = MultiHeadLatentAttention(10, H, d_h, d_c, dtype=torch.float64)
    x = torch.randn(B, T, 10, dtype=torch.float64)
    assert torch.allclose(m(x, absorbed=True), m(x), atol=1e-12, rtol=0)


def test_mla_absorbed_float32() -> None:
    torch.manual_seed(2)
    m = MultiHeadLatentAttention(64, 4, 16, 32)
    x = torch.randn(2, 12, 64)
    assert (m(x, absorbed=True) - m(x)).abs().max() < 1e-5


def test_mla_latent_cache_equals_full() -> None:
    torch.manual_seed(3)
    m = MultiHeadLatentAttention(16, 2, 4, 3, dtype=torch.float64)
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    full = m(x)
    for absorbed in (False, True):
        out, cache = latent_decode(m, x, prefill=4, absorbed=absorbed)
        assert torch.allclose(out, full, atol=1e-12, rtol=0)
    assert cache.num_bytes() == 2 * 9 * 3 * 8  # B T_max d_c float64
    with pytest.raises(ValueError, match="prefill must be at most T=9"):
        latent_decode(m, x, prefill=10)


def test_mla_is_causal() -> None:
    torch.manual_seed(4)
    m = MultiHeadLatentAttention(12, 2, 4, 3)
    x = torch.randn(1, 6, 12)
    y = x.clone()
    y[:, 4:] = torch.randn(1, 2, 12)
    assert torch.allclose(m(x)[:, :4], m(y)[:, :4], atol=1e-6)


def test_mla_errors() -> None:
    m = MultiHeadLatentAttention(12, 2, 4, 3)
    with pytest.raises(ValueError, match="d_model=12"):
        m(torch.zeros(1, 3, 10))
    with pytest.raises(ValueError, match="d_latent"):
        MultiHeadLatentAttention(12, 2, 4, 0)
    cache = LatentCache(1, 1, 4, 3)
    with pytest.raises(ValueError, match="exceed max_seq_len=4"):
        cache.update(0, torch.zeros(1, 5, 3))
    with pytest.raises(ValueError, match=r"shape \(1, T, 3\)"):
        cache.update(0, torch.zeros(1, 2, 4))


def test_mla_absorbed_gradients() -> None:
    torch.manual_seed(5)
    m = MultiHeadLatentAttention(8, 2, 3, 2, dtype=torch.float64)
    x = torch.randn(1, 4, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: m(t, absorbed=True), (x,))
    g_naive = torch.autograd.grad(m(x).square().sum(), x)[0]
    g_absorbed = torch.autograd.grad(m(x, absorbed=True).square().sum(), x)[0]
    assert torch.allclose(g_naive, g_absorbed, atol=1e-12, rtol=0)


# ---------------------------------------------------------------- MLA with decoupled RoPE


def _mla_rope(seed: int = 0, d: int = 24, H: int = 3, d_h: int = 4, d_c: int = 5, d_r: int = 4,
              dtype: torch.dtype = torch.float64) -> MultiHeadLatentAttention:
    torch.manual_seed(seed)
    return MultiHeadLatentAttention(d, H, d_h, d_c, dtype=dtype, d_rope=d_r, max_seq_len=32)


def test_mla_rope_equals_explicit_rotation_matrices() -> None:
    """Scores built position by position with rope_matrix (R_i q_R).(R_j k_R), no RotaryEmbedding."""
    m = _mla_rope(1)
    B, T, H, d_h, d_r = 2, 6, 3, 4, 4
    x = torch.randn(B, T, 24, dtype=torch.float64)
    R = torch.stack([rope_matrix(t, d_r) for t in range(T)])  # (T, d_R, d_R)
    q = (x @ m.q_proj.weight.T).view(B, T, H, d_h)
    k = (x @ m.kv_down.weight.T @ m.k_up.weight.T).view(B, T, H, d_h)
    v = (x @ m.kv_down.weight.T @ m.v_up.weight.T).view(B, T, H, d_h)
    q_r = torch.einsum("tij,bthj->bthi", R, (x @ m.q_rope.weight.T).view(B, T, H, d_r))
    k_r = torch.einsum("tij,btj->bti", R, x @ m.k_rope.weight.T)  # (B, T, d_R): one per token
    scores = (torch.einsum("bihd,bjhd->bhij", q, k) + torch.einsum("bihd,bjd->bhij", q_r, k_r))
    scores = scores / (d_h + d_r) ** 0.5
    scores = scores.masked_fill(~causal_mask(T), float("-inf"))
    z = torch.einsum("bhij,bjhd->bihd", torch.softmax(scores, -1), v).reshape(B, T, H * d_h)
    assert torch.allclose(m(x), z @ m.o_proj.weight.T, atol=1e-12, rtol=0)


@settings(max_examples=20, deadline=None)
@given(B=st.integers(1, 3), T=st.integers(1, 8), H=st.integers(1, 4), d_h=st.integers(1, 5),
       d_c=st.integers(1, 6), half_r=st.integers(1, 3), seed=st.integers(0, 10_000))
def test_mla_rope_absorbed_equals_naive(B, T, H, d_h, d_c, half_r, seed) -> None:
    m = _mla_rope(seed, 10, H, d_h, d_c, 2 * half_r)
    x = torch.randn(B, T, 10, dtype=torch.float64)
    assert torch.allclose(m(x, absorbed=True), m(x), atol=1e-12, rtol=0)


def test_mla_rope_cache_steps_equal_full_and_cache_size() -> None:
    m = _mla_rope(2)
    x = torch.randn(2, 9, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    full = m(x)
    for absorbed in (False, True):
        out, cache = latent_decode(m, x, prefill=3, absorbed=absorbed)
        assert torch.allclose(out, full, atol=1e-12, rtol=0)
    assert m.cache_width == 5 + 4
    assert cache.num_bytes() == 2 * 9 * (5 + 4) * 8  # B T_max (d_c + d_R) float64
    # the cached rows are [c ; k_R], the shared MQA key
    _, k, v = m.mqa_form(x)
    # equal up to round-off: the cache was filled step by step, mqa_form in one pass, and
    # another CPU's kernels may add the products in another order
    assert torch.allclose(cache.latents[0], k[:, 0], atol=1e-14, rtol=0)
    assert torch.equal(v[:, 0], k[:, 0, :, :5])


def test_mla_rope_is_mqa_with_one_wide_key() -> None:
    """softmax(q k^T / sqrt(d_h + d_R)) v with ONE key/value head broadcast to H query heads."""
    m = _mla_rope(3)
    x = torch.randn(2, 7, 24, dtype=torch.float64)
    q, k, v = m.mqa_form(x)
    assert q.shape == (2, 3, 7, 9) and k.shape == (2, 1, 7, 9) and v.shape == (2, 1, 7, 5)
    z = F.scaled_dot_product_attention(q, k.expand(-1, 3, -1, -1), v.expand(-1, 3, -1, -1),
                                       is_causal=True, scale=1 / (4 + 4) ** 0.5)  # (B, H, T, d_c)
    out = torch.einsum("bhtc,hcd->btd", z, m.absorbed_weights()[1])
    assert torch.allclose(out, m(x), atol=1e-12, rtol=0)


def test_mla_rope_position_dependence() -> None:
    """The rotary part is not a no-op: the same weights without it give another output."""
    m = _mla_rope(4)
    x = torch.randn(1, 5, 24, dtype=torch.float64)
    no_rope = MultiHeadLatentAttention(24, 3, 4, 5, dtype=torch.float64)
    no_rope.load_state_dict({k: v for k, v in m.state_dict().items() if "rope" not in k})
    assert not torch.allclose(m(x), no_rope(x), atol=1e-6)


def test_mla_matches_hugging_face_deepseek_v3() -> None:
    pytest.importorskip("transformers.models.deepseek_v3")  # transformers >= 4.50
    m = _mla_rope(5, d=32, H=4, d_h=6, d_c=7, d_r=4)
    peer = deepseek_v3_attention(m)
    T = 11
    x = torch.randn(2, T, 32, dtype=torch.float64)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * m.rope.inv_freq  # (T, d_R/2)
    emb = torch.cat((angles, angles), -1)[None]  # (1, T, d_R): HF's layout
    mask = torch.zeros(T, T, dtype=torch.float64).masked_fill(~causal_mask(T), float("-inf"))
    with torch.no_grad():
        got = peer(x, position_embeddings=(emb.cos(), emb.sin()), attention_mask=mask[None, None])[0]
        assert torch.allclose(got, m(x), atol=1e-12, rtol=0)
        assert torch.allclose(got, m(x, absorbed=True), atol=1e-12, rtol=0)


def test_mla_rope_errors() -> None:
    with pytest.raises(ValueError, match="d_rope must be even"):
        MultiHeadLatentAttention(12, 2, 4, 3, d_rope=3)
    with pytest.raises(ValueError, match="d_rope must be >= 0"):
        MultiHeadLatentAttention(12, 2, 4, 3, d_rope=-2)
    m = MultiHeadLatentAttention(12, 2, 4, 3, d_rope=2)
    with pytest.raises(ValueError, match="d_latent \\+ d_rope = 5"):
        m(torch.zeros(1, 2, 12), cache=LatentCache(1, 1, 4, 3))
    with pytest.raises(ValueError, match="d_rope > 0"):
        deepseek_v3_attention(MultiHeadLatentAttention(12, 2, 4, 3))
