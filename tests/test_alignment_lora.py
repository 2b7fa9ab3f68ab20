"""Tests for llmbook.alignment.lora: LoRA layers, merging, counts, and equality with peft."""

import math

import pytest
import sympy as sp
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from peft import LoraConfig, get_peft_model
from peft.optimizers import create_loraplus_optimizer
from seeded import gen
from torch import Tensor, nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from llmbook.alignment.lora import (
    LoRALinear,
    adamw_training_memory,
    apply_lora,
    count_trainable_parameters,
    lora_memory_ratio_symbolic,
    lora_parameter_count,
    lora_scaling,
    lora_state_dict,
    loraplus_param_groups,
    merge_lora,
    quantize_frozen_nf4,
    unmerge_lora,
)
from llmbook.inference.quant import nf4_levels
from llmbook.training.memory import MasterWeightOptimizer, training_state_bytes
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
    # mixed precision (the default): 2 + 2 + 4 + 4 + 4 = 16 bytes per trained parameter, 2 per frozen
    mem = adamw_training_memory(n_trainable=10, n_frozen=100)
    assert mem == {"weights": 220.0, "gradients": 20.0, "master weights": 40.0, "optimizer": 80.0,
                   "total": 360.0}
    assert adamw_training_memory(1, 0)["total"] == 16.0
    fp32 = adamw_training_memory(10, 100, weight_bytes=4, grad_bytes=4, master_bytes=0)
    assert fp32 == {"weights": 440.0, "gradients": 40.0, "master weights": 0.0, "optimizer": 80.0,
                    "total": 560.0}
    assert adamw_training_memory(0, 8, frozen_bytes=0.5)["total"] == 4.0
    ratio = lora_memory_ratio_symbolic()
    d_in, d_out, r = sorted(ratio.free_symbols, key=str)
    assert sp.simplify(ratio - (2 * d_in * d_out + 16 * r * (d_in + d_out)) / (16 * d_in * d_out)) == 0
    d = sp.Symbol("d", positive=True)
    assert sp.limit(ratio.subs({d_in: d, d_out: d}), d, sp.oo) == sp.Rational(1, 8)
    ratio32 = lora_memory_ratio_symbolic(trainable_bytes=16, frozen_bytes=4)
    assert sp.limit(ratio32.subs({d_in: d, d_out: d}), d, sp.oo) == sp.Rational(1, 4)
    assert lora_memory_ratio_symbolic(sp.Integer(16), sp.Rational(1, 2)) == lora_memory_ratio_symbolic(16, 0.5)
    assert lora_memory_ratio_symbolic(16, 0.5).subs({d_in: 4, d_out: 4, r: 1}) == sp.Rational(1, 32) + sp.Rational(1, 2)


def _measured_state_bytes(model: nn.Module, mixed: bool) -> int:
    """One real AdamW step on ``model``; the bytes it holds besides activations and step counters,
    measured tensor by tensor with chapter 10's training_state_bytes."""
    x = torch.randn(3, model.in_features, generator=gen(0)).to(model.lora_A.dtype
                                                               if isinstance(model, LoRALinear)
                                                               else model.weight.dtype)
    if mixed:
        opt = MasterWeightOptimizer(model.parameters(), lambda ps: torch.optim.AdamW(ps, lr=1e-3))
        model(x).float().pow(2).mean().backward()
        opt.step()
        got = training_state_bytes(model, opt.optimizer, opt.masters)
    else:
        adamw = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        model(x).pow(2).mean().backward()
        adamw.step()
        got = training_state_bytes(model, adamw)
    return got["total"] - got["optimizer (scalars)"]


@pytest.mark.parametrize("mixed", [True, False])
def test_memory_formula_equals_measured_training_state(mixed):
    """adamw_training_memory and rho against the bytes a real AdamW step holds (non-square layer)."""
    d_in, d_out, r = 48, 20, 3
    dtype = torch.bfloat16 if mixed else torch.float32
    kw = {} if mixed else {"weight_bytes": 4, "grad_bytes": 4, "master_bytes": 0}
    full = nn.Linear(d_in, d_out, bias=False, dtype=dtype)
    lora = LoRALinear(nn.Linear(d_in, d_out, bias=False, dtype=dtype), r=r, alpha=2 * r, generator=gen(1))
    n_adapter = lora_parameter_count(d_in, d_out, r)
    full_bytes, lora_bytes = _measured_state_bytes(full, mixed), _measured_state_bytes(lora, mixed)
    assert full_bytes == adamw_training_memory(d_in * d_out, 0, **kw)["total"]
    assert lora_bytes == adamw_training_memory(n_adapter, d_in * d_out, **kw)["total"]
    ratio = lora_memory_ratio_symbolic(16, 2 if mixed else 4)
    sym = {str(s): s for s in ratio.free_symbols}
    assert ratio.subs({sym["d_in"]: d_in, sym["d_out"]: d_out, sym["r"]: r}) == sp.Rational(lora_bytes, full_bytes)


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
    with pytest.raises(ValueError, match="weight_bytes must be a positive"):
        adamw_training_memory(3, 1, weight_bytes=0)
    with pytest.raises(ValueError, match="master_bytes must be a finite number >= 0"):
        adamw_training_memory(3, 1, master_bytes=-4)
    with pytest.raises(TypeError, match="frozen_bytes must be a number"):
        adamw_training_memory(3, 1, frozen_bytes="2")
    with pytest.raises(ValueError, match="frozen_bytes must be a positive"):
        lora_memory_ratio_symbolic(16, 0)
    with pytest.raises(ValueError, match="trainable_bytes must be a positive"):
        lora_memory_ratio_symbolic(sp.Integer(-16), 2)
    with pytest.raises(TypeError, match="use_rslora must be True or False"):
        LoRALinear(lin, r=2, alpha=1, use_rslora="yes")
    with pytest.raises(TypeError, match="use_dora must be True or False"):
        apply_lora(tiny_llama(), ["q_proj"], r=2, alpha=1, use_dora=1)
    with pytest.raises(ValueError, match="lr_ratio must be a positive"):
        loraplus_param_groups(model, lr=1e-3, lr_ratio=0)
    with pytest.raises(ValueError, match="no trainable parameters"):
        loraplus_param_groups(tiny_llama().requires_grad_(False), lr=1e-3, lr_ratio=16)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        loraplus_param_groups([], lr=1e-3, lr_ratio=16)


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
    return _make_peer(monkeypatch)


def _make_peer(monkeypatch, **options):
    """The ``peer`` fixture's models, with peft's and the book's ``use_rslora``/``use_dora``
    options set alike. DoRA's magnitudes are perturbed (and copied) too, so that m / n != 1."""
    monkeypatch.setattr(LlamaRMSNorm, "forward", _rms_norm_in_input_dtype)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                      num_attention_heads=3, num_key_value_heads=1, max_position_embeddings=32,
                      attn_implementation="sdpa")
    hf = LlamaForCausalLM(cfg)
    randomize_parameters_(hf, 0.1, gen(1))
    hf = hf.double().eval()
    ours = from_hf(hf).eval()
    lcfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                      **options)
    pm = get_peft_model(hf, lcfg)
    ids = torch.randint(0, 50, (2, 11), generator=gen(2))
    with torch.no_grad():
        base_logits = ours(ids)
        with pm.disable_adapter():
            hf_base_logits = pm(input_ids=ids).logits
        assert torch.equal(pm(input_ids=ids).logits, hf_base_logits)  # peft's B = 0 too
    apply_lora(ours, ["q_proj", "v_proj"], r=4, alpha=8, **options)
    peft_lora = {n: p for n, p in pm.named_parameters() if "lora_" in n}
    with torch.no_grad():
        for name, p in peft_lora.items():
            if "lora_B" in name:  # a non-zero B, or the comparison would be trivial
                p.copy_(0.3 * torch.randn(p.shape, generator=gen(len(name)), dtype=p.dtype))
            if "lora_magnitude" in name:
                p.mul_(1 + 0.2 * torch.randn(p.shape, generator=gen(len(name)), dtype=p.dtype))
    ours_lora = dict(ours.named_parameters())
    pairs = []
    for name, p in peft_lora.items():
        mine = _our_name(name)
        with torch.no_grad():
            ours_lora[mine].copy_(p)
        pairs.append((ours_lora[mine], p))
    return {"hf": pm, "ours": ours, "ids": ids, "pairs": pairs, "base_logits": base_logits}


def _our_name(peft_name: str) -> str:
    """base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight -> blocks.0.attn.q_proj.lora_A
    (and ...q_proj.lora_magnitude_vector.default.weight -> ...q_proj.lora_magnitude)."""
    name = (peft_name.removeprefix("base_model.model.model.layers.").removesuffix(".default.weight")
            .replace("self_attn.", "attn.").replace("lora_magnitude_vector", "lora_magnitude"))
    return "blocks." + name


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


# ---------------------------------------------------------------- rsLoRA


def test_lora_scaling_worked_examples():
    assert lora_scaling(4, 8) == 2.0 and lora_scaling(4, 8, use_rslora=True) == 4.0
    assert lora_scaling(9, 6) == pytest.approx(2 / 3, rel=1e-15)
    assert lora_scaling(9, 6, use_rslora=True) == 2.0
    layer = LoRALinear(nn.Linear(10, 7), r=4, alpha=8, use_rslora=True)
    assert layer.scaling == 4.0 and "scaling=4" in repr(layer)


@given(r=st.integers(1, 64), alpha=st.floats(0.25, 64))
def test_property_rslora_is_sqrt_r_times_lora(r, alpha):
    assert lora_scaling(r, alpha, True) == pytest.approx(math.sqrt(r) * lora_scaling(r, alpha), rel=1e-12)


@pytest.mark.parametrize("use_rslora", [False, True])
def test_first_step_from_zero_B_changes_the_output_by_eta_gamma2_norm_Ax2(use_rslora):
    """One SGD step on L = g . y from B = 0: Delta y = -eta gamma^2 ||A x||^2 g (the rsLoRA argument)."""
    d_in, d_out, r, eta = 40, 24, 6, 0.1
    layer = LoRALinear(nn.Linear(d_in, d_out, dtype=torch.float64), r=r, alpha=3.0, generator=gen(0),
                       use_rslora=use_rslora)
    x = torch.randn(d_in, generator=gen(1), dtype=torch.float64)
    g = torch.randn(d_out, generator=gen(2), dtype=torch.float64)
    y0 = layer(x)
    (g @ y0).backward()
    with torch.no_grad():
        for p in (layer.lora_A, layer.lora_B):
            p -= eta * p.grad
        y1 = layer(x)
    expected = -eta * layer.scaling**2 * float((layer.lora_A.detach() @ x).pow(2).sum()) * g
    assert (y1 - y0 - expected).abs().max() < 1e-12
    assert not layer.lora_A.grad.any()  # at B = 0 only B gets a gradient


def test_rslora_equals_peft(monkeypatch):
    peer = _make_peer(monkeypatch, use_rslora=True)
    pm, ours, ids = peer["hf"], peer["ours"], peer["ids"]
    scalings = {m.scaling["default"] for m in pm.modules()
                if isinstance(getattr(m, "scaling", None), dict) and "default" in m.scaling}
    assert scalings == {8 / math.sqrt(4)} == {m.scaling for m in ours.modules() if isinstance(m, LoRALinear)}
    with torch.no_grad():
        assert (pm(input_ids=ids).logits - ours(ids)).abs().max() < 1e-12


# ---------------------------------------------------------------- DoRA


def test_dora_worked_example_and_identity_at_init():
    base = nn.Linear(3, 2, dtype=torch.float64)
    with torch.no_grad():
        base.weight.copy_(torch.tensor([[3.0, 0.0, 4.0], [0.0, 1.0, 0.0]]))
        base.bias.copy_(torch.tensor([0.5, -1.0]))
    layer = LoRALinear(base, r=1, alpha=1.0, use_dora=True)
    assert torch.equal(layer.lora_magnitude, torch.tensor([5.0, 1.0], dtype=torch.float64))  # row norms
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    assert torch.equal(layer(x), base(x))  # m / n = 1 and B = 0: the base layer exactly
    with torch.no_grad():
        layer.lora_A.copy_(torch.tensor([[0.0, 0.0, 1.0]]))
        layer.lora_B.copy_(torch.tensor([[-4.0], [1.0]]))
        layer.lora_magnitude.copy_(torch.tensor([10.0, 2.0]))
    # W + BA = [[3, 0, 0], [0, 1, 1]], row norms (3, sqrt 2); W' = [[10, 0, 0], [0, sqrt 2, sqrt 2]]
    s2 = math.sqrt(2)
    w_prime = torch.tensor([[10.0, 0.0, 0.0], [0.0, s2, s2]], dtype=torch.float64)
    assert torch.allclose(layer.weight_norm(), torch.tensor([3.0, s2], dtype=torch.float64), rtol=0, atol=1e-15)
    assert torch.allclose(layer(x), x @ w_prime.T + base.bias, rtol=0, atol=1e-14)  # (10.5, 5 sqrt 2 - 1)
    layer.merge()
    assert torch.allclose(base.weight, w_prime, rtol=0, atol=1e-14)
    assert torch.allclose(layer(x), x @ w_prime.T + base.bias, rtol=0, atol=1e-14)
    layer.unmerge()
    assert torch.allclose(base.weight, torch.tensor([[3.0, 0.0, 4.0], [0.0, 1.0, 0.0]], dtype=torch.float64),
                          rtol=0, atol=1e-14)


def _dora_layer(seed: int = 0, dropout: float = 0.0) -> LoRALinear:
    layer = LoRALinear(nn.Linear(9, 5, dtype=torch.float64), r=2, alpha=4.0, dropout=dropout,
                       generator=gen(seed), use_dora=True)
    with torch.no_grad():
        layer.lora_B.copy_(torch.randn(5, 2, generator=gen(seed + 1), dtype=torch.float64))
        layer.lora_magnitude.mul_(1 + 0.3 * torch.rand(5, generator=gen(seed + 2), dtype=torch.float64))
    return layer


def test_dora_gradients_treat_the_norm_as_a_constant():
    layer = _dora_layer()
    x = torch.randn(4, 9, generator=gen(5), dtype=torch.float64, requires_grad=True)
    # x and m enter the forward pass only where the detach does not matter: exact derivatives
    assert torch.autograd.gradcheck(lambda x_, m_: _call_with_magnitude(layer, x_, m_),
                                    (x, layer.lora_magnitude.detach().clone().requires_grad_()))
    # A and B: the gradient of an independent formula with n frozen at its value ...
    g = torch.randn(4, 5, generator=gen(6), dtype=torch.float64)
    (g * layer(x)).sum().backward()
    A = layer.lora_A.detach().clone().requires_grad_()
    B = layer.lora_B.detach().clone().requires_grad_()
    W, b, m = layer.base.weight, layer.base.bias, layer.lora_magnitude.detach()

    def reference(A, B, n):
        return x.detach() @ (m[:, None] / n[:, None] * (W + layer.scaling * B @ A)).T + b

    n_const = torch.linalg.vector_norm(W + layer.scaling * (B @ A).detach(), dim=1)
    (g * reference(A, B, n_const)).sum().backward()
    assert (A.grad - layer.lora_A.grad).abs().max() < 1e-13
    assert (B.grad - layer.lora_B.grad).abs().max() < 1e-13
    # ... which differs from the full derivative (n differentiated too): the detach matters
    A2, B2 = A.detach().clone().requires_grad_(), B.detach().clone().requires_grad_()
    (g * reference(A2, B2, torch.linalg.vector_norm(W + layer.scaling * B2 @ A2, dim=1))).sum().backward()
    assert (A2.grad - layer.lora_A.grad).abs().max() > 1e-3


def _call_with_magnitude(layer: LoRALinear, x: Tensor, m: Tensor) -> Tensor:
    with torch.no_grad():
        layer.lora_magnitude.copy_(m.detach())
    factor = m / layer.weight_norm()
    lora = layer.scaling * (x @ layer.lora_A.T.detach() @ layer.lora_B.T.detach())
    out_mod = layer.base(x) + (factor - 1) * nn.functional.linear(x, layer.base.weight) + factor * lora
    out = layer(x)  # the layer itself, to tie the formula above to it
    assert (out - out_mod).abs().max() < 1e-13
    return out_mod


@given(seed=st.integers(0, 2**31 - 1))
def test_property_dora_merge_unmerge_round_trip(seed):
    layer = _dora_layer(seed % 1000)
    x = torch.randn(3, 9, generator=gen(seed), dtype=torch.float64)
    w0 = layer.base.weight.clone()
    with torch.no_grad():
        out = layer(x)
        layer.merge()
        merged = layer(x)
        layer.unmerge()
    assert (merged - out).abs().max() < 1e-12
    assert (layer.base.weight - w0).abs().max() < 1e-13


def test_dora_with_dropout_in_training_follows_peft_formula():
    layer = _dora_layer(dropout=0.5).train()
    x = torch.randn(6, 9, generator=gen(3), dtype=torch.float64)
    torch.manual_seed(4)
    out = layer(x)
    torch.manual_seed(4)
    x_d = nn.functional.dropout(x, 0.5, training=True)
    factor = layer.lora_magnitude / layer.weight_norm()
    expected = (layer.base(x) + (factor - 1) * (x_d @ layer.base.weight.T)
                + factor * layer.scaling * (x_d @ layer.lora_A.T @ layer.lora_B.T))
    assert (out - expected).abs().max() < 1e-13


def test_dora_equals_peft(monkeypatch):
    peer = _make_peer(monkeypatch, use_dora=True)
    pm, ours, ids, pairs = peer["hf"], peer["ours"], peer["ids"], peer["pairs"]
    assert len(pairs) == 12  # A, B and m on q_proj and v_proj of two layers
    assert lora_state_dict(ours).keys() == {_our_name(n) for n, _ in pm.named_parameters() if "lora_" in n}
    target = torch.randint(0, 50, ids.shape, generator=gen(7))
    theirs, mine = pm(input_ids=ids).logits, ours(ids)
    assert (mine - theirs).abs().max() < 1e-12
    assert (mine - peer["base_logits"]).abs().max() > 1e-2
    for logits in (theirs, mine):
        nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten()).backward()
    for a, b in pairs:
        assert a.shape == b.shape and (a.grad - b.grad).abs().max() < 1e-12
        assert a.grad.abs().max() > 0
    with torch.no_grad():
        merged_hf = pm.merge_and_unload()
        merge_lora(ours)
        assert (ours(ids) - merged_hf(ids).logits).abs().max() < 1e-12
    assert (ours.blocks[1].attn.v_proj.base.weight - merged_hf.model.layers[1].self_attn.v_proj.weight
            ).abs().max() < 1e-14


# ---------------------------------------------------------------- LoRA+


def test_loraplus_groups_worked_example():
    model = apply_lora(tiny_llama(), ["v_proj"], r=2, alpha=4, use_dora=True)
    groups = loraplus_param_groups(model, lr=1e-3, lr_ratio=16, weight_decay=0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert [g["lr"] for g in groups] == [1e-3, 16e-3] and all(g["weight_decay"] == 0.1 for g in groups)
    assert sorted(names[id(p)] for p in groups[0]["params"]) == [f"blocks.{i}.attn.v_proj.lora_A" for i in (0, 1)]
    assert sorted(names[id(p)] for p in groups[1]["params"]) == sorted(
        f"blocks.{i}.attn.v_proj.lora_{k}" for i in (0, 1) for k in ("B", "magnitude"))


def test_loraplus_equals_peft_create_loraplus_optimizer(monkeypatch):
    """Same learning rate for every parameter, and the same adapters after three AdamW steps."""
    peer = _make_peer(monkeypatch, use_dora=True)
    pm, ours, ids, pairs = peer["hf"], peer["ours"], peer["ids"], peer["pairs"]
    theirs_opt = create_loraplus_optimizer(pm, torch.optim.AdamW, lr=2e-3, loraplus_lr_ratio=8.0)
    ours_opt = torch.optim.AdamW(loraplus_param_groups(ours, lr=2e-3, lr_ratio=8.0))

    def lrs(opt):
        return {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}

    lr_theirs, lr_ours = lrs(theirs_opt), lrs(ours_opt)
    assert all(lr_ours[id(a)] == lr_theirs[id(b)] for a, b in pairs)
    assert sorted({lr_ours[id(a)] for a, _ in pairs}) == [2e-3, 16e-3]
    target = torch.randint(0, 50, ids.shape, generator=gen(8))
    before = [a.detach().clone() for a, _ in pairs]
    for _ in range(3):
        for opt, logits in ((theirs_opt, lambda: pm(input_ids=ids).logits), (ours_opt, lambda: ours(ids))):
            opt.zero_grad()
            nn.functional.cross_entropy(logits().flatten(0, 1), target.flatten()).backward()
            opt.step()
    assert max((a - b).abs().max().item() for a, b in pairs) < 1e-12
    assert all((a - a0).abs().max() > 1e-4 for (a, _), a0 in zip(pairs, before, strict=True))
