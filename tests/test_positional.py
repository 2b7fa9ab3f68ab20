"""Tests for llmbook.transformer.positional: sinusoidal, learned, rotary (RoPE) and ALiBi positions."""

import math

import pytest
import sympy as sp
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.transformer.positional import (
    LearnedPositions,
    RotaryEmbedding,
    alibi_bias,
    alibi_slopes,
    apply_rotary,
    rope_frequencies,
    rope_matrix,
    rope_permutation,
    rotate_half,
    sinusoidal_positions,
    sinusoidal_shift_matrix,
)


def rope_complex(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """An independent interleaved RoPE: pairs as complex numbers times e^(i m theta_j)."""
    d = x.shape[-1]
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    angles = positions.to(torch.float64)[..., None] * freqs  # (..., T, d/2)
    rot = torch.polar(torch.ones_like(angles), angles)  # e^(i angle)
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(z * rot).reshape(x.shape)


# ---------------------------------------------------------------- sinusoidal


def test_sinusoidal_worked_example():
    pe = sinusoidal_positions(3, 4, dtype=torch.float64)  # w = (1, 0.01)
    expected = torch.tensor(
        [
            [0.0, 1.0, 0.0, 1.0],
            [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)],
            [math.sin(2), math.cos(2), math.sin(0.02), math.cos(0.02)],
        ],
        dtype=torch.float64,
    )
    assert torch.allclose(pe, expected, rtol=0, atol=1e-15)
    assert sinusoidal_positions(5, 6).dtype == torch.float32


def test_sinusoidal_equals_sympy_formula():
    pos, i, d, base = sp.symbols("pos i d base", positive=True)
    angle = pos / base ** (2 * i / d)
    f_sin = sp.lambdify((pos, i, d, base), sp.sin(angle), "math")
    f_cos = sp.lambdify((pos, i, d, base), sp.cos(angle), "math")
    T, D, b = 11, 10, 500.0  # T != d, a non-default base
    pe = sinusoidal_positions(T, D, base=b, dtype=torch.float64)
    ref = torch.tensor(
        [[(f_sin if c % 2 == 0 else f_cos)(p, c // 2, D, b) for c in range(D)] for p in range(T)],
        dtype=torch.float64,
    )
    assert torch.allclose(pe, ref, rtol=0, atol=1e-14)


def test_sinusoidal_rotation_property_symbolic():
    p, k, w = sp.symbols("p k omega", real=True)
    pair = sp.Matrix([sp.sin(p * w), sp.cos(p * w)])
    M = sp.Matrix([[sp.cos(k * w), sp.sin(k * w)], [-sp.sin(k * w), sp.cos(k * w)]])
    shifted = pair.subs(p, p + k)
    assert sp.simplify(sp.expand_trig(shifted - M * pair)) == sp.zeros(2, 1)
    assert sp.simplify(M.T * M) == sp.eye(2)


@pytest.mark.parametrize("k", [1, 3, 17, -5])
def test_sinusoidal_shift_matrix(k):
    T, d = 40, 12
    pe = sinusoidal_positions(T, d, dtype=torch.float64)
    M = sinusoidal_shift_matrix(k, d)
    if k > 0:
        assert torch.allclose(pe[k:], pe[:-k] @ M.T, rtol=0, atol=1e-13)
    else:
        assert torch.allclose(pe[:k], pe[-k:] @ M.T, rtol=0, atol=1e-13)
    assert torch.allclose(M.T @ M, torch.eye(d, dtype=torch.float64), atol=1e-14)
    assert torch.allclose(M @ sinusoidal_shift_matrix(-k, d), torch.eye(d, dtype=torch.float64),
                          atol=1e-14)


def test_sinusoidal_bad_inputs():
    with pytest.raises(ValueError, match="d_model must be even.*d_model=5"):
        sinusoidal_positions(4, 5)
    with pytest.raises(ValueError, match="num_positions must be positive"):
        sinusoidal_positions(0, 4)
    with pytest.raises(ValueError, match="base must be a number greater than 1"):
        sinusoidal_positions(4, 4, base=1.0)
    with pytest.raises(TypeError, match="offset must be an int"):
        sinusoidal_shift_matrix(1.5, 4)


# ---------------------------------------------------------------- learned


def test_learned_positions_equal_nn_embedding():
    g = torch.Generator().manual_seed(0)
    wpe = LearnedPositions(16, 6, generator=g)  # T_max=16 != d=6
    ref = torch.nn.Embedding(16, 6)
    ref.load_state_dict(wpe.state_dict())
    pos = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 15]])  # (B=2, T=5)
    assert wpe(pos).shape == (2, 5, 6)
    assert torch.equal(wpe(pos), ref(pos))
    assert torch.equal(wpe(torch.arange(5)), wpe.weight[:5])
    assert abs(LearnedPositions(4000, 32).weight.std().item() - 0.02) < 1e-3


def test_learned_positions_equal_gpt2_embedding_sum():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=23, n_positions=16, n_embd=12, n_layer=1, n_head=2)
    torch.manual_seed(0)
    gpt2 = transformers.GPT2Model(cfg).eval()
    wpe = LearnedPositions(16, 12)
    wpe.load_state_dict(gpt2.wpe.state_dict())
    ids = torch.randint(0, 23, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        h0 = gpt2(ids, output_hidden_states=True).hidden_states[0]  # wte(ids) + wpe(pos)
        ours = gpt2.wte(ids) + wpe(torch.arange(7))
    assert torch.allclose(h0, ours, rtol=0, atol=1e-7)


def test_learned_positions_gradient_reaches_only_used_rows():
    wpe = LearnedPositions(10, 3, dtype=torch.float64)
    pos = torch.tensor([2, 5, 5])
    (wpe(pos) * torch.arange(9.0, dtype=torch.float64).reshape(3, 3)).sum().backward()
    grad = wpe.weight.grad
    assert torch.equal(grad[2], torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64))
    assert torch.equal(grad[5], torch.tensor([9.0, 11.0, 13.0], dtype=torch.float64))
    others = [r for r in range(10) if r not in (2, 5)]
    assert torch.equal(grad[others], torch.zeros(8, 3, dtype=torch.float64))


def test_learned_positions_bad_inputs():
    wpe = LearnedPositions(8, 4)
    with pytest.raises(ValueError, match=r"position 8 is out of range for max_seq_len=8"):
        wpe(torch.arange(9))
    with pytest.raises(ValueError, match=r"position -1 is out of range"):
        wpe(torch.tensor([-1, 0]))
    with pytest.raises(TypeError, match="integer dtype"):
        wpe(torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"\(T,\) or \(B, T\)"):
        wpe(torch.zeros(1, 2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="max_seq_len must be positive"):
        LearnedPositions(0, 4)
    with pytest.raises(ValueError, match="std must be positive"):
        LearnedPositions(4, 4, std=-1.0)


# ---------------------------------------------------------------- RoPE: parts


def test_rope_frequencies_worked_example_and_hf_inv_freq():
    f = rope_frequencies(8, theta=10000.0)
    assert torch.allclose(f, torch.tensor([1.0, 0.1, 0.01, 0.001], dtype=torch.float64),
                          rtol=1e-15, atol=0)
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = transformers.LlamaConfig(hidden_size=36, num_attention_heads=3, head_dim=12,
                                   rope_theta=500.0)
    hf = LlamaRotaryEmbedding(cfg)
    assert torch.equal(rope_frequencies(12, 500.0, dtype=torch.float32), hf.inv_freq)


def test_rope_permutation_worked_example_and_inverse():
    perm = rope_permutation(6)
    assert perm.tolist() == [0, 3, 1, 4, 2, 5]
    assert perm.dtype == torch.long
    inv = torch.argsort(perm)
    assert inv.tolist() == [0, 2, 4, 1, 3, 5]
    x = torch.arange(6)
    assert torch.equal(x[perm][inv], x)


def test_rotate_half_worked_example_and_hf():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert rotate_half(x).tolist() == [-4.0, -5.0, -6.0, 1.0, 2.0, 3.0]
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import rotate_half as hf_rotate_half

    y = torch.randn(2, 3, 5, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(rotate_half(y), hf_rotate_half(y))
    with pytest.raises(ValueError, match="even length"):
        rotate_half(torch.ones(3))


def test_apply_rotary_worked_example():
    # d = 2: a single pair rotated by 90 degrees: (1, 2) -> (-2, 1)
    x = torch.tensor([1.0, 2.0], dtype=torch.float64)
    c, s = torch.tensor([0.0], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    for interleaved in (False, True):
        assert torch.equal(apply_rotary(x, c, s, interleaved), torch.tensor([-2.0, 1.0],
                                                                            dtype=torch.float64))
    # d = 4, angles (90, 180) degrees: half-split pairs (x0, x2), (x1, x3); interleaved (x0, x1), (x2, x3)
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    c = torch.tensor([0.0, -1.0], dtype=torch.float64)
    s = torch.tensor([1.0, 0.0], dtype=torch.float64)
    assert apply_rotary(x, c, s, interleaved=False).tolist() == [-3.0, -2.0, 1.0, -4.0]
    assert apply_rotary(x, c, s, interleaved=True).tolist() == [-2.0, 1.0, -3.0, -4.0]


def test_apply_rotary_half_split_is_cos_plus_rotate_half_sin():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 5, 10, generator=g, dtype=torch.float64)
    angles = torch.randn(5, 5, generator=g, dtype=torch.float64)
    c, s = angles.cos(), angles.sin()
    ref = x * torch.cat((c, c), -1) + rotate_half(x) * torch.cat((s, s), -1)
    assert torch.allclose(apply_rotary(x, c, s), ref, rtol=0, atol=1e-15)


def test_apply_rotary_gradcheck_and_norm_preserved():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    angles = torch.randn(4, 3, generator=g, dtype=torch.float64)
    for interleaved in (False, True):
        assert torch.autograd.gradcheck(
            lambda y, il=interleaved: apply_rotary(y, angles.cos(), angles.sin(), il), (x,))
        y = apply_rotary(x, angles.cos(), angles.sin(), interleaved)
        assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), rtol=0, atol=1e-14)


def test_apply_rotary_bad_inputs():
    x = torch.ones(2, 3, 8)
    with pytest.raises(ValueError, match=r"d/2=4"):
        apply_rotary(x, torch.ones(3, 8), torch.ones(3, 8))
    with pytest.raises(ValueError, match="equal shapes"):
        apply_rotary(x, torch.ones(3, 4), torch.ones(2, 3, 4)[0:1])
    with pytest.raises(ValueError, match="do not broadcast"):
        apply_rotary(x, torch.ones(5, 4), torch.ones(5, 4))
    with pytest.raises(ValueError, match="do not broadcast"):  # would enlarge x
        apply_rotary(x, torch.ones(4, 2, 3, 4), torch.ones(4, 2, 3, 4))
    with pytest.raises(ValueError, match="even length"):
        apply_rotary(torch.ones(3, 5), torch.ones(3, 2), torch.ones(3, 2))
    with pytest.raises(TypeError, match="expects tensors"):
        apply_rotary(x, 1.0, 0.0)


# ---------------------------------------------------------------- RoPE: matrices and the proof


def test_rope_matrix_matches_apply_and_is_orthogonal():
    d, theta = 8, 100.0
    g = torch.Generator().manual_seed(3)
    x = torch.randn(d, generator=g, dtype=torch.float64)
    freqs = rope_frequencies(d, theta)
    for interleaved in (False, True):
        for m in (0, 3, 11):
            R = rope_matrix(m, d, theta, interleaved)
            y = apply_rotary(x, torch.cos(m * freqs), torch.sin(m * freqs), interleaved)
            assert torch.allclose(R @ x, y, rtol=0, atol=1e-15)
            assert torch.allclose(R.T @ R, torch.eye(d, dtype=torch.float64), atol=1e-15)
        # R_m^T R_n = R_{n - m}
        lhs = rope_matrix(4, d, theta, interleaved).T @ rope_matrix(9, d, theta, interleaved)
        assert torch.allclose(lhs, rope_matrix(5, d, theta, interleaved), rtol=0, atol=1e-14)
    assert torch.equal(rope_matrix(0, d), torch.eye(d, dtype=torch.float64))


def _rot(angle):
    return sp.Matrix([[sp.cos(angle), -sp.sin(angle)], [sp.sin(angle), sp.cos(angle)]])


def test_rope_relative_property_symbolic_2d():
    m, n, r, t = sp.symbols("m n r theta", real=True)
    assert sp.simplify(_rot(m * t).T * _rot(n * t) - _rot((n - m) * t)) == sp.zeros(2, 2)
    q = sp.Matrix(sp.symbols("q0 q1", real=True))
    k = sp.Matrix(sp.symbols("k0 k1", real=True))
    score = ((_rot(m * t) * q).T * (_rot(n * t) * k))[0, 0]
    relative = sp.simplify(score.subs(n, m + r))
    assert sp.simplify(sp.diff(relative, m)) == 0
    assert sp.simplify(relative - (q.T * _rot(r * t) * k)[0, 0]) == 0


def test_rope_relative_property_symbolic_block_diagonal_d4():
    m, n, r = sp.symbols("m n r", real=True)
    t = sp.symbols("theta0 theta1", positive=True)

    def R(p):
        return sp.diag(_rot(p * t[0]), _rot(p * t[1]))

    q = sp.Matrix(sp.symbols("q0:4", real=True))
    k = sp.Matrix(sp.symbols("k0:4", real=True))
    assert sp.simplify(R(m).T * R(n) - R(n - m)) == sp.zeros(4, 4)
    score = ((R(m) * q).T * (R(n) * k))[0, 0].subs(n, m + r)
    assert sp.simplify(sp.diff(score, m)) == 0


# ---------------------------------------------------------------- RotaryEmbedding


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(0, 40), n=st.integers(0, 40), shift=st.integers(0, 40),
    seed=st.integers(0, 2**31 - 1),
)
def test_rope_scores_depend_only_on_offset(interleaved, dtype, tol, m, n, shift, seed):
    d = 16
    rope = RotaryEmbedding(d, max_seq_len=128, interleaved=interleaved, dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, 1, d, generator=g, dtype=dtype)
    k = torch.randn(1, 1, 1, d, generator=g, dtype=dtype)

    def score(a, b):
        qa = rope(q, torch.tensor([a]))
        kb = rope(k, torch.tensor([b]))
        return (qa * kb).sum().item()

    scale = q.norm().item() * k.norm().item()
    assert abs(score(m, n) - score(m + shift, n + shift)) <= tol * scale


def test_rope_float32_angle_rounding_grows_with_position():
    # float32 tables (Hugging Face's arithmetic) against float64 ones: error ~ position * eps
    r32 = RotaryEmbedding(64, max_seq_len=4096, dtype=torch.float32)
    r64 = RotaryEmbedding(64, max_seq_len=4096, dtype=torch.float64)
    err = (r32.cos.double() - r64.cos).abs().amax(dim=1)  # (T_max,)
    assert err[:16].max() < 1e-6
    assert 1e-5 < err[2048:].max() < 4096 * 2 * 2**-24


@pytest.mark.parametrize("positions_shape", ["T", "BT"])
def test_rope_half_split_equals_hf_llama(positions_shape):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    B, H, T, d, theta = 3, 2, 7, 12, 500000.0  # T not a power of two, B > 1
    cfg = transformers.LlamaConfig(hidden_size=H * d, num_attention_heads=H, head_dim=d,
                                   max_position_embeddings=256, rope_theta=theta)
    hf = LlamaRotaryEmbedding(cfg)
    ours = RotaryEmbedding(d, theta=theta, max_seq_len=256)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(B, H, T, d, generator=g)
    k = torch.randn(B, H, T, d, generator=g)
    if positions_shape == "T":
        pos = torch.tensor([3, 4, 9, 10, 11, 50, 200])
        pos_b = pos.expand(B, T)
    else:
        pos = torch.stack([torch.tensor([3, 4, 9, 10, 11, 50, 200]),
                           torch.arange(17, 24), torch.tensor([255, 0, 1, 2, 100, 101, 7])])
        pos_b = pos
    cos, sin = hf(q, pos_b)
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.allclose(ours(q, pos), q_hf, rtol=0, atol=1e-6)
    assert torch.allclose(ours(k, pos), k_hf, rtol=0, atol=1e-6)
    # non-contiguous input: a transposed view (B, T, H, d) -> (B, H, T, d)
    q_view = q.transpose(1, 2).contiguous().transpose(1, 2)
    assert not q_view.is_contiguous()
    assert torch.allclose(ours(q_view, pos), q_hf, rtol=0, atol=1e-6)


def test_rope_interleaved_equals_complex_implementation():
    g = torch.Generator().manual_seed(5)
    B, H, T, d = 2, 3, 5, 10
    rope = RotaryEmbedding(d, max_seq_len=64, interleaved=True, dtype=torch.float64)
    x = torch.randn(B, H, T, d, generator=g, dtype=torch.float64)
    pos = torch.tensor([[1, 5, 6, 30, 63], [0, 2, 4, 8, 16]])
    ref = rope_complex(x, pos[:, None, :])
    assert torch.allclose(rope(x, pos), ref, rtol=0, atol=1e-12)


def test_both_layouts_agree_after_permutation():
    g = torch.Generator().manual_seed(6)
    d = 14
    half = RotaryEmbedding(d, max_seq_len=100)
    inter = RotaryEmbedding(d, max_seq_len=100, interleaved=True)
    perm = rope_permutation(d)
    inv = torch.argsort(perm)
    x = torch.randn(2, 3, 9, d, generator=g)
    pos = torch.randint(0, 100, (2, 9), generator=g)
    assert torch.equal(inter(x[..., perm], pos)[..., inv], half(x, pos))
    assert torch.equal(half(x[..., inv], pos)[..., perm], inter(x, pos))
    # q.k is the same in both layouts (the permutation is orthogonal)
    q, k = x, torch.randn(2, 3, 9, d, generator=g)
    s_half = half(q, pos) @ half(k, pos).transpose(-1, -2)
    s_inter = inter(q[..., perm], pos) @ inter(k[..., perm], pos).transpose(-1, -2)
    assert torch.allclose(s_half, s_inter, rtol=0, atol=1e-5)
    # ... but the two layouts are different functions
    assert (half(x, pos) - inter(x, pos)).abs().max() > 0.1


def test_rope_position_zero_is_identity_and_buffers_not_persistent():
    rope = RotaryEmbedding(8, max_seq_len=16)
    x = torch.randn(1, 2, 3, 8, generator=torch.Generator().manual_seed(7))
    assert torch.equal(rope(x, torch.zeros(3, dtype=torch.long)), x)
    assert rope.state_dict() == {}
    assert rope.cos.shape == (16, 4)
    assert {name for name, _ in rope.named_buffers()} == {"inv_freq", "cos", "sin"}


def test_rope_accepts_any_leading_dimensions_and_position_shapes():
    rope = RotaryEmbedding(6, max_seq_len=32, dtype=torch.float64)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 5, 7, 6, generator=g, dtype=torch.float64)  # (B, H, G, T, d)
    pos = torch.randint(0, 32, (2, 7), generator=g)
    got = rope(x, pos)
    for b in range(2):  # row b of the positions rotates everything in batch entry b
        expected = rope(x[b].reshape(15, 7, 6)[None], pos[b]).reshape(3, 5, 7, 6)
        assert torch.equal(got[b], expected)
    shared = torch.arange(7)
    assert torch.equal(rope(x, shared), rope(x, shared[None]))  # (T,) and (1, T) agree
    flat = x[0, 0, 0]  # (T, d) with no batch dimension at all
    assert torch.equal(rope(flat, shared), rope(flat[None, None], shared)[0, 0])
    three = x[:, 0, 0]  # (B, T, d), no head axis
    assert torch.equal(rope(three, pos)[1], rope(three[1:2], pos[1])[0])


def test_rope_bad_inputs():
    rope = RotaryEmbedding(8, max_seq_len=16)
    x = torch.zeros(2, 3, 5, 8)
    with pytest.raises(ValueError, match="d_head must be even.*d_head=7"):
        RotaryEmbedding(7)
    with pytest.raises(ValueError, match=r"position 16 is out of range for max_seq_len=16"):
        rope(x, torch.tensor([0, 1, 2, 3, 16]))
    with pytest.raises(ValueError, match=r"position -2 is out of range"):
        rope(x, torch.tensor([0, 1, 2, 3, -2]))
    with pytest.raises(TypeError, match="integer dtype"):
        rope(x, torch.arange(5.0))
    with pytest.raises(ValueError, match=r"\(\.\.\., T, d_head=8\), got \(5,\)"):
        rope(torch.zeros(5), torch.arange(5))
    with pytest.raises(ValueError, match=r"\(\.\.\., T, d_head=8\), got \(2, 3, 5, 6\)"):
        rope(torch.zeros(2, 3, 5, 6), torch.arange(5))
    with pytest.raises(ValueError, match=r"positions must have shape \(T,\) = \(5,\), \(1, T\) for"):
        rope(torch.zeros(5, 8), torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"positions must have shape .* got \(4,\)"):
        rope(x, torch.arange(4))
    with pytest.raises(ValueError, match=r"positions must have shape .* got \(3, 5\)"):
        rope(x, torch.zeros(3, 5, dtype=torch.long))
    with pytest.raises(TypeError, match="floating-point"):
        rope(torch.zeros(2, 3, 5, 8, dtype=torch.long), torch.arange(5))
    with pytest.raises(ValueError, match="theta must be a number greater than 1"):
        RotaryEmbedding(8, theta=0.5)


# ---------------------------------------------------------------- ALiBi


def test_alibi_slopes_published_values():
    assert alibi_slopes(8, dtype=torch.float64).tolist() == [2.0**-k for k in range(1, 9)]
    assert alibi_slopes(16, dtype=torch.float64).tolist() == [2.0 ** (-k / 2) for k in range(1, 17)]
    assert alibi_slopes(1, dtype=torch.float64).tolist() == [2.0**-8]
    # 12 heads: the 8 slopes for 8 heads, then slopes 1, 3, 5, 7 of the 16-head sequence
    expected_12 = [2.0**-k for k in range(1, 9)] + [2.0 ** (-k / 2) for k in (1, 3, 5, 7)]
    assert torch.allclose(alibi_slopes(12, dtype=torch.float64),
                          torch.tensor(expected_12, dtype=torch.float64), rtol=1e-15, atol=0)
    assert alibi_slopes(5).dtype == torch.float32


@pytest.mark.parametrize("n_heads", [1, 3, 6, 8, 12, 20, 32])
def test_alibi_slopes_equal_bloom(n_heads):
    pytest.importorskip("transformers")
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    mask = torch.ones(1, 4, dtype=torch.long)
    bloom = build_alibi_tensor(mask, n_heads, torch.float32)  # (H, 1, 4): slope * j
    assert torch.allclose(bloom[:, 0, 1], alibi_slopes(n_heads), rtol=1e-6, atol=0)


def test_alibi_bias_worked_example():
    b = alibi_bias(2, 3, dtype=torch.float64)  # slopes 1/16, 1/256
    expected_head0 = torch.tensor([[0, 1, 2], [-1, 0, 1], [-2, -1, 0]], dtype=torch.float64) / 16
    assert b.shape == (2, 3, 3)
    assert torch.equal(b[0], expected_head0)
    assert torch.equal(b[1], expected_head0 * 16 / 256)
    assert not torch.signbit(b).logical_and(b == 0).any()  # no negative zeros on the diagonal


def test_alibi_bias_rectangular_queries_are_the_last_keys():
    full = alibi_bias(6, 9)  # (H, 9, 9)
    tail = alibi_bias(6, 4, 9)  # queries at positions 5..8
    assert tail.shape == (6, 4, 9)
    assert torch.equal(tail, full[:, 5:, :])
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    assert (full[:, causal] <= 0).all() and (full[:, ~causal] > 0).all()


def test_alibi_softmax_equals_bloom_bias_after_causal_mask():
    pytest.importorskip("transformers")
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    H, T = 12, 7
    g = torch.Generator().manual_seed(8)
    scores = torch.randn(H, T, T, generator=g, dtype=torch.float64)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    bloom = build_alibi_tensor(torch.ones(1, T, dtype=torch.long), H, torch.float64)  # (H, 1, T)
    ours = alibi_bias(H, T, dtype=torch.float64)
    p_ours = F.softmax((scores + ours).masked_fill(~mask, float("-inf")), dim=-1)
    p_bloom = F.softmax((scores + bloom).masked_fill(~mask, float("-inf")), dim=-1)
    # they differ by slope * i, a constant per row, which softmax ignores
    assert torch.allclose(p_ours, p_bloom, rtol=0, atol=1e-6)
    assert (ours - bloom).abs().max() > 1.0


def test_alibi_bad_inputs():
    with pytest.raises(ValueError, match="n_heads must be positive"):
        alibi_slopes(0)
    with pytest.raises(TypeError, match="n_heads must be an int"):
        alibi_slopes(8.0)
    with pytest.raises(ValueError, match=r"T_k must be at least T_q.*T_q=5, T_k=3"):
        alibi_bias(4, 5, 3)
    with pytest.raises(ValueError, match="T_q must be positive"):
        alibi_bias(4, 0)


# ---------------------------------------------------------------- issue 27: float32 bound, RoPE scaling

from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

from llmbook.transformer.positional import (  # noqa: E402
    rope_float32_angle_error_bound,
    rope_inverse_frequencies,
)

U32 = 2.0**-24


def _angle_errors(d_head: int, theta: float, T: int = 4096) -> torch.Tensor:
    """max over m in [1, T) of |float32 angle - exact| / (m theta_j), per pair: (d/2,)."""
    r32 = RotaryEmbedding(d_head, theta=theta, max_seq_len=2)
    exact = torch.arange(1, T, dtype=torch.float64)[:, None] * rope_frequencies(d_head, theta)
    angle32 = (torch.arange(1, T, dtype=torch.float32)[:, None] * r32.inv_freq).double()
    return ((angle32 - exact).abs() / exact).max(0).values


def test_rope_float32_bound_worked_values():
    # power of two: the exponent 2j/d is exact, so the bound is (1 + 2u)(1 + u)^2 - 1 for every pair
    b64 = rope_float32_angle_error_bound(64)
    assert b64.shape == (32,)
    assert torch.allclose(b64, torch.full((32,), (1 + 2 * U32) * (1 + U32) ** 2 - 1, dtype=torch.float64),
                          rtol=1e-12, atol=0)
    # d = 80: pair j has the extra factor exp((2j/80) ln(10^4) u), about (4 + 9.21 * 39/40) u at j = 39
    b80 = rope_float32_angle_error_bound(80)
    assert b80[0] == b64[0]
    assert math.isclose(b80[-1].item() / U32, 4 + (78 / 80) * math.log(1e4), rel_tol=1e-6)
    assert math.isclose(rope_float32_angle_error_bound(64, pow_ulps=0.5)[0].item() / U32, 3, rel_tol=1e-6)


@pytest.mark.parametrize("d_head", [64, 72, 80, 96, 112, 128])
@pytest.mark.parametrize("theta", [10000.0, 500000.0, 1e6])
def test_rope_float32_bound_holds(d_head, theta):
    ratio = (_angle_errors(d_head, theta) / rope_float32_angle_error_bound(d_head, theta)).max().item()
    assert ratio <= 1.0, (d_head, theta, ratio)


def test_rope_float32_old_bound_fails_off_powers_of_two():
    # the power-of-two bound 3u (correctly rounded pow, exact exponent) is exceeded at d = 80 and 96
    for d_head in (80, 96):
        assert (_angle_errors(d_head, 10000.0) / ((1 + U32) ** 3 - 1)).max() > 1.2


def test_rope_float32_bound_bad_input():
    with pytest.raises(ValueError, match="d_head"):
        rope_float32_angle_error_bound(63)
    with pytest.raises(ValueError, match="theta"):
        rope_float32_angle_error_bound(64, theta=1.0)
    with pytest.raises(ValueError, match="pow_ulps"):
        rope_float32_angle_error_bound(64, pow_ulps=-1)


ROPE_SCALINGS = [
    dict(rope_type="linear", factor=4.0),
    dict(rope_type="dynamic", factor=2.0),
    dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024),
    dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=2048, beta_fast=16, beta_slow=2,
         mscale=1.0, mscale_all_dim=0.5),
    dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=2048, truncate=False,
         partial_rotary_factor=0.5),
    dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024, attention_factor=0.9),
    dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
         original_max_position_embeddings=1024),
    dict(rope_type="linear", factor=2.0, partial_rotary_factor=0.25),
]


def _hf_config(d_head: int, params: dict) -> LlamaConfig:
    return LlamaConfig(hidden_size=3 * d_head, num_attention_heads=3, head_dim=d_head,
                       max_position_embeddings=4096, rope_parameters=dict(params))


@pytest.mark.parametrize("scaling", ROPE_SCALINGS, ids=lambda s: s["rope_type"])
@pytest.mark.parametrize("d_head", [64, 80, 96])
@pytest.mark.parametrize("base", [10000.0, 500000.0])
def test_rope_inverse_frequencies_equal_transformers(scaling, d_head, base):
    params = dict(scaling, rope_theta=base)
    seq_lens = (None, 3000, 9000) if scaling["rope_type"] == "dynamic" else (None,)
    for seq_len in seq_lens:
        hf_inv, hf_factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](_hf_config(d_head, params), "cpu",
                                                                     seq_len=seq_len)
        inv, factor = rope_inverse_frequencies(d_head, scaling=params, max_position_embeddings=4096,
                                               seq_len=seq_len)
        assert inv.dtype == torch.float32 and inv.shape == hf_inv.shape
        assert torch.equal(inv, hf_inv), (scaling, d_head, base, seq_len)
        assert factor == hf_factor


def test_rope_inverse_frequencies_worked_values():
    plain, f0 = rope_inverse_frequencies(8, 10000.0, dtype=torch.float64)
    assert f0 == 1.0 and torch.allclose(plain, torch.tensor([1, 0.1, 0.01, 0.001], dtype=torch.float64))
    lin, _ = rope_inverse_frequencies(8, 10000.0, {"type": "linear", "factor": 4}, dtype=torch.float64)
    assert torch.allclose(lin, plain / 4)
    # dynamic: unchanged up to L_0, then base * (2 * 2 - 1)^(8/6) at twice L_0 with factor 2
    same, _ = rope_inverse_frequencies(8, 10000.0, {"rope_type": "dynamic", "factor": 2.0},
                                       max_position_embeddings=100, seq_len=50, dtype=torch.float64)
    assert torch.equal(same, plain)
    dyn, _ = rope_inverse_frequencies(8, 10000.0, {"rope_type": "dynamic", "factor": 2.0},
                                      max_position_embeddings=100, seq_len=200, dtype=torch.float64)
    new_base = 10000.0 * 3 ** (8 / 6)
    assert torch.allclose(dyn, new_base ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8), rtol=1e-14)
    # YaRN's attention factor 0.1 ln(s) + 1 (Peng et al., 2023, eq. 22 with sqrt(1/t) = 0.1 ln s + 1)
    _, af = rope_inverse_frequencies(8, scaling={"rope_type": "yarn", "factor": math.e ** 2,
                                                 "original_max_position_embeddings": 64})
    assert math.isclose(af, 1.2, rel_tol=1e-12)
    # llama3: the fastest pair (wavelength 2 pi < L_0 / 4) is kept, the slowest divided by the factor
    l3, _ = rope_inverse_frequencies(8, 10000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 64},
                                     dtype=torch.float64)
    assert l3[0] == plain[0] and torch.allclose(l3[-1], plain[-1] / 8)
    part, _ = rope_inverse_frequencies(12, 10000.0, {"partial_rotary_factor": 0.5})
    assert part.shape == (3,)


def test_rope_inverse_frequencies_bad_input():
    with pytest.raises(ValueError, match="longrope"):
        rope_inverse_frequencies(64, scaling={"rope_type": "longrope"})
    with pytest.raises(ValueError, match="factor"):
        rope_inverse_frequencies(64, scaling={"rope_type": "linear"})
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        rope_inverse_frequencies(64, scaling={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="max_position_embeddings"):
        rope_inverse_frequencies(64, scaling={"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        rope_inverse_frequencies(64, scaling={"partial_rotary_factor": 1.5})
    with pytest.raises(TypeError, match="scaling"):
        rope_inverse_frequencies(64, scaling=[("rope_type", "linear")])
    with pytest.raises(ValueError, match="factor"):
        rope_inverse_frequencies(64, scaling={"rope_type": "linear", "factor": -2.0})
    with pytest.raises(ValueError, match="dynamic"):
        RotaryEmbedding(64, scaling={"rope_type": "dynamic", "factor": 2.0})


@pytest.mark.parametrize("scaling", [s for s in ROPE_SCALINGS if s["rope_type"] != "dynamic"
                                     and "partial_rotary_factor" not in s], ids=lambda s: s["rope_type"])
def test_rotary_embedding_with_scaling_equals_llama(scaling):
    d_head, base, T = 80, 500000.0, 37
    params = dict(scaling, rope_theta=base)
    hf = LlamaRotaryEmbedding(_hf_config(d_head, params))
    rope = RotaryEmbedding(d_head, base, max_seq_len=4096, scaling=params)
    positions = torch.tensor([0, 5, 900, 2047, 3000] + list(range(T - 5)))
    x = torch.randn(2, 3, T, d_head, generator=torch.Generator().manual_seed(0))
    cos, sin = hf(x, positions[None])  # (1, T, d_head), attention factor included
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    expected, _ = apply_rotary_pos_emb(x, x, cos, sin)
    assert torch.allclose(rope(x, positions), expected, rtol=0, atol=2e-6)
    assert rope.attention_factor == hf.attention_scaling


def test_rotary_embedding_partial_rotation():
    # partial RoPE (GPT-NeoX, Phi): the first d_rot components rotate, the rest pass through
    d_head, T = 12, 5
    rope = RotaryEmbedding(d_head, scaling={"partial_rotary_factor": 0.5}, max_seq_len=T + 3, dtype=torch.float64)
    full = RotaryEmbedding(6, max_seq_len=T, dtype=torch.float64)
    x = torch.randn(2, T, d_head, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    pos = torch.arange(T)
    y = rope(x, pos)
    assert rope.d_rot == 6
    assert torch.equal(y[..., 6:], x[..., 6:])
    assert torch.allclose(y[..., :6], full(x[..., :6], pos), rtol=0, atol=1e-15)
    # scores still depend only on the offset
    s1 = rope(x, pos) @ rope(x, pos).transpose(-1, -2)
    s2 = rope(x, pos + 3) @ rope(x, pos + 3).transpose(-1, -2)
    assert torch.allclose(s1, s2, rtol=0, atol=1e-12)
    assert not torch.allclose(s1, rope(x, pos + 3) @ rope(x, pos).transpose(-1, -2), atol=1e-3)


def test_rotary_embedding_partial_equals_phi():
    # Phi's partial RoPE: rotary_ndims = int(d_head * 0.4) components rotate, half-split among themselves
    from transformers import PhiConfig
    from transformers.models.phi.modeling_phi import PhiRotaryEmbedding
    from transformers.models.phi.modeling_phi import apply_rotary_pos_emb as phi_apply

    d_head, T = 80, 11
    cfg = PhiConfig(hidden_size=2 * d_head, num_attention_heads=2, partial_rotary_factor=0.4)
    params = dict(cfg.rope_parameters)
    hf = PhiRotaryEmbedding(cfg)
    ours = RotaryEmbedding(d_head, params["rope_theta"], max_seq_len=64, scaling=params)
    n_rot = int(d_head * 0.4)
    assert ours.d_rot == n_rot == 32
    x = torch.randn(1, 2, T, d_head, generator=torch.Generator().manual_seed(5))
    pos = torch.arange(3, 3 + T)
    cos, sin = hf(x, pos[None])
    rot, _ = phi_apply(x[..., :n_rot], x[..., :n_rot], cos, sin)
    expected = torch.cat((rot, x[..., n_rot:]), dim=-1)
    assert torch.allclose(ours(x, pos), expected, rtol=0, atol=1e-6)
