"""Tests for llmbook.transformer.model: the configuration, the decoder block and TransformerLM."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.func import functional_call

from llmbook.transformer.model import (
    DecoderBlock,
    GeGLU,
    TransformerConfig,
    TransformerLM,
    expected_initial_loss,
    minimal_forward,
)


def tiny(style: str = "llama", **kw) -> TransformerConfig:
    base = dict(vocab_size=37, d_model=24, n_layers=2, n_heads=4, max_seq_len=20)
    base.update(kw)
    if style == "gpt2":
        return TransformerConfig.gpt2_style(**base)
    if style == "qwen2":
        return TransformerConfig.qwen2_style(**base)
    return TransformerConfig.llama_style(**base)


# ---------------------------------------------------------------- configuration


def test_config_defaults_and_resolution():
    c = TransformerConfig(vocab_size=10, d_model=12, n_layers=1, n_heads=3)
    assert (c.n_kv_heads, c.d_head, c.d_ff, c.activation) == (3, 4, 48, "gelu_tanh")
    assert (c.qkv_bias, c.out_bias) == (True, True)
    s = TransformerConfig(vocab_size=10, d_model=96, n_layers=1, n_heads=3, mlp="swiglu")
    assert s.d_ff == 256 and s.activation == "silu"  # int(8 * 96 / 3) = 256, a multiple of 32
    q = TransformerConfig.qwen2_style()
    assert (q.n_kv_heads, q.d_ff, q.qkv_bias, q.out_bias, q.mlp_bias, q.tie_embeddings) == \
        (2, 4864, True, False, False, True)
    assert q.rope_theta == 1e6 and q.norm == "rmsnorm" and q.positions == "rope"
    assert TransformerConfig.llama_style().d_ff == 11008
    assert TransformerConfig.gpt2_style().to_dict()["d_ff"] == 3072


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(d_model=10, n_heads=4), r"d_model=10 is not divisible by n_heads=4"),
        (dict(n_heads=4, n_kv_heads=3), r"n_heads=4 is not divisible by n_kv_heads=3"),
        (dict(n_layers=0), r"n_layers must be positive, got n_layers=0"),
        (dict(vocab_size=-5), r"vocab_size=-5"),
        (dict(d_ff=0), r"d_ff=0"),
        (dict(norm="batchnorm"), r"unknown norm='batchnorm'"),
        (dict(positions="alibi"), r"unknown positions='alibi'"),
        (dict(mlp="relu"), r"unknown mlp='relu'"),
        (dict(activation="tanhh"), r"unknown activation='tanhh'"),
        (dict(mlp="swiglu", activation="gelu"), r"activation='gelu'"),
        (dict(positions="rope", d_model=12, n_heads=4), r"d_head must be even, got d_head=3"),
        (dict(norm_eps=0.0), r"norm_eps must be a positive number"),
        (dict(positions="rope", rope_theta=1.0), r"rope_theta must be greater than 1"),
    ],
)
def test_config_rejects_bad_values(kwargs, message):
    base = dict(vocab_size=10, d_model=16, n_layers=1, n_heads=4)
    base.update(kwargs)
    with pytest.raises(ValueError, match=message):
        TransformerConfig(**base)


def test_config_rejects_non_int_sizes():
    with pytest.raises(TypeError, match="d_model must be an int"):
        TransformerConfig(vocab_size=10, d_model=16.0, n_layers=1, n_heads=4)
    with pytest.raises(TypeError, match="TransformerConfig"):
        TransformerLM({"vocab_size": 10})


# ---------------------------------------------------------------- forward pass


@pytest.mark.parametrize("style", ["gpt2", "llama", "qwen2"])
def test_forward_shape_and_finite(style):
    model = TransformerLM(tiny(style), generator=torch.Generator().manual_seed(0))
    ids = torch.randint(0, 37, (3, 13))
    z = model(ids)
    assert z.shape == (3, 13, 37) and z.dtype == torch.float32 and torch.isfinite(z).all()


def test_block_is_pre_norm_residual():
    """x + attn(norm(x)), then + mlp(norm(.)), spelled out by hand."""
    torch.manual_seed(0)
    c = tiny("gpt2")
    block = DecoderBlock(c).double()
    for p in block.parameters():
        p.data.normal_(0, 0.3)
    x = torch.randn(2, 7, 24, dtype=torch.float64)
    h = x + block.attn(block.attn_norm(x))
    expected = h + block.mlp(block.mlp_norm(h))
    assert torch.allclose(block(x), expected, rtol=0, atol=1e-14)


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_fused_attention_equals_book_attention(style):
    model = TransformerLM(tiny(style, n_kv_heads=2)).double()
    ids = torch.randint(0, 37, (2, 11))
    fused = model(ids)
    model.set_fused_attention(False)
    assert not any(b.attn.fused for b in model.blocks) and not model.config.fused_attention
    book = model(ids)
    assert torch.allclose(fused, book, rtol=0, atol=1e-12)


@settings(max_examples=15, deadline=None)
@given(style=st.sampled_from(["gpt2", "llama"]), T=st.integers(2, 20), t=st.integers(0, 19),
       seed=st.integers(0, 1000))
def test_causal_logits_ignore_the_future(style, T, t, seed):
    t = t % T
    g = torch.Generator().manual_seed(seed)
    model = TransformerLM(tiny(style), generator=g)
    ids = torch.randint(0, 37, (2, T), generator=g)
    changed = ids.clone()
    changed[:, t] = (changed[:, t] + 1) % 37
    with torch.no_grad():
        a, b = model(ids), model(changed)
    assert torch.equal(a[:, :t], b[:, :t])
    assert (a[:, t] - b[:, t]).abs().max() > 0


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_block_mask_with_restarted_positions_packs_documents(style):
    model = TransformerLM(tiny(style)).double()
    g = torch.Generator().manual_seed(3)
    a, b = torch.randint(0, 37, (1, 7), generator=g), torch.randint(0, 37, (1, 5), generator=g)
    packed = torch.cat([a, b], dim=1)  # (1, 12): two documents in one row
    doc = torch.tensor([0] * 7 + [1] * 5)
    mask = (doc[:, None] == doc[None, :])[None, None]  # (1, 1, 12, 12) block diagonal
    positions = torch.cat([torch.arange(7), torch.arange(5)])
    out = model(packed, positions=positions, mask=mask)
    assert torch.allclose(out[:, :7], model(a), rtol=0, atol=1e-12)
    assert torch.allclose(out[:, 7:], model(b), rtol=0, atol=1e-12)
    # without the mask the second document sees the first
    assert (model(packed, positions=positions)[:, 7:] - model(b)).abs().max() > 1e-3
    assert torch.equal(model(packed, mask=torch.ones(12, 12, dtype=torch.bool)), model(packed))
    with pytest.raises(TypeError, match="boolean"):
        model(packed, mask=mask.double())


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_hidden_states_are_what_the_head_reads(style):
    model = TransformerLM(tiny(style)).double()  # gpt2 ties its head, llama does not
    ids = torch.randint(0, 37, (3, 9))
    h = model.hidden_states(ids)
    assert h.shape == (3, 9, 24)
    head = model.embed.weight if model.lm_head is None else model.lm_head.weight
    assert (model.lm_head is None) == (style == "gpt2")
    assert torch.allclose(model(ids), h @ head.T, rtol=0, atol=1e-12)


def test_rope_model_depends_only_on_relative_positions():
    model = TransformerLM(tiny("llama", max_seq_len=40)).double()
    ids = torch.randint(0, 37, (2, 9))
    shifted = model(ids, positions=torch.arange(9) + 17)
    assert torch.allclose(model(ids), shifted, rtol=0, atol=1e-10)
    per_row = model(ids, positions=torch.stack([torch.arange(9), torch.arange(9) + 5]))
    assert torch.allclose(model(ids), per_row, rtol=0, atol=1e-10)
    # a learned table has no such symmetry
    gpt = TransformerLM(tiny("gpt2", max_seq_len=40)).double()
    assert not torch.allclose(gpt(ids), gpt(ids, positions=torch.arange(9) + 17), atol=1e-6)


def test_bad_inputs():
    model = TransformerLM(tiny("gpt2"))
    with pytest.raises(ValueError, match=r"T=21 exceeds max_seq_len=20"):
        model(torch.zeros(1, 21, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token id 37 is out of range for vocab_size=37"):
        model(torch.tensor([[1, 37, 2]]))
    with pytest.raises(ValueError, match=r"token id -1 is out of range"):
        model(torch.tensor([[1, -1, 2]]))
    with pytest.raises(TypeError, match="integer token ids"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"shape \(B, T\)"):
        model(torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match="torch.Tensor"):
        model([[1, 2]])
    with pytest.raises(ValueError, match=r"positions must be integers of shape \(T,\) = \(3,\)"):
        model(torch.zeros(2, 3, dtype=torch.long), positions=torch.arange(4))
    with pytest.raises(ValueError, match=r"position 25 is out of range for max_seq_len=20"):
        model(torch.zeros(1, 3, dtype=torch.long), positions=torch.arange(23, 26))


# ---------------------------------------------------------------- initialisation and tying


def test_gpt2_initialisation():
    c = TransformerConfig.gpt2_style(vocab_size=500, d_model=256, n_layers=8, n_heads=4,
                                     max_seq_len=64)
    model = TransformerLM(c, generator=torch.Generator().manual_seed(0))
    resid = 0.02 / math.sqrt(2 * 8)
    for block in model.blocks:
        assert abs(block.attn.o_proj.weight.std().item() / resid - 1) < 0.05
        assert abs(block.mlp.proj.weight.std().item() / resid - 1) < 0.05
        assert abs(block.attn.q_proj.weight.std().item() / 0.02 - 1) < 0.05
        assert torch.equal(block.attn.q_proj.bias, torch.zeros(256))
        assert torch.equal(block.attn_norm.weight, torch.ones(256))
    assert abs(model.embed.weight.std().item() / 0.02 - 1) < 0.05
    again = TransformerLM(c, generator=torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True))


def test_tied_and_untied_heads():
    tied = TransformerLM(tiny("gpt2"))
    assert tied.lm_head is None
    names = {n for n, _ in tied.named_parameters()}
    assert "embed.weight" in names and not any(n.startswith("lm_head") for n in names)
    ids = torch.randint(0, 10, (2, 5))  # tokens 10..36 never occur in the input
    tied(ids).sum().backward()
    # with tying, the rows of absent tokens still get a gradient, through the output layer
    assert tied.embed.weight.grad[10:].abs().sum() > 0
    untied = TransformerLM(tiny("llama"))
    assert untied.lm_head is not None and untied.lm_head.weight is not untied.embed.weight
    untied(ids).sum().backward()
    assert torch.equal(untied.embed.weight.grad[10:], torch.zeros(27, 24))
    assert untied.lm_head.weight.grad[10:].abs().sum() > 0


def test_builds_on_meta_device():
    with torch.device("meta"):
        model = TransformerLM(TransformerConfig.llama_style(n_layers=2))
        z = model(torch.zeros(1, 8, dtype=torch.long))
    assert z.device.type == "meta" and z.shape == (1, 8, 32000)


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_gradcheck_float64(style):
    """Autograd against central finite differences for every parameter of a tiny model."""
    c = (TransformerConfig.gpt2_style if style == "gpt2" else TransformerConfig.llama_style)(
        vocab_size=5, d_model=4, n_layers=1, n_heads=2, max_seq_len=4, d_ff=6,
        **({"n_kv_heads": 1} if style == "llama" else {}))
    model = TransformerLM(c, generator=torch.Generator().manual_seed(0)).double()
    model.set_fused_attention(False)
    names = [n for n, _ in model.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for p in model.parameters())
    for p in params:  # away from the init's exact zeros and ones
        p.data.add_(0.3 * torch.randn(p.shape, dtype=torch.float64))
    ids = torch.tensor([[1, 4, 0], [2, 2, 3]])

    def f(*ps):
        return functional_call(model, dict(zip(names, ps, strict=True)), (ids,))

    assert torch.autograd.gradcheck(f, params, eps=1e-6, atol=1e-7, rtol=1e-5)


# ---------------------------------------------------------------- the teaching version


@pytest.mark.parametrize("style,tied", [("gpt2", True), ("gpt2", False), ("llama", False),
                                        ("llama", True), ("qwen2", True)])
def test_minimal_forward_equals_forward(style, tied):
    # non-square shapes, grouped-query heads for the RoPE families, every parameter perturbed
    # (biases and gains included, so a forgotten bias or norm would show)
    kv = {} if style == "gpt2" else {"n_kv_heads": 2}
    c = tiny(style, d_model=28, n_heads=4, d_head=6, n_layers=3, tie_embeddings=tied, **kv)
    g = torch.Generator().manual_seed(3)
    model = TransformerLM(c, generator=g).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    ids = torch.randint(0, c.vocab_size, (3, 13), generator=g)
    for fused in (True, False):
        model.set_fused_attention(fused)
        got, want = minimal_forward(model, ids), model(ids)
        assert got.shape == (3, 13, c.vocab_size)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    # a wrong model would differ: dropping the final norm changes the logits by O(1)
    model.final_norm.weight.data.mul_(2.0)
    assert (minimal_forward(model, ids) - want).abs().max() > 1e-2


def test_minimal_forward_rejects_bad_input():
    model = TransformerLM(tiny("gpt2"))
    with pytest.raises(TypeError, match="model"):
        minimal_forward(torch.nn.Linear(2, 2), torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="ids"):
        minimal_forward(model, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="ids"):
        minimal_forward(model, torch.zeros(1, 3))


# ---------------------------------------------------------------- expected_initial_loss


def test_expected_initial_loss_worked_examples():
    assert expected_initial_loss(2, 0.0) == pytest.approx(math.log(2), abs=1e-15)
    # V = 3, sigma^2 = 0, mu = log 2, r = 1/2: log(2 + 2) - log(2) / 2 = 1.5 log 2
    assert expected_initial_loss(3, 0.0, math.log(2), 0.5) == pytest.approx(1.5 * math.log(2), abs=1e-15)
    # the 1/V expansion of the docstring, at the book's tied model (V = 1024, d = 64)
    V, s2, mu, r = 1024, 0.02**2 * 64, 0.73, 0.04
    series = math.log(V) + s2 / 2 + (math.exp(mu - s2 / 2) - 1) / V - r * mu
    assert abs(expected_initial_loss(V, s2, mu, r) - series) < 1e-5


def test_expected_initial_loss_against_simulated_logits():
    # a peer by simulation: V - 1 logits N(0, sigma^2), the current token's logit mu, and a
    # target equal to the current token with probability r; F.cross_entropy scores them
    g = torch.Generator().manual_seed(0)
    V, sigma, mu, r, n = 200, 0.3, 1.5, 0.2, 20_000
    z = sigma * torch.randn(n, V, generator=g, dtype=torch.float64)
    z[:, 0] = mu  # token 0 is the current token
    repeat = torch.rand(n, generator=g, dtype=torch.float64) < r
    other = torch.randint(1, V, (n,), generator=g)
    target = torch.where(repeat, torch.zeros_like(other), other)
    losses = torch.nn.functional.cross_entropy(z, target, reduction="none")
    se = losses.std().item() / math.sqrt(n)
    predicted = expected_initial_loss(V, sigma**2, mu, r)
    # 5 standard errors plus the Jensen gap of log E[S] vs E[log S], about var(S)/(2 E[S]^2)
    jensen = (math.exp(sigma**2) - 1) / (2 * V)
    assert abs(losses.mean().item() - predicted) < 5 * se + jensen
    # and the untied formula (mu ignored) is far outside that interval
    assert abs(losses.mean().item() - expected_initial_loss(V, sigma**2)) > 20 * se


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 100_000), st.floats(0, 1))
def test_expected_initial_loss_untied_is_log_v_plus_half_sigma2(V, s2):
    got = expected_initial_loss(V, s2)
    assert math.log(V) + s2 / 2 - s2 / V - 1e-12 <= got <= math.log(V) + s2 / 2 + 1e-12


@settings(max_examples=50, deadline=None)
@given(st.floats(0.01, 3), st.floats(0, 0.5))
def test_expected_initial_loss_falls_with_repeats_when_mu_is_positive(mu, r):
    assert expected_initial_loss(1024, 0.03, mu, r + 0.1) < expected_initial_loss(1024, 0.03, mu, r)


@pytest.mark.parametrize(("args", "error", "message"), [
    (("10", 0.1), TypeError, "vocab_size"), ((1, 0.1), ValueError, "vocab_size"),
    ((10, -0.1), ValueError, "logit_var"), ((10, 0.1, "a"), TypeError, "self_logit"),
    ((10, 0.1, float("nan")), ValueError, "self_logit"), ((10, 0.1, 0.5, 1.5), ValueError, "repeat_rate"),
])
def test_expected_initial_loss_bad_input(args, error, message):
    with pytest.raises(error, match=message):
        expected_initial_loss(*args)


# ---------------------------------------------------------------- QK-norm


def test_qk_norm_normalises_each_head_before_rope():
    c = tiny("llama", qk_norm=True, d_model=24, n_heads=4, n_kv_heads=2, d_head=10, norm_eps=1e-6)
    m = TransformerLM(c, generator=torch.Generator().manual_seed(0)).double()
    attn = m.blocks[0].attn
    x = 3.0 * torch.randn(2, 7, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    q, k, _ = attn.project_qkv(x)  # no rope: the normalised heads themselves
    assert q.shape == (2, 4, 7, 10) and k.shape == (2, 2, 7, 10)
    # unit gains: every head has mean square 1 (up to eps), whatever the size of x
    assert torch.allclose(q.pow(2).mean(-1), torch.ones(2, 4, 7, dtype=torch.float64), atol=1e-3)
    # by hand: RMSNorm of the raw projection, head by head
    raw = attn.k_proj(x).unflatten(-1, (2, 10)).transpose(1, 2)
    assert torch.allclose(k, raw / raw.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt(), atol=1e-12)
    assert m.num_parameters() == TransformerLM(tiny("llama", d_model=24, n_heads=4, n_kv_heads=2,
                                                   d_head=10)).num_parameters() + 2 * 2 * 10


def test_qk_norm_scope_all_normalises_the_whole_projection_in_the_hook():
    # OLMo 2's scope: one RMSNorm over all H d_head entries of a position, before the split
    from llmbook.transformer.attention import MultiHeadAttention
    from llmbook.transformer.model import QKNormAttention

    g = torch.Generator().manual_seed(4)
    attn = QKNormAttention(20, 6, 2, d_head=3, scope="all", eps=1e-6).double()  # H d_head = 18 != d
    with torch.no_grad():
        for p_ in attn.parameters():
            p_.copy_(torch.randn(p_.shape, generator=g, dtype=torch.float64))
    x = torch.randn(2, 5, 20, generator=g, dtype=torch.float64)
    q, k, v = attn.project_qkv(x)  # (2, 6, 5, 3), (2, 2, 5, 3) x 2
    raw = attn.q_proj(x)  # (2, 5, 18)
    want = attn.q_norm.weight * raw / raw.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    assert torch.allclose(q, want.unflatten(-1, (6, 3)).transpose(1, 2), rtol=0, atol=1e-12)
    # the hook is the only change: an identity norm would give the parent's projections
    plain = MultiHeadAttention(20, 6, 2, d_head=3, dtype=torch.float64)
    plain.load_state_dict({n: t for n, t in attn.state_dict().items() if "norm" not in n})
    raw_q, raw_k, raw_v = plain.project_qkv(x)
    hq, hk = attn.normalise_qk(raw_q, raw_k)
    assert torch.equal(hq, q) and torch.equal(hk, k) and torch.equal(raw_v, v)
    # per-position mean square over all heads is the gain's (unit gains: 1), not per head
    attn.q_norm.weight.data.fill_(1.0)
    q1, _, _ = attn.project_qkv(x)
    ms_all = q1.pow(2).mean(dim=(-3, -1))  # (2, 5)
    assert torch.allclose(ms_all, torch.ones(2, 5, dtype=torch.float64), atol=1e-4)
    assert not torch.allclose(q1.pow(2).mean(-1), torch.ones(2, 6, 5, dtype=torch.float64), atol=1e-2)


def test_qk_norm_needs_rmsnorm():
    with pytest.raises(ValueError, match="qk_norm"):
        tiny("gpt2", qk_norm=True)


# ---------------------------------------------------------------- sliding window, post-norm, options


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 4), st.integers(0, 10**6))
def test_sliding_window_receptive_field_is_l_times_w_minus_one(W, seed):
    # with L layers of window W, position t sees tokens back to t - L (W - 1), no further
    L, T = 2, 14
    m = TransformerLM(tiny("llama", n_layers=L, sliding_window=W, max_seq_len=T),
                      generator=torch.Generator().manual_seed(0)).double()
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 37, (1, T), generator=g)
    t = T - 1
    far, near = t - L * (W - 1) - 1, t - L * (W - 1)
    with torch.no_grad():
        base = m(ids)[0, t]
        changed = ids.clone()
        changed[0, : far + 1] = (changed[0, : far + 1] + 1) % 37  # everything out of reach
        assert torch.allclose(m(changed)[0, t], base, atol=1e-12)
        reach = ids.clone()
        reach[0, near] = (reach[0, near] + 1) % 37  # the oldest token in reach
        assert not torch.allclose(m(reach)[0, t], base, atol=1e-9)


def test_post_norm_block_normalises_the_sublayer_outputs():
    c = tiny("llama", norm_position="post")
    block = DecoderBlock(c).double()
    x = torch.randn(2, 5, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        h = x + block.attn_norm(block.attn(x))
        assert torch.allclose(block(x), h + block.mlp_norm(block.mlp(h)), atol=1e-12)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(qk_norm=True, qk_norm_scope="heads"), "qk_norm_scope"),
    (dict(norm_position="sandwiches"), "norm_position"),
    (dict(layer_types=("full_attention",)), "layer_types"),
    (dict(layer_types=("full_attention", "local")), "layer_types"),
    (dict(layer_types=("full_attention", "sliding_attention")), "sliding_window"),
    (dict(no_rope_layers=(2,)), "no_rope_layers"),
    (dict(embed_scale=0.0), "embed_scale"),
    (dict(embed_scale=None), "embed_scale"),
    (dict(attn_softcap=-1.0), "attn_softcap"),
    (dict(final_softcap=float("inf")), "final_softcap"),
    (dict(attn_scale=True), "attn_scale"),
    (dict(rope_local_theta=100.0), "rope_local_theta"),
    (dict(layer_types=("full_attention", "sliding_attention"), sliding_window=3, rope_local_theta=1.0),
     "rope_local_theta"),
    (dict(sliding_window=0), "sliding_window"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 2.0}), "rope_scaling"),
    (dict(rope_scaling={"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}), "rope_scaling"),
])
def test_new_options_reject_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny("llama", **kwargs)
    with pytest.raises(TypeError, match="rope_scaling"):
        tiny("llama", rope_scaling="llama3")


def test_minimal_forward_refuses_a_sliding_window():
    m = TransformerLM(tiny("llama", sliding_window=3))
    with pytest.raises(ValueError, match="sliding-window"):
        minimal_forward(m, torch.zeros(1, 4, dtype=torch.long))


def test_to_dict_leaves_out_later_options_at_their_defaults():
    c = tiny("llama")
    d = c.to_dict()
    assert not {"qk_norm", "qk_norm_scope", "norm_position", "sliding_window", "rope_scaling"} & set(d)
    assert TransformerConfig(**d) == c
    c2 = tiny("llama", qk_norm=True, sliding_window=4)
    d2 = c2.to_dict()
    assert d2["qk_norm"] is True and d2["sliding_window"] == 4 and "norm_position" not in d2
    assert TransformerConfig(**d2) == c2


# ---------------------------------------------------------------- Gemma 2 options and NoPE layers


def test_shipped_recipes_are_unchanged_by_the_new_options():
    """The recipes (and their hashes) recorded in data/models were written before these options."""
    import json

    from llmbook.paths import data_dir
    from llmbook.training.pretrained import RECIPES, recipe_hash

    for kind in RECIPES:
        info = json.loads((data_dir() / "models" / kind / "info.json").read_text())
        assert info["recipe_hash"] == recipe_hash(kind)
        assert TransformerConfig(**info["recipe"]["model"]).to_dict() == info["recipe"]["model"]
    d = tiny("llama", norm_position="sandwich", embed_scale=2.0, final_softcap=30.0).to_dict()
    assert (d["norm_position"], d["embed_scale"], d["final_softcap"]) == ("sandwich", 2.0, 30.0)
    assert "attn_softcap" not in d and "no_rope_layers" not in d


def test_sandwich_block_is_norm_before_and_after():
    c = tiny("llama", norm_position="sandwich")
    block = DecoderBlock(c).double()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in block.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    x = torch.randn(2, 5, 24, dtype=torch.float64, generator=g)

    def rms(t, w):  # written out, not the module
        return w * t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + c.norm_eps)

    with torch.no_grad():
        h = x + rms(block.attn(rms(x, block.attn_norm.weight)), block.attn_post_norm.weight)
        want = h + rms(block.mlp(rms(h, block.mlp_norm.weight)), block.mlp_post_norm.weight)
        assert torch.allclose(block(x), want, atol=1e-12)
    assert sum(p.numel() for p in block.parameters()) == \
        sum(p.numel() for p in DecoderBlock(tiny("llama")).parameters()) + 2 * 24


def test_geglu_matches_formula_and_rejects_bad_input():
    g = torch.Generator().manual_seed(2)
    m = GeGLU(6, 10).double()
    x = torch.randn(3, 4, 6, dtype=torch.float64, generator=g)
    gate = x @ m.gate_proj.weight.T
    want = (torch.nn.functional.gelu(gate, approximate="tanh") * (x @ m.up_proj.weight.T)) @ m.down_proj.weight.T
    assert torch.allclose(m(x), want, atol=1e-12)
    with pytest.raises(ValueError, match="activation"):
        GeGLU(6, 10, activation="tanh2")
    with pytest.raises(ValueError, match="GeGLU"):
        m(torch.zeros(2, 5, dtype=torch.float64))
    assert TransformerConfig(vocab_size=5, d_model=6, n_layers=1, n_heads=2, mlp="geglu").activation == "gelu_tanh"
    c = tiny("llama", mlp="geglu", activation="gelu_tanh")
    assert isinstance(TransformerLM(c).blocks[0].mlp, GeGLU)


def test_embed_scale_and_final_softcap():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 37, (2, 6), generator=g)
    base = TransformerLM(tiny("llama", norm_position="sandwich"), generator=g).double()
    scaled = TransformerLM(tiny("llama", norm_position="sandwich", embed_scale=4.0, final_softcap=2.0)).double()
    with torch.no_grad():
        scaled.load_state_dict(base.state_dict())
        base.embed.weight.mul_(4.0)  # the scale folded into the table: same stream
        z = base(ids)
        assert torch.allclose(scaled(ids), 2.0 * torch.tanh(z / 2.0), atol=1e-12)
        assert scaled(ids).abs().max() < 2.0
    with pytest.raises(ValueError, match="soft-cap"):
        minimal_forward(scaled, ids)


def test_local_and_global_layers_differ_only_where_the_window_cuts():
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 37, (1, 12), generator=g)
    kw = dict(n_layers=2, sliding_window=3)
    alt = TransformerLM(tiny("llama", layer_types=("sliding_attention", "full_attention"), **kw),
                        generator=g).double()
    with torch.no_grad():
        z_alt = alt(ids)
        full = TransformerLM(tiny("llama", n_layers=2)).double()
        full.load_state_dict(alt.state_dict())
        local = TransformerLM(tiny("llama", **kw)).double()
        local.load_state_dict(alt.state_dict())
        z_full, z_local = full(ids), local(ids)
    # the first W positions see their whole prefix in every layer: all three agree there
    assert torch.allclose(z_alt[:, :3], z_full[:, :3], atol=1e-12)
    assert torch.allclose(z_alt[:, :3], z_local[:, :3], atol=1e-12)
    assert (z_alt[:, 3:] - z_full[:, 3:]).abs().max() > 1e-6 and (z_alt[:, 3:] - z_local[:, 3:]).abs().max() > 1e-6


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), T=st.integers(3, 8))
def test_nope_layer_sees_its_prefix_as_a_set(seed, T):
    """Without RoPE attention is permutation-equivariant over the keys, so, the causal mask
    aside, the last position (which sees every key) is unchanged when the tokens before it
    are shuffled. With RoPE it changes."""
    from llmbook.transformer.positional import RotaryEmbedding, apply_rotary

    g = torch.Generator().manual_seed(seed)
    c = tiny("llama", n_layers=2, no_rope_layers=(1,))
    nope = DecoderBlock(c, layer=1).double()
    roped = DecoderBlock(c, layer=0).double()
    roped.load_state_dict(nope.state_dict())
    assert (nope.use_rope, roped.use_rope) == (False, True)
    r = RotaryEmbedding(c.d_head, c.rope_theta, c.max_seq_len)

    def rope(t, pos):
        return apply_rotary(t, r.cos[pos].to(t.dtype), r.sin[pos].to(t.dtype))

    x = torch.randn(1, T, 24, dtype=torch.float64, generator=g)
    perm = torch.cat([torch.roll(torch.arange(T - 1), 1), torch.tensor([T - 1])])  # a shuffle that moves every key
    pos = torch.arange(T)
    with torch.no_grad():
        assert torch.allclose(nope(x[:, perm], pos, rope)[:, -1], nope(x, pos, rope)[:, -1], atol=1e-12)
        assert not torch.allclose(roped(x[:, perm], pos, rope)[:, -1], roped(x, pos, rope)[:, -1], atol=1e-6)
        m = TransformerLM(c).double()
        ids = torch.randint(0, 37, (1, T), generator=g)
        no_rope_anywhere = TransformerLM(tiny("llama", n_layers=2, no_rope_layers=(0, 1))).double()
        no_rope_anywhere.load_state_dict(m.state_dict())
        assert not torch.allclose(m(ids), no_rope_anywhere(ids), atol=1e-9)


def test_local_layers_use_their_own_rope_base():
    """Gemma 3: with rope_local_theta the sliding layers rotate with that base, the global ones
    with rope_theta; with the local base equal to the global one nothing changes."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 37, (1, 9), generator=g)
    kw = dict(n_layers=2, sliding_window=20, layer_types=("sliding_attention", "full_attention"))
    base = TransformerLM(tiny("llama", **kw), generator=g).double()
    with torch.no_grad():  # weights large enough for the scores, and so the rotation, to matter
        for p in base.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    same = TransformerLM(tiny("llama", rope_local_theta=10000.0, **kw)).double()
    other = TransformerLM(tiny("llama", rope_local_theta=100.0, **kw)).double()
    same.load_state_dict(base.state_dict())
    other.load_state_dict(base.state_dict())
    assert torch.allclose(other.rope_local.inv_freq, 100.0 ** (-torch.arange(0, 6, 2, dtype=torch.float64) / 6)
                          .to(other.rope_local.inv_freq.dtype))
    with torch.no_grad():
        assert torch.allclose(same(ids), base(ids), atol=1e-12)
        assert (other(ids) - base(ids)).abs().max() > 1e-4
        assert torch.allclose(other(ids)[:, 0], base(ids)[:, 0], atol=1e-12)  # position 0 is not rotated
