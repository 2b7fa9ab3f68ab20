"""The exercise solutions of notebooks/04_attention hold."""

import math

import pytest
import sympy as sp
import torch
from solution_loader import load_solutions

from llmbook.transformer.attention import MultiHeadAttention, attention_weights, causal_mask

solutions = load_solutions("04_attention")


def test_exercise_1_padding_mask_equals_separate_runs():
    g = torch.Generator().manual_seed(0)
    lengths, T, d = torch.tensor([5, 2, 7]), 7, 12
    m = solutions.padding_mask(lengths, T)
    assert m.shape == (3, 1, 1, T) and m.dtype == torch.bool
    assert m[1, 0, 0].int().tolist() == [1, 1, 0, 0, 0, 0, 0]
    mha = MultiHeadAttention(d, 3, dtype=torch.float64)
    x = torch.randn(3, T, d, generator=g, dtype=torch.float64)
    y = mha(x, mask=m)
    for b, n in enumerate(lengths.tolist()):
        alone = mha(x[b: b + 1, :n])[0]
        assert torch.allclose(y[b, :n], alone, rtol=0, atol=1e-14)
    # without the mask the padded keys leak into the non-causal outputs of sequence 1
    assert not torch.allclose(mha(x, is_causal=False)[1, :2], mha(x[1:2, :2], is_causal=False)[0])
    assert torch.allclose(mha(x, mask=m, is_causal=False)[1, :2], mha(x[1:2, :2], is_causal=False)[0],
                          rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="lengths must lie in"):
        solutions.padding_mask(torch.tensor([0, 3]), 4)


def test_exercise_2_score_moments():
    mean, var, scale, (mu, sigma, d) = solutions.score_moments()
    assert sp.simplify(mean - d * mu**2) == 0
    assert sp.simplify(var - d * (sigma**4 + 2 * mu**2 * sigma**2)) == 0
    assert sp.simplify(var.subs({mu: 0, sigma: 1}) - d) == 0
    assert sp.simplify(scale**2 * var - 1) == 0
    # Monte Carlo: mu = 0.5, sigma = 2, d = 16
    g = torch.Generator().manual_seed(1)
    n, dd = 200_000, 16
    q = 0.5 + 2 * torch.randn(n, dd, generator=g, dtype=torch.float64)
    k = 0.5 + 2 * torch.randn(n, dd, generator=g, dtype=torch.float64)
    s = (q * k).sum(-1)
    subs = {mu: 0.5, sigma: 2, d: dd}
    v_exact = float(var.subs(subs))
    assert abs(s.mean().item() - float(mean.subs(subs))) < 4 * math.sqrt(v_exact / n)
    assert abs(s.var().item() / v_exact - 1) < 0.02
    assert abs((s * float(scale.subs(subs))).var().item() - 1) < 0.02


def test_exercise_3_mha_to_gqa():
    g = torch.Generator().manual_seed(2)
    d, H, H_kv = 24, 6, 2
    mha = MultiHeadAttention(d, H, qkv_bias=True, dtype=torch.float64)
    with torch.no_grad():  # make the heads within each group equal in k and v
        for lin in (mha.k_proj, mha.v_proj):
            W = lin.weight.view(H_kv, H // H_kv, d // H, d)
            W.copy_(W[:, :1].expand_as(W).clone())
            b = lin.bias.view(H_kv, H // H_kv, d // H)
            b.copy_(b[:, :1].expand_as(b).clone())
    gqa = solutions.mha_to_gqa(mha, H_kv)
    x = torch.randn(2, 5, d, generator=g, dtype=torch.float64)
    assert gqa.n_kv_heads == H_kv and gqa.k_proj.weight.shape == (H_kv * d // H, d)
    assert torch.allclose(gqa(x), mha(x), rtol=0, atol=1e-14)
    saved = sum(p.numel() for p in mha.parameters()) - sum(p.numel() for p in gqa.parameters())
    assert saved == 2 * (H - H_kv) * (d // H) * (d + 1)
    # a random multi-head layer: the pooled weights are the group means
    mha2 = MultiHeadAttention(d, H, dtype=torch.float64)
    gqa2 = solutions.mha_to_gqa(mha2, 3)
    W = mha2.v_proj.weight.view(3, 2, d // H, d)
    assert torch.allclose(gqa2.v_proj.weight.view(3, d // H, d), (W[:, 0] + W[:, 1]) / 2)
    assert not torch.allclose(gqa2(x), mha2(x))
    with pytest.raises(ValueError, match="expected a multi-head layer"):
        solutions.mha_to_gqa(gqa, 1)


@pytest.mark.parametrize("causal", [False, True])
def test_exercise_4_attention_backward_matches_autograd(causal):
    from llmbook.transformer.attention import scaled_dot_product_attention

    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 3, 6, 7, generator=g, dtype=torch.float64, requires_grad=True)
    G = torch.randn(2, 3, 5, 7, generator=g, dtype=torch.float64)
    mask = causal_mask(5, 6, offset=1) if causal else None
    scaled_dot_product_attention(q, k, v, mask=mask).backward(G)
    dq, dk, dv = solutions.attention_backward(q.detach(), k.detach(), v.detach(), G, mask=mask)
    for ours, ref in ((dq, q.grad), (dk, k.grad), (dv, v.grad)):
        assert torch.allclose(ours, ref, rtol=0, atol=1e-13)
        assert ref.abs().max() > 1e-2
    dq2, _, _ = solutions.attention_backward(q.detach(), k.detach(), v.detach(), G, is_causal=True,
                                             scale=0.5)
    q2 = q.detach().clone().requires_grad_()
    scaled_dot_product_attention(q2, k.detach(), v.detach(), is_causal=True, scale=0.5).backward(G)
    assert torch.allclose(dq2, q2.grad, rtol=0, atol=1e-13)


def test_exercise_5_qk_norm_weight_floor():
    from llmbook.transformer.layers import RMSNorm

    d_head, T = 16, 9
    floor = solutions.qk_norm_weight_floor(d_head, T)
    assert floor == pytest.approx(1 / (1 + 8 * math.exp(8)), rel=1e-15)
    norm = RMSNorm(d_head, eps=1e-300, dtype=torch.float64)  # eps > 0 is required; this one is negligible
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(500, 1, d_head, generator=gen, dtype=torch.float64)
    k = torch.randn(500, T, d_head, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        A = attention_weights(norm(q), norm(k))  # (500, 1, T)
        assert A.min().item() >= floor
        # the extreme case: key 0 opposite to the query, the others along it
        u = torch.randn(d_head, generator=gen, dtype=torch.float64)
        k_ext = torch.stack([-u] + [u] * (T - 1))[None]  # (1, T, d)
        A_ext = attention_weights(norm(u[None, None]), norm(k_ext))
    assert A_ext[0, 0, 0].item() == pytest.approx(floor, rel=1e-12)
    assert solutions.qk_norm_weight_floor(64, 32) < solutions.qk_norm_weight_floor(16, 32)


def test_exercise_6_sink_is_an_extra_key_with_zero_value():
    from llmbook.transformer.attention import sink_attention_weights

    g = torch.Generator().manual_seed(6)
    q = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, 7, 5, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, 7, 6, generator=g, dtype=torch.float64)
    sinks = torch.tensor([-1.0, 0.5, 3.0], dtype=torch.float64)
    mask = causal_mask(4, 7, offset=3)
    w, left = sink_attention_weights(q, k, sinks, mask=mask)
    out = solutions.sink_as_extra_key(q, k, v, sinks, mask=mask)
    assert out.shape == (2, 3, 4, 6)
    assert torch.allclose(out, w @ v, rtol=0, atol=1e-14)
    assert left.min() > 0.01  # the sink takes weight, so this differs from plain attention
    assert not torch.allclose(out, attention_weights(q, k, mask=mask) @ v, atol=1e-3)
