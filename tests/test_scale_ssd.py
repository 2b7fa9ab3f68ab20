"""Tests for llmbook.scale.ssd (state-space duality: recurrence = masked semiseparable matrix =
chunked algorithm) and llmbook.scale.mamba2 (the Mamba-2 model against Hugging Face
Mamba2ForCausalLM, constant-state decoding)."""

import math

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import gen, randn
from transformers import Mamba2Config as HFMamba2Config
from transformers import Mamba2ForCausalLM
from transformers.models.mamba2.modeling_mamba2 import mamba2_chunk_scan

from llmbook.scale.mamba2 import GatedRMSNorm, Mamba2Config, Mamba2LM, mamba2_from_hf, state_bytes
from llmbook.scale.ssd import (
    segsum,
    semiseparable_mask,
    ssd_chunked,
    ssd_quadratic,
    ssd_recurrent,
    ssd_step,
)
from llmbook.transformer.hf_loading import randomize_parameters_

pytestmark = pytest.mark.usefixtures("one_thread")
transformers.logging.set_verbosity_error()
D = torch.float64


def inputs(batch=2, T=13, H=4, P=3, G=2, N=5, seed=0, dtype=D):
    """Random SSD inputs: x (b, T, H, P), log_a (b, T, H) <= 0, B, C (b, T, G, N)."""
    g = gen(seed)
    return (torch.randn(batch, T, H, P, generator=g, dtype=dtype),
            -torch.rand(batch, T, H, generator=g, dtype=dtype),
            torch.randn(batch, T, G, N, generator=g, dtype=dtype),
            torch.randn(batch, T, G, N, generator=g, dtype=dtype))


# ---------------------------------------------------------------- the mask


def test_segsum_worked_example():
    la = torch.tensor([-1.0, -2.0, -4.0], dtype=D)
    inf = -math.inf
    assert torch.equal(segsum(la), torch.tensor([[0.0, inf, inf], [-2.0, 0.0, inf], [-6.0, -4.0, 0.0]], dtype=D))
    a = torch.tensor([0.5, 0.25, 0.8], dtype=D)
    L = semiseparable_mask(torch.log(a))
    want = torch.tensor([[1, 0, 0], [0.25, 1, 0], [0.25 * 0.8, 0.8, 1]], dtype=D)
    torch.testing.assert_close(L, want, rtol=0, atol=1e-15)


@settings(max_examples=25, deadline=None)
@given(T=st.integers(2, 9), seed=st.integers(0, 10_000))
def test_mask_is_1_semiseparable(T, seed):
    """Every block strictly below the diagonal has rank 1: L[i, j] = c_i / c_j for i > j."""
    la = -torch.rand(T, generator=gen(seed), dtype=D)
    L = semiseparable_mask(la)
    k = T // 2
    assert torch.linalg.matrix_rank(L[k:, :k]).item() == 1
    cum = torch.exp(la.cumsum(0))
    torch.testing.assert_close(L[k:, :k], cum[k:, None] / cum[None, :k], rtol=1e-12, atol=0)
    assert torch.equal(L.triu(1), torch.zeros(T, T, dtype=D))


def test_segsum_bad_input():
    with pytest.raises(TypeError, match="log_a"):
        segsum([1.0, 2.0])
    with pytest.raises(ValueError, match="log_a"):
        segsum(torch.zeros(0, dtype=D))


# ---------------------------------------------------------------- the three forms


def test_ssd_worked_example_scalar():
    """H = P = N = 1, x = B = C = 1, a = (1/2, 1/2, 1/2): y = 1, 1.5, 1.75."""
    x = torch.ones(1, 3, 1, 1, dtype=D)
    la = torch.full((1, 3, 1), math.log(0.5), dtype=D)
    one = torch.ones(1, 3, 1, 1, dtype=D)
    y, state = ssd_recurrent(x, la, one, one)
    torch.testing.assert_close(y.flatten(), torch.tensor([1.0, 1.5, 1.75], dtype=D), rtol=0, atol=1e-15)
    torch.testing.assert_close(state.flatten(), torch.tensor([1.75], dtype=D), rtol=0, atol=1e-15)
    torch.testing.assert_close(ssd_quadratic(x, la, one, one), y, rtol=0, atol=1e-15)


@settings(max_examples=20, deadline=None)
@given(T=st.integers(1, 17), Q=st.integers(1, 8), H=st.sampled_from([2, 4]), G=st.sampled_from([1, 2]),
       seed=st.integers(0, 10_000))
def test_recurrent_quadratic_chunked_agree(T, Q, H, G, seed):
    x, la, B, C = inputs(T=T, H=H, G=G, seed=seed)
    y_r, s_r = ssd_recurrent(x, la, B, C)
    y_c, s_c = ssd_chunked(x, la, B, C, Q)
    torch.testing.assert_close(ssd_quadratic(x, la, B, C), y_r, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y_c, y_r, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s_c, s_r, rtol=1e-12, atol=1e-12)


def test_initial_state_splits_the_sequence():
    """Running 0..T-1 equals running 0..k-1 then k..T-1 from the state it left."""
    x, la, B, C = inputs(T=15)
    y, s = ssd_chunked(x, la, B, C, 4)
    y1, s1 = ssd_chunked(x[:, :6], la[:, :6], B[:, :6], C[:, :6], 4)
    y2, s2 = ssd_recurrent(x[:, 6:], la[:, 6:], B[:, 6:], C[:, 6:], initial_state=s1)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s2, s, rtol=1e-12, atol=1e-12)


def test_state_is_sum_of_decayed_outer_products():
    x, la, B, C = inputs(T=7, G=4)
    _, s = ssd_recurrent(x, la, B, C)
    decay = torch.exp(la.flip(1).cumsum(1).flip(1) - la)  # prod_{k>s} a_k: (b, T, H)
    want = torch.einsum("bth,bthp,bthn->bhpn", decay, x, B)
    torch.testing.assert_close(s, want, rtol=1e-12, atol=1e-12)


def test_ssd_step_shapes_and_value():
    x, la, B, C = inputs(T=1)
    state = randn(2, 4, 3, 5, seed=3)
    y, new = ssd_step(state, x[:, 0], la[:, 0], B[:, 0], C[:, 0])
    assert y.shape == (2, 4, 3) and new.shape == state.shape
    y_r, s_r = ssd_recurrent(x, la, B, C, initial_state=state)
    torch.testing.assert_close(y, y_r[:, 0], rtol=0, atol=1e-15)
    torch.testing.assert_close(new, s_r, rtol=0, atol=1e-15)


def test_gradients_float64():
    x, la, B, C = (t.requires_grad_() for t in inputs(batch=1, T=5, H=2, P=2, G=1, N=2))
    la = (la - 0.1).detach().requires_grad_()  # away from 0, where log_a <= 0 is checked
    assert torch.autograd.gradcheck(lambda *a: ssd_chunked(*a, 2)[0], (x, la, B, C))
    assert torch.autograd.gradcheck(ssd_quadratic, (x, la, B, C))


def test_chunked_vs_transformers_chunk_scan():
    """The kernel against Hugging Face's torch reference of the SSD (in float32)."""
    g = gen(5)
    b, T, H, P, G, N, Q = 2, 21, 6, 4, 3, 5, 8
    x, dt = torch.randn(b, T, H, P, generator=g), torch.rand(b, T, H, generator=g)
    A = -torch.rand(H, generator=g) - 0.1
    B, C = torch.randn(b, T, G, N, generator=g), torch.randn(b, T, G, N, generator=g)
    ref, ref_state = mamba2_chunk_scan(x, dt, A, B, C, chunk_size=Q, return_final_states=True)
    y, state = ssd_chunked(x * dt[..., None], dt * A, B, C, Q)
    torch.testing.assert_close(y, ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(state, ref_state, rtol=0, atol=1e-5)


def test_ssd_bad_input():
    x, la, B, C = inputs()
    with pytest.raises(ValueError, match="log_a must be <= 0"):
        ssd_recurrent(x, -la, B, C)
    with pytest.raises(ValueError, match="x must have shape"):
        ssd_quadratic(x[0], la, B, C)
    with pytest.raises(ValueError, match="log_a must have shape"):
        ssd_chunked(x, la[:, :-1], B, C, 4)
    with pytest.raises(ValueError, match="groups"):
        ssd_chunked(x, la, B[:, :, :1].expand(-1, -1, 3, -1), C[:, :, :1].expand(-1, -1, 3, -1), 4)
    with pytest.raises(ValueError, match="chunk_size"):
        ssd_chunked(x, la, B, C, 0)
    with pytest.raises(TypeError, match="^B must have the dtype of x"):
        ssd_quadratic(x, la, B.float(), C)
    with pytest.raises(ValueError, match="initial_state"):
        ssd_recurrent(x, la, B, C, initial_state=torch.zeros(2, 4, 3, 4, dtype=D))
    with pytest.raises(ValueError, match=r"^x has no positions \(T = 0\)"):
        ssd_chunked(x[:, :0], la[:, :0], B[:, :0], C[:, :0], 4)


# ---------------------------------------------------------------- the model


def hf_tiny(seed=1, tie=False):
    torch.manual_seed(0)
    cfg = HFMamba2Config(vocab_size=50, hidden_size=24, state_size=5, num_hidden_layers=2, expand=2, head_dim=8,
                         num_heads=6, n_groups=2, conv_kernel=3, chunk_size=4, residual_in_fp32=False,
                         tie_word_embeddings=tie)
    return randomize_parameters_(Mamba2ForCausalLM(cfg), 0.1, gen(seed)).eval()


@pytest.mark.parametrize("method", ["chunked", "recurrent"])
def test_model_vs_transformers(method):
    hf = hf_tiny()
    ours = mamba2_from_hf(hf, method).eval()
    ids = torch.randint(0, 50, (2, 11), generator=gen(2))
    with torch.no_grad():
        ref = hf(ids, use_cache=False).logits
        torch.testing.assert_close(ours(ids), ref, rtol=0, atol=1e-4)
        assert (ours(ids) - ref).abs().max() < 5e-6


def test_tied_model_loads():
    hf = hf_tiny(tie=True)
    ours = mamba2_from_hf(hf)
    assert ours.lm_head is None
    ids = torch.randint(0, 50, (1, 6), generator=gen(3))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids, use_cache=False).logits, rtol=0, atol=1e-5)


def test_step_decoding_matches_full_forward_and_hf_cache():
    hf = hf_tiny()
    ours = mamba2_from_hf(hf).eval()
    ids = torch.randint(0, 50, (2, 12), generator=gen(4))
    with torch.no_grad():
        full = ours(ids)
        logits, state = ours.prefill(ids[:, :5])
        torch.testing.assert_close(logits, full[:, :5], rtol=0, atol=1e-6)
        sizes = {state_bytes(state)}
        steps = []
        for t in range(5, 12):
            lt, state = ours.step(ids[:, t], state)
            steps.append(lt)
            sizes.add(state_bytes(state))
        torch.testing.assert_close(torch.stack(steps, 1), full[:, 5:], rtol=0, atol=1e-5)
        # HF's own cached decoding, one token at a time
        out = hf(ids[:, :5], use_cache=True)
        cache, hf_steps = out.cache, []
        for t in range(5, 12):
            out = hf(ids[:, t:t + 1], cache=cache, use_cache=True)
            cache = out.cache
            hf_steps.append(out.logits[:, -1])
        torch.testing.assert_close(torch.stack(steps, 1), torch.stack(hf_steps, 1), rtol=0, atol=1e-5)
    # constant size: L (conv (B, K-1, E + 2GN) + ssm (B, H, P, N)) float32
    c = ours.config
    assert sizes == {2 * 4 * 2 * ((c.d_conv - 1) * c.conv_dim + c.n_heads * c.head_dim * c.d_state)}
    assert sizes == {2 * 4 * 2 * (2 * 68 + 6 * 8 * 5)}


def test_step_from_zero_state_equals_forward():
    model = Mamba2LM(Mamba2Config(vocab_size=30, d_model=16, n_layers=1, d_state=4, head_dim=8, d_conv=4,
                                  chunk_size=3)).double().eval()
    ids = torch.randint(0, 30, (3, 7), generator=gen(6))
    with torch.no_grad():
        state, outs = model.init_state(3), []
        for t in range(7):
            lt, state = model.step(ids[:, t], state)
            outs.append(lt)
        torch.testing.assert_close(torch.stack(outs, 1), model(ids), rtol=1e-12, atol=1e-12)
        _, st1 = model.prefill(ids[:, :2])  # shorter than K - 1: zero-padded conv state
        assert st1[0][0].shape == (3, 3, model.config.conv_dim)
        assert torch.equal(st1[0][0][:, 0], torch.zeros(3, model.config.conv_dim, dtype=D))


def test_gated_rmsnorm_worked_example():
    norm = GatedRMSNorm(4, 2, eps=1e-12)
    y, z = torch.tensor([[3.0, 4.0, 1.0, 1.0]]), torch.full((1, 4), 50.0)  # silu(50) = 50 (to 1e-20)
    out = norm(y, z)
    torch.testing.assert_close(out, torch.tensor([[3.0, 4.0, 1.0, 1.0]]) / torch.tensor([12.5, 12.5, 1.0, 1.0]).sqrt(),
                               rtol=1e-6, atol=0)


def test_model_bad_input():
    with pytest.raises(ValueError, match="head_dim"):
        Mamba2Config(vocab_size=10, d_model=10, head_dim=3)
    with pytest.raises(ValueError, match="n_groups"):
        Mamba2Config(vocab_size=10, d_model=16, head_dim=8, n_groups=3)
    with pytest.raises(ValueError, match="method"):
        Mamba2LM(Mamba2Config(vocab_size=10), method="fast")
    with pytest.raises(ValueError, match="group_size"):
        GatedRMSNorm(6, 4)
    model = Mamba2LM(Mamba2Config(vocab_size=10, d_model=16, n_layers=1, head_dim=8))
    with pytest.raises(ValueError, match="state"):
        model.step(torch.tensor([1]), [])
    with pytest.raises(ValueError, match="h must have shape"):
        model.layers[0].mixer.step(torch.zeros(1, 3), model.layers[0].mixer.init_state(1))
    with pytest.raises(TypeError, match="state"):
        state_bytes([torch.zeros(1)])
    with pytest.raises(ValueError, match="time_step_limit"):
        hf = hf_tiny()
        hf.config.time_step_limit = (0.001, 0.1)
        mamba2_from_hf(hf)
