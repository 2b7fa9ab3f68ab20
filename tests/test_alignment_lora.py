"""Tests for llmbook.alignment.lora: LoRA layers, merging, counts, and equality with peft."""

import math

import pytest
import sympy as sp
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from peft import LoraConfig, get_peft_model
from seeded import gen
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from llmbook.alignment.lora import (
    LoRALinear,
    adamw_training_memory,
    apply_lora,
    count_trainable_parameters,
    lora_memory_ratio_symbolic,
    lora_parameter_count,
    lora_state_dict,
    merge_lora,
    quantize_frozen_nf4,
    unmerge_lora,
)
from llmbook.inference.quant import nf4_levels
from llmbook.transformer.hf_loading import from_hf, randomize_parameters_
from llmbook.transformer.model import TransformerConfig, TransformerLM

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    # peft 0.21 calls a transformers method that transformers 5 has deprecated
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]


def tiny_llama() -> TransformerLM:
    cfg = TransformerConfig.llama_style(vocab_size=40, d_model=16, n_layers=2, n_heads=2,
                                        n_kv_heads=1, d_ff=24, max_seq_len=16)
    return TransformerLM(cfg, generator=gen(0)).double().eval()


def randomize_B_(model: nn.Module, seed: int = 5) -> None:
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=gen(seed), dtype=torch.float64))
                seed += 1


# ---------------------------------------------------------------- the layer


def test_zero_B_gives_the_base_model_exactly():
    model = tiny_llama()
    ids = torch.randint(0, 40, (2, 7), generator=gen(1))
    with torch.no_grad():
        ref = model(ids)
        apply_lora(model, ["q_proj", "v_proj", "down_proj"], r=3, alpha=6, generator=gen(2))
        out = model(ids)
    assert torch.equal(out, ref)
    assert all(m.lora_A.abs().max() > 0 for m in model.modules() if isinstance(m, LoRALinear))


def test_worked_example():
    base = nn.Linear(3, 2, bias=False)
    with torch.no_grad():
        base.weight.copy_(torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
    layer = LoRALinear(base, r=1, alpha=2.0)
    with torch.no_grad():
        layer.lora_A.copy_(torch.tensor([[1.0, 0.0, -1.0]]))  # (r, d_in)
        layer.lora_B.copy_(torch.tensor([[2.0], [1.0]]))  # (d_out, r)
    # Delta W = (alpha / r) B A = 2 [[2, 0, -2], [1, 0, -1]]
    assert torch.equal(layer.delta_weight(), torch.tensor([[4.0, 0.0, -4.0], [2.0, 0.0, -2.0]]))
    x = torch.tensor([[1.0, 2.0, 3.0]])
    # W x = (14, 32), Delta W x = (4 - 12, 2 - 6) = (-8, -4)
    assert torch.equal(layer(x), torch.tensor([[6.0, 28.0]]))
    layer.merge()
    assert torch.equal(layer.base.weight, torch.tensor([[5.0, 2.0, -1.0], [6.0, 5.0, 4.0]]))
    assert torch.equal(layer(x), torch.tensor([[6.0, 28.0]]))


def test_init_conventions():
    base = nn.Linear(10, 7, dtype=torch.float64)
    a = LoRALinear(base, r=4, alpha=8, generator=gen(3))
    b = LoRALinear(nn.Linear(10, 7, dtype=torch.float64), r=4, alpha=8, generator=gen(3))
    assert torch.equal(a.lora_A, b.lora_A)  # reproducible from the generator
    assert a.lora_A.dtype == torch.float64 and a.lora_A.shape == (4, 10)
    assert a.lora_B.shape == (7, 4) and not a.lora_B.any()
    assert a.lora_A.abs().max() <= 1 / math.sqrt(10) and a.scaling == 2.0
    assert not base.weight.requires_grad and a.lora_A.requires_grad and a.lora_B.requires_grad


def test_dropout_acts_on_the_adapter_input_only():
    layer = LoRALinear(nn.Linear(6, 5, dtype=torch.float64), r=2, alpha=4, dropout=0.5,
                       generator=gen(0))
    with torch.no_grad():
        layer.lora_B.copy_(torch.randn(5, 2, generator=gen(1), dtype=torch.float64))
    x = torch.randn(3, 6, generator=gen(2), dtype=torch.float64)
    torch.manual_seed(9)
    out = layer.train()(x)
    torch.manual_seed(9)
    x_drop = nn.functional.dropout(x, 0.5, training=True)
    expected = layer.base(x) + 2.0 * x_drop @ layer.lora_A.T @ layer.lora_B.T
    assert (out - expected).abs().max() < 1e-14
    no_drop = layer.base(x) + 2.0 * x @ layer.lora_A.T @ layer.lora_B.T
    assert (layer.eval()(x) - no_drop).abs().max() < 1e-14


def test_merge_unmerge_round_trip():
    model = tiny_llama()
    apply_lora(model, ["q_proj", "k_proj", "o_proj", "up_proj"], r=2, alpha=3.0, generator=gen(1))
    randomize_B_(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, 40, (2, 9), generator=gen(4))
    with torch.no_grad():
        out = model(ids)
        merge_lora(model)
        merged = model(ids)
        q = model.blocks[0].attn.q_proj
        assert q.merged and torch.allclose(q.base.weight, before["blocks.0.attn.q_proj.base.weight"]
                                           + q.delta_weight(), rtol=0, atol=1e-15)
        unmerge_lora(model)
        again = model(ids)
    assert (merged - out).abs().max() < 1e-12
    assert (again - out).abs().max() < 1e-12
    for k, v in model.state_dict().items():
        assert (v - before[k]).abs().max() < 1e-15, k
    with pytest.raises(RuntimeError, match="not merged"):
        q.unmerge()
    q.merge()
    with pytest.raises(RuntimeError, match="already merged"):
        q.merge()


def test_only_adapters_train_and_state_dict():
    model = tiny_llama()
    apply_lora(model, "v_proj", r=2, alpha=4, dropout=0.1, generator=gen(1))
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert names == {f"blocks.{i}.attn.v_proj.lora_{m}" for i in range(2) for m in "AB"}
    assert count_trainable_parameters(model) == 2 * lora_parameter_count(16, 8, 2)
    randomize_B_(model)
    sd = lora_state_dict(model)
    assert set(sd) == names
    fresh = apply_lora(tiny_llama(), ["v_proj"], r=2, alpha=4, dropout=0.1)
    fresh.load_state_dict(sd, strict=False)
    ids = torch.randint(0, 40, (1, 6), generator=gen(2))
    with torch.no_grad():  # eval mode: dropout is off
        assert torch.equal(fresh.eval()(ids), model.eval()(ids))


def test_gpt2_names_map_to_the_books():
    cfg = TransformerConfig.gpt2_style(vocab_size=30, d_model=12, n_layers=1, n_heads=2,
                                       max_seq_len=8)
    model = apply_lora(TransformerLM(cfg), ["c_attn", "c_proj", "c_fc"], r=2, alpha=2)
    wrapped = {n for n, m in model.named_modules() if isinstance(m, LoRALinear)}
    assert wrapped == {f"blocks.0.{s}" for s in ("attn.q_proj", "attn.k_proj", "attn.v_proj",
                                                 "attn.o_proj", "mlp.fc", "mlp.proj")}
    assert count_trainable_parameters(model) == (4 * lora_parameter_count(12, 12, 2)
                                                 + 2 * lora_parameter_count(12, 48, 2))


@given(d_in=st.integers(1, 12), d_out=st.integers(1, 12), r=st.integers(1, 6),
       seed=st.integers(0, 2**31 - 1))
def test_property_rank_and_count(d_in, d_out, r, seed):
    assume(r <= min(d_in, d_out))  # a larger rank is rejected (test below)
    layer = LoRALinear(nn.Linear(d_in, d_out, dtype=torch.float64), r=r, alpha=1.5,
                       generator=gen(seed))
    with torch.no_grad():
        layer.lora_B.copy_(torch.randn(d_out, r, generator=gen(seed + 1), dtype=torch.float64))
    assert torch.linalg.matrix_rank(layer.delta_weight()) <= min(r, d_in, d_out)
    n = count_trainable_parameters(layer)
    assert n == lora_parameter_count(d_in, d_out, r) == layer.lora_A.numel() + layer.lora_B.numel()


# ---------------------------------------------------------------- counts and memory


def test_quantize_frozen_nf4_puts_every_linear_weight_on_the_nf4_grid():
    cfg = TransformerConfig.gpt2_style(vocab_size=29, d_model=32, n_layers=2, n_heads=4,
                                       max_seq_len=8)
    model = TransformerLM(cfg, generator=gen(0))
    embed, bias = model.embed.weight.clone(), model.blocks[0].attn.q_proj.bias.clone()
    assert quantize_frozen_nf4(model, group_size=16) is model
    levels = nf4_levels()
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            w = m.weight.double().reshape(m.out_features, -1, 16)  # (d_out, groups, 16)
            scaled = w / w.abs().amax(-1, keepdim=True)  # each group's absmax is a level, 1
            dist = (scaled[..., None] - levels).abs().amin(-1)
            assert dist.max() < 1e-6, name
            assert (w.abs().amax(-1) > 0).all()
    assert torch.equal(model.embed.weight, embed)  # embeddings and biases untouched
    assert torch.equal(model.blocks[0].attn.q_proj.bias, bias)
    once = [p.clone() for p in model.parameters()]
    quantize_frozen_nf4(model, group_size=16)  # idempotent up to float round-off
    assert all(torch.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(once, model.parameters(), strict=True))
    apply_lora(model, ["q_proj"], r=2, alpha=4, generator=gen(1))  # a QLoRA model
    assert count_trainable_parameters(model) == 2 * lora_parameter_count(32, 32, 2)
    with pytest.raises(ValueError, match="does not divide the input width 32"):
        quantize_frozen_nf4(TransformerLM(cfg), group_size=24)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        quantize_frozen_nf4(torch.zeros(3, 4))


def test_memory_and_counts():
    assert lora_parameter_count(4096, 4096, 8) == 65_536
    mem = adamw_training_memory(n_trainable=10, n_frozen=100, bytes_per_param=2)
    assert mem == {"weights": 220.0, "gradients": 20.0, "optimizer": 40.0, "total": 280.0}
    assert adamw_training_memory(0, 8, 2, frozen_bytes_per_param=0.5)["total"] == 4.0
    ratio = lora_memory_ratio_symbolic()
    d_in, d_out, r = sorted(ratio.free_symbols, key=str)
    n_frozen, n_lora = 64 * 32, lora_parameter_count(64, 32, 4)
    expected = (adamw_training_memory(n_lora, n_frozen)["total"]
                / adamw_training_memory(n_frozen, 0)["total"])
    assert float(ratio.subs({d_in: 64, d_out: 32, r: 4})) == pytest.approx(expected, rel=1e-15)
    d = sp.Symbol("d", positive=True)
    assert sp.limit(ratio.subs({d_in: d, d_out: d}), d, sp.oo) == sp.Rational(1, 4)


# ---------------------------------------------------------------- bad input


def test_bad_input():
    lin = nn.Linear(4, 3)
    with pytest.raises(ValueError, match="r must be positive"):
        LoRALinear(lin, r=0, alpha=1)
    with pytest.raises(TypeError, match="r must be an int"):
        LoRALinear(lin, r=2.0, alpha=1)
    with pytest.raises(ValueError, match="alpha must be a positive"):
        LoRALinear(lin, r=2, alpha=0)
    with pytest.raises(TypeError, match="alpha must be a number"):
        LoRALinear(lin, r=2, alpha="8")
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        LoRALinear(lin, r=2, alpha=1, dropout=1.0)
    with pytest.raises(TypeError, match="base must be a torch.nn.Linear"):
        LoRALinear(nn.Conv1d(4, 3, 1), r=2, alpha=1)
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 4\), got \(2, 5\)"):
        LoRALinear(lin, r=2, alpha=1)(torch.zeros(2, 5))
    model = tiny_llama()
    with pytest.raises(ValueError, match=r"'qkv' matches no linear layer.*'down_proj'.*'q_proj'"):
        apply_lora(model, ["q_proj", "qkv"], r=2, alpha=1)
    with pytest.raises(TypeError, match="target_modules must be a non-empty list"):
        apply_lora(model, [], r=2, alpha=1)
    with pytest.raises(ValueError, match="no LoRALinear layers"):
        merge_lora(model)
    apply_lora(model, ["q_proj"], r=2, alpha=1)
    with pytest.raises(ValueError, match="already has LoRALinear layers"):
        apply_lora(model, ["v_proj"], r=2, alpha=1)
    with pytest.raises(ValueError, match="n_frozen must be a non-negative int"):
        adamw_training_memory(3, -1)
    with pytest.raises(ValueError, match="bytes_per_param must be a positive"):
        adamw_training_memory(3, 1, bytes_per_param=0)


# ---------------------------------------------------------------- the peer: peft


def _rms_norm_in_input_dtype(self, h):
    """Hugging Face's LlamaRMSNorm, without its cast to float32 (so float64 stays float64)."""
    return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


@pytest.fixture
def peer(monkeypatch):
    """A tiny random HF Llama (non-square projections, one KV head), wrapped by peft, and the
    book's model loaded from it with the same adapters. Float64 everywhere: Hugging Face's
    RMSNorm rounds to float32 (patched here; unpatched the logits differ by ~2e-7) and the
    sdpa path keeps float64 (the eager path's softmax is float32)."""
    monkeypatch.setattr(LlamaRMSNorm, "forward", _rms_norm_in_input_dtype)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                      num_attention_heads=3, num_key_value_heads=1, max_position_embeddings=32,
                      attn_implementation="sdpa")
    hf = LlamaForCausalLM(cfg)
    randomize_parameters_(hf, 0.1, gen(1))
    hf = hf.double().eval()
    ours = from_hf(hf).eval()
    lcfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    pm = get_peft_model(hf, lcfg)
    ids = torch.randint(0, 50, (2, 11), generator=gen(2))
    with torch.no_grad():
        base_logits = ours(ids)
        with pm.disable_adapter():
            hf_base_logits = pm(input_ids=ids).logits
        assert torch.equal(pm(input_ids=ids).logits, hf_base_logits)  # peft's B = 0 too
    apply_lora(ours, ["q_proj", "v_proj"], r=4, alpha=8)
    peft_lora = {n: p for n, p in pm.named_parameters() if "lora_" in n}
    with torch.no_grad():
        for name, p in peft_lora.items():
            if "lora_B" in name:  # a non-zero B, or the comparison would be trivial
                p.copy_(0.3 * torch.randn(p.shape, generator=gen(len(name)), dtype=p.dtype))
    ours_lora = dict(ours.named_parameters())
    pairs = []
    for name, p in peft_lora.items():
        # base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight
        # -> blocks.0.attn.q_proj.lora_A
        mine = (name.removeprefix("base_model.model.model.layers.").removesuffix(".default.weight")
                .replace("self_attn.", "attn."))
        mine = "blocks." + mine
        with torch.no_grad():
            ours_lora[mine].copy_(p)
        pairs.append((ours_lora[mine], p))
    return {"hf": pm, "ours": ours, "ids": ids, "pairs": pairs, "base_logits": base_logits}


def test_peft_same_init_convention(peer):
    for mine, theirs in peer["pairs"]:
        assert mine.shape == theirs.shape
    for m in peer["hf"].modules():
        if hasattr(m, "scaling") and isinstance(m.scaling, dict) and "default" in m.scaling:
            assert m.scaling["default"] == 8 / 4
            d_in = m.lora_A["default"].in_features
            assert m.lora_A["default"].weight.abs().max() <= 1 / math.sqrt(d_in)


def test_peft_logits_and_gradients_equal(peer):
    pm, ours, ids = peer["hf"], peer["ours"], peer["ids"]
    target = torch.randint(0, 50, ids.shape, generator=gen(7))
    theirs = pm(input_ids=ids).logits
    mine = ours(ids)
    err = (mine - theirs).abs().max().item()
    assert err < 1e-12, err
    assert (mine - peer["base_logits"]).abs().max() > 1e-2  # the adapters do change the model
    for logits in (theirs, mine):
        nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten()).backward()
    grad_err = max((a.grad - b.grad).abs().max().item() for a, b in peer["pairs"])
    assert grad_err < 1e-12, grad_err
    assert all(a.grad.abs().max() > 0 for a, _ in peer["pairs"])
    assert all(p.grad is None for n, p in ours.named_parameters() if "lora_" not in n)


def test_peft_trainable_parameter_counts(peer):
    pm, ours = peer["hf"], peer["ours"]
    trainable, total = pm.get_nb_trainable_parameters()
    assert count_trainable_parameters(ours) == trainable == 2 * (
        lora_parameter_count(24, 24, 4) + lora_parameter_count(24, 8, 4))
    assert sum(p.numel() for p in ours.parameters()) == total


def test_peft_merge_and_unload(peer):
    pm, ours, ids = peer["hf"], peer["ours"], peer["ids"]
    with torch.no_grad():
        before = ours(ids)
        merged_hf = pm.merge_and_unload()
        theirs = merged_hf(ids).logits
        mine = merge_lora(ours)(ids)
    assert (mine - theirs).abs().max() < 1e-12
    assert (mine - before).abs().max() < 1e-12
    w_theirs = merged_hf.model.layers[1].self_attn.v_proj.weight
    assert (ours.blocks[1].attn.v_proj.base.weight - w_theirs).abs().max() < 1e-14


def test_lora_rank_above_the_layers_width_is_rejected():
    base = nn.Linear(6, 4)
    assert LoRALinear(base, 4, 8.0).r == 4  # r = min(d_in, d_out) is allowed
    with pytest.raises(ValueError, match=r"r=5 exceeds .*min\(d_in=6, d_out=4\)"):
        LoRALinear(nn.Linear(6, 4), 5, 8.0)
