"""Tests for llmbook.inference.flash: online softmax, the merge rule, tiled attention and its backward."""

import math

import pytest
import sympy as sp
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.inference.attention_variants import sliding_window_mask
from llmbook.inference.flash import (
    attention_arithmetic_intensity,
    attention_hbm_accesses,
    causal_mask_mod,
    document_mask_mod,
    flash_attention_backward_reference,
    flash_attention_masked,
    flash_attention_reference,
    flash_attention_tiled,
    merge_softmax_states,
    online_softmax,
    peak_memory_bytes,
    sliding_window_mask_mod,
    softmax_state,
    split_kv_attention,
)
from llmbook.transformer.attention import scaled_dot_product_attention

F64 = torch.float64


def _randn(*shape, seed=0, dtype=F64, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(requires_grad)


def _err(a, b):
    return (a.double() - b.double()).abs().max().item()


# ---------------------------------------------------------------- states and the merge rule


def test_softmax_state_worked_example():
    s = torch.tensor([0.0, math.log(2.0), math.log(4.0)], dtype=F64)
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=F64)  # (n=3, d_v=2)
    m, ell, o = softmax_state(s, v)
    assert m.item() == pytest.approx(math.log(4.0))
    assert ell.item() == pytest.approx(1.75)  # (1 + 2 + 4) / 4
    assert o.tolist() == pytest.approx([1.25, 1.5])  # (1*[1,0] + 2*[0,1] + 4*[1,1]) / 4
    assert (o / ell).tolist() == pytest.approx([5 / 7, 6 / 7])  # the softmax-weighted average


def test_merge_two_blocks_equals_whole():
    s, v = _randn(4, 11, seed=1), _randn(11, 3, seed=2)
    s = s.unsqueeze(-2)  # (4, 1, 11): four independent rows of one query
    v = v.expand(4, 11, 3)
    m, ell, o = merge_softmax_states(softmax_state(s[..., :4], v[..., :4, :]),
                                   softmax_state(s[..., 4:], v[..., 4:, :]))
    expected = torch.softmax(s, -1) @ v  # (4, 1, 3)
    assert _err(o / ell.unsqueeze(-1), expected) < 1e-14
    assert _err(m + torch.log(ell), torch.logsumexp(s, -1)) < 1e-14


def test_merge_is_commutative_and_associative_numerically():
    states = [softmax_state(_randn(3, 2, 5, seed=i), _randn(3, 5, 4, seed=10 + i)) for i in range(3)]
    a, b, c = states
    left = merge_softmax_states(merge_softmax_states(a, b), c)
    right = merge_softmax_states(a, merge_softmax_states(b, c))
    swapped = merge_softmax_states(b, a)
    ab = merge_softmax_states(a, b)
    for x, y in zip(left, right, strict=True):
        assert _err(x, y) < 1e-13
    for x, y in zip(ab, swapped, strict=True):
        assert _err(x, y) < 1e-13


def test_empty_state_is_the_identity_and_fully_masked_rows_give_it():
    s = torch.full((2, 3), float("-inf"), dtype=F64)
    m, ell, o = softmax_state(s, torch.ones(3, 4, dtype=F64))
    assert torch.isneginf(m).all() and (ell == 0).all() and (o == 0).all()
    a = softmax_state(_randn(2, 3, seed=3), _randn(3, 4, seed=4))
    for x, y in zip(merge_softmax_states((m, ell, o), a), a, strict=True):
        assert torch.equal(x, y)
    both = merge_softmax_states((m, ell, o), (m, ell, o))  # no NaN from (-inf) - (-inf)
    assert not any(torch.isnan(t).any() for t in both)


def test_merge_rule_symbolic():
    """The merge of two blocks' states is exactly the full softmax-weighted sum (SymPy)."""
    s = sp.symbols("s1:6", real=True)
    v = sp.symbols("v1:6", real=True)

    def state(idx):
        m = sp.Max(*[s[i] for i in idx])
        return m, sum(sp.exp(s[i] - m) for i in idx), sum(sp.exp(s[i] - m) * v[i] for i in idx)

    def merge(a, b):
        m = sp.Max(a[0], b[0])
        al, be = sp.exp(a[0] - m), sp.exp(b[0] - m)
        return m, al * a[1] + be * b[1], al * a[2] + be * b[2]

    m, ell, o = merge(state([0, 1]), state([2, 3, 4]))
    direct = sum(sp.exp(s[i]) * v[i] for i in range(5)) / sum(sp.exp(s[i]) for i in range(5))
    assert sp.simplify(sp.powsimp(sp.expand(o / ell)) - direct) == 0
    a, b, c = state([0]), state([1, 2]), state([3, 4])
    for x, y in zip(merge(merge(a, b), c), merge(a, merge(b, c)), strict=True):
        assert sp.simplify(sp.powsimp(sp.expand(x - y))) == 0


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40), block=st.integers(1, 45), seed=st.integers(0, 2**16),
       spread=st.sampled_from([1.0, 30.0, 300.0]))
def test_online_softmax_equals_softmax_for_any_blocking(n, block, seed, spread):
    x = spread * _randn(3, n, seed=seed)
    p = online_softmax(x, block=block)
    assert _err(p, torch.softmax(x, -1)) < 1e-14
    assert _err(p.sum(-1), torch.ones(3, dtype=F64)) < 1e-13


@settings(max_examples=30, deadline=None)
@given(cuts=st.lists(st.integers(1, 19), min_size=1, max_size=5, unique=True),
       seed=st.integers(0, 2**16))
def test_folding_random_splits_gives_the_softmax_average(cuts, seed):
    s, v = 5 * _randn(2, 1, 20, seed=seed), _randn(2, 20, 3, seed=seed + 1)
    edges = [0, *sorted(cuts), 20]
    states = [softmax_state(s[..., a:b], v[..., a:b, :]) for a, b in zip(edges, edges[1:], strict=False)]
    m, ell, o = states[0]
    for st_ in states[1:]:
        m, ell, o = merge_softmax_states((m, ell, o), st_)
    assert _err(o / ell.unsqueeze(-1), torch.softmax(s, -1) @ v) < 1e-13


def test_online_softmax_float32_large_scores_do_not_overflow():
    x = torch.tensor([[1000.0, 999.0, -1000.0, 998.0]])
    assert _err(online_softmax(x, block=2), torch.softmax(x, -1)) < 1e-7


# ---------------------------------------------------------------- tiled forward and backward

CASES = [  # (T_q, T_k, d_k, d_v, block_q, block_k, causal)
    (37, 37, 16, 16, 16, 16, False),
    (37, 37, 16, 16, 16, 16, True),
    (50, 50, 8, 12, 16, 8, True),
    (45, 70, 16, 24, 16, 32, False),
    (70, 45, 16, 16, 32, 16, True),
    (5, 5, 4, 4, 64, 64, True),  # one block
]


@pytest.mark.parametrize("T_q,T_k,d_k,d_v,bq,bk,causal", CASES)
def test_reference_forward_equals_naive_and_torch(T_q, T_k, d_k, d_v, bq, bk, causal):
    q, k, v = _randn(2, 3, T_q, d_k, seed=1), _randn(2, 3, T_k, d_k, seed=2), _randn(2, 3, T_k, d_v, seed=3)
    out, lse = flash_attention_reference(q, k, v, is_causal=causal, block_q=bq, block_k=bk,
                                         return_lse=True)
    assert out.shape == (2, 3, T_q, d_v) and lse.shape == (2, 3, T_q)
    assert _err(out, scaled_dot_product_attention(q, k, v, is_causal=causal)) < 1e-12
    assert _err(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal)) < 1e-12
    s = q @ k.transpose(-2, -1) / math.sqrt(d_k)
    if causal:
        s = s.masked_fill(~torch.ones(T_q, T_k, dtype=torch.bool).tril(), float("-inf"))
    assert _err(lse, torch.logsumexp(s, -1)) < 1e-12


@pytest.mark.parametrize("causal", [False, True])
def test_reference_float32_within_1e5_forward_and_grads(causal):
    q, k, v = (_randn(2, 2, 53, 16, seed=i, dtype=torch.float32, requires_grad=True)
               for i in range(3))
    do = _randn(2, 2, 53, 16, seed=9, dtype=torch.float32)
    out = flash_attention_reference(q, k, v, is_causal=causal, block_q=16, block_k=16)
    naive = scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert _err(out, naive) < 1e-5
    for a, b in zip(torch.autograd.grad(out, (q, k, v), do),
                    torch.autograd.grad(naive, (q, k, v), do), strict=True):
        assert _err(a, b) < 1e-5


@pytest.mark.parametrize("T_q,T_k,d_k,d_v,bq,bk,causal", CASES)
def test_backward_reference_equals_autograd(T_q, T_k, d_k, d_v, bq, bk, causal):
    q, k, v = (_randn(2, T, d, seed=i, requires_grad=True)
               for i, (T, d) in enumerate([(T_q, d_k), (T_k, d_k), (T_k, d_v)]))
    do = _randn(2, T_q, d_v, seed=7)
    naive = scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.3)
    expected = torch.autograd.grad(naive, (q, k, v), do)
    out, lse = flash_attention_reference(q.detach(), k.detach(), v.detach(), is_causal=causal,
                                         block_q=bq, block_k=bk, scale=0.3, return_lse=True)
    got = flash_attention_backward_reference(q.detach(), k.detach(), v.detach(), out, lse, do,
                                             is_causal=causal, block_q=bq, block_k=bk, scale=0.3)
    for a, b in zip(expected, got, strict=True):
        assert a.shape == b.shape and _err(a, b) < 1e-12


@settings(max_examples=20, deadline=None)
@given(T_q=st.integers(1, 23), T_k=st.integers(1, 23), d_k=st.integers(1, 6), d_v=st.integers(1, 7),
       bq=st.integers(1, 9), bk=st.integers(1, 9), causal=st.booleans())
def test_algorithm2_backward_equals_torch_sdpa_autograd(T_q, T_k, d_k, d_v, bq, bk, causal):
    """FlashAttention-2's Algorithm 2 against autograd through torch's own attention, float64,
    any shapes and blocks (causal: top-left aligned, as torch's is_causal)."""
    if causal and T_k < T_q:
        T_k = T_q  # keep every query row with at least one visible key
    q, k, v = (_randn(1, 2, T, d, seed=i, requires_grad=True)
               for i, (T, d) in enumerate([(T_q, d_k), (T_k, d_k), (T_k, d_v)]))
    do = _randn(1, 2, T_q, d_v, seed=5)
    expected = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                   (q, k, v), do)
    out, lse = flash_attention_reference(q.detach(), k.detach(), v.detach(), is_causal=causal,
                                         block_q=bq, block_k=bk, return_lse=True)
    got = flash_attention_backward_reference(q.detach(), k.detach(), v.detach(), out, lse, do,
                                             is_causal=causal, block_q=bq, block_k=bk)
    for a, b in zip(expected, got, strict=True):
        assert a.shape == b.shape and _err(a, b) < 1e-12


def test_reference_gradcheck_through_the_tiles():
    q, k, v = (_randn(1, 9, 4, seed=i, requires_grad=True) for i in range(3))
    assert torch.autograd.gradcheck(
        lambda q, k, v: flash_attention_reference(q, k, v, is_causal=True, block_q=4, block_k=3),
        (q, k, v))


@pytest.mark.parametrize("causal", [False, True])
def test_tiled_function_joins_forward_and_backward(causal):
    q, k, v = (_randn(2, 3, T, d, seed=i, requires_grad=True)
               for i, (T, d) in enumerate([(11, 5), (13, 5), (13, 7)]))
    do = _randn(2, 3, 11, 7, seed=9)
    out = flash_attention_tiled(q, k, v, is_causal=causal, block_q=4, block_k=3, scale=0.4)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.4)
    assert _err(out, expected) < 1e-13
    # what the graph keeps is q, k, v, O and L: no (T_q, T_k) tensor
    saved = [t.shape for t in out.grad_fn.saved_tensors]
    assert saved == [q.shape, k.shape, v.shape, out.shape, out.shape[:-1]]
    for a, b in zip(torch.autograd.grad(out, (q, k, v), do),
                    torch.autograd.grad(expected, (q, k, v), do), strict=True):
        assert a.shape == b.shape and _err(a, b) < 1e-12


def test_tiled_function_gradcheck_and_defaults():
    q, k, v = (_randn(1, 9, 4, seed=i, requires_grad=True) for i in range(3))
    assert torch.autograd.gradcheck(
        lambda q, k, v: flash_attention_tiled(q, k, v, is_causal=True, block_q=4, block_k=3),
        (q, k, v))
    from llmbook.inference.flash import FlashAttentionReferenceFunction
    assert torch.equal(FlashAttentionReferenceFunction.apply(q, k, v),
                       flash_attention_tiled(q, k, v))
    with pytest.raises(ValueError, match="same last dimension"):
        flash_attention_tiled(q, k[..., :3], v)


def test_causal_output_ignores_the_future():
    q, k, v = _randn(1, 30, 8, seed=1), _randn(1, 30, 8, seed=2), _randn(1, 30, 8, seed=3)
    out = flash_attention_reference(q, k, v, is_causal=True, block_q=8, block_k=8)
    k2, v2 = k.clone(), v.clone()
    k2[:, 20:] += 5.0
    v2[:, 20:] -= 5.0
    out2 = flash_attention_reference(q, k2, v2, is_causal=True, block_q=8, block_k=8)
    assert torch.equal(out[:, :20], out2[:, :20])
    assert not torch.equal(out[:, 20:], out2[:, 20:])


def test_reference_bad_inputs():
    q, k, v = _randn(2, 5, 4), _randn(2, 6, 4), _randn(2, 6, 3)
    with pytest.raises(ValueError, match=r"same last dimension d_k.*\(2, 5, 4\).*\(2, 6, 5\)"):
        flash_attention_reference(q, _randn(2, 6, 5), v)
    with pytest.raises(ValueError, match=r"number of positions T_k.*\(2, 7, 3\)"):
        flash_attention_reference(q, k, _randn(2, 7, 3))
    with pytest.raises(ValueError, match=r"equal leading dimensions.*\(3, 6, 4\)"):
        flash_attention_reference(q, _randn(3, 6, 4), _randn(3, 6, 3))
    with pytest.raises(ValueError, match=r"block_q must be positive"):
        flash_attention_reference(q, k, v, block_q=0)
    with pytest.raises(TypeError, match=r"block_k must be an int"):
        flash_attention_reference(q, k, v, block_k=2.0)
    with pytest.raises(TypeError, match=r"floating-point"):
        flash_attention_reference(q, k, torch.ones(2, 6, 3, dtype=torch.long))
    with pytest.raises(TypeError, match=r"share a dtype"):
        flash_attention_reference(q, k, v.float())
    with pytest.raises(ValueError, match=r"at least 2 dimension"):
        flash_attention_reference(_randn(4), k, v)
    out, lse = flash_attention_reference(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match=r"lse of shape \(2, 5\)"):
        flash_attention_backward_reference(q, k, v, out, lse[:, :4], out)


def test_state_bad_inputs():
    with pytest.raises(ValueError, match=r"v must have shape .*\(2, 3\).*\(4, 2\)"):
        softmax_state(_randn(2, 3), _randn(4, 2))
    with pytest.raises(ValueError, match=r"at least one score"):
        softmax_state(torch.zeros(2, 0, dtype=F64))
    a = softmax_state(_randn(2, 3), _randn(3, 4))
    with pytest.raises(ValueError, match=r"both states carry an output"):
        merge_softmax_states(a, (a[0], a[1], None))
    with pytest.raises(ValueError, match=r"one shape.*m2 \(3,\)"):
        merge_softmax_states(a, (_randn(3), _randn(3), _randn(3, 4)))
    with pytest.raises(TypeError, match=r"two \(m, l, o\) tuples"):
        merge_softmax_states(a, a[:2])
    with pytest.raises(ValueError, match=r"block must be positive"):
        online_softmax(_randn(3), block=0)


# ---------------------------------------------------------------- IO counts and memory


def test_hbm_accesses_worked_example():
    counts = attention_hbm_accesses(T=1024, d=64, sram=65536)  # B_r = 65536 / 256 = 256
    assert counts["block_q"] == 256
    assert counts["standard"] == 4 * 1024 * 64 + 4 * 1024**2 == 4456448
    assert counts["flash"] == 2 * 1024 * 64 + 1024 + 2 * 1024 * 64 * 4 == 656384


def test_hbm_accesses_block_sizes_follow_dao_and_fit_in_sram():
    """Dao et al. (2022), Algorithm 1: ceil(M / 4d) rows held, min(ceil(M / 4d), d) streamed."""
    a100 = attention_hbm_accesses(T=4096, d=64, sram=98304)  # 384 = 98304 / 256
    assert (a100["block_q"], a100["block_k"]) == (384, 64)
    assert a100["sram_used"] == 2 * 384 * 64 + 2 * 64 * 64 + 384 * 64 == 81920 <= 98304
    odd = attention_hbm_accesses(T=100, d=24, sram=5000)  # ceil(5000 / 96) = 53, not floor 52
    assert (odd["block_q"], odd["block_k"]) == (53, 24)
    small = attention_hbm_accesses(T=100, d=64, sram=4096)  # M < 4 d^2: both blocks M/4d = 16
    assert (small["block_q"], small["block_k"]) == (16, 16)
    assert small["sram_used"] == 4096 + 16 * 16  # M + M^2 / (16 d^2): does not fit
    for M in (8 * 64**2, 8 * 64**2 + 256 * 5, 2**17):  # 4d | M and M >= 8 d^2: 3M/4 + 2d^2 <= M
        used = attention_hbm_accesses(4096, 64, M)["sram_used"]
        assert used == 3 * M // 4 + 2 * 64**2 and used <= M
    forced = attention_hbm_accesses(T=1024, d=64, sram=98304, block_q=128)
    assert (forced["block_q"], forced["block_k"]) == (128, 64)
    assert forced["flash"] == 2 * 1024 * 64 + 1024 + 2 * 1024 * 64 * 8
    with pytest.raises(ValueError, match="block_q"):
        attention_hbm_accesses(1024, 64, 98304, block_q=0)


def test_hbm_accesses_count_matches_the_tiled_loop_and_scales_as_the_theorem():
    T, d, sram = 1000, 32, 4000  # B_r = ceil(4000 / 128) = 32, not a divisor of T
    counts = attention_hbm_accesses(T, d, sram)
    B_r = counts["block_q"]
    loads = 0
    for i0 in range(0, T, B_r):  # per query block: Q_i read, O_i and L_i written, all of K, V read
        rows = min(B_r, T - i0)
        loads += rows * d + rows * d + rows + 2 * T * d
    assert loads == counts["flash"]
    big = [attention_hbm_accesses(4096, 64, m)["flash"] for m in (2**14, 2**16)]
    assert 3.5 < big[0] / big[1] < 4.1  # Theta(T^2 d^2 / M): 4x the SRAM, ~1/4 the traffic
    with pytest.raises(ValueError, match=r"sram=100 .* d=32"):
        attention_hbm_accesses(10, 32, 100)


@pytest.mark.parametrize("T,d,block_q,block_k", [(37, 8, 16, 16), (64, 16, 16, 8),
                                                  (100, 4, 33, 7)])
def test_io_counter_of_the_tiled_pass_equals_the_formula(T, d, block_q, block_k):
    """Counted in the loop: reads + writes = attention_hbm_accesses' flash count, with the
    SRAM chosen so that B_r = block_q (the count is per head, whatever the batch)."""
    q, k, v = (_randn(2, 3, T, d, seed=i) for i in range(3))
    io = {}
    out = flash_attention_reference(q, k, v, block_q=block_q, block_k=block_k, io=io)
    torch.testing.assert_close(out, flash_attention_reference(q, k, v, block_q=block_q,
                                                              block_k=block_k))
    assert io["read"] + io["written"] == attention_hbm_accesses(T, d, 4 * d * block_q)["flash"]
    assert io["written"] == T * (d + 1)
    causal = {}
    flash_attention_reference(q, k, v, is_causal=True, block_q=block_q, block_k=block_k, io=causal)
    assert causal["written"] == io["written"] and causal["read"] < io["read"]


def test_io_counter_with_different_value_width():
    q, k = _randn(1, 10, 4, seed=0), _randn(1, 12, 4, seed=1)
    v = _randn(1, 12, 6, seed=2)
    io = {"read": 5}  # an existing count is added to
    flash_attention_reference(q, k, v, block_q=4, block_k=5, io=io)
    n_qblocks = 3  # ceil(10 / 4)
    assert io["read"] == 5 + 10 * 4 + n_qblocks * 12 * (4 + 6)
    assert io["written"] == 10 * (6 + 1)


def test_arithmetic_intensity_worked_example_and_limits():
    ai = attention_arithmetic_intensity(T=1024, d=64, sram=65536)  # B_r = 256
    assert ai["flops"] == 4 * 1024**2 * 64
    assert ai["standard"] == pytest.approx(4 * 1024**2 * 64 / (2 * 4456448))
    assert ai["flash"] == pytest.approx(4 * 1024**2 * 64 / (2 * 656384))
    big = attention_arithmetic_intensity(T=2**20, d=64, sram=65536)
    assert big["standard"] == pytest.approx(64 / 2, rel=1e-3)  # d / bytes_per_element
    assert big["flash"] == pytest.approx(256, rel=1e-2)  # 2 B_r / bytes_per_element
    f32 = attention_arithmetic_intensity(T=1024, d=64, sram=65536, bytes_per_element=4)
    assert f32["standard"] == pytest.approx(ai["standard"] / 2)
    with pytest.raises(ValueError, match="bytes_per_element"):
        attention_arithmetic_intensity(1024, 64, 65536, bytes_per_element=0)


def test_peak_memory_of_naive_is_quadratic_and_of_tiled_is_linear():
    q, k, v = (_randn(1, 1, 512, 16, seed=i, dtype=torch.float32) for i in range(3))
    naive = peak_memory_bytes(scaled_dot_product_attention, q, k, v)
    tiled = peak_memory_bytes(flash_attention_reference, q, k, v, block_q=64, block_k=64)
    assert naive >= 512 * 512 * 4  # at least the score matrix
    assert tiled < 512 * 512 * 4 / 4
    assert peak_memory_bytes(scaled_dot_product_attention, q, k, v) == naive  # deterministic
    with pytest.raises(TypeError, match=r"callable"):
        peak_memory_bytes(3)


# ---------------------------------------------------------------- masks as functions, block sparsity


def _dense(mask_mod, T_q, T_k):
    i, j = torch.arange(T_q)[:, None], torch.arange(T_k)[None, :]
    return mask_mod(torch.tensor(0), torch.tensor(0), i, j).expand(T_q, T_k)


def test_mask_mods_worked_examples():
    assert torch.equal(_dense(causal_mask_mod(), 5, 7), torch.ones(5, 7, dtype=torch.bool).tril())
    for T, w in ((9, 1), (9, 3), (12, 20)):
        assert torch.equal(_dense(sliding_window_mask_mod(w), T, T), sliding_window_mask(T, T, w))
    docs = torch.tensor([0, 0, 0, 1, 1])
    expected = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0],
                             [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(_dense(document_mask_mod(docs), 5, 5), expected)


def test_mask_mods_bad_input():
    with pytest.raises(ValueError, match="window"):
        sliding_window_mask_mod(0)
    with pytest.raises(TypeError, match="doc_ids"):
        document_mask_mod(torch.tensor([0.0, 1.0]))
    with pytest.raises(TypeError, match="doc_ids"):
        document_mask_mod([0, 1])
    q = _randn(4, 8)
    with pytest.raises(TypeError, match="mask_mod"):
        flash_attention_masked(q, q, q, mask_mod=None)
    with pytest.raises(ValueError, match="block_k"):
        flash_attention_masked(q, q, q, causal_mask_mod(), block_k=0)


@settings(max_examples=25, deadline=None)
@given(T_q=st.integers(1, 40), T_k=st.integers(1, 40), block_q=st.integers(1, 17),
       block_k=st.integers(1, 17), window=st.integers(1, 45), kind=st.sampled_from(["causal", "window", "docs"]))
def test_masked_flash_equals_sdpa_with_the_dense_mask(T_q, T_k, block_q, block_k, window, kind):
    T = max(T_q, T_k)
    docs = torch.arange(T) // (window % 7 + 2)  # documents of window % 7 + 2 tokens
    mask_mod = {"causal": causal_mask_mod(), "window": sliding_window_mask_mod(window),
                "docs": document_mask_mod(docs)}[kind]
    q, k, v = _randn(2, T_q, 8, seed=1), _randn(2, T_k, 8, seed=2), _randn(2, T_k, 5, seed=3)
    blocks = {}
    out, lse = flash_attention_masked(q, k, v, mask_mod, block_q, block_k, return_lse=True,
                                      blocks=blocks)
    dense = _dense(mask_mod, T_q, T_k)
    s = (q @ k.transpose(-2, -1)) / math.sqrt(8)
    s = s.masked_fill(~dense, float("-inf"))
    seen = dense.any(-1)
    expected = torch.where(seen[:, None], torch.softmax(s, -1).nan_to_num(0.0) @ v, 0.0)
    assert _err(out, expected) < 1e-12
    assert torch.equal(torch.isneginf(lse), ~seen.expand(2, T_q))
    assert _err(lse[:, seen], torch.logsumexp(s, -1)[:, seen]) < 1e-12
    tiles = [(dense[i0:i0 + block_q, j0:j0 + block_k]) for i0 in range(0, T_q, block_q)
             for j0 in range(0, T_k, block_k)]
    assert blocks == {"full": sum(bool(t.all()) for t in tiles),
                      "skipped": sum(not bool(t.any()) for t in tiles),
                      "partial": sum(bool(t.any()) and not bool(t.all()) for t in tiles)}


def test_masked_flash_causal_worked_count_and_gradcheck():
    q, k, v = (_randn(1, 64, 8, seed=i) for i in range(3))
    blocks = {}
    out = flash_attention_masked(q, k, v, causal_mask_mod(), 16, 16, blocks=blocks)
    assert blocks == {"full": 6, "partial": 4, "skipped": 6}  # 4 x 4 tiles: below, on, above the diagonal
    assert _err(out, F.scaled_dot_product_attention(q, k, v, is_causal=True)) < 1e-12
    small = [_randn(1, 9, 4, seed=i, requires_grad=True) for i in range(3)]
    assert torch.autograd.gradcheck(
        lambda a, b, c: flash_attention_masked(a, b, c, sliding_window_mask_mod(3), 4, 4), small)


def _flex_peer(mask_mod, T, block):
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    return flex, flex.create_block_mask(mask_mod, None, None, T, T, device="cpu", BLOCK_SIZE=block)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("kind", ["causal", "window", "docs"])
def test_masked_flash_equals_flex_attention_and_its_block_mask(kind):
    T, block = 80, 16
    docs = torch.tensor([0] * 21 + [1] * 40 + [2] * 19)
    mask_mod = {"causal": causal_mask_mod(), "window": sliding_window_mask_mod(20),
                "docs": document_mask_mod(docs)}[kind]
    flex, block_mask = _flex_peer(mask_mod, T, block)
    q, k, v = (_randn(1, 2, T, 16, seed=i, dtype=torch.float32) for i in range(3))
    blocks = {}
    ours = flash_attention_masked(q, k, v, mask_mod, block, block, blocks=blocks)
    theirs = flex.flex_attention(q, k, v, block_mask=block_mask)
    assert _err(ours, theirs) < 1e-5
    assert blocks["partial"] == int(block_mask.kv_num_blocks.sum())
    assert blocks["full"] == int(block_mask.full_kv_num_blocks.sum())
    n_tiles = (T // block) ** 2
    assert 100 * blocks["skipped"] / n_tiles == pytest.approx(block_mask.sparsity())


# ---------------------------------------------------------------- split-KV


@settings(max_examples=25, deadline=None)
@given(T_q=st.integers(1, 4), T_k=st.integers(1, 60), data=st.data())
def test_split_kv_equals_sdpa(T_q, T_k, data):
    n_splits = data.draw(st.integers(1, T_k))
    q, k, v = _randn(2, 3, T_q, 8, seed=4), _randn(2, 3, T_k, 8, seed=5), _randn(2, 3, T_k, 6, seed=6)
    out, lse = split_kv_attention(q, k, v, n_splits, return_lse=True)
    assert _err(out, F.scaled_dot_product_attention(q, k, v)) < 1e-12
    assert _err(lse, torch.logsumexp(q @ k.transpose(-2, -1) / math.sqrt(8), -1)) < 1e-12


def test_split_kv_worked_example_and_bad_input():
    q = torch.zeros(1, 1, 2, dtype=F64)  # equal scores: the output is the mean of the values
    k = torch.zeros(5, 2, dtype=F64)[None]
    v = torch.arange(5, dtype=F64).reshape(1, 5, 1)
    out, lse = split_kv_attention(q, k, v, 2, return_lse=True)
    assert out.item() == pytest.approx(2.0) and lse.item() == pytest.approx(math.log(5))
    with pytest.raises(ValueError, match="n_splits"):
        split_kv_attention(q, k, v, 6)
    with pytest.raises(ValueError, match="n_splits"):
        split_kv_attention(q, k, v, 0)
    with pytest.raises(ValueError, match="T_k"):
        split_kv_attention(q, k[..., :3, :], v, 2)
