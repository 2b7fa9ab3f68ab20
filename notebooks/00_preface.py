# %% [markdown]
# # 0 Preface
#
# This book is about the mathematics of large language models, and it is written to be
# *executed*. Every chapter is a notebook you run top to bottom on a laptop CPU. Each one
# follows the same four steps:
#
# 1. **Derive.** A formula is stated and then derived with SymPy, so the algebra is checked
#    by a computer algebra system rather than trusted.
# 2. **Implement.** The formula is implemented in the `llmbook` package. The notebook shows
#    the package's source in place: what you read is what the tests run.
# 3. **Verify.** The implementation is compared with the symbolic result and with an
#    independent production implementation (PyTorch, Hugging Face `tokenizers` or
#    `transformers`). Every chapter prints a table of these checks with the measured error.
# 4. **Explore.** A figure or experiment shows what the formula does.
#
# Each chapter ends with exercises, graded by the book itself. `llmbook exercises 03` writes
# chapter 3's stub into `llmbook-work/` (the functions to write, with their signatures and
# hints), and `llmbook grade 03` runs the chapter's checks on your file: one row per
# exercise, *passed*, *failed* with what was expected and what came back, or *not
# attempted*. They are the same checks the test suite runs on the reference solutions in
# `notebooks/solutions/`, so look there after your own attempt, not before. You can also
# answer inside a chapter: its last cell, `grade("03", globals())`, grades each function you
# define in the notebook under an exercise's name (the book's solution stands in for the
# rest, and its row says so). The README's "Doing the exercises" says more.
#
# Beyond the exercises, a build-it-yourself track has one unit per Part in which you write
# the Part's core yourself: a byte-level BPE tokenizer; softmax, attention, RoPE, RMSNorm,
# SwiGLU and a decoder block; cross-entropy's backward pass and AdamW; top-p sampling, a KV
# cache and NF4; the DPO loss and GAE; a ring all-reduce. `llmbook exercises build-II` writes
# Part II's stub, and `llmbook grade build-II` compares your code with the production
# libraries the chapters use (`tokenizers`, `transformers`, `torch.optim`,
# `torch.distributed`, TRL) and ends with your pieces working together: for Part II, your
# block in every layer of SmolLM2 must give the model's own next-token distribution.
#
# ## How to run the book
#
# | command | what it does |
# |---|---|
# | `make book` | creates `.venv`, executes every notebook and renders the book to HTML under `build/book/` |
# | `make test` | lint, notebook checks, unit tests, and every notebook re-executed and compared cell by cell |
# | `make lab` | opens JupyterLab on `notebooks/` to study and experiment |
#
# The source of each chapter is a plain Python file, `notebooks/NN_slug.py`, paired with the
# notebook `NN_slug.ipynb`; JupyterLab opens either. Change a number, re-run, and see what moves.
#
# ## Who it is for
#
# You know Python, NumPy, and first-year calculus and linear algebra. You do not need to
# know PyTorch or any machine learning: the book introduces what it uses.

# %% [markdown]
# ## Checking the environment
#
# The next cell imports every package the book needs and fails loudly, naming what is
# missing, if the machine is not ready. (Its printed versions differ from machine to
# machine, so the test suite ignores this one cell's output, but not its failure.)

# %% tags=["nbval-ignore-output"]
from llmbook.environment import check_environment

rows = check_environment()

# %% [markdown]
# ## Notation
#
# The same symbols are used in every chapter.
#
# | symbol | meaning |
# |---|---|
# | $B$ | batch size (sequences processed together) |
# | $T$ | sequence length in tokens; $t$ indexes positions $1,\dots,T$ |
# | $V$ | vocabulary size; tokens are integers $0,\dots,V-1$ |
# | $d$ | model width (the size of each token's vector) |
# | $H$ | number of attention heads; $d_k$ key/query width per head, $d_v$ value width |
# | $L$ | number of layers |
# | $E \in \mathbb{R}^{V\times d}$ | token embedding matrix |
# | $x_{1:T}$ | a token sequence; $x_{<t}$ the tokens before position $t$ |
# | $z \in \mathbb{R}^{V}$ | logits; $p = \mathrm{softmax}(z)$ the predicted distribution |
# | $y$ | one-hot target vector |
# | $\theta$ | all trainable parameters; $\mathcal{L}$ a loss |
# | $\log$ | the natural logarithm: losses and entropies are in nats |
# | $N$, $D$, $C$ | parameters, training tokens, training compute (FLOPs) |
#
# Shapes are written as tuples in code comments, e.g. `# (B, T, V)`.

# %% [markdown]
# ## The pattern in miniature
#
# Here is the whole rhythm on a small example: the derivative of the logistic sigmoid
# $\sigma(x) = 1/(1+e^{-x})$, which appears again in the gated feed-forward layers of
# Part II.
#
# **Derive.** SymPy differentiates $\sigma$ and we assert that the result equals
# $\sigma(x)\,(1-\sigma(x))$:

# %%
import sympy as sp

x = sp.symbols("x", real=True)
sigma = 1 / (1 + sp.exp(-x))
derivative = sp.diff(sigma, x)
assert sp.simplify(derivative - sigma * (1 - sigma)) == 0
sp.Eq(sp.Derivative(sp.Function("sigma")(x), x), sp.Function("sigma")(x) * (1 - sp.Function("sigma")(x)))

# %% [markdown]
# **Implement and verify.** In this miniature the implementation is PyTorch's own
# `torch.sigmoid`; from Chapter 1 on the implementations are the book's. The derivative
# that autograd computes in float64 should equal the symbolic formula evaluated with
# `sp.lambdify` up to round-off. `Checks` collects such comparisons and prints them as
# a table; if any fails, the cell raises.

# %%
import torch

from llmbook.nbtools import Checks, save_figure, seed_everything, show_source

generator = seed_everything(0)
xs = torch.linspace(-8, 8, 101, dtype=torch.float64, requires_grad=True)
torch.sigmoid(xs).sum().backward()
symbolic = sp.lambdify(x, derivative, "numpy")(xs.detach().numpy())

checks = Checks("sigmoid derivative")
checks.close("autograd vs SymPy, 101 points", expected=symbolic, got=xs.grad, tol=1e-15)
checks.close("derivative at 0 is 1/4", expected=0.25, got=float(xs.grad[50]), tol=0.0)
checks

# %% [markdown]
# The helpers are part of the package like everything else. This is how a notebook shows
# code; here is the one that makes a run repeatable:

# %%
show_source(seed_everything)

# %% [markdown]
# **Explore.** Every chapter saves its figures under `figures/`. The derivative peaks at
# $1/4$ at $x=0$ and decays like $e^{-|x|}$: a saturated sigmoid passes almost no gradient,
# a fact that comes back when we discuss gating and normalisation.

# %%
import matplotlib.pyplot as plt

grid = xs.detach().numpy()
fig, ax = plt.subplots(figsize=(6, 3.2))
ax.plot(grid, torch.sigmoid(xs).detach().numpy(), label=r"$\sigma(x)$")
ax.plot(grid, xs.grad.numpy(), label=r"$\sigma'(x)=\sigma(1-\sigma)$")
ax.set(title="The logistic sigmoid and its derivative", xlabel="x", ylabel="value")
ax.legend()
save_figure(fig, "00_preface_sigmoid")
plt.show()

# %% [markdown]
# ## The road ahead
#
# - **Part I, text as mathematics** (Chapters 1–3): bytes and byte-level BPE tokenisation;
#   embeddings; language modelling as probability, with a synthetic source whose exact
#   entropy rate is the floor every later model is measured against.
# - **Part II, the transformer**: attention, positions, normalisation, the decoder.
# - **Part III, training**: backpropagation, optimisers, a trained model, scaling laws.
# - **Part IV, inference**: decoding, the KV cache, FlashAttention, quantisation.
# - **Part V, adaptation and alignment**: LoRA, SFT, reward models, PPO, DPO, RL for reasoning.
# - **Part VI, scale and beyond**: mixture of experts, distributed training, alternatives to attention.
#
# ## Summary
#
# * Each chapter runs the same loop: **derive** with SymPy, **implement** in `llmbook`
#   (shown with `show_source`), **verify** against the symbolic result and an independent
#   peer in a `Checks` table that prints the measured error, and **explore** with a figure.
# * The miniature: $\sigma'(x) = \sigma(x)(1-\sigma(x))$, derived symbolically and matched
#   by autograd in float64 to round-off, with its peak $1/4$ at $x = 0$.
# * `seed_everything` makes every run repeatable; `make test` re-executes every notebook
#   and compares it cell by cell.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/00_preface.py`; `llmbook exercises 00`
# writes your stub and `llmbook grade 00` grades it with the checks the reference passes
# (`llmbook/workbench/checks/ch00.py`, run on the reference by `tests/test_solutions_00.py`).
# Or answer in the notebook itself: the cell after this list grades each function defined
# here under an exercise's name, and the book's solution where there is none (marked "the
# book's"); every chapter ends with such a cell.
#
# 1. (★) **The derivative of tanh.** Derive $\frac{d}{dx}\tanh(x)$ with SymPy and show it
#    equals $1-\tanh^2(x)$. Then verify it against autograd in float64 on 101 points, as above.
# 2. (★) **tanh from the sigmoid.** Show with SymPy that $\tanh(x) = 2\sigma(2x) - 1$.
# 3. (★★) **An honest tolerance.** Use `Checks` to compare `torch.nn.functional.softplus`
#    with $\log(1+e^{x})$, evaluated literally as `torch.log(1 + torch.exp(x))`, on
#    $[-20, 20]$ in float64. Where is the relative error largest, what tolerance is honest,
#    and why? Bound the error from the rounding of $1 + e^{x}$, then compare with
#    `torch.log1p(torch.exp(x))`.

# %%
from llmbook.workbench import grade

grade("00", globals())
