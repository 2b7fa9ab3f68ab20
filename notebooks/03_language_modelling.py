# %% [markdown]
# # 3 Language modelling as probability
#
# A language model is a probability distribution over sequences of tokens. This chapter
# makes that sentence precise and computable. The chain rule turns the probability of a
# sequence into a product of next-token predictions; maximum likelihood turns learning
# into minimising the **cross-entropy**; the **softmax** turns a vector of logits into a
# next-token distribution. We derive each piece with SymPy, build `softmax`,
# `log_softmax` and `cross_entropy` in `llmbook.text.functional` and check them against
# PyTorch, including at logits of $\pm 10^4$ where the textbook formula breaks.
#
# Then we build something the rest of the book leans on: a **synthetic source** whose
# entropy rate is known exactly. No model of it can score a cross-entropy below that
# number, so it is the floor every later model is measured against. A counting n-gram
# model, the oldest language model there is, shows how fast data takes us to the floor.

# %%
import math

import matplotlib.pyplot as plt
import numpy as np
import sympy as sp
import torch
import torch.nn.functional as F
from IPython.display import display

from llmbook.nbtools import Checks, Formula, save_figure, seed_everything, show_source
from llmbook.text.data import MarkovSource, default_source
from llmbook.text.functional import (
    cross_entropy,
    log_softmax,
    logsumexp,
    perplexity,
    softmax,
)
from llmbook.text.ngram import NGramModel

gen = seed_everything(0)
torch.set_default_dtype(torch.float32)

# %% [markdown]
# ## The chain rule of probability
#
# For any joint distribution of tokens $x_1, \dots, x_T$, the definition of conditional
# probability, $P(a, b) = P(a)\,P(b \mid a)$, applied $T-1$ times gives
#
# $$P(x_1, \dots, x_T) = \prod_{t=1}^{T} P(x_t \mid x_{<t}),
# \qquad \log P(x_{1:T}) = \sum_{t=1}^{T} \log P(x_t \mid x_{<t}).$$
#
# No assumption is made: it holds for every distribution. That is why a model that only
# predicts the *next* token is a complete model of text. We check it for $T = 3$ and
# $V = 2$: eight unknown joint probabilities $p_{abc}$, the marginals and conditionals
# written as sums and ratios of them, and the product of the three conditionals.

# %%
p = {(a, b, c): sp.Symbol(f"p_{a}{b}{c}", positive=True) for a in (0, 1) for b in (0, 1) for c in (0, 1)}
total = sum(p.values())


def P1(a):
    return sum(p[a, b, c] for b in (0, 1) for c in (0, 1)) / total


def P2_given_1(b, a):
    return sum(p[a, b, c] for c in (0, 1)) / sum(p[a, bb, c] for bb in (0, 1) for c in (0, 1))


def P3_given_12(c, a, b):
    return p[a, b, c] / sum(p[a, b, cc] for cc in (0, 1))


for a, b, c in p:
    assert sp.simplify(P1(a) * P2_given_1(b, a) * P3_given_12(c, a, b) - p[a, b, c] / total) == 0
product = P1(0) * P2_given_1(1, 0) * P3_given_12(1, 0, 1)
display(Formula(r"P(x_1{=}0)\,P(x_2{=}1 \mid x_1{=}0)\,P(x_3{=}1 \mid x_1{=}0, x_2{=}1) = "
             + sp.latex(sp.factor(product))))
print("chain rule holds for all 8 sequences: P(x1) P(x2|x1) P(x3|x1,x2) = p_abc / sum(p)")

# %% [markdown]
# ## Maximum likelihood is minimum cross-entropy
#
# Give a model $P_\theta$ a training set of $N$ tokens, each with its context. The
# likelihood is the product of the probabilities it assigns to what actually came next;
# its logarithm is a sum, and dividing by $-N$ gives the **average negative
# log-likelihood**
#
# $$\mathcal{L}(\theta) = -\frac{1}{N}\sum_{i=1}^{N} \log P_\theta(x_i \mid c_i)
#   = -\sum_x \hat q(x) \log P_\theta(x) \quad \text{(one context)},$$
#
# where $\hat q$ is the empirical distribution of the data. The right-hand side is the
# **cross-entropy** $H(\hat q, P_\theta)$. Maximising the likelihood and minimising the
# cross-entropy are the same problem, and the loss of every model in this book is this
# number, in nats per token.
#
# For a single categorical distribution $\theta = (\theta_1, \dots, \theta_V)$ with counts
# $n_i$, the maximiser is the empirical frequency $\theta_i = n_i / N$. With a Lagrange
# multiplier for $\sum_i \theta_i = 1$, for $V = 3$:

# %%
V3 = 3
theta = sp.symbols("theta1:4", positive=True)
n = sp.symbols("n1:4", positive=True)
lam = sp.Symbol("lambda")
lagrangian = sum(ni * sp.log(ti) for ni, ti in zip(n, theta, strict=True)) - lam * (sum(theta) - 1)
solution = sp.solve([sp.diff(lagrangian, v) for v in (*theta, lam)], [*theta, lam], dict=True)[0]
for ni, ti in zip(n, theta, strict=True):
    assert sp.simplify(solution[ti] - ni / sum(n)) == 0
display(*[sp.Eq(ti, solution[ti]) for ti in theta])
display(sp.Eq(lam, solution[lam]))

# %% [markdown]
# The multiplier is the total count $N$, and each $\theta_i$ is its count over $N$. An
# n-gram model (at the end of the chapter) is exactly this estimate, made once per context.
#
# ## The softmax and its shift invariance
#
# A neural language model outputs a vector of **logits** $z \in \mathbb{R}^V$ per
# position and turns it into probabilities with the softmax
#
# $$p_i = \operatorname{softmax}(z)_i = \frac{e^{z_i}}{\sum_{j=1}^{V} e^{z_j}}.$$
#
# Adding the same constant $c$ to every logit multiplies numerator and denominator by
# $e^c$, so the probabilities do not change. SymPy, for $V = 4$:

# %%
V4 = 4
z = sp.symbols("z1:5", real=True)
const = sp.Symbol("c", real=True)


def sym_softmax(zs):
    return [sp.exp(zi) / sum(sp.exp(zj) for zj in zs) for zi in zs]


shifted = sym_softmax([zi + const for zi in z])
for a_, b_ in zip(shifted, sym_softmax(z), strict=True):
    assert sp.simplify(a_ - b_) == 0
display(Formula(r"\operatorname{softmax}(z + c)_1 = " + sp.latex(shifted[0]) + " = "
             + sp.latex(sp.simplify(shifted[0]))))
print("softmax(z + c) = softmax(z) for all 4 components")

# %% [markdown]
# Shift invariance is what makes the softmax computable. In float32, $e^{z}$ overflows
# to `inf` for $z > 88.7$, and underflows to 0 for $z < -103$. Choosing $c = -\max_j z_j$
# makes every exponent at most 0 and the largest exactly $e^0 = 1$: no overflow, and a
# denominator of at least 1.
#
# ## The gradient of cross-entropy: $p - y$
#
# For one position with logits $z$ and target token $y$ (one-hot vector $\mathbf{y}$), the
# loss is $\ell = -\log \operatorname{softmax}(z)_y = -z_y + \log \sum_j e^{z_j}$, and
#
# $$\frac{\partial \ell}{\partial z_i} = p_i - \mathbf{y}_i .$$
#
# The gradient is the prediction minus the target: it pushes up the logit of the correct
# token by $1 - p_y$ and pushes down every other logit by its probability. SymPy proves
# it for $V = 4$ and every possible target.

# %%
for target in range(V4):
    loss = -(z[target] - sp.log(sum(sp.exp(zj) for zj in z)))
    p_sym = sym_softmax(z)
    for i in range(V4):
        assert sp.simplify(sp.diff(loss, z[i]) - (p_sym[i] - (1 if i == target else 0))) == 0
loss_y2 = -(z[1] - sp.log(sum(sp.exp(zj) for zj in z)))  # target y = 2 (z[1] is z_2)
display(Formula(r"\frac{\partial \ell}{\partial z_2}\Big|_{y=2} = "
             + sp.latex(sp.simplify(sp.diff(loss_y2, z[1]))) + r" = p_2 - 1"))
print("d ell / d z_i = p_i - y_i for all 4 targets and all 4 components")

# %% [markdown]
# Averaged over $N$ positions, the gradient of the mean loss is $(p - \mathbf{y})/N$.
# Autograd through our `cross_entropy` (defined below) must agree, in float64:

# %%
B, T, V = 3, 5, 11  # a non-square batch of logits
logits64 = torch.randn(B, T, V, generator=gen, dtype=torch.float64, requires_grad=True)
targets = torch.randint(0, V, (B, T), generator=gen)
(grad,) = torch.autograd.grad(cross_entropy(logits64, targets), logits64)
formula = (softmax(logits64.detach()) - F.one_hot(targets, V)) / (B * T)  # (B, T, V)
grad_checks = Checks("dCE/dz = (p - y) / N")
grad_checks.close("autograd vs (p - y)/N, float64", formula, grad, tol=1e-15)
# and autograd against a central difference along a random direction u, step h = 1e-5:
# (f(z + h u) - f(z - h u)) / 2h = <grad f, u> + O(h^2)
u_dir = torch.randn(B, T, V, generator=gen, dtype=torch.float64)
with torch.no_grad():
    ce_plus = cross_entropy(logits64 + 1e-5 * u_dir, targets)
    ce_minus = cross_entropy(logits64 - 1e-5 * u_dir, targets)
grad_checks.close("<grad, u> vs central difference", (grad * u_dir).sum(), (ce_plus - ce_minus) / 2e-5,
                  tol=1e-8)
grad_checks

# %% [markdown]
# ## The Jacobian of the softmax
#
# The gradient above went straight from the loss to the logits. Later chapters also need
# the derivative of the softmax itself, the $V \times V$ Jacobian $J_{ij} = \partial p_i /
# \partial z_j$: chapter 4 uses it to explain why a saturated attention row stops learning,
# and chapter 8 to write the softmax's backward pass by hand. Differentiating
# $p_i = e^{z_i} / \sum_k e^{z_k}$ by the quotient rule gives $p_i(1 - p_i)$ on the diagonal
# and $-p_i p_j$ off it, that is
#
# $$ J = \frac{\partial p}{\partial z} = \operatorname{diag}(p) - p\,p^\top . $$
#
# SymPy differentiates the softmax of four symbolic logits and compares the result, entry
# by entry, with that matrix:

# %%
p_vec = sp.Matrix(sym_softmax(z))  # (4, 1)
J_sym = p_vec.jacobian(z)  # (4, 4): d p_i / d z_j, by differentiation
J_formula = sp.diag(*p_vec) - p_vec * p_vec.T
assert sp.simplify(J_sym - J_formula) == sp.zeros(V4, V4)
display(Formula(r"\frac{\partial p_1}{\partial z_1} = " + sp.latex(sp.factor(J_sym[0, 0]))
             + r" = p_1 (1 - p_1), \qquad \frac{\partial p_1}{\partial z_2} = "
             + sp.latex(sp.factor(J_sym[0, 1])) + r" = -p_1 p_2"))
print("d softmax(z) / dz = diag(p) - p p^T for all 16 entries (V = 4)")

# %% [markdown]
# Three consequences, each visible in the formula and checked below in float64 against
# `torch.autograd.functional.jacobian` applied to the package's `softmax`:
#
# * every row of $J$ sums to zero, $J\mathbf{1} = p - p\,(p^\top \mathbf{1}) = 0$: moving all
#   logits together changes nothing, which is the shift invariance again;
# * $J$ is also the **Hessian of the cross-entropy** in $z$, because the gradient is
#   $p - \mathbf{y}$ and $\mathbf{y}$ does not depend on $z$. It is positive semi-definite:
#   $v^\top J v = \sum_i p_i v_i^2 - (\sum_i p_i v_i)^2$ is the variance of the values $v_i$
#   under $p$, never negative. So the loss is convex in the logits, flat only along
#   $\mathbf{1}$;
# * at a one-hot $p$ (a **saturated** softmax) every entry $p_i(\delta_{ij} - p_j)$ is
#   zero: no gradient passes back *through the softmax*. A loss that sees only the
#   probabilities, $L(p)$, has $\partial L / \partial z = J^\top \partial L / \partial p$,
#   which vanishes whatever $\partial L / \partial p$ is (the squared error
#   $\lVert p - \mathbf{y} \rVert^2$, for example, even when the saturated class is the
#   wrong one). The cross-entropy computed from the logits is different: its gradient is
#   $p - \mathbf{y}$ directly, and $\log p_y$ keeps a gradient where $p_y$ has underflowed.
#   It vanishes only when the saturated class *is* the target; when it is not, the gradient
#   is $+1$ on the saturated logit and $-1$ on the target's, as large as it ever gets.

# %%
z_vec = torch.randn(7, generator=gen, dtype=torch.float64)  # V = 7
J_auto = torch.autograd.functional.jacobian(softmax, z_vec)  # (7, 7)
p_z = softmax(z_vec)
H_auto = torch.autograd.functional.hessian(lambda t: cross_entropy(t[None], torch.tensor([3])), z_vec)
saturated = softmax(torch.tensor([40.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64))
J_sat = torch.diag(saturated) - torch.outer(saturated, saturated)
jac_checks = Checks("softmax Jacobian diag(p) - p p^T, V = 7, float64")
jac_checks.close("autograd jacobian vs formula", torch.diag(p_z) - torch.outer(p_z, p_z), J_auto,
                 tol=1e-15)
jac_checks.close("rows sum to 0", torch.zeros(7), J_auto.sum(1), tol=1e-15)
jac_checks.close("Hessian of CE (y = 3) vs formula", torch.diag(p_z) - torch.outer(p_z, p_z), H_auto,
                 tol=1e-15)
v_rand = torch.randn(7, generator=gen, dtype=torch.float64)
variance_under_p = (p_z * v_rand**2).sum() - (p_z * v_rand).sum() ** 2  # Var_p(v) >= 0
jac_checks.close("v^T J v vs variance of v under p", variance_under_p, v_rand @ J_auto @ v_rand, tol=1e-15)
jac_checks.close("smallest eigenvalue (direction 1)", 0.0, torch.linalg.eigvalsh(J_auto).min(), tol=1e-15)
jac_checks.close("J at logits (40, 0, ..., 0): max |J| vs 6 e^-40 bound", 0.0, J_sat.abs().max(),
                 tol=6 * math.exp(-40))  # |J_ij| <= max(p_i (1 - p_i), p_i p_j) <= 1 - p_1 < 6 e^-40
jac_checks

# %% [markdown]
# The last bullet, on the saturated logits $z = (40, 0, \dots, 0)$, for three losses. Autograd
# differentiates each through the package's functions; the expected gradients are closed
# forms computed separately. For the squared error of the probabilities, with the target on
# class 2, it is $J^\top \cdot 2(p - \mathbf{y})$, and since $|p_j - y_j| \le 1$ each entry is
# at most $2 \sum_j |J_{ij}| = 4 p_i (1 - p_i) < 24 e^{-40}$: no signal, although the
# prediction is wrong. For the cross-entropy from the logits it is $p - \mathbf{y}$: about
# $e^{-40}$ when the target is the saturated class 1, and $(1, -1, 0, \dots)$ up to
# $e^{-40}$ when it is class 2. `F.cross_entropy` is the peer for the last one.

# %%
z_sat = torch.tensor([40.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)


def grad_of(loss_fn):
    """Autograd's d loss / d z at z_sat."""
    zz = z_sat.clone().requires_grad_(True)
    return torch.autograd.grad(loss_fn(zz), zz)[0]


y_wrong, y_right = F.one_hot(torch.tensor(1), 7).double(), F.one_hot(torch.tensor(0), 7).double()
g_mse = grad_of(lambda t: ((softmax(t) - y_wrong) ** 2).sum())  # a loss of p; wrong class saturated
g_ce_right = grad_of(lambda t: cross_entropy(t[None], torch.tensor([0])))
g_ce_wrong = grad_of(lambda t: cross_entropy(t[None], torch.tensor([1])))
g_ce_peer = grad_of(lambda t: F.cross_entropy(t[None], torch.tensor([1])))
for name, g in [("squared error of p, target 2", g_mse), ("cross-entropy, target 1 (saturated)", g_ce_right),
                ("cross-entropy, target 2", g_ce_wrong)]:
    print(f"{name:36s} grad = {[round(v, 4) + 0.0 for v in g.tolist()]}")
sat_checks = Checks("gradient at a saturated softmax, z = (40, 0, ..., 0), float64")
sat_checks.close("MSE of p (wrong class): autograd vs J^T 2(p - y)", J_sat.T @ (2 * (saturated - y_wrong)),
                 g_mse, tol=1e-15)
# |g_i| <= 2 sum_j |J_ij| = 4 p_i (1 - p_i) <= 4 (1 - p_1) < 24 e^-40, since |p_j - y_j| <= 1
sat_checks.close("MSE of p (wrong class): |grad| below the 24 e^-40 bound", 0.0, g_mse.abs().max(),
                 tol=24 * math.exp(-40))
sat_checks.close("CE, target = saturated class: autograd vs p - y", saturated - y_right, g_ce_right, tol=1e-15)
sat_checks.close("CE, target = another class: autograd vs p - y", saturated - y_wrong, g_ce_wrong, tol=1e-15)
sat_checks.close("CE, target = another class: vs F.cross_entropy", g_ce_peer, g_ce_wrong, tol=1e-15)
sat_checks.close("CE, target = another class: |grad|_1 vs 2 (p_1 = 1, p_2 = 0)", 2.0, g_ce_wrong.abs().sum(),
                 tol=1e-12)
sat_checks

# %% [markdown]
# ## Log-sum-exp: the stable way
#
# Everything above runs through one quantity, the **log-sum-exp**
# $\operatorname{LSE}(z) = \log \sum_j e^{z_j}$: $\log p_i = z_i - \operatorname{LSE}(z)$
# and $\ell = \operatorname{LSE}(z) - z_y$. The shift identity
# $\operatorname{LSE}(z) = m + \operatorname{LSE}(z - m)$ holds for any $m$:

# %%
m = sp.Symbol("m", real=True)
lse = sp.log(sum(sp.exp(zi) for zi in z))
lse_shifted = m + sp.log(sum(sp.exp(zi - m) for zi in z))
assert sp.simplify(sp.expand_log(lse_shifted - lse, force=True)) == 0
display(sp.Eq(lse, lse_shifted))

# %% [markdown]
# Here is the difference it makes. The naive formulas take $e^{10^4}$, which is `inf` in
# any floating-point format; `inf / inf` is `nan`. The stable ones never exponentiate a
# positive number.

# %%
extreme = torch.tensor([[1e4, -1e4, 0.0, 1e4], [-1e4, -1e4, -1e4, -1e4]])  # (2, 4)
naive_softmax = torch.exp(extreme) / torch.exp(extreme).sum(-1, keepdim=True)
naive_lse = torch.log(torch.exp(extreme).sum(-1))
print("naive softmax:    ", naive_softmax.tolist())
print("stable softmax:   ", softmax(extreme).tolist())
print("naive logsumexp:  ", naive_lse.tolist())
print("stable logsumexp: ", [round(v, 4) for v in logsumexp(extreme).tolist()])
print("stable log_softmax row 0:", [round(v, 4) for v in log_softmax(extreme)[0].tolist()])

# %% [markdown]
# The row of all $-10^4$ is the subtle case: naively every $e^{-10^4}$ underflows to 0, and
# $\log 0 = -\infty$ (then $0/0$ = `nan` for the softmax). Shifted by its max, the row is
# all zeros, and the answer, $-10^4 + \log 4$, comes out exactly.
#
# ## The implementation
#
# The package versions follow the derivation line by line. The shift is detached from
# autograd: the result does not depend on it, so no gradient should flow through the max.

# %%
show_source(logsumexp)

# %%
show_source(log_softmax)

# %% [markdown]
# `log_softmax` subtracts the max *before* anything else: $z_i - m$ is computed exactly
# for the largest logits, whereas $z_i - \operatorname{LSE}(z)$ would first round
# $\operatorname{LSE}(z) \approx 10^4$ to float32, whose spacing there is about $10^{-3}$.
# `cross_entropy` validates its input at the door (float logits, integer targets of the
# same leading shape, ids in $[0, V)$), then picks $-\log p_y$ with `gather`:

# %%
show_source(cross_entropy)

# %% [markdown]
# Now the checks against PyTorch's own `torch.softmax`, `torch.log_softmax`,
# `torch.logsumexp` and `torch.nn.functional.cross_entropy` (which wants logits as $(N, V)$,
# so we reshape), on a $(B, T, V) = (4, 7, 50)$ batch in float32 and float64, and on the
# extreme logits. Padded positions carry the target `ignore_index` (PyTorch's $-100$): they
# add nothing to the loss and are left out of the count it is averaged over: a batch whose last
# three positions in each row are padding is averaged over the other positions only. The
# checks use padding in that role, and a second `ignore_index` that is an ordinary id (0),
# summed rather than averaged.

# %%
def agree(checks, what, got, ref, tol):
    """Record max |got - ref| <= tol, relative where |ref| > 1 (both sides are divided by
    max(|ref|, 1) before they are compared)."""
    scale = ref.abs().clamp(min=1.0)
    checks.close(f"{what} (tol {tol:.0e})", ref / scale, got / scale, tol=tol)


checks = Checks("llmbook.text.functional against PyTorch")
for dtype, tol in ((torch.float32, 1e-6), (torch.float64, 1e-12)):
    zz = 3 * torch.randn(4, 7, 50, generator=gen, dtype=dtype)  # (B, T, V)
    yy = torch.randint(0, 50, (4, 7), generator=gen)
    name = str(dtype).replace("torch.", "")
    agree(checks, f"softmax, {name}", softmax(zz), torch.softmax(zz, -1), tol)
    agree(checks, f"log_softmax, {name}", log_softmax(zz), torch.log_softmax(zz, -1), tol)
    agree(checks, f"logsumexp, {name}", logsumexp(zz), torch.logsumexp(zz, -1), tol)
    agree(checks, f"cross_entropy, {name}", cross_entropy(zz, yy),
          F.cross_entropy(zz.reshape(-1, 50), yy.reshape(-1)), tol)
    yy_pad = torch.where(torch.arange(7) >= 4, -100, yy)  # (4, 7): the last 3 of each row are padding
    agree(checks, f"cross_entropy, ignore_index = -100, {name}", cross_entropy(zz, yy_pad),
          F.cross_entropy(zz.reshape(-1, 50), yy_pad.reshape(-1), ignore_index=-100), tol)
    agree(checks, f"cross_entropy, sum, ignore_index = 0, {name}",
          cross_entropy(zz, yy_pad.clamp(min=0), ignore_index=0, reduction="sum"),
          F.cross_entropy(zz.reshape(-1, 50), yy_pad.clamp(min=0).reshape(-1), ignore_index=0,
                          reduction="sum"), tol)
y_ext = torch.tensor([1, 2])
for fn in (softmax, log_softmax):
    n_finite = int(torch.isfinite(fn(extreme)).sum())
    checks.true(f"{fn.__name__} finite at ±1e4", n_finite == extreme.numel(),
                got=f"{n_finite}/{extreme.numel()} finite")
agree(checks, "log_softmax at ±1e4", log_softmax(extreme), torch.log_softmax(extreme, -1), 1e-6)
agree(checks, "cross_entropy at ±1e4", cross_entropy(extreme, y_ext), F.cross_entropy(extreme, y_ext), 1e-6)
checks

# %% [markdown]
# Errors are measured relative to the reference where it exceeds 1 in magnitude, because
# a float32 number near 30 is stored only to the spacing of float32 there, $2^{-19}$, the
# same for either implementation. NumPy's `spacing` gives the distance to the next float:

# %%
for value in (1.0, 30.0, 1e4):
    gap = float(np.spacing(np.float32(value)))
    print(f"float32 spacing at {value:>7g}: {gap:.4g} = 2^{round(math.log2(gap))}")

# %% [markdown]
# (At $10^4$ the spacing is about $10^{-3}$: that is why `log_softmax` above subtracts the
# max before the log-sum-exp.)
#
# ## Perplexity: the effective branching factor
#
# Cross-entropy in nats is hard to picture. Its exponential, the **perplexity**
#
# $$\operatorname{PPL} = \exp\Big(-\frac{1}{N}\sum_i \log P_\theta(x_i \mid c_i)\Big),$$
#
# is a number of choices: a model that spreads its probability uniformly over $m$
# tokens, always including the right one, has perplexity exactly $m$. The uniform model
# over the whole vocabulary has perplexity $V$; a perfect one, 1.

# %%
ppl_checks = Checks("perplexity as a branching factor")
for m_choices in (1, 5, 50):
    zz = torch.full((6, 50), -1e9, dtype=torch.float64)
    zz[:, :m_choices] = 0.0  # uniform over the first m tokens
    yy = torch.arange(6) % m_choices  # always one of them
    ppl_checks.close(f"uniform over m = {m_choices} of V = 50", m_choices, perplexity(zz, yy), tol=1e-12)
ppl_checks.close("all-zero logits, V = 50257", 50257, perplexity(torch.zeros(3, 50257, dtype=torch.float64), torch.tensor([0, 7, 50256])),
                 tol=1e-12, rel=True, digits=7)
ppl_checks

# %% [markdown]
# ## The synthetic source and its entropy rate
#
# The best achievable cross-entropy on real text is unknown. For the rest of the book we
# therefore also train on a source whose best is known. `llmbook.text.data.MarkovSource` is a
# Markov chain of order $k$ over $V$ tokens: the next token depends only on the previous
# $k$ tokens (the **context** $c$),
#
# $$P(x_t \mid x_{<t}) = P(x_t \mid c_t), \qquad c_t = (x_{t-k}, \dots, x_{t-1}),$$
#
# and each row $P(\cdot \mid c)$ is drawn once from a Dirichlet distribution with
# concentration $\alpha = 0.2 < 1$, which puts most of a row's mass on a few tokens. With
# $\pi$ the stationary distribution of contexts, the **entropy rate** is
#
# $$H = -\sum_{c} \pi(c) \sum_{x} P(x \mid c) \log P(x \mid c) \quad \text{nats per token}$$
#
# (Cover & Thomas, 2006, *Elements of Information Theory*, Thm. 4.2.4). For a stationary
# source the expected cross-entropy of any model $Q$ is $H$ plus the expected KL
# divergence between the true next-token distribution and $Q$'s, and KL is never
# negative: **no model can beat $H$ on average**, and only the true conditional reaches it.
#
# First a case we can do by hand: two states, order 1, with
# $P = \begin{pmatrix} 1-a & a \\ b & 1-b \end{pmatrix}$. The stationary distribution
# solves $\pi P = \pi$, and $H = \pi_0 h(a) + \pi_1 h(b)$ with $h$ the binary entropy.

# %%
a_s, b_s, pi0 = sp.symbols("a b pi_0", positive=True)
P2 = sp.Matrix([[1 - a_s, a_s], [b_s, 1 - b_s]])
pi_sol = sp.solve(sp.Matrix([[pi0, 1 - pi0]]) * P2 - sp.Matrix([[pi0, 1 - pi0]]), pi0, dict=True)[0][pi0]


def h_bin(q):
    return -(q * sp.log(q) + (1 - q) * sp.log(1 - q))


H2 = pi_sol * h_bin(a_s) + sp.simplify(1 - pi_sol) * h_bin(b_s)  # pi_1 = 1 - pi_0
display(sp.Eq(pi0, sp.simplify(pi_sol)), sp.Eq(sp.Symbol("H"), H2))
H2_exact = sp.expand_log(H2.subs({a_s: sp.Rational(1, 4), b_s: sp.Rational(1, 2)}), force=True)
display(sp.Eq(sp.Symbol("H(a=1/4, b=1/2)"), sp.simplify(H2_exact)))

# %%
two_state = MarkovSource.from_transition([[0.75, 0.25], [0.5, 0.5]], order=1)
src_checks = Checks("MarkovSource: worked example")
src_checks.close("stationary pi", [2 / 3, 1 / 3], two_state.stationary, tol=1e-15)
src_checks.close("entropy rate (nats/token)", float(H2_exact), two_state.entropy_rate(), tol=1e-15)
src_checks

# %% [markdown]
# The book's default source has $V = 16$, order $k = 2$ (so $V^2 = 256$ contexts) and
# $\alpha = 0.2$. Its stationary distribution comes from power iteration in float64 on
# the chain of contexts, and its entropy rate is then a finite sum:

# %%
source = default_source()
H = source.entropy_rate()
print(source)
print(f"entropy rate H     = {H:.4f} nats/token  (perplexity e^H = {math.exp(H):.4f})")
print(f"uniform guess      = log V = {math.log(source.vocab_size):.4f} nats/token  (perplexity {source.vocab_size})")
print(f"stationarity residual |pi P - pi|_1 < 1e-14: {source.stationary_residual() < 1e-14}")

# %%
show_source(MarkovSource.entropy_rate)

# %% [markdown]
# A few sampled sequences: each token has about $e^H \approx 5$ plausible successors
# given the two before it.

# %%
for s in range(3):
    print(" ".join(f"{t:2d}" for t in source.sample(24, seed=s).tolist()))

# %% [markdown]
# The exact $H$ must agree with a Monte-Carlo estimate: sample a long sequence and
# average $-\log P(x_t \mid c_t)$ along it. Its standard error comes from 100 batch
# means (the tokens are correlated, the batches nearly independent).

# %%
long_run = source.sample(1_000_000, seed=2024)
nll = -source.conditional_log_probs(long_run).numpy()  # (N - 2,)
stderr = nll[: len(nll) // 100 * 100].reshape(100, -1).mean(1).std(ddof=1) / 10
print(f"Monte-Carlo estimate {nll.mean():.4f} ± {stderr:.4f}  vs exact {H:.4f}")
mc_checks = Checks("MarkovSource: default source")
mc_checks.close("Monte-Carlo entropy rate (4 s.e.)", H, nll.mean(), tol=4 * stderr)
mc_checks.close("stationarity residual |pi P - pi|_1", 0.0, source.stationary_residual(), tol=1e-14)
mc_checks.equal("same seed, same sample", source.sample(1000, seed=5), source.sample(1000, seed=5))
mc_checks

# %% [markdown]
# ## The n-gram baseline
#
# An order-$n$ **n-gram model** assumes that a token depends on the $n-1$ tokens before
# it, and estimates each conditional by counting, which is the maximum-likelihood
# estimate derived above, once per context. Unseen pairs would get probability 0 and an
# infinite loss, so we add $k$ to every count (add-$k$, or Lidstone, smoothing):
#
# $$\hat P(x \mid c) = \frac{N(c, x) + k}{N(c) + kV}.$$
#
# This is also the posterior mean under a $\operatorname{Dirichlet}(k)$ prior on each row,
# so $k = \alpha = 0.2$ is the Bayes choice for our source. Counting is one `bincount`
# over context numbers; there is no Python loop over tokens.

# %%
show_source(NGramModel.update)

# %%
show_source(NGramModel.probability_table)

# %% [markdown]
# We sample 2 million training tokens and 200,000 held-out ones, fit models of order
# 1 to 5 on growing prefixes of the training data, and score the held-out tokens.

# %%
train, val = source.train_val(2_000_000, 200_000, seed=1)
sizes = np.unique(np.logspace(2, math.log10(len(train)), 15).astype(int))
orders = [1, 2, 3, 4, 5]
held_out = {
    n: [NGramModel(n, source.vocab_size, add_k=0.2).fit(train[:size]).cross_entropy(val) for size in sizes]
    for n in orders
}
oracle = float(-source.conditional_log_probs(val).mean())  # the true source on the same tokens
print(f"true source on the held-out tokens: {oracle:.4f} nats/token (exact H = {H:.4f})")

# %%
fig, ax = plt.subplots(figsize=(7, 4.2))
for n in orders:
    ax.plot(sizes, held_out[n], marker="o", ms=3, label=f"n = {n}" + (" (order-matched)" if n == 3 else ""))
ax.axhline(H, color="black", ls="--", lw=1, label=f"entropy rate H = {H:.4f}")
ax.axhline(math.log(source.vocab_size), color="grey", ls=":", lw=1, label="uniform, log V")
ax.set_xscale("log")
ax.set_ylim(H - 0.1, 3.2)
ax.set(xlabel="training tokens", ylabel="held-out cross-entropy (nats/token)",
       title="n-gram models on the synthetic source (V = 16, order 2)")
ax.legend(fontsize="small", ncol=2)
save_figure(fig, "03_language_modelling_ngram_convergence")
plt.show()

# %% [markdown]
# Read the figure from right to left. The **order-matched** trigram ($n = 3$: two tokens
# of context, like the source) falls onto the floor. The unigram and bigram flatten out
# well above it no matter how much data they get: they cannot see the token two places
# back, and on this source that costs about a nat per token. (The unigram sits just
# below $\log V$: the stationary token frequencies are nearly uniform.) The 4-gram and
# 5-gram *can* represent the source exactly, since they may ignore their extra context,
# but they split the data over 16 and 256 times more contexts and need that much more
# data: they trail the trigram everywhere and the 5-gram is still catching up at two
# million tokens. Smoothing matters too: with few tokens the bigram is worse than the
# unigram, because its true conditionals (averages of the source's peaked rows) are far
# flatter than the add-0.2 prior assumes, so it is overconfident.

# %%
print(f"{'order':>5}  {'CE at 2M tokens':>15}  {'gap to H':>9}  {'gap to true source':>18}")
for n in orders:
    ce = held_out[n][-1]
    print(f"{n:>5}  {ce:>15.4f}  {ce - H:>9.4f}  {ce - oracle:>18.4f}")

# %% [markdown]
# At 2M tokens the trigram is within about a thousandth of a nat of the true source on the
# same held-out tokens (the gap to the exact $H$ also contains the sampling noise of the
# held-out set, of order 0.002 nats for 200,000 tokens). A statistical rule of thumb predicts this gap: each of
# the $256 \times 15$ free probabilities adds about $1/(2N)$ nats of estimation error,
# $3840 / (2 \cdot 2\times 10^6) \approx 0.001$.
#
# That is the bar for the rest of the book: a neural model trained on this source is good
# when its held-out loss approaches $H = 1.6184$ nats/token, and the n-gram curve shows
# how much data a model that knows the right context length needs to get there.
#
# ## Summary
#
# * The chain rule $P(x_{1:T}) = \prod_t P(x_t \mid x_{<t})$ holds for every distribution,
#   so a next-token predictor is a complete model of text; maximum likelihood is minimum
#   cross-entropy, and for a categorical distribution its solution is the empirical
#   frequency (derived with a Lagrange multiplier).
# * The softmax is shift invariant. The gradient of the cross-entropy in the logits is
#   $p - \mathbf{y}$, and the softmax Jacobian, which is also the loss's Hessian, is
#   $\operatorname{diag}(p) - pp^\top$: positive semi-definite, flat along $\mathbf{1}$,
#   zero at a saturated (one-hot) $p$. So at a saturated softmax a loss of the probabilities
#   gets no gradient, while the cross-entropy from the logits still gets $p - \mathbf{y}$,
#   which vanishes only when the saturated class is the target. All are derived in SymPy
#   and checked against autograd in float64.
# * Subtracting the max makes `softmax`, `log_softmax`, `logsumexp` and `cross_entropy`
#   finite at logits of $\pm 10^4$; they agree with PyTorch's to round-off relative to the
#   float32 spacing (about $2^{-19}$ near 30).
# * Perplexity $e^{\text{cross-entropy}}$ is an effective number of choices.
# * The synthetic Markov source has an exact entropy rate $H = 1.6184$ nats/token, the
#   floor for every model trained on it; an order-matched n-gram reaches it with a few
#   million tokens, and models with too short a context never do.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/03_language_modelling.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 03` writes a stub
# of every function, `llmbook grade 03` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_03.py` runs
# the same checks on the reference.
#
# 1. (★★) **The shift needs no gradient.** `logsumexp` detaches its shift $m = \max_j z_j$.
#    Show that it may: with SymPy, for $V = 3$, let $m(z_1, z_2, z_3)$ be an *arbitrary*
#    differentiable function (a `sympy.Function`) and show that
#    $\partial / \partial z_i\,[\,m + \log \sum_j e^{z_j - m}\,] = \operatorname{softmax}(z)_i$:
#    the terms in $\partial m / \partial z_i$ cancel. Then write a log-sum-exp that does *not*
#    detach the max and check in float64 that autograd's gradient of both equals
#    `softmax(z)`, for random logits and for logits with a tied maximum, where the gradient
#    of `max` itself is split between the tied entries.
# 2. (★) **Label smoothing.** Label smoothing trains against the target
#    $(1 - \varepsilon)\mathbf{y} + \varepsilon / V$ instead of $\mathbf{y}$. Write
#    `label_smoothed_cross_entropy(logits, targets, epsilon)` with `log_softmax` and match
#    `F.cross_entropy(..., label_smoothing=epsilon)` to $10^{-12}$ in float64.
# 3. (★★) **Where the flat curves end.** The unigram and bigram curves in the figure flatten
#    out. Compute their limits exactly from `source.stationary` and `source.transition`: with
#    unlimited data an order-$n$ model's cross-entropy is the conditional entropy
#    $H(X_t \mid X_{t-n+1}, \dots, X_{t-1}) = H_n - H_{n-1}$, where $H_n$ is the entropy of an $n$-block
#    of the stationary chain. Compare with the printed table.
# 4. (★★) **Cross-entropy is entropy plus KL.** Show with SymPy that for distributions
#    $q, p$ on three outcomes, $H(q, p) = H(q) + \mathrm{KL}(q \,\|\, p)$, and that the KL
#    term is zero at $p = q$ and positive elsewhere on a grid. This is why the entropy rate
#    is a floor.

# %%
from llmbook.workbench import grade

grade("03", globals())
