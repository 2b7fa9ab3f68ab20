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
