"""Tests for llmbook.transformer.sizing: closed-form parameter counts and FLOPs equal the real ones."""

import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode
from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

from llmbook.transformer.hf_loading import from_hf
from llmbook.transformer.model import TransformerConfig, TransformerLM
from llmbook.transformer.sizing import (
    SYMBOLS,
    count_parameters,
    count_parameters_symbolic,
    flops_per_token,
    flops_per_token_symbolic,
    flops_shares,
    flops_terms_symbolic,
    linear_parameters,
    matmul_flops,
    parameter_shares,
    parameter_terms_symbolic,
    symbol_values,
)


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied one once


configs = st.builds(
    lambda V, H, g, dh, L, ff, norm, pos, mlp, bias, ob, mb, tie, T: TransformerConfig(
        vocab_size=V, d_model=H * dh, n_layers=L, n_heads=H,
        n_kv_heads=H // g if H % g == 0 else H, d_ff=ff, max_seq_len=T, norm=norm,
        positions=pos, mlp=mlp, qkv_bias=bias, out_bias=ob, mlp_bias=mb, tie_embeddings=tie,
        activation=None),
    V=st.integers(3, 60), H=st.integers(1, 4), g=st.sampled_from([1, 2]),
    dh=st.sampled_from([2, 4, 6]), L=st.integers(1, 3), ff=st.integers(1, 20),
    norm=st.sampled_from(["layernorm", "rmsnorm"]), pos=st.sampled_from(["learned", "rope"]),
    mlp=st.sampled_from(["gelu", "swiglu"]), bias=st.booleans(), ob=st.booleans(),
    mb=st.booleans(), tie=st.booleans(), T=st.integers(4, 30))


@settings(max_examples=30, deadline=None)
@given(c=configs)
def test_count_parameters_equals_model(c):
    with torch.device("meta"):
        model = TransformerLM(c)
    assert count_parameters(c) == n_params(model)
    assert count_parameters_symbolic().subs(symbol_values(c)) == count_parameters(c)
    shares = parameter_shares(c)
    assert sum(v for k, v in shares.items() if k != "total") == shares["total"]


@settings(max_examples=12, deadline=None)
@given(c=configs, B=st.integers(1, 3), T=st.integers(1, 4))
def test_flops_equal_flop_counter(c, B, T):
    model = TransformerLM(c)
    model.set_fused_attention(False)  # the fused CPU kernel is not seen by FlopCounterMode
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.zeros(B, T, dtype=torch.long))
    assert counter.get_total_flops() == B * T * flops_per_token(c, T)
    assert flops_per_token_symbolic().subs(symbol_values(c, T)) == flops_per_token(c, T)


def test_published_sizes():
    # GPT-2 small: 124,439,808 (tied); Llama 2 7B: 6,738,415,616 (Touvron et al., 2023)
    assert count_parameters(TransformerConfig.gpt2_style()) == 124_439_808
    assert count_parameters(TransformerConfig.llama_style()) == 6_738_415_616
    assert count_parameters(TransformerConfig.qwen2_style()) == 494_032_768


def test_qwen2_0_5b_on_meta_device():
    cfg = Qwen2Config(vocab_size=151936, hidden_size=896, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
                      tie_word_embeddings=True, max_position_embeddings=32768,
                      rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    with torch.device("meta"):
        hf = Qwen2ForCausalLM(cfg)
        ours = from_hf(hf)
    c = ours.config
    assert n_params(hf) == n_params(ours) == count_parameters(c) == 494_032_768
    assert c == TransformerConfig.qwen2_style()
    ours.set_fused_attention(False)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        ours(torch.zeros(1, 2048, dtype=torch.long, device="meta"))
    assert counter.get_total_flops() == 2048 * flops_per_token(c, 2048)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize(("d", "L", "H", "n_inner"), [(32, 1, 2, None), (48, 3, 4, 100)])
def test_counts_equal_hugging_face_gpt2(d, L, H, n_inner, tied):
    cfg = GPT2Config(vocab_size=97, n_positions=33, n_embd=d, n_layer=L, n_head=H, n_inner=n_inner,
                     tie_word_embeddings=tied, bos_token_id=0, eos_token_id=0)
    with torch.device("meta"):
        hf = GPT2LMHeadModel(cfg)
    c = TransformerConfig.gpt2_style(vocab_size=97, d_model=d, n_layers=L, n_heads=H,
                                     max_seq_len=33, d_ff=n_inner or 4 * d, tie_embeddings=tied)
    assert n_params(hf) == count_parameters(c)


def test_two_n_approximation():
    """Without the attention-score term, FLOPs per token = 2 x (matmul parameters)."""
    c = TransformerConfig.llama_style(vocab_size=1000, d_model=64, n_layers=2, n_heads=4,
                                      n_kv_heads=2)
    shares = parameter_shares(c)
    matmul_params = shares["attention"] + shares["mlp"] + c.vocab_size * c.d_model
    f = flops_shares(c, 100)
    assert f["total"] - f["attention_scores"] == 2 * matmul_params
    assert f["attention_scores"] == 4 * 100 * c.n_layers * c.n_heads * c.d_head


def test_symbolic_forms_are_polynomials_in_the_symbols():
    expr = flops_per_token_symbolic()
    T = [s for s in expr.free_symbols if s.name == "T"][0]
    assert sp.degree(expr, T) == 1  # linear in T per token: quadratic per sequence


def test_bad_arguments():
    c = TransformerConfig.gpt2_style(vocab_size=10, d_model=8, n_layers=1, n_heads=2)
    with pytest.raises(ValueError, match="seq_len must be a positive int, got seq_len=0"):
        flops_per_token(c, 0)
    with pytest.raises(TypeError, match="expected a TransformerConfig, got dict"):
        count_parameters({"vocab_size": 10})


def _numel(params) -> int:
    return sum(p.numel() for p in params)


@settings(max_examples=20, deadline=None)
@given(c=configs)
def test_parameter_terms_equal_the_tensors_of_each_component(c):
    """Each symbolic term against the sum of numel() over the matching submodules (enumeration)."""
    with torch.device("meta"):
        model = TransformerLM(c)
    t = {k: int(v.subs(symbol_values(c))) for k, v in parameter_terms_symbolic().items()}
    assert t["embedding"] == model.embed.weight.numel()
    assert t["positions"] == (0 if model.pos_embed is None else model.pos_embed.weight.numel())
    assert t["lm_head"] == (0 if model.lm_head is None else model.lm_head.weight.numel())
    assert t["norm"] == _numel(model.final_norm.parameters())
    for block in model.blocks:
        assert t["attention"] == _numel(block.attn.parameters())
        assert t["mlp"] == _numel(block.mlp.parameters())
        assert 2 * t["norm"] == _numel(block.attn_norm.parameters()) + _numel(block.mlp_norm.parameters())


@settings(max_examples=10, deadline=None)
@given(c=configs, B=st.integers(1, 3), T=st.integers(1, 5))
def test_flops_terms_equal_the_counter_module_by_module(c, B, T):
    model = TransformerLM(c)
    model.set_fused_attention(False)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.zeros(B, T, dtype=torch.long))
    counts = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
    t = {k: int(v.subs(symbol_values(c, T))) for k, v in flops_terms_symbolic().items()}
    blocks = 0
    for i in range(c.n_layers):
        attn = counter.get_flop_counts()[f"TransformerLM.blocks.{i}.attn"]
        mm = sum(v for op, v in attn.items() if "bmm" not in str(op))
        assert mm == B * T * t["attention_projections"]
        assert attn.get(torch.ops.aten.bmm, 0) == B * T * t["attention_scores"]
        assert counts[f"TransformerLM.blocks.{i}.mlp"] == B * T * t["mlp"]
        blocks += counts[f"TransformerLM.blocks.{i}"]
    assert counts["Global"] - blocks == B * T * t["lm_head"]


def test_building_blocks_against_torch():
    n_in, n_out = sp.symbols("n_in n_out")
    for bias in (0, 1):
        layer = torch.nn.Linear(5, 7, bias=bool(bias))
        assert linear_parameters(n_in, n_out, bias).subs({n_in: 5, n_out: 7}) == _numel(layer.parameters())
    counter = FlopCounterMode(display=False)
    with counter:
        torch.randn(3, 4) @ torch.randn(4, 6)
    assert counter.get_total_flops() == matmul_flops(3, 4, 6) == 144


def test_symbolic_collapses_to_12_L_d_squared():
    """GPT-2's switches give 12 L d^2 + 13 L d + V d + T_max d + 2 d (the classic count)."""
    V, d, L, H, H_kv, d_h, d_ff, m, T, T_max, b_qkv, b_o, b_mlp, b_n, u, p = SYMBOLS
    gpt2 = count_parameters_symbolic().subs({H_kv: H, d_h: d / H, d_ff: 4 * d, m: 2, b_qkv: 1, b_o: 1,
                                             b_mlp: 1, b_n: 1, u: 0, p: 1})
    poly = sp.Poly(sp.expand(gpt2), L, d, V, T_max)
    assert poly.coeff_monomial(L * d**2) == 12 and poly.coeff_monomial(L * d) == 13
    assert poly.coeff_monomial(d) == 2 and poly.coeff_monomial(V * d) == 1
