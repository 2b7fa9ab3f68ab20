# %% [markdown]
# # 9 Optimisers
#
# Chapter 8 computed the gradient $g = \nabla_\theta \mathcal L$ of the loss with respect to
# every parameter. This chapter is about what to do with it. The simplest answer, a small
# step against the gradient, is where we start; the rest of the chapter adds what makes
# transformers actually train:
#
# 1. **momentum**: a running sum of past gradients, which multiplies the step along
#    consistent directions by $1/(1-\mu)$;
# 2. **Adam**: per-parameter step sizes from moving averages of $g$ and $g^2$, and the bias
#    correction that their zero initialisation needs, derived in SymPy;
# 3. **AdamW**: weight decay applied to $\theta$ itself instead of added to the gradient,
#    and why this differs from an L2 penalty for Adam but not for plain SGD;
# 4. **a learning-rate schedule** (linear warmup, cosine decay) and **gradient clipping**;
# 5. the three optimisers racing on a two-dimensional valley, and a final check: on a small
#    transformer, 100 training steps with `llmbook.training.optim` give the same parameters as
#    `torch.optim`;
# 6. the optimisers practitioners use now: Muon, Adafactor and Lion, each checked against
#    PyTorch or SymPy, and the warmup-stable-decay schedule.
#
# The optimisers live in `llmbook.training.optim` as subclasses of `torch.optim.Optimizer`, so
# parameter groups and checkpoints work as in PyTorch.

# %%
import copy
import math

import matplotlib.pyplot as plt
import numpy as np
import sympy as sp
import torch
import torch.nn.functional as F
import transformers
from IPython.display import display
from torch import nn

from llmbook.nbtools import Checks, save_figure, seed_everything, show_source
from llmbook.text.data import default_source
from llmbook.text.embedding import TokenEmbedding
from llmbook.training.optim import (
    SGD,
    Adam,
    AdamW,
    clip_grad_norm_,
    cosine_schedule,
    gradient_vector,
    set_lr,
    wsd_schedule,
)
from llmbook.training.optimisers_modern import (
    Adafactor,
    Lion,
    Muon,
    least_squares_run,
    newton_schulz,
    race_with_peer,
)
from llmbook.transformer.attention import MultiHeadAttention
from llmbook.transformer.layers import MLP, LayerNorm

g = seed_everything(0)
torch.set_num_threads(1)  # every tensor here is small: one thread is faster than several
f64 = torch.float64

# %% [markdown]
# ## 9.1 Gradient descent and momentum
#
# Gradient descent moves the parameters a step of size $\eta$ (the learning rate) against
# the gradient, $\theta_t = \theta_{t-1} - \eta\, g_t$. *Stochastic* gradient descent (SGD)
# uses the gradient of the loss on a mini-batch, a noisy estimate of the full gradient.
#
# Polyak's heavy-ball momentum (Polyak, 1964, "Some methods of speeding up the convergence
# of iteration methods") keeps a buffer $b$ of past gradients and steps along it:
#
# $$ b_t = \mu\, b_{t-1} + g_t, \qquad \theta_t = \theta_{t-1} - \eta\, b_t,
#    \qquad b_0 = 0,\ 0 \le \mu < 1 . $$
#
# Unrolling the recursion gives $b_t = \sum_{i=1}^{t} \mu^{t-i} g_i$: a sum of all past
# gradients with geometrically falling weights. SymPy checks the unrolled form for
# $t = 1, \dots, 8$ with every $g_i$ a free symbol (the step from $t-1$ to $t$ is the same
# for any $t$: multiplying the sum by $\mu$ shifts every exponent by one):

# %%
mu, eta = sp.symbols("mu eta", positive=True)
t, i, k = sp.symbols("t i k", integer=True, positive=True)
G = sp.IndexedBase("g")
b = 0
for t_ in range(1, 9):
    b = mu * b + G[t_]
    assert sp.expand(b - sp.Sum(mu ** (t_ - i) * G[i], (i, 1, t_)).doit()) == 0
display(sp.Eq(sp.Symbol("b_t"), sp.Sum(mu ** (t - i) * G[i], (i, 1, t))))

# %% [markdown]
# The weights sum to $\sum_{i=1}^{t}\mu^{t-i} = (1-\mu^t)/(1-\mu) \to 1/(1-\mu)$. So
# $(1-\mu)\,b_t$ is an exponential moving average of the gradients (weights summing to
# $1 - \mu^t$), and $b_t$ itself is that average *times* $1/(1-\mu)$: where the gradient is
# steady, momentum moves $1/(1-\mu)$ times as fast as plain SGD with the same $\eta$, ten
# times for $\mu = 0.9$. Where the gradient flips sign from step to step (across a narrow
# valley) the terms cancel instead. SymPy sums the weights, finite and infinite:

# %%
weights_t = sp.summation(mu ** (t - i), (i, 1, t))
weights_inf = sp.Sum(mu**k, (k, 0, sp.oo)).doit()
weights_t = sp.piecewise_fold(weights_t).args[-1][0]  # the branch for mu != 1
assert sp.simplify(weights_t * (1 - mu) - (1 - mu**t)) == 0
assert weights_inf.args[0] == (1 / (1 - mu), mu < 1)
display(sp.Eq(sp.Sum(mu ** (t - i), (i, 1, t)), (1 - mu**t) / (1 - mu)),
        sp.Eq(sp.Sum(mu**k, (k, 0, sp.oo)), 1 / (1 - mu)))

# %% [markdown]
# PyTorch's `SGD` has two more options, kept here with the same meaning. *Dampening*
# $\tau$ scales the new gradient, $b_t = \mu b_{t-1} + (1-\tau) g_t$ (with $\tau = \mu$ the
# buffer is a true moving average). *Nesterov momentum* steps along $g_t + \mu\, b_t$
# instead of $b_t$: a look-ahead by one more momentum step, the form of Sutskever et al.
# (2013, "On the importance of initialization and momentum in deep learning") of Nesterov's
# accelerated gradient. An L2 penalty $\frac\lambda2\lVert\theta\rVert^2$ (`weight_decay`)
# adds $\lambda\theta$ to the gradient first.

# %%
show_source(SGD)

# %% [markdown]
# A check of the $1/(1-\mu)$ factor: a constant gradient (a linear loss
# $\mathcal L = c^\top\theta$, so $g = c$ at every step) must leave the buffer at
# $c\,(1-\mu^t)/(1-\mu)$ after $t$ steps, and the step $\eta\, b_t$ approaches
# $\eta\, c / (1-\mu)$:

# %%
c = torch.tensor([1.0, -2.0, 0.5], dtype=f64)
checks = Checks("momentum with a constant gradient")
for mu_, steps in [(0.9, 5), (0.9, 200), (0.5, 30)]:
    theta = nn.Parameter(torch.zeros(3, dtype=f64))
    opt = SGD([theta], lr=0.1, momentum=mu_)
    for _ in range(steps):
        theta.grad = c.clone()
        opt.step()
    checks.close(f"b_t = c (1 - mu^t) / (1 - mu), mu = {mu_}, t = {steps}",
                 c * (1 - mu_**steps) / (1 - mu_), opt.state[theta]["momentum_buffer"], tol=1e-13)
checks

# %% [markdown]
# ## 9.2 Adam and its bias correction
#
# A single learning rate suits no parameter well when gradients differ in scale by orders of
# magnitude across parameters (as in an embedding matrix, whose rare tokens get rare
# gradients). Adam (Kingma & Ba, 2015, "Adam: A Method for Stochastic Optimization",
# Algorithm 1) divides each coordinate's step by a running estimate of its gradient's
# root mean square:
#
# $$ m_t = \beta_1 m_{t-1} + (1-\beta_1)\, g_t, \qquad
#    v_t = \beta_2 v_{t-1} + (1-\beta_2)\, g_t^2, \qquad m_0 = v_0 = 0, $$
#
# $$ \hat m_t = \frac{m_t}{1-\beta_1^t}, \qquad \hat v_t = \frac{v_t}{1-\beta_2^t}, \qquad
#    \theta_t = \theta_{t-1} - \eta\, \frac{\hat m_t}{\sqrt{\hat v_t} + \varepsilon}, $$
#
# elementwise, with defaults $\beta_1 = 0.9$, $\beta_2 = 0.999$, $\varepsilon = 10^{-8}$.
# The step is invariant to rescaling the loss: multiplying every $g$ by $c > 0$ multiplies
# $\hat m$ by $c$ and $\sqrt{\hat v}$ by $c$ (up to $\varepsilon$).
#
# ### Deriving the bias correction
#
# Why divide by $1 - \beta_1^t$? The averages start at zero, so early on they are pulled
# toward zero. The recursion for $m$ is the momentum recursion with weight $1-\beta_1$ on
# the new term, so by the same unrolling
#
# $$ m_t = (1-\beta_1) \sum_{i=1}^{t} \beta_1^{t-i} g_i . $$
#
# If the gradients are stationary, $\mathbb E[g_i] = \bar g$ for every $i$, then by linearity
# of expectation $\mathbb E[m_t] = (1-\beta_1)\,\bar g \sum_{i=1}^t \beta_1^{t-i}$. SymPy
# checks the unrolled form and evaluates the sum for symbolic $t$:

# %%
beta1, beta2, gbar = sp.symbols("beta_1 beta_2 gbar", positive=True)
m = 0
for t_ in range(1, 9):
    m = beta1 * m + (1 - beta1) * G[t_]
    assert sp.expand(m - (1 - beta1) * sp.Sum(beta1 ** (t_ - i) * G[i], (i, 1, t_)).doit()) == 0
E_m = sp.summation((1 - beta1) * beta1 ** (t - i) * gbar, (i, 1, t))  # g_i -> E[g_i] = gbar
assert sp.simplify(E_m - (1 - beta1**t) * gbar) == 0
display(sp.Eq(sp.Symbol(r"\mathbb{E}[m_t]"), (1 - beta1**t) * gbar))

# %% [markdown]
# $\mathbb E[m_t] = (1-\beta_1^t)\,\bar g$: after one step only $10\%$ of the mean gradient,
# after 10 steps $65\%$, and the bias dies out as $\beta_1^t \to 0$. Dividing by
# $1-\beta_1^t$ makes $\hat m_t$ an *unbiased* estimate of $\bar g$ at every $t$. The second
# moment is the same computation with $\beta_2$ and $g^2$: for
# $\mathbb E[g_i^2] = s$, $\mathbb E[v_t] = (1-\beta_2^t)\,s$ and $\hat v_t$ is unbiased for $s$:

# %%
s_sym = sp.Symbol("s", positive=True)  # s = E[g_i^2], the same for every i
E_v = sp.summation((1 - beta2) * beta2 ** (t - i) * s_sym, (i, 1, t))
assert sp.simplify(E_v / (1 - beta2**t) - s_sym) == 0
uncorrected_first = ((1 - beta1) * gbar) / sp.sqrt((1 - beta2) * gbar**2)  # m_1 / sqrt(v_1)
display(sp.Eq(sp.Symbol(r"\mathbb{E}[\hat v_t]"), sp.simplify(E_v / (1 - beta2**t))),
        sp.Eq(sp.Symbol(r"m_1 / \sqrt{v_1}"), uncorrected_first),
        sp.Eq(sp.Symbol(r"m_1 / \sqrt{v_1}\ (\beta_1 = 0.9, \beta_2 = 0.999)"),
              sp.N(uncorrected_first.subs({beta1: 0.9, beta2: 0.999}), 4)))

# %% [markdown]
# The two biases do not cancel, because $\beta_2$ is much closer to 1: without correction
# the first update would be $\eta (1-\beta_1)/\sqrt{1-\beta_2} \approx 3.2\,\eta$ per
# coordinate, and it would take about $1/(1-\beta_2) = 1000$ steps for $v_t$ to forget its
# zero start. With the correction the first update is $\eta\, g_1/|g_1| = \eta \operatorname{sign}(g_1)$,
# exactly $\eta$ in size for every coordinate.
#
# ### In code
#
# The implementation follows `torch.optim.Adam`'s arithmetic operation by operation: the
# correction of $m$ is folded into the step size $\eta/(1-\beta_1^t)$, and $\varepsilon$ is
# added to $\sqrt{v_t}/\sqrt{1-\beta_2^t}$. `m.lerp_(g, 1 - beta1)` computes
# $m + (1-\beta_1)(g - m)$, which is $\beta_1 m + (1-\beta_1)g$ rearranged; PyTorch writes
# it so, and using the same operations gives the same rounding. The `weight_decay` of
# `Adam` is an L2 penalty, the subject of the next section.

# %%
show_source(Adam)

# %% [markdown]
# ## 9.3 AdamW: decoupled weight decay versus an L2 penalty
#
# *Weight decay* shrinks every weight a little at each step, $\theta \leftarrow
# (1 - \eta\lambda)\,\theta$, pulling unused weights toward zero. An *L2 penalty* adds
# $\frac\lambda2 \lVert\theta\rVert^2$ to the loss, i.e. $\lambda\theta$ to the gradient.
# For SGD the two are the same update:

# %%
theta_s, g_s, lam = sp.symbols("theta g lambda", real=True)
sgd_l2 = theta_s - eta * (g_s + lam * theta_s)  # SGD on L + lambda/2 theta^2
sgd_decoupled = (1 - eta * lam) * theta_s - eta * g_s  # decay, then the SGD step
assert sp.expand(sgd_l2 - sgd_decoupled) == 0
display(sp.Eq(sp.Symbol(r"\theta - \eta(g + \lambda\theta)"), sp.collect(sp.expand(sgd_l2), theta_s)))

# %% [markdown]
# (Loshchilov & Hutter, 2019, "Decoupled Weight Decay Regularization", Proposition 1, state
# it with a decay that is not multiplied by $\eta$, so their L2 coefficient is
# $\lambda' = \lambda/\eta$; in PyTorch's convention, used here, the decay is $\eta\lambda\theta$
# and $\lambda' = \lambda$.)
#
# For Adam the two differ, because the gradient is divided by $\sqrt{\hat v} + \varepsilon$
# and the penalty term with it. Freeze the denominator at its current value
# $r = \sqrt{\hat v} + \varepsilon$ for one step and set $\beta_1 = 0$ to isolate the effect.
# Adam with an L2 penalty and AdamW then take the steps

# %%
r = sp.Symbol("r", positive=True)  # sqrt(v_hat) + eps, per coordinate
adam_l2 = theta_s - eta * (g_s + lam * theta_s) / r
adamw = theta_s - eta * lam * theta_s - eta * g_s / r
difference = sp.factor(adamw - adam_l2)
assert sp.simplify(difference - eta * lam * theta_s * (1 - r) / r) == 0
assert sp.solve(difference, r) == [1]
display(sp.Eq(sp.Symbol(r"\theta_{\mathrm{AdamW}} - \theta_{\mathrm{Adam+L2}}"), difference))

# %% [markdown]
# With the L2 penalty, the decay of a weight is $\eta\lambda\theta / r$: a weight whose
# gradients have been large (large $\hat v$, large $r$) is decayed *less*, one with small
# gradients more; the two agree only where $r = 1$. AdamW decays every weight at the same
# rate $\eta\lambda$, whatever its gradients, which is what "weight decay" was meant to be;
# Loshchilov & Hutter found it generalises better and makes the best $\lambda$ less
# dependent on $\eta$.
#
# `AdamW` is `Adam` with one line changed: the decay acts on the parameters, before the
# Adam step, and the moments see the raw gradient. The default $\lambda = 10^{-2}$ is
# PyTorch's.

# %%
show_source(AdamW)

# %% [markdown]
# **An experiment.** Three weights start at $\theta = 1$ and receive gradients that carry no
# information, $g_t = \pm\sigma$ alternating in sign ($+\sigma$ first), with
# $\sigma = 10, 100, 1000$. Over $T = 2000$ steps with $\eta = 10^{-3}$ and $\lambda = 1$,
# the oscillations average out and the decay remains. Here $\sqrt{\hat v} \approx \sigma$,
# so the derivation predicts $\theta_T \approx e^{-\eta\lambda T/\sigma}$ with the L2
# penalty and $\theta_T \approx (1-\eta\lambda)^T \approx e^{-2}$ for all three with AdamW.
#
# Not quite: the noise does not average out completely. With $g_t = \sigma(-1)^{t-1}$ every
# $g_t^2 = \sigma^2$, so $\hat v_t = \sigma^2$ exactly at every step, and the first moment
# has a closed form (SymPy checks it against the recursion for $t \le 8$):
#
# $$ \frac{m_t}{\sigma} = \frac{1-\beta_1}{1+\beta_1}\,(-1)^{t-1}\bigl(1 - (-\beta_1)^t\bigr),
#    \qquad \frac{\hat m_t}{\sigma} = \frac{m_t}{\sigma\,(1-\beta_1^t)} . $$
#
# Without decay the weight moves by $-\eta\sum_t \hat m_t/\sigma$. The alternating part
# $\pm(1-\beta_1)/(1+\beta_1)$ cancels over each pair of steps; what is left is the bias
# correction acting on an *unbalanced* start (the first gradient has no partner yet): at odd
# $t$ the factor $(1+\beta_1^t)/(1-\beta_1^t)$ exceeds 1 by $2\beta_1^t/(1-\beta_1^t)$, at
# even $t$ it is exactly 1. After any even number of steps past the first hundred or so
# the weight sits at
#
# $$ \theta - \theta_0 = -\delta\,\eta, \qquad
#    \delta = \frac{2(1-\beta_1)}{1+\beta_1}\sum_{k\ \mathrm{odd}} \frac{\beta_1^k}{1-\beta_1^k}, $$
#
# a fixed offset made in the first steps, after which it neither grows nor fades. SymPy
# checks the closed form; $\delta$ is then summed numerically for $\beta_1 = 0.9$ (the
# terms fall like $\beta_1^{2k}$, so 400 of them are plenty):

# %%
m_over_sigma = lambda t_: (1 - beta1) / (1 + beta1) * (-1) ** (t_ - 1) * (1 - (-beta1) ** t_)  # noqa: E731
m = 0
for t_ in range(1, 9):
    m = beta1 * m + (1 - beta1) * (-1) ** (t_ - 1)  # g_t / sigma = (-1)^(t-1)
    assert sp.cancel(m - m_over_sigma(t_)) == 0  # a rational function of beta_1: cancel decides
delta_sum = 2 * (1 - beta1) / (1 + beta1) * sp.Sum(beta1 ** (2 * k - 1) / (1 - beta1 ** (2 * k - 1)), (k, 1, sp.oo))
summand = sp.lambdify(k, (beta1 ** (2 * k - 1) / (1 - beta1 ** (2 * k - 1))).subs(beta1, 0.9), "numpy")
delta_drift = float(2 * 0.1 / 1.9 * summand(np.arange(1, 401)).sum())  # terms beyond k = 400 are below 1e-36
display(sp.Eq(sp.Symbol(r"\delta"), delta_sum))
print(f"beta_1 = 0.9: delta = {delta_drift:.4f}, half-swing (1 - beta_1) / (1 + beta_1) = {0.1 / 1.9:.3f}")

# %% [markdown]
# So $\delta = 1.7588$: every weight that receives pure noise of this kind ends about
# $1.76\,\eta$ below where it started (and $0.053\,\eta$ lower still after an odd number of
# steps, the half-swing of the oscillation). With decay the offset, made early, is shrunk
# by the decay like the rest of the weight. For AdamW the whole path is then exact:
# $\theta_T = (1-\eta\lambda)^T\theta_0 - \eta\sum_{t=1}^{T}(1-\eta\lambda)^{T-t}\,\hat m_t/\sigma$
# (up to $\varepsilon/\sigma \le 10^{-9}$ relative). For Adam with the L2 penalty,
# $\theta_T \approx e^{-\eta\lambda T/\sigma}(1 - \delta\eta)$, and the terms this leaves out
# are of relative size $\lambda/\sigma$ on the offset (the early gradients are
# $\pm\sigma + \lambda\theta$, not $\pm\sigma$) and $\lambda^2/\sigma^2$ on the rate of decay
# ($\hat v \approx \sigma^2 + \lambda^2\theta^2$), so we allow
# $2\delta\eta\lambda/\sigma + \eta\lambda^3 T/\sigma^3$. The runs, with a third one of
# 6000 steps and no decay at all to see whether the offset moves:

# %%
sigma = torch.tensor([10.0, 100.0, 1000.0], dtype=f64)
lr_d, lam_d, T_d = 1e-3, 1.0, 2000


def decay_run(cls, lam=lam_d, steps=T_d):
    theta = nn.Parameter(torch.ones(3, dtype=f64))
    opt = cls([theta], lr=lr_d, weight_decay=lam)
    path = [theta.detach().clone()]
    for step in range(steps):
        theta.grad = sigma * (-1.0) ** step
        opt.step()
        path.append(theta.detach().clone())
    return torch.stack(path)  # (steps + 1, 3)


path_l2, path_w, path_0 = decay_run(Adam), decay_run(AdamW), decay_run(AdamW, lam=0.0, steps=6000)
m_hat = sp.lambdify(t, (m_over_sigma(t) / (1 - beta1**t)).subs(beta1, 0.9), "numpy")(np.arange(1, T_d + 1))  # (T,)
adamw_exact = (1 - lr_d * lam_d) ** T_d - lr_d * np.sum((1 - lr_d * lam_d) ** (T_d - np.arange(1, T_d + 1)) * m_hat)
for t_ in (1, 2, 10, 50, 200, 2000, 6000):
    print(f"no decay, after {t_:4d} steps: (theta - 1) / eta = {(path_0[t_, 1].item() - 1) / lr_d:+.6f}")

# %%
checks = Checks("weight decay: Adam + L2 against AdamW, and the offset delta eta")
checks.close("no decay: theta - 1 = -delta eta after 6000 steps (SymPy's delta)", torch.full((3,), -delta_drift * lr_d, dtype=f64), path_0[-1] - 1, tol=1e-11)
checks.close("no decay: the offset does not move from step 200 to 6000", path_0[200], path_0[-1], tol=1e-11)
checks.close("AdamW: theta_T = (1-eta lambda)^T - eta sum (1-eta lambda)^(T-t) m_hat_t / sigma", torch.full((3,), adamw_exact, dtype=f64), path_w[-1], tol=1e-11)
for j in range(3):
    sig = sigma[j].item()
    checks.close(f"Adam + L2, sigma = {sig:.0f}: exp(-eta lambda T / sigma)(1 - delta eta)",
                 np.exp(-lr_d * lam_d * T_d / sig) * (1 - delta_drift * lr_d), path_l2[-1, j],
                 tol=2 * delta_drift * lr_d * lam_d / sig + lr_d * lam_d**3 * T_d / sig**3)
checks

# %% [markdown]
# Under AdamW, the three weights shrink to $0.135$ together; under Adam with the same
# $\lambda$, to $0.818$, $0.978$ and $0.996$: the L2 penalty barely touches weights with
# large gradients. The figure shows the whole paths (each curve also swings by about
# $0.05\,\eta$ from step to step, too little to see).

# %%
steps_d = np.arange(T_d + 1)
fig, ax = plt.subplots(figsize=(7, 4))
for j, col in enumerate(["C0", "C1", "C2"]):
    ax.plot(steps_d, path_l2[:, j], color=col, label=f"Adam + L2, sigma = {sigma[j]:.0f}")
    ax.plot(steps_d, np.exp(-lr_d * lam_d * steps_d / sigma[j].item()), color="k", ls=":", lw=1)
ax.plot(steps_d, path_w[:, 0], color="C3", lw=2, label="AdamW, all three sigma")
ax.plot(steps_d, (1 - lr_d * lam_d) ** steps_d, color="k", ls=":", lw=1, label="theory")
ax.set(xlabel="step t", ylabel="weight theta_t (starts at 1)", ylim=(0, 1.05),
       title="Decay of weights receiving only noise gradients (eta = 1e-3, lambda = 1)")
ax.legend(loc="lower left", fontsize="small")
save_figure(fig, "09_optimisers_weight_decay")
plt.show()

# %% [markdown]
# ## 9.4 Learning-rate warmup and cosine decay
#
# Transformers are trained with a learning rate that changes over the run. At the start
# Adam's $\hat v$ rests on a handful of gradients and the parameters are far from anywhere
# sensible, so the rate is raised linearly from zero over $W$ warmup steps (Goyal et al.,
# 2017, "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour"; Vaswani et al., 2017,
# used warmup for the original transformer). Then it decays along half a cosine period to
# $\eta_{\min}$ at step $N$ (Loshchilov & Hutter, 2017, "SGDR: Stochastic Gradient Descent
# with Warm Restarts"), and stays there:
#
# $$ \eta(s) = \begin{cases}
#    \eta_{\max}\, s / W, & 0 \le s < W,\\
#    \eta_{\min} + \tfrac12(\eta_{\max} - \eta_{\min})\bigl(1 + \cos\bigl(\pi\,\tfrac{s-W}{N-W}\bigr)\bigr), & W \le s \le N,\\
#    \eta_{\min}, & s > N.
#    \end{cases} $$
#
# We chose the warmup to start at $\eta(0) = 0$, as Hugging Face's
# `get_cosine_schedule_with_warmup` does: the schedule is then continuous, and the first
# update, which does not move $\theta$, still fills Adam's moments. SymPy confirms the
# pieces join: continuous at $W$ and $N$, flat at both ends of the decay, and halfway
# between $\eta_{\max}$ and $\eta_{\min}$ at the midpoint of the decay:

# %%
s, W, N = sp.symbols("s W N", positive=True)
eta_max, eta_min = sp.symbols(r"eta_max eta_min", positive=True)
warm = eta_max * s / W
decay = eta_min + (eta_max - eta_min) / 2 * (1 + sp.cos(sp.pi * (s - W) / (N - W)))
assert sp.simplify(warm.subs(s, W) - decay.subs(s, W)) == 0  # continuous at W
assert sp.simplify(decay.subs(s, N) - eta_min) == 0  # continuous at N
assert sp.diff(decay, s).subs(s, W) == 0 and sp.simplify(sp.diff(decay, s).subs(s, N)) == 0
assert sp.simplify(decay.subs(s, (W + N) / 2) - (eta_max + eta_min) / 2) == 0
display(sp.Eq(sp.Symbol(r"\eta(s)"), sp.Piecewise((warm, s < W), (decay, s <= N), (eta_min, True))))

# %%
show_source(cosine_schedule)

# %% [markdown]
# `set_lr(optimizer, lr)` writes a rate into every parameter group; a training loop calls it
# with `cosine_schedule(step, ...)` before each `optimizer.step()`. The values at the key
# steps for the rates of nanoGPT's GPT-2 configuration ($\eta_{\max} = 6\times10^{-4}$,
# $\eta_{\min} = \eta_{\max}/10$) on a short run ($W = 100$, $N = 1000$), and the whole schedule against Hugging Face's
# `get_cosine_with_min_lr_schedule_with_warmup` (a `LambdaLR`) and, for the decay, PyTorch's
# `CosineAnnealingLR` (which computes it by a recursion):

# %%
sched = {"max_lr": 6e-4, "min_lr": 6e-5, "warmup_steps": 100, "total_steps": 1000}
lrs = np.array([cosine_schedule(step, **sched) for step in range(1201)])
opt_hf = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=6e-4)
hf_sched = transformers.get_cosine_with_min_lr_schedule_with_warmup(opt_hf, 100, 1000, min_lr=6e-5)
opt_ca = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=6e-4)
ca_sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt_ca, T_max=900, eta_min=6e-5)
hf_lrs, ca_lrs = [], []
for step in range(1001):
    hf_lrs.append(hf_sched.get_last_lr()[0])
    ca_lrs.append(ca_sched.get_last_lr()[0] if step < 901 else float("nan"))
    for opt_, sched_ in [(opt_hf, hf_sched), (opt_ca, ca_sched)]:
        opt_.step()
        sched_.step()

# %%
checks = Checks("warmup + cosine schedule")
for step, want in [(0, 0.0), (50, 3e-4), (100, 6e-4), (550, 3.3e-4), (1000, 6e-5), (1200, 6e-5)]:
    checks.close(f"lr({step})", want, lrs[step], tol=1e-18)
checks.close("all steps 0..1000 vs transformers (relative)", np.array(hf_lrs), lrs[:1001], tol=1e-12, rel=True)
checks.close("decay 100..1000 vs CosineAnnealingLR (relative)", np.array(ca_lrs[:901]), lrs[100:1001], tol=1e-12, rel=True)
checks

# %%
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(np.arange(1201), lrs * 1e4, lw=2, label="cosine_schedule")
ax.plot(np.arange(0, 1001, 25), np.array(hf_lrs[::25]) * 1e4, "o", ms=3, label="transformers")
for x_, lab in [(100, "end of warmup W"), (550, "midpoint"), (1000, "N")]:
    ax.axvline(x_, color="grey", ls=":", lw=1)
    ax.text(x_ + 8, 6.2, lab, fontsize="small")
ax.set(xlabel="optimiser step s", ylabel="learning rate (1e-4)", ylim=(0, 6.8),
       title="Linear warmup to 6e-4 over 100 steps, cosine decay to 6e-5 at step 1000")
ax.legend(loc="center right", fontsize="small")
save_figure(fig, "09_optimisers_schedule")
plt.show()

# %% [markdown]
# The rate climbs linearly for 100 steps, spends the early decay near its peak and the late
# decay near its floor (the cosine is flat at both ends), and passes through the middle
# value $3.3 \times 10^{-4}$ at step 550. With AdamW the decay is $\eta\lambda$ per step, so
# the schedule scales the weight decay too (exercise 3 counts how much in total).
#
# ## 9.5 Gradient clipping
#
# One unlucky batch can produce a gradient many times larger than usual, and one step along
# it can undo hours of training. *Clipping by the global norm* (Pascanu et al., 2013, "On the
# difficulty of training recurrent neural networks") treats all gradients as one long
# vector and, when its norm exceeds a threshold $c$, scales it back:
#
# $$ \lVert g\rVert = \Bigl(\sum_{p} \lVert g_p\rVert_2^2\Bigr)^{1/2}, \qquad
#    g \leftarrow g \cdot \min\Bigl(1, \frac{c}{\lVert g\rVert + \epsilon}\Bigr). $$
#
# The direction is kept, only the length shrinks (to just under $c$; $\epsilon = 10^{-6}$
# guards a zero norm). Parameters without a gradient are skipped. GPT-3 (Brown et al.,
# 2020, "Language Models are Few-Shot Learners") was trained with $c = 1$, a common choice.

# %%
show_source(clip_grad_norm_)

# %% [markdown]
# Checks come after the model of section 9.7 is built, on its real gradients.
#
# ## 9.6 Three optimisers in a curved valley
#
# Rosenbrock's function (Rosenbrock, 1960, "An automatic method for finding the greatest or
# least value of a function") $f(x, y) = (1-x)^2 + 100\,(y - x^2)^2$ has its minimum
# $f = 0$ at $(1, 1)$, at the end of a long, curved, narrow valley: the curvature across
# the valley is hundreds of times that along it, as in the loss surfaces of networks.
# Each optimiser starts at $(-1.5, 2)$ and takes 2000 steps.
#
# How large may SGD's rate be? Near the minimum the loss is a quadratic,
# $f \approx \frac12 (\theta-\theta^*)^\top \mathbf H (\theta-\theta^*)$, and a gradient step
# multiplies the component along each eigenvector of the Hessian $\mathbf H$ (eigenvalue
# $\lambda_i$) by $1 - \eta\lambda_i$. The step is stable when $|1-\eta\lambda_i| < 1$ for
# every $i$, that is when $\eta < 2/\lambda_{\max}$. SymPy computes the Hessian at $(1, 1)$,
# its eigenvalues and the limit before any run; the gradient for the runs is SymPy's too
# (`sp.lambdify` turns it into a function, faster than autograd for two numbers):

# %%
x_s, y_s = sp.symbols("x y", real=True)
f_ros = (1 - x_s) ** 2 + 100 * (y_s - x_s**2) ** 2
hessian_min = sp.hessian(f_ros, (x_s, y_s)).subs({x_s: 1, y_s: 1})
lam_max = max(hessian_min.eigenvals())
eta_crit = float(2 / lam_max)
grad_ros = sp.lambdify((x_s, y_s), [sp.diff(f_ros, x_s), sp.diff(f_ros, y_s)])
lam_min = min(hessian_min.eigenvals())
display(hessian_min, sp.Eq(sp.Symbol(r"\lambda_{\max}"), lam_max))
print(f"lambda_max = {float(lam_max):.1f}, lambda_min = {float(lam_min):.4f} (ratio {float(lam_max / lam_min):.0f}), "
      f"limit 2 / lambda_max = {eta_crit:.4g}")

# %% [markdown]
# $\lambda_{\max} = 501 + \sqrt{250601} \approx 1001.6$ and $\lambda_{\min} \approx 0.4$: the
# valley is 2508 times more curved across than along, and the limit is
# $\eta < 2/\lambda_{\max} \approx 1.997 \times 10^{-3}$. SGD is run at $10^{-3}$, half the
# limit, and at 0.95 and 1.05 times the limit to test the prediction; momentum
# $\mu = 0.9$ with $10^{-4}$ (the same effective rate $\eta/(1-\mu) = 10^{-3}$) and with
# $10^{-3}$; Adam with $0.05$, with and without $\lambda = 0.1$ of either kind of decay.

# %%
def rosenbrock(p):
    return (1 - p[0]) ** 2 + 100 * (p[1] - p[0] ** 2) ** 2


def trajectory(make, steps=2000, start=(-1.5, 2.0)):
    p = nn.Parameter(torch.tensor(start, dtype=f64))
    opt, path = make([p]), [p.detach().clone()]
    for _ in range(steps):
        p.grad = torch.stack(grad_ros(p[0].detach(), p[1].detach()))
        opt.step()
        path.append(p.detach().clone())
        if not p.abs().max() < 1e6:  # diverged: stop before the numbers overflow
            break
    return torch.stack(path)  # (steps + 1, 2), shorter if the run diverged


# %%
runs = {
    "SGD, eta = 1e-3": lambda q: SGD(q, lr=1e-3),
    "momentum 0.9, eta = 1e-4": lambda q: SGD(q, lr=1e-4, momentum=0.9),
    "momentum 0.9, eta = 1e-3": lambda q: SGD(q, lr=1e-3, momentum=0.9),
    "Adam, eta = 0.05": lambda q: Adam(q, lr=0.05),
    "Adam + L2 0.1, eta = 0.05": lambda q: Adam(q, lr=0.05, weight_decay=0.1),
    "AdamW 0.1, eta = 0.05": lambda q: AdamW(q, lr=0.05, weight_decay=0.1),
}
paths = {name: trajectory(make) for name, make in runs.items()}
edge = {factor: trajectory(lambda q, f_=factor: SGD(q, lr=f_ * eta_crit)) for factor in (0.95, 1.05)}
for name, path in paths.items():
    x_end, y_end = path[-1].tolist()
    print(f"{name:27s} ends at ({x_end:.4f}, {y_end:.4f}), f = {rosenbrock(path[-1]).item():.2e}")
for factor, path in edge.items():
    print(f"SGD, eta = {factor} x 2/lambda_max: {len(path) - 1} steps, f = {rosenbrock(path[-1]).item():.2e}")

# %%
checks = Checks("SGD on either side of the predicted limit 2 / lambda_max")
checks.true("eta = 0.95 x limit: 2000 steps, f falls below 1e-2", len(edge[0.95]) == 2001 and rosenbrock(edge[0.95][-1]).item() < 1e-2,
            got=f"f = {rosenbrock(edge[0.95][-1]).item():.1e}")
checks.true("eta = 1.05 x limit: diverges (|theta| > 1e6) within 2000 steps", len(edge[1.05]) < 2001,
            got=f"after {len(edge[1.05]) - 1} steps")
checks

# %% [markdown]
# The prediction holds on both sides. Below the limit SGD converges, slowly, because the
# direction along the valley contracts by only $1 - \eta\lambda_{\min}$ per step; above
# it, the component across the valley is multiplied by $|1 - \eta\lambda_{\max}| > 1$ at
# every step and the run blows up. (Right at the limit the growth factor is so close to 1
# that a short run cannot tell.) The rate $10^{-3}$ of the figure is half the limit.

# %%
xs, ys = np.meshgrid(np.linspace(-2, 2, 300), np.linspace(-1, 3, 300))
fs = (1 - xs) ** 2 + 100 * (ys - xs**2) ** 2
fig, axes = plt.subplots(1, 3, figsize=(11, 4.2))
for ax, names in zip(axes[:2], [list(runs)[:3], list(runs)[3:]], strict=True):
    ax.contour(xs, ys, np.log10(fs + 1e-3), levels=20, cmap="Greys", linewidths=0.6)
    for name, col in zip(names, ["C0", "C1", "C2"], strict=True):
        ax.plot(paths[name][:, 0], paths[name][:, 1], color=col, lw=1.2, label=name)
        ax.plot(*paths[name][-1], "o", color=col, ms=6, mfc="none")  # where it stopped
    ax.plot([-1.5], [2.0], "ko", ms=5)
    ax.plot([1.0], [1.0], "r*", ms=12, label="minimum (1, 1)")
    ax.set(xlabel="x", ylabel="y", xlim=(-2, 2), ylim=(-1, 3))
    ax.legend(loc="lower right", fontsize="small")
for j, (name, path) in enumerate(paths.items()):
    f_t = (1 - path[:, 0]) ** 2 + 100 * (path[:, 1] - path[:, 0] ** 2) ** 2
    axes[2].semilogy(f_t, color=f"C{j % 3}", ls="-" if j < 3 else "--", label=name)
axes[2].set(xlabel="step t", ylabel="f(x_t, y_t)", ylim=(1e-13, 1e3), title="Rosenbrock f along each path")
axes[2].legend(loc="lower left", fontsize="x-small")
axes[0].set_title("SGD and momentum, 2000 steps")
axes[1].set_title("Adam, Adam + L2, AdamW, 2000 steps")
save_figure(fig, "09_optimisers_trajectories")
plt.show()

# %% [markdown]
# On the left, SGD and momentum at the same *effective* rate $10^{-3}$ trace practically the
# same path (the blue one lies under the orange) and both stop halfway along the valley
# ($f \approx 0.19$; circles mark the end points): at this rate momentum's only effect is
# the $1/(1-\mu)$ speed-up, which a ten times smaller $\eta$ cancels. Momentum at the full
# $\eta = 10^{-3}$ zigzags across the valley at first, then moves ten times faster along its
# floor, where the gradient is small but consistent, while the oscillations across the
# valley average out in the buffer; it reaches $f \approx 10^{-8}$. In the middle, Adam
# takes steps of about $\eta$ in each coordinate whatever the gradient's size, drops into
# the valley within a few steps and converges ($f \approx 10^{-12}$); the right panel
# shows the loss along every path on a log scale. With decay, neither variant can
# reach $(1, 1)$, since it pulls toward the origin, and they stop at different points.
# Adam with the L2 penalty is plain Adam on the loss $f + \frac\lambda2\lVert\theta\rVert^2$,
# so it should end at that function's minimum; SymPy finds the minimum by Newton's method
# on the gradient (`sp.nsolve`), and the checks compare:

# %%
f_pen = f_ros + sp.Rational(1, 20) * (x_s**2 + y_s**2)
argmin_pen = sp.nsolve([sp.diff(f_pen, x_s), sp.diff(f_pen, y_s)], [x_s, y_s], [0.9, 0.8])
argmin_pen = torch.tensor([float(v) for v in argmin_pen], dtype=f64)
checks = Checks("where the runs end")
checks.close("Adam: at the minimum (1, 1)", torch.ones(2, dtype=f64), paths["Adam, eta = 0.05"][-1], tol=1e-5)
checks.close("Adam + L2: at argmin f + 0.05 |theta|^2", argmin_pen, paths["Adam + L2 0.1, eta = 0.05"][-1], tol=1e-6)
checks.true("AdamW: not there (distance > 0.1)", (paths["AdamW 0.1, eta = 0.05"][-1] - argmin_pen).norm().item() > 0.1,
            (paths["AdamW 0.1, eta = 0.05"][-1] - argmin_pen).norm())
checks

# %% [markdown]
# ## 9.7 Against `torch.optim`: 100 steps on a small transformer
#
# The final test is a real training run. The model is one pre-LN transformer block built
# from the book's layers: token embedding (tied with the output layer) plus learned
# positions, causal multi-head attention and an MLP, $V = 16$, $d = 32$, $H = 4$, $T = 16$.
# It reads batches of $B = 16$ sequences from the synthetic Markov source of chapter 3, and
# the loss is the cross-entropy of the next token.

# %%
class TinyLM(nn.Module):
    def __init__(self, V=16, T=16, d=32, H=4):
        super().__init__()
        self.emb = TokenEmbedding(V, d)  # E (V, d), also the output layer
        self.pos = nn.Parameter(0.02 * torch.randn(T, d))  # (T, d)
        self.ln1, self.ln2, self.ln_f = LayerNorm(d), LayerNorm(d), LayerNorm(d)
        self.attn, self.mlp = MultiHeadAttention(d, H, bias=True), MLP(d, 4 * d)

    def forward(self, ids):  # (B, T) -> (B, T, V)
        x = self.emb(ids) + self.pos[: ids.shape[1]]  # (B, T, d)
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return self.emb.logits(self.ln_f(x))


# %%
B, T_len, V = 16, 16, 16
tokens = default_source().sample(20_000, seed=1)
starts = torch.randint(0, len(tokens) - T_len - 1, (100, B), generator=g)
windows = tokens[starts[..., None] + torch.arange(T_len + 1)]  # (100, B, T + 1)
batches = [(w[:, :-1], w[:, 1:]) for w in windows]  # inputs and next-token targets
base = TinyLM()
print(f"{sum(p.numel() for p in base.parameters()):,} parameters, "
      f"{len(batches)} batches of {B} x {T_len} tokens")


def loss_on(model, x, y):
    return F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))


# %% [markdown]
# First the clipping checks of section 9.5, on the gradient of this model for one batch:
# against `torch.nn.utils.clip_grad_norm_` (the returned norm and every clipped gradient),
# when clipping is needed and when it is not, with the position table frozen (no gradient),
# and that clipping keeps the direction of the whole gradient.

# %%
def grads_of(model, freeze_pos=False):
    model = copy.deepcopy(model)
    model.pos.requires_grad_(not freeze_pos)
    loss_on(model, *batches[0]).backward()
    return model


checks = Checks("gradient clipping against torch.nn.utils.clip_grad_norm_")
for max_norm, freeze in [(0.1, False), (0.1, True), (100.0, False)]:
    ours, ref = grads_of(base, freeze), grads_of(base, freeze)
    before = gradient_vector(ours).clone()
    n_ours, n_ref = clip_grad_norm_(ours.parameters(), max_norm), torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm)
    what = f"c = {max_norm}" + (", pos frozen" if freeze else "")
    checks.close(f"returned norm, {what}", n_ref, n_ours, tol=1e-6, rel=True)
    checks.close(f"clipped gradients, {what}", gradient_vector(ref), gradient_vector(ours), tol=1e-9)
    n = n_ref.item()
    checks.close(f"norm after: min(n, c n / (n + 1e-6)), {what}", min(n, max_norm * n / (n + 1e-6)), gradient_vector(ours).norm(), tol=1e-6, rel=True)
    checks.close(f"direction kept: cos(before, after), {what}", 1.0, F.cosine_similarity(before.double(), gradient_vector(ours).double(), dim=0), tol=1e-12)
checks

# %% [markdown]
# Now the optimisers. Each is run twice from identical weights on identical batches: once
# with `llmbook.training.optim`, once with its `torch.optim` counterpart. The last rows add two
# parameter groups (no weight decay for the biases, norm gains and positions, the usual
# practice with AdamW, and, to exercise per-group settings, half the learning rate), the
# full training recipe of chapter 10 (AdamW with the two weight-decay groups, warmup and
# cosine decay set on every group, clipping at $c = 1$; PyTorch's side uses `transformers`'
# schedule and PyTorch's clipping), and an AdamW run stopped after 50 steps,
# saved with `state_dict()` and resumed in a fresh model and optimiser.

# %%
def train(model, opt, batches, recipe=False, first_step=0):
    for step, (x, y) in enumerate(batches, start=first_step):
        if recipe:
            set_lr(opt, cosine_schedule(step, 1e-2, 1e-3, 10, 100))
        opt.zero_grad()
        loss = loss_on(model, x, y)
        loss.backward()
        if recipe:
            clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return loss.item()


def groups(model, wd=0.1, rest_lr=5e-3):
    """Weight decay for the matrices (and E); none, and a smaller lr, for the rest."""
    matrices = [p for p in model.parameters() if p.ndim == 2 and p is not model.pos]
    rest = [p for p in model.parameters() if all(p is not q for q in matrices)]
    rest_group = {"params": rest, "weight_decay": 0.0} | ({"lr": rest_lr} if rest_lr else {})
    return [{"params": matrices, "weight_decay": wd}, rest_group]


# %%
pairs = {
    "SGD": (lambda p: SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    "SGD momentum 0.9": (lambda p: SGD(p, lr=0.05, momentum=0.9),
                         lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    "SGD Nesterov, weight_decay": (
        lambda p: SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    "Adam": (lambda p: Adam(p, lr=1e-2), lambda p: torch.optim.Adam(p, lr=1e-2)),
    "Adam, L2 0.1": (lambda p: Adam(p, lr=1e-2, weight_decay=0.1),
                     lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1)),
    "AdamW 0.1": (lambda p: AdamW(p, lr=1e-2, weight_decay=0.1),
                  lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1)),
    "AdamW, 2 param groups": (lambda m: AdamW(groups(m), lr=1e-2),
                              lambda m: torch.optim.AdamW(groups(m), lr=1e-2)),
}
results = {}
for name, (make_ours, make_ref) in pairs.items():
    ours, ref = copy.deepcopy(base), copy.deepcopy(base)
    by_module = "groups" in name
    loss_ours = train(ours, make_ours(ours if by_module else ours.parameters()), batches)
    loss_ref = train(ref, make_ref(ref if by_module else ref.parameters()), batches)
    results[name] = (ours, ref, loss_ours, loss_ref)

# %%
recipe_ours, recipe_ref = copy.deepcopy(base), copy.deepcopy(base)
train(recipe_ours, AdamW(groups(recipe_ours, rest_lr=None), lr=1e-2), batches, recipe=True)
opt_ref = torch.optim.AdamW(groups(recipe_ref, rest_lr=None), lr=1e-2)
sched_ref = transformers.get_cosine_with_min_lr_schedule_with_warmup(opt_ref, 10, 100, min_lr=1e-3)
for x, y in batches:
    opt_ref.zero_grad()
    loss_on(recipe_ref, x, y).backward()
    torch.nn.utils.clip_grad_norm_(recipe_ref.parameters(), 1.0)
    opt_ref.step()
    sched_ref.step()

# %%
straight, half = copy.deepcopy(base), copy.deepcopy(base)
train(straight, AdamW(straight.parameters(), lr=1e-2, weight_decay=0.1), batches)
opt_half = AdamW(half.parameters(), lr=1e-2, weight_decay=0.1)
train(half, opt_half, batches[:50])
checkpoint = copy.deepcopy({"model": half.state_dict(), "optim": opt_half.state_dict()})
resumed = TinyLM()  # fresh weights, overwritten by the checkpoint
resumed.load_state_dict(checkpoint["model"])
opt_resumed = AdamW(resumed.parameters(), lr=1e-2, weight_decay=0.1)
opt_resumed.load_state_dict(checkpoint["optim"])
_ = train(resumed, opt_resumed, batches[50:], first_step=50)

# %%
def max_param_diff(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters(), strict=True))


checks = Checks("100 training steps: llmbook.training.optim against torch.optim (max |diff| of all parameters)")
for name, (ours, ref, _, _) in results.items():
    checks.close(name, 0.0, max_param_diff(ours, ref), tol=1e-6)
checks.close("AdamW + groups + cosine schedule + clipping", 0.0, max_param_diff(recipe_ours, recipe_ref), tol=1e-6)
checks.close("AdamW: 50 steps, save, load, 50 steps vs 100 steps", 0.0, max_param_diff(straight, resumed), tol=0)
checks.true("the parameters moved (max |change| > 0.01)", max_param_diff(straight, base) > 0.01, max_param_diff(straight, base))
checks.true("Adam + L2 and AdamW end at different weights (> 1e-3)",
            max_param_diff(results["Adam, L2 0.1"][0], results["AdamW 0.1"][0]) > 1e-3,
            max_param_diff(results["Adam, L2 0.1"][0], results["AdamW 0.1"][0]))
checks

# %% [markdown]
# Every difference is exactly zero: because the book's optimisers perform the same
# floating-point operations in the same order as PyTorch's, the two runs stay bit-for-bit
# identical for 100 steps (the test suite asks only for $10^{-6}$). For the record, the loss
# on the last batch: after 100 steps every run is still early in training, a little below
# the $\log 16 = 2.773$ nats of a uniform guess and far above the source's entropy rate of
# $1.618$ (chapter 10 trains this kind of model to the floor):

# %%
for name, (_, _, loss_ours, loss_ref) in results.items():
    print(f"{name:27s} loss at step 100: {loss_ours:.4f} (torch.optim: {loss_ref:.4f})")

# %% [markdown]
# ## 9.8 Optimisers practitioners use now
#
# AdamW is still the default, but three newer rules are in wide use, and the cosine
# schedule has a rival. `llmbook.training.optimisers_modern` holds the optimisers, each
# following its PyTorch counterpart operation by operation where there is one.
#
# **Muon** (Jordan et al., 2024, "Muon: An optimizer for hidden layers in neural
# networks") treats a weight matrix as a matrix. It keeps SGD's momentum $B$ and then
# replaces the step $M$ (with PyTorch's conventions $B \leftarrow \mu B + (1-\mu) g$
# and Nesterov's look-ahead $M = (1-\mu) g + \mu B$) by the nearest matrix with all
# singular values equal to one: if $M = U S V^\top$, the update is $U V^\top$. Every singular direction of the
# momentum then moves by the same amount, the rare directions as far as the dominant one.
# An SVD per step would be slow on an accelerator, so $U V^\top$ is approximated by a
# Newton–Schulz iteration that uses only matrix products: with $X_0 = M/\lVert M\rVert_F$
# (singular values in $(0, 1]$), $X \leftarrow aX + b\,(XX^\top)X + c\,(XX^\top)^2X$.
# SymPy shows why this works: with $X = USV^\top$ and $U, V$ orthonormal the step is
# $U\,p(S)\,V^\top$ with $p(x) = ax + bx^3 + cx^5$, the same polynomial for every singular
# value, and $U$, $V$ never change (checked on a $2\times2$ example with rotations of
# rational entries and symbolic singular values):

# %%
a_ns, b_ns, c_ns, x_ns = sp.symbols("a b c x", real=True)
U_ns = sp.Matrix([[3, -4], [4, 3]]) / 5  # orthogonal, with rational entries so that expand decides
V_ns = sp.Matrix([[5, -12], [12, 5]]) / 13
S_ns = sp.diag(*sp.symbols("s_1 s_2", positive=True))
X_ns = U_ns * S_ns * V_ns.T
A_ns = X_ns * X_ns.T
step_ns = a_ns * X_ns + b_ns * A_ns * X_ns + c_ns * A_ns**2 * X_ns
p_ns = lambda v: a_ns * v + b_ns * v**3 + c_ns * v**5  # noqa: E731
assert sp.expand(step_ns - U_ns * sp.diag(*[p_ns(s_) for s_ in S_ns.diagonal()]) * V_ns.T) == sp.zeros(2, 2)
quintic = {a_ns: 3.4445, b_ns: -4.7750, c_ns: 2.0315}  # Jordan et al.'s coefficients, torch's default
cubic = {a_ns: sp.Rational(3, 2), b_ns: -sp.Rational(1, 2), c_ns: 0}
print(f"cubic (3/2, -1/2, 0): p(1) = {p_ns(1).subs(cubic)}, p'(1) = {sp.diff(p_ns(x_ns), x_ns).subs(cubic).subs(x_ns, 1)}, "
      f"p'(0) = {sp.diff(p_ns(x_ns), x_ns).subs(cubic).subs(x_ns, 0)}")
print(f"quintic: p(1) = {float(p_ns(1).subs(quintic)):.4f}, p'(0) = {float(sp.diff(p_ns(x_ns), x_ns).subs(quintic).subs(x_ns, 0)):.4f}")

# %% [markdown]
# The classical cubic has the fixed point $p(1) = 1$ with zero slope, so it converges to
# $UV^\top$, but it multiplies a small singular value by only $3/2$ per step. Jordan et al.
# chose a quintic with slope $a = 3.4445$ at zero: five steps lift even tiny singular values
# close to one, at the price of not converging (the values end scattered around one,
# between about 0.5 and 1.5 by Jordan et al.'s account). The book's `newton_schulz` runs
# in bfloat16 like PyTorch's; in float64 it must equal $U\,p^5(S/\lVert M\rVert_F)\,V^\top$ computed from an SVD, which is
# the first check below. The second runs `Muon` and `torch.optim.Muon` (defaults: momentum
# 0.95, Nesterov, weight decay 0.1, the step scaled by $\sqrt{\max(1, n/m)}$ for an
# $n\times m$ matrix) for 20 steps on a tall and a wide float64 matrix. `race_with_peer`
# gives both optimisers the same start and, at every step, the same gradient (Gaussian noise
# plus the current weights), and returns the largest difference of the weights at the end.

# %%
show_source(newton_schulz)

# %%
G_ns = torch.randn(12, 20, dtype=f64, generator=torch.Generator().manual_seed(1))
U_svd, S_svd, Vh_svd = torch.linalg.svd(G_ns, full_matrices=False)
s_poly = S_svd / S_svd.norm()
for _ in range(5):
    s_poly = 3.4445 * s_poly - 4.7750 * s_poly**3 + 2.0315 * s_poly**5
checks = Checks("Muon against an SVD and against torch.optim.Muon")
checks.close("newton_schulz (float64) = U p^5(S / |G|_F) V^T, G 12 x 20", U_svd @ torch.diag(s_poly) @ Vh_svd,
             newton_schulz(G_ns, dtype=f64), tol=1e-12)
for kw in [{}, {"nesterov": False, "momentum": 0.9, "adjust_lr_fn": "match_rms_adamw"}]:
    race = race_with_peer(lambda q, kw=kw: Muon(q, lr=0.02, **kw), lambda q, kw=kw: torch.optim.Muon(q, lr=0.02, **kw),
                          [(7, 12), (12, 5)])
    checks.close(f"20 steps, 7 x 12 and 12 x 5 in float64, {kw or 'defaults'}", 0.0, race.max_abs_diff, tol=0)
checks

# %% [markdown]
# **Adafactor** (Shazeer & Stern, 2018, "Adafactor: Adaptive Learning Rates with Sublinear
# Memory Cost") saves memory. Adam's second moment $v$ has one number per weight; for an
# $n \times m$ matrix Adafactor keeps only the running means of $g^2$ over each row, $R$
# ($n$ numbers), and over each column, $C$ ($m$ numbers), and estimates
# $\hat V = R\,C/\operatorname{mean}(R)$, the rank-one matrix with those row and column
# means. It has no first moment, a decay $\hat\beta_{2,t} = 1 - t^{-0.8}$ that starts at zero
# instead of a bias correction, a step *relative* to the weight's size,
# $\alpha_t = \max(\varepsilon_2, \mathrm{RMS}(\theta))\,\min(\eta, 1/\sqrt t)$, and it clips the
# update $U = g/\sqrt{\hat V}$ to $\mathrm{RMS}(U) \le d = 1$. We follow
# `torch.optim.Adafactor`, whose defaults are the paper's ($\eta = 10^{-2}$, $\varepsilon_2 =
# 10^{-3}$, $d = 1$, exponent $-0.8$) with two differences: $\varepsilon_1$ (machine epsilon
# of the dtype, squared) is a floor on $\hat V$ rather than $10^{-30}$ added to $g^2$, and
# there is an optional decoupled weight decay. The check runs both on a matrix, a vector
# (which keeps the full $v$) and a 3-D tensor (factored over its last two axes).
#
# **Lion** (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms"), found by a
# program search, steps along the *sign* of an interpolation of momentum and gradient:
#
# $$ c = \beta_1 m + (1-\beta_1) g, \qquad \theta \leftarrow \theta(1-\eta\lambda) - \eta\,\operatorname{sign}(c),
#    \qquad m \leftarrow \beta_2 m + (1-\beta_2) g, $$
#
# with $\beta_1 = 0.9$, $\beta_2 = 0.99$. Every coordinate moves by exactly $\eta$, so Lion
# wants a smaller $\eta$ than AdamW, and it keeps one state tensor where Adam keeps two.
# PyTorch has no Lion, so the check is against the three lines above, evaluated by SymPy for
# two steps on four coordinates (in the first step $c = 0$ in the third coordinate, which
# therefore only decays; in the second, $c$ changes sign in the first coordinate while $m$
# does not).

# %%
race_af = race_with_peer(lambda q: Adafactor(q, weight_decay=0.1), lambda q: torch.optim.Adafactor(q, weight_decay=0.1),
                         [(7, 12), (9,), (2, 3, 4)])
th_l, m_l, g_l, eta_l, b1_l, b2_l, lam_l = sp.symbols("theta m g eta beta_1 beta_2 lambda", real=True)
lion_theta = th_l * (1 - eta_l * lam_l) - eta_l * sp.sign(b1_l * m_l + (1 - b1_l) * g_l)
lion_m = b2_l * m_l + (1 - b2_l) * g_l
theta_lion, m_lion = [0.3, -1.2, 2.0, 0.7], [0.0] * 4
lion_grads = [[1.0, -0.2, 0.0, 3.0], [-0.5, 0.3, 2.0, -3.0]]
for grads_ in lion_grads:
    for j in range(4):
        sub = {eta_l: 0.1, b1_l: 0.9, b2_l: 0.99, lam_l: 0.5, th_l: theta_lion[j], m_l: m_lion[j], g_l: grads_[j]}
        theta_lion[j], m_lion[j] = float(lion_theta.subs(sub)), float(lion_m.subs(sub))
p_lion = nn.Parameter(torch.tensor([0.3, -1.2, 2.0, 0.7], dtype=f64))
opt_lion = Lion([p_lion], lr=0.1, weight_decay=0.5)
for grads_ in lion_grads:
    p_lion.grad = torch.tensor(grads_, dtype=f64)
    opt_lion.step()
state_numbers = lambda opt_, p_: sum(v.numel() for k_, v in opt_.state[p_].items() if k_ != "step")  # noqa: E731
p_adam = nn.Parameter(torch.zeros(7, 12, dtype=f64))
opt_adam = AdamW([p_adam])
p_adam.grad = torch.ones(7, 12, dtype=f64)
opt_adam.step()

checks = Checks("Adafactor against torch.optim.Adafactor; Lion against SymPy; optimiser state")
checks.close("Adafactor: 20 steps, 7 x 12, 9 and 2 x 3 x 4 in float64, weight decay 0.1", 0.0, race_af.max_abs_diff, tol=0)
checks.close("Lion: two steps = SymPy's update (theta)", torch.tensor(theta_lion, dtype=f64), p_lion.detach(), tol=1e-15)
checks.close("Lion: two steps = SymPy's update (m)", torch.tensor(m_lion, dtype=f64), opt_lion.state[p_lion]["exp_avg"], tol=1e-15)
checks.equal("state of a 7 x 12 matrix: AdamW 2 n m", 2 * 7 * 12, state_numbers(opt_adam, p_adam))
checks.equal("state of a 7 x 12 matrix: Adafactor n + m", 7 + 12, state_numbers(race_af.optimizer, race_af.params[0]))
checks.equal("state of 4 weights: Lion one tensor (4 numbers)", 4, state_numbers(opt_lion, p_lion))
checks

# %% [markdown]
# **Warmup-stable-decay.** The cosine schedule must know the run's length $N$ in advance:
# stopping early leaves the rate high, continuing needs a new schedule. Hu et al. (2024,
# "MiniCPM: Unveiling the Potential of Small Language Models with Scalable Training
# Strategies") hold the peak rate after the warmup and decay only in a short final phase of
# $D$ steps; a run can be continued from any point of the plateau and decayed when wanted.
# They allow any decreasing function in the decay phase; `wsd_schedule` uses a straight
# line from $\eta_{\max}$ to $\eta_{\min}$. SymPy evaluates the three pieces exactly at the
# phase boundaries, with rational rates, and the function must agree:

# %%
show_source(wsd_schedule)

# %%
S_w, D_w = sp.symbols("S D", positive=True)
wsd_sym = sp.Piecewise((eta_max * s / W, s < W), (eta_max, s < S_w), (eta_max - (eta_max - eta_min) * (s - S_w) / D_w, s <= N),
                       (eta_min, True))
wsd_values = {eta_max: sp.Rational(1, 100), eta_min: sp.Rational(1, 1000), W: 20, D_w: 60, N: 300, S_w: 240}
checks = Checks("wsd_schedule at the phase boundaries (SymPy, exact rationals)")
for step in (0, 10, 20, 239, 240, 270, 300, 400):
    checks.close(f"lr({step})", float(wsd_sym.subs(wsd_values).subs(s, step)), wsd_schedule(step, 1e-2, 1e-3, 20, 60, 300), tol=1e-18)
checks

# %% [markdown]
# **The four on one problem.** Muon is meant for weight matrices, so the test is a matrix
# least-squares problem: learn $W$ ($16 \times 32$) from $N = 256$ examples,
# $\mathcal L(W) = \frac1{2N}\lVert WX - Y\rVert_F^2$ with $Y = W^\star X$, where the inputs $X$
# have scales from 1 down to 0.01 along 32 random orthogonal directions. The badly scaled
# directions are not the coordinate axes, so Adam's per-coordinate rescaling cannot simply
# undo them. Each optimiser takes 300 steps from the same random start with the WSD schedule
# (20 warmup, 60 decay steps, $\eta_{\min} = \eta_{\max}/10$), at three peak rates; no weight
# decay. `least_squares_run` does one run: at each step it sets the scheduled rate, writes
# the gradient $(WX - Y)X^\top/N$ by hand and steps, and it returns the loss curve. Muon's
# Newton–Schulz iteration runs in float64 here, not bfloat16, so that the
# run depends less on the CPU's kernels. This is a measurement on one small problem, not a
# ranking: the figure shows the best rate of each.

# %%
gen_ls = torch.Generator().manual_seed(0)
Q_ls, _ = torch.linalg.qr(torch.randn(32, 32, dtype=f64, generator=gen_ls))
X_ls = Q_ls @ (torch.randn(32, 256, dtype=f64, generator=gen_ls) * torch.logspace(0, -2, 32, dtype=f64)[:, None])
Y_ls = torch.randn(16, 32, dtype=f64, generator=gen_ls) @ X_ls
W_start = torch.randn(16, 32, dtype=f64, generator=gen_ls) / 32**0.5
ls_steps = 300
modern = {"AdamW": lambda q, lr: AdamW(q, lr=lr, weight_decay=0.0), "Muon": lambda q, lr: Muon(q, lr=lr, weight_decay=0.0, ns_dtype=f64),
          "Adafactor": lambda q, lr: Adafactor(q, lr=lr), "Lion": lambda q, lr: Lion(q, lr=lr)}
ls_runs = {(name, lr): least_squares_run(make, lr, X_ls, Y_ls, W_start, ls_steps)  # WSD: 20 warmup, 60 decay steps
           for name, make in modern.items() for lr in (0.03, 0.1, 0.3)}
best_lr = {name: min((0.03, 0.1, 0.3), key=lambda lr, n=name: ls_runs[n, lr][-1]) for name in modern}
print(f"loss at the start: {ls_runs['AdamW', 0.1][0]:.1f}; after {ls_steps} steps (the decade only: the "
      f"oscillating runs differ in their second digit from one CPU to another):")
for name in modern:
    print(f"{name:9s} at peak rate 0.03 / 0.1 / 0.3: "
          + " / ".join(f"< 1e{math.ceil(math.log10(ls_runs[name, lr][-1])):+d}" for lr in (0.03, 0.1, 0.3))
          + f"; best rate {best_lr[name]}")

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for j, name in enumerate(modern):
    axes[0].semilogy(ls_runs[name, best_lr[name]], color=f"C{j}", label=f"{name}, peak rate {best_lr[name]}")
axes[0].set(xlabel="step", ylabel="loss", title="Matrix least squares, 16 x 32, WSD schedule")
axes[0].legend(fontsize="small")
axes[1].plot([wsd_schedule(s_, 1.0, 0.1, 20, 60, ls_steps) for s_ in range(ls_steps + 1)], label="warmup-stable-decay")
axes[1].plot([cosine_schedule(s_, 1.0, 0.1, 20, ls_steps) for s_ in range(ls_steps + 1)], ls="--", label="warmup + cosine")
axes[1].set(xlabel="step", ylabel="learning rate / peak", title="The two schedules, same warmup and floor")
axes[1].legend(fontsize="small")
save_figure(fig, "09_optimisers_modern")
plt.show()

# %% [markdown]
# On this problem Muon, Adafactor and Lion oscillate on the plateau and make their last
# large gain in the decay phase, once the rate falls: the decay, not the plateau, brings
# their final loss down, which is why a checkpoint taken on the plateau can be continued
# and decayed later. AdamW's loss falls smoothly throughout. Muon, whose steps treat the
# badly scaled directions like the others, ends lowest at its best rate; Lion, which moves
# every weight by exactly $\eta$, does best at the smallest of the three rates, as Chen et
# al. advise. The printed table shows how much each method depends on its rate: one
# problem and three rates rank nothing.


# %% [markdown]
# ## Summary
#
# * Momentum's buffer $b_t = \sum_i \mu^{t-i} g_i$ weights past gradients geometrically; along
#   a steady gradient it multiplies the step by $1/(1-\mu)$, across an oscillating one it cancels.
# * Adam's moving averages start at zero and are biased toward it:
#   $\mathbb E[m_t] = (1-\beta_1^t)\,\mathbb E[g]$, $\mathbb E[v_t] = (1-\beta_2^t)\,\mathbb E[g^2]$;
#   dividing by $1-\beta^t$ removes the bias, and makes the first step exactly $\eta$ per coordinate.
# * An L2 penalty is weight decay for SGD ($\lambda' = \lambda$ in PyTorch's convention), but not
#   for Adam, which divides it by $\sqrt{\hat v}+\varepsilon$: weights with large gradients are
#   decayed less. AdamW decays every weight by $\eta\lambda$ per step. Gradients of pure
#   alternating noise still leave a fixed offset $-\delta\eta$ ($\delta = 1.7588$ for
#   $\beta_1 = 0.9$), made by the bias correction in the first steps.
# * Gradient descent is stable near a minimum only for $\eta < 2/\lambda_{\max}$ of the
#   Hessian there: on Rosenbrock's valley $2/1001.6 \approx 1.997\times10^{-3}$, and runs at 0.95
#   and 1.05 times that converge and diverge.
# * Warmup from $0$ to $\eta_{\max}$ in $W$ steps, then
#   $\eta_{\min} + \frac12(\eta_{\max}-\eta_{\min})(1+\cos\pi\frac{s-W}{N-W})$; clipping scales the
#   global gradient norm down to $c$ and keeps its direction.
# * `llmbook.training.optim`'s SGD, Adam and AdamW reproduce `torch.optim` bit for bit over 100 steps
#   of a transformer, with parameter groups, a schedule, clipping and a checkpoint resume.
# * Muon orthogonalises a matrix's momentum with a Newton–Schulz polynomial applied to its
#   singular values; Adafactor stores $n + m$ second-moment numbers for an $n\times m$ matrix
#   instead of $nm$; Lion steps by $\eta\operatorname{sign}(\cdot)$ with one state tensor. The
#   first two equal `torch.optim.Muon` and `torch.optim.Adafactor` step for step, Lion equals
#   its SymPy update. Warmup-stable-decay holds the peak rate and decays only at the end.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/09_optimisers.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 09` writes a stub
# of every function, `llmbook grade 09` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_09.py` runs
# the same checks on the reference.
#
# 1. (★) **How far does momentum go?** With a constant gradient $g$, show that after $t$
#    steps of SGD with momentum $\mu$ (no dampening) the parameters have moved by
#    $-\frac{\eta g}{1-\mu}\bigl(t - \mu\frac{1-\mu^t}{1-\mu}\bigr)$. Derive it with
#    `sp.summation`, write `momentum_displacement(lr, mu, g, t)`, and check it against
#    `llmbook.training.optim.SGD` in float64 for several $\mu$ and $t$. How many steps does
#    $\mu = 0.9$ lose to its "warm-up" compared with a step of $\eta g/(1-\mu)$ from the start?
# 2. (★★) **RMSprop.** RMSprop (Tieleman & Hinton, 2012, lecture 6.5 of "Neural Networks for
#    Machine Learning") is Adam without the first moment and without bias correction:
#    $v \leftarrow \alpha v + (1-\alpha) g^2$, $\theta \leftarrow \theta - \eta\, g/(\sqrt v + \varepsilon)$.
#    Implement `RMSprop(params, lr=1e-2, alpha=0.99, eps=1e-8)` as a `torch.optim.Optimizer`
#    subclass with validated hyperparameters and check it against `torch.optim.RMSprop` over
#    50 steps of a small model, to $10^{-6}$.
# 3. (★★) **Total decay under a schedule.** With gradients that carry no signal, AdamW
#    multiplies a weight by $\prod_s (1-\eta_s\lambda) \approx \exp(-\lambda \sum_s \eta_s)$.
#    Integrate the warmup-cosine schedule in SymPy to get
#    $\int_0^N \eta(s)\,ds = \eta_{\max} W/2 + (\eta_{\max}+\eta_{\min})(N-W)/2$, write
#    `schedule_area(max_lr, min_lr, W, N)` and `adamw_shrink_factor(...)`, and compare them
#    with the exact product and with `AdamW` run on zero gradients.
# 4. (★★★) **Adam's largest step.** $\hat m_t$ and $\hat v_t$ are weighted averages of $g_i$
#    and $g_i^2$ with weights $w_i$ and $u_i$ (each summing to 1). Use the Cauchy–Schwarz
#    inequality to show that, with $\varepsilon = 0$, $|\hat m_t|/\sqrt{\hat v_t} \le
#    \bigl(\sum_i w_i^2/u_i\bigr)^{1/2}$, with equality when $g_i \propto w_i/u_i$. Write
#    `adam_step_bound(t, beta1, beta2)`; show it is 1 at $t = 1$ and about 7.3 for large $t$
#    with the default betas, that `Adam` attains it on the extremal gradient sequence, and
#    never exceeds it on random ones. (Kingma & Ba, section 2.1, call the step
#    "approximately bounded" by $\eta$; the worst case is several times larger.)
# 5. (★★) **How many Newton–Schulz steps?** With the cubic $(a, b, c) = (3/2, -1/2, 0)$,
#    `newton_schulz` converges to the polar factor $UV^\top$ of $G = USV^\top$. Since each
#    step maps every normalised singular value $x_i = s_i/\lVert G\rVert_F$ by the same
#    polynomial, the spectral-norm error after $k$ steps is $\max_i |1 - p^k(x_i)|$. Write
#    `polar_error(G, steps, coefficients)` (from `torch.linalg.svd`) and
#    `cubic_steps_needed(x, tol)` (the scalar iteration), and check that the steps needed
#    for matrices with condition numbers 10 and 1000 are those the smallest $x_i$ needs.
#    How far from $UV^\top$ is the quintic of Muon after its 5 steps?

# %%
from llmbook.workbench import grade

grade("09", globals())
