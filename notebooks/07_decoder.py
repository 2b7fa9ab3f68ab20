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
import math

import matplotlib.pyplot as plt
import numpy as np
import sympy as sp
import torch
from IPython.display import display
from torch.utils.flop_counter import FlopCounterMode
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from llmbook.nbtools import Checks, save_figure, seed_everything, show_source
from llmbook.transformer.hf_loading import config_from_hf, from_hf, randomize_parameters_
from llmbook.transformer.model import DecoderBlock, TransformerConfig, TransformerLM
from llmbook.transformer.sizing import (
    count_parameters,
    count_parameters_symbolic,
    flops_per_token,
    flops_per_token_symbolic,
    flops_shares,
    parameter_shares,
    symbol_values,
)

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
# the stream before the output layer. In code, `forward` applies the output layer to what
# `hidden_states` computes, the normalised stream $\operatorname{Norm}(x_L)$ (a reward model
# in chapter 17 puts another head on the same states):

# %%
show_source(TransformerLM.forward)

# %%
show_source(TransformerLM.hidden_states)

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
# that total independent of depth.

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
checks.equal("norm gains", 1.0, m_init.final_norm.weight.unique().item())
checks

# %% [markdown]
# ## 7.3 Counting parameters
#
# Write $V$ for the vocabulary, $d$ the width, $L$ the depth, $H$ and $H_{kv}$ the query and
# key/value heads of width $d_h$, $d_{ff}$ the feed-forward width, and $m$ the number of
# feed-forward matrices (2 for the GELU MLP, 3 for SwiGLU). Indicators $b_{qkv}, b_o, b_{mlp},
# b_n \in \{0, 1\}$ switch the biases and LayerNorm's shift on, $u = 1$ for an untied output
# layer and $p = 1$ for a learned position table of $T_{max}$ rows. Term by term:

# %%
V, d, L, H, H_kv, d_h, d_ff, m, T, T_max, b_qkv, b_o, b_mlp, b_n, u, p = sp.symbols(
    "V d L H H_kv d_h d_ff m T T_max b_qkv b_o b_mlp b_n u p", integer=True, nonnegative=True)
P_attn = d * H * d_h + 2 * d * H_kv * d_h + H * d_h * d  # W_Q, W_K and W_V, W_O
P_attn += b_qkv * (H + 2 * H_kv) * d_h + b_o * d  # their biases
P_ffn = m * d * d_ff + b_mlp * ((m - 1) * d_ff + d)  # m matrices, (m - 1) d_ff + d biases
P_norm = d * (1 + b_n)  # gain (and LayerNorm's shift)
P_model = L * (P_attn + P_ffn + 2 * P_norm) + P_norm + V * d * (1 + u) + p * T_max * d
assert sp.simplify(P_model - count_parameters_symbolic()) == 0  # = llmbook.transformer.sizing's form
display(sp.Eq(sp.Symbol("N"), sp.collect(sp.expand(P_model), L)))

# %% [markdown]
# For GPT-2 ($H_{kv} = H$, $H d_h = d$, $d_{ff} = 4d$, $m = 2$, all biases, tied, a learned
# table) it collapses to the well-known $12Ld^2$ plus lower-order terms; for a Llama-style
# model without biases and with $d_{ff} = \frac83 d$ (before rounding) and $H_{kv} = H$ the
# same $12 L d^2$ appears, which is exactly why Llama chose $\frac23 \cdot 4d$: SwiGLU's
# three matrices then hold as many parameters as the MLP's two.

# %%
gpt2_subs = {H_kv: H, d_h: d / H, d_ff: 4 * d, m: 2, b_qkv: 1, b_o: 1, b_mlp: 1, b_n: 1,
             u: 0, p: 1}
llama_subs = {H_kv: H, d_h: d / H, d_ff: sp.Rational(8, 3) * d, m: 3, b_qkv: 0, b_o: 0,
              b_mlp: 0, b_n: 0, u: 1, p: 0}
P_gpt2 = sp.expand(P_model.subs(gpt2_subs))
P_llama = sp.expand(P_model.subs(llama_subs))
assert sp.simplify(P_gpt2 - (12 * L * d**2 + 13 * L * d + V * d + T_max * d + 2 * d)) == 0
assert sp.simplify(P_llama - (12 * L * d**2 + 2 * L * d + 2 * V * d + d)) == 0
display(sp.Eq(sp.Symbol(r"N_{\mathrm{GPT\text{-}2}}"), sp.collect(P_gpt2, L)),
        sp.Eq(sp.Symbol(r"N_{\mathrm{Llama}}"), sp.collect(P_llama, L)))

# %% [markdown]
# `llmbook.transformer.sizing.count_parameters` evaluates the same closed form with integers:

# %%
show_source(parameter_shares)

# %% [markdown]
# Now the check against real objects. For each family, small models of the book and of
# Hugging Face, tied and untied, and the published sizes. The large ones are built inside
# `with torch.device("meta"):`: a meta tensor has a shape and a dtype but no storage, so
# a 7-billion-parameter model costs nothing to build and its parameters can still be
# counted. For Qwen2-0.5B, Hugging Face's own `Qwen2ForCausalLM` is built the same way.

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


checks = Checks("parameter count: closed form vs real models")
for family in ("gpt2", "llama", "qwen2"):
    for tied in (True, False):
        hf = hf_small(family, tied)
        c = config_from_hf(hf)
        checks.equal(f"{family}, tied={tied}: Hugging Face", n_params(hf), count_parameters(c))
        checks.equal(f"{family}, tied={tied}: ours", n_params(TransformerLM(c)), count_parameters(c))
with torch.device("meta"):
    for name, c in styles.items():
        checks.equal(f"{name} (meta): ours", n_params(TransformerLM(c)), count_parameters(c))
    qwen_hf = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, intermediate_size=4864, tie_word_embeddings=True,
        max_position_embeddings=32768, rope_parameters={"rope_type": "default", "rope_theta": 1e6}))
checks.equal("Qwen2-0.5B (meta): Hugging Face", n_params(qwen_hf), count_parameters(styles["Qwen2-0.5B"]))
checks.equal("Qwen2-0.5B: published 494,032,768", 494_032_768, count_parameters(styles["Qwen2-0.5B"]))
checks.equal("GPT-2 small: 124,439,808", 124_439_808, count_parameters(styles["GPT-2 small"]))
checks.equal("Llama 2 7B: 6,738,415,616", 6_738_415_616, count_parameters(styles["Llama 2 7B"]))
checks

# %% [markdown]
# ## 7.4 FLOPs per token
#
# Count the forward pass the way PyTorch's `FlopCounterMode` does: matrix products only, and
# 2 FLOPs per multiply-add, so an $(a \times b)(b \times c)$ product costs $2abc$. Biases,
# norms, activations, the softmax, RoPE and the embedding lookup are left out; they are
# $O(d)$ per token against the $O(d^2)$ of the products. Per token, on a sequence of $T$:
#
# * attention projections: $2d \cdot (H + 2H_{kv}) d_h$ for $q, k, v$ and $2 H d_h \cdot d$
#   for the output;
# * attention proper: the scores $QK^\top$ cost $2T H d_h$ per token and the mix $AV$ as
#   much again: this is the only term that grows with $T$ (the full $T \times T$ square, as
#   the book's attention computes it; a causal kernel that skips the masked half does half);
# * feed-forward: $2 m\, d\, d_{ff}$; the output layer: $2dV$.

# %%
F_layer = 2 * d * (H + 2 * H_kv) * d_h + 2 * H * d_h * d + 2 * T * H * d_h * 2 + 2 * m * d * d_ff
F_token = L * F_layer + 2 * d * V
assert sp.simplify(F_token - flops_per_token_symbolic()) == 0
display(sp.Eq(sp.Symbol("C_{fwd}/token"), sp.collect(sp.expand(F_token), [L, T])))

# %% [markdown]
# The familiar approximation "$C \approx 2N$ FLOPs per token" falls out: the number of
# parameters that enter matrix products is $N_{mm} = L(P_{attn} + P_{ffn}) + dV$ without
# biases (the embedding lookup multiplies nothing, but a tied $E$ is used again as the output
# layer, and an untied $W_{out}$ is a product too). Every such weight does one multiply-add
# per token, 2 FLOPs. What remains is the attention term $4LTHd_h$:

# %%
N_mm = (L * (P_attn + P_ffn) + d * V).subs({b_qkv: 0, b_o: 0, b_mlp: 0})
attention_term = sp.expand(F_token - 2 * N_mm)
assert sp.simplify(attention_term - 4 * L * T * H * d_h) == 0
display(sp.Eq(sp.Symbol("C_{fwd}/token"), sp.Add(2 * sp.Symbol("N_{mm}"), attention_term,
                                                  evaluate=False)))

# %% [markdown]
# `FlopCounterMode` must agree exactly, for every family and several lengths. The book's
# attention is used for this count: PyTorch's fused CPU attention kernel is invisible to
# the counter (the second table shows what it misses: precisely the attention term). The
# full-size Qwen2-0.5B runs a $T = 2048$ forward pass on the meta device: no numbers are
# computed, only shapes, so the count takes a fraction of a second.

# %%
def counted_flops(model, B, T_):
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.zeros(B, T_, dtype=torch.long, device=model.embed.weight.device))
    return counter.get_total_flops()


checks = Checks("FLOPs: closed form x B T vs FlopCounterMode")
missed = {}
for family in ("gpt2", "llama", "qwen2"):
    model = from_hf(hf_small(family, tied=family != "llama"))
    for B_, T_ in ((1, 32), (3, 13)):
        model.set_fused_attention(False)
        checks.equal(f"{family}, B={B_}, T={T_}", B_ * T_ * flops_per_token(model.config, T_),
                     counted_flops(model, B_, T_))
        model.set_fused_attention(True)
        gap = B_ * T_ * flops_per_token(model.config, T_) - counted_flops(model, B_, T_)
        missed[(family, B_, T_)] = (gap, model.config)
with torch.device("meta"):
    qwen = from_hf(qwen_hf)
qwen.set_fused_attention(False)
qwen_flops = flops_per_token(qwen.config, 2048)
checks.equal("Qwen2-0.5B (meta), B=1, T=2048", 2048 * qwen_flops, counted_flops(qwen, 1, 2048))
checks.equal("symbolic form at Qwen2-0.5B, T=2048", qwen_flops,
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
fig, axes = plt.subplots(1, 2, figsize=(13, 4.4))
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
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
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
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/07_decoder.py` and are checked by
# `tests/test_solutions_07.py`.
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
