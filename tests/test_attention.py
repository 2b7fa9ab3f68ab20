"""Tests for llmbook.transformer.attention: against PyTorch, Hugging Face, autograd and worked examples."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.transformer.attention import (
    MultiHeadAttention,
    attention_flops,
    attention_weights,
    causal_mask,
    minimal_multi_head_attention,
    scaled_dot_product_attention,
)


def randn(*shape, g, dtype=torch.float32):
    return torch.randn(*shape, generator=g, dtype=dtype)


# ---------------------------------------------------------------- causal_mask


def test_causal_mask_worked_examples():
    assert causal_mask(3).int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    # top-left aligned for T_q != T_k, as torch's is_causal
    assert causal_mask(2, 4).int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0]]
    assert torch.equal(causal_mask(4, 2), torch.ones(4, 2, dtype=torch.bool).tril())
    # bottom-right aligned: the 2 queries are the last 2 of 4 positions
    assert causal_mask(2, 4, offset=2).int().tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert causal_mask(3, 3, offset=-1).int().tolist() == [[0, 0, 0], [1, 0, 0], [1, 1, 0]]


def test_causal_mask_bad_inputs():
    with pytest.raises(ValueError, match="T_q must be positive, got T_q=0"):
        causal_mask(0)
    with pytest.raises(ValueError, match="T_k must be positive, got T_k=-2"):
        causal_mask(3, -2)
    with pytest.raises(TypeError, match="offset must be an int"):
        causal_mask(3, 3, offset=1.5)


# ---------------------------------------------------------------- scaled_dot_product_attention


def test_worked_example_exact_numbers():
    # two queries, three keys, d_k = 1, scale 1: the scores are the products q_i k_j
    q = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    k = torch.tensor([[0.0], [1.0], [2.0]], dtype=torch.float64)
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    A = attention_weights(q, k)
    e = torch.tensor([1.0, math.e, math.e**2], dtype=torch.float64)
    assert torch.allclose(A[0], torch.full((3,), 1 / 3, dtype=torch.float64), atol=1e-15)
    assert torch.allclose(A[1], e / e.sum(), atol=1e-15)
    z = scaled_dot_product_attention(q, k, v)
    expected = torch.tensor([(1 + math.e**2) / e.sum(), (math.e + math.e**2) / e.sum()])
    assert torch.allclose(z[1], expected.double(), atol=1e-15)
    # is_causal: the first query sees only the first key
    assert torch.equal(scaled_dot_product_attention(q, k, v, is_causal=True)[0], v[0])


SHAPES = [  # (leading dims, T_q, T_k, d_k, d_v): never square
    ((), 3, 5, 4, 6),
    ((2,), 5, 3, 8, 2),
    ((2, 3), 4, 7, 5, 3),
    ((2, 1, 3), 6, 6, 4, 7),
]


@pytest.mark.parametrize("lead, T_q, T_k, d_k, d_v", SHAPES)
def test_equals_torch_sdpa(lead, T_q, T_k, d_k, d_v):
    g = torch.Generator().manual_seed(T_q * 10 + T_k)
    q, k, v = randn(*lead, T_q, d_k, g=g), randn(*lead, T_k, d_k, g=g), randn(*lead, T_k, d_v, g=g)
    ref = F.scaled_dot_product_attention

    def close(ours, theirs):
        assert ours.shape == (*lead, T_q, d_v)
        assert (ours - theirs).abs().max().item() < 1e-6

    close(scaled_dot_product_attention(q, k, v), ref(q, k, v))
    close(scaled_dot_product_attention(q, k, v, is_causal=True), ref(q, k, v, is_causal=True))
    close(scaled_dot_product_attention(q, k, v, scale=0.3), ref(q, k, v, scale=0.3))
    masks = [
        torch.rand(T_q, T_k, generator=g) > 0.4,  # broadcast over every leading dim
        torch.rand(*lead, T_q, T_k, generator=g) > 0.4,  # one mask per batch element
        randn(T_q, T_k, g=g),  # float bias
        torch.zeros(*lead, 1, T_k).masked_fill(torch.rand(*lead, 1, T_k, generator=g) > 0.5,
                                               float("-inf")),  # float key mask with -inf
    ]
    if lead:
        masks.append(torch.rand(lead[0], *([1] * (len(lead) - 1)), T_q, T_k, generator=g) > 0.4)
    for m in masks:
        close(scaled_dot_product_attention(q, k, v, mask=m), ref(q, k, v, attn_mask=m))


def test_fully_masked_rows_are_zero_like_torch_and_have_finite_gradients():
    g = torch.Generator().manual_seed(1)
    q, k, v = (randn(2, 4, 3, g=g, dtype=torch.float64).requires_grad_() for _ in range(3))
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[2] = False  # query 2 may attend nothing
    float_mask = torch.zeros(4, 4, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    for m in (mask, float_mask):
        z = scaled_dot_product_attention(q, k, v, mask=m)
        assert torch.equal(z[:, 2], torch.zeros(2, 3, dtype=torch.float64))
        assert torch.isfinite(z).all()
        assert torch.allclose(z, F.scaled_dot_product_attention(q, k, v, attn_mask=m), atol=1e-12)
        A = attention_weights(q, k, mask=m)
        assert torch.equal(A[:, 2], torch.zeros(2, 4, dtype=torch.float64))
        z.sum().backward()
        for t in (q, k, v):
            assert torch.isfinite(t.grad).all()
            t.grad = None
    # bottom-right causal mask with T_q > T_k: the first two queries see nothing
    z = scaled_dot_product_attention(q, k[:, :2], v[:, :2], mask=causal_mask(4, 2, offset=-2))
    assert torch.equal(z[:, :2], torch.zeros(2, 2, 3, dtype=torch.float64))
    assert torch.isfinite(torch.autograd.grad(z.sum(), q)[0]).all()


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(2)
    q = randn(2, 3, 4, g=g, dtype=torch.float64).requires_grad_()
    k = randn(2, 5, 4, g=g, dtype=torch.float64).requires_grad_()
    v = randn(2, 5, 2, g=g, dtype=torch.float64).requires_grad_()
    mask = torch.rand(3, 5, generator=g) > 0.3
    mask[:, 0] = True
    assert torch.autograd.gradcheck(scaled_dot_product_attention, (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: scaled_dot_product_attention(
        a, b, c, is_causal=True), (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: scaled_dot_product_attention(
        a, b, c, mask=mask), (q, k, v))


@settings(max_examples=25, deadline=None)
@given(T=st.integers(2, 9), d_k=st.integers(1, 6), d_v=st.integers(1, 5), seed=st.integers(0, 10**6))
def test_causal_output_ignores_the_future_and_rows_sum_to_one(T, d_k, d_v, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = randn(2, T, d_k, g=g, dtype=torch.float64), randn(2, T, d_k, g=g,
                                                               dtype=torch.float64), randn(
        2, T, d_v, g=g, dtype=torch.float64)
    i = int(torch.randint(0, T - 1, (1,), generator=g))
    z = scaled_dot_product_attention(q, k, v, is_causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[:, i + 1:] = 100 * randn(2, T - i - 1, d_k, g=g, dtype=torch.float64)
    v2[:, i + 1:] = 100 * randn(2, T - i - 1, d_v, g=g, dtype=torch.float64)
    z2 = scaled_dot_product_attention(q, k2, v2, is_causal=True)
    assert torch.equal(z[:, : i + 1], z2[:, : i + 1])  # rows 0..i did not move
    assert not torch.allclose(z[:, i + 1:], z2[:, i + 1:])  # the later rows did
    A = attention_weights(q, k, is_causal=True)
    assert torch.allclose(A.sum(-1), torch.ones(2, T, dtype=torch.float64), atol=1e-14)
    assert (A >= 0).all() and torch.equal(A.triu(1), torch.zeros_like(A))


def test_bad_inputs_name_the_shapes():
    q, k, v = torch.ones(2, 3, 4), torch.ones(2, 5, 4), torch.ones(2, 5, 6)
    with pytest.raises(ValueError, match=r"same last dimension d_k, got q \(2, 3, 4\) and k \(2, 5, 3\)"):
        scaled_dot_product_attention(q, torch.ones(2, 5, 3), v)
    with pytest.raises(ValueError, match=r"same number of positions T_k, got k \(2, 5, 4\) and v \(2, 4, 6\)"):
        scaled_dot_product_attention(q, k, torch.ones(2, 4, 6))
    with pytest.raises(ValueError, match=r"equal leading dimensions.*q \(2, 3, 4\), k \(1, 5, 4\)"):
        scaled_dot_product_attention(q, torch.ones(1, 5, 4), torch.ones(1, 5, 6))
    with pytest.raises(ValueError, match=r"mask of shape \(3, 4\) does not broadcast .* \(2, 3, 5\)"):
        scaled_dot_product_attention(q, k, v, mask=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask of shape \(4, 3, 5\) does not broadcast"):
        scaled_dot_product_attention(q, k, v, mask=torch.ones(4, 3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask of shape \(7, 2, 3, 5\) does not broadcast"):
        scaled_dot_product_attention(q, k, v, mask=torch.ones(7, 2, 3, 5))  # would grow the output
    with pytest.raises(ValueError, match="either mask or is_causal"):
        scaled_dot_product_attention(q, k, v, mask=torch.ones(3, 5, dtype=torch.bool), is_causal=True)
    with pytest.raises(TypeError, match="mask must be boolean .* got torch.int64"):
        scaled_dot_product_attention(q, k, v, mask=torch.ones(3, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"shape \(\.\.\., T, d\), got \(4,\)"):
        scaled_dot_product_attention(torch.ones(4), k, v)
    with pytest.raises(TypeError, match="q must be a floating-point tensor"):
        scaled_dot_product_attention(q.long(), k, v)


# ---------------------------------------------------------------- MultiHeadAttention


def test_mha_equals_separate_heads():
    g = torch.Generator().manual_seed(3)
    B, T, d, H = 2, 5, 12, 3
    mha = MultiHeadAttention(d, H, bias=True, dtype=torch.float64)
    x = randn(B, T, d, g=g, dtype=torch.float64)
    Wq, Wk, Wv = mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight  # (H d_head, d)
    bq, bk, bv = mha.q_proj.bias, mha.k_proj.bias, mha.v_proj.bias
    heads = []
    for h in range(H):
        s = slice(h * 4, (h + 1) * 4)
        Q, K, V = x @ Wq[s].T + bq[s], x @ Wk[s].T + bk[s], x @ Wv[s].T + bv[s]  # (B, T, d_head)
        S = Q @ K.transpose(1, 2) / math.sqrt(4)
        S = S.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        heads.append(torch.softmax(S, -1) @ V)
    expected = mha.o_proj(torch.cat(heads, dim=-1))
    assert torch.allclose(mha(x), expected, rtol=0, atol=1e-14)


@pytest.mark.parametrize("causal", [False, True])
def test_mha_equals_torch_multihead_attention(causal):
    g = torch.Generator().manual_seed(4)
    B, T, d, H = 3, 6, 20, 4
    ours = MultiHeadAttention(d, H, bias=True)
    ref = torch.nn.MultiheadAttention(d, H, bias=True, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight,
                                            ours.v_proj.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        ref.out_proj.weight.copy_(ours.o_proj.weight)
        ref.out_proj.bias.copy_(ours.o_proj.bias)
    x = randn(B, T, d, g=g)
    # torch's MultiheadAttention takes the opposite boolean convention: True = masked out
    blocked = ~causal_mask(T) if causal else None
    expected, _ = ref(x, x, x, attn_mask=blocked, need_weights=False)
    for fused in (False, True):
        ours.fused = fused
        assert (ours(x, is_causal=causal) - expected).abs().max() < 1e-6


def test_gqa_equals_repeated_kv_heads_and_fused_path():
    g = torch.Generator().manual_seed(5)
    B, T, d, H, H_kv = 2, 7, 24, 6, 2
    gqa = MultiHeadAttention(d, H, H_kv, qkv_bias=True, dtype=torch.float64)
    full = MultiHeadAttention(d, H, dtype=torch.float64, qkv_bias=True)
    d_head, groups = d // H, H // H_kv
    with torch.no_grad():
        full.q_proj.load_state_dict(gqa.q_proj.state_dict())
        full.o_proj.load_state_dict(gqa.o_proj.state_dict())
        for name in ("k_proj", "v_proj"):
            W = getattr(gqa, name).weight.view(H_kv, d_head, d).repeat_interleave(groups, 0)
            b = getattr(gqa, name).bias.view(H_kv, d_head).repeat_interleave(groups, 0)
            getattr(full, name).weight.copy_(W.reshape(H * d_head, d))
            getattr(full, name).bias.copy_(b.reshape(H * d_head))
    x = randn(B, T, d, g=g, dtype=torch.float64)
    expected = full(x)
    assert torch.allclose(gqa(x), expected, rtol=0, atol=1e-14)
    gqa.fused = True
    assert torch.allclose(gqa(x), expected, rtol=0, atol=1e-13)
    # multi-query attention (one KV head) through both paths
    mqa = MultiHeadAttention(d, H, 1, dtype=torch.float64)
    y = mqa(x)
    mqa.fused = True
    assert torch.allclose(mqa(x), y, rtol=0, atol=1e-13)
    assert mqa.k_proj.weight.shape == (d_head, d)


def rotate_half(t):
    a, b = t.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def make_rope(d_head, T, dtype=torch.float64):
    inv = 1.0 / 10000 ** (torch.arange(0, d_head, 2, dtype=dtype) / d_head)
    angles = torch.arange(T, dtype=dtype)[:, None] * inv
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()

    def rope(t, positions):  # t (B, H, T, d_head), positions (T,) or (B, T)
        c, s = cos[positions], sin[positions]
        if positions.ndim == 2:
            c, s = c[:, None], s[:, None]
        return t * c + rotate_half(t) * s

    return rope, cos, sin


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_mha_equals_transformers_attention_with_rope_and_gqa(family):
    transformers = pytest.importorskip("transformers")
    g = torch.Generator().manual_seed(6)
    B, T, d, H, H_kv = 2, 6, 32, 8, 2
    d_head = d // H
    if family == "llama":
        from transformers.models.llama.modeling_llama import LlamaAttention as Attn
        cfg = transformers.LlamaConfig(hidden_size=d, num_attention_heads=H, num_key_value_heads=H_kv)
        ours = MultiHeadAttention(d, H, H_kv, dtype=torch.float64)
    else:
        from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention as Attn
        cfg = transformers.Qwen2Config(hidden_size=d, num_attention_heads=H, num_key_value_heads=H_kv)
        ours = MultiHeadAttention(d, H, H_kv, qkv_bias=True, out_bias=False, dtype=torch.float64)
    cfg._attn_implementation = "sdpa"
    hf = Attn(cfg, layer_idx=0).double()
    torch.manual_seed(0)
    for p in hf.parameters():  # biases start at zero in transformers; make them count
        torch.nn.init.normal_(p, std=0.3)
    assert set(hf.state_dict()) == set(ours.state_dict())
    ours.load_state_dict(hf.state_dict())
    x = randn(B, T, d, g=g, dtype=torch.float64)
    rope, cos, sin = make_rope(d_head, T)
    blocked = torch.zeros(T, T, dtype=torch.float64).masked_fill(~causal_mask(T), float("-inf"))
    expected, _ = hf(x, position_embeddings=(cos.expand(B, T, d_head), sin.expand(B, T, d_head)),
                     attention_mask=blocked[None, None])
    for fused in (False, True):
        ours.fused = fused
        assert torch.allclose(ours(x, rope=rope), expected, rtol=0, atol=1e-12)
        positions = torch.arange(T).expand(B, T)
        assert torch.allclose(ours(x, positions=positions, rope=rope), expected, rtol=0, atol=1e-12)


def test_mha_masks_and_bias():
    g = torch.Generator().manual_seed(7)
    B, T, d, H = 2, 5, 8, 2
    mha = MultiHeadAttention(d, H, dtype=torch.float64)
    x = randn(B, T, d, g=g, dtype=torch.float64)
    # a padding mask: sequence 0 has 3 real tokens; its first 3 outputs equal the short run
    pad = torch.ones(B, 1, 1, T, dtype=torch.bool)
    pad[0, ..., 3:] = False
    y = mha(x, mask=pad)
    assert torch.allclose(y[0, :3], mha(x[:1, :3])[0], rtol=0, atol=1e-14)
    # non-causal mode: every position sees every other; a zero bias changes nothing
    y_full = mha(x, is_causal=False)
    assert not torch.allclose(y_full, mha(x))
    assert torch.allclose(mha(x, is_causal=False, attn_bias=torch.zeros(T, T, dtype=torch.float64)),
                          y_full, atol=1e-14)
    # an additive bias equals a hand-built causal float mask plus that bias, in both paths
    bias = randn(H, T, T, g=g, dtype=torch.float64)
    q, k, v = mha.project_qkv(x)
    float_mask = bias.masked_fill(~causal_mask(T), float("-inf"))
    z = scaled_dot_product_attention(q, k, v, mask=float_mask).transpose(1, 2).reshape(B, T, d)
    assert torch.allclose(mha(x, attn_bias=bias), mha.o_proj(z), rtol=0, atol=1e-14)
    mha.fused = True
    assert torch.allclose(mha(x, attn_bias=bias), mha.o_proj(z), rtol=0, atol=1e-13)
    # positions and rope default to 0..T-1; v is not rotated
    rope, _, _ = make_rope(d // H, T)
    q_r, k_r, v_r = mha.project_qkv(x, rope=rope)
    assert torch.allclose(q_r, rope(q, torch.arange(T))) and torch.equal(v_r, v)
    assert not torch.allclose(q_r, q)


def test_mha_gradcheck():
    g = torch.Generator().manual_seed(8)
    mha = MultiHeadAttention(6, 3, 1, d_head=2, bias=True, dtype=torch.float64)
    x = randn(2, 4, 6, g=g, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(mha, (x,))
    params = dict(mha.named_parameters())

    def as_function_of_weights(wq, wk):
        return torch.func.functional_call(mha, {**params, "q_proj.weight": wq,
                                                "k_proj.weight": wk}, (x.detach(),))

    wq = params["q_proj.weight"].detach().clone().requires_grad_()
    wk = params["k_proj.weight"].detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(as_function_of_weights, (wq, wk))


def test_mha_shapes_names_and_config_errors():
    mha = MultiHeadAttention(10, 4, 2, d_head=3, qkv_bias=True, out_bias=False)
    assert mha.q_proj.weight.shape == (12, 10) and mha.k_proj.weight.shape == (6, 10)
    assert mha.o_proj.weight.shape == (10, 12) and mha.o_proj.bias is None
    assert mha.v_proj.bias.shape == (6,)
    assert mha(torch.ones(2, 3, 10)).shape == (2, 3, 10)
    assert mha.scale == pytest.approx(1 / math.sqrt(3))
    with pytest.raises(ValueError, match="d_model=10 is not divisible by n_heads=4"):
        MultiHeadAttention(10, 4)
    with pytest.raises(ValueError, match="n_heads=6 is not divisible by n_kv_heads=4"):
        MultiHeadAttention(12, 6, 4)
    with pytest.raises(ValueError, match="n_kv_heads must be positive"):
        MultiHeadAttention(12, 6, 0)
    with pytest.raises(TypeError, match="n_heads must be an int"):
        MultiHeadAttention(12, 2.0)
    with pytest.raises(ValueError, match=r"x must have shape \(..., T, d_model=10\), got \(3, 9\)"):
        mha(torch.ones(3, 9))
    with pytest.raises(ValueError, match=r"x must have shape \(..., T, d_model=10\), got \(10,\)"):
        mha(torch.ones(10))
    with pytest.raises(TypeError, match="x must be a floating-point tensor, got torch.int64"):
        mha(torch.ones(2, 3, 10, dtype=torch.long))
    with pytest.raises(ValueError, match=r"mask of shape \(2, 2\) does not broadcast .* \(2, 4, 3, 3\)"):
        mha(torch.ones(2, 3, 10), mask=torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask must be a boolean tensor .* pass an additive float mask as attn_bias"):
        mha(torch.ones(2, 3, 10), mask=torch.zeros(3, 3))
    with pytest.raises(TypeError, match="attn_bias must be a floating-point tensor"):
        mha(torch.ones(2, 3, 10), attn_bias=torch.zeros(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask of shape \(5, 3, 3\) does not broadcast"):
        mha(torch.ones(2, 3, 10), attn_bias=torch.zeros(5, 3, 3))


def test_mha_accepts_any_leading_dimensions():
    """A (2, 3, T, d) input equals running each (T, d) slice alone, with GQA, masks and RoPE."""
    from llmbook.transformer.positional import RotaryEmbedding

    g = torch.Generator().manual_seed(10)
    T, d, H, H_kv = 5, 12, 4, 2  # non-square: T != d, d_head = 3
    mha = MultiHeadAttention(d, H, H_kv, d_head=4, qkv_bias=True, dtype=torch.float64)
    x = randn(2, 3, T, d, g=g, dtype=torch.float64)
    rope = RotaryEmbedding(4, max_seq_len=32, dtype=torch.float64)
    per_row = torch.tensor([[3, 4, 5, 6, 7], [0, 2, 4, 6, 8]])  # (B, T): one row per x[b]
    for fused in (False, True):
        mha.fused = fused
        y = mha(x)
        assert y.shape == (2, 3, T, d)
        for b in range(2):
            for c in range(3):
                slice_ = x[b, c]  # (T, d): unbatched, as torch allows
                assert torch.allclose(y[b, c], mha(slice_), rtol=0, atol=1e-14)
                assert torch.allclose(y[b, c], mha(slice_[None])[0], rtol=0, atol=1e-14)
                assert torch.allclose(y[b, c], mha(x[b])[c], rtol=0, atol=1e-14)
                assert torch.allclose(mha(x, positions=per_row, rope=rope)[b, c],
                                      mha(slice_, positions=per_row[b], rope=rope), rtol=0, atol=1e-14)
        shared = torch.arange(2, 2 + T)
        assert torch.allclose(mha(x, positions=shared, rope=rope),
                              mha(x, positions=shared[None], rope=rope), rtol=0, atol=0)
        assert not torch.allclose(mha(x, positions=shared, rope=rope), y)
        # a mask over the leading dimensions: slice (1, 2) sees only its first 2 keys
        mask = torch.ones(2, 3, 1, 1, T, dtype=torch.bool)
        mask[1, 2, ..., 2:] = False
        y_m = mha(x, mask=mask)
        assert torch.allclose(y_m[1, 2, :2], mha(x[1, 2, :2]), rtol=0, atol=1e-14)
        assert torch.allclose(y_m[0], y[0], rtol=0, atol=1e-14)
        # a bias per leading slice, ALiBi-like
        bias = randn(2, 3, H, T, T, g=g, dtype=torch.float64)
        assert torch.allclose(mha(x, attn_bias=bias)[0, 1], mha(x[0, 1], attn_bias=bias[0, 1]),
                              rtol=0, atol=1e-14)
    mha.fused = False
    with pytest.raises(ValueError, match=r"positions must have shape \(T,\), \(1, T\) or \(B, T\)"):
        mha(x, positions=torch.arange(T).expand(3, T), rope=rope)
    with pytest.raises(ValueError, match=r"positions must have shape .* got \(4,\)"):
        mha(x, positions=torch.arange(4), rope=rope)
    with pytest.raises(ValueError, match=r"positions must have shape .* got \(2, 5\)"):
        mha(x[0, 0], positions=per_row, rope=rope)  # no batch dimension to match
    with pytest.raises(TypeError, match="positions must be a torch.Tensor, got list"):
        mha(x, positions=[0, 1, 2, 3, 4], rope=rope)
    with pytest.raises(ValueError, match=r"mask of shape \(2, 1, 1, 5\) does not broadcast .* \(2, 3, 4, 5, 5\)"):
        mha(x, mask=torch.ones(2, 1, 1, T, dtype=torch.bool))  # would need (2, 1, 1, 1, T)
    with pytest.raises(ValueError, match=r"with a cache, x must have shape \(B, T, d_model=12\), got \(2, 3, 5, 12\)"):
        mha(x, cache=object())


def _minimal_weights(mha):
    """The module's weights in the x @ W convention of minimal_multi_head_attention."""
    return [lin.weight.T for lin in (mha.q_proj, mha.k_proj, mha.v_proj, mha.o_proj)]


@pytest.mark.parametrize("lead", [(), (1,), (3,), (2, 3)])
@pytest.mark.parametrize("T, d, H", [(1, 4, 1), (7, 12, 3), (5, 8, 4), (9, 6, 2)])
def test_minimal_mha_equals_module_and_torch_sdpa(lead, T, d, H):
    g = torch.Generator().manual_seed(11 + T + d + H)
    mha = MultiHeadAttention(d, H, dtype=torch.float64)
    with torch.no_grad():
        for p in mha.parameters():
            p.copy_(randn(*p.shape, g=g, dtype=torch.float64))  # unit-variance weights: peaked rows, a harder test than the default init
    x = randn(*lead, T, d, g=g, dtype=torch.float64)
    W_q, W_k, W_v, W_o = _minimal_weights(mha)
    got = minimal_multi_head_attention(x, W_q, W_k, W_v, W_o, H)
    assert got.shape == (*lead, T, d)
    with torch.no_grad():
        assert torch.allclose(got, mha(x), rtol=0, atol=1e-12)
        mha.fused = True
        assert torch.allclose(got, mha(x), rtol=0, atol=1e-12)
    # torch's fused attention on the same projections, heads split by hand
    d_head = d // H
    q, k, v = ((x @ W).unflatten(-1, (H, d_head)).transpose(-3, -2) for W in (W_q, W_k, W_v))
    z = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(-3, -2).flatten(-2)
    assert torch.allclose(got, z @ W_o, rtol=0, atol=1e-12)


def test_minimal_mha_is_causal_and_rejects_bad_input():
    g = torch.Generator().manual_seed(12)
    d, H, T = 6, 2, 4
    W = [randn(d, d, g=g, dtype=torch.float64) for _ in range(4)]
    x = randn(T, d, g=g, dtype=torch.float64)
    x2 = x.clone()
    x2[-1] += 1.0
    y, y2 = minimal_multi_head_attention(x, *W, H), minimal_multi_head_attention(x2, *W, H)
    assert torch.equal(y[:-1], y2[:-1]) and not torch.allclose(y[-1], y2[-1])
    with pytest.raises(ValueError, match="n_heads must be a positive int, got 0"):
        minimal_multi_head_attention(x, *W, 0)
    with pytest.raises(ValueError, match="width of W_q, 6, is not divisible by n_heads=4"):
        minimal_multi_head_attention(x, *W, 4)
    with pytest.raises(TypeError, match=r"x must be a floating-point tensor of shape \(..., T, d\)"):
        minimal_multi_head_attention(torch.ones(T, d, dtype=torch.long), *W, H)
    with pytest.raises(TypeError, match=r"x must be a floating-point tensor .* got .* shape \(6,\)"):
        minimal_multi_head_attention(x[0], *W, H)
    with pytest.raises(ValueError, match=r"W_o must have shape \(6, 6\) .* got \(6, 5\)"):
        minimal_multi_head_attention(x, *W[:3], W[3][:, :5], H)
    with pytest.raises(ValueError, match=r"W_k must have shape \(6, 6\) .* got \(5, 6\)"):
        minimal_multi_head_attention(x, W[0], W[1][:5], W[2], W[3], H)
    with pytest.raises(TypeError, match="W_v must be a 2-d tensor, got list"):
        minimal_multi_head_attention(x, W[0], W[1], [[1.0]], W[3], H)


# ---------------------------------------------------------------- cost


def test_attention_flops_formula_and_flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    T, d, H = 16, 32, 4
    parts = attention_flops(T, d, H)
    assert parts["projections"] == 8 * T * d * d
    assert parts["scores"] + parts["mix"] == 4 * T * T * d
    assert parts["total"] == 8 * T * d * d + 4 * T * T * d
    for n_kv in (H, 2, 1):
        mha = MultiHeadAttention(d, H, n_kv)
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            mha(torch.ones(1, T, d))
        assert counter.get_total_flops() == attention_flops(T, d, H, n_kv)["total"]
    # cross-attention shape and explicit d_head
    assert attention_flops(3, 10, 2, 1, d_head=4, T_k=7) == {
        "projections": 2 * 3 * 10 * (2 * 8 + 2 * 4), "scores": 2 * 3 * 7 * 8,
        "mix": 2 * 3 * 7 * 8, "total": 2 * 3 * 10 * 24 + 4 * 3 * 7 * 8}
    with pytest.raises(ValueError, match="d_model=10 is not divisible by n_heads=3"):
        attention_flops(4, 10, 3)
    with pytest.raises(ValueError, match="T must be positive"):
        attention_flops(0, 8)


def test_mha_with_chapter_5_rotary_embedding_equals_transformers_llama():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    from llmbook.transformer.positional import RotaryEmbedding

    g = torch.Generator().manual_seed(9)
    B, T, d, H, H_kv = 2, 9, 32, 4, 2
    cfg = transformers.LlamaConfig(hidden_size=d, num_attention_heads=H, num_key_value_heads=H_kv,
                                   max_position_embeddings=64)
    cfg._attn_implementation = "sdpa"
    hf = LlamaAttention(cfg, layer_idx=0).double()
    ours = MultiHeadAttention(d, H, H_kv, dtype=torch.float64)
    ours.load_state_dict(hf.state_dict())
    x = randn(B, T, d, g=g, dtype=torch.float64)
    positions = torch.arange(3, 3 + T).expand(B, T)  # an offset start, as after a prompt
    cos, sin = LlamaRotaryEmbedding(cfg)(x, positions)  # HF computes the angles in float32
    blocked = torch.zeros(T, T, dtype=torch.float64).masked_fill(~causal_mask(T), float("-inf"))
    expected, _ = hf(x, position_embeddings=(cos, sin), attention_mask=blocked[None, None])
    rope = RotaryEmbedding(d // H, max_seq_len=64)  # float32 tables, HF's arithmetic
    for fused in (False, True):
        ours.fused = fused
        assert torch.allclose(ours(x, positions=positions, rope=rope), expected, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- issue 27: soft-capping

from llmbook.transformer.attention import soft_cap  # noqa: E402


def test_soft_cap_worked_values_and_bounds():
    x = torch.tensor([0.0, 1.0, -50.0, 1e6], dtype=torch.float64)
    y = soft_cap(x, 50.0)
    assert torch.allclose(y, torch.tensor([0.0, 50 * math.tanh(0.02), -50 * math.tanh(1.0), 50.0],
                                          dtype=torch.float64), rtol=0, atol=1e-12)
    z = torch.linspace(-200, 200, 1001, dtype=torch.float64)
    assert (soft_cap(z, 30.0).abs() < 30.0 + 1e-12).all()
    x0 = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    (d0,) = torch.autograd.grad(soft_cap(x0, 7.0).sum(), x0)
    assert d0.item() == pytest.approx(1.0, abs=1e-15)  # slope 1 at 0


def test_soft_cap_bad_input():
    with pytest.raises(ValueError, match="cap"):
        soft_cap(torch.zeros(2), 0.0)
    with pytest.raises(ValueError, match="cap"):
        soft_cap(torch.zeros(2), float("inf"))
    with pytest.raises(TypeError, match="x"):
        soft_cap(torch.zeros(2, dtype=torch.long), 5.0)
    with pytest.raises(ValueError, match="cap"):
        MultiHeadAttention(8, 2, softcap=-1.0)


def test_attention_softcap_equals_gemma2_eager():
    from transformers import Gemma2Config
    from transformers.models.gemma2.modeling_gemma2 import Gemma2Attention

    d, H, H_kv, d_head, T, cap = 24, 4, 2, 8, 7, 2.5  # a small cap so that capping matters
    cfg = Gemma2Config(hidden_size=d, num_attention_heads=H, num_key_value_heads=H_kv, head_dim=d_head,
                       query_pre_attn_scalar=d_head, attn_logit_softcapping=cap, sliding_window=None,
                       layer_types=["full_attention"], num_hidden_layers=1, attention_bias=False)
    cfg._attn_implementation = "eager"
    hf = Gemma2Attention(cfg, layer_idx=0).double().eval()
    ours = MultiHeadAttention(d, H, H_kv, d_head=d_head, softcap=cap, dtype=torch.float64)
    ours.load_state_dict(hf.state_dict())
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p_ in ours.parameters():
            p_.copy_(torch.randn(p_.shape, generator=gen, dtype=torch.float64))
        hf.load_state_dict(ours.state_dict())
    x = torch.randn(2, T, d, generator=gen, dtype=torch.float64)
    ones, zeros = torch.ones(2, T, d_head, dtype=torch.float64), torch.zeros(2, T, d_head, dtype=torch.float64)
    blocked = torch.zeros(T, T, dtype=torch.float64).masked_fill(~causal_mask(T), float("-inf"))
    with torch.no_grad():
        expected, _ = hf(x, position_embeddings=(ones, zeros), attention_mask=blocked[None, None])
        got = ours(x)
        ours.fused = True  # soft-capping falls back to the book's path
        got_fused = ours(x)
        uncapped = MultiHeadAttention(d, H, H_kv, d_head=d_head, dtype=torch.float64)
        uncapped.load_state_dict(ours.state_dict())
        plain = uncapped(x)
    # Gemma 2's eager attention takes its softmax in float32: relative error about 1e-7
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5), (got - expected).abs().max()
    assert torch.equal(got, got_fused)
    assert (got - plain).abs().max() > 1e-2  # the cap changed the output


# ---------------------------------------------------------------- issue 27 round 2: windows and sinks

from llmbook.inference.attention_variants import sliding_window_mask  # noqa: E402
from llmbook.transformer.attention import sink_attention_weights, sliding_window_reach  # noqa: E402


def test_sliding_window_reach_worked_values_and_bad_input():
    assert sliding_window_reach(1, 4) == 3
    assert sliding_window_reach(32, 4096) == 32 * 4095  # Mistral 7B: 131,040 positions
    assert sliding_window_reach(5, 1) == 0
    for bad in ((0, 4), (2, 0), (2.0, 4), (True, 4)):
        with pytest.raises((ValueError, TypeError), match="n_layers|window"):
            sliding_window_reach(*bad)


@settings(max_examples=25, deadline=None)
@given(L=st.integers(1, 4), W=st.integers(1, 6), T=st.integers(1, 30))
def test_sliding_window_reach_equals_composed_masks(L, W, T):
    # position i depends on j after L layers iff the L-fold boolean product of the mask links them
    m = sliding_window_mask(T, T, W).to(torch.int64)  # (T, T)
    reach = torch.linalg.matrix_power(m, L) > 0
    i, j = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    want = (j <= i) & (i - j <= sliding_window_reach(L, W))
    assert torch.equal(reach, want)


def _gpt_oss_peer(q, k, v, sinks, mask):
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    module = torch.nn.Module()
    module.sinks, module.num_key_value_groups = torch.nn.Parameter(sinks), 1
    module.eval()
    add = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, float("-inf"))
    return eager_attention_forward(module, q, k, v, add, scaling=q.shape[-1] ** -0.5)


@pytest.mark.parametrize("B,H,T_q,T_k,d", [(2, 3, 4, 7, 5), (1, 2, 6, 6, 8)])
def test_sink_attention_equals_transformers_gpt_oss(B, H, T_q, T_k, d):
    g = torch.Generator().manual_seed(B * 100 + T_q)
    q, k, v = (torch.randn(B, H, n, d, generator=g, dtype=torch.float64) for n in (T_q, T_k, T_k))
    sinks = torch.randn(H, generator=g, dtype=torch.float64) * 2
    mask = causal_mask(T_q, T_k, offset=T_k - T_q)
    out_hf, w_hf = _gpt_oss_peer(q, k, v, sinks, mask)
    w, sink_w = sink_attention_weights(q, k, sinks, mask=mask)
    assert torch.allclose(w, w_hf, rtol=0, atol=1e-14)
    assert torch.allclose((w @ v).transpose(1, 2), out_hf, rtol=0, atol=1e-13)
    assert torch.allclose(w.sum(-1) + sink_w, torch.ones(B, H, T_q, dtype=torch.float64), atol=1e-14)


def test_sink_attention_worked_example_and_limits():
    # one head, two keys with scores 0 and log 2, sink logit log 3: denominator 1 + 2 + 3 = 6
    q = torch.tensor([[[[1.0, 0.0]]]], dtype=torch.float64)  # (1, 1, 1, 2)
    k = torch.tensor([[[[0.0, 0.0], [math.log(2), 0.0]]]], dtype=torch.float64)  # (1, 1, 2, 2)
    w, s = sink_attention_weights(q, k, torch.tensor([math.log(3)], dtype=torch.float64), scale=1.0)
    assert torch.allclose(w, torch.tensor([[[[1 / 6, 2 / 6]]]], dtype=torch.float64), atol=1e-15)
    assert torch.allclose(s, torch.tensor([[[0.5]]], dtype=torch.float64), atol=1e-15)
    # a sink at -inf is plain attention; a fully masked row gives everything to the sink
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 4, 3, generator=g), torch.randn(2, 5, 3, generator=g)
    w, s = sink_attention_weights(q, k, torch.full((2,), float("-inf")))
    assert torch.allclose(w, attention_weights(q, k), atol=1e-6) and torch.all(s == 0)
    dead = torch.zeros(4, 5, dtype=torch.bool)
    w, s = sink_attention_weights(q, k, torch.zeros(2), mask=dead)
    assert torch.all(w == 0) and torch.all(s == 1)


@settings(max_examples=25, deadline=None)
@given(T_k=st.integers(1, 9), s=st.floats(-5, 5), z=st.floats(-5, 5))
def test_sink_weight_of_equal_scores_is_the_closed_form(T_k, s, z):
    # all scores equal to z: the sink keeps e^s / (e^s + T_k e^z)
    q = torch.ones(1, 1, 1, dtype=torch.float64)
    k = torch.full((1, T_k, 1), z, dtype=torch.float64)
    w, sink = sink_attention_weights(q, k, torch.tensor([s], dtype=torch.float64), scale=1.0)
    want = math.exp(s) / (math.exp(s) + T_k * math.exp(z))
    assert abs(sink.item() - want) < 1e-12 and torch.allclose(w, torch.full_like(w, (1 - want) / T_k))


def test_sink_attention_gradcheck_float64():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    sinks = torch.randn(2, generator=g, dtype=torch.float64, requires_grad=True)
    mask = causal_mask(3, 5, offset=2)
    assert torch.autograd.gradcheck(lambda a, b, c: sink_attention_weights(a, b, c, mask=mask), (q, k, sinks))


def test_sink_attention_bad_input():
    q, k = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    with pytest.raises(ValueError, match=r"sinks must have shape \(H,\)"):
        sink_attention_weights(q, k, torch.zeros(3))
    with pytest.raises(TypeError, match="sinks must be a floating-point"):
        sink_attention_weights(q, k, torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="q must have shape"):
        sink_attention_weights(torch.randn(3, 4), torch.randn(5, 4), torch.zeros(1))
    with pytest.raises(ValueError, match="does not broadcast"):
        sink_attention_weights(q, k, torch.zeros(2), mask=torch.ones(3, 4, dtype=torch.bool))


# ---------------------------------------------------------------- attention_entropy (moved from notebook 04)

from llmbook.transformer.attention import attention_entropy  # noqa: E402


def test_attention_entropy_worked_examples():
    # uniform rows: log T_k; one-hot rows: 0; two equal weights: log 2; T_q = 3 != T_k = 5
    assert torch.allclose(attention_entropy(torch.zeros(2, 3, 5, dtype=torch.float64)),
                          torch.full((2, 3), math.log(5), dtype=torch.float64), rtol=0, atol=1e-15)
    one_hot = torch.eye(5, dtype=torch.float64)[:3]  # (3, 5)
    assert torch.equal(attention_entropy(weights=one_hot).abs(), torch.zeros(3, dtype=torch.float64))
    # p = (1/4, 1/4, 1/2): H = 2 (1/4) log 4 + (1/2) log 2 = (3/2) log 2
    w = torch.tensor([[0.25, 0.25, 0.5]], dtype=torch.float64)
    assert abs(attention_entropy(weights=w).item() - 1.5 * math.log(2)) < 1e-15
    assert abs(attention_entropy(w.log()).item() - 1.5 * math.log(2)) < 1e-15
    # masked keys (-inf) count 0: two finite equal scores of four give log 2
    s = torch.tensor([[3.0, float("-inf"), 3.0, float("-inf")]], dtype=torch.float64)
    assert abs(attention_entropy(s).item() - math.log(2)) < 1e-15
    # a fully masked row (attention_weights' zero row) has entropy 0, from scores and weights
    dead = torch.full((1, 4), float("-inf"))
    assert attention_entropy(dead).item() == 0
    assert attention_entropy(weights=attention_weights(torch.ones(1, 2), torch.ones(4, 2),
                                                       mask=torch.zeros(1, 4, dtype=torch.bool))).item() == 0


@settings(max_examples=40, deadline=None)
@given(lead=st.integers(1, 3), T_q=st.integers(1, 5), T_k=st.integers(1, 9), spread=st.floats(0.0, 30.0),
       seed=st.integers(0, 10**6))
def test_attention_entropy_equals_torch_categorical(lead, T_q, T_k, spread, seed):
    scores = spread * torch.randn(lead, T_q, T_k, generator=torch.Generator().manual_seed(seed),
                                  dtype=torch.float64)
    peer = torch.distributions.Categorical(logits=scores).entropy()  # (lead, T_q)
    got = attention_entropy(scores)
    assert got.shape == (lead, T_q)
    assert torch.allclose(got, peer, rtol=0, atol=1e-12)
    w = torch.softmax(scores, dim=-1)
    assert torch.allclose(attention_entropy(weights=w), torch.distributions.Categorical(probs=w).entropy(),
                          rtol=0, atol=1e-12)
    # bounds: 0 <= H <= log T_k, and scaling scores by 0 gives the uniform row
    assert bool((got >= -1e-15).all()) and bool((got <= math.log(T_k) + 1e-12).all())
    assert torch.allclose(attention_entropy(0 * scores), torch.full_like(got, math.log(T_k)), atol=1e-15)


@settings(max_examples=25, deadline=None)
@given(T_k=st.integers(2, 8), seed=st.integers(0, 10**6))
def test_attention_entropy_falls_as_scores_sharpen(T_k, seed):
    # dH/dbeta = -beta Var_p(s) <= 0 for scores beta s: sharpening never spreads a row
    s = torch.randn(T_k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    hs = [attention_entropy(beta * s).item() for beta in (0.0, 0.5, 1.0, 2.0, 4.0)]
    assert all(a >= b - 1e-12 for a, b in zip(hs, hs[1:], strict=False))


def test_attention_entropy_gradcheck_float64():
    s = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(7), dtype=torch.float64,
                    requires_grad=True)
    assert torch.autograd.gradcheck(attention_entropy, (s,))
    # the weights path, through the softmax (a perturbed p leaves the simplex and is refused)
    assert torch.autograd.gradcheck(lambda t: attention_entropy(weights=torch.softmax(t, -1)), (s,))


def test_attention_entropy_bad_input():
    with pytest.raises(ValueError, match="exactly one of scores"):
        attention_entropy()
    with pytest.raises(ValueError, match="exactly one of scores"):
        attention_entropy(torch.zeros(3), weights=torch.ones(3) / 3)
    with pytest.raises(TypeError, match="scores must be a torch.Tensor"):
        attention_entropy([0.0, 1.0])
    with pytest.raises(TypeError, match="weights must be a floating-point"):
        attention_entropy(weights=torch.ones(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"T_k >= 1, got \(\)"):
        attention_entropy(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"T_k >= 1, got \(2, 0\)"):
        attention_entropy(torch.zeros(2, 0))
    with pytest.raises(ValueError, match="scores must not hold NaN"):
        attention_entropy(torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match=r"\+inf"):
        attention_entropy(torch.tensor([0.0, float("inf")]))
    with pytest.raises(ValueError, match="rows summing to 1"):  # scores passed as weights
        attention_entropy(weights=torch.tensor([[0.5, 2.0, 1.0]]))
    with pytest.raises(ValueError, match="rows summing to 1"):
        attention_entropy(weights=torch.tensor([[1.5, -0.5]]))


# ---------------------------------------------------------------- the normalise_qk hook


def test_normalise_qk_is_the_identity_and_runs_between_projection_and_rope():
    g = torch.Generator().manual_seed(11)
    mha = MultiHeadAttention(12, 4, 2, d_head=6, dtype=torch.float64)
    q, k = randn(2, 4, 7, 6, g=g, dtype=torch.float64), randn(2, 2, 7, 6, g=g, dtype=torch.float64)
    q2, k2 = mha.normalise_qk(q, k)
    assert q2 is q and k2 is k

    class Shifted(MultiHeadAttention):  # overrides only the hook, with an affine (not linear) map
        def normalise_qk(self, q, k):
            return 2 * q + 1, k - 3

    shifted = Shifted(12, 4, 2, d_head=6, dtype=torch.float64)
    shifted.load_state_dict(mha.state_dict())
    x = randn(2, 7, 12, g=g, dtype=torch.float64)
    qa, ka, va = mha.project_qkv(x)  # (2, 4, 7, 6), (2, 2, 7, 6) x 2
    rope, _, _ = make_rope(6, 7)
    qb, kb, vb = shifted.project_qkv(x, rope=rope)
    pos = torch.arange(7)
    # the hook acts on the projected heads and the rotation after it (rope(q) + 1 would differ)
    assert torch.allclose(qb, rope(2 * qa + 1, pos), rtol=0, atol=1e-14)
    assert torch.allclose(kb, rope(ka - 3, pos), rtol=0, atol=1e-14)
    assert not torch.allclose(qb, 2 * rope(qa, pos) + 1)
    assert torch.equal(vb, va)
