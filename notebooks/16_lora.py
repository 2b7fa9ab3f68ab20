# %% [markdown]
# # 16 LoRA: low-rank adaptation
#
# Fine-tuning every weight of a pretrained model is expensive in memory: besides the weights,
# AdamW keeps a gradient and two moment estimates for each of them, and every fine-tune
# produces a full copy of the model. Hu et al. (2021, "LoRA: Low-Rank Adaptation of Large
# Language Models") freeze the pretrained weights and learn only a *low-rank update* of a few
# matrices. This chapter:
#
# 1. **derives** the update $\Delta W = \frac{\alpha}{r} BA$: with $B = 0$ the model is
#    unchanged, $\Delta W$ has rank at most $r$, and it costs $r(d_{in}+d_{out})$ parameters;
#    SymPy works out how much training memory that saves with mixed-precision AdamW, and a
#    real training step measures it;
# 2. **verifies** `llmbook.alignment.lora`: zero-initialised adapters leave the book's text
#    model bit-for-bit unchanged, merging and unmerging are exact to round-off, and the layer
#    matches Hugging Face `peft` on a Llama model;
# 3. **explores** adapting the book's text model to a topic it never saw, with full
#    fine-tuning and with LoRA, and looks at the singular values of what full fine-tuning
#    changed;
# 4. works out the memory of QLoRA, LoRA on a base model stored in 4-bit NF4 (chapter 15),
#    and trains it: adapters on the book's model rounded to NF4;
# 5. derives three refinements practitioners use, rsLoRA's scaling $\alpha/\sqrt r$, LoRA+'s
#    larger learning rate for $B$, and DoRA's split into magnitude and direction, and checks
#    each against `peft`.

# %%
import copy
import warnings

import matplotlib.pyplot as plt
import sympy as sp
import torch
from IPython.display import display
from peft import LoraConfig, get_peft_model
from peft.optimizers import create_loraplus_optimizer
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
    lora_scaling,
    lora_state_dict,
    loraplus_param_groups,
    merge_lora,
    quantize_frozen_nf4,
    unmerge_lora,
)
from llmbook.nbtools import Checks, save_figure, seed_everything, show_source
from llmbook.text.corpus import load_stdlib_docs
from llmbook.training.memory import (
    MasterWeightOptimizer,
    mixed_precision_bytes_symbolic,
    training_state_bytes,
)
from llmbook.training.pretrained import book_model
from llmbook.training.train import TrainConfig, evaluate, train
from llmbook.transformer.hf_loading import from_hf, randomize_parameters_

g = seed_everything(0)
torch.set_num_threads(1)  # a small model: one thread is steadier
f64 = torch.float64
# peft 0.21 calls a transformers method that transformers 5 has deprecated
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")

# %% [markdown]
# ## 16.1 The low-rank update
#
# A linear layer $h = Wx$ with $W \in \mathbb R^{d_{out}\times d_{in}}$ is fine-tuned to
# $W + \Delta W$. LoRA restricts the change to a product of two thin matrices,
#
# $$ h = Wx + \frac{\alpha}{r}\, B A x, \qquad A \in \mathbb R^{r\times d_{in}},\quad
#    B \in \mathbb R^{d_{out}\times r},\quad r \ll \min(d_{in}, d_{out}), $$
#
# trains $A$ and $B$, and keeps $W$ frozen. $A$ starts random and $B$ at zero, so training
# starts from the pretrained model itself; the factor $\alpha/r$ keeps the size of the update
# roughly the same when one tries several ranks at a fixed $\alpha$ (Hu et al., section 4.1).
# The bet behind it: the change a fine-tune needs has low *intrinsic* dimension, as
# Aghajanyan et al. (2020, "Intrinsic Dimensionality Explains the Effectiveness of Language
# Model Fine-Tuning") measured for whole models.
#
# SymPy cannot reason about matrices of unknown shape, so a $3\times 2$ layer with $r = 1$
# stands in for the general one. Three facts: with $B = 0$ the layer is the base layer;
# $BA$ has rank 1 (every $2\times 2$ minor vanishes); and the update has
# $r(d_{in}+d_{out}) = 5$ entries against $d_{in}d_{out} = 6$ for $W$.

# %%
alpha, r_ = sp.symbols("alpha r", positive=True)
W = sp.Matrix(3, 2, sp.symbols("w0:6"))
B = sp.Matrix(3, 1, sp.symbols("b0:3"))
A = sp.Matrix(1, 2, sp.symbols("a0:2"))
x = sp.Matrix(2, 1, sp.symbols("x0:2"))
h = W * x + alpha / r_ * B * A * x
assert sp.simplify(h.subs({b: 0 for b in B}) - W * x) == sp.zeros(3, 1)
minors = [(B * A)[[i, j], :].det() for i in range(3) for j in range(i + 1, 3)]
assert all(sp.expand(m) == 0 for m in minors) and (B * A).rank() == 1
display(sp.Eq(sp.Symbol(r"\Delta W"), alpha / r_ * B * A, evaluate=False))

# %% [markdown]
# Zero-initialising $B$ has a consequence for the first step. For a loss with gradient
# $g = \partial\mathcal L/\partial h$ at the layer's output, the chain rule gives
#
# $$ \frac{\partial \mathcal L}{\partial B} = \frac{\alpha}{r}\, g\,(Ax)^\top, \qquad
#    \frac{\partial \mathcal L}{\partial A} = \frac{\alpha}{r}\, B^\top g\, x^\top , $$
#
# so at $B = 0$ only $B$ receives a gradient; $A$ starts moving once $B$ has. SymPy checks both
# on the small layer (a loss linear in $h$ has exactly the gradient $g$):

# %%
gvec = sp.Matrix(3, 1, sp.symbols("g0:3"))
loss = (gvec.T * h)[0]
dB = sp.Matrix(3, 1, lambda i, j: sp.diff(loss, B[i, j]))
dA = sp.Matrix(1, 2, lambda i, j: sp.diff(loss, A[i, j]))
assert sp.simplify(dB - alpha / r_ * gvec * (A * x).T) == sp.zeros(3, 1)
assert sp.simplify(dA - alpha / r_ * B.T * gvec * x.T) == sp.zeros(1, 2)
assert dA.subs({b: 0 for b in B}) == sp.zeros(1, 2)
display(sp.Eq(sp.Symbol(r"\partial\mathcal{L}/\partial A|_{B=0}"), dA.subs({b: 0 for b in B}), evaluate=False))

# %% [markdown]
# **What it saves.** An adapter has $r(d_{in}+d_{out})$ parameters. On a $4096\times 4096$
# projection of a 7B Llama with $r = 8$ that is 65 536 against 16 777 216, 0.39 %. Memory
# saves less than that. Large models are fine-tuned in mixed precision (chapter 10): a
# trained parameter keeps a 16-bit weight and gradient, a float32 master copy of the weight
# and AdamW's two float32 moments, $t = 2 + 2 + 4 + 4 + 4 = 16$ bytes; a frozen one keeps only
# its 16-bit weight, $f = 2$ bytes. For one matrix the ratio of LoRA's training memory to full
# fine-tuning's is
#
# $$ \rho = \frac{f\,d_{in}d_{out} + t\,r(d_{in}+d_{out})}{t\,d_{in}d_{out}} , $$
#
# which tends to $f/t = 1/8$ for large matrices: the frozen weights themselves remain. (Plain
# float32 training also keeps $t = 16$ bytes per trained parameter, but $f = 4$ per frozen one:
# the floor is then $1/4$.) That floor is what QLoRA lowers (section 16.5). Chapter 10
# derived $t$ from the bits of each copy:

# %%
t_bytes = mixed_precision_bytes_symbolic()["total"]  # chapter 10: 16-bit weight and gradient, fp32 master, m, v
rho = lora_memory_ratio_symbolic(trainable_bytes=t_bytes, frozen_bytes=2)
d_in, d_out, r, d = sp.symbols("d_in d_out r d", positive=True, integer=True)
limit = sp.limit(rho.subs({d_in: d, d_out: d}), d, sp.oo)
display(sp.Eq(sp.Symbol("t"), t_bytes), sp.Eq(sp.Symbol(r"\rho"), sp.factor(rho)),
        sp.Eq(sp.Symbol(r"\lim_{d\to\infty}\rho(d, d, r)"), limit))
rho_7b = rho.subs({d_in: 4096, d_out: 4096, r: 8})
print("q_proj of a 7B Llama, r = 8:", lora_parameter_count(4096, 4096, 8), "vs", 4096 * 4096,
      f" rho = {rho_7b} = {float(rho_7b):.4f}")

# %% [markdown]
# The formula is a count; a training step can be measured. Chapter 10's
# `MasterWeightOptimizer` runs mixed-precision AdamW on a bfloat16 layer, and
# `training_state_bytes` adds up the bytes of every tensor the step leaves behind (weights,
# gradients, master copies, moments; Adam's one step counter per tensor is left out). A
# non-square $96 \to 40$ layer, fully trained and with a rank-4 adapter:

# %%
def measured_state_bytes(layer):
    """Bytes held after one mixed-precision AdamW step, tensor by tensor (no step counters)."""
    opt = MasterWeightOptimizer(layer.parameters(), lambda ps: torch.optim.AdamW(ps, lr=1e-3))
    x = torch.randn(4, 96, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    layer(x).float().pow(2).mean().backward()
    opt.step()
    state = training_state_bytes(layer, opt.optimizer, opt.masters)
    return state["total"] - state["optimizer (scalars)"]


full_bytes = measured_state_bytes(nn.Linear(96, 40, bias=False, dtype=torch.bfloat16))
lora_bytes = measured_state_bytes(LoRALinear(nn.Linear(96, 40, bias=False, dtype=torch.bfloat16),
                                             r=4, alpha=8))
checks = Checks("memory: the formula against a measured training step (96 → 40, r = 4, bfloat16)")
checks.equal("full fine-tuning, bytes per parameter: t", t_bytes, sp.Rational(full_bytes, 96 * 40))
checks.equal("ρ(96, 40, 4) = LoRA's bytes / full fine-tuning's", rho.subs({d_in: 96, d_out: 40, r: 4}),
             sp.Rational(lora_bytes, full_bytes))
checks

# %% [markdown]
# The package's layer wraps a frozen `nn.Linear`. Its forward pass never forms $\Delta W$:
# it computes $x A^\top$ (width $r$) and then $(\cdot) B^\top$, which costs
# $r(d_{in}+d_{out})$ multiplications per token instead of $d_{in}d_{out}$. `merge` adds
# $\Delta W$ into the base weight after training, so that inference costs exactly what the
# base model costs; `unmerge` takes it out again. (The options `use_rslora` and `use_dora`
# are section 16.6's.)

# %%
show_source(LoRALinear)

# %% [markdown]
# `apply_lora(model, ["q_proj", "v_proj"], r, alpha)` freezes the model and wraps every
# linear layer whose last name component is listed. The book's model uses Llama's names, so a
# target list written for `peft` on a Llama selects the same matrices here.
#
# ## 16.2 Verify
#
# Three checks on the book's trained text model (2M parameters, chapter 10): with $B = 0$ the
# adapted model's logits are *equal*, bit for bit, to the base model's (the adapter adds an
# exact $0$); after giving $B$ random values, merging leaves the logits unchanged up to float64
# round-off; and unmerging restores the original weights.

# %%
base, info = book_model("text")
tok = info["tokenizer"]
ids = torch.tensor([tok.encode("Return the number of items in the queue.")])
lora = apply_lora(copy.deepcopy(base), ["q_proj", "v_proj"], r=4, alpha=8, generator=g)
lora64 = apply_lora(copy.deepcopy(base).double(), ["q_proj", "v_proj"], r=4, alpha=8, generator=g)
base64 = copy.deepcopy(base).double()
w_before = lora64.blocks[2].attn.v_proj.base.weight.clone()
with torch.no_grad():
    for m in lora64.modules():
        if isinstance(m, LoRALinear):
            m.lora_B.copy_(0.1 * torch.randn(m.lora_B.shape, generator=g, dtype=f64))
    adapted, base_logits = lora64(ids), base64(ids)
    merged = merge_lora(lora64)(ids)
    unmerge_lora(lora64)

# %%
checks = Checks("LoRA on the book's text model")
with torch.no_grad():
    checks.true("B = 0: logits equal to the base model's (torch.equal)",
                torch.equal(lora(ids), base(ids)))
checks.true("B ≠ 0 changes the logits", float((adapted - base_logits).abs().max()) > 1e-3)
checks.close("merged logits = adapted logits (float64)", adapted, merged, tol=1e-12)
checks.close("unmerge restores W (float64)", w_before, lora64.blocks[2].attn.v_proj.base.weight, tol=1e-15)
checks.equal("adapter entries saved by lora_state_dict", 4 * 2 * 2, len(lora_state_dict(lora)))
checks.equal("trainable parameters = 4 layers × 2 × r(d_in + d_out)",
             4 * 2 * lora_parameter_count(192, 192, 4), count_trainable_parameters(lora))
checks

# %% [markdown]
# **The peer: `peft`.** Hugging Face's `peft` is what most LoRA fine-tunes use. A tiny random
# Llama (hidden size 24, one key-value head, so `v_proj` is $8\times 24$: not square) in
# float64 is wrapped by `peft` and, after loading it into the book's model, by `apply_lora`
# with the same $r$, $\alpha$ and targets. Copying `peft`'s adapter weights (with a non-zero
# $B$) into ours, the two must agree on the trainable parameter count, the logits and the
# merged weights. The logits agree to about $10^{-7}$, not $10^{-15}$: Hugging Face's
# RMSNorm computes in float32 even in a float64 model.

# %%
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=50, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                  num_attention_heads=3, num_key_value_heads=1, attn_implementation="sdpa")
hf = LlamaForCausalLM(cfg)
randomize_parameters_(hf, 0.1, torch.Generator().manual_seed(1))
hf = hf.double().eval()
ours = apply_lora(from_hf(hf).eval(), ["q_proj", "v_proj"], r=4, alpha=8)
pm = get_peft_model(hf, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
ours_params = dict(ours.named_parameters())
with torch.no_grad():
    for name, p in pm.named_parameters():
        if "lora_" in name:
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=f64))
            key = "blocks." + name.split("layers.")[1].replace("self_attn.", "attn.")
            ours_params[key.removesuffix(".default.weight")].copy_(p)

# %%
ids_hf = torch.randint(0, 50, (2, 11), generator=g)
checks = Checks("the book's LoRA against peft")
checks.equal("trainable parameters", pm.get_nb_trainable_parameters()[0], count_trainable_parameters(ours))
with torch.no_grad():
    checks.close("logits with adapters", pm(input_ids=ids_hf).logits, ours(ids_hf), tol=1e-6)
    merged_hf = pm.merge_and_unload()
    merge_lora(ours)
checks.close("merged v_proj weight (8 × 24)", merged_hf.model.layers[1].self_attn.v_proj.weight,
             ours.blocks[1].attn.v_proj.base.weight, tol=1e-14)
checks

# %% [markdown]
# ## 16.3 Adapting the book's model to a new topic
#
# The book's text model was trained on the first 90 % of the standard-library docstrings; the
# last 10 %, which it never saw, includes the `xml.*` packages (`xml.dom`, `xml.etree`,
# `xml.sax`, …): about 18 000 tokens of text about elements, nodes, parsers and handlers. The
# task: adapt the model to XML documentation, training on the first 80 % of those tokens and
# measuring on the last 20 %. The docstrings between `urllib.response` and `xml.dom` (also
# unseen, but about other things) measure what the adaptation costs elsewhere.

# %%
text = load_stdlib_docs()
start, end = text.index("# module xml.dom\n"), text.index("# module xmlrpc.client")
xml_ids = torch.tensor(tok.encode(text[start:end]))
other_ids = torch.tensor(tok.encode(text[text.index("# module urllib.response"):start]))
n_train = int(0.8 * len(xml_ids))
xml_train, xml_val = xml_ids[:n_train], xml_ids[n_train:]
print(f"XML: {len(xml_train)} training and {len(xml_val)} validation tokens; "
      f"other held-out docstrings: {len(other_ids)} tokens")


def val_loss(model, tokens):
    """Mean cross-entropy (nats/token) on the same 4 batches of 16 × 64 tokens every time."""
    return evaluate(model, tokens, batch_size=16, context_length=64, num_batches=4)


# %% [markdown]
# Both runs take 80 AdamW steps on batches of $8\times 64$ tokens with chapter 10's `train`
# (warmup and cosine decay, no weight decay), each at a learning rate suited to it: full
# fine-tuning at $2\cdot 10^{-4}$, LoRA at $10^{-2}$. LoRA trains larger steps because its
# update starts at zero and must grow from there, and its small number of parameters makes it
# less prone to overshoot; Hu et al. likewise tune its learning rate separately. LoRA uses
# $r = 4$, $\alpha = 8$ on `q_proj` and `v_proj` of the four blocks, the placement Hu et al.
# found best for a fixed budget (their section 7.1).

# %%
def fine_tune(model, lr):
    cfg = TrainConfig(steps=80, batch_size=8, context_length=64, lr=lr, min_lr=lr / 10,
                      warmup_steps=8, weight_decay=0.0, eval_every=None)
    train(model, xml_train, None, cfg)
    return model


full = fine_tune(copy.deepcopy(base), lr=2e-4)
lora = fine_tune(apply_lora(copy.deepcopy(base), ["q_proj", "v_proj"], r=4, alpha=8, generator=g), lr=1e-2)

# %%
results = {"base model": base, "full fine-tuning": full, "LoRA r=4 (q, v)": lora}
loss_table = {name: (val_loss(m, xml_val), val_loss(m, other_ids)) for name, m in results.items()}
print(f"{'':18s} {'trainable':>10s} {'XML val loss':>13s} {'other docstrings':>17s}")
for name, m in results.items():
    n = 0 if m is base else count_trainable_parameters(m)
    print(f"{name:18s} {n:10d} {loss_table[name][0]:13.2f} {loss_table[name][1]:17.2f}")

# %% [markdown]
# Full fine-tuning trains all 2 001 024 parameters; LoRA trains 12 288, 0.6 % of them, and
# stores a 48 KB adapter instead of an 8 MB model. Within the same 80 steps full fine-tuning
# lowers the XML loss more: this model is tiny and the adapters cover only two of the six
# matrices of a block, so LoRA's rank and placement constrain it much more than on a
# billion-parameter model, where Hu et al. found rank 4 on $W_q, W_v$ to match full
# fine-tuning. Both gains cost something on the other unseen docstrings: an adaptation moves
# the model towards its new topic and away from the rest.

# %%
(b_xml, b_other), (f_xml, f_other), (l_xml, l_other) = loss_table.values()
checks = Checks("adaptation to the XML docstrings")
checks.true("full fine-tuning lowers the XML loss by > 0.5 nats", b_xml - f_xml > 0.5)
checks.true("LoRA lowers the XML loss by > 0.2 nats", b_xml - l_xml > 0.2)
checks.true("full fine-tuning beats LoRA on XML", f_xml < l_xml)
checks.true("LoRA trains < 1 % of the parameters", count_trainable_parameters(lora) < 0.01 * base.num_parameters())
checks.true("both raise the loss on the other docstrings", f_other > b_other and l_other > b_other)
checks

# %% [markdown]
# ## 16.4 How low-rank is the full fine-tuning update?
#
# LoRA presumes that the change fine-tuning makes is nearly low-rank. The full fine-tune above
# changed every weight, so it can answer that directly: the singular values
# $\sigma_1 \ge \sigma_2 \ge \dots$ of $\Delta W = W_{\text{tuned}} - W$ for the query
# projection of block 1. By the Eckart–Young theorem the best rank-$r$ approximation of
# $\Delta W$ keeps the top $r$ singular directions and loses the rest, so the share of the
# *energy* $\sum_{i\le r}\sigma_i^2 / \sum_i \sigma_i^2$ is what a rank-$r$ update could
# capture at best. As a yardstick, a random Gaussian matrix of the same shape.

# %%
def energy(delta):
    s = torch.linalg.svdvals(delta.to(f64))
    return s, (s**2).cumsum(0) / (s**2).sum()


name = "blocks.1.attn.q_proj.weight"
s_ft, e_ft = energy(full.state_dict()[name] - base.state_dict()[name])
s_rand, e_rand = energy(torch.randn(192, 192, generator=g, dtype=f64))
for k in (4, 16, 48):
    print(f"top {k:2d} of 192 directions: {float(e_ft[k - 1]):.2f} of the fine-tuning update's "
          f"energy, {float(e_rand[k - 1]):.2f} of a random matrix's")
hundredfold = int((s_ft / s_ft[0] < 0.01).nonzero()[0]) + 1  # the first i with σ_i < σ_1 / 100
print(f"σ_i / σ_1 first falls below 0.01 at i = {hundredfold} for the fine-tuning update; "
      f"there a random matrix's is {float(s_rand[hundredfold - 1] / s_rand[0]):.2f}")

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
k = torch.arange(1, 193)
ax1.semilogy(k, s_ft / s_ft[0], label="full fine-tuning ΔW")
ax1.semilogy(k, s_rand / s_rand[0], "--", label="random Gaussian matrix")
ax1.set(xlabel="index i", ylabel="σ_i / σ_1", title="Singular values (normalised)")
ax2.plot(k, e_ft, label="full fine-tuning ΔW")
ax2.plot(k, e_rand, "--", label="random Gaussian matrix")
ax2.axvline(4, color="grey", lw=0.8)
ax2.set(xlabel="rank r", ylabel="share of energy in top r directions",
        title="Energy a rank-r update can capture")
ax2.legend()
fig.suptitle("ΔW of block 1's q_proj after 80 steps of full fine-tuning (192 × 192)")
fig.tight_layout()
save_figure(fig, "16_lora_spectrum")
plt.show()

# %% [markdown]
# On the left, the singular values of the fine-tuning update fall a hundred-fold over the
# first 160 indices, where those of a random matrix (whose energy is spread evenly over all
# directions) fall less than ten-fold, to 0.14 of the largest. On the right, the same as
# energy: the top 4 directions (grey line) hold about a third of the update's energy, four
# times a random matrix's share, and the top 16 hold three quarters. It is not rank 4 either: a long tail of smaller singular
# values carries the rest, part of it the noise of 80 small batches. A rank-$r$ adapter can
# represent the head and not the tail, which is why a small rank recovers part, but not all,
# of what full fine-tuning gains.

# %%
checks = Checks("spectrum of the full fine-tuning update")
checks.true("top 4 directions: > 3× the energy share of a random matrix's", e_ft[3] > 3 * e_rand[3])
checks.true("top 48 of 192 directions hold > 70 % of the energy", e_ft[47] > 0.7)
checks.true("but rank 4 holds < 60 %: ΔW is not exactly low-rank", e_ft[3] < 0.6)
checks

# %% [markdown]
# ## 16.5 QLoRA: a 4-bit frozen base
#
# Section 16.1 found LoRA's memory floor: the frozen weights. Dettmers et al. (2023, "QLoRA:
# Efficient Finetuning of Quantized LLMs") store them in 4-bit NF4 (chapter 15), dequantise
# each block on the fly in the forward and backward passes, and train 16-bit adapters on top.
# Gradients flow *through* the frozen quantised weights to the adapters, but no weight
# gradient or optimiser state is kept for them.
#
# For a concrete size: LLaMA-7B (Touvron et al., 2023, "LLaMA: Open and Efficient Foundation
# Language Models") has $d = 4096$, 32 layers, an MLP width of 11 008 and 32 000 tokens, with
# untied input and output embeddings. Its parameter count follows from that:

# %%
V, dm, L, dff = 32_000, 4096, 32, 11_008
per_layer = 4 * dm * dm + 3 * dm * dff + 2 * dm  # attention, SwiGLU MLP, two RMSNorm gains
n_llama = L * per_layer + 2 * V * dm + dm  # + embeddings, LM head, final norm
n_adapter = L * 2 * lora_parameter_count(dm, dm, 8)  # r = 8 on q_proj and v_proj
print(f"LLaMA-7B: {n_llama:,} parameters; LoRA r=8 on q, v: {n_adapter:,} ({n_adapter / n_llama:.3%})")

# %% [markdown]
# The memory of the training state (weights, gradients, master weights and AdamW's two
# moments; activations come on top and depend on batch and sequence length), in mixed
# precision as in section 16.1: $t = 16$ bytes per trained parameter, 2 per frozen 16-bit
# weight, and for QLoRA's frozen weights 4 bits (0.5 bytes; NF4's block constants add about
# 0.5 bit per weight, or 0.127 with QLoRA's double quantisation, not counted here):
#
# * full fine-tuning: $16\,N$ bytes;
# * LoRA: $2\,N + 16\,N_{\text{adapter}}$;
# * QLoRA: $0.5\,N + 16\,N_{\text{adapter}}$.

# %%
memory = {"full fine-tuning": adamw_training_memory(n_llama, 0),
          "LoRA, 16-bit base": adamw_training_memory(n_adapter, n_llama),
          "QLoRA, NF4 base": adamw_training_memory(n_adapter, n_llama, frozen_bytes=0.5)}
print(f"{'':18s} {'bytes':>15s} {'GiB':>7s}")
for name, mem in memory.items():
    print(f"{name:18s} {int(mem['total']):15,d} {mem['total'] / 2**30:7.2f}")
print(f"adapter state (trained parameters only): {int(t_bytes) * n_adapter / 2**20:.0f} MiB")
assert memory["full fine-tuning"]["total"] == int(t_bytes) * n_llama  # chapter 10: 16 bytes per parameter
assert memory["QLoRA, NF4 base"]["total"] == n_llama / 2 + int(t_bytes) * n_adapter

# %% [markdown]
# Full fine-tuning of a 7B model needs about 100 GiB for the training state alone, twelve of
# every sixteen bytes in the float32 master weights and moments that mixed precision cannot do
# without (chapter 10: a 16-bit weight rounds small updates away). LoRA brings that to the
# 12.55 GiB of the frozen 16-bit weights plus 64 MiB of adapter state, and QLoRA to about
# 3.2 GiB: small enough, with activations, for one consumer GPU. The float32 copies weigh on
# full fine-tuning alone, since LoRA keeps them only for its few trained parameters.
#
# **Training on a 4-bit base.** Memory is only half of the claim; the other half is that
# the adapters learn as well on the rounded base. `quantize_frozen_nf4` rounds every linear
# weight of the book's model to NF4 in groups of 64 (chapter 15's `quantize_nf4`; embeddings,
# biases and norms stay in full precision, as in QLoRA), and the same LoRA fine-tune as in
# section 16.3 then runs on top of it.

# %%
show_source(quantize_frozen_nf4)

# %%
nf4_base = quantize_frozen_nf4(copy.deepcopy(base))
qlora = fine_tune(apply_lora(quantize_frozen_nf4(copy.deepcopy(base)), ["q_proj", "v_proj"],
                             r=4, alpha=8, generator=g), lr=1e-2)
nf4_xml, nf4_other = val_loss(nf4_base, xml_val), val_loss(nf4_base, other_ids)
q_xml, q_other = val_loss(qlora, xml_val), val_loss(qlora, other_ids)
print(f"{'':22s} {'XML val loss':>13s}")
for name, loss in [("base model", b_xml), ("NF4 base, no adapter", nf4_xml),
                   ("LoRA on 16-bit base", l_xml), ("QLoRA (LoRA on NF4)", q_xml)]:
    print(f"{name:22s} {loss:13.2f}")

# %%
checks = Checks("QLoRA on the book's model")
checks.true("NF4 rounding costs < 0.05 nats (XML, other)",
            nf4_xml - b_xml < 0.05 and nf4_other - b_other < 0.05)
checks.true("QLoRA lowers the XML loss by > 0.2 nats", b_xml - q_xml > 0.2)
checks.true("QLoRA within 0.05 nats of 16-bit LoRA", abs(q_xml - l_xml) < 0.05)
checks

# %% [markdown]
# Rounding the frozen weights to 4 bits costs about a hundredth of a nat, and the adapters
# trained on the rounded base reach the loss of those trained on the full-precision one: the
# adapters also learn to compensate for part of the rounding error, since they see its
# effect in every gradient. This is Dettmers et al.'s finding at 7–65B parameters (their
# section 4: 4-bit QLoRA matches 16-bit LoRA and full fine-tuning), seen here at 2M.

# %% [markdown]
# ## 16.6 Three refinements: rsLoRA, LoRA+ and DoRA
#
# LoRA's recipe, the factor $\alpha/r$, one learning rate for $A$ and $B$, and a plain sum
# $W + \Delta W$, has been revised since. Three revisions are now options of `peft` and of
# the book's `LoRALinear`; each follows from a short argument.
#
# **rsLoRA: the scaling $\gamma_r$.** Write $\gamma_r$ for the factor in front of $BA$.
# Take one step of plain gradient descent, of size $\eta$, from $B = 0$ on a loss whose
# gradient at the layer's output is $g$. Section 16.1 found $\partial\mathcal L/\partial B = \gamma_r\, g\,(Ax)^\top$
# and $\partial\mathcal L/\partial A = 0$, so the step sets $B_1 = -\eta\gamma_r\, g\,(Ax)^\top$
# and changes the output by
#
# $$ \Delta h = \gamma_r B_1 A x = -\eta\,\gamma_r^2\,\lVert Ax\rVert^2\, g . $$
#
# $A$ has $r$ rows of independent entries of variance $\sigma_A^2$, so
# $\mathbb E\lVert Ax\rVert^2 = r\,\sigma_A^2\lVert x\rVert^2$ grows like $r$, and the first
# step moves the output by an amount proportional to $\gamma_r^2\, r$. With Hu et al.'s
# $\gamma_r = \alpha/r$ that is $\alpha^2/r$: the larger the rank, the less a step at a given
# learning rate does, so a higher rank learns more slowly instead of better. With
# $\gamma_r = \alpha/\sqrt r$ it is $\alpha^2$ at every rank. Kalajdzievski (2023, "A Rank
# Stabilization Scaling Factor for Fine-Tuning with LoRA") proves the general statement in
# the limit of large rank: $\gamma_r \propto 1/\sqrt r$ is the scaling under which neither
# the adapter's outputs nor its gradients vanish or blow up as $r$ grows. (The one-step
# argument is for plain gradient descent. Adam moves every entry of $B$ by about $\eta$
# whatever the gradient's size, so its first step is $\gamma_r\eta\lVert Ax\rVert_1$ in size,
# which grows like $\gamma_r r$; what happens over a whole run with Adam is what the paper's
# experiments measure.)
# SymPy checks the step on section 16.1's small layer and takes the expectation for `peft`'s
# initialisation of $A$, uniform on $\pm 1/\sqrt{d_{in}}$:

# %%
eta = sp.Symbol("eta", positive=True)
B1 = -eta * dB.subs({b: 0 for b in B})  # one gradient step from B = 0
step = (h.subs(dict(zip(B, B1, strict=True))) - W * x).applyfunc(sp.simplify)
assert sp.simplify(step + eta * (alpha / r_) ** 2 * (A * x).dot(A * x) * gvec) == sp.zeros(3, 1)
u, c, n_in, x2 = sp.symbols("u c d_in ||x||^2", positive=True)
var_A = sp.integrate(u**2 / (2 * c), (u, -c, c)).subs(c, 1 / sp.sqrt(n_in))  # 1 / (3 d_in)
expected_Ax2 = r_ * var_A * x2  # r rows, each a sum of d_in independent terms
for name, gamma in [("alpha/r", alpha / r_), ("alpha/sqrt(r)", alpha / sp.sqrt(r_))]:
    size = sp.simplify(eta * gamma**2 * expected_Ax2)
    print(f"gamma = {name:14s} E|Δh| / |g| = {size}   as r → ∞: {sp.limit(size, r_, sp.oo)}")

# %% [markdown]
# The same on a real layer ($256 \to 192$, non-square): one step on $B$ at $\eta = 0.01$ for
# ranks from 1 to 192, each averaged over 32 draws of $A$, with both scalings at
# $\alpha = 8$; the prediction is $\eta\gamma_r^2\, r\lVert x\rVert^2\lVert g\rVert/(3 d_{in})$.

# %%
x_in = torch.randn(256, generator=torch.Generator().manual_seed(1), dtype=f64)
g_out = torch.randn(192, generator=torch.Generator().manual_seed(2), dtype=f64)


def first_step(r, use_rslora, seed, lr=0.01):
    """|Δh| after one SGD step on B from B = 0, and its distance from -η γ² |Ax|² g."""
    layer = LoRALinear(nn.Linear(256, 192, dtype=f64), r, 8.0, use_rslora=use_rslora,
                       generator=torch.Generator().manual_seed(seed))
    h0 = layer(x_in)
    (g_out @ h0).backward()
    with torch.no_grad():
        layer.lora_B -= lr * layer.lora_B.grad
        dh = layer(x_in) - h0
        exact = -lr * layer.scaling**2 * (layer.lora_A @ x_in).pow(2).sum() * g_out
    return float(dh.norm()), float((dh - exact).abs().max())


ranks = (1, 4, 16, 64, 192)
step_size, worst = {}, 0.0
for rs in (False, True):
    for rank in ranks:
        runs = [first_step(rank, rs, seed) for seed in range(100, 132)]  # A's seeds: not x's or g's
        step_size[rs, rank] = sum(s for s, _ in runs) / len(runs)
        worst = max(worst, *(e for _, e in runs))
print(f"{'r':>4s} {'α/r: |Δh|':>10s} {'predicted':>10s} {'α/√r: |Δh|':>11s} {'predicted':>10s}")
for rank in ranks:
    pred = [0.01 * lora_scaling(rank, 8.0, rs) ** 2 * rank * float(x_in @ x_in) / (3 * 256)
            * float(g_out.norm()) for rs in (False, True)]
    print(f"{rank:4d} {step_size[False, rank]:10.3g} {pred[0]:10.3g} {step_size[True, rank]:11.3g} {pred[1]:10.3g}")

# %%
rs_sizes = [step_size[True, rank] for rank in ranks]
checks = Checks("rsLoRA: the first step's size against the rank")
checks.true("Δh = -η γ² |Ax|² g in every run (max difference < 1e-12)", worst < 1e-12)
checks.true("α/r: the step shrinks > 50-fold from r = 1 to r = 192",
            step_size[False, 1] > 50 * step_size[False, 192])
checks.true("α/√r: largest / smallest step over the ranks < 1.5", max(rs_sizes) < 1.5 * min(rs_sizes))
checks

# %% [markdown]
# The measured steps follow the prediction: with $\alpha/r$ the first step at rank 192 does
# a couple of hundred times less than at rank 1; with $\alpha/\sqrt r$ it is about the same at
# every rank (the remaining spread at small $r$ is the randomness of $A$: $\lVert Ax\rVert^2$
# is a sum of only $r$ terms). Only the factor changes: `use_rslora=True` in `peft` and
# here, and the two agree (the checks at the end of this section).
#
# **LoRA+: one learning rate is not enough.** Once $B \ne 0$ both factors train. By the
# gradients of section 16.1, a step of size $\eta_A$ on $A$ lowers the loss, to first order,
# by $\eta_A\lVert\partial\mathcal L/\partial A\rVert^2$ and a step on $B$ by
# $\eta_B\lVert\partial\mathcal L/\partial B\rVert^2$, where
#
# $$ \Big\lVert\frac{\partial\mathcal L}{\partial A}\Big\rVert^2
#    = \gamma_r^2\,\lVert B^\top g\rVert^2\,\lVert x\rVert^2 , \qquad
#    \Big\lVert\frac{\partial\mathcal L}{\partial B}\Big\rVert^2
#    = \gamma_r^2\,\lVert g\rVert^2\,\lVert Ax\rVert^2 . $$
#
# An input with entries of order one has $\lVert x\rVert^2 \approx d_{in}$, while
# $\lVert Ax\rVert^2 \approx r\lVert x\rVert^2/(3d_{in}) \approx r/3$ does not grow with the
# width. At one learning rate for both, $A$'s steps therefore weigh about $d_{in}$ times more
# than $B$'s, and as the model grows $B$ falls behind. (With Adam, whose steps are about
# $\eta$ in every entry, the first-order decrease is $\eta\lVert\nabla\rVert_1$ instead, and
# the same count gives the same factor.) Hayou, Ghosh and Yu (2024, "LoRA+: Efficient Low
# Rank Adaptation of Large Models") make this precise in the limit of large width and conclude
# that $\eta_B/\eta_A$ must grow with it; in practice one sets $\eta_B = \lambda\,\eta_A$ with a
# fixed ratio $\lambda$ well above one. SymPy checks both norms on the small layer, and a
# layer of growing input width measures the ratio (32 draws of $A$ and $x$ for each width,
# the same $B$ and $g$):

# %%
for grad, expected in [(dA, (alpha / r_) ** 2 * (B.T * gvec).dot(B.T * gvec) * x.dot(x)),
                       (dB, (alpha / r_) ** 2 * gvec.dot(gvec) * (A * x).dot(A * x))]:
    assert sp.expand(sum(e**2 for e in grad) - expected) == 0  # the squared norms above
B_fixed = torch.randn(32, 8, generator=torch.Generator().manual_seed(3), dtype=f64) / 8**0.5


def grad_norms(d_in, seed):
    """|∂L/∂A|², |∂L/∂B|² for L = g·h on a d_in → 32 layer, r = 8, with the fixed B."""
    gen_ = torch.Generator().manual_seed(seed)
    layer = LoRALinear(nn.Linear(d_in, 32, dtype=f64), 8, 16.0, generator=gen_)
    with torch.no_grad():
        layer.lora_B.copy_(B_fixed)
    x_ = torch.randn(d_in, generator=gen_, dtype=f64)
    (torch.ones(32, dtype=f64) @ layer(x_)).backward()
    return float(layer.lora_A.grad.pow(2).sum()), float(layer.lora_B.grad.pow(2).sum())


widths = (64, 256, 1024)
ratio = {}
for w in widths:
    norms = [grad_norms(w, seed) for seed in range(100, 132)]
    ratio[w] = sum(a for a, _ in norms) / sum(b for _, b in norms)
    print(f"d_in = {w:4d} ({w // 64:2d}× the narrowest): |∂L/∂A|² / |∂L/∂B|² = {ratio[w]:6.1f}, "
          f"{ratio[w] / ratio[64]:4.1f}× the narrowest's")

# %%
checks = Checks("LoRA+: A's gradient outgrows B's with the input width")
checks.true("16× the width: the ratio grows 12× to 20×", 12 < ratio[1024] / ratio[64] < 20)
checks.true("4× the width: the ratio grows 3× to 5×", 3 < ratio[256] / ratio[64] < 5)
checks

# %% [markdown]
# The ratio grows in proportion to $d_{in}$, as derived. `loraplus_param_groups(model, lr,
# lr_ratio)` builds the two optimizer groups: the $A$ matrices at $\eta$, the $B$ matrices
# (and any trained vector, such as DoRA's magnitudes below) at $\lambda\eta$, the grouping of
# `peft`'s `create_loraplus_optimizer`.
#
# **DoRA: magnitude and direction.** Liu et al. (2024, "DoRA: Weight-Decomposed Low-Rank
# Adaptation") split each output unit's weight vector $w_j$ (a row of the $d_{out}\times d_{in}$
# matrix) into a length $m_j$ and a direction, and let LoRA change only the direction:
#
# $$ W' = \operatorname{diag}\!\Big(\frac{m}{\lVert V\rVert}\Big)\, V, \qquad
#    V = W + \gamma_r BA, \qquad m \text{ trained, initialised to } \lVert W\rVert , $$
#
# with the norms taken row by row, so that $W' = W$ at the start. (The paper writes the weight
# as $d_{in}\times d_{out}$ and calls these column norms; `peft` computes them over `dim=1` of
# the `(d_out, d_in)` weight, one per output unit, and so does the book.) The derivative of
# $m\,v/\lVert v\rVert$ with respect to $v$ is
# $\frac{m}{\lVert v\rVert}\big(I - \frac{vv^\top}{\lVert v\rVert^2}\big)$: it removes the part
# of the gradient along $v$, since lengthening $v$ does not change $W'$. DoRA drops that
# projection: its section 4.3 treats $\lVert V\rVert$ as a constant in the backward pass, which
# saves the memory of differentiating through the norm. `peft` does the same
# (`weight_norm.detach()`), and so does the book's layer. SymPy derives the Jacobian for
# $d_{in} = 3$:

# %%
v = sp.Matrix(sp.symbols("v0:3", real=True))
m_ = sp.Symbol("m", positive=True)
norm_v = sp.sqrt(v.dot(v))
J = (m_ * v / norm_v).jacobian(v)
assert sp.simplify(J - m_ / norm_v * (sp.eye(3) - v * v.T / norm_v**2)) == sp.zeros(3, 3)
assert sp.simplify(J * v) == sp.zeros(3, 1)  # lengthening v leaves W' unchanged
print("d(m v/|v|)/dv = (m/|v|) (I - v v^T/|v|^2), and it maps v to 0: verified")

# %% [markdown]
# **The peer.** The tiny Llama of section 16.2, now with `use_rslora=True` and
# `use_dora=True` in `peft` and in `apply_lora`. After copying `peft`'s adapters (with a
# non-zero $B$ and magnitudes moved off their initial values, so that $m/\lVert V\rVert \ne 1$)
# into the book's model, the logits, the gradients of $A$, $B$ and $m$, three steps of AdamW
# with LoRA+'s groups ($\lambda = 8$) against `create_loraplus_optimizer`, and the merged
# weights must agree. Adam divides each gradient by its own running size, so a gradient near
# zero that differs by round-off can move a weight by a whole step: for this comparison
# Hugging Face's RMSNorm computes in float64 instead of rounding through float32 (the patch
# the tests use), and the two models then agree to float64 round-off.

# %%
def rms_norm_float64(self, hidden):
    """LlamaRMSNorm without its cast to float32."""
    return self.weight * hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)


def peft_pair(**options):
    """The tiny Llama wrapped by peft with ``options``, the book's copy with the same adapters."""
    torch.manual_seed(0)
    hf_ = LlamaForCausalLM(cfg)
    randomize_parameters_(hf_, 0.1, torch.Generator().manual_seed(1))
    hf_ = hf_.double().eval()
    ours_ = apply_lora(from_hf(hf_).eval(), ["q_proj", "v_proj"], r=4, alpha=8, **options)
    pm_ = get_peft_model(hf_, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], **options))
    mine = dict(ours_.named_parameters())
    pairs_, gen_ = [], torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in pm_.named_parameters():
            if "lora_" not in name:
                continue
            if "magnitude" in name:  # m away from |V|, so that m / |V| != 1
                p.mul_(1 + 0.2 * torch.randn(p.shape, generator=gen_, dtype=f64))
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen_, dtype=f64))
            key = ("blocks." + name.split("layers.")[1].replace("self_attn.", "attn.")
                   .replace("lora_magnitude_vector", "lora_magnitude").removesuffix(".default.weight"))
            mine[key].copy_(p)
            pairs_.append((p, mine[key]))
    return pm_, ours_, pairs_


rms_norm_hf = LlamaRMSNorm.forward
LlamaRMSNorm.forward = rms_norm_float64  # undone at the end of the comparison
pm_d, ours_d, pairs_d = peft_pair(use_rslora=True, use_dora=True)
n_trainable_hf = pm_d.get_nb_trainable_parameters()[0]
logits_hf, logits_ours = pm_d(input_ids=ids_hf).logits, ours_d(ids_hf)
for logits in (logits_hf, logits_ours):  # the same loss on each model's logits
    logits.sum().backward()

# %%
opt_hf = create_loraplus_optimizer(pm_d, torch.optim.AdamW, lr=2e-3, loraplus_lr_ratio=8.0)
opt_ours = torch.optim.AdamW(loraplus_param_groups(ours_d, lr=2e-3, lr_ratio=8.0))
lr_of = [{id(p): grp["lr"] for grp in opt.param_groups for p in grp["params"]} for opt in (opt_hf, opt_ours)]
grad_err = max(float((a.grad - b.grad).abs().max()) for a, b in pairs_d)
target_hf = torch.randint(0, 50, ids_hf.shape, generator=torch.Generator().manual_seed(6))
for _ in range(3):
    for opt, model_fn in ((opt_hf, lambda: pm_d(input_ids=ids_hf).logits), (opt_ours, lambda: ours_d(ids_hf))):
        opt.zero_grad()
        nn.functional.cross_entropy(model_fn().flatten(0, 1), target_hf.flatten()).backward()
        opt.step()
scaling_hf = pm_d.base_model.model.model.layers[0].self_attn.q_proj.scaling["default"]
with torch.no_grad():
    step_err = max(float((a - b).abs().max()) for a, b in pairs_d)
    merged_d = pm_d.merge_and_unload()
    merge_lora(ours_d)
    merged_err = float((merged_d(ids_hf).logits - ours_d(ids_hf)).abs().max())
LlamaRMSNorm.forward = rms_norm_hf

# %%
checks = Checks("rsLoRA, LoRA+ and DoRA against peft (tiny Llama, float64)")
checks.equal("rsLoRA scaling α/√r", scaling_hf, ours_d.blocks[0].attn.q_proj.scaling)
checks.equal("trainable parameters (A, B and m)", n_trainable_hf, count_trainable_parameters(ours_d))
logit_err = float((logits_hf - logits_ours).detach().abs().max())
checks.true("DoRA logits: max difference < 1e-12", logit_err < 1e-12)
checks.true("DoRA gradients of A, B and m: max difference < 1e-12", grad_err < 1e-12)
checks.equal("LoRA+ learning rate of every adapter tensor", [lr_of[0][id(a)] for a, _ in pairs_d],
             [lr_of[1][id(b)] for _, b in pairs_d])
checks.true("adapters after 3 AdamW steps with LoRA+ groups: max difference < 1e-12", step_err < 1e-12)
checks.true("merged DoRA model's logits: max difference < 1e-12", merged_err < 1e-12)
checks

# %% [markdown]
# ## Summary
#
# * LoRA freezes $W$ and learns $\Delta W = \frac{\alpha}{r}BA$ with $B = 0$ at the start: the
#   adapted model begins as the base model, $\Delta W$ has rank at most $r$, and it costs
#   $r(d_{in}+d_{out})$ parameters. At $B = 0$ only $B$ receives a gradient.
# * With mixed-precision AdamW (16 bytes per trained parameter, 2 per frozen one) its
#   training memory per matrix is $\frac{2d_{in}d_{out} + 16r(d_{in}+d_{out})}{16d_{in}d_{out}}$
#   of full fine-tuning's, as a measured training step confirms, tending to $1/8$: the frozen
#   weights remain, and QLoRA shrinks them to 4 bits.
# * The book's `LoRALinear` leaves its model bit-for-bit unchanged at initialisation, merges
#   and unmerges exactly to round-off, and agrees with `peft`.
# * On the book's model, adapting to unseen XML docstrings, LoRA with 0.6 % of the parameters
#   recovers part of what full fine-tuning gains; the full update's spectrum is concentrated
#   in a few directions, with a long tail that a low rank drops. The same adapters trained on
#   the model rounded to NF4 (QLoRA) reach the same loss as on the full-precision base.
# * rsLoRA's $\alpha/\sqrt r$ keeps the size of a training step the same at every rank, where
#   $\alpha/r$ shrinks it like $1/r$; LoRA+ gives $B$ a larger learning rate because $A$'s
#   gradient grows with the input width and $B$'s does not; DoRA trains a magnitude per output
#   unit and lets the adapter turn the direction, with the norm held constant in the backward
#   pass. All three equal `peft`'s `use_rslora`, `create_loraplus_optimizer` and `use_dora`.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/16_lora.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 16` writes a stub
# of every function, `llmbook grade 16` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_16.py` runs
# the same checks on the reference.
#
# 1. (★) **Break-even ranks.** Find, with SymPy, the rank $r$ at which an adapter has as many
#    parameters as $W$ itself, and the rank at which LoRA's mixed-precision training memory
#    $\rho$ reaches full fine-tuning's. Evaluate both for a $4096\times 11008$ MLP matrix.
#    Which of the two ranks is smaller, and why? How does the answer change in float32?
# 2. (★★) **The best rank-$r$ adapter.** Write `best_low_rank(delta, r)`, which returns
#    LoRA factors $B$ ($d_{out}\times r$) and $A$ ($r \times d_{in}$) with $BA$ the truncated
#    SVD of $\Delta W$, and check the Eckart–Young statement: the squared Frobenius error is
#    the sum of the discarded $\sigma_i^2$, and no other rank-$r$ product does better (try the
#    projection of $\Delta W$ onto random $r$-dimensional subspaces).
# 3. (★★) **Two adapters.** Merge two adapters of ranks $r_1$ and $r_2$ into the same $W$, one
#    after the other. Show that the result does not depend on the order, that the combined
#    update has rank at most $r_1 + r_2$, and that it equals a single adapter of rank
#    $r_1 + r_2$ whose $B$ and $A$ stack those of the two (with the scalings folded into $B$).

# %%
from llmbook.workbench import grade

grade("16", globals())
