# %% [markdown]
# # 21 Mixture of experts
#
# A transformer spends about two thirds of its parameters, and of its FLOPs per token, in the
# feed-forward layers. A *mixture-of-experts* (MoE) layer replaces that one layer by $N$
# feed-forward **experts** and a small **router** that sends each token to only $k$ of them
# (Shazeer et al., 2017, "Outrageously Large Neural Networks: The Sparsely-Gated
# Mixture-of-Experts Layer"). The model then holds $N$ experts' worth of parameters but pays,
# per token, for $k$: Mixtral 8x7B has 47B parameters and uses 13B per token (Jiang et al.,
# 2024, "Mixtral of Experts"). This chapter:
#
# 1. **derives** the router's top-$k$ gate, the Switch Transformer's load-balancing loss
#    $\alpha N\sum_i f_iP_i$ (its value under uniform routing, its gradient, its minimum), the
#    router z-loss of ST-MoE, and the fraction of tokens an expert of fixed *capacity* drops
#    when routing is uniform (the expected overflow of a binomial load);
# 2. **implements** them in `llmbook.scale.moe`, with shared experts (DeepSeekMoE) and the
#    bias-based, auxiliary-loss-free balancing of DeepSeek-V3;
# 3. **verifies** the layer against Hugging Face's Mixtral, Qwen2-MoE and DeepSeek-V3 MoE
#    blocks and the balancing loss against `transformers`' own `load_balancing_loss_func`;
#    the drop fraction against simulation and against the layer itself;
# 4. **explores** an MoE language model against a dense one with the same *active*
#    parameters on the book's text (shipped training curves), the expert load during
#    training with and without balancing, and the all-to-all traffic of expert parallelism;
# 5. **derives** why a top-1 gate renormalised over its one expert gives the router no
#    gradient from the language-model loss, and shows it with autograd on the trained model.

# %%
import copy
import json
import math

import matplotlib.pyplot as plt
import sympy as sp
import sympy.stats as ss
import torch
from IPython.display import display
from scipy import stats
from transformers import DeepseekV3Config, MixtralConfig, Qwen2MoeConfig
from transformers import logging as hf_logging
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
from transformers.models.mixtral.modeling_mixtral import (
    MixtralSparseMoeBlock,
    load_balancing_loss_func,
)
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

from llmbook.nbtools import Checks, save_figure, seed_everything, show_source
from llmbook.paths import data_path
from llmbook.scale.moe import (
    MoELayer,
    all_to_all_bytes,
    capacity_keep_mask,
    expected_drop_fraction,
    expert_capacity,
    expert_load_fractions,
    from_hf_moe_block,
    gate_jacobian_symbolic,
    lm_router_gradients,
    load_balancing_loss,
    route,
    router_z_loss,
    update_expert_bias,
)
from llmbook.scale.moe_training import (
    active_parameters,
    load_moe_vs_dense,
    moe_layers,
    moe_lm,
    summarize_seeds,
    train_variant_seed,
)
from llmbook.text.corpus import load_stdlib_docs
from llmbook.training.pretrained import book_model

g = seed_everything(0)
torch.set_num_threads(1)
f64 = torch.float64

# %% [markdown]
# ## 21.1 The router and the top-$k$ gate
#
# For a token $x\in\mathbb R^d$ the router computes one logit per expert, $z = W_r x$ with
# $W_r\in\mathbb R^{N\times d}$, and the probabilities $s = \mathrm{softmax}(z)$. The layer
# keeps the $k$ largest, $S = \operatorname{top}_k(s)$, renormalises them, and mixes the
# chosen experts' outputs:
#
# $$ y = \sum_{i\in S} g_i\,E_i(x), \qquad g_i = \frac{s_i}{\sum_{j\in S} s_j}. $$
#
# Two facts make this cheap and well defined. Softmax is monotone, so the top-$k$ of $s$ are
# the top-$k$ of $z$; and the renormalised gate is the softmax of the *selected logits
# alone*: the $N-k$ others cancel. SymPy checks the second for $N = 4$, $k = 2$, $S = \{0, 2\}$:

# %%
z = sp.symbols("z0:4", real=True)
s = [sp.exp(zi) / sum(sp.exp(zj) for zj in z) for zi in z]
S = [0, 2]
gate = [s[i] / sum(s[j] for j in S) for i in S]
softmax_of_selected = [sp.exp(z[i]) / sum(sp.exp(z[j]) for j in S) for i in S]
assert all(sp.simplify(a - b) == 0 for a, b in zip(gate, softmax_of_selected, strict=True))
display(sp.Eq(sp.Symbol("g_0"), sp.simplify(gate[0])))

# %% [markdown]
# The package's `route` does this for $n$ tokens at once. It also takes the two options later
# sections need: sigmoid scores instead of softmax (DeepSeek-V3) and a *bias* that moves only
# the selection (section 21.5).

# %%
show_source(route)

# %%
z_num = torch.randn(6, 4, generator=g, dtype=f64)
r = route(z_num, 2)
gate_fn = sp.lambdify(z, gate, "math")
checks = Checks("top-2 gate: SymPy against route")
checks.equal("top-2 of softmax = top-2 of logits", torch.topk(z_num, 2).indices, r.indices)
z_sel = torch.tensor([[1.3, -0.2, 0.4, -1.0]], dtype=f64)  # top-2 = {0, 2}
checks.close("gates = SymPy softmax of the selected logits", torch.tensor(gate_fn(*z_sel[0].tolist()), dtype=f64),
             route(z_sel, 2).weights[0], tol=1e-15)
checks.close("gates sum to 1 (6 tokens)", torch.ones(6, dtype=f64), r.weights.sum(-1), tol=1e-15)
checks

# %% [markdown]
# ## 21.2 The load-balancing loss
#
# Left alone, a router tends to collapse onto a few experts: the experts it prefers get more
# gradient, improve, and are preferred more (Shazeer et al., 2017, section 4). Overloaded
# experts are also what limits speed, since with expert parallelism every device waits for
# the busiest one. The Switch Transformer (Fedus, Zoph & Shazeer, 2021, "Switch Transformers:
# Scaling to Trillion Parameter Models with Simple and Efficient Sparsity", eq. 4–6) adds
#
# $$ \mathcal L_{\text{bal}} = \alpha\,N\sum_{i=1}^N f_i\,P_i, \qquad
#    f_i = \frac{\#\{\text{assignments to } i\}}{nk}, \qquad
#    P_i = \frac1n\sum_{x} s_i(x), $$
#
# over a batch of $n$ tokens: $f_i$ is the share of the top-$k$ assignments that expert $i$
# receives (a count: no gradient flows through it), $P_i$ the router's mean probability for
# it (differentiable). Three things to derive.
#
# **Its value under uniform routing.** With $f_i = P_i = 1/N$ the loss is
# $\alpha N\cdot N\cdot\frac1{N^2} = \alpha$, whatever $N$ and $k$: the factor $N$ is there
# to make that so.

# %%
alpha, N_ = sp.symbols("alpha N", positive=True)
i_ = sp.symbols("i", integer=True)
uniform = alpha * N_ * sp.summation((1 / N_) * (1 / N_), (i_, 1, N_))
assert sp.simplify(uniform - alpha) == 0
display(sp.Eq(sp.Symbol(r"\mathcal{L}_{bal}(f = P = 1/N)"), sp.simplify(uniform)))

# %% [markdown]
# **Its gradient.** With $f$ fixed, $\partial\mathcal L_{\text{bal}}/\partial P_i = \alpha N f_i$:
# the busiest expert's probability is pushed down the hardest. Through the softmax of one
# token $t$ (with $P_i = \frac1n\sum_t s_{ti}$) the chain rule gives
#
# $$ \frac{\partial\mathcal L_{\text{bal}}}{\partial z_{tj}} = \frac{\alpha N}{n}\,s_{tj}
#    \Big(f_j - \sum_i f_i s_{ti}\Big), $$
#
# positive, so that gradient descent lowers $z_{tj}$, exactly when expert $j$'s load exceeds the
# load averaged under that token's own probabilities. SymPy derives it for $N = 3$ and one
# token ($n = 1$), and the package's loss, differentiated by autograd in float64, agrees:

# %%
zs, fs = sp.symbols("z0:3", real=True), sp.symbols("f0:3", positive=True)
sm = [sp.exp(zi) / sum(sp.exp(zj) for zj in zs) for zi in zs]
L_bal = alpha * 3 * sum(fi * si for fi, si in zip(fs, sm, strict=True))
grad = [sp.diff(L_bal, zj) for zj in zs]
derived = [alpha * 3 * sm[j] * (fs[j] - sum(fi * si for fi, si in zip(fs, sm, strict=True))) for j in range(3)]
assert all(sp.simplify(a - b) == 0 for a, b in zip(grad, derived, strict=True))
assert all(sp.diff(L_bal.subs(dict(zip(sm, sp.symbols("P0:3"), strict=True))), sp.Symbol(f"P{i}")) == alpha * 3 * fs[i]
           for i in range(3))

# %%
zt = torch.randn(10, 3, generator=g, dtype=f64, requires_grad=True)
load_balancing_loss(zt, top_k=1, alpha=0.5).backward()
f_num = expert_load_fractions(route(zt.detach(), 1).indices, 3)
grad_fn = sp.lambdify([*zs, *fs, alpha], derived, "math")
by_sympy = torch.tensor([grad_fn(*row.tolist(), *f_num.tolist(), 0.5) for row in zt.detach()], dtype=f64) / 10
checks = Checks("Switch loss gradient: SymPy against autograd (float64)")
checks.close("dL/dz for 10 tokens, N = 3", by_sympy, zt.grad, tol=1e-15)
checks.true("the overloaded expert's logits are pushed down", bool((zt.grad[:, f_num.argmax()] > 0).all()))
checks

# %% [markdown]
# **Why it pushes towards balance.** For a fixed $f$ the loss is *linear* in $P$, so on its own
# it would pile all probability on the least-loaded expert; it is the feedback that makes it
# balance: a router whose probabilities shift also shifts its choices, so $f$ follows $P$. In
# the limit where the assignment follows the probabilities, $f = P$ and
# $\mathcal L_{\text{bal}} = \alpha N\sum_i P_i^2$. Minimising that on the simplex
# $\sum_i P_i = 1$ with a Lagrange multiplier:

# %%
P = sp.symbols("P0:4", positive=True)
lam = sp.Symbol("lambda")
lagrangian = alpha * 4 * sum(p**2 for p in P) - lam * (sum(P) - 1)
sol = sp.solve([sp.diff(lagrangian, v) for v in (*P, lam)], [*P, lam], dict=True)[0]
assert all(sol[p] == sp.Rational(1, 4) for p in P)
hessian = sp.hessian(alpha * 4 * sum(p**2 for p in P), P)
assert hessian == 8 * alpha * sp.eye(4)  # positive definite: the stationary point is the minimum
minimum = (alpha * 4 * sum(p**2 for p in P)).subs(sol)
assert minimum == alpha
display(sol, sp.Eq(sp.Symbol(r"\min\ \alpha N\sum P_i^2"), minimum))

# %% [markdown]
# The unique minimum is uniform, $P_i = 1/N$, with value $\alpha$ (Cauchy–Schwarz says the same:
# $\sum_i P_i^2 \ge (\sum_i P_i)^2/N = 1/N$). The worst case is collapse: every token sent to
# one expert with probability one gives $\alpha N$. The package's loss reproduces both ends:
# logits that are every cyclic shift of one vector give a perfectly balanced batch.

# %%
v = torch.tensor([2.0, 0.5, -1.0, 0.0, 1.0, -0.5, 0.3, 1.5], dtype=f64)
balanced = torch.stack([v.roll(i) for i in range(8)])  # f = P = 1/8 exactly
collapsed = torch.tensor([[60.0] + [0.0] * 7] * 8, dtype=f64)  # all to expert 0, P_0 = 1 - 7e-26
checks = Checks("Switch loss: uniform and collapsed routing (alpha = 0.01, N = 8)")
for k in (1, 2):
    checks.close(f"balanced batch, top-{k}: alpha", 0.01, load_balancing_loss(balanced, k, alpha=0.01), tol=1e-15)
checks.close("collapsed onto one expert, top-1: alpha N", 0.08, load_balancing_loss(collapsed, 1, alpha=0.01),
             tol=1e-15)
checks

# %%
show_source(load_balancing_loss)

# %% [markdown]
# ## 21.3 The router z-loss
#
# Large router logits make the softmax's exponentials overflow in low precision and the
# router's decisions brittle. ST-MoE (Zoph et al., 2022, "ST-MoE: Designing Stable and
# Transferable Sparse Expert Models", eq. 5) penalises their size with
#
# $$ \mathcal L_z = \frac1n\sum_{x}\Big(\log\sum_{j=1}^N e^{z_j(x)}\Big)^2 , $$
#
# scaled by $10^{-3}$. The softmax itself is unchanged by adding a constant to all logits,
# but the z-loss is not, and its gradient pulls the logsumexp towards 0:
# $\partial\mathcal L_z/\partial z_j = \frac2n\,\mathrm{lse}(z)\,\mathrm{softmax}(z)_j$.

# %%
lse = sp.log(sum(sp.exp(zi) for zi in zs))
grad_z = [sp.diff(lse**2, zj) for zj in zs]
assert all(sp.simplify(gz - 2 * lse * smj) == 0 for gz, smj in zip(grad_z, sm, strict=True))
zt = torch.randn(5, 3, generator=g, dtype=f64, requires_grad=True)
router_z_loss(zt).backward()
gz_fn = sp.lambdify(zs, grad_z, "math")
checks = Checks("router z-loss: SymPy gradient against autograd")
checks.close("dL_z/dz for 5 tokens, N = 3", torch.tensor([gz_fn(*row.tolist()) for row in zt.detach()], dtype=f64) / 5,
             zt.grad, tol=1e-14)
checks.close("value at z = 0, N = 8: (log 8)^2", math.log(8) ** 2, router_z_loss(torch.zeros(4, 8, dtype=f64)),
             tol=1e-15)
checks

# %% [markdown]
# ## 21.4 Capacity and dropped tokens
#
# Hardware wants static shapes, so the Switch Transformer gives each expert a fixed buffer of
#
# $$ C = \Big\lceil \text{CF}\cdot\frac{k\,n}{N}\Big\rceil $$
#
# slots for a batch of $n$ tokens (Fedus et al., eq. 3, with a *capacity factor* CF $\ge 1$;
# GShard, Lepikhin et al., 2020, for $k = 2$). Assignments beyond $C$ are **dropped**: that
# expert contributes nothing, and the token passes through the block on its residual
# connection. `capacity_keep_mask` fills the buffers first come, first served, with all
# first choices before any second choice.
#
# **How much is dropped under uniform routing?** If every token picks $k$ distinct experts
# uniformly at random, expert $i$'s load is $X\sim\mathrm{Binomial}(n, p)$ with $p = k/N$ (each
# token includes it with probability $k/N$, independently). It drops $(X - C)^+$, so the
# expected dropped fraction of the $nk$ assignments is
#
# $$ \delta = \frac{N\,\mathbb E[(X-C)^+]}{nk}, \qquad
#    \mathbb E[(X-C)^+] = \sum_{x > C}(x - C)\binom nx p^x(1-p)^{n-x}. $$
#
# SymPy's `sympy.stats` computes the expectation exactly for a small case, $n = 16$ tokens,
# $N = 4$, $k = 1$, CF $= 1$ ($C = 4$), and the package's float64 sum matches it:

# %%
n_s, N_s, k_s = 16, 4, 1
C_s = expert_capacity(n_s, N_s, k_s, 1.0)
X = ss.Binomial("X", n_s, sp.Rational(k_s, N_s))
overflow = ss.E(sp.Max(X - C_s, 0))
delta = sp.nsimplify(N_s * overflow / (n_s * k_s))
# the same expectation another way: E[(X - C)^+] = E[X] - C + E[(C - X)^+]
assert sp.simplify(overflow - (n_s * sp.Rational(k_s, N_s) - C_s + ss.E(sp.Max(C_s - X, 0)))) == 0
display(sp.Eq(sp.Symbol(r"\delta(n=16, N=4, k=1, C=4)"), delta), sp.N(delta, 6))
checks = Checks("dropped fraction: SymPy against the package")
checks.close("expected_drop_fraction(16, 4, 1, 4)", float(delta), expected_drop_fraction(n_s, N_s, k_s, C_s), tol=1e-15)
checks

# %% [markdown]
# A fifth of the tokens are dropped at capacity factor 1, even though the *average* load
# fits exactly: random fluctuations overflow some experts while others sit idle. The bigger
# the batch, the smaller the relative fluctuation ($\sqrt{np(1-p)}/np$), so the less slack
# is needed. The layer itself gives a third measurement: an `MoELayer` whose router rows are
# orthonormal sees i.i.d. standard normal logits for standard normal inputs, so its routing is
# uniform. For $n = 2048$ tokens, $N = 8$, $k = 2$ the three agree (the simulation averages 100
# random batches, the layer one batch of each size):

# %%
def simulated_drop(n, N, k, cf, trials=100):
    """Mean dropped fraction of `trials` batches of uniform random top-k routing."""
    idx = torch.rand(trials, n, N, generator=torch.Generator().manual_seed(1)).topk(k, -1).indices
    cap = expert_capacity(n, N, k, cf)
    return float(torch.stack([~capacity_keep_mask(i, N, cap) for i in idx]).double().mean())


layer = MoELayer(32, 16, 8, 2)
with torch.no_grad():
    layer.router.weight.copy_(torch.linalg.qr(torch.randn(32, 8, generator=g))[0].T)  # orthonormal rows
x_uniform = torch.randn(2048, 32, generator=g)
cfs = [1.0, 1.1, 1.25, 1.5, 2.0]
print(f"{'CF':>5s} {'C':>5s} {'formula':>9s} {'simulated':>10s} {'MoELayer':>9s}")
rows = []
for cf in cfs:
    layer.capacity_factor = cf
    with torch.no_grad():
        layer(x_uniform)
    rows.append((expected_drop_fraction(2048, 8, 2, expert_capacity(2048, 8, 2, cf)),
                 simulated_drop(2048, 8, 2, cf), layer.dropped_fraction()))
    print(f"{cf:5.2f} {expert_capacity(2048, 8, 2, cf):5d} {rows[-1][0]:9.4f} {rows[-1][1]:10.4f} {rows[-1][2]:9.3f}")

# %%
checks = Checks("dropped fraction, n = 2048, N = 8, k = 2")
checks.close("simulation = formula (all CF)", [r[0] for r in rows], [r[1] for r in rows], tol=2e-3)
checks.close("MoELayer on uniform routing = formula (all CF)", [r[0] for r in rows], [r[2] for r in rows], tol=1e-2)
checks.true("CF = 1.25 drops < 1 %", rows[2][0] < 0.01)
checks

# %% [markdown]
# A *trained* router is not uniform, and that is where capacity bites. The MoE model trained
# in section 21.7 (with the Switch loss) is routed on 2048 held-out tokens of the book's text
# at each capacity factor: even with its balancing loss it drops several times more than the
# uniform formula predicts, because some experts are favoured by the text itself. This is why
# Switch trained at CF 1.25 and evaluated at 2.0, and why recent MoE models are *dropless*,
# computing every assignment with variable-size expert batches (Gale et al., 2022, "MegaBlocks:
# Efficient Sparse Training with Mixture-of-Experts"; Mixtral and DeepSeek-V3 drop nothing).

# %%

moe_model, loads, info = load_moe_vs_dense()
tok = book_model("text")[1]["tokenizer"]
text = load_stdlib_docs()
held_out = torch.tensor(tok.encode(text[int(0.95 * len(text)):]))[: 32 * 64].reshape(32, 64)
trained_drop = []
for cf in cfs:
    for m in moe_layers(moe_model):
        m.capacity_factor = cf
    with torch.no_grad():
        moe_model(held_out)
    trained_drop.append(sum(m.dropped_fraction() for m in moe_layers(moe_model)) / 2)
print("trained router, mean over both layers:", [f"CF {cf}: {d:.2f}" for cf, d in zip(cfs, trained_drop, strict=True)])
for m in moe_layers(moe_model):
    m.capacity_factor = None

# %%
fig, ax = plt.subplots(figsize=(6.4, 3.8))
grid = [1 + i / 40 for i in range(41)]
ax.semilogy(grid, [max(expected_drop_fraction(2048, 8, 2, expert_capacity(2048, 8, 2, c)), 1e-7) for c in grid],
            label="uniform routing: binomial formula")
ax.semilogy(cfs, [r[1] for r in rows], "o", label="uniform routing: simulated (100 batches)")
ax.semilogy(cfs, [max(r[2], 1e-7) for r in rows], "x", ms=9, label="uniform routing: MoELayer")
ax.semilogy([c for c, d in zip(cfs, trained_drop, strict=True) if d > 0], [d for d in trained_drop if d > 0], "s-",
            label="trained router on held-out text (0 from CF 1.5)")
ax.set(xlabel="capacity factor CF", ylabel="fraction of assignments dropped",
       title="Dropped tokens, n = 2048 tokens, N = 8 experts, top-2", ylim=(1e-6, 1))
ax.legend(fontsize="small")
fig.tight_layout()
save_figure(fig, "21_mixture_of_experts_dropping")
plt.show()

# %% [markdown]
# Under uniform routing the dropped fraction falls steeply with the capacity factor: about
# 1.5 % at CF 1, $10^{-4}$ at 1.1 and nothing measurable from 1.25 on (points at zero are off
# the logarithmic axis). The trained router (squares) stays far above that curve: 13 % at CF 1
# and 3 % at 1.25, where uniform routing drops nothing; only at 1.5 does it drop nothing.

# %%
checks = Checks("dropping with a trained router")
checks.true("trained router drops more than uniform at CF 1.25 (x 5)", trained_drop[2] > 5 * rows[2][0])
checks.true("dropping falls with CF", all(a >= b for a, b in zip(trained_drop, trained_drop[1:], strict=False)))
checks

# %% [markdown]
# ## 21.5 Shared experts and balancing without an auxiliary loss
#
# **Shared experts.** DeepSeekMoE (Dai et al., 2024, "DeepSeekMoE: Towards Ultimate Expert
# Specialization in Mixture-of-Experts Language Models") splits the experts into many small
# ones and adds a few **shared experts** that every token uses:
#
# $$ y = \sum_{s=1}^{N_s} E^{\text{sh}}_s(x) + \sum_{i\in S} g_i\,E_i(x). $$
#
# Knowledge every token needs (syntax, frequent words) then lives once in the shared experts
# instead of being copied into each routed one, and the routed experts are free to
# specialise. Several shared experts are one wider SwiGLU, which is how DeepSeek-V2/V3 and
# Qwen2-MoE store them (`shared_d_ff` in `MoELayer`; Qwen2-MoE also scales it by a learned
# sigmoid gate).
#
# **Auxiliary-loss-free balancing.** Any auxiliary loss adds a gradient that is not the
# language-modelling one; a large $\alpha$ balances well and hurts the model, a small one the
# reverse. Wang et al. (2024, "Auxiliary-Loss-Free Load Balancing Strategy for
# Mixture-of-Experts"), used in DeepSeek-V3 (DeepSeek-AI, 2024, section 2.1.2), balance
# without a gradient: each expert gets a bias $b_i$ that is added to its score **for the
# selection only**,
#
# $$ S = \operatorname{top}_k(s_i + b_i), \qquad g_i = \frac{s_i}{\sum_{j\in S}s_j}
#    \quad(\text{no } b), \qquad
#    b_i \leftarrow b_i + \gamma\,\operatorname{sign}(\bar c - c_i) \text{ after each batch}, $$
#
# with $c_i$ the expert's load in the batch and $\bar c$ the mean. The bias decides *which*
# experts a token visits; the gates, and so the gradients of the model, are those of the
# unbiased router. `route` implements exactly that:

# %%
z_demo = torch.tensor([[2.0, 1.0, 0.0, -1.0]], dtype=f64)
b_demo = torch.tensor([0.0, 0.0, 0.5, 0.0], dtype=f64)
s_demo = torch.sigmoid(z_demo)
plain, biased = route(z_demo, 2, "sigmoid"), route(z_demo, 2, "sigmoid", bias=b_demo)
checks = Checks("the bias moves the selection, not the gates")
checks.equal("selection without bias", [[0, 1]], plain.indices)
checks.equal("selection with b_2 = 0.5", [[2, 0]], biased.indices)
checks.close("gates = unbiased s of the selected, renormalised", s_demo[:, [2, 0]] / s_demo[:, [2, 0]].sum(),
             biased.weights, tol=1e-15)
checks

# %% [markdown]
# The bias update needs no model at all to be seen working. A router whose logits favour
# expert 0 strongly (a skew of $+1.5$ on its logit, $N = 8$, $k = 2$) is routed on fresh
# random batches of 2048 tokens; after each batch `update_expert_bias` takes one step of
# $\gamma = 0.003$:

# %%
skew = torch.tensor([1.5, 0.8, 0.4, 0.0, 0.0, -0.4, -0.8, -1.5], dtype=f64)
bias = torch.zeros(8, dtype=f64)
gbias = torch.Generator().manual_seed(2)
max_load = []
for _ in range(300):
    logits = torch.randn(2048, 8, generator=gbias, dtype=f64) + skew
    r = route(logits, 2, bias=bias)
    counts = torch.bincount(r.indices.reshape(-1), minlength=8)
    max_load.append(float(counts.max()) / (2 * 2048))
    bias = update_expert_bias(bias, counts, 0.003)
print(f"largest expert share: {max_load[0]:.3f} at the start, {sum(max_load[-50:]) / 50:.3f} "
      f"over the last 50 batches (uniform: {1 / 8:.3f})")
print("final bias:", [round(b, 2) for b in bias.tolist()])

# %% [markdown]
# The busiest expert's share falls from 37 % to within the batch-to-batch noise of 1/8, and the
# learned bias mirrors the skew: negative for the favoured expert 0, positive for the
# disfavoured ones. No gradient was involved.

# %%
checks = Checks("auxiliary-loss-free balancing on a skewed router")
checks.true("busiest expert starts above 2x its share", max_load[0] > 2 / 8)
checks.true("ends within 10 % of 1/8", sum(max_load[-50:]) / 50 < 1.1 / 8)
checks.true("bias undoes the skew: b_0 < 0 < b_7", bias[0] < 0 < bias[7])
checks

# %% [markdown]
# ## 21.6 Verify: Hugging Face's MoE blocks
#
# `transformers` 5 stores each block's experts as two fused 3-D parameters,
# `experts.gate_up_proj` of shape $(N, 2f, d)$ (the SiLU gate's rows first, then the up
# projection's) and `experts.down_proj` of shape $(N, d, f)$, and the router as `gate.weight`
# $(N, d)$. `from_hf_moe_block` splits them into the book's per-expert SwiGLUs. Three peers,
# tiny, random and in float64:
#
# * Mixtral's `MixtralSparseMoeBlock`: softmax, top-2, renormalised;
# * Qwen2-MoE's block: softmax top-$k$ without renormalisation (`norm_topk_prob=False`) and a
#   shared expert behind a sigmoid gate;
# * DeepSeek-V3's `DeepseekV3MoE`: sigmoid scores, a non-zero selection bias
#   (`e_score_correction_bias`), renormalisation, a routed scaling factor of 2.5 and two shared
#   experts (group-limited routing off: one group).
#
# They compute the router's probabilities in float32 even in a float64 model, so outputs
# agree to about $10^{-7}$ rather than $10^{-15}$. Mixtral's and Qwen2-MoE's logits, computed
# before that cast, agree exactly; DeepSeek-V3 casts the router's input and weight to float32
# first, so its logits too agree to $10^{-7}$. The chosen experts agree in all three.

# %%
show_source(from_hf_moe_block)

# %%


def randomised(block):
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return block.double().eval()


torch.manual_seed(0)
mix_cfg = MixtralConfig(hidden_size=12, intermediate_size=20, num_local_experts=6, num_experts_per_tok=2)
qwen_cfg = Qwen2MoeConfig(hidden_size=12, moe_intermediate_size=20, shared_expert_intermediate_size=28,
                          num_experts=6, num_experts_per_tok=2, norm_topk_prob=False)
ds_cfg = DeepseekV3Config(hidden_size=12, moe_intermediate_size=20, n_shared_experts=2, n_routed_experts=8,
                          num_experts_per_tok=3, n_group=1, topk_group=1, routed_scaling_factor=2.5)
hf_logging.set_verbosity_error()  # no warning for running an experts module standalone
hf_blocks = {"Mixtral": (randomised(MixtralSparseMoeBlock(mix_cfg)), mix_cfg),
             "Qwen2-MoE": (randomised(Qwen2MoeSparseMoeBlock(qwen_cfg)), qwen_cfg),
             "DeepSeek-V3": (randomised(DeepseekV3MoE(ds_cfg)), ds_cfg)}
with torch.no_grad():
    hf_blocks["DeepSeek-V3"][0].gate.e_score_correction_bias.copy_(0.3 * torch.randn(8, generator=g))
x_peer = torch.randn(3, 7, 12, generator=g, dtype=f64)

# %%
checks = Checks("the book's MoELayer against transformers' MoE blocks (float64)")
for name, (hf, cfg) in hf_blocks.items():
    ours = from_hf_moe_block(hf, cfg)
    with torch.no_grad():
        y_hf, (logits_hf, _, idx_hf) = hf(x_peer), hf.gate(x_peer)
        y_ours = ours(x_peer)
    checks.close(f"{name}: outputs (3 x 7 x 12)", y_hf, y_ours, tol=1e-6)
    checks.close(f"{name}: router logits", logits_hf, ours.router_logits, tol=1e-6 if name == "DeepSeek-V3" else 1e-15)
    checks.equal(f"{name}: chosen experts (as sets)", sorted(map(sorted, idx_hf.tolist())),
                 sorted(map(sorted, ours.expert_indices.tolist())))
checks

# %% [markdown]
# **The balancing loss.** `load_balancing_loss_func` (in `transformers`' Mixtral module, also
# used by Qwen2-MoE and OLMoE) takes a tuple of per-layer router logits, pools the tokens of
# all layers, and counts $f_i$ per *token* rather than per assignment, so its $f$ sums to $k$
# instead of 1; it multiplies by $N$ and has no $\alpha$ (the model multiplies by
# `router_aux_loss_coef` outside). It is therefore $k$ times the book's loss on the pooled
# logits, and equal to $k$, not 1, under uniform routing:

# %%
layer_logits = tuple(torch.randn(21, 6, generator=g, dtype=f64) for _ in range(3))
checks = Checks("load_balancing_loss against transformers.load_balancing_loss_func")
for k in (1, 2, 3):
    checks.close(f"top-{k}, 3 layers x 21 tokens, N = 6", load_balancing_loss_func(layer_logits, 6, k),
                 k * load_balancing_loss(torch.cat(layer_logits), k), tol=1e-6)
checks.close("HF on a perfectly balanced batch, top-2: k", 2.0,
             load_balancing_loss_func((balanced,), 8, 2), tol=1e-6)
checks

# %% [markdown]
# ## 21.7 Explore: MoE against dense on the book's text
#
# `llmbook.scale.moe_training` turns the book's Llama-style `TransformerLM` (chapter 7) into
# an MoE model by swapping every block's `mlp` for an `MoELayer`; attention, norms, embeddings
# and the initialisation stay the dense model's.

# %%
show_source(moe_lm)

# %% [markdown]
# Five models were trained on the same 600 batches of $16\times 64$ tokens of the standard
# library's docstrings with chapter 10's BPE tokenizer (2 layers, $d = 64$, RoPE, RMSNorm,
# AdamW with warmup and cosine decay), and shipped:
#
# * **dense**: a SwiGLU of width 128;
# * **MoE**: 8 SwiGLU experts of width 64, top-2, so a token uses $2\times 64 = 128$ units,
#   exactly the dense model's, plus a router of $8\times 64$ weights per layer; balanced by
#   the Switch loss with $\alpha = 0.01$ (the Switch paper's value), by the Switch loss with
#   $\alpha = 0.001$, by the bias of section 21.5 ($\gamma = 0.001$), or not at all. All but
#   the unbalanced one also use the z-loss at $10^{-3}$.
#
# The training compute is $6\times$ the *active* parameters per token (chapter 11's
# $C = 6ND$): the MoE models hold twice the dense model's parameters and cost 0.7 % more per
# token (the routers).

# %%
V = info["variants"]
names = {"dense": "dense (SwiGLU 128)", "moe_aux": "MoE, Switch loss α=0.01",
         "moe_aux_small": "MoE, Switch loss α=0.001", "moe_free": "MoE, bias balancing",
         "moe_none": "MoE, no balancing"}
print(f"{'model':26s} {'parameters':>10s} {'active':>8s} {'FLOPs/step':>11s} {'final val loss':>15s}"
      f" {'- dense':>8s}")
for key, label in names.items():
    h = V[key]
    print(f"{label:26s} {h['total_parameters']:10d} {h['active_parameters']:8d} "
          f"{h['flops_per_step']:11.3e} {h['val_loss'][-1]:15.3f} {h['val_loss'][-1] - V['dense']['val_loss'][-1]:+8.2f}")
checks = Checks("shipped models: parameter counts")
checks.equal("MoE active = dense + 2 routers (2 x 8 x 64)", V["dense"]["active_parameters"] + 2 * 8 * 64,
             active_parameters(moe_model))
checks

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
for key, label in names.items():
    h = V[key]
    flops = [s * h["flops_per_step"] for s in h["eval_steps"]]
    ax1.plot(flops, h["val_loss"], marker=".", label=label)
    ax2.plot(h["eval_steps"], h["lb"] if h["lb"] else [float("nan")] * len(h["eval_steps"]), marker=".", label=label)
ax1.set(xlabel="training compute (FLOPs, 6 × active parameters × tokens)", ylabel="validation loss (nats/token)",
        title="Validation loss against compute", ylim=(4.0, 5.6))
ax1.legend(fontsize="small")
ax2.axhline(2, color="grey", lw=0.8)
ax2.set(xlabel="step", ylabel="Switch loss, α = 1, summed over 2 layers",
        title="Balance during training (2 = perfectly uniform)")
fig.tight_layout()
save_figure(fig, "21_mixture_of_experts_moe_vs_dense")
plt.show()

# %% [markdown]
# On the left, at the same compute, the MoE models trained with the bias or without any
# balancing end about 0.2 nats below the dense model: twice the parameters for 0.7 % more
# compute. The Switch loss is a trade-off: at $\alpha = 0.001$ the MoE model still beats the
# dense one, by 0.07 nats, and at $\alpha = 0.01$ it ends 0.09 nats *above* it. In a model this
# small and a run this short, the balancing gradient competes with the language-modelling
# one inside the router; that interference is what Wang et al. designed the bias to avoid,
# and here the bias-balanced model is the best of the five. On the right, the balance each
# method buys (measured by the Switch loss itself, 2 for two perfectly uniform layers): none
# stays far above 2, $\alpha = 0.01$ holds it at 2 almost exactly, and the bias brings it
# down over the run, since it moves by only $\gamma = 0.001$ per step. All of this is one seed,
# and the balanced models differ from the unbalanced one by two changes (balancing and the
# z-loss): section 21.10 repeats the comparison over three seeds, one change at a time.

# %%
final = {k: V[k]["val_loss"][-1] for k in names}
checks = Checks("MoE against dense (shipped curves)")
checks.true("bias-balanced MoE beats dense by > 0.1 nats", final["dense"] - final["moe_free"] > 0.1)
checks.true("Switch loss: α = 0.001 beats dense, α = 0.01 does not",
            final["moe_aux_small"] < final["dense"] < final["moe_aux"])
checks.true("unbalanced MoE beats dense by > 0.1 nats", final["dense"] - final["moe_none"] > 0.1)
checks.true("Switch loss α = 0.01 is the most balanced (final LB < 2.05)", V["moe_aux"]["lb"][-1] < 2.05)
checks.true("no balancing: final LB > 3", V["moe_none"]["lb"][-1] > 3)
checks

# %% [markdown]
# **Expert load over training.** The load of each expert at every evaluation (the share of the
# top-2 assignments of one fixed validation batch), per layer, for the three ways of
# balancing:

# %%
show = ["moe_aux", "moe_free", "moe_none"]
fig, axes = plt.subplots(2, 3, figsize=(11, 5.2), sharex=True, sharey=True)
steps = V["moe_aux"]["eval_steps"]
for col, key in enumerate(show):
    for layer_i in range(2):
        ax = axes[layer_i, col]
        im = ax.imshow(loads[key][:, layer_i, :].T.numpy(), aspect="auto", cmap="viridis", vmin=0, vmax=0.45,
                       extent=(steps[0] - 25, steps[-1] + 25, 7.5, -0.5))
        ax.set(title=f"{names[key]}, layer {layer_i}", xlabel="step" if layer_i else "",
               ylabel="expert" if col == 0 else "")
fig.colorbar(im, ax=axes, label="share of assignments (uniform: 0.125)")
fig.suptitle("Expert load during training (one fixed validation batch)")
save_figure(fig, "21_mixture_of_experts_expert_load")
plt.show()

# %% [markdown]
# Without balancing (right) the router settles within the first hundred steps on a few
# favourite experts: in layer 1 two experts take most of the assignments and several
# starve. The Switch loss (left) evens the load out within a hundred steps; the bias (middle)
# starts as unbalanced as no balancing and evens it out more slowly. On this one batch both
# end with every expert between about 6 % and 17 % of the assignments.

# %%
spread = {k: float(loads[k][-1].max() - loads[k][-1].min()) for k in show}
print("final max - min expert share:", {k: round(v, 2) for k, v in spread.items()})
checks = Checks("expert load at the end of training")
checks.true("no balancing: some expert gets < 1 %", float(loads["moe_none"][-1].min()) < 0.01)
checks.true("Switch loss and bias: every expert > 5 %",
            float(loads["moe_aux"][-1].min()) > 0.05 and float(loads["moe_free"][-1].min()) > 0.05)
checks.true("spread without balancing > 3x that of either method",
            spread["moe_none"] > 3 * max(spread["moe_aux"], spread["moe_free"]))
checks

# %% [markdown]
# ## 21.8 The cost of expert parallelism: all-to-all traffic
#
# A large MoE model puts different experts on different devices (*expert parallelism*,
# Lepikhin et al., 2020). Each MoE layer then needs two all-to-all exchanges: *dispatch*, which
# sends each of the $n$ tokens' $k$ copies ($d$ numbers of $b$ bytes) to the device of its
# expert, and *combine*, which sends the expert outputs back. Per layer and forward pass that
# is
#
# $$ B = 2\,n\,k\,d\,b \quad\text{bytes}, $$
#
# of which, with $N_{ep}$ devices and uniform routing, a fraction $(N_{ep}-1)/N_{ep}$ leaves
# the device; the backward pass moves as much again. For Mixtral 8x7B (Jiang et al., 2024:
# $d = 4096$, 32 layers, 8 experts, top-2) in bfloat16, on 8 devices with one expert each:

# %%
n_sym, k_sym, d_sym, b_sym = sp.symbols("n k d b", positive=True, integer=True)
B_expr = 2 * n_sym * k_sym * d_sym * b_sym
per_token_layer = all_to_all_bytes(1, 4096, 2, 2)
assert B_expr.subs({n_sym: 1, k_sym: 2, d_sym: 4096, b_sym: 2}) == per_token_layer
batch = 4096 * 8  # a global batch of 8 sequences of 4096 tokens
forward = 32 * all_to_all_bytes(batch, 4096, 2, 2, ep_size=8)
print(f"per token and layer: {per_token_layer} bytes = {per_token_layer // 1024} KiB")
print(f"one forward pass, {batch} tokens, 32 layers, 8 devices: {forward / 2**30:.1f} GiB across devices "
      f"({2 * forward / 2**30:.1f} GiB with the backward pass)")
active_flops = 2 * 12.9e9  # forward FLOPs per token for Mixtral's 12.9B active parameters
print(f"forward FLOPs per byte sent: {active_flops / (32 * per_token_layer * 7 / 8):.0f}")

# %% [markdown]
# About 28 GiB cross the network per forward pass of 32 768 tokens, and 56 GiB per training
# step. Each token's 1 MiB of traffic (32 layers of 32 KiB) buys about 26 GFLOPs of forward
# compute, some 28 000 FLOPs per byte that crosses: an accelerator doing $10^{15}$ FLOP/s
# needs about 36 GB/s of all-to-all bandwidth not to wait,
# within NVLink's reach but not a commodity network's. This is why expert parallelism is
# usually kept inside a node, and why DeepSeek-V3 limits each token to experts on at most 4
# nodes (its section 2.1.2). Chapter 22 models such communication costs.
#
# ## 21.9 When the router learns nothing: the renormalised top-1 gate
#
# The router's weights $W_r$ reach the layer's output $y = \sum_{i\in S} g_i E_i(x)$ in two
# ways: through the selection $S$ and through the gate values $g_i$. The selection is a top-$k$,
# piecewise constant in the logits $z = W_r x$: its derivative is zero almost everywhere, and
# autograd does not differentiate through `topk`'s indices at all. So every gradient the
# language-model loss sends to the router goes through $\partial g/\partial z$. With one expert
# and gates renormalised over the chosen experts (the `normalize=True` of `route`, which is
# Mixtral's rule), $g_1 = s_1/s_1 = 1$ for every $z$: the Jacobian is zero, and
# $\partial\mathcal L/\partial W_r = \sum_{\text{tokens}} (\partial\mathcal L/\partial y)
# \,E_1(x)\,(\partial g_1/\partial z)\,x^\top = 0$. The router still picks an expert, but the
# loss never tells it whether the pick was good. SymPy computes the Jacobian $\partial g/\partial z$
# for $N = 4$ experts, the selected ones taken as the first $k$:

# %%
show_source(gate_jacobian_symbolic)

# %%
jacobians = {"top-1, renormalised": gate_jacobian_symbolic(4, 1),
             "top-1, sigmoid, renormalised": gate_jacobian_symbolic(4, 1, "sigmoid"),
             "top-1, softmax over all N (Switch)": gate_jacobian_symbolic(4, 1, normalize=False),
             "top-2, renormalised": gate_jacobian_symbolic(4, 2)}
for name, jac in jacobians.items():
    print(f"{name:35s} zero: {jac == sp.zeros(*jac.shape)!s:5s}  dg_1/dz_1 = {sp.simplify(jac[0, 0])}")

# %% [markdown]
# Renormalising a single score, softmax or sigmoid, leaves nothing to differentiate. The
# Switch Transformer routes to one expert but keeps $g = p_i$, the softmax over *all* $N$
# logits (Fedus et al., 2021): then $\partial g/\partial z_j = p_i(\delta_{ij} - p_j)$, and a
# useful expert's output pulls its logit up and the others down. With $k = 2$ renormalised
# (Mixtral), the two gates are a two-way softmax of the chosen logits, so they learn which of
# the two should weigh more, though nothing reaches the $N - k$ experts left out.
#
# **Autograd agrees, on the trained model.** Section 21.7's MoE model (top-2, renormalised) is
# run on held-out text in float64, and the gradient of its language-model loss alone, no
# auxiliary loss, is taken with respect to both routers: as trained; switched to top-1 with
# renormalisation; to top-1 with Switch's unrenormalised gate; and top-1 renormalised once more
# with the Switch loss at $\alpha = 0.01$ and the z-loss at $10^{-3}$ added, as in training. No
# weight changes; only the gate rule does.

# %%
show_source(lm_router_gradients)

# %%
probe = copy.deepcopy(moe_model).double()  # the shipped model stays as it is
gate_rules = {"top-2, renormalised (as trained)": (2, True, 0.0, 0.0), "top-1, renormalised": (1, True, 0.0, 0.0),
              "top-1, Switch gate (softmax over N)": (1, False, 0.0, 0.0),
              "top-1, renormalised + Switch and z-losses": (1, True, 0.01, 1e-3)}
measured = {name: [float(gr.abs().max()) for gr in lm_router_gradients(probe, held_out[:8], *rule)]
            for name, rule in gate_rules.items()}
for name, per_layer in measured.items():
    print(f"{name:42s} max |dL/dW_r| per layer: " + ", ".join(f"{v:.1e}" if v > 1e-12 else "< 1e-12" for v in per_layer))
checks = Checks("router gradient: SymPy's Jacobian against autograd on the trained model (float64)")
checks.true("SymPy: renormalised top-1 Jacobian is zero", jacobians["top-1, renormalised"] == sp.zeros(1, 4))
checks.true("autograd: renormalised top-1, LM loss only: every router gradient < 1e-12",
            max(measured["top-1, renormalised"]) < 1e-12)
for name in ("top-2, renormalised (as trained)", "top-1, Switch gate (softmax over N)",
             "top-1, renormalised + Switch and z-losses"):
    checks.true(f"autograd: {name}: every router gradient > 1e-4", min(measured[name]) > 1e-4,
                got=min(measured[name]))
checks

# %% [markdown]
# The auxiliary losses do give the renormalised top-1 router a gradient, but not the one it
# needs: the Switch loss only asks for balance, whatever the experts are good at, and the
# z-loss only asks for small logits. A router trained that way spreads tokens evenly and
# arbitrarily. Hence the rules in use: Switch keeps the unrenormalised top-1 gate; Mixtral and
# DeepSeek-V3 route each token to several experts ($k = 2$ and $k = 8$) before renormalising;
# Qwen2-MoE does not renormalise at all (`norm_topk_prob=False`). A model configured with
# `normalize=True` and `top_k=1` trains its experts, but its router only ever learns from
# whatever auxiliary loss it is given.

# %% [markdown]
# ## 21.10 The rankings over three seeds, one change at a time
#
# Section 21.7's table comes from one seed, and two of its comparisons change two things at
# once: every balanced model there also carries the z-loss, which the unbalanced one does not.
# `data/make_moe_seeds.py` repeats the runs with three seeds (each sets both the
# initialisation and the order of the batches; seed 0 is section 21.7's recipe) for six
# models that differ from the unbalanced MoE by one change at a time: the z-loss alone
# ($10^{-3}$), the Switch loss alone ($\alpha = 0.01$), both (section 21.7's `moe_aux`), the
# bias alone ($\gamma = 0.001$, without the z-loss this time), and the dense model. Each run
# records its final validation loss, the load imbalance at the end (the busiest expert's
# share over the mean share, per layer, averaged over the two layers; 1 is perfect balance
# and $N/k = 4$ the worst) and the router's z (the mean squared log-sum-exp of its logits,
# the quantity the z-loss penalises), both on the first validation batch.

# %%
show_source(train_variant_seed)

# %% [markdown]
# The table gives the mean over the three seeds with its 95 % Student-$t$ interval (two
# degrees of freedom, so the half-width is more than four standard errors $s/\sqrt 3$), and
# each model's loss minus the unbalanced MoE's *paired by seed*: the two runs of a seed share
# their batches (and, between MoE models, their initial weights), so the difference cancels
# part of the seed's luck.

# %%
seed_runs = json.loads(data_path("moe_seeds", "results.json").read_text())
seed_rows = summarize_seeds(seed_runs, baseline="moe_none")
seed_names = {"dense": "dense (SwiGLU 128)", "moe_none": "MoE, no balancing", "moe_z": "MoE, z-loss only",
              "moe_switch": "MoE, Switch loss only", "moe_aux": "MoE, Switch + z (21.7)",
              "moe_bias": "MoE, bias only"}
print(f"{'model':24s} {'seeds':>5s} {'final val loss':>15s} {'- no balancing':>15s} {'imbalance':>13s}"
      f" {'router z':>13s}")
for r in seed_rows:
    cells = [f"{r['val_loss']:.3f} ± {r['val_loss_pm']:.3f}",
             "-" if r["diff"] is None else f"{r['diff']:+.3f} ± {r['diff_pm']:.3f}",
             "-" if r["imbalance"] is None else f"{r['imbalance']:.2f} ± {r['imbalance_pm']:.2f}",
             "-" if r["router_z"] is None else f"{r['router_z']:.2f} ± {r['router_z_pm']:.2f}"]
    print(f"{seed_names[r['variant']]:24s} {r['seeds']:5d} {cells[0]:>15s} {cells[1]:>15s} {cells[2]:>13s} "
          f"{cells[3]:>13s}")

# %% [markdown]
# Which differences survive the seeds? Below, a difference whose interval excludes zero is
# called real and one whose interval contains zero is within noise. The same paired
# intervals are given against the dense model, and for the z-loss's effect when the Switch
# loss is present (Switch + z against Switch alone):

# %%
by_seed = {v: {r["seed"]: r["val_loss"] for r in runs} for v, runs in seed_runs["runs"].items()}
pairs = [(v, "moe_none") for v in seed_names if v != "moe_none"] + [
    (v, "dense") for v in seed_names if v not in ("dense", "moe_none")] + [("moe_aux", "moe_switch")]
seed_verdicts = {}
for a, b in pairs:
    row = {r["variant"]: r for r in summarize_seeds(seed_runs, baseline=b)}[a]
    lo, hi = row["diff"] - row["diff_pm"], row["diff"] + row["diff_pm"]
    seed_verdicts[a, b] = (lo, hi)
    word = "within noise" if lo <= 0 <= hi else ("lower (real)" if hi < 0 else "higher (real)")
    print(f"{seed_names[a]:24s} - {seed_names[b]:24s} {row['diff']:+.3f} ± {row['diff_pm']:.3f}  {word}")

# %%
checks = Checks("MoE over seeds: intervals and the shipped run")
for r in seed_rows:
    raw = [by_seed[r["variant"]][s] for s in sorted(by_seed[r["variant"]])]
    lo, hi = stats.t.interval(0.95, len(raw) - 1, loc=stats.tmean(raw), scale=stats.sem(raw))
    checks.close(f"{r['variant']}: interval from scipy.stats.t", [lo, hi],
                 [r["val_loss"] - r["val_loss_pm"], r["val_loss"] + r["val_loss_pm"]], tol=1e-9)
for (a, b), (lo, hi) in seed_verdicts.items():
    seeds = sorted(set(by_seed[a]) & set(by_seed[b]))
    ci = stats.ttest_rel([by_seed[a][s] for s in seeds], [by_seed[b][s] for s in seeds]).confidence_interval(0.95)
    checks.close(f"{a} - {b}: paired interval = scipy's ttest_rel", [ci.low, ci.high], [lo, hi], tol=1e-9)
checks.equal("seed runs use section 21.7's recipe", info["recipe"], seed_runs["recipe"])
checks.close("seed 0 of Switch + z = section 21.7's shipped moe_aux (final val loss)",
             V["moe_aux"]["val_loss"][-1], by_seed["moe_aux"][0], tol=1e-4)
checks

# %% [markdown]
# With three seeds, none of the five changes to the unbalanced MoE moves the final loss by
# more than the seeds do: every paired interval against it contains zero. Section 21.7's
# ranking of the MoE variants by loss is therefore not established by these runs. Seed 0
# (section 21.7's) happens to be the one where Switch + z looks worst; over three seeds its
# cost is $0.182 \pm 0.327$ nats, within noise. The confounded question, whether the z-loss
# costs loss, gets no clear answer either: alone it costs $0.066 \pm 0.230$ nats and on top of
# the Switch loss $0.043 \pm 0.080$, both intervals straddling zero. What does survive:
#
# * **Balance.** The Switch loss and the bias cut the load imbalance from $2.76 \pm 0.36$ to
#   $1.31 \pm 0.09$ and $1.14 \pm 0.11$; the z-loss does not balance ($2.94 \pm 0.33$).
# * **Router z.** The z-loss does what it is built for, shrinking the router's z from
#   $5.56 \pm 0.74$ to $1.59 \pm 0.70$ (and from $6.11 \pm 0.59$ to $2.47 \pm 0.33$ with the
#   Switch loss); the Switch loss alone leaves it where it was.
# * **MoE against dense.** The MoE with the bias alone ends $0.237 \pm 0.217$ nats below the
#   dense model and the one with the z-loss alone $0.135 \pm 0.109$ below; both intervals
#   exclude zero, barely. The unbalanced MoE's lead over the dense model, $0.201 \pm 0.299$,
#   and the Switch-balanced models' are within noise.
#
# Two degrees of freedom make wide intervals: telling apart the balancing methods' effects
# on the loss, a few hundredths of a nat in this model, would take many more seeds.
#
# ## Summary
#
# * The router's top-$k$ gate is the softmax of the selected logits; only $k$ of $N$ experts
#   run per token, so parameters grow with $N$ at constant compute.
# * The Switch loss $\alpha N\sum_i f_iP_i$ equals $\alpha$ under uniform routing; its gradient
#   $\alpha N f_i$ on $P_i$ pushes down the busiest experts, and with $f = P$ its minimum on the
#   simplex is the uniform router. The z-loss keeps the router's logits small.
# * A capacity of $\lceil \text{CF}\,kn/N\rceil$ slots drops
#   $N\,\mathbb E[(X - C)^+]/(nk)$ of the assignments under uniform routing (binomial $X$),
#   1.5 % at CF 1 and none measurable at 1.25 for 2048 tokens; a trained router drops much more.
# * DeepSeekMoE's shared experts and DeepSeek-V3's selection-only bias are an `MoELayer`
#   option each; the layer matches `transformers`' Mixtral, Qwen2-MoE and DeepSeek-V3 blocks
#   to float32 round-off of their router, and the loss matches `load_balancing_loss_func`
#   up to its factor $k$.
# * On the book's text, MoE models with the dense model's active parameters end about 0.2 nats
#   lower at the same compute when balanced by the bias or not at all; the Switch loss trades
#   loss for balance, and at $\alpha = 0.01$ this small model ends worse than the dense one
#   in that one seed (see the last bullet).
# * Expert parallelism moves $2nkd\,b$ bytes per layer and pass: about 1 MiB per token for
#   Mixtral 8x7B.
# * A top-1 gate renormalised over its one expert is identically 1, so the language-model loss
#   sends the router no gradient (SymPy's Jacobian and autograd on the trained model agree);
#   the auxiliary losses give it one, towards balance only. Switch's softmax-over-$N$ gate and
#   $k \ge 2$ avoid the problem.
# * Over three seeds (section 21.10), the balancing methods' effects on the final loss are
#   within noise; what survives is that the Switch loss and the bias balance the experts, the
#   z-loss shrinks the router's logits, and the MoE with the bias or the z-loss alone beats
#   the dense model.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/21_mixture_of_experts.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 21` writes a stub
# of every function, `llmbook grade 21` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_21.py` runs
# the same checks on the reference.
#
# 1. (★) **How much slack?** Find the smallest capacity factor (on a grid of 0.01) that drops
#    less than 1 % of the assignments under uniform routing for $n = 4096$ tokens, $k = 2$, and
#    $N = 8$, $64$ and $256$ experts. Why does it grow with $N$?
# 2. (★) **Partial collapse.** Show with SymPy that when the router sends every token to $m$ of
#    the $N$ experts, uniformly among them and with probability one ($k = 1$), the Switch loss
#    is $\alpha N/m$; check it with `load_balancing_loss`.
# 3. (★★) **Fine-grained experts.** DeepSeekMoE splits each expert into $m$ experts of width
#    $f/m$ and routes to $mk$ of them. Show that parameters and active parameters stay the same
#    (count them on `MoELayer`s), and compute how the number of possible expert combinations
#    per token, $\binom{N}{k}$, grows for $N = 16$, $k = 2$ and $m = 1, 2, 4$.
# 4. (★★) **Bias balancing with sigmoid scores.** Repeat section 21.5's experiment with
#    DeepSeek-V3's sigmoid scores: write `balance_with_bias(logits_fn, k, rate, steps)` that
#    returns the final bias and the busiest expert's share per batch, and check that the gates
#    of every token equal its renormalised *unbiased* sigmoid scores.

# %%
from llmbook.workbench import grade

grade("21", globals())
