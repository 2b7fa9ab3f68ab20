# %% [markdown]
# # 8 Backpropagation
#
# Training a model means following the gradient of the loss $\mathcal L$ with respect to
# every parameter $\theta$. A transformer has millions of parameters and one scalar loss,
# and backpropagation computes all of $\partial \mathcal L / \partial \theta$ at the cost of
# about two more forward passes. This chapter opens the box that `loss.backward()` closes:
#
# 1. **the chain rule as a product of Jacobians**, and why multiplying it from the loss
#    end (reverse mode) is the cheap order: every step is a vector-Jacobian product;
# 2. **backward passes by hand** for the layers of the book: the linear layer, softmax,
#    cross-entropy, LayerNorm, GELU and attention. Each is derived in SymPy, implemented in
#    `llmbook.training.backprop` and checked against `torch.autograd` to $10^{-10}$ in float64;
# 3. **a scalar autograd engine** (`llmbook.training.autograd.Value`), one class of about 150 lines, that
#    trains a small MLP with exactly the loss curve PyTorch gives;
# 4. **finite differences**: why the step $\varepsilon$ can be too small as well as too
#    large, where the optimum lies, and a gradient checker built on it.

# %%
import matplotlib.pyplot as plt
import numpy as np
import sympy as sp
import torch
import torch.nn.functional as F
from IPython.display import display
from torch.utils.flop_counter import FlopCounterMode

from llmbook.nbtools import Checks, save_figure, seed_everything, show_source
from llmbook.training.autograd import (
    MLP,
    Value,
    finite_difference,
    gradcheck,
    mse_loss,
    numeric_gradient,
    topological_order,
)
from llmbook.training.backprop import (
    attention_backward,
    cross_entropy_backward,
    gelu_backward,
    layer_norm_backward,
    linear_backward,
    softmax_backward,
)

g = seed_everything(0)
torch.set_num_threads(1)  # every tensor here is small
f64 = torch.float64


def randn(*shape):
    """A float64 tensor of standard normal entries from the chapter's generator."""
    return torch.randn(*shape, generator=g, dtype=f64)


def grad_matrix(L, M):
    """The matrix of partial derivatives dL/dM_ij of a SymPy scalar L, shaped like M."""
    return sp.Matrix(*M.shape, lambda i, j: sp.diff(L, M[i, j]))


def is_zero(M):
    """True if every entry of the SymPy matrix M simplifies to 0."""
    return M.applyfunc(lambda e: sp.together(sp.expand(e))) == sp.zeros(*M.shape)


# %% [markdown]
# ## 8.1 The chain rule, Jacobians and vector-Jacobian products
#
# A network is a composition $\mathcal L = \ell \circ f_K \circ \dots \circ f_1$ of maps
# $f_k: \mathbb{R}^{n_{k-1}} \to \mathbb{R}^{n_k}$, ending in a scalar loss $\ell$. Write
# $h_k = f_k(h_{k-1})$ and $J_k = \partial h_k / \partial h_{k-1}$ ($n_k \times n_{k-1}$).
# The chain rule says the Jacobian of a composition is the product of the Jacobians, so the
# gradient with respect to the input, as a row vector, is
#
# $$ \frac{\partial \mathcal L}{\partial h_0} = \frac{\partial \ell}{\partial h_K}\, J_K\, J_{K-1} \cdots J_1 . $$
#
# Matrix multiplication is associative, but the cost of the two orders is not the same.
# From the right (**forward mode**) every partial product $J_k \cdots J_1$ is an
# $n_k \times n_0$ matrix: one column per input. From the left (**reverse mode**) every
# partial product $\bar h_k^\top = \frac{\partial \ell}{\partial h_K} J_K \cdots J_{k+1}$
# is a single row vector, and each step is a **vector-Jacobian product**
#
# $$ \bar h_{k-1} = J_k^\top\, \bar h_k , $$
#
# which never needs $J_k$ as a matrix: for a linear layer it is one matrix product, for an
# elementwise function one elementwise product. With one scalar output and millions of
# inputs, reverse mode is the order to use. It is what Rumelhart, Hinton & Williams (1986,
# "Learning representations by back-propagating errors") called back-propagation, and what
# Griewank & Walther (2008, "Evaluating Derivatives") analyse as the reverse mode of automatic
# differentiation: its cost is a small constant times the cost of the forward pass, however
# many inputs there are.
#
# SymPy writes the rule out for a composition of two arbitrary (undefined) maps
# $f: \mathbb{R}^2 \to \mathbb{R}^3$ and $\ell: \mathbb{R}^3 \to \mathbb{R}$. This is a display,
# not a proof: SymPy differentiates $\ell(f(u))$ *by* the chain rule, so comparing its result
# with $J_f^\top \nabla \ell$ would check the rule with itself:

# %%
u = sp.Matrix(sp.symbols("u_0:2", real=True))
h = sp.Matrix(sp.symbols("h_0:3", real=True))
f_sym = sp.Matrix([sp.Function(f"f_{i}")(*u) for i in range(3)])  # R^2 -> R^3
ell = sp.Function("ell")(*h)  # R^3 -> R
composed = ell.subs(dict(zip(h, f_sym, strict=True)))
display(sp.Eq(sp.Symbol(r"\partial \ell(f(u)) / \partial u_0"), sp.diff(composed, u[0])))

# %% [markdown]
# An independent witness needs no derivative of the composition at all: a difference
# quotient. Take two concrete maps, $f(u) = (\sin u_0 u_1,\; u_0^2 + e^{u_1},\; u_0 - u_1^3)$
# and $\ell(h) = \log(1 + h_0^2) + h_1 h_2$. SymPy differentiates each map *on its own*
# ($J_f$, $3 \times 2$, and $\nabla \ell$), the chain rule multiplies them at the point
# $u = (0.7, -1.3)$, and `numeric_gradient` (in `llmbook.training.autograd`) differentiates
# the composed function by central differences in float64, $\varepsilon = 10^{-5}$, with no
# autograd and no symbolic derivative of the composition. Section 8.9 derives the error of a
# central difference, $\tfrac{\varepsilon^2}{6}|F'''| + u|F|/\varepsilon$: at this step about
# $2 \times 10^{-11}$ per unit of third derivative and $10^{-11}$ per unit of $|F|$, so for
# derivatives and values of order 10 to 100 it stays below $10^{-9}$. The check allows
# $10^{-8}$, fixed before the run; a chain that keeps only the path through $h_0$ (forgetting
# that $u$ reaches $\ell$ along three paths) is compared too, to show the check can fail:

# %%
f_map = sp.Matrix([sp.sin(u[0] * u[1]), u[0]**2 + sp.exp(u[1]), u[0] - u[1]**3])  # R^2 -> R^3
ell_map = sp.log(1 + h[0]**2) + h[1] * h[2]  # R^3 -> R
J_f = sp.lambdify(u, f_map.jacobian(u))  # (3, 2): the Jacobian of f alone
grad_ell = sp.lambdify(h, sp.Matrix([ell_map]).jacobian(h))  # (1, 3): the gradient of ell alone
f_num, ell_num = sp.lambdify(u, f_map), sp.lambdify(h, ell_map)
u_at = np.array([0.7, -1.3])
h_at = np.asarray(f_num(*u_at), dtype=float).ravel()  # (3,): h = f(u)
Jf_at, gl_at = np.asarray(J_f(*u_at), dtype=float), np.asarray(grad_ell(*h_at), dtype=float).ravel()
chain = Jf_at.T @ gl_at  # (2,): J_f^T grad ell(f(u)), the chain rule
one_path = Jf_at[0] * gl_at[0]  # (2,): only the path through h_0
(numeric,) = numeric_gradient(lambda t: ell_num(*np.asarray(f_num(*t.tolist()), dtype=float).ravel()),
                              torch.tensor(u_at, dtype=f64), eps=1e-5)
print("chain rule:", chain.round(6), " central differences:", numeric.numpy().round(6))
checks = Checks("chain rule vs central differences (float64, eps = 1e-5)")
checks.close("J_f^T grad ell vs differences of ell(f(u))", numeric, chain, tol=1e-8)
one_path_error = float(np.abs(one_path - numeric.numpy()).max())
checks.true("the one-path chain is off by more than 1e-2", one_path_error > 1e-2, round(one_path_error, 2))
checks

# %% [markdown]
# The rest of the chapter writes $\bar h_k$, $J_k^\top \bar h_k$ out for each layer. We use
# $G$ (or $\mathrm dO$, $\mathrm dA$, ...) for the gradient of $\mathcal L$ with respect to a
# layer's output, with the output's shape: the **upstream gradient**.
#
# ## 8.2 The linear layer
#
# Take $Y = XW$ with $X \in \mathbb{R}^{N \times d_{in}}$ ($N$ rows: the $B \cdot T$ positions
# of a batch) and $W \in \mathbb{R}^{d_{in} \times d_{out}}$, and let $G = \partial \mathcal L
# / \partial Y$. Since $Y_{nk} = \sum_j X_{nj} W_{jk}$, only the entries $Y_{\cdot k}$ depend
# on $W_{jk}$, and
#
# $$ \frac{\partial \mathcal L}{\partial W_{jk}} = \sum_n G_{nk} X_{nj}
#    \;\Rightarrow\; \frac{\partial \mathcal L}{\partial W} = X^\top G, \qquad
#    \frac{\partial \mathcal L}{\partial X_{nj}} = \sum_k G_{nk} W_{jk}
#    \;\Rightarrow\; \frac{\partial \mathcal L}{\partial X} = G W^\top . $$
#
# A check that costs nothing: each gradient has the shape of what it differentiates, and
# there is only one way to combine $X$, $W$ and $G$ into a matrix of that shape. SymPy takes
# $X$ of shape $2 \times 3$, $W$ of shape $3 \times 2$ and a symbolic $G$, and writes the
# loss as $\mathcal L = \sum_{nk} G_{nk} (XW)_{nk}$: any loss whose gradient at $Y$ is $G$
# has the same gradients, to first order, as this one.

# %%
X_s = sp.Matrix(2, 3, lambda i, j: sp.Symbol(f"x_{i}{j}"))
W_s = sp.Matrix(3, 2, lambda i, j: sp.Symbol(f"w_{i}{j}"))
G_s = sp.Matrix(2, 2, lambda i, j: sp.Symbol(f"g_{i}{j}"))
L_lin = sum(G_s.multiply_elementwise(X_s * W_s))
dL_dW, dL_dX = grad_matrix(L_lin, W_s), grad_matrix(L_lin, X_s)
assert sp.simplify(dL_dW - X_s.T * G_s) == sp.zeros(3, 2)
assert sp.simplify(dL_dX - G_s * W_s.T) == sp.zeros(2, 3)
display(sp.Eq(sp.Symbol(r"\partial L / \partial W"), dL_dW, evaluate=False))

# %% [markdown]
# **PyTorch's layout.** `torch.nn.Linear` stores $W$ as $(d_{out}, d_{in})$ and computes
# $y = x W^\top + b$ for each row $x$. Substituting $W \to W^\top$ in the rules above gives
#
# $$ \frac{\partial \mathcal L}{\partial W} = G^\top X \ (d_{out} \times d_{in}), \qquad
#    \frac{\partial \mathcal L}{\partial X} = G W, \qquad
#    \frac{\partial \mathcal L}{\partial b} = \sum_n G_{n \cdot} , $$
#
# the bias gradient summing over the $N$ positions because the same $b$ is added to each.
# `llmbook.training.backprop.linear_backward` implements this layout, the one every module of the
# book uses, with any leading batch dimensions. SymPy confirms it on the same symbols:

# %%
Wt_s = sp.Matrix(2, 3, lambda i, j: sp.Symbol(f"w_{j}{i}"))  # (d_out, d_in) = W_s^T
b_s = sp.Matrix(1, 2, lambda i, j: sp.Symbol(f"b_{j}"))
L_torch = sum(G_s.multiply_elementwise(X_s * Wt_s.T + sp.ones(2, 1) * b_s))
assert sp.simplify(grad_matrix(L_torch, Wt_s) - G_s.T * X_s) == sp.zeros(2, 3)
assert sp.simplify(grad_matrix(L_torch, X_s) - G_s * Wt_s) == sp.zeros(2, 3)
assert sp.simplify(grad_matrix(L_torch, b_s) - sp.ones(1, 2) * G_s) == sp.zeros(1, 2)

# %%
show_source(linear_backward)

# %% [markdown]
# Checks against `torch.autograd` in float64 on non-square shapes ($B = 3$, $T = 5$,
# $d_{in} = 7$, $d_{out} = 4$), the upstream gradient $G$ a random tensor:

# %%
B, T, d_in, d_out = 3, 5, 7, 4
x = randn(B, T, d_in).requires_grad_()
W = randn(d_out, d_in).requires_grad_()
b = randn(d_out).requires_grad_()
G = randn(B, T, d_out)
auto = torch.autograd.grad(F.linear(x, W, b), (x, W, b), G)
ours = linear_backward(x.detach(), W.detach(), G)
checks = Checks("linear layer backward vs torch.autograd (float64)")
for name, a, o in zip(["dL/dx (B, T, d_in)", "dL/dW (d_out, d_in)", "dL/db (d_out,)"], auto, ours, strict=True):
    checks.close(name, a, o, tol=1e-10)
checks

# %% [markdown]
# ### What the backward pass costs
#
# The forward pass of a linear layer is one matrix product of $2 N d_{in} d_{out}$
# floating-point operations (a multiply and an add per term). The backward pass is two of
# the same size, $G W$ and $G^\top X$, so it costs **twice the forward pass**; the first
# layer can skip $G W$ when nobody needs the gradient of the input. PyTorch's
# `FlopCounterMode` counts the matrix-product FLOPs that autograd actually runs, on a
# three-layer MLP with a batch of 32:

# %%
net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 64),
                          torch.nn.Tanh(), torch.nn.Linear(64, 10))
xb = torch.randn(32, 64, generator=g)
flops = {}
for needs_input_grad in (False, True):
    xin = xb.clone().requires_grad_(needs_input_grad)
    with FlopCounterMode(display=False) as forward_count:
        loss = net(xin).square().sum()
    with FlopCounterMode(display=False) as backward_count:
        loss.backward()
    flops[needs_input_grad] = (forward_count.get_total_flops(), backward_count.get_total_flops())
    print(f"input grad {needs_input_grad!s:5}: forward {flops[needs_input_grad][0]:,} FLOPs, "
          f"backward {flops[needs_input_grad][1]:,} (ratio {flops[needs_input_grad][1] / flops[needs_input_grad][0]:.3f})")

# %%
n_params = sum(p.numel() for p in net.parameters())
per_layer = [2 * 32 * m.in_features * m.out_features for m in net if isinstance(m, torch.nn.Linear)]
checks = Checks("backward FLOPs = 2 x forward (matrix products)")
checks.equal("forward = sum of 2 N d_in d_out", sum(per_layer), flops[True][0])
checks.equal("backward with input grad = 2 x forward", 2 * flops[True][0], flops[True][1])
checks.equal("backward without = 2 x forward - first layer's G W", 2 * flops[False][0] - per_layer[0], flops[False][1])
checks

# %% [markdown]
# A training step (forward plus backward) therefore costs about three forward passes, the
# factor behind the "$C \approx 6ND$" rule of chapter 11 ($2N$ FLOPs per token forward,
# $4N$ backward). Forward mode would need one Jacobian-vector product *per parameter*
# direction, each about as costly as a forward pass, so a full gradient would take as many
# passes as there are parameters:

# %%
print(f"parameters of the MLP: {n_params:,}; forward-mode passes for a full gradient: {n_params:,}; "
      f"reverse-mode passes: 1")

# %% [markdown]
# ## 8.3 Softmax
#
# For $p = \mathrm{softmax}(z)$, $p_i = e^{z_i} / \sum_j e^{z_j}$, the quotient rule gives
# $\partial p_i / \partial z_j = p_i \delta_{ij} - p_i p_j$, that is
#
# $$ J_{\mathrm{softmax}} = \operatorname{diag}(p) - p p^\top . $$
#
# The Jacobian is symmetric, and its vector-Jacobian product with an upstream gradient
# $g = \partial \mathcal L / \partial p$ collapses to $O(V)$ work:
#
# $$ J^\top g = p \odot g - p\,(p^\top g) = p \odot \big(g - \langle g, p \rangle \mathbf 1\big). $$
#
# Every row of $J$ sums to zero ($J \mathbf 1 = p - p \cdot 1 = 0$), so $J^\top g$ is
# orthogonal to $\mathbf 1$: the gradient never tries to shift all logits together, which
# would not change $p$ (the shift invariance of chapter 3). SymPy with $V = 3$:

# %%
z = sp.Matrix(sp.symbols("z_0:3", real=True))
gp = sp.Matrix(sp.symbols("g_0:3", real=True))
p_sym = z.applyfunc(sp.exp) / sum(z.applyfunc(sp.exp))
J_sm = p_sym.jacobian(z)
assert sp.simplify(J_sm - (sp.diag(*p_sym) - p_sym * p_sym.T)) == sp.zeros(3, 3)
vjp_sm = p_sym.multiply_elementwise(gp - (gp.T * p_sym)[0] * sp.ones(3, 1))
assert is_zero(J_sm.T * gp - vjp_sm)
assert sp.simplify(sum(vjp_sm)) == 0
display(sp.Eq(sp.Derivative(sp.Function("p_0")(*z), z[1]), sp.simplify(J_sm[0, 1])))

# %%
show_source(softmax_backward)

# %%
V = 11
zt = randn(B, T, V).requires_grad_()
pt = torch.softmax(zt, dim=-1)
gt = randn(B, T, V)
(auto_sm,) = torch.autograd.grad(pt, zt, gt)
ours_sm = softmax_backward(pt.detach(), gt)
J_explicit = torch.diag_embed(pt.detach()) - pt.detach().unsqueeze(-1) * pt.detach().unsqueeze(-2)
checks = Checks("softmax backward (float64)")
checks.close("p * (g - <g, p>) vs torch.autograd", auto_sm, ours_sm, tol=1e-10)
checks.close("vs the explicit Jacobian J^T g", (J_explicit.transpose(-1, -2) @ gt.unsqueeze(-1)).squeeze(-1), ours_sm, tol=1e-10)
checks.close("every row sums to 0", torch.zeros(B, T), ours_sm.sum(-1), tol=1e-14)
checks

# %% [markdown]
# ## 8.4 Cross-entropy
#
# Chapter 3 derived $\partial\, \mathrm{CE} / \partial z = p - y$ for one position with
# one-hot target $y$: composing $-\log p_y$ (gradient $-y / p$ with respect to $p$) with the
# softmax VJP gives $p \odot (-y/p + \langle y/p, p \rangle) = -y + p$. For the mean over $N$
# positions the gradient at each is $(p - y)/N$. SymPy re-derives it for $V = 3$, target 1,
# and checks that the composition of the two backward passes gives the same:

# %%
ce = -sp.log(p_sym[1])
y_onehot = sp.Matrix([0, 1, 0])
dce = sp.Matrix([sp.diff(ce, zi) for zi in z])
assert sp.simplify(dce - (p_sym - y_onehot)) == sp.zeros(3, 1)
g_log = sp.Matrix([0, -1 / p_sym[1], 0])  # d(-log p_1)/dp
through_softmax = p_sym.multiply_elementwise(g_log - (g_log.T * p_sym)[0] * sp.ones(3, 1))
assert sp.simplify(through_softmax - (p_sym - y_onehot)) == sp.zeros(3, 1)
display(sp.Eq(sp.Symbol(r"\partial\, \mathrm{CE} / \partial z_1"), sp.simplify(dce[1])))

# %%
show_source(cross_entropy_backward)

# %% [markdown]
# Checks against `F.cross_entropy` (mean over positions) with $B = 3$, $T = 5$, $V = 11$,
# once with every target counted and once with two positions set to PyTorch's
# `ignore_index` $= -100$ (they get no gradient and do not count in $N$):

# %%
targets = torch.randint(0, V, (B, T), generator=g)
targets_ignored = targets.clone()
targets_ignored[0, 0] = targets_ignored[2, 3] = -100
checks = Checks("cross-entropy backward (float64)")
for name, tgt in [("(p - y) / N vs autograd", targets), ("with ignore_index", targets_ignored)]:
    (auto_ce,) = torch.autograd.grad(F.cross_entropy(zt.reshape(-1, V), tgt.reshape(-1)), zt)
    checks.close(name, auto_ce, cross_entropy_backward(zt.detach(), tgt), tol=1e-10)
via_softmax = softmax_backward(pt.detach(), -F.one_hot(targets, V) / pt.detach() / (B * T))
checks.close("= softmax_backward of d(-log p_y)/dp", cross_entropy_backward(zt.detach(), targets), via_softmax, tol=1e-10)
checks.close("ignored positions get exactly 0", torch.zeros(2, V, dtype=f64),
             cross_entropy_backward(zt.detach(), targets_ignored)[targets_ignored == -100], tol=0)
checks

# %% [markdown]
# ## 8.5 LayerNorm
#
# Chapter 6 found the Jacobian of LayerNorm, $y = \gamma \odot \hat x + \beta$ with
# $\hat x = (x - \mu)/s$, $s = \sqrt{\sigma^2 + \varepsilon}$:
#
# $$ \frac{\partial y}{\partial x} = \frac{\operatorname{diag}(\gamma)}{s}\, P, \qquad
#    P = I - \tfrac1d \mathbf 1 \mathbf 1^\top - \tfrac1d \hat x \hat x^\top . $$
#
# $P$ is symmetric, so with $g' = \gamma \odot G$ the vector-Jacobian product is
# $P g' / s$, and writing out $P$ with bars for means over the $d$ features,
#
# $$ \frac{\partial \mathcal L}{\partial x} = \frac1s \Big( g' - \overline{g'}\,\mathbf 1
#    - \overline{g' \odot \hat x}\; \hat x \Big), \qquad
#    \frac{\partial \mathcal L}{\partial \gamma} = \sum_{\text{positions}} G \odot \hat x, \qquad
#    \frac{\partial \mathcal L}{\partial \beta} = \sum_{\text{positions}} G . $$
#
# $O(d)$ per position instead of the $O(d^2)$ of the Jacobian. SymPy builds LayerNorm
# from its definition for $d = 3$ (every $x_i$, $\gamma_i$ and $\varepsilon$ a symbol),
# takes `sp.Matrix.jacobian`, and compares its transpose times a symbolic $G$ with the formula:

# %%
d3 = 3
xl = sp.Matrix(sp.symbols("x_0:3", real=True))
gam = sp.Matrix(sp.symbols("gamma_0:3", real=True))
Gl = sp.Matrix(sp.symbols("G_0:3", real=True))
eps = sp.Symbol("epsilon", positive=True)
mu_l = sum(xl) / d3
s_l = sp.sqrt(sum((xi - mu_l) ** 2 for xi in xl) / d3 + eps)
x_hat = (xl - mu_l * sp.ones(d3, 1)) / s_l
y_ln = gam.multiply_elementwise(x_hat) + sp.Matrix(sp.symbols("beta_0:3", real=True))
gprime = gam.multiply_elementwise(Gl)
formula = (gprime - sum(gprime) / d3 * sp.ones(d3, 1) - sum(gprime.multiply_elementwise(x_hat)) / d3 * x_hat) / s_l
assert sp.simplify(y_ln.jacobian(xl).T * Gl - formula) == sp.zeros(d3, 1)
assert sp.simplify(y_ln.jacobian(gam).T * Gl - Gl.multiply_elementwise(x_hat)) == sp.zeros(d3, 1)
display(sp.Eq(sp.Symbol(r"J^{\top} G"), sp.Symbol(r"\frac{1}{s}\left(g' - \overline{g'}\,\mathbf{1} - \overline{g' \odot \hat x}\,\hat x\right)")))

# %%
show_source(layer_norm_backward)

# %%
d_ln = 8
xln = (3 * randn(B, T, d_ln) + 2).requires_grad_()
gamma_t, beta_t = randn(d_ln).requires_grad_(), randn(d_ln).requires_grad_()
G_ln = randn(B, T, d_ln)
checks = Checks("LayerNorm backward vs torch.autograd (float64)")
for ln_eps in (1e-5, 0.5):
    auto_ln = torch.autograd.grad(F.layer_norm(xln, (d_ln,), gamma_t, beta_t, ln_eps), (xln, gamma_t, beta_t), G_ln)
    ours_ln = layer_norm_backward(xln.detach(), gamma_t.detach(), ln_eps, G_ln)
    for name, a, o in zip(["dL/dx", "dL/dgamma", "dL/dbeta"], auto_ln, ours_ln, strict=True):
        checks.close(f"{name} (eps = {ln_eps})", a, o, tol=1e-10)
checks.close("dL/dx is orthogonal to 1", torch.zeros(B, T), ours_ln[0].sum(-1), tol=1e-13)
checks

# %% [markdown]
# ## 8.6 GELU
#
# An elementwise function has a diagonal Jacobian, and its VJP is an elementwise product:
# $\partial \mathcal L / \partial x = G \odot \mathrm{GELU}'(x)$. For the exact GELU
# $x\Phi(x)$ the derivative is $\Phi(x) + x\varphi(x)$; for GPT-2's tanh form (chapter 6),
# with $u = \sqrt{2/\pi}\,(x + c x^3)$, it is
# $\frac12(1 + \tanh u) + \frac x2 (1 - \tanh^2 u)\sqrt{2/\pi}\,(1 + 3cx^2)$. SymPy differentiates both:

# %%
xs, c = sp.Symbol("x", real=True), sp.Symbol("c", positive=True)
Phi = (1 + sp.erf(xs / sp.sqrt(2))) / 2
phi = sp.exp(-(xs**2) / 2) / sp.sqrt(2 * sp.pi)
assert sp.simplify(sp.diff(xs * Phi, xs) - (Phi + xs * phi)) == 0
u_t = sp.sqrt(2 / sp.pi) * (xs + c * xs**3)
gelu_t = xs / 2 * (1 + sp.tanh(u_t))
dgelu_t = (1 + sp.tanh(u_t)) / 2 + xs / 2 * (1 - sp.tanh(u_t) ** 2) * sp.sqrt(2 / sp.pi) * (1 + 3 * c * xs**2)
assert sp.simplify(sp.diff(gelu_t, xs) - dgelu_t) == 0
show_source(gelu_backward)

# %%
checks = Checks("GELU backward vs torch.autograd (float64)")
for approximate in ("none", "tanh"):
    (auto_gelu,) = torch.autograd.grad(F.gelu(xln, approximate=approximate), xln, G_ln)
    checks.close(f"approximate = {approximate!r}", auto_gelu, gelu_backward(xln.detach(), G_ln, approximate), tol=1e-10)
checks

# %% [markdown]
# ## 8.7 Attention
#
# Attention (chapter 4) is three steps, and its backward pass is their VJPs in reverse:
#
# $$ S = c\, Q K^\top, \qquad A = \mathrm{softmax}_{\text{rows}}(S), \qquad O = A V, $$
#
# with $c = 1/\sqrt{d_k}$ and a causal mask setting the masked $S_{ij}$ to $-\infty$. Given
# $\mathrm dO = \partial \mathcal L / \partial O$:
#
# * $O = AV$ is a matrix product (section 8.2): $\mathrm dV = A^\top \mathrm dO$ and
#   $\mathrm dA = \mathrm dO\, V^\top$;
# * each row of $A$ is a softmax (section 8.3):
#   $\mathrm dS = A \odot \big(\mathrm dA - \operatorname{rowsum}(\mathrm dA \odot A)\big)$;
# * $S = c\,QK^\top$ is a matrix product again: $\mathrm dQ = c\, \mathrm dS\, K$ and
#   $\mathrm dK = c\, \mathrm dS^\top Q$.
#
# A masked entry has $A_{ij} = 0$, hence $\mathrm dS_{ij} = 0$: no gradient flows through
# a connection that the forward pass cut. SymPy checks the whole chain on $2 \times 2$
# matrices with every entry of $Q$, $K$, $V$, $\mathrm dO$ and the scale $c$ symbolic,
# against the derivatives of $\mathcal L = \sum_{ij} \mathrm dO_{ij} O_{ij}$ taken entry by
# entry. (The expressions are rational functions of exponentials; bringing each difference
# to a common denominator is enough to see it vanish.)

# %%
def sym_matrix(name, rows=2, cols=2):
    return sp.Matrix(rows, cols, lambda i, j: sp.Symbol(f"{name}_{i}{j}", real=True))


Qs, Ks, Vs, dOs = sym_matrix("q"), sym_matrix("k"), sym_matrix("v"), sym_matrix("o")
cs = sp.Symbol("c", positive=True)
E_s = (cs * Qs * Ks.T).applyfunc(sp.exp)
A_s = sp.Matrix(2, 2, lambda i, j: E_s[i, j] / sum(E_s[i, :]))  # row softmax
L_att = sum(dOs.multiply_elementwise(A_s * Vs))
dA_s = dOs * Vs.T
dS_s = sp.Matrix(2, 2, lambda i, j: A_s[i, j] * (dA_s[i, j] - sum(dA_s[i, m] * A_s[i, m] for m in range(2))))
hand = {"dQ": (Qs, cs * dS_s * Ks), "dK": (Ks, cs * dS_s.T * Qs), "dV": (Vs, A_s.T * dOs)}
for name, (M, dM) in hand.items():
    assert is_zero(grad_matrix(L_att, M) - dM), name
print("dQ, dK and dV: the hand-derived chain equals SymPy's derivatives entry by entry")

# %%
show_source(attention_backward)

# %% [markdown]
# Checks against autograd through PyTorch's own `F.scaled_dot_product_attention`, in
# float64, with $B = 3$ sequences, $H = 2$ heads, $T_q = 5$ queries, $T_k = 6$ keys,
# $d_k = 7$ and $d_v = 4$, with and without the causal mask (top-left aligned, as PyTorch's
# `is_causal`), and with a non-default scale:

# %%
H, T_q, T_k, d_k, d_v = 2, 5, 6, 7, 4
q, k, v = randn(B, H, T_q, d_k).requires_grad_(), randn(B, H, T_k, d_k).requires_grad_(), randn(B, H, T_k, d_v).requires_grad_()
dO = randn(B, H, T_q, d_v)
checks = Checks("attention backward vs torch.autograd of F.scaled_dot_product_attention (float64)")
for causal, scale in [(False, None), (True, None), (True, 0.3)]:
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    auto_att = torch.autograd.grad(out, (q, k, v), dO)
    ours_att = attention_backward(q.detach(), k.detach(), v.detach(), dO, is_causal=causal, scale=scale)
    for name, a, o in zip(["dQ", "dK", "dV"], auto_att, ours_att, strict=True):
        checks.close(f"{name} (causal={causal}, scale={scale})", a, o, tol=1e-10)
checks

# %% [markdown]
# One more consequence of the mask. With the top-left aligned mask and $T_q = 5 < T_k = 6$,
# query $i$ sees the keys $j \le i$, so the last key is seen by no query at all: its rows of
# $\mathrm dK$ and $\mathrm dV$ must be exactly zero.

# %%
ours_att = attention_backward(q.detach(), k.detach(), v.detach(), dO, is_causal=True)
checks = Checks("causality in the backward pass")
checks.close("dK of the last key (seen by no query)", torch.zeros(B, H, d_k), ours_att[1][:, :, -1], tol=0)
checks.close("dV of the last key", torch.zeros(B, H, d_v), ours_att[2][:, :, -1], tol=0)
checks.true("dV of the first key is non-zero", bool(ours_att[2][:, :, 0].abs().min() > 0))
checks

# %% [markdown]
# ## 8.8 A scalar autograd engine
#
# PyTorch does all of the above automatically: every operation records its inputs and how
# to compute its VJP, and `backward()` replays the record in reverse. The whole idea fits in
# a small class. A `Value` holds a float `data`, its `children` (the Values it was computed
# from), and the **local derivatives** $\partial\,\text{self} / \partial\,\text{child}$,
# computed during the forward pass. Multiplication, for example, records that
# $\partial (ab)/\partial a = b$ and $\partial (ab)/\partial b = a$:

# %%
show_source(Value.__mul__)

# %% [markdown]
# Elementary functions record their derivative the same way, here
# $\tanh' = 1 - \tanh^2$, computed from the output:

# %%
show_source(Value.tanh)

# %% [markdown]
# The backward pass needs an order in which every node comes after all the nodes that use
# it, so that its gradient is complete before it is passed on: a reverse **topological
# order** of the graph. A recursive depth-first search is the textbook way to find one, but
# Python allows only about 1000 nested calls, and a chain of 10,000 operations is not deep
# by the standards of a training run. `topological_order` keeps its own stack:

# %%
show_source(topological_order)

# %% [markdown]
# `backward` then applies the chain rule once per edge. A node used twice (like $a$ in
# $a \cdot a$) receives a contribution along each use, and `+=` sums them, as the
# multivariable chain rule requires:

# %%
show_source(Value.backward)

# %% [markdown]
# A worked example: $f(a, b) = \tanh(ab + b^2)\, e^{a} / (a + 3) - \log(1 + \sigma(a - b))$ at
# $a = 0.7$, $b = -1.3$, against SymPy's derivatives evaluated in floating point, plus the
# rule for repeated use ($\mathrm d(a \cdot a)/\mathrm da = 2a$) and the 10,000-step chain
# $x \mapsto 1.0001\,x + 0.001$ alternately multiplying and adding (its derivative is
# $1.0001^{5000}$):

# %%
def f_example(a, b, exp, tanh, log, sigmoid):
    return tanh(a * b + b**2) * exp(a) / (a + 3) - log(1 + sigmoid(a - b))


a, b_ = Value(0.7, label="a"), Value(-1.3, label="b")
f_val = f_example(a, b_, Value.exp, Value.tanh, Value.log, Value.sigmoid)
f_val.backward()
sa, sb = sp.symbols("a b", real=True)
f_s = f_example(sa, sb, sp.exp, sp.tanh, sp.log, lambda t: 1 / (1 + sp.exp(-t)))
at = {sa: sp.Float(0.7, 30), sb: sp.Float(-1.3, 30)}
sym_grads = [float(sp.diff(f_s, var).evalf(subs=at)) for var in (sa, sb)]
print(f"f = {f_val.data:.6f}; df/da = {a.grad:.6f}, df/db = {b_.grad:.6f}; graph of {len(topological_order(f_val))} nodes")

# %%
twice = Value(1.5)
(twice * twice).backward()
x0 = Value(0.5)
chain = x0
for i in range(10_000):
    chain = chain * 1.0001 if i % 2 else chain + 0.001
chain.backward()
checks = Checks("Value against SymPy")
checks.close("f(a, b)", float(f_s.evalf(subs=at)), f_val.data, tol=1e-15)
checks.close("df/da, df/db", sym_grads, [a.grad, b_.grad], tol=1e-14)
checks.close("d(a a)/da = 2a at a = 1.5", 3.0, twice.grad, tol=0)
checks.close("10,000-op chain: d/dx0 = 1.0001^5000", 1.0001**5000, x0.grad, tol=1e-12)
checks

# %% [markdown]
# ### A small MLP, against PyTorch
#
# `llmbook.training.autograd.MLP` stacks neurons $\tanh(\sum_i w_i x_i + b)$ into layers (the last
# one linear), initialised from $\mathcal U(-1/\sqrt{n_{in}}, 1/\sqrt{n_{in}})$ like
# `torch.nn.Linear`. We build a $3 \to 4 \to 4 \to 1$ network, copy its weights into the same
# network written with `torch.nn.Linear` in float64, and fit 8 points of a smooth function
# of three variables with the mean squared error.

# %%
mlp = MLP([3, 4, 4, 1], activation="tanh", seed=0)
torch_mlp = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4),
                                torch.nn.Tanh(), torch.nn.Linear(4, 1)).double()
with torch.no_grad():
    for lin, (Wl, bl) in zip(torch_mlp[::2], mlp.weights(), strict=True):
        lin.weight.copy_(torch.tensor(Wl, dtype=f64))
        lin.bias.copy_(torch.tensor(bl, dtype=f64))
X_data = torch.rand(8, 3, generator=g, dtype=f64) * 2 - 1  # (8, 3) in [-1, 1]
y_data = torch.sin(2 * X_data[:, 0]) * X_data[:, 1] + 0.5 * X_data[:, 2]  # (8,)
print(f"{len(mlp.parameters())} parameters; MLP sizes {mlp.sizes}")


def value_loss():
    return mse_loss([mlp(row)[0] for row in X_data.tolist()], y_data.tolist())


def torch_loss():
    return F.mse_loss(torch_mlp(X_data).squeeze(-1), y_data)


# %%
mlp.zero_grad()
loss_v = value_loss()
loss_v.backward()
loss_t = torch_loss()
loss_t.backward()
checks = Checks("Value MLP vs PyTorch (float64)")
checks.close("loss", loss_t, loss_v.data, tol=1e-12)
for i, (lin, (dW, db)) in enumerate(zip(torch_mlp[::2], mlp.gradients(), strict=True)):
    checks.close(f"layer {i}: dL/dW {tuple(lin.weight.shape)}", lin.weight.grad, torch.tensor(dW, dtype=f64), tol=1e-12)
    checks.close(f"layer {i}: dL/db {tuple(lin.bias.shape)}", lin.bias.grad, torch.tensor(db, dtype=f64), tol=1e-12)
checks

# %% [markdown]
# Now train both for 60 steps of plain gradient descent, $\theta \leftarrow \theta - \eta\,
# \nabla_\theta \mathcal L$ with $\eta = 0.2$ (chapter 9 does better), each engine with its own
# gradients:

# %%
lr, steps = 0.2, 60
curve_v, curve_t = [], []
for _ in range(steps):
    mlp.zero_grad()
    loss_v = value_loss()
    loss_v.backward()
    for p_ in mlp.parameters():
        p_.data -= lr * p_.grad
    torch_mlp.zero_grad()
    loss_t = torch_loss()
    loss_t.backward()
    with torch.no_grad():
        for p_ in torch_mlp.parameters():
            p_ -= lr * p_.grad
    curve_v.append(loss_v.data)
    curve_t.append(loss_t.item())
curve_v, curve_t = np.array(curve_v), np.array(curve_t)
print(f"loss: step 0 {curve_v[0]:.4f}, step {steps - 1} {curve_v[-1]:.4f}; "
      f"Value and PyTorch agree to 1e-14 at every step: {np.abs(curve_v - curve_t).max() < 1e-14}")

# %%
final_W = [torch.tensor(Wl, dtype=f64) for Wl, _ in mlp.weights()]
checks = Checks("training: Value vs PyTorch")
checks.close("loss curve (60 steps)", curve_t, curve_v, tol=1e-12)
checks.close("final weights, every layer", torch.cat([lin.weight.detach().reshape(-1) for lin in torch_mlp[::2]]),
             torch.cat([Wl.reshape(-1) for Wl in final_W]), tol=1e-12)
checks.true("the loss went down by more than 5x", curve_v[-1] < curve_v[0] / 5, curve_v[0] / curve_v[-1])
checks

# %%
fig, ax = plt.subplots(figsize=(7, 3.8))
ax.plot(curve_t, color="tab:orange", lw=4, alpha=0.5, label="PyTorch (torch.autograd)")
ax.plot(curve_v, color="black", lw=1, ls="--", label="llmbook Value engine")
ax.set_yscale("log")
ax.set(title="The same 3-4-4-1 MLP trained by two autograd engines (float64)",
       xlabel="gradient-descent step", ylabel="mean squared error (target units$^2$)")
ax.legend()
save_figure(fig, "08_backpropagation_mlp_training")
plt.show()

# %% [markdown]
# The two curves lie on top of each other: step after step the engines agree to round-off,
# because they compute the same numbers in a different order. The Value engine is of course
# far slower (a Python object per scalar); PyTorch's autograd does the same bookkeeping once
# per *tensor* operation and hands the arithmetic to the matrix-product kernels of
# section 8.2.
#
# ## 8.9 Finite differences and gradient checking
#
# Every check above compared two exact methods. The oldest check of a gradient needs no
# derivative at all: a difference quotient. For a scalar function $f$,
#
# $$ D_+ f(x) = \frac{f(x + \varepsilon) - f(x)}{\varepsilon}
#    = f'(x) + \frac{\varepsilon}{2} f''(x) + O(\varepsilon^2), \qquad
#    D_0 f(x) = \frac{f(x + \varepsilon) - f(x - \varepsilon)}{2\varepsilon}
#    = f'(x) + \frac{\varepsilon^2}{6} f'''(x) + O(\varepsilon^4) . $$
#
# The central difference's error falls faster, but both *truncation errors* fall with
# $\varepsilon$, so why not take $\varepsilon$ tiny? Because $f$ is evaluated in floating
# point: each value carries a relative error of up to $u$, the unit round-off
# ($2^{-53} \approx 1.1 \times 10^{-16}$ in float64, $2^{-24} \approx 6 \times 10^{-8}$ in
# float32), and the difference of two nearly equal values, divided by $\varepsilon$, turns it
# into an error of about $2u|f|/\varepsilon$ (forward) or $u|f|/\varepsilon$ (central).
# The total is
#
# $$ E(\varepsilon) = a\, \varepsilon^{p} + \frac{b}{\varepsilon}, $$
#
# $p = 1$, $a = |f''|/2$, $b = 2u|f|$ forward, and $p = 2$, $a = |f'''|/6$, $b = u|f|$
# central. SymPy minimises it:

# %%
e_, a_, b_s, p_ = sp.symbols("varepsilon a b p", positive=True)
E_model = a_ * e_**p_ + b_s / e_
eps_opt = sp.solve(sp.diff(E_model, e_), e_)[0]
assert sp.simplify(eps_opt - (b_s / (p_ * a_)) ** (1 / (p_ + 1))) == 0
u_sym, f0 = sp.symbols("u f", positive=True)  # f = f' = f'' = f''' for f = exp
eps_fwd = sp.simplify(eps_opt.subs({p_: 1, a_: f0 / 2, b_s: 2 * u_sym * f0}))
eps_cen = sp.simplify(eps_opt.subs({p_: 2, a_: f0 / 6, b_s: u_sym * f0}))
display(sp.Eq(sp.Symbol(r"\varepsilon^*"), eps_opt), sp.Eq(sp.Symbol(r"\varepsilon^*_{\mathrm{forward}}"), eps_fwd),
        sp.Eq(sp.Symbol(r"\varepsilon^*_{\mathrm{central}}"), eps_cen))

# %% [markdown]
# For $f = \exp$ (where $f = f'' = f'''$) the optimum is $\varepsilon^* = 2\sqrt u$ forward
# and $(3u)^{1/3}$ central, and the best error is of order $\sqrt u$ and $u^{2/3}$: about
# $10^{-8}$ and $10^{-11}$ in float64, but only $10^{-4}$ and $10^{-5}$ in float32.

# %%
unit_roundoff = {torch.float64: 2.0**-53, torch.float32: 2.0**-24}
predicted = {(dt, scheme): float((eps_fwd if scheme == "forward" else eps_cen).subs(u_sym, uu))
             for dt, uu in unit_roundoff.items() for scheme in ("forward", "central")}
for (dt, scheme), e_star in predicted.items():
    print(f"{str(dt):14s} {scheme:8s} optimal eps = {e_star:.2g}")

# %% [markdown]
# The experiment: the relative error of both quotients for $\exp$ at 1001 points
# $x \in [0.5, 1.5]$, median over the points, for 49 step sizes from $10^{-16}$ to 1 (three per
# decade), with all arithmetic in the dtype under test:

# %%
eps_grid = np.logspace(-16, 0, 49)
x_grid = torch.linspace(0.5, 1.5, 1001, dtype=f64)
errors = {}
for dt in unit_roundoff:
    for scheme in ("forward", "central"):
        fd = torch.stack([finite_difference(torch.exp, x_grid.to(dt), float(e), scheme).double() for e in eps_grid])
        errors[dt, scheme] = ((fd - x_grid.exp()).abs() / x_grid.exp()).median(dim=1).values.numpy()
best = {key: (eps_grid[err.argmin()], err.min()) for key, err in errors.items()}
for (dt, scheme), (e_best, err_best) in best.items():
    print(f"{str(dt):14s} {scheme:8s} best eps = {e_best:.2g} (predicted {predicted[dt, scheme]:.2g}), "
          f"error {err_best:.0e}")

# %%
fig, ax = plt.subplots(figsize=(8, 4.5))
styles = {"forward": "o-", "central": "s-"}
colours = {torch.float64: "tab:blue", torch.float32: "tab:red"}
for (dt, scheme), err in errors.items():
    ax.plot(eps_grid, err, styles[scheme], color=colours[dt], ms=3, lw=1,
            label=f"{scheme}, {str(dt).removeprefix('torch.')}")
    uu, p_val = unit_roundoff[dt], (1 if scheme == "forward" else 2)
    model = (eps_grid / 2 + 2 * uu / eps_grid) if p_val == 1 else (eps_grid**2 / 6 + uu / eps_grid)
    ax.plot(eps_grid, model, ":", color=colours[dt], lw=1)
    ax.axvline(predicted[dt, scheme], color=colours[dt], lw=0.5, alpha=0.6)
ax.set(xscale="log", yscale="log", ylim=(1e-13, 10), xlabel=r"step $\varepsilon$ (units of x)",
       ylabel="relative error of the derivative (median)",
       title=r"Finite differences of $e^x$: truncation ($\propto\varepsilon^p$) against round-off ($\propto u/\varepsilon$)")
ax.legend(fontsize="small", loc="lower left")
save_figure(fig, "08_backpropagation_finite_differences")
plt.show()

# %% [markdown]
# Each curve is a V. To the right of its minimum the truncation error dominates, with slope
# 1 (forward) or 2 (central) on the log-log axes; to the left, round-off, with slope $-1$;
# the dotted lines are the error model $a\varepsilon^p + b/\varepsilon$ with the bound
# $b$, which the median error stays just under. The minima sit where SymPy put them
# (the thin vertical lines), within a factor of about 2: near $10^{-8}$ and $10^{-5}$ in
# float64, $5 \times 10^{-4}$ and $6 \times 10^{-3}$ in float32. On the far left of the float32 curves $x + \varepsilon$ rounds to
# $x$ and the quotient is 0, a relative error of exactly 1. In float32 even the best central
# difference is only good to a few parts in a million, too coarse to check a gradient that
# is wrong by a few parts in a thousand; hence gradient checking is always done in float64.

# %%
checks = Checks("finite-difference optima: measured vs the error model")
for (dt, scheme), (e_best, _) in best.items():
    ratio = e_best / predicted[dt, scheme]
    checks.true(f"{str(dt).removeprefix('torch.')} {scheme}: best eps within 4x of predicted", 0.25 < ratio < 4, ratio)
checks.true("float64 central beats float64 forward by > 100x", best[f64, "central"][1] * 100 < best[f64, "forward"][1])
checks.true("float32 central best error > 1e-6", best[torch.float32, "central"][1] > 1e-6,
            float(f"{best[torch.float32, 'central'][1]:.0e}"))
checks

# %% [markdown]
# ### A gradient checker
#
# `llmbook.training.autograd.gradcheck` perturbs each input entry by $\pm\varepsilon$
# ($\varepsilon = 10^{-6}$, near the central optimum), compares the central difference of
# $f$ with autograd's gradient, and passes an entry when the two agree to
# $\mathrm{atol} + \mathrm{rtol}\,|\text{numeric}|$ ($10^{-5}$ and $10^{-3}$, PyTorch's
# defaults). A function with a vector output is reduced to $\langle v, f \rangle$ for a fixed
# random $v$, so the check is of $J^\top v$, the vector-Jacobian product, one random
# direction at a time. It refuses float32 inputs, for the reason the figure shows:

# %%
show_source(gradcheck)

# %% [markdown]
# We test it the way one tests a smoke detector: with smoke. `SiLUWrongBackward` computes
# $\mathrm{SiLU}(x) = x\sigma(x)$ correctly but returns $\sigma(x)$ as its derivative,
# forgetting the $x\sigma(x)(1 - \sigma(x))$ term; `SiLUScaledBackward` returns the true
# derivative times $1.0001$, a relative error of $10^{-4}$, ten times smaller than the
# relative tolerance $\mathrm{rtol} = 10^{-3}$ both checkers use by default. With those
# defaults both, ours and `torch.autograd.gradcheck`, should accept the correct function and
# the scaled one and reject the wrong formula:

# %%
class SiLUWrongBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_):
        ctx.save_for_backward(x_)
        return x_ * torch.sigmoid(x_)

    @staticmethod
    def backward(ctx, grad_output):
        (x_,) = ctx.saved_tensors
        return grad_output * torch.sigmoid(x_)  # missing + x sigma (1 - sigma)


class SiLUScaledBackward(SiLUWrongBackward):
    @staticmethod
    def backward(ctx, grad_output):
        (x_,) = ctx.saved_tensors
        s_ = torch.sigmoid(x_)
        return 1.0001 * grad_output * (s_ + x_ * s_ * (1 - s_))


# %%
x_check = randn(3, 4)
candidates = {"F.silu": F.silu, "wrong backward": SiLUWrongBackward.apply, "backward x 1.0001": SiLUScaledBackward.apply,
              "attention (q, k, v)": lambda q_, k_, v_: F.scaled_dot_product_attention(q_, k_, v_, is_causal=True)}
att_inputs = (randn(2, 3, 4), randn(2, 5, 4), randn(2, 5, 3))
checks = Checks("gradcheck: ours vs torch.autograd.gradcheck")
for name, fn in candidates.items():
    inputs = att_inputs if name.startswith("attention") else (x_check,)
    ours_ok = gradcheck(fn, inputs)
    torch_ok = torch.autograd.gradcheck(fn, tuple(t.clone().requires_grad_() for t in inputs), raise_exception=False)
    checks.equal(f"{name}: verdict (ours = torch)", torch_ok, bool(ours_ok))
    shown = f"{ours_ok.max_abs_error:.0e}" if ours_ok.max_abs_error > 1e-8 else "< 1e-8"
    print(f"{name:20s} ours: {'passed' if ours_ok else 'FAILED'} (max |analytic - numeric| {shown}), torch: {torch_ok}")
checks.true("the wrong backward fails", not gradcheck(SiLUWrongBackward.apply, x_check))
checks

# %%
try:
    gradcheck(F.silu, x_check.float())
except TypeError as err:
    print(f"TypeError: {err}")

# %% [markdown]
# Passing the scaled backward is a property of the default tolerance, not of finite
# differences. In float64 at $\varepsilon = 10^{-6}$ the error model of this section bounds the
# central difference of a smooth function by $\tfrac{\varepsilon^2}{6}|f'''| + u|f|/\varepsilon
# \approx 2 \times 10^{-13}|f'''| + 10^{-10}|f|$; for SiLU on inputs of order 1, projected on
# a direction of 12 entries, that is below $10^{-9}$. A tolerance of $\mathrm{atol} = 10^{-8}$,
# $\mathrm{rtol} = 10^{-6}$, fixed from that bound before the run, still passes the correct
# function, and now rejects an error of one part in $10^4$:

# %%
checks = Checks("gradcheck with atol = 1e-8, rtol = 1e-6 (from the error model)")
for name in ("F.silu", "backward x 1.0001"):
    fn = candidates[name]
    ours_ok = bool(gradcheck(fn, x_check, atol=1e-8, rtol=1e-6))
    torch_ok = torch.autograd.gradcheck(fn, (x_check.clone().requires_grad_(),), atol=1e-8, rtol=1e-6,
                                        raise_exception=False)
    checks.equal(f"{name}: passes (ours, torch)", [name == "F.silu"] * 2, [ours_ok, torch_ok])
checks

# %% [markdown]
# Finite differences are a blunt instrument at the default tolerance: they catch a wrong
# formula, but not an error of one part in $10^4$ unless the tolerance is set from the error
# model, and they cost two evaluations of $f$ *per input entry* (forward mode
# again). That is why this chapter compared every hand-derived backward pass with autograd
# to $10^{-10}$ instead, and uses finite differences to check the checkers.
#
# ## Summary
#
# * Backpropagation is the chain rule evaluated from the loss backwards: a chain of
#   vector-Jacobian products $\bar h_{k-1} = J_k^\top \bar h_k$, none of which forms a Jacobian.
# * Linear layer ($y = xW^\top + b$): $\partial\mathcal L/\partial W = G^\top X$,
#   $\partial\mathcal L/\partial x = GW$, $\partial\mathcal L/\partial b = \sum G$; in the
#   $Y = XW$ layout, $X^\top G$ and $GW^\top$. Backward = 2 × forward FLOPs.
# * Softmax: $p \odot (g - \langle g, p\rangle)$; cross-entropy: $(p - y)/N$; LayerNorm:
#   $\frac1s(g' - \overline{g'} - \hat x\,\overline{g'\hat x})$; attention:
#   $\mathrm dV = A^\top \mathrm dO$, $\mathrm dS = A \odot (\mathrm dA - \operatorname{rowsum}(\mathrm dA \odot A))$,
#   $\mathrm dQ = c\,\mathrm dS K$, $\mathrm dK = c\,\mathrm dS^\top Q$. All equal autograd to $10^{-10}$.
# * A scalar engine (`Value`) needs only local derivatives, a topological order (found
#   without recursion) and `+=`; it reproduces PyTorch's training curve to round-off.
# * Finite differences have an optimal step: $\varepsilon^* \approx 2\sqrt u \approx 10^{-8}$
#   forward, $(3u)^{1/3} \approx 10^{-5}$ central, in float64; float32 is too coarse to check gradients.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/08_backpropagation.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 08` writes a stub
# of every function, `llmbook grade 08` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_08.py` runs
# the same checks on the reference.
#
# 1. (★) **Softplus without overflow.** Using only `Value` operations, write `softplus(x)`
#    $= \log(1 + e^x)$ so that it works for $x = 800$ (where $e^x$ overflows float64).
#    Check that its gradient is $\sigma(x)$ for $x \in \{-800, -3, 0, 2, 800\}$.
# 2. (★★) **RMSNorm backward.** For $y = w \odot x / r$, $r = \sqrt{\overline{x^2} + \varepsilon}$
#    (chapter 6), show that with $\hat x = x / r$ and $g' = w \odot G$,
#    $\partial \mathcal L / \partial x = \frac1r\big(g' - \hat x\, \overline{g' \odot \hat x}\big)$ and
#    $\partial \mathcal L / \partial w = \sum G \odot \hat x$. Implement
#    `rms_norm_backward(x, weight, eps, grad_out)` and check it against autograd through
#    `llmbook.transformer.layers.RMSNorm` in float64 to $10^{-10}$.
# 3. (★★) **A five-point stencil.** Find the weights $c_k$ of
#    $f'(x) \approx \frac{1}{\varepsilon}\sum_{k=-2}^{2} c_k f(x + k\varepsilon)$ that make the error
#    $O(\varepsilon^4)$, by solving the Taylor conditions in SymPy. From the error model
#    $a\varepsilon^4 + b/\varepsilon$, predict the optimal $\varepsilon$ in float64 and the best
#    error; measure both for $\exp$ as in section 8.9.
# 4. (★★★) **Forward mode with dual numbers.** Write a class `Dual` (a value and a tangent,
#    $(a, \dot a)$) with `+`, `*`, `tanh` and `exp`, so that evaluating $f$ on
#    $(x, e_i)$ yields $\partial f / \partial x_i$. Use it to compute the full gradient of the
#    loss of the section 8.8 MLP (one forward-mode pass per parameter) and check it against
#    `Value.backward()`. How many passes did forward mode need, and how many did reverse mode?

# %%
from llmbook.workbench import grade

grade("08", globals())
