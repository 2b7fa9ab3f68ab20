"""Checks of chapter 4's exercises (notebooks/04_attention), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are the book's attention (:mod:`llmbook.transformer.attention`: separate runs of
each sequence, PyTorch's autograd through it, ``sink_attention_weights``), SymPy and a
Monte Carlo estimate, and the extreme case of QK-norm built by hand.
"""

from __future__ import annotations

import math

import sympy as sp
import torch

from llmbook.transformer.attention import MultiHeadAttention, attention_weights, causal_mask
from llmbook.workbench.checks import raises


def exercise_1_padding_mask_equals_separate_runs(solutions) -> None:
    g = torch.Generator().manual_seed(0)
    lengths, T, d = torch.tensor([5, 2, 7]), 7, 12
    m = solutions.padding_mask(lengths, T)
    shape, dtype = tuple(m.shape), m.dtype
    assert shape == (3, 1, 1, T) and dtype == torch.bool, (
        f"expected a torch.bool mask of shape (3, 1, 1, {T}), got {dtype} of shape {shape}")
    row = m[1, 0, 0].int().tolist()
    assert row == [1, 1, 0, 0, 0, 0, 0], f"expected sequence 1 (length 2) to read [1, 1, 0, 0, 0, 0, 0], got {row}"
    mha = MultiHeadAttention(d, 3, dtype=torch.float64)
    x = torch.randn(3, T, d, generator=g, dtype=torch.float64)
    y = mha(x, mask=m)
    for b, n in enumerate(lengths.tolist()):
        alone = mha(x[b: b + 1, :n])[0]
        error = (y[b, :n] - alone).abs().max().item()
        assert torch.allclose(y[b, :n], alone, rtol=0, atol=1e-14), (
            f"expected sequence {b} (length {n}) in the padded batch to equal its run alone to 1e-14, "
            f"largest difference {error:.3g}")
    # without the mask the padded keys leak into the non-causal outputs of sequence 1
    leaked = torch.allclose(mha(x, is_causal=False)[1, :2], mha(x[1:2, :2], is_causal=False)[0])
    assert not leaked, "without a mask the padded keys should change the non-causal outputs of sequence 1"
    masked, alone = mha(x, mask=m, is_causal=False)[1, :2], mha(x[1:2, :2], is_causal=False)[0]
    error = (masked - alone).abs().max().item()
    assert torch.allclose(masked, alone, rtol=0, atol=1e-14), (
        f"expected the mask to keep the padded keys out without the causal mask too (to 1e-14), "
        f"largest difference {error:.3g}")
    with raises(ValueError, match="lengths must lie in", what="padding_mask([0, 3], 4)"):
        solutions.padding_mask(torch.tensor([0, 3]), 4)


def exercise_2_score_moments(solutions) -> None:
    mean, var, scale, (mu, sigma, d) = solutions.score_moments()
    gap = sp.simplify(mean - d * mu**2)
    assert gap == 0, f"expected the mean d mu^2, got {mean} (difference {gap})"
    gap = sp.simplify(var - d * (sigma**4 + 2 * mu**2 * sigma**2))
    assert gap == 0, f"expected the variance d (sigma^4 + 2 mu^2 sigma^2), got {var} (difference {gap})"
    gap = sp.simplify(var.subs({mu: 0, sigma: 1}) - d)
    assert gap == 0, f"expected the variance d at mu = 0, sigma = 1, got {var.subs({mu: 0, sigma: 1})}"
    gap = sp.simplify(scale**2 * var - 1)
    assert gap == 0, f"expected scale^2 var = 1, got scale = {scale} (scale^2 var - 1 = {gap})"
    # Monte Carlo: mu = 0.5, sigma = 2, d = 16
    g = torch.Generator().manual_seed(1)
    n, dd = 200_000, 16
    q = 0.5 + 2 * torch.randn(n, dd, generator=g, dtype=torch.float64)
    k = 0.5 + 2 * torch.randn(n, dd, generator=g, dtype=torch.float64)
    s = (q * k).sum(-1)
    subs = {mu: 0.5, sigma: 2, d: dd}
    v_exact = float(var.subs(subs))
    sampled, formula = s.mean().item(), float(mean.subs(subs))
    assert abs(sampled - formula) < 4 * math.sqrt(v_exact / n), (
        f"expected the mean at mu = 0.5, sigma = 2, d = 16 within 4 standard errors of "
        f"200,000 samples' {sampled:.5g}, got {formula:.5g}")
    sampled = s.var().item()
    assert abs(sampled / v_exact - 1) < 0.02, (
        f"expected the variance within 2 % of 200,000 samples' {sampled:.5g}, got {v_exact:.5g}")
    scaled = (s * float(scale.subs(subs))).var().item()
    assert abs(scaled - 1) < 0.02, f"expected the scaled scores' variance within 2 % of 1, got {scaled:.5g}"


def exercise_3_mha_to_gqa(solutions) -> None:
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
    n_kv, k_shape = gqa.n_kv_heads, tuple(gqa.k_proj.weight.shape)
    assert n_kv == H_kv and k_shape == (H_kv * d // H, d), (
        f"expected {H_kv} key-value heads and k_proj of shape {(H_kv * d // H, d)}, got {n_kv} and {k_shape}")
    error = (gqa(x) - mha(x)).abs().max().item()
    assert torch.allclose(gqa(x), mha(x), rtol=0, atol=1e-14), (
        f"expected the grouped layer to equal the multi-head one whose grouped heads agree (to 1e-14), "
        f"largest difference {error:.3g}")
    saved = sum(p.numel() for p in mha.parameters()) - sum(p.numel() for p in gqa.parameters())
    want = 2 * (H - H_kv) * (d // H) * (d + 1)
    assert saved == want, f"expected {want} parameters saved (k and v, weights and biases), got {saved}"
    # a random multi-head layer: the pooled weights are the group means
    mha2 = MultiHeadAttention(d, H, dtype=torch.float64)
    gqa2 = solutions.mha_to_gqa(mha2, 3)
    W = mha2.v_proj.weight.view(3, 2, d // H, d)
    assert torch.allclose(gqa2.v_proj.weight.view(3, d // H, d), (W[:, 0] + W[:, 1]) / 2), (
        "expected each pooled v_proj head to be the mean of its group's heads")
    assert not torch.allclose(gqa2(x), mha2(x)), (
        "expected a random multi-head layer to change when pooled into groups")
    with raises(ValueError, match="expected a multi-head layer", what="mha_to_gqa on a grouped layer"):
        solutions.mha_to_gqa(gqa, 1)


def exercise_4_attention_backward_matches_autograd(solutions) -> None:
    from llmbook.transformer.attention import scaled_dot_product_attention

    for causal in (False, True):
        g = torch.Generator().manual_seed(3)
        q = torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)
        k = torch.randn(2, 3, 6, 4, generator=g, dtype=torch.float64, requires_grad=True)
        v = torch.randn(2, 3, 6, 7, generator=g, dtype=torch.float64, requires_grad=True)
        G = torch.randn(2, 3, 5, 7, generator=g, dtype=torch.float64)
        mask = causal_mask(5, 6, offset=1) if causal else None
        scaled_dot_product_attention(q, k, v, mask=mask).backward(G)
        dq, dk, dv = solutions.attention_backward(q.detach(), k.detach(), v.detach(), G, mask=mask)
        for name, ours, ref in (("dq", dq, q.grad), ("dk", dk, k.grad), ("dv", dv, v.grad)):
            error = (ours - ref).abs().max().item()
            assert torch.allclose(ours, ref, rtol=0, atol=1e-13), (
                f"expected {name} to equal autograd's to 1e-13 ({'causal' if causal else 'no'} mask), "
                f"largest difference {error:.3g}")
            largest = ref.abs().max().item()
            assert largest > 1e-2, f"the reference {name} is too small to test: {largest:.3g}"
        dq2, _, _ = solutions.attention_backward(q.detach(), k.detach(), v.detach(), G, is_causal=True,
                                                 scale=0.5)
        q2 = q.detach().clone().requires_grad_()
        scaled_dot_product_attention(q2, k.detach(), v.detach(), is_causal=True, scale=0.5).backward(G)
        error = (dq2 - q2.grad).abs().max().item()
        assert torch.allclose(dq2, q2.grad, rtol=0, atol=1e-13), (
            f"expected dq with is_causal=True, scale=0.5 to equal autograd's to 1e-13, "
            f"largest difference {error:.3g}")


def exercise_5_qk_norm_weight_floor(solutions) -> None:
    from llmbook.transformer.layers import RMSNorm

    d_head, T = 16, 9
    floor = solutions.qk_norm_weight_floor(d_head, T)
    want = 1 / (1 + 8 * math.exp(8))
    assert abs(floor - want) <= max(1e-15 * abs(want), 1e-12), (
        f"expected 1 / (1 + 8 e^8) = {want!r} for d_head = 16, T = 9, got {floor!r}")
    norm = RMSNorm(d_head, eps=1e-300, dtype=torch.float64)  # eps > 0 is required; this one is negligible
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(500, 1, d_head, generator=gen, dtype=torch.float64)
    k = torch.randn(500, T, d_head, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        A = attention_weights(norm(q), norm(k))  # (500, 1, T)
        lowest = A.min().item()
        assert lowest >= floor, f"a random query gave an attention weight {lowest!r} below the floor {floor!r}"
        # the extreme case: key 0 opposite to the query, the others along it
        u = torch.randn(d_head, generator=gen, dtype=torch.float64)
        k_ext = torch.stack([-u] + [u] * (T - 1))[None]  # (1, T, d)
        A_ext = attention_weights(norm(u[None, None]), norm(k_ext))
    attained = A_ext[0, 0, 0].item()
    assert abs(attained - floor) <= max(1e-12 * abs(floor), 1e-12), (
        f"expected the floor {floor!r} to be attained by a key opposite the query, which gets {attained!r}")
    wide, narrow = solutions.qk_norm_weight_floor(64, 32), solutions.qk_norm_weight_floor(16, 32)
    assert wide < narrow, f"expected a lower floor for d_head = 64 than 16, got {wide!r} and {narrow!r}"


def exercise_6_sink_is_an_extra_key_with_zero_value(solutions) -> None:
    from llmbook.transformer.attention import sink_attention_weights

    g = torch.Generator().manual_seed(6)
    q = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, 7, 5, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, 7, 6, generator=g, dtype=torch.float64)
    sinks = torch.tensor([-1.0, 0.5, 3.0], dtype=torch.float64)
    mask = causal_mask(4, 7, offset=3)
    w, left = sink_attention_weights(q, k, sinks, mask=mask)
    out = solutions.sink_as_extra_key(q, k, v, sinks, mask=mask)
    shape = tuple(out.shape)
    assert shape == (2, 3, 4, 6), f"expected shape (2, 3, 4, 6), got {shape}"
    error = (out - w @ v).abs().max().item()
    assert torch.allclose(out, w @ v, rtol=0, atol=1e-14), (
        f"expected sink_attention_weights' weights times v (to 1e-14), largest difference {error:.3g}")
    taken = left.min().item()
    assert taken > 0.01, f"the sinks take too little weight to test: {taken:.3g}"  # so this differs from plain
    assert not torch.allclose(out, attention_weights(q, k, mask=mask) @ v, atol=1e-3), (
        "expected the sinks to change the output from plain attention's")
