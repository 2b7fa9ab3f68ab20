"""Tests for llmbook.transformer.hf_loading: our model equals Hugging Face GPT-2, Llama and Qwen2."""

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
)

from llmbook.transformer.hf_loading import config_from_hf, from_hf, randomize_parameters_


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
    with pytest.raises(ValueError, match=r"rope_type='linear'"):
        config_from_hf(LlamaForCausalLM(rope))
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
