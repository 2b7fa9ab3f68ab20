"""Tests for llmbook.transformer.layers: LayerNorm, RMSNorm, their Jacobians, GELU, SiLU, MLP, SwiGLU."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.transformer.layers import (
    ACTIVATIONS,
    MLP,
    LayerNorm,
    RMSNorm,
    SwiGLU,
    gelu,
    get_activation,
    layer_norm_jacobian,
    mlp_parameter_count,
    rms_norm_jacobian,
    silu,
    swiglu_hidden_size,
    swiglu_parameter_count,
    swish,
)

B, T, D, D_FF = 3, 5, 7, 11  # all different, so a transposed axis cannot hide


def _randomise(module, seed):
    """Give every parameter of ``module`` random values (so gains and biases are not 1 and 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def _x(seed, dtype=torch.float32, shape=(B, T, D), scale=1.0, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(shape, generator=g, dtype=dtype) + shift


# ---------------------------------------------------------------- LayerNorm


def test_layer_norm_worked_example():
    x = torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=torch.float64)
    # mean 3, biased variance (4 + 1 + 0 + 9) / 4 = 3.5
    expected = (x - 3.0) / math.sqrt(3.5 + 1e-5)
    ln = LayerNorm(4, eps=1e-5, dtype=torch.float64)
    assert torch.allclose(ln(x), expected, rtol=0, atol=1e-15)
    y = ln(x)
    assert abs(y.mean().item()) < 1e-15
    assert abs(y.pow(2).mean().item() - 3.5 / (3.5 + 1e-5)) < 1e-15


def test_layer_norm_eps_zero_is_the_bare_definition():
    # x = (1, 2, 3, 6): mean 3, biased variance 3.5, so y = (x - 3) / sqrt(3.5) exactly;
    # non-square batch (2, 3, 4) and equality with torch.nn.functional.layer_norm(eps=0)
    x = torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=torch.float64)
    ln0 = LayerNorm(4, eps=0.0, dtype=torch.float64)
    assert torch.allclose(ln0(x), torch.tensor([-2.0, -1.0, 0.0, 3.0], dtype=torch.float64) / math.sqrt(3.5),
                          rtol=0, atol=1e-15)
    assert abs(ln0(x).pow(2).mean().item() - 1.0) < 1e-15  # unit variance only when eps = 0
    xb = _x(11, torch.float64, shape=(2, 3, 4), scale=2.0, shift=1.0)
    assert torch.allclose(ln0(xb), F.layer_norm(xb, (4,), eps=0.0), rtol=0, atol=1e-14)
    assert not torch.allclose(LayerNorm(4, dtype=torch.float64)(xb), ln0(xb), rtol=0, atol=1e-9)
    assert torch.isnan(ln0(torch.ones(4, dtype=torch.float64))).all()  # 0 / 0, as documented


def test_layer_norm_parameters_and_init():
    ln = LayerNorm(D)
    assert dict(ln.named_parameters()).keys() == {"weight", "bias"}
    assert torch.equal(ln.weight, torch.ones(D)) and torch.equal(ln.bias, torch.zeros(D))
    no_bias = LayerNorm(D, bias=False)
    assert no_bias.bias is None and [n for n, _ in no_bias.named_parameters()] == ["weight"]
    assert set(ln.state_dict()) == set(torch.nn.LayerNorm(D).state_dict())


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("eps", [1e-5, 1e-2])
def test_layer_norm_equals_torch(bias, eps):
    ours = _randomise(LayerNorm(D, eps=eps, bias=bias), 0)
    ref = torch.nn.LayerNorm(D, eps=eps, bias=bias)
    ref.load_state_dict(ours.state_dict())
    x = _x(1, scale=3.0, shift=2.0)
    assert torch.allclose(ours(x), ref(x), rtol=0, atol=1e-6)
    assert torch.allclose(ours(x), F.layer_norm(x, (D,), ref.weight, ref.bias, eps), atol=1e-6)
    x64 = x.double()
    ours64, ref64 = ours.double(), ref.double()
    assert torch.allclose(ours64(x64), ref64(x64), rtol=0, atol=1e-13)


def test_layer_norm_gradcheck():
    ln = _randomise(LayerNorm(D, dtype=torch.float64), 2)
    x = _x(3, torch.float64, shape=(2, 3, D)).requires_grad_(True)

    def f(x, w, b):
        return torch.func.functional_call(ln, {"weight": w, "bias": b}, (x,))

    w = ln.weight.detach().clone().requires_grad_(True)
    b = ln.bias.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(f, (x, w, b))
    assert torch.autograd.gradgradcheck(ln, (x,))


# ---------------------------------------------------------------- RMSNorm


def test_rms_norm_worked_example():
    rms = RMSNorm(4, eps=1e-6, dtype=torch.float64)
    x = torch.tensor([1.0, -2.0, 3.0, 4.0], dtype=torch.float64)  # mean square 30 / 4 = 7.5
    assert torch.allclose(rms(x), x / math.sqrt(7.5 + 1e-6), rtol=0, atol=1e-15)
    assert dict(rms.named_parameters()).keys() == {"weight"}
    assert torch.equal(RMSNorm(D).weight, torch.ones(D))


def test_rms_norm_equals_torch_and_llama():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    ours = _randomise(RMSNorm(D, eps=1e-6), 4)
    ref = torch.nn.RMSNorm(D, eps=1e-6)
    ref.load_state_dict(ours.state_dict())
    llama = LlamaRMSNorm(D, eps=1e-6)
    llama.load_state_dict(ours.state_dict())
    x = _x(5, scale=2.0, shift=1.0)
    assert torch.allclose(ours(x), ref(x), rtol=0, atol=1e-6)
    assert torch.allclose(ours(x), llama(x), rtol=0, atol=1e-6)
    # half precision: normalise in float32, cast back, then scale - bit for bit as Llama
    for dtype in (torch.bfloat16, torch.float16):
        xh = x.to(dtype)
        assert torch.equal(ours(xh), llama(xh))
        assert ours(xh).dtype == llama(xh).dtype == torch.float32  # float32 weight promotes
        ours_h = RMSNorm(D, dtype=dtype)
        llama_h = LlamaRMSNorm(D).to(dtype)
        llama_h.load_state_dict(ours_h.state_dict())
        assert torch.equal(ours_h(xh), llama_h(xh)) and ours_h(xh).dtype == dtype


def test_rms_norm_keeps_float64_and_gradchecks():
    rms = _randomise(RMSNorm(D, dtype=torch.float64), 6)
    x = _x(7, torch.float64, shape=(2, 3, D)).requires_grad_(True)
    assert rms(x).dtype == torch.float64
    ref = torch.nn.RMSNorm(D, eps=1e-6, dtype=torch.float64)
    ref.load_state_dict(rms.state_dict())
    assert torch.allclose(rms(x), ref(x), rtol=0, atol=1e-14)
    w = rms.weight.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda x, w: torch.func.functional_call(rms, {"weight": w}, (x,)), (x, w)
    )


def test_norm_bad_inputs():
    for cls in (LayerNorm, RMSNorm):
        norm = cls(4)
        with pytest.raises(ValueError, match=r"shape \(\.\.\., 4\), got \(2, 3, 5\)"):
            norm(torch.zeros(2, 3, 5))
        with pytest.raises(ValueError, match=r"shape \(\.\.\., 4\), got \(\)"):
            norm(torch.tensor(1.0))
        with pytest.raises(TypeError, match="floating-point"):
            norm(torch.zeros(2, 4, dtype=torch.long))
        with pytest.raises(ValueError, match="d must be positive"):
            cls(0)
        with pytest.raises(TypeError, match="d must be an int"):
            cls(4.0)
        if cls is RMSNorm:
            with pytest.raises(ValueError, match="eps must be a positive finite number, got eps=0"):
                cls(4, eps=0.0)
        else:
            with pytest.raises(ValueError, match="eps must be a non-negative finite number, got eps=-1"):
                cls(4, eps=-1.0)
        with pytest.raises(ValueError, match="eps=-1e-05"):
            cls(4, eps=-1e-5)
        with pytest.raises(ValueError, match="eps=inf"):
            cls(4, eps=math.inf)


# ---------------------------------------------------------------- Jacobians


def test_layer_norm_jacobian_equals_autograd():
    ln = _randomise(LayerNorm(D, eps=1e-3, dtype=torch.float64), 8)
    x = _x(9, torch.float64, shape=(2, 3, D))
    ours = layer_norm_jacobian(x, ln.weight.detach(), eps=1e-3)  # (2, 3, D, D)
    assert ours.shape == (2, 3, D, D)
    for b in range(2):
        for t in range(3):
            ref = torch.autograd.functional.jacobian(ln, x[b, t])
            assert torch.allclose(ours[b, t], ref, rtol=0, atol=1e-13)


def test_rms_norm_jacobian_equals_autograd():
    rms = _randomise(RMSNorm(D, eps=1e-3, dtype=torch.float64), 10)
    x = _x(11, torch.float64, shape=(4, D))
    ours = rms_norm_jacobian(x, rms.weight.detach(), eps=1e-3)
    for t in range(4):
        ref = torch.autograd.functional.jacobian(rms, x[t])
        assert torch.allclose(ours[t], ref, rtol=0, atol=1e-13)


def test_jacobian_null_spaces():
    x = _x(12, torch.float64, shape=(D,), scale=2.0, shift=1.0)
    ones = torch.ones(D, dtype=torch.float64)
    eps = 1e-5
    J = layer_norm_jacobian(x, eps=eps)
    assert (J @ ones).abs().max() < 1e-14  # shifts do nothing, for every eps
    var = x.var(unbiased=False)
    # x is annihilated up to eps: J x = (x - mu) / sigma * eps / (var + eps)
    expected = (x - x.mean()) / (var + eps).sqrt() * eps / (var + eps)
    assert torch.allclose(J @ x, expected, rtol=0, atol=1e-15)
    assert (J @ x).abs().max() < 1e-5
    # with gamma = 1 the singular values are 1/sigma (d - 2 times), eps / sigma^3 and 0
    sigma = (var + eps).sqrt()
    sv = torch.linalg.svdvals(J)  # descending
    assert torch.allclose(sv[: D - 2], torch.full((D - 2,), 1 / sigma.item(), dtype=torch.float64))
    assert abs(sv[D - 2].item() - eps / sigma.item() ** 3) < 1e-12 and sv[D - 1] < 1e-14
    Jr = rms_norm_jacobian(x, eps=eps)
    r2 = x.pow(2).mean() + eps
    assert torch.allclose(Jr @ x, x * eps / r2**1.5, rtol=0, atol=1e-15)
    sv = torch.linalg.svdvals(Jr)  # 1/r (d - 1 times) and eps / r^3 along x
    assert torch.allclose(sv[: D - 1], torch.full((D - 1,), r2.item() ** -0.5, dtype=torch.float64))
    assert abs(sv[D - 1].item() - eps / r2.item() ** 1.5) < 1e-12


def test_jacobian_bad_inputs():
    with pytest.raises(ValueError, match=r"weight expects input of shape \(\.\.\., 3\)"):
        layer_norm_jacobian(torch.zeros(2, 3), torch.ones(4))
    with pytest.raises(ValueError, match="0-d"):
        rms_norm_jacobian(torch.tensor(1.0))
    with pytest.raises(ValueError, match="eps"):
        rms_norm_jacobian(torch.zeros(3), eps=0.0)
    with pytest.raises(TypeError, match="floating-point"):
        layer_norm_jacobian(torch.zeros(3, dtype=torch.int64))


# ---------------------------------------------------------------- invariances (hypothesis)

rows = st.integers(2, 9).flatmap(
    lambda n: st.lists(
        st.floats(-100, 100, allow_nan=False, allow_subnormal=False), min_size=n, max_size=n
    )
)


@settings(max_examples=60, deadline=None)
@given(rows, st.floats(1e-2, 1e2), st.floats(-50, 50))
def test_layer_norm_affine_invariance(values, alpha, beta):
    x = torch.tensor(values, dtype=torch.float64)
    if x.var(unbiased=False) < 1e-2:  # away from the eps floor
        return
    ln = LayerNorm(x.numel(), eps=1e-20, dtype=torch.float64)  # eps -> 0
    y = ln(x)
    assert torch.allclose(ln(alpha * x + beta), y, rtol=0, atol=1e-8)
    # exactly, with eps: LN_eps(alpha x + beta) = LN_{eps / alpha^2}(x)
    ln_eps = LayerNorm(x.numel(), eps=0.1, dtype=torch.float64)
    ln_scaled = LayerNorm(x.numel(), eps=0.1 / alpha**2, dtype=torch.float64)
    assert torch.allclose(ln_eps(alpha * x + beta), ln_scaled(x), rtol=0, atol=1e-9)
    assert abs(y.mean().item()) < 1e-9 and abs(y.pow(2).mean().item() - 1) < 1e-8


@settings(max_examples=60, deadline=None)
@given(rows, st.floats(1e-2, 1e2))
def test_rms_norm_scale_invariance(values, alpha):
    x = torch.tensor(values, dtype=torch.float64)
    if x.pow(2).mean() < 1e-2:
        return
    rms = RMSNorm(x.numel(), eps=1e-20, dtype=torch.float64)  # eps -> 0
    y = rms(x)
    assert torch.allclose(rms(alpha * x), y, rtol=0, atol=1e-8)
    assert abs(y.pow(2).mean().item() - 1) < 1e-8
    rms_eps = RMSNorm(x.numel(), eps=0.1, dtype=torch.float64)
    rms_scaled = RMSNorm(x.numel(), eps=0.1 / alpha**2, dtype=torch.float64)
    assert torch.allclose(rms_eps(alpha * x), rms_scaled(x), rtol=0, atol=1e-9)
    # a negative factor flips the sign; a shift is NOT removed (no re-centring)
    assert torch.allclose(rms(-alpha * x), -y, rtol=0, atol=1e-8)


def test_rms_norm_is_not_shift_invariant_but_layer_norm_is():
    x = _x(13, torch.float64, shape=(D,))
    rms, ln = RMSNorm(D, dtype=torch.float64), LayerNorm(D, dtype=torch.float64)
    assert (rms(x + 3.0) - rms(x)).abs().max() > 0.1
    assert (ln(x + 3.0) - ln(x)).abs().max() < 1e-12
    # on zero-mean rows the two agree (up to their eps)
    xc = x - x.mean()
    rms0, ln0 = (
        RMSNorm(D, eps=1e-5, dtype=torch.float64),
        LayerNorm(D, eps=1e-5, dtype=torch.float64),
    )
    assert torch.allclose(rms0(xc), ln0(xc), rtol=0, atol=1e-14)


# ---------------------------------------------------------------- activations


def test_gelu_worked_values():
    x = torch.tensor([-1.0, 0.0, 1.0, 2.0], dtype=torch.float64)
    phi = 0.5 * (1 + torch.erf(x / math.sqrt(2)))
    assert torch.allclose(gelu(x), x * phi, rtol=0, atol=1e-16)
    assert abs(gelu(torch.tensor(1.0, dtype=torch.float64)).item() - 0.8413447460685429) < 1e-15
    assert gelu(torch.zeros(3)).abs().max() == 0
    # tanh form at 1: 0.5 (1 + tanh(sqrt(2/pi) * 1.044715))
    value = 0.5 * (1 + math.tanh(math.sqrt(2 / math.pi) * 1.044715))
    assert abs(gelu(torch.tensor(1.0, dtype=torch.float64), "tanh").item() - value) < 1e-15


def test_gelu_equals_torch():
    x = torch.linspace(-6, 6, 3001)  # float32
    assert torch.allclose(gelu(x), F.gelu(x), rtol=0, atol=1e-6)
    assert torch.allclose(gelu(x, "tanh"), F.gelu(x, approximate="tanh"), rtol=0, atol=1e-6)
    x2 = _x(14, shape=(B, T, D), scale=3.0)
    assert torch.allclose(gelu(x2, approximate="tanh"), F.gelu(x2, approximate="tanh"), atol=1e-6)
    from transformers.activations import ACT2FN

    assert torch.allclose(gelu(x2, "tanh"), ACT2FN["gelu_new"](x2), rtol=0, atol=1e-6)


def test_gelu_tanh_error_is_below_5e_4():
    x = torch.linspace(-6, 6, 120001, dtype=torch.float64)
    err = (gelu(x) - gelu(x, "tanh")).abs()
    assert 4.6e-4 < err.max().item() < 4.8e-4  # measured 4.73e-4
    assert 2.6 < x[err.argmax()].abs().item() < 2.8
    assert err[x.abs() < 0.1].max() < 1e-7  # O(x^4) error near 0


def test_silu_and_swish():
    x = _x(15, shape=(B, T, D), scale=3.0)
    assert torch.allclose(silu(x), F.silu(x), rtol=0, atol=1e-6)
    assert torch.allclose(swish(x, 1.0), silu(x), rtol=0, atol=1e-6)
    x64 = torch.tensor([0.0, 1.0, -2.0], dtype=torch.float64)
    assert torch.allclose(swish(x64, 2.0), x64 / (1 + torch.exp(-2 * x64)), rtol=0, atol=1e-16)


def test_activation_gradchecks():
    x = _x(16, torch.float64, shape=(4, 6), scale=3.0).requires_grad_(True)
    assert torch.autograd.gradcheck(gelu, (x,))
    assert torch.autograd.gradcheck(lambda v: gelu(v, "tanh"), (x,))
    assert torch.autograd.gradcheck(silu, (x,))


def test_activation_registry_and_bad_names():
    x = _x(17, shape=(5,))
    assert torch.equal(get_activation("gelu_new")(x), gelu(x, "tanh"))
    assert torch.equal(get_activation("gelu")(x), gelu(x))
    assert torch.equal(get_activation("relu")(x), F.relu(x))
    assert {"gelu", "gelu_tanh", "gelu_new", "relu", "silu"} <= set(ACTIVATIONS)
    with pytest.raises(ValueError, match=r"unknown activation 'tanh_gelu'"):
        get_activation("tanh_gelu")
    with pytest.raises(ValueError, match=r"approximate must be 'none' or 'tanh', got 'erf'"):
        gelu(x, approximate="erf")
    with pytest.raises(TypeError, match="floating-point"):
        gelu(torch.arange(3))
    with pytest.raises(TypeError, match="torch.Tensor"):
        silu([1.0])


# ---------------------------------------------------------------- MLP and SwiGLU


def test_mlp_structure_and_formula():
    mlp = _randomise(MLP(D, D_FF, dtype=torch.float64), 18)
    assert dict(mlp.named_parameters()).keys() == {
        "fc.weight",
        "fc.bias",
        "proj.weight",
        "proj.bias",
    }
    assert mlp.fc.weight.shape == (D_FF, D) and mlp.proj.weight.shape == (D, D_FF)
    x = _x(19, torch.float64)
    expected = F.gelu(x @ mlp.fc.weight.T + mlp.fc.bias, approximate="tanh") @ mlp.proj.weight.T
    assert torch.allclose(mlp(x), expected + mlp.proj.bias, rtol=0, atol=1e-13)
    relu = MLP(D, D_FF, activation="relu", bias=False)
    assert relu.fc.bias is None and relu.proj.bias is None
    assert sum(p.numel() for p in relu.parameters()) == mlp_parameter_count(D, D_FF, bias=False)
    assert sum(p.numel() for p in mlp.parameters()) == mlp_parameter_count(D, D_FF)


def test_relu_mlp_worked_example():
    # d_model = 2, d_ff = 3: W1 x + b1 = (1.5, -1, 0.25) -> ReLU (1.5, 0, 0.25)
    # -> W2 h + b2 = (1.5 + 0.5 + 0.1, -1.5 + 0 - 0.2) = (2.1, -1.7); non-square weights
    mlp = MLP(2, 3, activation="relu", dtype=torch.float64)
    f64 = torch.float64
    with torch.no_grad():
        mlp.fc.weight.copy_(torch.tensor([[1.0, 0.5], [-1.0, 0.0], [0.25, -0.25]], dtype=f64))
        mlp.fc.bias.copy_(torch.tensor([0.0, 0.0, 0.25], dtype=f64))
        mlp.proj.weight.copy_(torch.tensor([[1.0, 2.0, 2.0], [-1.0, 5.0, -0.8]], dtype=f64))
        mlp.proj.bias.copy_(torch.tensor([0.1, 0.0], dtype=f64))
    x = torch.tensor([1.0, 1.0], dtype=torch.float64)
    assert torch.allclose(mlp.fc(x), torch.tensor([1.5, -1.0, 0.25], dtype=torch.float64), rtol=0, atol=1e-15)
    assert torch.allclose(mlp(x), torch.tensor([2.1, -1.7], dtype=torch.float64), rtol=0, atol=1e-15)
    # the negative pre-activation is cut: its weights in proj do not matter
    with torch.no_grad():
        mlp.proj.weight[:, 1] = 123.0
    assert torch.allclose(mlp(x), torch.tensor([2.1, -1.7], dtype=torch.float64), rtol=0, atol=1e-15)


def test_mlp_equals_transformers_gpt2_mlp():
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

    cfg = GPT2Config(n_embd=D, n_head=1, activation_function="gelu_new", resid_pdrop=0.0)
    ref = _randomise(GPT2MLP(D_FF, cfg), 20).eval()
    ours = MLP(D, D_FF, activation="gelu_tanh")
    with torch.no_grad():  # GPT-2's Conv1D stores the transposed weight (in, out)
        ours.fc.weight.copy_(ref.c_fc.weight.T)
        ours.fc.bias.copy_(ref.c_fc.bias)
        ours.proj.weight.copy_(ref.c_proj.weight.T)
        ours.proj.bias.copy_(ref.c_proj.bias)
    x = _x(21)
    assert torch.allclose(ours(x), ref(x), rtol=0, atol=1e-5)
    assert (ours(x) - ref(x)).abs().max() / ref(x).abs().max() < 1e-6


def test_swiglu_equals_transformers_llama_mlp():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    cfg = LlamaConfig(
        hidden_size=D + 1,
        intermediate_size=D_FF,
        hidden_act="silu",
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    ref = _randomise(LlamaMLP(cfg), 22)
    ours = SwiGLU(D + 1, D_FF)
    assert set(ours.state_dict()) == set(ref.state_dict())
    ours.load_state_dict(ref.state_dict())
    x = _x(23, shape=(B, T, D + 1))
    assert torch.allclose(ours(x), ref(x), rtol=0, atol=1e-6 * ref(x).abs().max().item())
    w = ours
    expected = (F.silu(x @ w.gate_proj.weight.T) * (x @ w.up_proj.weight.T)) @ w.down_proj.weight.T
    assert torch.allclose(ours(x), expected, rtol=0, atol=1e-5)


def test_swiglu_parameter_counts():
    s = SwiGLU(D, D_FF)
    assert sum(p.numel() for p in s.parameters()) == 3 * D * D_FF == swiglu_parameter_count(D, D_FF)
    sb = SwiGLU(D, D_FF, bias=True)
    assert sum(p.numel() for p in sb.parameters()) == swiglu_parameter_count(D, D_FF, bias=True)
    assert swiglu_parameter_count(D, D_FF, bias=True) == 3 * D * D_FF + 2 * D_FF + D
    assert mlp_parameter_count(768, 3072) == 4_722_432
    assert swiglu_parameter_count(4096, 11008) == 135_266_304


def test_swiglu_hidden_size_llama_rule():
    assert swiglu_hidden_size(4096) == 11008  # Llama 7B
    assert swiglu_hidden_size(5120) == 13824  # Llama 13B
    assert swiglu_hidden_size(4096, multiple_of=1024, ffn_dim_multiplier=1.3) == 14336  # Llama 3 8B
    assert (
        swiglu_hidden_size(8192, multiple_of=4096, ffn_dim_multiplier=1.3) == 28672
    )  # Llama 2 70B
    assert swiglu_hidden_size(6, multiple_of=1) == 16  # int(2 * 24 / 3)
    with pytest.raises(ValueError, match="multiple_of must be positive"):
        swiglu_hidden_size(64, multiple_of=0)
    with pytest.raises(ValueError, match="ffn_dim_multiplier must be positive"):
        swiglu_hidden_size(64, ffn_dim_multiplier=0.0)


def test_ffn_gradchecks():
    x = _x(24, torch.float64, shape=(2, 3, 4)).requires_grad_(True)
    mlp = _randomise(MLP(4, 6, dtype=torch.float64), 25)
    mlp_exact = _randomise(MLP(4, 6, activation="gelu", dtype=torch.float64), 26)
    swiglu = _randomise(SwiGLU(4, 6, dtype=torch.float64), 27)
    assert torch.autograd.gradcheck(mlp, (x,))
    assert torch.autograd.gradcheck(mlp_exact, (x,))
    assert torch.autograd.gradcheck(swiglu, (x,))
    params = {k: v.detach().clone().requires_grad_(True) for k, v in swiglu.named_parameters()}
    names = list(params)
    assert torch.autograd.gradcheck(
        lambda *ws: torch.func.functional_call(swiglu, dict(zip(names, ws, strict=True)), (x,)),
        tuple(params.values()),
    )


def test_ffn_bad_inputs():
    with pytest.raises(
        ValueError, match=r"MLP expects input of shape \(\.\.\., 7\), got \(3, 5, 11\)"
    ):
        MLP(D, D_FF)(torch.zeros(3, 5, 11))
    with pytest.raises(
        ValueError, match=r"SwiGLU expects input of shape \(\.\.\., 7\), got \(11,\)"
    ):
        SwiGLU(D, D_FF)(torch.zeros(11))
    with pytest.raises(ValueError, match="unknown activation 'gelu_exact'"):
        MLP(D, D_FF, activation="gelu_exact")
    with pytest.raises(ValueError, match="d_ff must be positive, got d_ff=0"):
        MLP(D, 0)
    with pytest.raises(ValueError, match="d_model must be positive, got d_model=-1"):
        SwiGLU(-1, D_FF)
    with pytest.raises(TypeError, match="d_ff must be an int"):
        SwiGLU(D, 2.5)
    with pytest.raises(ValueError, match="d_model must be positive"):
        mlp_parameter_count(0, 4)


# ---------------------------------------------------------------- tanh_cdf_error (moved from notebook 06)

import mpmath as mp  # noqa: E402
import numpy as np  # noqa: E402

from llmbook.transformer.layers import tanh_cdf_error  # noqa: E402


def test_tanh_cdf_error_worked_values_and_peers():
    x = torch.linspace(-5, 5, 1001, dtype=torch.float64)
    assert tanh_cdf_error(torch.zeros(3, dtype=torch.float64)).abs().max().item() == 0
    # peer: scipy's normal CDF, and the tanh form written out in NumPy
    from scipy.stats import norm

    xn = x.numpy()
    for c in (0.044715, 0.0):
        want = 0.5 * (1 + np.tanh(math.sqrt(2 / math.pi) * (xn + c * xn**3))) - norm.cdf(xn)
        assert np.allclose(tanh_cdf_error(x, c).numpy(), want, rtol=0, atol=1e-15)
    # GELU_tanh - GELU = x (Phi_tanh - Phi), with the package's gelu on both sides
    assert torch.allclose(x * tanh_cdf_error(x), gelu(x, "tanh") - gelu(x), rtol=0, atol=1e-15)
    # odd in x, and 30-digit mpmath values at a few points, both up to the round-off of the
    # two halves (1 + .) / 2, a few ulp of 1 (2.2e-16)
    assert torch.allclose(tanh_cdf_error(-x), -tanh_cdf_error(x), rtol=0, atol=1e-15)
    with mp.workdps(30):
        for t in (0.3, 1.7, 2.5, -4.0):
            z = mp.mpf(t)
            exact = (1 + mp.tanh(mp.sqrt(2 / mp.pi) * (z + mp.mpf("0.044715") * z**3))) / 2 - mp.ncdf(z)
            assert abs(tanh_cdf_error(torch.tensor(t, dtype=torch.float64)).item() - float(exact)) < 1e-15


def test_tanh_cdf_error_bad_input():
    with pytest.raises(TypeError, match="tanh_cdf_error"):
        tanh_cdf_error(torch.arange(3))
    for bad in (float("nan"), float("inf"), "0.04", True):
        with pytest.raises(ValueError, match="c must be a finite real number"):
            tanh_cdf_error(torch.zeros(2), bad)
