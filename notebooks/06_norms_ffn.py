# %% [markdown]
# # 6 Norms, residuals and the feed-forward layer
#
# Attention (chapter 4) lets positions exchange information. Everything else in a
# transformer block acts on each position's vector $x \in \mathbb{R}^d$ on its own, and
# is the subject of this chapter:
#
# 1. **normalisation**: LayerNorm (GPT-2) and RMSNorm (Llama, Qwen2) rescale $x$ to a
#    fixed size; we derive their Jacobians, which explain what they forget (a shift, a scale);
# 2. **residual connections** $y = x + F(x)$, whose Jacobian $I + J_F$ carries gradients
#    through deep stacks, and the two ways to combine them with a norm (pre-LN, post-LN);
# 3. **the feed-forward layer**: GPT-2's two-layer MLP with the GELU activation (exact and
#    tanh-approximated), and Llama's gated SwiGLU, with their parameter counts.
#
# Section 6.6 then recomputes the feed-forward step of a published hand-worked example and
# grades every number it printed.
#
# Each formula is derived in SymPy, implemented in `llmbook.transformer.layers`, and checked against
# PyTorch and Hugging Face `transformers` (with weights copied across, no downloads).

# %%
import math

import matplotlib.pyplot as plt
import mpmath as mp
import numpy as np
import sympy as sp
import torch
import torch.nn.functional as F
import transformers
from IPython.display import display
from scipy import stats
from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from llmbook.nbtools import Checks, save_figure, seed_everything, show_source
from llmbook.text.worked_example import PublishedComparison, load_the_cat_sat
from llmbook.transformer.extremes import critical_extremes
from llmbook.transformer.layers import (
    MLP,
    LayerNorm,
    RMSNorm,
    SwiGLU,
    gelu,
    layer_norm_jacobian,
    mlp_parameter_count,
    rms_norm_jacobian,
    swiglu_hidden_size,
    swiglu_parameter_count,
    tanh_cdf_error,
)
from llmbook.transformer.worked_example import ffn_step

g = seed_everything(0)
torch.set_num_threads(1)  # every tensor here is tiny: one thread is faster than several

# %% [markdown]
# ## 6.1 LayerNorm
#
# Layer normalisation (Ba, Kiros & Hinton, 2016, "Layer Normalization") standardises each
# vector across its $d$ features, then applies a learned gain $\gamma$ and shift $\beta$:
#
# $$ \mu = \frac1d \sum_i x_i, \qquad \sigma^2 = \frac1d \sum_i (x_i - \mu)^2, \qquad
#    \hat x = \frac{x - \mu \mathbf 1}{\sqrt{\sigma^2 + \varepsilon}}, \qquad
#    y = \gamma \odot \hat x + \beta . $$
#
# The variance is the *biased* one (divide by $d$, not $d-1$), and $\varepsilon$ (PyTorch's
# default $10^{-5}$) keeps a constant vector from dividing by zero. Unlike batch
# normalisation, the statistics are per position, so a token's output does not depend on
# the rest of the batch.
#
# ### The Jacobian
#
# Write $s = \sqrt{\sigma^2 + \varepsilon}$. Since $\partial \mu / \partial x_j = 1/d$ and
# $\partial \sigma^2 / \partial x_j = 2(x_j - \mu)/d$ (the terms from $\mu$ sum to zero),
# $\partial s / \partial x_j = (x_j - \mu)/(d s) = \hat x_j / d$, and the quotient rule gives
#
# $$ \frac{\partial \hat x_i}{\partial x_j} = \frac{\delta_{ij} - 1/d}{s}
#    - \frac{x_i - \mu}{s^2}\,\frac{\hat x_j}{d}
#    = \frac1s\left(\delta_{ij} - \frac1d - \frac{\hat x_i \hat x_j}{d}\right), \qquad
#    \frac{\partial y}{\partial x} = \frac{\operatorname{diag}(\gamma)}{s}
#    \left(I - \frac1d \mathbf 1 \mathbf 1^\top - \frac1d \hat x \hat x^\top\right). $$
#
# The formula is exact for every $\varepsilon > 0$ (with $\hat x$ built from $s$). SymPy
# cannot differentiate with respect to a vector of symbolic length, so we take $d = 3$ with
# every $x_i$, $\gamma_i$, $\beta_i$ and $\varepsilon$ a free symbol, build $y$ from the
# definition, and compare `sp.Matrix.jacobian` with the closed form:

# %%
d3 = 3
x = sp.Matrix(sp.symbols(f"x_0:{d3}", real=True))
gamma = sp.Matrix(sp.symbols(f"gamma_0:{d3}", real=True))
beta = sp.Matrix(sp.symbols(f"beta_0:{d3}", real=True))
eps = sp.Symbol("epsilon", positive=True)
ones = sp.ones(d3, 1)


def layer_norm_sym(v, eps_):
    """x_hat for a symbolic column vector v: (v - mean) / sqrt(biased variance + eps)."""
    mu_ = sum(v) / len(v)
    var_ = sum((vi - mu_) ** 2 for vi in v) / len(v)
    return (v - mu_ * ones) / sp.sqrt(var_ + eps_)


mu = sum(x) / d3
var = sum((xi - mu) ** 2 for xi in x) / d3
s = sp.sqrt(var + eps)
x_hat = layer_norm_sym(x, eps)
y = sp.diag(*gamma) * x_hat + beta
J_ln = y.jacobian(x)
J_ln_closed = sp.diag(*gamma) / s * (sp.eye(d3) - ones * ones.T / d3 - x_hat * x_hat.T / d3)
assert sp.simplify(J_ln - J_ln_closed) == sp.zeros(d3, d3)
display(sp.Eq(sp.Derivative(sp.Function("y_0")(*x), x[1]), sp.factor(sp.simplify(J_ln[0, 1]))))

# %% [markdown]
# ### What LayerNorm forgets
#
# The bracket $P = I - \frac1d \mathbf 1 \mathbf 1^\top - \frac1d \hat x \hat x^\top$ is
# (up to $\varepsilon$) the orthogonal projection onto the complement of $\mathbf 1$ and
# $\hat x$: note $\hat x \perp \mathbf 1$ and $\lVert \hat x \rVert^2 = d\,\sigma^2/s^2$.
# So the Jacobian annihilates two directions:
#
# * $\mathbf 1$: $J \mathbf 1 = 0$ exactly. Adding a constant to every feature changes nothing;
# * $x$ itself: $J x = \operatorname{diag}(\gamma)\,\hat x\,\dfrac{\varepsilon}{\sigma^2 + \varepsilon}$,
#   zero as $\varepsilon \to 0$. Rescaling $x$ changes nothing either.
#
# Both follow from the forward map: for $\alpha > 0$ and any shift $b$,
# $\mathrm{LN}_\varepsilon(\alpha x + b\mathbf 1) = \mathrm{LN}_{\varepsilon/\alpha^2}(x)$,
# which is $\mathrm{LN}(x)$ when $\varepsilon = 0$. SymPy checks all four statements on the
# symbolic $d = 3$ vector:

# %%
alpha, b = sp.Symbol("alpha", positive=True), sp.Symbol("b", real=True)
assert sp.simplify(J_ln * ones) == sp.zeros(d3, 1)
assert sp.simplify(J_ln * x - sp.diag(*gamma) * x_hat * eps / (var + eps)) == sp.zeros(d3, 1)
assert sp.simplify(layer_norm_sym(alpha * x + b * ones, eps) - layer_norm_sym(x, eps / alpha**2)) == sp.zeros(d3, 1)
assert sp.simplify(layer_norm_sym(alpha * x + b * ones, 0) - layer_norm_sym(x, 0)) == sp.zeros(d3, 1)
display(sp.Eq(sp.Symbol(r"\mathrm{LN}_\varepsilon(\alpha x + b \mathbf{1})"),
              sp.Symbol(r"\mathrm{LN}_{\varepsilon / \alpha^2}(x)")))

# %% [markdown]
# A consequence worth remembering: the gradient reaching $x$ through a LayerNorm,
# $J^\top g$, has no component along $\mathbf 1$ and (nearly) none along $x$, and it is
# divided by $s$. A large input means a small gradient. This is what section 6.3 is about.
#
# ### In code
#
# The package module computes exactly the definition with plain tensor operations. The
# parameters are called `weight` ($\gamma$) and `bias` ($\beta$), as in `torch.nn.LayerNorm`,
# so state dicts are interchangeable; `bias=False` drops $\beta$.

# %%
show_source(LayerNorm)

# %% [markdown]
# The closed-form Jacobian, batched over any leading dimensions (entry $[i, j]$ is
# $\partial y_i / \partial x_j$):

# %%
show_source(layer_norm_jacobian)

# %% [markdown]
# Checks, on a batch of $B = 3$ sequences of $T = 5$ positions with $d = 8$, random
# $\gamma$ and $\beta$ and inputs of mean 2 and standard deviation 3: equal to
# `torch.nn.LayerNorm` and `F.layer_norm` in float32; the Jacobian equal to autograd's in
# float64 at every position; its null space; and `gradcheck` of the module with respect to
# input, gain and shift. `torch.autograd.gradcheck` compares autograd's Jacobian with central
# differences (step $10^{-6}$) entry by entry and passes when every entry agrees within
# $10^{-5} + 10^{-3}|\text{numerical}|$; the table shows those tolerances, as it reports only
# pass or fail. Float32 comparisons in this chapter report
# the largest error relative to the largest output, so $10^{-6}$ means agreement to a few
# units in the last place of float32 (whose spacing near 1 is $1.2 \times 10^{-7}$).

# %%
B, T, d = 3, 5, 8
ln = LayerNorm(d)
torch_ln = torch.nn.LayerNorm(d)
with torch.no_grad():
    ln.weight.normal_(generator=g)
    ln.bias.normal_(generator=g)
torch_ln.load_state_dict(ln.state_dict())
X = 3 * torch.randn(B, T, d, generator=g) + 2  # (B, T, d) float32
ln64 = LayerNorm(d, dtype=torch.float64)
ln64.load_state_dict(ln.state_dict())
X64 = X.double()
J_auto = torch.stack([torch.autograd.functional.jacobian(ln64, X64[0, t]) for t in range(T)])
J_ours = layer_norm_jacobian(X64[0], ln64.weight.detach())  # (T, d, d)

# %%
ones_d = torch.ones(d, dtype=torch.float64)
GRADCHECK = "all entries within 1e-5 + 1e-3 |num|"  # torch.autograd.gradcheck's defaults
x0 = X64[0, 0]
xc = x0 - x0.mean()
s0 = (xc.pow(2).mean() + ln64.eps).sqrt()
params = (X64[:2, :2].clone().requires_grad_(), ln64.weight.detach().clone().requires_grad_(),
          ln64.bias.detach().clone().requires_grad_())


def ln_of(x_, w_, b_):
    return torch.func.functional_call(ln64, {"weight": w_, "bias": b_}, (x_,))


checks = Checks("LayerNorm against PyTorch and its Jacobian")
checks.close("LayerNorm vs torch.nn.LayerNorm (float32)", torch_ln(X), ln(X), tol=1e-6, rel=True)
checks.close("LayerNorm vs F.layer_norm (float32)", F.layer_norm(X, (d,), ln.weight, ln.bias), ln(X), tol=1e-6, rel=True)
checks.close("Jacobian: closed form vs autograd (float64)", J_auto, J_ours, tol=1e-13)
checks.close("J 1 = 0", torch.zeros(d), J_ours[0] @ ones_d, tol=1e-14)
checks.close("J x = gamma x_hat eps / (var + eps)",
             ln64.weight.detach() * xc / s0 * ln64.eps / s0**2, J_ours[0] @ x0, tol=1e-15)
checks.true("gradcheck in x, gamma, beta", torch.autograd.gradcheck(ln_of, params), got=GRADCHECK)
checks

# %% [markdown]
# ## 6.2 RMSNorm
#
# Zhang & Sennrich (2019, "Root Mean Square Layer Normalization") observed that the
# re-centring is not what makes LayerNorm work, and dropped it: divide by the root mean
# square and apply a gain $g$, with no shift,
#
# $$ r = \sqrt{\frac1d \sum_i x_i^2 + \varepsilon}, \qquad y = g \odot \frac{x}{r}. $$
#
# It saves the mean and the bias. The first Llama and Qwen2 use it with
# $\varepsilon = 10^{-6}$, Llama 2 with $\varepsilon = 10^{-5}$ (the `rms_norm_eps` of their
# released configurations).
# Since $\partial r / \partial x_j = x_j / (d r)$,
#
# $$ \frac{\partial y}{\partial x} = \frac{\operatorname{diag}(g)}{r}
#    \left(I - \frac{x x^\top}{d\, r^2}\right). $$
#
# This time $d = 4$, again with symbolic entries, gain and $\varepsilon$:

# %%
d4 = 4
xr = sp.Matrix(sp.symbols(f"x_0:{d4}", real=True))
gr = sp.Matrix(sp.symbols(f"g_0:{d4}", real=True))


def rms_norm_sym(v, eps_):
    return v / sp.sqrt(sum(vi**2 for vi in v) / len(v) + eps_)


r = sp.sqrt(sum(xi**2 for xi in xr) / d4 + eps)
J_rms = (sp.diag(*gr) * rms_norm_sym(xr, eps)).jacobian(xr)
J_rms_closed = sp.diag(*gr) / r * (sp.eye(d4) - xr * xr.T / (d4 * r**2))
assert sp.simplify(J_rms - J_rms_closed) == sp.zeros(d4, d4)
assert sp.simplify(J_rms * xr - sp.diag(*gr) * xr * eps / r**3) == sp.zeros(d4, 1)
assert sp.simplify(rms_norm_sym(alpha * xr, eps) - rms_norm_sym(xr, eps / alpha**2)) == sp.zeros(d4, 1)
assert sp.simplify(rms_norm_sym(alpha * xr, 0) - rms_norm_sym(xr, 0)) == sp.zeros(d4, 1)
display(sp.Eq(sp.Symbol(r"\partial y / \partial x \cdot x"), sp.Symbol(r"g \odot x\, \varepsilon / r^3")))

# %% [markdown]
# RMSNorm keeps one of LayerNorm's invariances: $\mathrm{RMS}(\alpha x) = \mathrm{RMS}(x)$
# for $\alpha > 0$ (exactly $\mathrm{RMS}_\varepsilon(\alpha x) = \mathrm{RMS}_{\varepsilon/\alpha^2}(x)$),
# and its Jacobian annihilates $x$ up to $\varepsilon$. It gives up the other: a shift
# $x + b\mathbf 1$ is *not* removed. On zero-mean inputs the two norms coincide.
#
# ### Precision, as Llama does it
#
# Hugging Face's `LlamaRMSNorm` (shared by Qwen2 and others) upcasts the input to float32,
# normalises, casts the result back to the input dtype, and only *then* multiplies by the
# weight. In bfloat16 the order matters at the last bit, so to reproduce Llama's outputs
# exactly the package follows the same order. It differs in one deliberate way: a float64
# input stays in float64 (Llama's would drop to float32), so that `gradcheck` works.

# %%
show_source(RMSNorm)

# %% [markdown]
# Checks against `torch.nn.RMSNorm` and `LlamaRMSNorm` (same random gain) in float32,
# bit-for-bit against `LlamaRMSNorm` in bfloat16, and in float64 with a non-default
# $\varepsilon = 10^{-5}$ on inputs whose mean square is about $\varepsilon$, where a wrong
# $\varepsilon$ (or one added outside the square root) would show; then the Jacobian against
# autograd, the invariances numerically, and `gradcheck`:

# %%
rms = RMSNorm(d)
with torch.no_grad():
    rms.weight.normal_(generator=g)
torch_rms = torch.nn.RMSNorm(d, eps=1e-6)
llama_rms = LlamaRMSNorm(d, eps=1e-6)
torch_rms.load_state_dict(rms.state_dict())
llama_rms.load_state_dict(rms.state_dict())
rms64 = RMSNorm(d, dtype=torch.float64)
rms64.load_state_dict(rms.state_dict())
J_rms_auto = torch.stack([torch.autograd.functional.jacobian(rms64, X64[0, t]) for t in range(T)])
J_rms_ours = rms_norm_jacobian(X64[0], rms64.weight.detach())  # (T, d, d)
Xb = X.to(torch.bfloat16)
X_tiny = 1e-3 * X64  # mean square about 1.3e-5: eps = 1e-5 is no longer negligible
rms_eps5 = RMSNorm(d, eps=1e-5, dtype=torch.float64)
torch_eps5 = torch.nn.RMSNorm(d, eps=1e-5, dtype=torch.float64)
llama_eps5 = LlamaRMSNorm(d, eps=1e-5).double()
for m_ in (rms_eps5, torch_eps5, llama_eps5):
    m_.load_state_dict(rms64.state_dict())
rms_scaled_eps = RMSNorm(d, eps=rms64.eps / 7.5**2, dtype=torch.float64)
rms_scaled_eps.load_state_dict(rms64.state_dict())
ln_scaled_eps = LayerNorm(d, eps=ln64.eps / 0.2**2, dtype=torch.float64)
_ = ln_scaled_eps.load_state_dict(ln64.state_dict())

# %%
checks = Checks("RMSNorm against PyTorch, Llama and its Jacobian")
checks.close("RMSNorm vs torch.nn.RMSNorm (float32)", torch_rms(X), rms(X), tol=1e-6, rel=True)
checks.close("RMSNorm vs LlamaRMSNorm (float32)", llama_rms(X), rms(X), tol=1e-6, rel=True)
checks.close("RMSNorm vs LlamaRMSNorm (bfloat16 input)", llama_rms(Xb), rms(Xb), tol=0)
checks.close("eps = 1e-5, mean square ~ eps: vs torch.nn.RMSNorm", torch_eps5(X_tiny), rms_eps5(X_tiny), tol=1e-14)
checks.close("eps = 1e-5, mean square ~ eps: vs LlamaRMSNorm (float32 inside)", llama_eps5(X_tiny),
             rms_eps5(X_tiny), tol=1e-6, rel=True)
eps_gap = (rms_eps5(X_tiny) - rms64(X_tiny)).abs().max()
checks.true("... where eps 1e-5 vs 1e-6 moves outputs by > 0.1", bool(eps_gap > 0.1), got=eps_gap)
checks.close("Jacobian: closed form vs autograd (float64)", J_rms_auto, J_rms_ours, tol=1e-13)
checks.close("RMS_eps(7.5 x) = RMS_{eps/7.5^2}(x)", rms_scaled_eps(X64), rms64(7.5 * X64), tol=1e-13)
checks.close("LN_eps(0.2 x + 4) = LN_{eps/0.2^2}(x)", ln_scaled_eps(X64), ln64(0.2 * X64 + 4), tol=1e-13)
checks.close("LN(0.2 x + 4) ~ LN(x): the eps effect", ln64(X64), ln64(0.2 * X64 + 4), tol=1e-3)
shift_gap = (rms64(X64 + 3) - rms64(X64)).abs().max()
checks.true("RMS(x + 3) != RMS(x): max |diff| > 0.1", bool(shift_gap > 0.1), got=shift_gap)
checks.true("gradcheck in x", torch.autograd.gradcheck(rms64, (X64[:2, :2].clone().requires_grad_(),)),
            got=GRADCHECK)
checks

# %% [markdown]
# The invariances hold to round-off once $\varepsilon$ is rescaled to $\varepsilon/\alpha^2$.
# With the same $\varepsilon$ they are approximate, and the error grows when $\alpha < 1$
# shrinks the input toward $\sqrt{\varepsilon}$: here $\alpha = 0.2$ turns
# $\varepsilon = 10^{-5}$ into an effective $2.5 \times 10^{-4}$, and the outputs move by
# up to $2 \times 10^{-4}$.
#
# ## 6.3 Residual connections: pre-LN and post-LN
#
# A residual block (He et al., 2016, "Deep Residual Learning for Image Recognition")
# adds a sub-layer's output to its input, $y = x + F(x)$. Its Jacobian is
#
# $$ \frac{\partial y}{\partial x} = I + J_F(x), $$
#
# so the gradient $g$ arriving at $y$ leaves as $g + J_F^\top g$: the identity term passes
# it through unchanged, whatever $F$ does. SymPy, with $F$ an arbitrary (undefined)
# function of two variables:

# %%
u = sp.Matrix(sp.symbols("x_0:2", real=True))
F_sym = sp.Matrix([sp.Function("F_0")(*u), sp.Function("F_1")(*u)])
J_res = (u + F_sym).jacobian(u)
assert sp.simplify(J_res - (sp.eye(2) + F_sym.jacobian(u))) == sp.zeros(2, 2)
display(sp.Eq(sp.Symbol(r"\partial (x + F(x)) / \partial x"), J_res, evaluate=False))

# %% [markdown]
# The original transformer (Vaswani et al., 2017, "Attention Is All You Need") normalised
# *after* the residual sum; GPT-2 moved the norm to the *input* of the sub-layer and added
# one final norm after the last block. For a stack of $L$ blocks with sub-layers $F_l$:
#
# $$ \text{post-LN: } x_{l+1} = \mathrm{LN}\big(x_l + F_l(x_l)\big), \qquad
#    \text{pre-LN: } x_{l+1} = x_l + F_l\big(\mathrm{LN}(x_l)\big), \ \text{output } \mathrm{LN}(x_L). $$
#
# By the chain rule their Jacobians are
# $J_{\mathrm{LN}}(x_l + F_l(x_l))\,(I + J_{F_l}(x_l))$ and
# $I + J_{F_l}(\mathrm{LN}(x_l))\,J_{\mathrm{LN}}(x_l)$. In pre-LN the identity is outside,
# so the product over the layers $\prod_l (I + \dots)$ contains the bare identity path from
# the loss to the input; in post-LN every path passes through every LayerNorm. We check both
# block Jacobians with an MLP as $F$ (section 6.5), in float64:

# %%
mlp64 = MLP(d, 3 * d, dtype=torch.float64)
ln_plain = LayerNorm(d, dtype=torch.float64)  # at initialisation: gamma = 1, beta = 0
xv = X64[1, 2]


def pre_ln_block(x_):
    return x_ + mlp64(ln_plain(x_))


def post_ln_block(x_):
    return ln_plain(x_ + mlp64(x_))


def J_of(f, x_):
    return torch.autograd.functional.jacobian(f, x_)


eye = torch.eye(d, dtype=torch.float64)
pre_chain = eye + J_of(mlp64, ln_plain(xv)) @ layer_norm_jacobian(xv)
post_chain = layer_norm_jacobian(xv + mlp64(xv)) @ (eye + J_of(mlp64, xv))

# %%
checks = Checks("residual block Jacobians (float64)")
checks.close("x + F(x): autograd vs I + J_F", eye + J_of(mlp64, xv), J_of(lambda v: v + mlp64(v), xv), tol=1e-14)
checks.close("pre-LN: autograd vs I + J_F J_LN", pre_chain, J_of(pre_ln_block, xv), tol=1e-13)
checks.close("post-LN: autograd vs J_LN (I + J_F)", post_chain, J_of(post_ln_block, xv), tol=1e-13)
checks.close("post-LN block: J 1 = 0 (the sum's shift is lost)", torch.zeros(d),
             layer_norm_jacobian(xv + mlp64(xv)) @ ones_d, tol=1e-14)
checks

# %% [markdown]
# ### Gradients through depth
#
# Now a stack of $L$ random blocks, each an MLP of width $d = 64$, $d_{ff} = 256$
# (weights $\mathcal N(0, 1/\text{fan-in})$, zero biases), applied to $T = 16$ random
# positions in float64, with the loss $\mathcal L = \langle w, \text{output} \rangle / \sqrt{Td}$
# for a fixed random $w$. For each depth and 4 seeds we record the gradient norm at the
# input, $\lVert \partial \mathcal L / \partial x_0 \rVert$, and at the first weight matrix
# of the *last* block. Xiong et al. (2020, "On Layer Normalization in the Transformer
# Architecture") prove that at initialisation the last block's gradient stays the same size
# for any $L$ in post-LN but shrinks like $1/\sqrt L$ in pre-LN: there the residual stream
# $x_L$ is a sum of $L$ roughly independent terms, its scale $\mathrm{rms}(x_L)$ grows like
# $\sqrt L$ (derived and fitted below), and the final LayerNorm divides every gradient by it
# (its Jacobian carries $1/s$).

# %%
def random_stack(L, seed, d=64, d_ff=256):
    gen = torch.Generator().manual_seed(seed)
    blocks = [MLP(d, d_ff, activation="gelu_tanh", dtype=torch.float64) for _ in range(L)]
    with torch.no_grad():
        for m in blocks:
            m.fc.weight.normal_(0.0, d**-0.5, generator=gen)
            m.proj.weight.normal_(0.0, d_ff**-0.5, generator=gen)
            m.fc.bias.zero_()
            m.proj.bias.zero_()
    x0 = torch.randn(16, d, generator=gen, dtype=torch.float64, requires_grad=True)  # (T, d)
    w = torch.randn(16, d, generator=gen, dtype=torch.float64)
    return blocks, x0, w


# %%
def gradient_norms(L, seed, pre_ln):
    """(|dL/dx_0|, |dL/dW_fc| of the last block, rms of the residual stream x_L)."""
    blocks, x0, w = random_stack(L, seed)
    norm = LayerNorm(x0.shape[-1], dtype=torch.float64)
    x_ = x0
    for m in blocks:
        x_ = x_ + m(norm(x_)) if pre_ln else norm(x_ + m(x_))
    out = norm(x_) if pre_ln else x_
    ((w * out).sum() / math.sqrt(w.numel())).backward()
    return x0.grad.norm().item(), blocks[-1].fc.weight.grad.norm().item(), x_.pow(2).mean().sqrt().item()


depths, seeds = [1, 2, 4, 8, 16, 32, 64], range(4)
runs = {arch: np.array([[gradient_norms(L, s, arch == "pre-LN") for s in seeds] for L in depths])
        for arch in ("pre-LN", "post-LN")}  # (depths, seeds, 3)

# %%
for arch, res in runs.items():
    print(f"{arch:8s} |dL/dx0| mean:", np.round(res[:, :, 0].mean(1), 3))
    print(f"{'':8s} |dL/dW| last block:", np.round(res[:, :, 1].mean(1), 3))
    print(f"{'':8s} rms(x_L):", np.round(res[:, :, 2].mean(1), 3))
    print(f"{'':8s} |dL/dx0| over seeds at L = {depths[-1]}:", np.round(np.sort(res[-1, :, 0]), 3))
pre = runs["pre-LN"].mean(1)
print("pre-LN |dL/dW_last| * rms(x_L):", np.round(pre[:, 1] * pre[:, 2], 2))

# %% [markdown]
# Is the growth of $\mathrm{rms}(x_L)$ really $\sqrt L$? A prediction first, made before looking
# at the runs. In pre-LN each block adds $W_2\,\mathrm{GELU}(W_1\,\mathrm{LN}(x))$ to the stream.
# $\mathrm{LN}(x)$ has mean square 1 (up to $\varepsilon$), so with $W_1 \sim \mathcal N(0, 1/d)$
# every pre-activation is $\mathcal N(0, 1)$; with $W_2 \sim \mathcal N(0, 1/d_{ff})$ each output
# component has variance $m = \mathbb{E}[\mathrm{GELU}_{\tanh}(z)^2]$, $z \sim \mathcal N(0, 1)$; and
# fresh weights make the increments uncorrelated with the stream. So
# $\mathbb{E}\,\mathrm{rms}(x_L)^2 = 1 + mL$ (the 1 is $x_0$): $\sqrt L$ only asymptotically, with
# the local log-log slope $\tfrac12\,mL/(1 + mL)$. mpmath integrates $m$:

# %%
mp.mp.dps = 20
m_gelu = float(mp.quad(lambda z: (z / 2 * (1 + mp.tanh(mp.sqrt(2 / mp.pi) * (z + mp.mpf("0.044715") * z**3))))**2
                       * mp.npdf(z), [-mp.inf, 0, mp.inf]))
print(f"m = E[GELU_tanh(z)^2] = {m_gelu:.6f}; predicted rms(x_L) = sqrt(1 + m L)")

# %% [markdown]
# Against the $4 \times 7$ measured values (four seeds at each depth), in log space: the
# prediction (no free parameter), $a\sqrt L$, $aL$ and a constant $a$ (one fitted parameter
# each, least squares), and a free power law $aL^b$, whose slope $b$ gets a 95% interval
# from ordinary least squares. Only the deepest four depths ($L \ge 8$) go into the power
# law, where the prediction's own local slope is between 0.39 and 0.48, so that fit is
# compared with the same fit to the predicted curve.

# %%
L_all = np.repeat(np.array(depths, dtype=float), len(seeds))  # (28,)
log_rms = np.log(runs["pre-LN"][:, :, 2].reshape(-1))  # (28,) depth-major, as L_all
models = {"sqrt(1 + m L), derived": 0.5 * np.log1p(m_gelu * L_all)}
for name, shape in (("a sqrt(L)", 0.5 * np.log(L_all)), ("a L", np.log(L_all)), ("a (constant)", 0 * L_all)):
    models[name] = shape + (log_rms - shape).mean()  # least squares for the free log a
rss = {name: float(((log_rms - pred) ** 2).sum()) for name, pred in models.items()}
deep = L_all >= 8
fit = stats.linregress(np.log(L_all[deep]), log_rms[deep])
half_width = stats.t.ppf(0.975, deep.sum() - 2) * fit.stderr
slope_pred = np.polyfit(np.log(L_all[deep]), 0.5 * np.log1p(m_gelu * L_all[deep]), 1)[0]
for name, r in rss.items():
    print(f"  {name:24s} residual sum of squares (log rms): {r:.3f}")
print(f"power law on L >= 8: slope b = {fit.slope:.3f} +- {half_width:.3f} (95%); "
      f"the prediction's slope there: {slope_pred:.3f}")
checks = Checks("residual-stream growth in pre-LN: sqrt(1 + m L)")
checks.true("derived curve fits better than a sqrt(L), a L, a", rss["sqrt(1 + m L), derived"] < min(
    v for k, v in rss.items() if k != "sqrt(1 + m L), derived"), got=round(rss["sqrt(1 + m L), derived"], 3))
checks.close("fitted slope (L >= 8) vs the prediction's, 95% interval", slope_pred, fit.slope, tol=half_width)
checks.true("slope interval excludes 1 (linear) and 0 (constant)",
            fit.slope - half_width > 0 and fit.slope + half_width < 1, got=round(fit.slope, 3))
checks

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
colours = {"pre-LN": "tab:blue", "post-LN": "tab:red"}
for k, (ax, what) in enumerate(zip(axes, ["input $x_0$", "first weight of the last block"], strict=True)):
    for arch, res in runs.items():
        mean, lo, hi = res[:, :, k].mean(1), res[:, :, k].min(1), res[:, :, k].max(1)
        ax.plot(depths, mean, "o-", color=colours[arch], label=f"{arch} (mean of 4 seeds)")
        ax.fill_between(depths, lo, hi, color=colours[arch], alpha=0.2)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("number of blocks L")
    ax.set_ylabel("gradient norm (loss units per unit input)")
    ax.set_title(f"gradient at the {what}")
pre_pred = pre[0, 1] * pre[0, 2] / pre[:, 2]
axes[1].plot(depths, pre_pred, "k--", lw=1, label=r"pre-LN, $\propto 1/\mathrm{rms}(x_L)$")
axes[0].legend(fontsize="small")
axes[1].legend(fontsize="small")
fig.suptitle("Gradient norms at initialisation versus depth (float64; band: min to max over seeds)", y=1.02)
save_figure(fig, "06_norms_ffn_depth_gradients")
plt.show()

# %% [markdown]
# Left: in pre-LN the gradient at the input stays near 1 at every depth, with a narrow
# band across seeds (1.1 to 1.3 at $L = 64$); the identity path delivers it. In post-LN it
# drifts upward and its spread across seeds widens with depth (1.3 to 3.5 at $L = 64$): the
# gradient is a product of $L$ LayerNorm Jacobians and $L$ factors
# $I + J_F$, each a little off from norm-preserving. Right: the last block's weight gradient
# is flat for post-LN, as Xiong et al. predict, while for pre-LN it falls exactly as
# $1/\mathrm{rms}(x_L)$ (the dashed line, anchored at $L = 1$; the printed product
# $\lVert \partial\mathcal L/\partial W \rVert \cdot \mathrm{rms}(x_L)$ is nearly constant).
# Xiong et al. trace post-LN's need for a learning-rate warm-up to these large gradients near
# the output. Modern decoders (GPT-2, Llama, Qwen2) are all pre-norm.
#
# ## 6.4 GELU: exact and tanh
#
# The feed-forward layer needs a nonlinearity. GPT-2 uses the Gaussian error linear unit
# (Hendrycks & Gimpel, 2016, "Gaussian Error Linear Units (GELUs)"): weight $x$ by the
# probability that a standard normal falls below it,
#
# $$ \mathrm{GELU}(x) = x\,\Phi(x) = \frac x2\left(1 + \operatorname{erf}\frac{x}{\sqrt 2}\right). $$
#
# The same paper proposes a cheaper form that GPT-2 adopted (Hugging Face calls it
# `gelu_new`; PyTorch `approximate="tanh"`):
#
# $$ \mathrm{GELU}_{\tanh}(x) = \frac x2\left(1 + \tanh\!\Big(\sqrt{2/\pi}\,(x + c\,x^3)\Big)\right),
#    \qquad c = 0.044715 . $$
#
# Where does it come from? Both functions are $x/2$ plus $x/2$ times an odd function, so
# their Taylor series contain $x$ and even powers only. SymPy expands both with $c$ left symbolic:

# %%
xs, c = sp.Symbol("x", real=True), sp.Symbol("c", positive=True)
gelu_exact = xs / 2 * (1 + sp.erf(xs / sp.sqrt(2)))
gelu_tanh = xs / 2 * (1 + sp.tanh(sp.sqrt(2 / sp.pi) * (xs + c * xs**3)))
series_exact = sp.series(gelu_exact, xs, 0, 7).removeO()
series_tanh = sp.expand(sp.series(gelu_tanh, xs, 0, 7).removeO())
display(sp.Eq(sp.Symbol(r"\mathrm{GELU}(x)"), series_exact + sp.O(xs**7)))
display(sp.Eq(sp.Symbol(r"\mathrm{GELU}_{\tanh}(x)"), sp.collect(series_tanh, xs) + sp.O(xs**7)))

# %% [markdown]
# The coefficients of $x$ and $x^2$ agree for every $c$ (that is what the factor
# $\sqrt{2/\pi} = 2\varphi(0)$ is for) and there is no $x^3$ term, so the approximation is
# exact through third order for any $c$: the error is $O(x^4)$. Matching the $x^4$
# coefficient as well would need $c^* = (4 - \pi)/(6\pi) \approx 0.04554$:

# %%
c_star = sp.solve(sp.Eq(series_tanh.coeff(xs, 4), series_exact.coeff(xs, 4)), c)[0]
assert sp.simplify(c_star - (4 - sp.pi) / (6 * sp.pi)) == 0
for n in (1, 2, 3):
    assert sp.simplify(series_tanh.coeff(xs, n) - series_exact.coeff(xs, n)) == 0
x4_gap = sp.simplify((series_tanh - series_exact).coeff(xs, 4).subs(c, sp.Rational(44715, 10**6)))
display(sp.Eq(sp.Symbol("c^*"), c_star), sp.Eq(sp.Symbol("c^*_{float}"), sp.N(c_star, 6)))
print(f"x^4 coefficient of GELU_tanh - GELU at c = 0.044715: {float(x4_gap):.4g}")

# %% [markdown]
# The published constant 0.044715 is *not* the Taylor value, so it gives up the $x^4$ match
# near 0 (an error term of $-3.3 \times 10^{-4}\,x^4$). What is it, then? The tanh formula is
# really an approximation of the normal CDF, $\Phi(x) \approx \frac12\big(1 + \tanh(\sqrt{2/\pi}\,
# (x + c x^3))\big)$, and GELU multiplies it by $x$. Hendrycks & Gimpel state the constant
# without a derivation; it is the **minimax** constant for $\Phi$: the $c$ that makes the
# largest error of the CDF approximation over the whole line as small as possible. A
# ternary search over $c$ (the maximum error is unimodal in $c$) on a float64 grid finds it:

# %%
x_line = torch.linspace(-8, 8, 160001, dtype=torch.float64)
lo, hi = 0.040, 0.050
for _ in range(60):  # ternary search on max |Phi_tanh(x; c) - Phi(x)| over the grid
    c1, c2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
    e1, e2 = (tanh_cdf_error(x_line, c_).abs().max().item() for c_ in (c1, c2))
    lo, hi = (lo, c2) if e1 < e2 else (c1, hi)
checks = Checks("where 0.044715 comes from")
checks.true("minimax c for Phi (6 decimals) = 0.044715", round(lo, 6) == 0.044715,
            f"{lo:.6f}")
checks

# %% [markdown]
# How large is that smallest maximum error? The grid gives one answer; an independent one
# comes from mpmath at 30 significant digits, with no grid: the extremes of the error
# $f(x) = \Phi_{\tanh}(x) - \Phi(x)$ are the roots of $f'(x) = 0$, which SymPy differentiates
# and mpmath solves by Newton's method, started from the grid's local extremes (the package's
# `critical_extremes`, below; the grid values come from `tanh_cdf_error`). The two must
# agree to within what a grid of step $h$ can miss at a smooth maximum, at most
# $\tfrac12 (h/2)^2 \max|f''|$ (Taylor's theorem at the maximiser, where $f' = 0$); $\max|f''|$
# is bounded on the grid with a factor 2 to spare. The same procedure, applied to
# $\mathrm{GELU}_{\tanh} - \mathrm{GELU}$ on $[-6, 6]$, gives the number the next figure shows.

# %%
show_source(critical_extremes)

# %%
cdf_tanh_c = (1 + sp.tanh(sp.sqrt(2 / sp.pi) * (xs + sp.Rational(44715, 10**6) * xs**3))) / 2
cdf_err_expr = cdf_tanh_c - (1 + sp.erf(xs / sp.sqrt(2))) / 2
cdf_err_grid = tanh_cdf_error(x_line, 0.044715)  # float64, the same expression on the grid
cdf_extremes = critical_extremes(cdf_err_expr, xs, x_line, cdf_err_grid)
cdf_max_mp = max(abs(v) for _, v in cdf_extremes)
f2 = sp.lambdify(xs, sp.diff(cdf_err_expr, xs, 2), "math")
h_line = (x_line[1] - x_line[0]).item()
curv = max(abs(f2(t)) for t in x_line[::100].tolist())  # max |f''| on a grid of step 0.01
print(f"max |Phi_tanh - Phi| (mpmath, 30 digits): {mp.nstr(cdf_max_mp, 6)} at |x| = "
      f"{mp.nstr(abs(max(cdf_extremes, key=lambda e: abs(e[1]))[0]), 4)}")
checks = Checks("the minimax CDF error: float64 grid vs mpmath")
checks.close("max |Phi_tanh - Phi|: grid vs mpmath", float(cdf_max_mp), cdf_err_grid.abs().max(),
             tol=0.5 * (h_line / 2) ** 2 * 2 * curv)
checks

# %% [markdown]
# So the constant is optimal for the CDF, in the max norm, not for GELU itself: multiplying
# by $x$ weights the CDF's errors by $|x|$, which moves the best constant for GELU (in the
# same sense) to about 0.04438 (exercise 3). We now measure the GELU error of the published
# and the Taylor constants on a fine grid in float64. First, the package function, and its
# agreement with PyTorch:

# %%
show_source(gelu)

# %%
grid32 = torch.linspace(-6, 6, 12001)  # float32
grid = torch.linspace(-6, 6, 120001, dtype=torch.float64)  # step 1e-4
err = gelu(grid, "tanh") - gelu(grid)
err_taylor = (grid / 2 * (1 + torch.tanh(math.sqrt(2 / math.pi) * (grid + float(c_star) * grid**3)))
              - gelu(grid))
i_max = int(err.abs().argmax())
checks = Checks("GELU against PyTorch; the tanh error")
checks.close("gelu exact vs F.gelu (float32)", F.gelu(grid32), gelu(grid32), tol=1e-6, rel=True)
checks.close("gelu tanh vs F.gelu(approximate=tanh) (float32)", F.gelu(grid32, approximate="tanh"),
             gelu(grid32, "tanh"), tol=1e-6, rel=True)
checks.close("gelu tanh vs transformers gelu_new (float32)", transformers.activations.ACT2FN["gelu_new"](grid32),
             gelu(grid32, "tanh"), tol=1e-6, rel=True)
checks.close("exact at x = 1: Phi(1)", 0.8413447460685429, gelu(torch.tensor(1.0, dtype=torch.float64)), tol=1e-15)
gelu_err_expr = gelu_tanh.subs(c, sp.Rational(44715, 10**6)) - gelu_exact
gelu_extremes = critical_extremes(gelu_err_expr, xs, grid, err)
gelu_max_mp = max(abs(v) for _, v in gelu_extremes)
f2_gelu = sp.lambdify(xs, sp.diff(gelu_err_expr, xs, 2), "math")
curv_gelu = max(abs(f2_gelu(t)) for t in grid[::100].tolist())
checks.close("max |tanh - exact| on [-6, 6]: grid vs mpmath", float(gelu_max_mp), err.abs().max(),
             tol=0.5 * (1e-4 / 2) ** 2 * 2 * curv_gelu)
checks.true("the Taylor constant c* is worse in max norm", err_taylor.abs().max() > err.abs().max(),
            err_taylor.abs().max().item())
checks

# %%
print(f"max |GELU_tanh - GELU| on [-6, 6]: {err.abs().max().item():.4g} at x = {grid[i_max].item():+.3f}"
      f" (mpmath: {mp.nstr(gelu_max_mp, 4)})")
print(f"most negative: {err.min().item():.4g} at |x| = {grid[int(err.argmin())].abs().item():.3f}")
print(f"with the Taylor constant c* = {float(c_star):.5f}: {err_taylor.abs().max().item():.4g}")
print(f"near 0, |x| < 0.1: {err[grid.abs() < 0.1].abs().max().item():.3g} (an O(x^4) error)")

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
xg = grid.numpy()
axes[0].plot(xg, gelu(grid).numpy(), color="black", label=r"GELU $x\Phi(x)$")
axes[0].plot(xg, F.relu(grid).numpy(), color="grey", ls=":", label="ReLU")
axes[0].plot(xg, F.silu(grid).numpy(), color="tab:green", ls="--", label=r"SiLU $x\sigma(x)$")
axes[0].set_xlim(-4, 3)
axes[0].set_ylim(-0.6, 3)
axes[0].set(title="activations", xlabel="pre-activation x (dimensionless)", ylabel="output (dimensionless)")
axes[0].legend(fontsize="small")
axes[1].plot(xg, err.numpy(), color="tab:blue", label="c = 0.044715 (GPT-2)")
axes[1].plot(xg, err_taylor.numpy(), color="tab:orange", lw=1, label=f"c* = {float(c_star):.5f} (Taylor)")
axes[1].axhline(0, color="black", lw=0.5)
axes[1].set(title=r"error of the tanh approximation, GELU$_{\tanh}$ $-$ GELU",
            xlabel="x (dimensionless)", ylabel="error (output units)")
axes[1].legend(fontsize="small", loc="lower right")
fig.tight_layout()
save_figure(fig, "06_norms_ffn_gelu_error")
plt.show()

# %% [markdown]
# Left: GELU is a smooth ReLU that dips slightly below zero (minimum about $-0.17$ near
# $x = -0.75$); SiLU, the gate of section 6.5, is a close cousin. Right: the tanh form is
# off by at most $4.7 \times 10^{-4}$, at $|x| \approx 2.7$. The error
# $\frac x2(\tanh(\cdot) - \operatorname{erf}(\cdot))$ is $x$ times an odd function, hence
# even: two positive peaks at $\pm 2.7$, two negative dips of $-2.3 \times 10^{-4}$ near
# $\pm 1.4$, a flat fourth-order start at 0, and fast decay in both tails. The Taylor
# constant (orange) removes the dips but raises the peaks to $7.5 \times 10^{-4}$. GPT-2's
# constant, optimal for $\Phi$ rather than for $x\Phi(x)$, lets the positive peaks stand
# about twice as high as the dips; a constant fitted to GELU's own maximum error would even
# them out (exercise 3). Small as it is, the difference is far above float32 round-off,
# so a model must be run with the GELU it was trained with to reproduce its logits: GPT-2
# with the tanh form.
#
# ## 6.5 The feed-forward layer: MLP and SwiGLU
#
# GPT-2's feed-forward layer is a two-layer perceptron applied to every position,
#
# $$ \mathrm{MLP}(x) = W_2\, \mathrm{GELU}_{\tanh}(W_1 x + b_1) + b_2, \qquad
#    W_1 \in \mathbb{R}^{d_{ff} \times d},\ W_2 \in \mathbb{R}^{d \times d_{ff}},\ d_{ff} = 4d, $$
#
# with the submodules called `fc` and `proj`. (Hugging Face's GPT-2 stores the two matrices
# transposed, as `Conv1D` weights of shape (in, out); the loader of chapter 7 transposes them.)

# %%
show_source(MLP)

# %% [markdown]
# Shazeer (2020, "GLU Variants Improve Transformer") replaced the activation by a *gated*
# linear unit: two projections of $x$, one passed through an activation and used to gate the
# other elementwise. With the SiLU (Swish with $\beta = 1$), $\mathrm{SiLU}(z) = z\,\sigma(z)$,
# this is SwiGLU, the feed-forward layer of Llama, Qwen2 and most open models since:
#
# $$ \mathrm{SwiGLU}(x) = W_{\text{down}}\big(\mathrm{SiLU}(W_{\text{gate}} x) \odot W_{\text{up}} x\big). $$
#
# No biases, and three matrices instead of two. The submodule names are Llama's, so a
# Llama state dict loads directly.

# %%
show_source(SwiGLU)

# %% [markdown]
# Checks against `transformers`, built locally from configurations and given our (random)
# weights: GPT-2's `GPT2MLP` (with the transposes) and Llama's `LlamaMLP`, on
# $B = 3$, $T = 5$, $d = 8$ and $d_{ff} = 20$, plus `gradcheck` for both layers in float64.

# %%
d_ff = 20
mlp = MLP(d, d_ff)
gpt2_mlp = GPT2MLP(d_ff, transformers.GPT2Config(n_embd=d, n_head=2, resid_pdrop=0.0)).eval()
with torch.no_grad():
    gpt2_mlp.c_fc.weight.copy_(mlp.fc.weight.T)  # Conv1D weight is (in, out)
    gpt2_mlp.c_fc.bias.copy_(mlp.fc.bias)
    gpt2_mlp.c_proj.weight.copy_(mlp.proj.weight.T)
    gpt2_mlp.c_proj.bias.copy_(mlp.proj.bias)
swiglu = SwiGLU(d, d_ff)
llama_cfg = transformers.LlamaConfig(hidden_size=d, intermediate_size=d_ff, hidden_act="silu",
                                     num_attention_heads=2, num_key_value_heads=2)
llama_mlp = LlamaMLP(llama_cfg)
_ = llama_mlp.load_state_dict(swiglu.state_dict())

# %%
sw = swiglu
by_hand = (F.silu(X @ sw.gate_proj.weight.T) * (X @ sw.up_proj.weight.T)) @ sw.down_proj.weight.T
X_small = X64[:2, :2].clone().requires_grad_()
checks = Checks("feed-forward layers against transformers")
checks.close("MLP vs GPT2MLP (float32)", gpt2_mlp(X), mlp(X), tol=1e-6, rel=True)
checks.close("SwiGLU vs LlamaMLP (float32)", llama_mlp(X), swiglu(X), tol=1e-6, rel=True)
checks.close("SwiGLU vs the formula, by hand (float32)", by_hand, swiglu(X), tol=1e-6, rel=True)
checks.equal("SwiGLU state dict keys = LlamaMLP's", sorted(llama_mlp.state_dict()), sorted(swiglu.state_dict()))
checks.true("gradcheck MLP (float64)", torch.autograd.gradcheck(MLP(d, d_ff, dtype=torch.float64), (X_small,)),
            got=GRADCHECK)
checks.true("gradcheck SwiGLU (float64)", torch.autograd.gradcheck(SwiGLU(d, d_ff, dtype=torch.float64), (X_small,)),
            got=GRADCHECK)
checks

# %% [markdown]
# ### Counting parameters: why $d_{ff} \approx \frac23 \cdot 4d$
#
# An MLP with $d_{ff} = 4d$ holds $2 \cdot d \cdot 4d = 8d^2$ weights. A SwiGLU layer holds
# $3\,d\,d_{ff}$. To compare the two at equal size, Shazeer (2020) shrinks the hidden width
# of the gated variants by $2/3$; SymPy solves for it:

# %%
d_sym, dff_sym = sp.symbols("d d_ff", positive=True)
mlp_count = 2 * d_sym * (4 * d_sym) + 4 * d_sym + d_sym  # weights + biases, d_ff = 4d
swiglu_count = 3 * d_sym * dff_sym
(dff_equal,) = sp.solve(sp.Eq(swiglu_count, 2 * d_sym * (4 * d_sym)), dff_sym)
assert sp.simplify(dff_equal - sp.Rational(2, 3) * 4 * d_sym) == 0
display(sp.Eq(sp.Symbol("d_{ff}"), dff_equal), sp.Eq(sp.Symbol(r"N_{\mathrm{MLP}}"), mlp_count))

# %% [markdown]
# $8d/3$ is rarely an integer, let alone a fast matrix size, so Llama's reference code
# (Touvron et al., 2023, "LLaMA: Open and Efficient Foundation Language Models") rounds it up
# to a multiple of 256; Llama 2 70B and Llama 3 also scale by a multiplier of 1.3 and round
# to a multiple of 1024 or 4096:

# %%
show_source(swiglu_hidden_size)

# %% [markdown]
# The counts against the real layers, built on PyTorch's `meta` device (shapes only, no
# memory): GPT-2 small's MLP ($d = 768$) and the feed-forward layers of the Llama 7B and
# Llama 3 8B shapes ($d = 4096$; `LlamaConfig`'s default `intermediate_size` is Llama 7B's).

# %%
with torch.device("meta"):
    gpt2_full = GPT2MLP(3072, transformers.GPT2Config())
    llama7 = LlamaMLP(transformers.LlamaConfig())
    llama3 = LlamaMLP(transformers.LlamaConfig(intermediate_size=swiglu_hidden_size(4096, 1024, 1.3)))


def n_params(m):
    return sum(p.numel() for p in m.parameters())


checks = Checks("feed-forward parameter counts")
checks.equal("GPT-2 small MLP = 2 d d_ff + d_ff + d", n_params(gpt2_full), mlp_parameter_count(768, 3072))
checks.equal("GPT-2 small MLP = SymPy count at d = 768", n_params(gpt2_full), int(mlp_count.subs(d_sym, 768)))
checks.equal("Llama 7B d_ff from d = 4096", transformers.LlamaConfig().intermediate_size, swiglu_hidden_size(4096))
checks.equal("Llama 7B SwiGLU = 3 d d_ff", n_params(llama7), swiglu_parameter_count(4096, 11008))
checks.equal("Llama 3 8B d_ff (x1.3, multiple of 1024)", 14336, swiglu_hidden_size(4096, 1024, 1.3))
checks.equal("Llama 3 8B SwiGLU = 3 d d_ff", n_params(llama3), swiglu_parameter_count(4096, 14336))
checks

# %%
ratios = {}
for name, n_ff, count in [("MLP d_ff = 4d", 4 * 4096, mlp_parameter_count(4096, 4 * 4096, bias=False)),
                          ("SwiGLU d_ff = 11008", 11008, swiglu_parameter_count(4096, 11008))]:
    ratios[name] = sp.Rational(count, 4096**2)  # exact, in units of d^2
    print(f"d = 4096, {name:20s}: {count:,} weights = {ratios[name]} d^2 = {float(ratios[name])} d^2"
          f" (d_ff / d = {sp.Rational(n_ff, 4096)})")
excess = ratios["SwiGLU d_ff = 11008"] / ratios["MLP d_ff = 4d"] - 1
print(f"SwiGLU / MLP - 1 = {excess} = {float(excess):.2%}")

# %% [markdown]
# Rounding $8d/3 \approx 10{,}922.7$ up to 11,008 makes Llama 7B's SwiGLU exactly
# $129/16\,d^2 = 8.0625\,d^2$ against the MLP's $8\,d^2$, larger by $1/128 \approx 0.78\%$
# (the exact fractions printed above): in a Llama block, as in GPT-2's, the
# feed-forward layer holds about two thirds of the weights (attention has $4d^2$).
#
# ## 6.6 A published worked example, checked
#
# The file `data/worked_examples/the_cat_sat.json` holds a published, hand-computed walk
# through one layer of a toy transformer (vocabulary of 5, $d = 4$): its exact inputs and
# every value the source printed, rounded by hand. Chapter 4 recomputed its attention; this
# chapter's part is the feed-forward sub-layer. The source applies it in its own simplified
# way, which we follow to the letter: the FFN acts on the raw embedding $x_2 = E_2$ of "sat"
# (not on the attention output), with a ReLU, $\mathrm{FFN}(x) = W_2\,\mathrm{ReLU}(W_1 x +
# b_1) + b_2$ with $d_{ff} = 3$; then the residual $y = x_2 + \mathrm{FFN}(x_2)$ and a
# LayerNorm *after* the sum (the post-LN order of section 6.3) with $\gamma = 1$, $\beta = 0$
# and $\varepsilon = 0$. The package's `MLP` with `activation="relu"` and `LayerNorm` with
# `eps=0.0` compute exactly this, in float64; `ffn_step` builds them with the source's weights
# once, for this chapter and for chapters 7 and 12, which continue from its output:

# %%
show_source(ffn_step)

# %%
ex = load_the_cat_sat()
W = ex.inputs
print("source's note:", W["ffn_note"])
step = ffn_step(ex)
x2, pre_act, ffn_out, resid = step["x"], step["pre_activation"], step["ffn_out"], step["residual"]
ln_mean, ln_var, h_last = step["mean"], step["variance"], step["h_last"]
for name, v in [("W1 x + b1", pre_act), ("ReLU", pre_act.relu()), ("FFN(x_2)", ffn_out),
                ("residual", resid), ("LayerNorm", h_last)]:
    print(f"{name:10s}", np.round(v.numpy(), 6))
print(f"mean {ln_mean.item():.6f}, population variance {ln_var.item():.8f}")

# %% [markdown]
# The inputs are short decimals, so every value up to the variance is a rational number, and
# the LayerNorm output is that rational number divided by the square root of another. SymPy
# recomputes the whole sub-layer exactly, in rationals, as an independent reference for the
# float64 values; and a LayerNorm output with $\varepsilon = 0$ must have mean 0 and
# population variance 1, a test any printed answer can be put to:

# %%
def rational_matrix(t):
    """A float64 tensor of short decimals as an exact SymPy matrix (0.2 -> 1/5)."""
    rows = t.tolist() if t.ndim == 2 else [[v] for v in t.tolist()]
    return sp.Matrix([[sp.Rational(repr(v)) for v in row] for row in rows])


x2_q = rational_matrix(x2)
pre_q = rational_matrix(W["W1"]) * x2_q + rational_matrix(W["b1"])
out_q = rational_matrix(W["W2"]) * pre_q.applyfunc(lambda v: sp.Max(v, 0)) + rational_matrix(W["b2"])
resid_q = x2_q + out_q
mean_q = sum(resid_q) / 4
var_q = sum((v - mean_q) ** 2 for v in resid_q) / 4
ln_q = (resid_q - mean_q * sp.ones(4, 1)) / sp.sqrt(var_q)
display(sp.Eq(sp.Symbol(r"\sigma^2"), var_q), sp.Eq(sp.Symbol(r"\mathrm{LN}(y)_3"), sp.nsimplify(ln_q[3])))


def as_float(mat):
    return [float(sp.N(v, 30)) for v in mat]


published_ln = ex.published_tensor("layernorm_out")
checks = Checks("the worked example's FFN sub-layer: float64 against exact rationals")
checks.close("W1 x + b1", as_float(pre_q), pre_act, tol=1e-15)
checks.close("FFN(x_2) = W2 ReLU(.) + b2", as_float(out_q), ffn_out, tol=1e-15)
checks.close("residual x_2 + FFN(x_2)", as_float(resid_q), resid, tol=1e-15)
checks.close("LayerNorm mean and population variance", [float(mean_q), float(var_q)],
             [ln_mean, ln_var], tol=1e-15)
checks.close("LayerNorm output (eps = 0)", as_float(ln_q), h_last, tol=1e-15)
checks.close("its mean is 0", 0.0, h_last.mean(), tol=1e-15)
checks.close("its population variance is 1", 1.0, h_last.pow(2).mean(), tol=1e-15)
checks.true("the published output breaks it: |sum| >= 1e-4", abs(published_ln.sum().item()) >= 1e-4,
            got=round(published_ln.sum().item(), 4))
checks

# %% [markdown]
# Now every printed number against the exact one. The table (`PublishedComparison`, from
# `llmbook.text.worked_example`) grades each entry: *agrees* when it is the exact value
# rounded to the decimals printed; *rounded inputs* when it is instead what the source's own
# rounded intermediates give; *truncated* when it is cut rather than rounded; *last digit*
# when it is within 1.5 units of the last place; *error* otherwise. For the LayerNorm output
# the recomputation from rounded inputs divides the printed residual minus the printed mean
# (0.1385) by the square root of the printed variance (0.2336):

# %%
P = ex.published_tensor
ln_from_rounded = (P("residual") - P("layernorm_mean")) / P("layernorm_variance").sqrt()
table = PublishedComparison("chapter 6: FFN, residual and LayerNorm of 'sat'")
table.add("ffn_pre_activation", ex.published["ffn_pre_activation"], pre_act)
table.add("ffn_out", ex.published["ffn_out"], ffn_out)
table.add("residual", ex.published["residual"], resid)
table.add("layernorm_mean", ex.published["layernorm_mean"], ln_mean)
table.add("layernorm_variance", ex.published["layernorm_variance"], ln_var)
table.add("layernorm_out", ex.published["layernorm_out"], h_last, from_rounded=ln_from_rounded)
table.add("h_last_used_downstream", ex.published["h_last_used_downstream"], h_last,
          from_rounded=P("layernorm_out"))
table

# %%
sigma_4 = round(math.sqrt(ex.published["layernorm_variance"]), 4)  # an intermediate the source did not print
print(f"sqrt(0.2336) = {math.sqrt(0.2336):.6f}; rounded to {sigma_4}, the outputs would be",
      np.round(((P("residual") - P("layernorm_mean")) / sigma_4).numpy(), 4))
print(f"sum of the published LayerNorm output: {published_ln.sum().item():+.4f}")
print(f"with PyTorch's default eps = 1e-5 instead of 0 the outputs would move by up to "
      f"{(LayerNorm(4, dtype=torch.float64)(resid) - h_last).abs().max().item():.1e}")

# %% [markdown]
# The FFN, the residual, the mean and the variance all agree: those values are exact short
# decimals, and the source used the population variance ($\sigma^2 = 934459/4000000 =
# 0.23361475$, printed 0.2336; the sample variance, dividing by 3, would be 0.3115). The three
# entries of the LayerNorm output that do not agree are of three different kinds:
#
# * **1.3520** (exact 1.352058) is *truncated*: rounded, it is 1.3521.
# * **0.5411** (exact 0.541030, rounding to 0.5410) is off by one in the *last digit*. The
#   likeliest cause is an intermediate the source did not print: with $\sigma = \sqrt{0.2336}$
#   rounded to 0.4833 before dividing, this entry becomes 0.5411 (printed above).
# * **−1.1557** (exact −1.155508) is an *error*: 1.9 units of the last place off, and no
#   rounding of the printed intermediates gives it (the rounded $\sigma$ gives −1.1556). The
#   source could have caught it: a LayerNorm output with $\beta = 0$ sums to exactly zero,
#   and the printed one sums to −0.0002.
#
# None of the three survives into the vector the source carries forward: rounded to three
# decimals, $h_{\text{last}} = (-0.738, 1.352, 0.541, -1.156)$ agrees with the exact values,
# so the logits of chapter 7 start from correct inputs. Chapter 7 continues the example.
#
# ## Summary
#
# * LayerNorm's Jacobian is $\frac{\operatorname{diag}(\gamma)}{s}(I - \frac1d\mathbf 1\mathbf 1^\top - \frac1d\hat x\hat x^\top)$:
#   it forgets shifts exactly and scale up to $\varepsilon$, and divides gradients by $s$.
# * RMSNorm's is $\frac{\operatorname{diag}(g)}{r}(I - \frac{x x^\top}{d r^2})$: scale
#   invariance without centring; Llama normalises in float32 before applying the weight.
# * A residual block's Jacobian is $I + J_F$. Pre-LN keeps that identity on the main path:
#   input gradients stay $O(1)$ with depth, and the last blocks' gradients shrink like
#   $1/\sqrt L$ (Xiong et al., 2020), where post-LN's stay large.
# * The tanh GELU matches the exact one through $x^3$ and within $4.7 \times 10^{-4}$ everywhere.
# * SwiGLU uses three matrices; $d_{ff} = \frac23 4d$ (rounded up) keeps it the size of a $4d$ MLP.
# * A published hand-computed FFN sub-layer, recomputed exactly: its FFN, residual, mean and
#   variance agree; of its LayerNorm output one entry is truncated, one off in the last digit,
#   and one wrong (it breaks the zero sum every LayerNorm output with $\beta = 0$ has).
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/06_norms_ffn.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 06` writes a stub
# of every function, `llmbook grade 06` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_06.py` runs
# the same checks on the reference.
#
# 1. (★) **LayerNorm from RMSNorm.** Write `layer_norm_via_rms_norm(x, weight, bias, eps)`
#    that computes LayerNorm using only `RMSNorm` from `llmbook.transformer.layers` and a mean, and check
#    it against `torch.nn.LayerNorm` on a $(3, 5, 8)$ batch.
# 2. (★★) **LayerNorm backward without the matrix.** The vector-Jacobian product $J^\top g$
#    is what backpropagation needs. Show from the closed form that, with $g' = \gamma \odot g$,
#    $J^\top g = \frac1s\big(g' - \overline{g'}\,\mathbf 1 - \overline{g' \odot \hat x}\,\hat x\big)$
#    (bars are means over the $d$ features), which costs $O(d)$ instead of $O(d^2)$. Implement
#    `layer_norm_vjp(x, weight, grad_out, eps)` for $(\dots, d)$ tensors and check it against
#    autograd in float64.
# 3. (★★) **A better GELU constant?** Write `tanh_gelu_max_error(c)` (the maximum of
#    $|\mathrm{GELU}_{\tanh} - \mathrm{GELU}|$ over a grid of $[-6, 6]$ with step $10^{-4}$)
#    and find the $c$ that minimises it to 4 decimals. How far is it from 0.044715, the
#    optimum for $\Phi$ found in section 6.4, and how much smaller is its maximum error?
# 4. (★★★) **The spectrum of the RMSNorm Jacobian.** With $g = \mathbf 1$, show that
#    $\frac1r(I - \frac{x x^\top}{d r^2})$ has the eigenvalue $1/r$ with multiplicity $d - 1$
#    and the eigenvalue $\varepsilon / r^3$ along $x$. Verify it in SymPy for $d = 3$
#    (symbolic $x$ and $\varepsilon$), write `rms_norm_jacobian_condition_number(x, eps)`
#    $= r^2/\varepsilon$, and check it against `torch.linalg.cond` of `rms_norm_jacobian`.
#    What does it say about how far gradients along $x$ are damped?

# %%
from llmbook.workbench import grade

grade("06", globals())
