"""Tests for llmbook.transformer.hf_loading: our model equals Hugging Face GPT-2, Llama (3.x), Qwen2,
Qwen3, Mistral, OLMo 2, Gemma 2, Gemma 3 and SmolLM3."""

import dataclasses

import pytest
import torch
from torch import nn
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    GPT2Model,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from llmbook.transformer.hf_loading import config_from_hf, from_hf, randomize_parameters_
from llmbook.transformer.model import QKNormAttention, TransformerLM
from llmbook.transformer.sizing import count_parameters


def hf_model(family: str, tied: bool | None = None, impl: str = "eager") -> nn.Module:
    """A small randomly initialised Hugging Face model (no download), with noise on every
    parameter so that norm gains and biases are not at their trivial 1 and 0."""
    torch.manual_seed(0)
    if family == "gpt2":
        cfg = GPT2Config(vocab_size=211, n_positions=32, n_embd=72, n_layer=2, n_head=3,
                         bos_token_id=0, eos_token_id=0, attn_implementation=impl,
                         tie_word_embeddings=True if tied is None else tied)
        model = GPT2LMHeadModel(cfg)
    elif family == "llama":
        cfg = LlamaConfig(vocab_size=173, hidden_size=64, intermediate_size=160,
                          num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=48, rms_norm_eps=1e-5,
                          tie_word_embeddings=bool(tied), attn_implementation=impl)
        model = LlamaForCausalLM(cfg)
    else:
        cfg = Qwen2Config(vocab_size=251, hidden_size=96, intermediate_size=200,
                          num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                          max_position_embeddings=64, attn_implementation=impl,
                          tie_word_embeddings=True if tied is None else tied)
        model = Qwen2ForCausalLM(cfg)
    randomize_parameters_(model, 0.1, torch.Generator().manual_seed(1))
    return model.eval()


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2"])
def test_logits_equal_hugging_face(family, impl):
    hf = hf_model(family, impl=impl)
    ours = from_hf(hf).eval()
    V = hf.config.vocab_size
    ids = torch.randint(0, V, (3, 13), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits
        for fused in (True, False):
            ours.set_fused_attention(fused)
            err = (ours(ids) - ref).abs().max().item()
            assert err < 1e-4, (family, impl, fused, err)
    assert ref.std() > 0.5  # the comparison is not between near-constant logits


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2"])
def test_logits_equal_in_float64(family):
    hf = hf_model(family).double()
    ours = from_hf(hf)
    assert ours.embed.weight.dtype == torch.float64
    ids = torch.randint(0, hf.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        err = (ours(ids) - hf(ids).logits).abs().max().item()
    # Hugging Face's RMSNorm computes in float32 even for float64 inputs, so Llama/Qwen2
    # agree to float32 round-off only; GPT-2 agrees to float64 round-off.
    assert err < (1e-12 if family == "gpt2" else 1e-4)


@pytest.mark.parametrize(("family", "tied"), [("gpt2", True), ("gpt2", False), ("llama", False),
                                              ("llama", True), ("qwen2", True), ("qwen2", False)])
def test_config_and_parameter_count(family, tied):
    hf = hf_model(family, tied=tied)
    ours = from_hf(hf)
    c = ours.config
    assert c.tie_embeddings == tied and (ours.lm_head is None) == tied
    assert ours.num_parameters() == sum(p.numel() for p in hf.parameters())
    expected = {"gpt2": ("layernorm", "learned", "gelu", True, True),
                "llama": ("rmsnorm", "rope", "swiglu", False, False),
                "qwen2": ("rmsnorm", "rope", "swiglu", True, False)}[family]
    assert (c.norm, c.positions, c.mlp, c.qkv_bias, c.out_bias) == expected
    if family == "llama":
        assert (c.n_heads, c.n_kv_heads, c.d_ff, c.norm_eps) == (4, 2, 160, 1e-5)


def test_weights_are_copied_not_shared():
    hf = hf_model("llama")
    ours = from_hf(hf)
    w = ours.blocks[0].attn.q_proj.weight
    assert torch.equal(w, hf.model.layers[0].self_attn.q_proj.weight)
    with torch.no_grad():
        w.add_(1.0)
    assert not torch.equal(w, hf.model.layers[0].self_attn.q_proj.weight)


def test_gpt2_conv1d_split():
    """c_attn's (d, 3d) weight is three transposed (d, d) blocks, in q, k, v order."""
    hf = hf_model("gpt2")
    ours = from_hf(hf)
    W = hf.transformer.h[1].attn.c_attn.weight  # (72, 216)
    assert torch.equal(ours.blocks[1].attn.k_proj.weight, W[:, 72:144].T)
    assert torch.equal(ours.blocks[1].mlp.fc.weight, hf.transformer.h[1].mlp.c_fc.weight.T)
    assert ours.config.activation == "gelu_new"


def test_unsupported_models_are_rejected():
    with pytest.raises(ValueError, match=r"unsupported model GPT2Model \(model_type='gpt2'\)"):
        from_hf(GPT2Model(GPT2Config(vocab_size=20, n_positions=8, n_embd=8, n_layer=1, n_head=2,
                                     bos_token_id=0, eos_token_id=0)))
    with pytest.raises(ValueError, match=r"unsupported model Linear \(model_type=None\)"):
        from_hf(nn.Linear(2, 2))
    rope = LlamaConfig(vocab_size=20, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                       num_attention_heads=2,
                       rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4})
    assert config_from_hf(LlamaForCausalLM(rope)).rope_scaling["factor"] == 2.0  # linear: supported
    gpt = GPT2Config(vocab_size=20, n_positions=8, n_embd=8, n_layer=1, n_head=2, bos_token_id=0,
                     eos_token_id=0, scale_attn_by_inverse_layer_idx=True)
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx"):
        config_from_hf(GPT2LMHeadModel(gpt))


def test_randomize_parameters_keeps_ties_and_moves_norms():
    hf = hf_model("qwen2")
    assert hf.lm_head.weight is hf.model.embed_tokens.weight
    gain = hf.model.norm.weight
    assert 0.05 < (gain - 1).abs().mean() < 0.15  # was exactly 1 before the noise
    assert hf.model.layers[0].self_attn.q_proj.bias.abs().max() > 0
    with pytest.raises(ValueError, match="std must be positive"):
        randomize_parameters_(hf, 0.0)


def qwen3_model(impl: str = "eager", **kw) -> nn.Module:
    """A small random Qwen3 (QK-norm) with a non-default RoPE base and RMSNorm eps, and
    head_dim = 16 != hidden_size / heads = 12; noise on every parameter, norms included."""
    torch.manual_seed(0)
    cfg = dict(vocab_size=101, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=40,
               rms_norm_eps=0.01, rope_parameters={"rope_type": "default", "rope_theta": 300.0},
               attn_implementation=impl)
    cfg.update(kw)
    model = Qwen3ForCausalLM(Qwen3Config(**cfg))
    randomize_parameters_(model, 0.1, torch.Generator().manual_seed(1))
    return model.eval()


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_qwen3_logits_equal_hugging_face(impl):
    hf = qwen3_model(impl)
    ours = from_hf(hf).eval()
    c = ours.config
    assert c.qk_norm and (c.d_head, c.norm_eps, c.rope_theta) == (16, 0.01, 300.0)
    assert isinstance(ours.blocks[1].attn, QKNormAttention)
    assert torch.equal(ours.blocks[1].attn.k_norm.weight, hf.model.layers[1].self_attn.k_norm.weight)
    ids = torch.randint(0, 101, (3, 13), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits
        for fused in (True, False):
            ours.set_fused_attention(fused)
            assert (ours(ids) - ref).abs().max().item() < 1e-5
        # the QK-norm matters: without it (gains and all) the logits are far off
        ours.blocks[0].attn.q_norm.eps = 1.0
        assert (ours(ids) - ref).abs().max().item() > 1e-2
    assert ref.std() > 0.5
    assert ours.num_parameters() == sum(p.numel() for p in hf.parameters()) == count_parameters(c)


def test_qwen3_in_float64_agrees_to_float32_roundoff():
    hf = qwen3_model().double()
    ours = from_hf(hf)
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(3))  # all 40 positions
    with torch.no_grad():
        err = (ours(ids) - hf(ids).logits).abs().max().item()
    assert err < 1e-5  # Hugging Face's RMSNorm computes in float32


def test_qwen3_options_not_implemented_are_rejected():
    with pytest.raises(ValueError, match="use_sliding_window"):
        config_from_hf(qwen3_model(use_sliding_window=True, sliding_window=8, max_window_layers=0))
    with pytest.raises(ValueError, match="attention_dropout"):
        config_from_hf(qwen3_model(attention_dropout=0.1))
    with pytest.raises(ValueError, match="layer_types"):
        config_from_hf(qwen3_model(layer_types=["full_attention", "sliding_attention"], sliding_window=8))


ARCHITECTURES = {
    # name: (model class, config class, options)
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(sliding_window=5, head_dim=16)),
    "olmo2": ("Olmo2ForCausalLM", "Olmo2Config", dict(bos_token_id=0, eos_token_id=0, pad_token_id=0)),
    "llama3": ("LlamaForCausalLM", "LlamaConfig", dict(max_position_embeddings=64, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
}


def architecture_model(name: str, impl: str = "eager") -> nn.Module:
    import transformers
    model_cls, config_cls, options = ARCHITECTURES[name]
    torch.manual_seed(0)
    cfg = dict(vocab_size=101, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=40,
               rms_norm_eps=0.01, attn_implementation=impl)
    cfg.update(options)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**cfg))
    randomize_parameters_(model, 0.1, torch.Generator().manual_seed(1))
    return model.eval()


def test_architecture_switches_are_read():
    assert from_hf(architecture_model("mistral")).config.sliding_window == 5
    c = from_hf(architecture_model("olmo2")).config
    assert (c.norm_position, c.qk_norm, c.qk_norm_scope) == ("post", True, "all")
    assert from_hf(architecture_model("llama3")).config.rope_scaling["rope_type"] == "llama3"


@pytest.mark.parametrize("name", ["mistral", "gemma2", "gemma3"])
def test_sliding_window_with_a_cache_equals_the_full_pass(name):
    """Mistral slides in every layer; Gemma 2 and 3 alternate local and global layers (and Gemma 3
    gives them two RoPE bases): the cached steps must equal the full pass in each."""
    from llmbook.inference.kvcache import KVCache

    ours = from_hf(architecture_model(name) if name == "mistral" else gemma_like_model(name)).eval()
    c = ours.config
    ids = torch.randint(0, 101, (2, 11), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = ours(ids)
        cache = KVCache(c.n_layers, 2, c.n_kv_heads, 16, c.d_head)
        steps = [ours(ids[:, :6], cache=cache)] + [ours(ids[:, t:t + 1], cache=cache) for t in range(6, 11)]
    assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-5


def test_unsupported_rope_scaling_and_architectures_are_rejected():
    from transformers import Phi3Config, Phi3ForCausalLM

    yarn = LlamaConfig(vocab_size=20, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                       num_attention_heads=2, rope_parameters={"rope_type": "yarn", "factor": 2.0,
                                                               "rope_theta": 1e4})
    with pytest.raises(ValueError, match="rope_type='yarn'"):
        config_from_hf(LlamaForCausalLM(yarn))
    phi3 = Phi3ForCausalLM(Phi3Config(vocab_size=20, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, pad_token_id=0, bos_token_id=0, eos_token_id=0))
    with pytest.raises(ValueError, match="model_type='phi3'"):
        from_hf(phi3)


# ---------------------------------------------------------------- Gemma 2, Gemma 3, SmolLM3 (NoPE)

GEMMA_LIKE = {
    # name: (model class, config class, options)
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", dict(
        head_dim=16, query_pre_attn_scalar=24, sliding_window=4, attn_logit_softcapping=2.0,
        final_logit_softcapping=5.0)),
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(
        head_dim=16, query_pre_attn_scalar=24, sliding_window=4, sliding_window_pattern=2, rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})),
    "smollm3": ("SmolLM3ForCausalLM", "SmolLM3Config", dict(no_rope_layer_interval=2)),
}


def gemma_like_model(name: str, **kw) -> nn.Module:
    import transformers
    model_cls, config_cls, options = GEMMA_LIKE[name]
    torch.manual_seed(0)
    cfg = dict(vocab_size=101, hidden_size=48, intermediate_size=96, num_hidden_layers=3,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=40,
               rms_norm_eps=0.01, attn_implementation="eager", pad_token_id=0, bos_token_id=0, eos_token_id=0)
    cfg.update(options)
    cfg.update(kw)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**cfg))
    randomize_parameters_(model, 0.1, torch.Generator().manual_seed(1))
    return model.eval()


# the switches each architecture sets, and the value that turns each off
SWITCHES = {
    "mistral": dict(sliding_window=None),
    "olmo2": dict(norm_position="pre"),
    "llama3": dict(rope_scaling=None),
    "gemma2": dict(attn_softcap=None, final_softcap=None, embed_scale=1.0, attn_scale=None,
                   layer_types=("full_attention",) * 3, norm_position="post"),
    "gemma3": dict(rope_local_theta=None, qk_norm=False, embed_scale=1.0),
    "smollm3": dict(no_rope_layers=None),
}


# every architecture of ARCHITECTURES with both attention implementations; the Gemma-like models eager
LOGIT_CASES = [(name, impl) for name in ARCHITECTURES for impl in ("eager", "sdpa")] + \
    [(name, "eager") for name in GEMMA_LIKE]


@pytest.mark.parametrize(("name", "impl"), LOGIT_CASES)
def test_architecture_logits_equal_hugging_face(name, impl):
    """Logits equal transformers' with fused and unfused attention, and each switch the architecture
    sets matters: the same weights with it turned off give logits far from transformers'."""
    hf = architecture_model(name, impl) if name in ARCHITECTURES else gemma_like_model(name)
    assert hf.config._attn_implementation == impl
    ours = from_hf(hf).eval()
    ids = torch.randint(0, 101, (3, 13), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits
        for fused in (True, False):
            ours.set_fused_attention(fused)
            assert (ours(ids) - ref).abs().max().item() < 1e-5, (name, impl, fused)
        assert ref.std() > 0.5
        for switch, off in SWITCHES[name].items():
            plain = TransformerLM(dataclasses.replace(ours.config, **{switch: off})).eval()
            # turning a norm off drops its gains; every parameter the plain model has comes from ours
            missing, _ = plain.load_state_dict(ours.state_dict(), strict=False)
            assert not missing, (name, switch, missing)
            assert (plain(ids) - ref).abs().max().item() > 1e-2, (name, switch)
    assert ours.num_parameters() == sum(p.numel() for p in hf.parameters()) == count_parameters(ours.config)


@pytest.mark.parametrize("name", list(GEMMA_LIKE))
def test_gemma_and_smollm3_in_float64(name):
    hf = gemma_like_model(name).double()
    ours = from_hf(hf)
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        err = (ours(ids) - hf(ids).logits).abs().max().item()
    assert err < 1e-5  # Hugging Face's RMSNorm computes in float32


def test_gemma_switches_are_read():
    c = from_hf(gemma_like_model("gemma2")).config
    assert (c.norm_position, c.mlp, c.activation, c.attn_softcap, c.final_softcap) == \
        ("sandwich", "geglu", "gelu_tanh", 2.0, 5.0)
    assert c.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    assert (c.sliding_window, c.attn_scale, c.embed_scale) == (4, 24 ** -0.5, float(torch.tensor(48 ** 0.5)))
    c3 = from_hf(gemma_like_model("gemma3")).config
    assert (c3.qk_norm, c3.attn_softcap, c3.rope_theta, c3.rope_local_theta) == (True, None, 1e5, 100.0)
    assert c3.rope_scaling["rope_type"] == "linear"
    assert from_hf(gemma_like_model("smollm3")).config.no_rope_layers == (1,)
    ours = from_hf(gemma_like_model("gemma2"))  # Gemma's norm multiplies by 1 + w: the gain stored is 1 + w
    hf = gemma_like_model("gemma2")
    assert torch.equal(ours.blocks[1].attn_post_norm.weight, 1 + hf.model.layers[1].post_attention_layernorm.weight)


def test_gemma_options_not_implemented_are_rejected():
    with pytest.raises(ValueError, match="hidden_activation"):
        config_from_hf(gemma_like_model("gemma2", hidden_activation="relu"))
    with pytest.raises(ValueError, match="attention_dropout"):
        config_from_hf(gemma_like_model("gemma2", attention_dropout=0.1))
    with pytest.raises(ValueError, match="sliding layers"):
        config_from_hf(gemma_like_model("gemma3", rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1e5},
            "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100.0}}))
