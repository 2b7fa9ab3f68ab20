"""Tests for llmbook.scale.ssm: zero-order hold, recurrence = convolution, the selective scan
(sequential and associative), and the Mamba model against Hugging Face MambaForCausalLM."""

import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import randn

from llmbook.scale.ssm import (
    CausalDepthwiseConv1d,
    MambaConfig,
    MambaLM,
    associative_scan,
    causal_convolution,
    linear_recurrence,
    mamba_from_hf,
    mamba_num_parameters,
    scan_combine,
    selective_scan,
    ssm_kernel,
    ssm_recurrent,
    zoh_discretize,
    zoh_discretize_diagonal,
)

pytestmark = pytest.mark.usefixtures("one_thread")

D = torch.float64


def rand(*shape, seed=0):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=D)


def stable_A(N, seed=0):
    return randn(N, N, seed=seed) - 3 * torch.eye(N, dtype=D)


# ---------------------------------------------------------------- discretisation


def test_zoh_scalar_worked_example():
    # a = -1, b = 1, delta = ln 2: A_bar = 1/2, B_bar = (1/2 - 1) / (-1) = 1/2
    A_bar, B_bar = zoh_discretize(torch.tensor([[-1.0]], dtype=D), torch.tensor([1.0], dtype=D), math.log(2))
    assert abs(float(A_bar) - 0.5) < 1e-15 and abs(float(B_bar) - 0.5) < 1e-15
    a, b = zoh_discretize_diagonal(torch.tensor([-1.0], dtype=D), torch.tensor([1.0], dtype=D), math.log(2))
    assert abs(float(a) - 0.5) < 1e-15 and abs(float(b) - 0.5) < 1e-15


def test_zoh_is_the_exact_solution_for_constant_input():
    """One ZOH step equals the solution of x' = A x + B u with u = 1 over delta, computed by
    scipy's 8th-order Runge-Kutta (DOP853) to 1e-13: to 1e-11, where the bilinear (Tustin)
    step is 1.3e-2 away and a matrix exponential cut after the delta^8 term 2.4e-7 away."""
    from scipy.integrate import solve_ivp

    A, B, delta = stable_A(3, 1), randn(3, seed=2), 0.2
    A_bar, B_bar = zoh_discretize(A, B, delta)
    x0 = randn(3, seed=3)
    An, Bn = A.numpy(), B.numpy()
    ode = solve_ivp(lambda t, x: An @ x + Bn, (0.0, delta), x0.numpy(), method="DOP853",
                    rtol=1e-13, atol=1e-14)
    assert ode.success
    assert torch.allclose(A_bar @ x0 + B_bar, torch.from_numpy(ode.y[:, -1]), rtol=0, atol=1e-11)


def test_zoh_diagonal_equals_dense_and_first_order_term():
    A, B = -rand(5, seed=4) - 0.1, randn(5, seed=5)
    a, b = zoh_discretize_diagonal(A, B, 0.3)
    a2, b2 = zoh_discretize(torch.diag(A), B, 0.3)
    assert torch.allclose(a, torch.diag(a2), atol=1e-15) and torch.allclose(b, b2, atol=1e-15)
    # for small delta, B_bar = delta B + O(delta^2): Mamba's simplification
    for delta in (1e-2, 1e-3):
        _, b = zoh_discretize_diagonal(A, B, delta)
        assert float((b - delta * B).abs().max()) < delta**2 * float((A * B).abs().max())
    # per-channel deltas (one per leading index)
    A2, B2, deltas = -rand(3, 4, seed=6) - 0.1, randn(3, 4, seed=7), rand(3, seed=8) + 0.1
    a, b = zoh_discretize_diagonal(A2, B2, deltas)
    assert torch.allclose(a[1], torch.exp(deltas[1] * A2[1]), atol=1e-15)


def test_zoh_bad_input():
    A, B = stable_A(3), randn(3)
    with pytest.raises(ValueError, match="square"):
        zoh_discretize(randn(3, 2), B, 0.1)
    with pytest.raises(ValueError, match="B must have"):
        zoh_discretize(A, randn(4), 0.1)
    with pytest.raises(ValueError, match="positive"):
        zoh_discretize(A, B, 0.0)
    with pytest.raises(TypeError, match="number"):
        zoh_discretize(A, B, "0.1")
    with pytest.raises(ValueError, match="same shape"):
        zoh_discretize_diagonal(randn(3), randn(4), 0.1)
    with pytest.raises(ValueError, match="zero"):
        zoh_discretize_diagonal(torch.zeros(3, dtype=D), randn(3), 0.1)
    with pytest.raises(ValueError, match="delta must be positive"):
        zoh_discretize_diagonal(-rand(2, 3) - 0.1, randn(2, 3), rand(3))
    with pytest.raises(TypeError, match="floating-point"):
        zoh_discretize(A.long(), B, 0.1)


# ---------------------------------------------------------------- recurrence = convolution


def test_kernel_and_convolution_worked_example():
    A_bar, B_bar, C = torch.tensor([[0.5]], dtype=D), torch.tensor([1.0], dtype=D), torch.tensor([2.0], dtype=D)
    assert ssm_kernel(A_bar, B_bar, C, 4).tolist() == [2.0, 1.0, 0.5, 0.25]
    u, K = torch.tensor([1.0, 1.0, 0.0], dtype=D), torch.tensor([1.0, 2.0, 4.0], dtype=D)
    assert causal_convolution(u, K, method="direct").tolist() == [1.0, 3.0, 6.0]
    assert torch.allclose(causal_convolution(u, K), torch.tensor([1.0, 3.0, 6.0], dtype=D), atol=1e-14)
    assert ssm_recurrent(A_bar, B_bar, C, torch.tensor([1.0, 0.0, 0.0], dtype=D)).tolist() == [2.0, 1.0, 0.5]


@settings(max_examples=15, deadline=None)
@given(N=st.integers(1, 5), T=st.integers(1, 40), seed=st.integers(0, 10_000))
def test_recurrence_equals_convolution(N, T, seed):
    A_bar, B_bar = zoh_discretize(stable_A(N, seed), randn(N, seed=seed + 1), 0.1)
    C, u = randn(N, seed=seed + 2), randn(2, T, seed=seed + 3)
    y = ssm_recurrent(A_bar, B_bar, C, u)
    K = ssm_kernel(A_bar, B_bar, C, T)
    assert torch.allclose(causal_convolution(u, K), y, atol=1e-12)
    assert torch.allclose(causal_convolution(u, K, method="direct"), y, atol=1e-12)


def test_lti_bad_input():
    A_bar, B_bar, C = stable_A(3), randn(3), randn(3)
    with pytest.raises(ValueError, match="A_bar"):
        ssm_recurrent(A_bar, randn(4), C, randn(5))
    with pytest.raises(ValueError, match="positive"):
        ssm_kernel(A_bar, B_bar, C, 0)
    with pytest.raises(ValueError, match="K must have"):
        causal_convolution(randn(2, 5), randn(4))
    with pytest.raises(ValueError, match="method"):
        causal_convolution(randn(5), randn(5), method="fast")


# ---------------------------------------------------------------- scans


def test_scan_combine_worked_example_and_associativity():
    a, b = scan_combine((torch.tensor(2.0), torch.tensor(3.0)), (torch.tensor(5.0), torch.tensor(7.0)))
    assert (float(a), float(b)) == (10.0, 22.0)  # h -> 5 (2h + 3) + 7 = 10h + 22
    x, y, z = [(randn(4, seed=s), randn(4, seed=s + 10)) for s in range(3)]
    left = scan_combine(scan_combine(x, y), z)
    right = scan_combine(x, scan_combine(y, z))
    assert all(torch.allclose(p, q, atol=1e-14) for p, q in zip(left, right, strict=True))


def test_linear_recurrence_worked_example():
    a, b = torch.tensor([1.0, 2.0, 3.0], dtype=D), torch.ones(3, dtype=D)
    assert linear_recurrence(a, b, dim=0).tolist() == [1.0, 3.0, 10.0]
    cum, h = associative_scan(a, b, dim=0)
    assert h.tolist() == [1.0, 3.0, 10.0] and cum.tolist() == [1.0, 2.0, 6.0]


@settings(max_examples=25, deadline=None)
@given(T=st.integers(1, 70), dim=st.sampled_from([0, 1, -1]), seed=st.integers(0, 10_000))
def test_associative_scan_equals_sequential(T, dim, seed):
    shape = [3, 4, 2]
    shape[dim] = T
    a, b = rand(*shape, seed=seed) + 0.3, randn(*shape, seed=seed + 1)
    cum, h = associative_scan(a, b, dim=dim)
    assert torch.allclose(h, linear_recurrence(a, b, dim=dim), atol=1e-12)
    assert torch.allclose(cum, torch.cumprod(a, dim=dim), atol=1e-12)


def selective_inputs(batch=2, T=9, E=6, N=4, seed=0):
    return (randn(batch, T, E, seed=seed), rand(batch, T, E, seed=seed + 1) + 0.01,
            -rand(E, N, seed=seed + 2) - 0.1, randn(batch, T, N, seed=seed + 3),
            randn(batch, T, N, seed=seed + 4), randn(E, seed=seed + 5))


def test_selective_scan_methods_agree_and_match_a_direct_loop():
    u, delta, A, B, C, Dskip = selective_inputs(T=33)
    y_seq = selective_scan(u, delta, A, B, C, Dskip)
    y_par = selective_scan(u, delta, A, B, C, Dskip, method="parallel")
    assert y_seq.shape == (2, 33, 6)
    assert torch.allclose(y_seq, y_par, atol=1e-12)
    # channel 2 of batch 1, written out with scalars
    h, ys = torch.zeros(4, dtype=D), []
    for t in range(33):
        d = delta[1, t, 2]
        h = torch.exp(d * A[2]) * h + d * B[1, t] * u[1, t, 2]
        ys.append(float(C[1, t] @ h + Dskip[2] * u[1, t, 2]))
    assert torch.allclose(y_seq[1, :, 2], torch.tensor(ys, dtype=D), atol=1e-13)


def test_selective_scan_with_constant_parameters_is_an_lti_convolution():
    # Delta, B, C constant in time: the selective SSM is S4D, y = K * u per channel
    T, N = 20, 3
    A = -rand(1, N, seed=1) - 0.2
    delta, B, C = 0.3, randn(N, seed=2), randn(N, seed=3)
    u = randn(1, T, 1, seed=4)
    y = selective_scan(u, torch.full((1, T, 1), delta, dtype=D), A, B.expand(1, T, N), C.expand(1, T, N))
    K = ssm_kernel(torch.diag(torch.exp(delta * A[0])), delta * B, C, T)
    assert torch.allclose(y[0, :, 0], causal_convolution(u[0, :, 0], K), atol=1e-13)


def test_selective_scan_gradients_agree():
    inputs = [t.requires_grad_() for t in selective_inputs(batch=1, T=5, E=2, N=3, seed=7)]
    assert torch.autograd.gradcheck(lambda *x: selective_scan(*x, method="parallel"), inputs)
    g1 = torch.autograd.grad(selective_scan(*inputs).sum(), inputs)
    g2 = torch.autograd.grad(selective_scan(*inputs, method="parallel").sum(), inputs)
    assert all(torch.allclose(p, q, atol=1e-12) for p, q in zip(g1, g2, strict=True))


def test_scan_bad_input():
    u, delta, A, B, C, Dskip = selective_inputs()
    with pytest.raises(ValueError, match="same shape"):
        associative_scan(randn(3, 4), randn(4, 3))
    with pytest.raises(ValueError, match="out of range"):
        linear_recurrence(randn(3), randn(3), dim=2)
    with pytest.raises(ValueError, match="u and delta"):
        selective_scan(u, delta[:, :-1], A, B, C)
    with pytest.raises(ValueError, match="A must have"):
        selective_scan(u, delta, A.T, B, C)
    with pytest.raises(ValueError, match="B and C"):
        selective_scan(u, delta, A, B[:, :, :-1], C)
    with pytest.raises(ValueError, match="D must have"):
        selective_scan(u, delta, A, B, C, Dskip[:-1])
    with pytest.raises(ValueError, match="method"):
        selective_scan(u, delta, A, B, C, method="blelloch")


# ---------------------------------------------------------------- the Mamba model


def test_causal_depthwise_conv_equals_torch_conv1d():
    conv = CausalDepthwiseConv1d(5, 3).double()
    ref = torch.nn.Conv1d(5, 5, 3, groups=5, padding=2).double()
    with torch.no_grad():
        ref.weight.copy_(conv.weight)
        conv.bias.copy_(randn(5, seed=1))
        ref.bias.copy_(conv.bias)
    x = randn(2, 7, 5, seed=2)
    expected = ref(x.transpose(1, 2))[:, :, :7].transpose(1, 2)
    assert torch.allclose(conv(x), expected, atol=1e-14)
    with pytest.raises(ValueError, match="expected"):
        conv(randn(2, 7, 4))


def test_mamba_config():
    c = MambaConfig(vocab_size=10, d_model=40)
    assert c.dt_rank == 3 and c.d_inner == 80
    with pytest.raises(ValueError, match="d_state"):
        MambaConfig(vocab_size=10, d_state=0)


def test_mamba_lm_is_causal_and_both_scans_agree():
    model = MambaLM(MambaConfig(vocab_size=30, d_model=16, n_layers=2, d_state=4), "parallel").double()
    ids = torch.randint(0, 30, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids)
        ids2 = ids.clone()
        ids2[:, 6:] = (ids2[:, 6:] + 1) % 30
        assert torch.allclose(model(ids2)[:, :6], logits[:, :6], atol=1e-13)
        assert not torch.allclose(model(ids2)[:, 6:], logits[:, 6:])
        for layer in model.layers:
            layer.mixer.scan_method = "sequential"
        assert torch.allclose(model(ids), logits, atol=1e-12)
    with pytest.raises(TypeError, match="integer"):
        model(ids.double())


@pytest.fixture(scope="module")
def hf_mamba():
    transformers = pytest.importorskip("transformers")
    from llmbook.transformer.hf_loading import randomize_parameters_

    torch.manual_seed(0)
    cfg = transformers.MambaConfig(vocab_size=50, hidden_size=24, state_size=5, num_hidden_layers=2,
                                   expand=2, conv_kernel=3, time_step_rank=3, residual_in_fp32=False,
                                   use_associative_scan=False)
    hf = transformers.MambaForCausalLM(cfg)
    randomize_parameters_(hf, 0.1, torch.Generator().manual_seed(1))
    return hf


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mamba_matches_hugging_face(hf_mamba, dtype):
    hf = hf_mamba.to(dtype).eval()
    ours = mamba_from_hf(hf, scan_method="parallel").eval()
    ids = torch.randint(0, 50, (2, 13), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected, got = hf(ids).logits, ours(ids)
    # Hugging Face computes its RMSNorm, B_bar u and the logits in float32 even in float64
    assert float((expected.double() - got.double()).abs().max()) < 5e-6
    assert float(expected.abs().max()) > 1.0


# ---------------------------------------------------------------- parameter count


def test_mamba_num_parameters_worked_example():
    # d = 48, E = 96, N = 8, R = 3, K = 4: a block holds 9216 + 384 + 96 + 1824 + 288 + 96
    # + 768 + 96 + 4608 + 48 = 17424; 2 blocks + 16 x 48 embedding + 48 final gain = 35664
    config = MambaConfig(vocab_size=16, d_model=48, n_layers=2, d_state=8)
    assert mamba_num_parameters(config) == 35664
    assert sum(p.numel() for p in MambaLM(config).parameters()) == 35664


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 40), st.integers(1, 24), st.integers(1, 3), st.integers(1, 6),
       st.integers(1, 3), st.integers(1, 4), st.booleans(), st.booleans(), st.booleans())
def test_mamba_num_parameters_counts_the_module(V, d, L, N, expand, K, bias, conv_bias, tie):
    config = MambaConfig(vocab_size=V, d_model=d, n_layers=L, d_state=N, expand=expand, d_conv=K,
                         bias=bias, conv_bias=conv_bias, tie_embeddings=tie)
    assert mamba_num_parameters(config) == sum(p.numel() for p in MambaLM(config).parameters())


def test_mamba_num_parameters_matches_hugging_face():
    import transformers

    for tie, bias in ((True, False), (False, True)):
        hf_cfg = transformers.MambaConfig(vocab_size=24, hidden_size=20, state_size=6, num_hidden_layers=3,
                                          expand=2, conv_kernel=3, time_step_rank=5, use_bias=bias,
                                          use_conv_bias=True, tie_word_embeddings=tie)
        hf = transformers.MambaForCausalLM(hf_cfg)
        ours = MambaConfig(vocab_size=24, d_model=20, n_layers=3, d_state=6, expand=2, d_conv=3,
                           dt_rank=5, bias=bias, tie_embeddings=tie)
        assert mamba_num_parameters(ours) == hf.num_parameters()


def test_mamba_num_parameters_bad_input():
    with pytest.raises(TypeError, match="config"):
        mamba_num_parameters({"vocab_size": 16})
