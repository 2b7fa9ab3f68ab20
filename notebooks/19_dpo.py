# %% [markdown]
# # 19 DPO: direct preference optimisation
#
# Chapter 17 fitted a reward model to preference pairs; chapter 18 then maximised that
# reward with PPO, sampling responses from the policy at every step and holding it near the
# reference model with a KL penalty. Rafailov et al. (2023, "Direct Preference Optimization:
# Your Language Model is Secretly a Reward Model") noticed that the KL-regularised objective
# of RLHF has a closed-form maximiser, and that in it the reward can be written in terms of
# the policy. Substituted into the Bradley–Terry likelihood of the preferences, the reward
# model disappears: one trains the policy directly on the pairs, with a loss no harder than
# a classifier's, with no sampling and no reward model. This chapter:
#
# 1. **derives** the optimal KL-regularised policy
#    $\pi^*(y\mid x) = \pi_{\text{ref}}(y\mid x)\,e^{r(x,y)/\beta}/Z(x)$ with SymPy (a
#    Lagrange multiplier, and the Gibbs variational identity that proves it is the global
#    maximum), and checks it on a finite set of six responses against a numerical optimiser;
# 2. **derives** the DPO loss: the partition function $Z(x)$ cancels in the Bradley–Terry
#    probability, and on the six responses the minimiser of the expected DPO loss is
#    $\pi^*$ itself;
# 3. **derives** its gradient, which weighs each pair by $\sigma(\hat r_l - \hat r_w)$, and
#    checks it against autograd and finite differences through a small transformer;
# 4. **runs** DPO on the preference pairs of chapter 17 from the book's text model (shipped
#    as artifact `"dpo"`) and measures how well its *implicit reward* tracks the true one;
# 5. **compares** the result with chapter 18's PPO: reward, KL to the reference, compute;
# 6. **derives** the family that followed DPO (IPO, KTO, ORPO, SimPO, RLOO) and shows their
#    losses and gradients on one batch of the same pairs;
# 7. **trains** all six on the book's task with one recipe and several seeds, and compares
#    their reward, KL and compute with DPO's and PPO's shipped runs.
#
# The code is in `llmbook.alignment.dpo`; the loss itself, `dpo_loss`, is in
# `llmbook.alignment.losses` (tested against `trl`), the family's losses in
# `llmbook.alignment.preference_losses` and their training runs in
# `llmbook.alignment.preference_training`.

# %%
import json
import math

import matplotlib.pyplot as plt
import sympy as sp
import torch
from IPython.display import display
from scipy import stats

from llmbook.alignment.dpo import (
    comparison_rows,
    dpo_batch_loss,
    dpo_logprob_gradients,
    expected_dpo_loss,
    kl_regularized_objective,
    load_dpo_policy,
    log_partition,
    optimal_policy,
    ppo_compute_to_reward,
    reference_logprobs,
    reward_correlation,
    sequence_logprobs,
)
from llmbook.alignment.losses import bradley_terry_loss, dpo_loss
from llmbook.alignment.preference_losses import (
    ipo_loss,
    kto_loss,
    kto_reference_point,
    orpo_loss,
    rloo_advantages,
    rloo_loss,
    simpo_loss,
)
from llmbook.alignment.preference_training import (
    family_loss,
    family_paths,
    reward_at_kl,
    summarize_family,
)
from llmbook.alignment.preferences import (
    keyword_ids,
    keyword_reward,
    preference_data,
    sample_responses,
)
from llmbook.alignment.shipped import load_artifact
from llmbook.nbtools import Checks, save_figure, seed_everything, show_source
from llmbook.paths import data_path
from llmbook.training.pretrained import book_model
from llmbook.transformer.model import TransformerConfig, TransformerLM

g = seed_everything(0)
torch.set_num_threads(1)  # a small model: one thread is steadier
f64 = torch.float64

# %% [markdown]
# ## 19.1 The optimal KL-regularised policy
#
# Fix a prompt $x$ and drop it from the notation. RLHF (chapter 18) maximises the expected
# reward while paying $\beta$ per nat of KL divergence from the reference model:
#
# $$ J(\pi) = \sum_y \pi(y)\, r(y) \;-\; \beta \sum_y \pi(y) \log\frac{\pi(y)}{\pi_{\text{ref}}(y)},
#    \qquad \sum_y \pi(y) = 1 . $$
#
# With a Lagrange multiplier $\lambda$ for the constraint, setting
# $\partial/\partial\pi(y)$ of $J - \lambda(\sum_y \pi(y) - 1)$ to zero gives
# $r(y) - \beta\log\frac{\pi(y)}{\pi_{\text{ref}}(y)} - \beta - \lambda = 0$, so
# $\pi(y) \propto \pi_{\text{ref}}(y)\, e^{r(y)/\beta}$, and the constraint fixes the
# constant:
#
# $$ \pi^*(y) = \frac{\pi_{\text{ref}}(y)\, e^{r(y)/\beta}}{Z}, \qquad
#    Z = \sum_y \pi_{\text{ref}}(y)\, e^{r(y)/\beta} $$
#
# (Rafailov et al., eq. 4). SymPy does the same on three responses with symbolic
# probabilities $p_i = \pi_{\text{ref}}(y_i)$ and rewards $r_i$: solve each stationarity
# equation, solve the constraint for $\lambda$, compare with the closed form. The Hessian of
# $J$ is $\mathrm{diag}(-\beta/\pi_i)$, negative definite, so $J$ is strictly concave and the
# stationary point is its only maximum.

# %%
K = 3
p = sp.symbols("p0:3", positive=True)  # pi_ref
r = sp.symbols("r0:3", real=True)
pi = sp.symbols("pi0:3", positive=True)
beta, lam = sp.Symbol("beta", positive=True), sp.Symbol("lambda", real=True)
J = sum(pi[i] * r[i] - beta * pi[i] * sp.log(pi[i] / p[i]) for i in range(K))
stationary = [sp.solve(sp.diff(J - lam * (sum(pi) - 1), pi[i]), pi[i])[0] for i in range(K)]
lam_star = sp.solve(sp.Eq(sum(stationary), 1), lam)[0]
Z = sum(p[i] * sp.exp(r[i] / beta) for i in range(K))
pi_star = [p[i] * sp.exp(r[i] / beta) / Z for i in range(K)]
assert all(sp.simplify(stationary[i].subs(lam, lam_star) - pi_star[i]) == 0 for i in range(K))
assert sp.hessian(J, pi) == sp.diag(*[-beta / pi[i] for i in range(K)])
display(sp.Eq(lam, lam_star), sp.Eq(sp.Symbol(r"\pi^*_0"), pi_star[0]))

# %% [markdown]
# Two more facts, both exact. The maximum value is $J(\pi^*) = \beta\log Z$. And for *every*
# $\pi$ on the simplex
#
# $$ J(\pi) = \beta \log Z - \beta\, \mathrm{KL}(\pi \,\|\, \pi^*) , $$
#
# the Gibbs variational principle (Donsker–Varadhan): since KL is non-negative and zero only
# at $\pi = \pi^*$, this proves the maximum without any calculus, and says how much is lost
# by any other policy. SymPy finds $J(\pi) - \beta\log Z + \beta\,\mathrm{KL}(\pi\|\pi^*)
# = \beta\log Z\,(\sum_i\pi_i - 1)$, which vanishes on the simplex.

# %%
J_star = sp.expand_log(J.subs(dict(zip(pi, pi_star, strict=True))), force=True)
assert sp.simplify(J_star - beta * sp.log(Z)) == 0
kl_to_star = sum(pi[i] * sp.log(pi[i] / pi_star[i]) for i in range(K))
gap = sp.factor(sp.expand(sp.expand_log(J - beta * sp.log(Z) + beta * kl_to_star, force=True)))
assert sp.simplify(gap - beta * sp.log(Z) * (sum(pi) - 1)) == 0
display(sp.Eq(sp.Symbol(r"J(\pi) - \beta\log Z + \beta\,\mathrm{KL}(\pi\|\pi^*)"), gap))

# %% [markdown]
# **A numerical check on six responses.** Six responses with keyword counts
# $r = (0, 0, 1, 1, 2, 3)$ (the true reward of the book's task, chapter 17), a reference
# distribution drawn at random, $\beta = 1/2$. A generic optimiser (L-BFGS in float64, on
# the logits $\theta$ of $\pi = \mathrm{softmax}(\theta)$, starting from the uniform
# distribution) maximises $J$ knowing nothing of the closed form; it must land on
# `optimal_policy`, at the value $\beta \log Z$.

# %%
show_source(optimal_policy)

# %%
def lbfgs_argmin(loss_of_probs, k=6):
    """argmin over the simplex of loss(softmax(theta)), by L-BFGS on theta (float64)."""
    theta = torch.zeros(k, dtype=f64, requires_grad=True)
    opt = torch.optim.LBFGS([theta], lr=1, max_iter=500, tolerance_grad=1e-15,
                            tolerance_change=1e-20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = loss_of_probs(torch.softmax(theta, -1))
        loss.backward()
        return loss

    opt.step(closure)
    return torch.softmax(theta.detach(), -1)


ref6 = torch.softmax(torch.randn(6, generator=torch.Generator().manual_seed(0), dtype=f64), -1)
r6 = torch.tensor([0.0, 0.0, 1.0, 1.0, 2.0, 3.0], dtype=f64)
b6 = 0.5
star6 = optimal_policy(ref6, r6, b6)
found = lbfgs_argmin(lambda q: -kl_regularized_objective(q, ref6, r6, b6))

# %%
checks = Checks("the optimal policy on six responses (beta = 1/2)")
checks.close("L-BFGS argmax of J = closed-form pi*", star6, found, tol=1e-8)
checks.close("J(pi*) = beta log Z", b6 * log_partition(ref6, r6, b6),
             kl_regularized_objective(star6, ref6, r6, b6), tol=1e-14)
q = torch.softmax(torch.randn(6, generator=g, dtype=f64), -1)
checks.close("random q: J(q) = beta log Z - beta KL(q||pi*)",
             b6 * log_partition(ref6, r6, b6) - b6 * (q * (q / star6).log()).sum(),
             kl_regularized_objective(q, ref6, r6, b6), tol=1e-14)
checks.true("J(q) < J(pi*)", kl_regularized_objective(q, ref6, r6, b6) < kl_regularized_objective(star6, ref6, r6, b6))
checks

# %% [markdown]
# The figure shows what $\beta$ does: $\pi^*$ reweights the reference by $e^{r/\beta}$. At
# $\beta = 2$ it stays close to $\pi_{\text{ref}}$; at $\beta = 0.2$ nearly all the mass sits
# on the one response with three keywords, although the reference gave it 3 %. A small
# $\beta$ buys reward with KL.

# %%
fig, ax = plt.subplots(figsize=(7.5, 3.4))
width = 0.2
ax.bar(torch.arange(6) - 1.5 * width, ref6, width, label=r"$\pi_{ref}$", color="grey")
for j, b in enumerate((2.0, 0.5, 0.2)):
    ax.bar(torch.arange(6) + (j - 0.5) * width, optimal_policy(ref6, r6, b), width, label=fr"$\pi^*$, β = {b}")
ax.set_xticks(range(6), [f"y{i}\nr = {int(v)}" for i, v in enumerate(r6)])
ax.set(ylabel="probability", title=r"$\pi^* \propto \pi_{ref}\, e^{r/\beta}$ on six responses")
ax.legend(loc="upper center")
fig.tight_layout()
save_figure(fig, "19_dpo_optimal_policy")
plt.show()

# %% [markdown]
# ## 19.2 The partition function cancels: the DPO loss
#
# $\pi^*$ cannot be computed for a language model: $Z(x)$ sums over every possible
# response. But the closed form can be read backwards, as the reward in terms of the optimal
# policy:
#
# $$ r(x, y) = \beta \log\frac{\pi^*(y\mid x)}{\pi_{\text{ref}}(y\mid x)} + \beta\log Z(x). $$
#
# The Bradley–Terry model (chapter 17) uses only *differences* of rewards for the same
# prompt, $P(y_w \succ y_l \mid x) = \sigma\big(r(x, y_w) - r(x, y_l)\big)$, and in the
# difference the unknown $\beta\log Z(x)$ cancels:

# %%
pw, pl, qw, ql, Zx = sp.symbols(r"\pi_w \pi_l \pi_{ref\,w} \pi_{ref\,l} Z", positive=True)
reward_of = lambda p_, q_: beta * sp.log(p_ / q_) + beta * sp.log(Zx)  # noqa: E731
diff = sp.expand_log(reward_of(pw, qw) - reward_of(pl, ql), force=True)
implicit_diff = sp.expand_log(beta * sp.log(pw / qw) - beta * sp.log(pl / ql), force=True)
assert not diff.has(Zx) and sp.simplify(diff - implicit_diff) == 0
display(sp.Eq(sp.Symbol(r"r(x,y_w) - r(x,y_l)"), diff))

# %% [markdown]
# So the likelihood of the preferences is a function of the policy, and DPO fits the policy
# $\pi_\theta$ by maximum likelihood on the preference pairs $(x, y_w, y_l)$, the DPO loss
# (Rafailov et al., eq. 7):
#
# $$ \mathcal L_{\text{DPO}}(\theta) = -\,\mathbb E_{(x, y_w, y_l)} \log\sigma\big(\hat r_\theta(x, y_w) - \hat r_\theta(x, y_l)\big),
#    \qquad \hat r_\theta(x, y) = \beta\log\frac{\pi_\theta(y\mid x)}{\pi_{\text{ref}}(y\mid x)} . $$
#
# $\hat r_\theta$ is the *implicit reward*: the reward for which $\pi_\theta$ would be the
# optimal policy, up to a term that depends on the prompt alone. Fitting it to the
# preferences with the Bradley–Terry loss is chapter 17's reward modelling, done with the
# policy's own log-probabilities instead of a separate reward head.
#
# **The check.** Does minimising this loss really give $\pi^*$? On the six responses, the
# expected DPO loss over pairs drawn from $\pi_{\text{ref}}$ and labelled by Bradley–Terry
# with the true reward is computable exactly (`expected_dpo_loss`). It is a cross-entropy
# between the true and the modelled preference probabilities, smallest when
# $\hat r(y_i) - \hat r(y_j) = r_i - r_j$ for all pairs, which is $\pi = \pi^*$. L-BFGS on
# it must find the same policy as on $J$ in 19.1, though it never sees $J$, $Z$ or the
# reward values themselves except through preference probabilities.

# %%
show_source(expected_dpo_loss)

# %%
dpo_min = lbfgs_argmin(lambda q: expected_dpo_loss(q, ref6, r6, b6))
checks = Checks("DPO's minimiser on six responses")
checks.close("argmin of the expected DPO loss = pi*", star6, dpo_min, tol=1e-7)
checks.close("expected DPO loss at pi_ref = log 2", math.log(2),
             expected_dpo_loss(ref6, ref6, r6, b6), tol=1e-15)
checks.true("loss(pi*) < loss(pi_ref)", expected_dpo_loss(star6, ref6, r6, b6) < math.log(2))
checks

# %% [markdown]
# ## 19.3 The gradient, and what it up-weights
#
# Write $a_w = \log\pi_\theta(y_w)$, $a_l = \log\pi_\theta(y_l)$ and $b_w, b_l$ for the
# reference's. For one pair the loss is $-\log\sigma(\hat r_w - \hat r_l)$ with
# $\hat r = \beta(a - b)$; since $\frac{d}{du}\log\sigma(u) = \sigma(-u)$,
#
# $$ \nabla_\theta\mathcal L = -\beta\, \mathbb E\Big[\sigma(\hat r_l - \hat r_w)\,
#    \big(\nabla_\theta \log\pi_\theta(y_w) - \nabla_\theta\log\pi_\theta(y_l)\big)\Big] . $$
#
# The step raises the log-probability of the chosen response and lowers the rejected one's,
# each pair weighted by $\sigma(\hat r_l - \hat r_w)$: the probability the *implicit
# reward* gives to the wrong ordering. Pairs it already ranks rightly by a wide margin
# hardly count; pairs it ranks wrongly count fully. Rafailov et al. (section 4) report that
# without this weight (a plain "raise $y_w$, lower $y_l$" objective) the language model
# degenerates; exercise 3 shows why on the six responses. SymPy derives both partial
# derivatives:

# %%
aw, al, bw, bl = sp.symbols("a_w a_l b_w b_l", real=True)
sigmoid = lambda u: 1 / (1 + sp.exp(-u))  # noqa: E731
loss_pair = -sp.log(sigmoid(beta * (aw - bw) - beta * (al - bl)))
weight = sigmoid(beta * (al - bl) - beta * (aw - bw))  # sigma(r_l - r_w)
assert sp.simplify(sp.diff(loss_pair, aw) + beta * weight) == 0
assert sp.simplify(sp.diff(loss_pair, al) - beta * weight) == 0
display(sp.Eq(sp.Symbol(r"\partial\mathcal{L}/\partial a_w"), -beta * sp.Symbol(r"\sigma(\hat r_l - \hat r_w)")))

# %% [markdown]
# `dpo_logprob_gradients` implements the two derivatives (averaged over the batch).
# Against autograd through `dpo_loss` on random float64 log-probabilities, then one level
# deeper, through a small transformer (float64, a vocabulary of 13, one layer; prompts of 3
# and responses of 5 tokens): the autograd gradient of the batched loss with respect to all
# parameters must equal $\sum_i g_{w,i}\nabla\log\pi(y_{w,i}) + g_{l,i}\nabla\log\pi(y_{l,i})$
# with the hand-derived weights, and `gradcheck` compares autograd with finite differences.

# %%
show_source(dpo_logprob_gradients)

# %%
lw, ll, rw, rl = (3 * torch.randn(8, generator=g, dtype=f64) - 20 for _ in range(4))  # log-probs <= 0
lw.requires_grad_(True)
ll.requires_grad_(True)
auto_w, auto_l = torch.autograd.grad(dpo_loss(lw, ll, rw, rl, 0.1)[0], (lw, ll))
hand_w, hand_l = dpo_logprob_gradients(lw.detach(), ll.detach(), rw, rl, 0.1)

cfg = TransformerConfig.gpt2_style(vocab_size=13, d_model=8, n_layers=1, n_heads=2, max_seq_len=16)
tiny_ref = TransformerLM(cfg, generator=torch.Generator().manual_seed(0)).double()
tiny = TransformerLM(cfg, generator=torch.Generator().manual_seed(1)).double()
x_p, x_w, x_l = (torch.randint(0, 13, (6, n), generator=g) for n in (3, 5, 5))
ref_w, ref_l = reference_logprobs(tiny_ref, x_p, x_w, x_l)
params = list(tiny.parameters())
grads = torch.autograd.grad(dpo_batch_loss(tiny, x_p, x_w, x_l, ref_w, ref_l, 0.3).loss, params)
seq_w, seq_l = sequence_logprobs(tiny, x_p, x_w), sequence_logprobs(tiny, x_p, x_l)
g_w, g_l = dpo_logprob_gradients(seq_w.detach(), seq_l.detach(), ref_w, ref_l, 0.3)
chain = torch.autograd.grad((g_w * seq_w).sum() + (g_l * seq_l).sum(), params)

# %%
def loss_of_gain(w):
    """The batched DPO loss as a function of the final LayerNorm's gain (8 numbers)."""
    weights = {**dict(tiny.named_parameters()), "final_norm.weight": w}
    model = lambda ids: torch.func.functional_call(tiny, weights, (ids,))  # noqa: E731
    return dpo_batch_loss(model, x_p, x_w, x_l, ref_w, ref_l, 0.3).loss


checks = Checks("the DPO gradient")
checks.close("dL/d log pi(y_w): hand = autograd", auto_w, hand_w, tol=1e-15)
checks.close("dL/d log pi(y_l): hand = autograd", auto_l, hand_l, tol=1e-15)
checks.close("all parameters: autograd = chain rule",
             torch.cat([t.flatten() for t in grads]), torch.cat([t.flatten() for t in chain]), tol=1e-14)
checks.true("gradcheck: finite differences = autograd",
            torch.autograd.gradcheck(loss_of_gain, (tiny.final_norm.weight.detach().clone().requires_grad_(True),)))
checks

# %% [markdown]
# ## 19.4 DPO on the book's model
#
# The task is chapter 17's: the book's text model continues an 8-token prompt from the
# standard-library docstrings with 24 tokens, and the true reward $r(x, y)$ counts the
# response tokens among twelve keywords (" value", " string", " list", ...). The 4096
# training pairs were sampled from the model itself and labelled by Bradley–Terry with scale
# 1, so each label is noisy, and 56 % of the pairs are ties in true reward, labelled by a
# coin flip.
#
# `dpo_batch_loss` runs the policy once on the $2N$ sequences (chosen and rejected stacked),
# sums the per-token log-probabilities of `response_logprobs` over the response, and hands
# the sums to `dpo_loss`. The reference is frozen, so its sequence log-probabilities of all
# pairs are computed once, before training (`reference_logprobs`), and each step costs one
# forward and one backward pass of the policy. PPO (chapter 18) needs, at every step,
# generation, a reward, a value model and the reference.

# %%
show_source(dpo_batch_loss)

# %% [markdown]
# On the book's text model itself (policy = reference, float32), the batched loss of 8 pairs
# must equal the mean of the 8 per-pair losses computed one pair at a time, and at the start
# every implicit reward is 0 and the loss is $\log 2$.

# %%
train = preference_data("train")
test = preference_data("test")
policy, reference, info = load_dpo_policy()
recipe = info["recipe"]
sl = slice(0, 8)
ref_c, ref_r = reference_logprobs(reference, train.prompts[sl], train.chosen[sl], train.rejected[sl])
with torch.no_grad():
    start = dpo_batch_loss(reference, train.prompts[sl], train.chosen[sl], train.rejected[sl], ref_c, ref_r, recipe["beta"])
    batched = dpo_batch_loss(policy, train.prompts[sl], train.chosen[sl], train.rejected[sl], ref_c, ref_r,
                             recipe["beta"], reduction="none").loss
    one_by_one = torch.stack([dpo_batch_loss(policy, train.prompts[i:i + 1], train.chosen[i:i + 1],
                                             train.rejected[i:i + 1], ref_c[i:i + 1], ref_r[i:i + 1],
                                             recipe["beta"]).loss for i in range(8)])

# %%
checks = Checks("the batched DPO loss on the text model")
checks.close("policy = reference: loss = log 2", math.log(2), start.loss, tol=1e-6)
checks.close("policy = reference: implicit rewards = 0", torch.zeros(16), torch.cat(start[1:]), tol=0.0)
checks.close("DPO policy: per-pair losses = one at a time", one_by_one, batched, tol=1e-5)
checks

# %% [markdown]
# **The shipped run.** DPO training is cheap but not instant, and its result depends on the
# last bits of float arithmetic, which differ between CPUs; so the run is shipped as artifact
# `"dpo"` (`python -m llmbook.alignment.shipped dpo` remakes it) and loaded here. The recipe:

# %%
print(recipe)
compute = info["compute"]
n_model = sum(p.numel() for p in reference.parameters())
print(f"trainable parameters: {compute['trainable_parameters']:,} (LoRA adapters) of "
      f"{n_model:,}, {compute['trainable_parameters'] / n_model:.1%}")
print(f"{compute['steps']} steps; {compute['forward_tokens']:,} tokens through forward passes "
      f"(reference {2 * recipe['num_pairs'] * (train.prompts.shape[1] + train.chosen.shape[1]):,}), "
      f"{compute['backward_tokens']:,} through backward passes; "
      f"{compute['wall_seconds']:.0f} s on one core")

# %% [markdown]
# The policy is the text model with LoRA adapters (chapter 16) of rank 8 on all six linear
# layers of every block: 110 592 trainable parameters, 5.5 % of the model. LoRA is here for
# the file more than for speed: the adapters ship in 0.4 MB where the whole model takes 8 MB,
# the reference is the base model under the adapters, and chapter 18's PPO trains the same
# adapters, so the two runs differ only in how they learn.
#
# $\beta = 0.3$ is chapter 18's KL coefficient, on purpose. The labels were drawn by
# Bradley–Terry with scale 1 from the true reward, so the reward that best explains them is
# $r$ itself (up to a constant per prompt), and DPO with $\beta = 0.3$ aims at the very policy
# PPO aims at, $\pi_{\text{ref}}\,e^{r/0.3}/Z$: same target, different route. One pass over
# the 4096 pairs in batches of 64 (64 AdamW steps, learning rate $10^{-3}$ with warmup and
# cosine decay): each batch is new to the policy when its loss is recorded, so the training
# curves below are also held-out curves. A second pass did not help in a trial run (at
# $\beta = 0.1$ and a learning rate three times larger): the training accuracy jumped from
# about 0.55 to about 0.9 the moment the pairs came round again, while the test accuracy fell
# from 0.56 to 0.53. With a coin flip deciding 56 % of the labels, much of what a second pass
# can learn is noise.
#
# How low can the loss go? If the implicit reward were the true reward itself, the loss on
# these pairs would be the Bradley–Terry loss of the true reward (chapter 17's
# `bradley_terry_loss`): a floor set by the noise of the labels.

# %%
floor = bradley_terry_loss(train.reward_chosen.double(), train.reward_rejected.double())
print(f"loss of the true reward on the training pairs: {float(floor):.2f} nats (log 2 = {math.log(2):.2f})")
tied = train.reward_chosen == train.reward_rejected
print(f"pairs tied in true reward (labelled by a coin flip): {float(tied.double().mean()):.0%} "
      f"of the {len(tied)} training pairs")

# %%
h = info["history"]
path = info["path"]
steps = torch.arange(1, len(h["loss"]) + 1)


def smooth(values, k=8):
    v = torch.tensor(values)
    return torch.nn.functional.avg_pool1d(v[None, None], k, 1)[0, 0], steps[k - 1:]


fig, axes = plt.subplots(1, 3, figsize=(11, 3.8))
for key, ax in (("loss", axes[0]), ("accuracy", axes[1])):
    ax.plot(steps, h[key], color="lightgrey", lw=0.8, label="per batch")
    y, x = smooth(h[key])
    ax.plot(x, y, label="mean of 8 batches")
axes[0].axhline(math.log(2), color="k", ls=":", lw=0.8, label="log 2")
axes[0].axhline(float(floor), color="C2", ls="--", lw=0.8, label="true reward's loss")
axes[0].set(xlabel="step", ylabel="DPO loss", title="Loss on training batches")
axes[1].axhline(0.5, color="k", ls=":", lw=0.8)
axes[1].set(xlabel="step", ylabel=r"fraction with $\hat r_w > \hat r_l$", title="Preference accuracy (train batches)")
for key, label in (("chosen_reward", r"chosen $\hat r_w$"), ("rejected_reward", r"rejected $\hat r_l$")):
    y, x = smooth(h[key])
    axes[2].plot(x, y, label=label)
axes[2].axhline(0, color="k", ls=":", lw=0.8)
axes[2].set(xlabel="step", ylabel=r"$\beta\log\pi/\pi_{ref}$ (batch mean)", title="Implicit rewards")
for ax in axes:
    ax.legend(fontsize="small")
fig.tight_layout()
save_figure(fig, "19_dpo_training")
plt.show()

# %% [markdown]
# Left, the loss of each new batch: it starts at $\log 2$ exactly (policy = reference, every
# implicit reward 0) and moves only a little below it, as it must: the labels are so noisy
# that even the true reward would score 0.62 nats (dashed line): on new pairs a perfect DPO
# run could gain at most 0.07 nats, and one pass over 4096 pairs gains a fraction of that. The
# accuracy (middle) rises from chance to about 0.56 of the pairs of a batch ranked rightly
# (at step 1 every implicit reward is 0, a tie, counted as wrong). Right, the implicit
# rewards: the rejected responses' $\hat r_l$ falls faster than the chosen ones' $\hat r_w$,
# which is what the loss asks for, but *both* fall: the policy lowers the probability of the
# chosen responses too. The loss only constrains the difference, and this decline of the
# preferred responses' likelihood is a known trait of DPO (Pal et al., 2024, "Smaug: Fixing
# Failure Modes of Preference Optimisation with DPO-Positive"). The probability goes to
# responses that appear in neither set, part of it to responses with more keywords than the
# base model usually writes, which is why the true reward of sampled responses rises.

# %%
last = slice(-32, None)
mean = lambda v: sum(v) / len(v)  # noqa: E731
checks = Checks("the shipped DPO run")
checks.close("first step: loss = log 2 (policy = reference)", math.log(2), h["loss"][0], tol=1e-6)
checks.true("last 32 steps: mean loss below log 2", mean(h["loss"][last]) < math.log(2))
checks.true("last 32 steps: mean train accuracy > 0.5", mean(h["accuracy"][last]) > 0.5,
            got=round(mean(h["accuracy"][last]), 2))
checks.true("last 32 steps: chosen reward > rejected", mean(h["chosen_reward"][last]) > mean(h["rejected_reward"][last]))
checks.true("both implicit rewards fell below 0", mean(h["chosen_reward"][last]) < 0 and mean(h["rejected_reward"][last]) < 0)
checks.true("reward of sampled responses rose by > 0.25", info["final"]["reward"] > info["base"]["reward"] + 0.25)
checks.true("at a KL below 1 nat per response", info["final"]["kl"] < 1)
checks

# %% [markdown]
# ## 19.5 The implicit reward against the true reward
#
# DPO's policy defines a reward, $\hat r(x, y) = \beta\log\frac{\pi_\theta(y\mid x)}{\pi_{\text{ref}}(y\mid x)}$.
# How well does it track the true keyword count? The test split has 512 pairs, so 1024
# responses DPO never trained on. The run stored their implicit rewards, computed by the
# book's code (`implicit_reward`, through `response_logprobs`). The notebook checks them by
# a second, independent route on the chosen and rejected responses of the first 128 test
# pairs: the shipped adapters' and the reference's log-probabilities from PyTorch's own
# `F.cross_entropy` on the logits, $\hat r = \beta\,(\mathrm{CE}_{\text{ref}} - \mathrm{CE}_\theta)$;
# and the DPO loss of those pairs, from `dpo_batch_loss`, must be
# $-\log\sigma(\hat r_w - \hat r_l)$ of the rewards found that way. Then it correlates
# all 1024 with the true reward (`reward_correlation`: Pearson, and Spearman with average
# ranks for the many ties of an integer reward).

# %%
shipped, _ = load_artifact("dpo")
stored = shipped["test_implicit_reward"]
prompts2 = torch.cat([test.prompts, test.prompts])
responses2 = torch.cat([test.chosen, test.rejected])
true2 = torch.cat([test.reward_chosen, test.reward_rejected])
pearson, spearman = reward_correlation(stored, true2)
# the second route: summed token log-probabilities as minus PyTorch's cross-entropy (float64)
n_check, m = 128, test.prompts.shape[0]
pick = torch.cat([torch.arange(n_check), m + torch.arange(n_check)])  # chosen, then rejected
ids = torch.cat([prompts2[pick], responses2[pick]], dim=1)
first = test.prompts.shape[1] - 1  # the logits at P - 1 + t score response token t
with torch.no_grad():
    nll = {name: torch.nn.functional.cross_entropy(
               model(ids)[:, first:-1].double().transpose(1, 2), responses2[pick], reduction="none").sum(1)
           for name, model in (("policy", policy), ("reference", reference))}
    by_ce = recipe["beta"] * (nll["reference"] - nll["policy"])  # (256,)
    ref_w, ref_l = reference_logprobs(reference, test.prompts[:n_check], test.chosen[:n_check],
                                      test.rejected[:n_check])
    check_batch = dpo_batch_loss(policy, test.prompts[:n_check], test.chosen[:n_check],
                                 test.rejected[:n_check], ref_w, ref_l, recipe["beta"], reduction="none")

# %%
t = info["test"]
untied = test.reward_chosen != test.reward_rejected
truth_acc = ((test.reward_chosen > test.reward_rejected)[untied]).double().mean()
checks = Checks("implicit reward on the 1024 test responses")
# float32 models: the two routes agree to float32 round-off, which differs between CPUs
max_diff = lambda a, b: float((a.double() - b.double()).abs().max())  # noqa: E731
checks.true("shipped implicit rewards (256) = beta (CE_ref - CE_policy), to 1e-4",
            max_diff(by_ce, stored[pick]) < 1e-4)
checks.true("dpo_batch_loss (128 pairs) = -log sigma(r_w - r_l) from CE, to 1e-4",
            max_diff(-torch.nn.functional.logsigmoid(by_ce[:n_check] - by_ce[n_check:]), check_batch.loss) < 1e-4)
checks.true("dpo_batch_loss's rewards = CE's, to 1e-4",
            max_diff(by_ce, torch.cat([check_batch.chosen_rewards, check_batch.rejected_rewards])) < 1e-4)
checks.close("Pearson recomputed = the run's", t["pearson"], pearson, tol=1e-6)
checks.true("Pearson with the true reward > 0.2", pearson > 0.2, got=round(pearson, 2))
checks.true("Spearman with the true reward > 0.2", spearman > 0.2, got=round(spearman, 2))
checks.true("|Pearson| of log pi_ref with true reward < 0.1", abs(t["reference_logprob_pearson"]) < 0.1,
            got=round(t["reference_logprob_pearson"], 2))
checks.true("test pairs ranked rightly > 0.5", t["pair_accuracy"] > 0.5,
            got=round(t["pair_accuracy"], 2))
checks

# %%
print(f"test pairs ranked rightly: {t['pair_accuracy']:.2f} of all 512, "
      f"{t['pair_accuracy_untied']:.2f} of the {int(untied.sum())} pairs without a tie in true reward")
print(f"the true reward itself ranks {truth_acc:.2f} of those {int(untied.sum())} rightly "
      f"(the labels are Bradley-Terry draws, so even it is wrong on some)")

# %%
fig, ax = plt.subplots(figsize=(6.5, 4))
jitter = 0.25 * (torch.rand(true2.shape, generator=torch.Generator().manual_seed(1)) - 0.5)
ax.scatter(true2 + jitter, stored, s=5, alpha=0.35, label="test response")
levels = [v for v in sorted(set(true2.tolist())) if int((true2 == v).sum()) >= 5]
means = [float(stored[true2 == v].mean()) for v in levels]
ax.plot(levels, means, "o-", color="C3", label="mean per true reward (≥ 5 responses)")
ax.set(xlabel="true reward r(x, y) (keywords in the response; jittered)",
       ylabel=r"implicit reward $\beta\log\pi_\theta/\pi_{ref}$",
       title=f"DPO's implicit reward on 1024 test responses\nPearson {pearson:.2f}, Spearman {spearman:.2f}")
ax.legend()
fig.tight_layout()
save_figure(fig, "19_dpo_implicit_reward")
plt.show()

# %% [markdown]
# The red line, the mean implicit reward at each true reward (where at least five test
# responses have it), climbs with the number of keywords, and the correlation is positive,
# while the reference model's own log-probability is uncorrelated with the reward (Pearson
# -0.02): DPO has learned something about keywords from the pairs. But the spread is wide,
# and the slope is far below what the theory promises at the optimum. There
# $\hat r = r + c(x)$ exactly (the labels have Bradley–Terry scale 1), a slope of 1
# whatever $\beta$; the least-squares slope after one pass over the pairs is printed below.
# On the test pairs the implicit reward ranks 0.69 of the pairs without a tie rightly, where
# the true reward ranks 0.79 (a pair whose chosen response has fewer keywords lost the
# Bradley–Terry coin; no reward can rank those rightly).

# %%
centred = true2 - true2.mean()
slope = float((centred * (stored - stored.mean())).sum() / (centred**2).sum())
print(f"least-squares slope of the implicit reward on the true reward: {slope:.2f} (1 at the optimum)")

# %% [markdown]
# ## 19.6 DPO against PPO
#
# Both chapters score their policies with one function, `evaluate_policy`: one response
# sampled at temperature 1 for each of the 512 test prompts, the mean true reward, and the
# Monte Carlo estimate of the sequence-level $\mathrm{KL}(\pi\,\|\,\pi_{\text{ref}})$ in nats.
# Chapter 18's run is shipped as artifact `"ppo"`.

# %%
try:
    _, ppo_info = load_artifact("ppo")
except ValueError:
    ppo_info = None
    print("chapter 18's PPO artifact is not shipped yet: the table shows the base model and DPO")
runs = {"base model": None, "DPO": info}
if ppo_info is not None:
    runs["PPO"] = ppo_info
rows = comparison_rows(runs)
fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
print(f"{'':11s} {'reward':>7s} {'KL (nats)':>10s} {'± s.e.':>7s} {'train s':>8s} {'fwd tokens':>11s} "
      f"{'bwd tokens':>11s} {'generated':>9s}")
for row in rows:
    print(f"{row['name']:11s} {row['reward']:7.2f} {row['kl']:10.2f} {row['kl_stderr']:7.2f} "
          f"{fmt(row['wall_seconds'], '8.0f')} {fmt(row['forward_tokens'], '11,d')} "
          f"{fmt(row['backward_tokens'], '11,d')} {fmt(row['generated_tokens'], '9,d')}")

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
for ax in axes:
    ax.plot(path["kl"], path["reward"], "o-", color="C0", ms=4, label=f"DPO, every {recipe['eval_every']} steps")
    ax.plot([0], [info["base"]["reward"]], "ks", ms=8, label="base model")
    if ppo_info is not None:
        ax.plot(ppo_info["history"]["kl_mean"], ppo_info["history"]["reward_mean"], ".-", color="C1", lw=0.6,
                ms=3, alpha=0.6, label="PPO, each iteration's batch")
        ax.errorbar(ppo_info["final"]["kl"], ppo_info["final"]["reward"], xerr=ppo_info["final"]["kl_stderr"],
                    fmt="D", color="C1", ms=8, label="PPO, final")
    ax.errorbar(info["final"]["kl"], info["final"]["reward"], xerr=info["final"]["kl_stderr"], fmt="D",
                color="C0", ms=8, label="DPO, final")
    ax.set(xlabel=r"KL($\pi\,\|\,\pi_{ref}$) per response (nats)", ylabel="mean true reward (keywords per response)")
axes[0].set_title("Reward against KL")
axes[0].legend(fontsize="small")
axes[1].set(xlim=(-0.05, 1.5), ylim=(0.2, 1.2), title="The same, KL < 1.5 nats")
fig.tight_layout()
save_figure(fig, "19_dpo_reward_kl")
plt.show()

# %% [markdown]
# The two runs aim at the same policy, $\pi_{\text{ref}}\,e^{r/0.3}/Z$, and end far apart.
# PPO reaches about 4.4 keywords per response at a KL of about 10 nats; DPO about 0.65 at
# 0.46 nats. Per nat of KL, DPO does well: in the zoom on the right its path runs above
# PPO's early iterations (PPO's points are the noisier statistics of its 32-response
# training batches; DPO's are `evaluate_policy` on the 512 test prompts). But DPO stops where
# its data stop. Its pairs are fixed responses of the *base* model, which rarely hold more
# than two keywords, labelled by a coin that comes up tails often; everything DPO knows about
# the reward is what 4096 such pairs say, and its implicit reward has recovered only a
# seventh of the true reward's scale (slope 0.13). PPO samples from its *current* policy and
# scores every sample with the exact reward: as it writes more keywords it sees responses
# with four, six, eight of them and learns from those. That is the advantage of on-policy
# RL; Xu et al. (2024, "Is DPO Superior to PPO for LLM Alignment? A Comprehensive Study")
# found PPO ahead of DPO on real tasks too, and traced part of DPO's deficit to the shift
# between the distribution of its preference data and that of the policy. The comparison
# also flatters PPO here: chapter 18 gives PPO the true reward, where in practice it would
# get chapter 17's learned reward model, trained on the same noisy pairs DPO sees.
#
#
# **Compute.** Is DPO at least the cheaper route? Count *token passes*: one token through a
# forward or a backward pass of one network. DPO's forward passes are the reference's, once
# over every pair, and the policy's over each batch; its backward passes are the policy's.
# PPO's, per iteration, are the scoring of its rollouts by policy, reference and critic, and
# a forward and a backward pass of policy and critic in each of its epochs; it also
# *generates* its responses, one token at a time. The table counts both runs in full, and
# PPO up to the first iteration at which its rollout reward (the mean of 8 iterations, to
# smooth the 32-response batches) reaches DPO's final reward (`ppo_compute_to_reward`;
# its training seconds pro-rated by iterations, an estimate).

# %%
show_source(ppo_compute_to_reward)

# %%
if ppo_info is not None:
    dpo_c, ppo_c = info["compute"], ppo_info["compute"]
    matched = ppo_compute_to_reward(ppo_info, info["final"]["reward"], window=8)
    seq_len = train.prompts.shape[1] + train.chosen.shape[1]
    dpo_reference_fwd = 2 * recipe["num_pairs"] * seq_len  # the reference's one pass
    table = {f"DPO, whole run ({dpo_c['steps']} steps)": dpo_c,
             f"PPO, whole run ({ppo_c['iterations']} iterations)": ppo_c,
             f"PPO to DPO's reward ({matched['iterations']} iterations)": matched}
    print(f"{'':36s} {'fwd tokens':>11s} {'bwd tokens':>11s} {'generated':>9s} {'train s':>8s}")
    for name, c in table.items():
        print(f"{name:36s} {c['forward_tokens']:11,d} {c['backward_tokens']:11,d} {c['generated_tokens']:9,d} "
              f"{c['wall_seconds']:8.0f}")
    print(f"DPO's forward tokens of the reference pass: {dpo_reference_fwd:,} "
          f"({dpo_reference_fwd / dpo_c['forward_tokens']:.0%})")
    print(f"PPO reaches DPO's final reward {info['final']['reward']:.2f} at iteration {matched['iterations']} "
          f"of {ppo_c['iterations']} (8-iteration mean {matched['reward']:.2f}, KL {matched['kl']:.3f} nats; "
          f"DPO's KL {info['final']['kl']:.2f}, ratio {matched['kl'] / info['final']['kl']:.1f})")
    print(f"DPO / PPO-to-match: forward tokens {dpo_c['forward_tokens'] / matched['forward_tokens']:.1f} times, "
          f"backward {dpo_c['backward_tokens'] / matched['backward_tokens']:.1f} times, "
          f"training seconds {dpo_c['wall_seconds'] / matched['wall_seconds']:.1f} times")

# %% [markdown]
# Compute is not where DPO wins here. Its whole run passed more tokens through forward
# passes and more through backward passes than the whole PPO run, and a reader who counts
# only the policy's passes should note that half of DPO's forward tokens are the reference's
# pass, which PPO pays too, batch by batch. To *equal reward* the gap widens: PPO matches
# DPO's final reward after a quarter of its iterations: DPO spent 4.9 times the forward and
# 4.3 times the backward token passes PPO needed to get there, and more training time,
# though PPO got there at about twice DPO's KL, and its reward is measured on its own
# training rollouts where DPO's is measured on the test prompts. What DPO saves is generation: it samples nothing, where PPO had by
# then generated 11,520 tokens one step at a time. On a large model generation is the
# dominant cost of an RL step and can tip the balance in DPO's favour; on the book's model,
# with 24-token responses, sampling is cheap, and PPO's training time above includes it.
# So the measured case for DPO on this task is simplicity (no sampling, no critic, no reward
# model) and reward per nat of KL, not compute.

# %%
dpo_row, ppo_row = rows[1], rows[-1]
checks = Checks("DPO against PPO (shipped runs)")
checks.true("DPO: reward above the base model's", dpo_row["reward"] > rows[0]["reward"])
if ppo_info is not None:
    checks.true("PPO reaches a higher reward", ppo_row["reward"] > dpo_row["reward"])
    checks.true("... at a larger KL", ppo_row["kl"] > dpo_row["kl"])
    checks.true("DPO generates no tokens; PPO does", dpo_row["generated_tokens"] == 0 < ppo_row["generated_tokens"])
    checks.close("DPO's forward tokens = reference pass + policy passes (from the recipe)",
                 dpo_reference_fwd * (1 + recipe["epochs"]), dpo_row["forward_tokens"], tol=0)
    checks.true("whole runs: DPO used more forward token passes than PPO",
                dpo_row["forward_tokens"] > ppo_row["forward_tokens"])
    checks.true("... and more backward token passes", dpo_row["backward_tokens"] > ppo_row["backward_tokens"])
    checks.true("PPO matched DPO's reward with under a third of DPO's token passes",
                3 * (matched["forward_tokens"] + matched["backward_tokens"])
                < dpo_row["forward_tokens"] + dpo_row["backward_tokens"])
checks

# %% [markdown]
# ## 19.7 The family: IPO, KTO, ORPO, SimPO, RLOO
#
# DPO changed RLHF's route but kept its target. Its successors each change one more piece,
# and each is one function of sequence log-probabilities in `llmbook.alignment.preference_losses`,
# equal to trl's implementation (trl 1.16.0) on the same float64 inputs (the tests). With
# $h = \log\frac{\pi(y_w)}{\pi_{\text{ref}}(y_w)} - \log\frac{\pi(y_l)}{\pi_{\text{ref}}(y_l)}$:
#
# * **IPO** (Azar et al., 2023) replaces the Bradley–Terry likelihood by a square,
#   $(h - \frac{1}{2\tau})^2$. For a pair preferred with probability $p$ the expected loss is
#   smallest at $h^* = \frac{2p-1}{2\tau}$, which stays below $\frac{1}{2\tau}$, where DPO's
#   optimum $h^* = \frac{1}{\beta}\log\frac{p}{1-p}$ runs off to infinity as $p \to 1$ (exercise 1).
#   trl averages the log-ratios over the response tokens, and so does `ipo_loss`.
# * **KTO** (Ethayarajh et al., 2024) needs no pairs: a response is desirable or not on its
#   own. With $r = \log\frac{\pi(y)}{\pi_{\text{ref}}(y)}$ and a reference point $z_0$, the
#   loss is $\lambda_D(1 - \sigma(\beta(r - z_0)))$ for a desirable and
#   $\lambda_U(1 - \sigma(\beta(z_0 - r)))$ for an undesirable response: prospect theory's
#   value, saturating in both directions. $z_0$ estimates $\mathrm{KL}(\pi\|\pi_{\text{ref}})$
#   on responses paired with the wrong prompts, clamped at 0 and not differentiated.
# * **ORPO** (Hong et al., 2024) drops the reference model and the separate SFT stage: the
#   SFT loss of $y_w$ plus $-\lambda\log\sigma\big(\log\mathrm{odds}(y_w) - \log\mathrm{odds}(y_l)\big)$,
#   with $\mathrm{odds} = P/(1-P)$ of the per-token average probability $P$.
# * **SimPO** (Meng et al., 2024) also drops the reference: the reward is the average
#   log-probability, $r = \frac{\beta}{|y|}\log\pi(y)$, the quantity sampling ranks by, and
#   the Bradley–Terry loss asks for a margin $\gamma$: $-\log\sigma(r_w - r_l - \gamma)$.
# * **RLOO** (Ahmadian et al., 2024) goes back to RL: REINFORCE on $k$ samples per prompt,
#   each with the mean reward of the other $k-1$ as its baseline,
#   $A_i = R_i - \frac{1}{k-1}\sum_{j\ne i}R_j$. The baseline does not depend on $y_i$, so the
#   gradient stays unbiased, and the advantages of a group sum to 0.
#
# The book's pairs fit all five: the chosen and the rejected response were both sampled from
# the base model for the same prompt, so for RLOO they are $k = 2$ samples, with advantages
# $\pm(r_w - r_l)$ from the *true* reward rather than from the label. Below, each loss on the
# first training batch (64 pairs), at the reference (the first step of every run) and at the
# shipped DPO policy, and its gradient with respect to the sequence log-probabilities at the
# DPO policy: how hard it pushes $\log\pi(y_w)$ up and $\log\pi(y_l)$ down, per pair
# (times 64, so that a mean loss's per-pair weight reads directly). KTO sees the 128
# responses unpaired (chosen = desirable), its $z_0$ from the chosen responses shifted by one
# prompt. All responses have 24 tokens, so here length normalisation only rescales.

# %%
show_source(simpo_loss)

# %%
nb = 64
bp, bw, bl = train.prompts[:nb], train.chosen[:nb], train.rejected[:nb]
lengths = torch.full((nb,), bw.shape[1])
with torch.no_grad():
    seq = {name: [sequence_logprobs(model, bp, y).double() for y in (bw, bl, bw.roll(1, 0))]
           for name, model in (("reference", reference), ("DPO policy", policy))}
ref_w, ref_l, ref_mis = seq["reference"]
b, tau, lam, simpo_beta, simpo_gamma = recipe["beta"], recipe["beta"], 0.1, 2.0, 0.5
desirable = torch.cat([torch.ones(nb), torch.zeros(nb)]).bool()
true_rewards = torch.stack([train.reward_chosen[:nb], train.reward_rejected[:nb]], 1).reshape(-1).double()
rloo_adv = rloo_advantages(true_rewards, group_size=2)  # (r_w - r_l, r_l - r_w) per pair
family = {
    "DPO": lambda w, lo, mis: dpo_loss(w, lo, ref_w, ref_l, b)[0],
    "IPO": lambda w, lo, mis: ipo_loss(w, lo, ref_w, ref_l, tau, lengths, lengths).loss,
    "KTO": lambda w, lo, mis: kto_loss(torch.cat([w, lo]), torch.cat([ref_w, ref_l]), desirable, b,
                                      kto_reference_point(mis, ref_mis)).loss,
    "ORPO": lambda w, lo, mis: orpo_loss(w / lengths, lo / lengths, lam).loss,
    "SimPO": lambda w, lo, mis: simpo_loss(w, lo, lengths, lengths, simpo_beta, simpo_gamma).loss,
    "RLOO": lambda w, lo, mis: rloo_loss(torch.stack([w, lo], 1).reshape(-1),
                                        torch.stack([w, lo], 1).reshape(-1).detach(), rloo_adv),
}
results, pushes = {}, {}
for name, loss_fn in family.items():
    at_ref = float(loss_fn(*seq["reference"]))
    w, lo = (t.clone().requires_grad_(True) for t in seq["DPO policy"][:2])
    loss = loss_fn(w, lo, seq["DPO policy"][2])
    g_w, g_l = torch.autograd.grad(loss, (w, lo))
    pushes[name] = nb * (g_l - g_w)  # > 0: raise y_w relative to y_l
    results[name] = (at_ref, float(loss.detach()), float(-nb * g_w.mean()), float(nb * g_l.mean()))
print(f"{'':6s} {'loss at ref':>11s} {'at DPO':>8s} {'raise y_w':>10s} {'lower y_l':>10s} {'corr. with DPO':>14s}")
for name, (at_ref, at_pol, up, down) in results.items():
    corr = reward_correlation(pushes[name], pushes["DPO"])[0] if name != "DPO" else 1.0
    print(f"{name:6s} {at_ref:11.4f} {at_pol:8.4f} {up:10.4f} {down:10.4f} {corr:14.2f}")

# %%
checks = Checks("the family on one batch of the book's pairs")
checks.close("DPO at the reference: log 2", math.log(2), results["DPO"][0], tol=1e-15)
checks.close("IPO at the reference: h = 0, loss (1/(2 tau))^2", (1 / (2 * tau)) ** 2, results["IPO"][0], tol=1e-12)
checks.close("KTO at the reference: z0 = 0, loss 1 - sigma(0)", 0.5, results["KTO"][0], tol=1e-15)
checks.close("RLOO (k = 2): per-pair push = r_w - r_l, from the rewards",
             (train.reward_chosen[:nb] - train.reward_rejected[:nb]).double(), pushes["RLOO"], tol=1e-12)
by_hand = -torch.nn.functional.logsigmoid(simpo_beta * (ref_w - ref_l) / bw.shape[1] - simpo_gamma).mean()
checks.close("SimPO at the reference = -log sigma(beta (avg_w - avg_l) - gamma), by hand",
             float(by_hand), results["SimPO"][0], tol=1e-12)
checks.true("every pairwise loss pushes y_w up relative to y_l on average",
            all(float(pushes[k].mean()) > 0 for k in ("DPO", "IPO", "KTO", "ORPO", "SimPO")))
checks

# %% [markdown]
# The losses start from different places and weigh the same pairs differently. At the
# reference DPO's loss is $\log 2$, IPO's $(1/2\tau)^2$ and KTO's $\frac12$, and all three
# give every pair the same weight; the reference-free SimPO and ORPO start from the base
# model's own average log-probabilities instead. At the DPO policy IPO's pushes follow
# DPO's almost exactly (on margins this small its square is nearly linear, as DPO's
# sigmoid is), KTO's more loosely, having split each pair in two. SimPO and ORPO weigh pairs
# by the model's own probabilities; ORPO's push is mostly its SFT term raising $y_w$, its
# odds-ratio term lowering $y_l$ far less at this $\lambda$. RLOO weighs each pair by the
# true reward difference: tied pairs, more than half of the data, get no weight at all,
# where every preference loss trusts their coin-flip labels, and its weights even run
# against DPO's, which are largest where the implicit reward still ranks a pair wrongly,
# seldom a pair the true reward separates widely. Which loss does best on this task is a
# question for training runs, not for one batch: the next section runs them.

# %% [markdown]
# ## 19.8 The family on the book's task
#
# Each method of 19.7 is now trained as DPO was in 19.4, and nothing else changes: the same
# rank-8 LoRA adapters on the text model, the same 4096 pairs visited once in the same 64
# batches of 64, AdamW with the same schedule and clipping (`train_member` in
# `llmbook.alignment.preference_training`; with the DPO loss it repeats `train_dpo`, which a
# check below confirms). The seed fixes the adapters' initialisation and the order of the
# batches; each method runs with the seeds listed below, and the table gives the mean over
# seeds with a 95 % Student-t interval. With three seeds that interval is
# $\pm 4.3\,s/\sqrt 3$ for a standard deviation $s$ between seeds: wide, but honest about
# what three runs can tell apart.
#
# **Hyperparameters.** Every method with a reference model uses chapter 18's $\beta = 0.3$
# ($\tau = 0.3$ for IPO, and the KL penalty of RLOO), so that DPO, IPO, KTO and RLOO aim at
# the policy PPO aims at, $\pi_{\text{ref}}\,e^{r/0.3}/Z$ (trl's defaults are 0.1, and 0.05
# for RLOO's penalty). ORPO and SimPO have no reference model and so no such target; they keep
# the settings of 19.7, ORPO's $\lambda = 0.1$ (trl's default, after Hong et al.) and SimPO's
# $\beta = 2$ with the margin $\gamma = 0.5$ (trl's default margin; Meng et al. tune $\beta$
# around that value). There is no sweep: every number below belongs to these settings, and a
# method that loses here might win with others.
#
# **RLOO, matched to DPO step for step.** RLOO never sees the responses of the pairs, only
# their prompts. Each step takes the 64 prompts of DPO's batch, samples $k = 2$ responses to
# each from the *current* policy (trl's default $k$), scores each with the true keyword reward
# minus $0.3$ times its log-ratio to the reference, and takes one REINFORCE step with the
# leave-one-out baseline: with $k = 2$ a response's advantage is its score minus its
# sibling's. So per step it passes 128 sequences of 32 tokens through the policy, forward and
# backward, as DPO does, and the reference scores the 128 new responses where DPO's reference
# scored all pairs once in advance: the same token passes in total. What RLOO adds is
# generation (128 responses of 24 tokens per step) and the exact reward, which the offline
# methods see only through the noisy labels.
#
# Every run is scored as in 19.6: `evaluate_policy` on the 512 test prompts after the last
# step, and, for the path, every 8 steps on the first 128 test prompts (cheaper, noisier
# points). `data/make_preference_family.py` makes the runs and the notebook loads them.

# %%
show_source(family_loss)

# %%
fam = json.loads(data_path("preference_family", "results.json").read_text())
fam_recipe = fam["recipe"]
print({k: fam_recipe[k] for k in ("num_pairs", "batch_pairs", "lr", "eval_every", "num_eval_prompts",
                                  "path_eval_prompts", "seeds")})
for method, params in fam_recipe["params"].items():
    print(f"{method:6s} {params}")

# %%
fam_rows = summarize_family(fam)
print(f"{'':12s} {'seeds':>5s} {'reward ± 95%':>13s} {'(each seed)':>20s} {'KL ± 95%':>13s} {'fwd tokens':>10s} "
      f"{'bwd tokens':>10s} {'generated':>9s} {'train s':>7s}")
print(f"{'base model':12s} {'':5s} {fam['base']['reward']:6.2f} {'':27s} {0:6.2f}")
for row in fam_rows:
    each = ", ".join(f"{r['final']['reward']:.2f}" for r in fam["runs"][row["method"]])
    print(f"{row['method']:12s} {row['seeds']:5d} {row['reward']:6.2f} ± {row['reward_pm']:4.2f} {each:>20s} "
          f"{row['kl']:6.2f} ± {row['kl_pm']:4.2f} {row['forward_tokens']:10,.0f} {row['backward_tokens']:10,.0f} "
          f"{row['generated_tokens']:9,.0f} {row['wall_seconds']:7.0f}")
for name, ref_info in (("DPO (19.4)", info), ("PPO (ch. 18)", ppo_info)):
    if ref_info is not None:
        c = ref_info["compute"]
        print(f"{name:12s} {1:5d} {ref_info['final']['reward']:6.2f} {'':27s} {ref_info['final']['kl']:6.2f} {'':6s} "
              f"{c['forward_tokens']:10,d} {c['backward_tokens']:10,d} {c['generated_tokens']:9,d} "
              f"{c['wall_seconds']:7.0f}")

# %%
fam_paths = family_paths(fam)
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
for ax in axes:
    ax.plot([0], [fam["base"]["reward"]], "ks", ms=7, label="base model")
    ax.plot(path["kl"], path["reward"], ":", color="grey", lw=1.2, label="DPO of 19.4 (shipped)")
    if ppo_info is not None:
        ax.plot(ppo_info["history"]["kl_mean"], ppo_info["history"]["reward_mean"], ".", color="grey", ms=2,
                alpha=0.5, label="PPO, each iteration's batch")
        ax.plot(ppo_info["final"]["kl"], ppo_info["final"]["reward"], "D", color="grey", ms=7, label="PPO, final")
    for j, row in enumerate(fam_rows):
        p_, runs_ = fam_paths[row["method"]], fam["runs"][row["method"]]
        ax.plot(p_["kl"], p_["reward"], "-", color=f"C{j}", lw=1, alpha=0.7)
        ax.plot([r["final"]["kl"] for r in runs_], [r["final"]["reward"] for r in runs_], "o", mfc="none",
                color=f"C{j}", ms=5)
        ax.plot(row["kl"], row["reward"], "o", color=f"C{j}", ms=7, label=f"{row['method']}, {row['seeds']} seeds")
    ax.set(xlabel=r"KL($\pi\,\|\,\pi_{ref}$) per response (nats)", ylabel="mean true reward (keywords per response)")
axes[0].set_title("After 64 steps (filled: mean; open: each seed)")
axes[0].legend(fontsize="x-small")
offline = [r for runs_ in (fam["runs"][m] for m in fam["runs"] if m != "RLOO") for r in runs_]
axes[1].set(xlim=(-0.1, 1.1 * max(r["final"]["kl"] for r in offline)),
            ylim=(0.25, 1.1 * max(r["final"]["reward"] for r in offline)), title="The offline methods, zoomed")
fig.tight_layout()
save_figure(fig, "19_dpo_family")
plt.show()

# %%
at_kls = {"DPO": fam_rows[0]["kl"], "IPO": fam_rows[1]["kl"]}  # the mean final KLs of DPO and IPO
print("reward where each mean path first reaches "
      + " and ".join(f"{kl:.2f} nats ({name}'s final KL)" for name, kl in at_kls.items()) + ":")
for row in fam_rows:
    at = [reward_at_kl(fam_paths[row["method"]], kl) for kl in at_kls.values()]
    print(f"  {row['method']:6s} " + "  ".join("   -" if v is None else f"{v:4.2f}" for v in at))

# %%
fam_dpo0 = next(r for r in fam["runs"]["DPO"] if r["seed"] == 0)
rloo0 = next(r for r in fam["runs"]["RLOO"] if r["seed"] == 0)
# RLOO's first batch, redrawn: at step 0 the policy is the base model; the first 64 prompts of the seed-0 order
order0 = torch.randperm(fam_recipe["num_pairs"], generator=torch.Generator().manual_seed(0))
first_prompts = train.prompts[order0[:fam_recipe["batch_pairs"]]].repeat_interleave(2, 0)
kw = keyword_ids(book_model("text")[1]["tokenizer"])
first_samples = sample_responses(reference, first_prompts, 24, 1.0, torch.Generator().manual_seed(0))
checks = Checks("the family's shipped runs")
for row in fam_rows:
    finals = [r["final"]["reward"] for r in fam["runs"][row["method"]]]
    if len(finals) > 1:
        low, high = stats.t.interval(0.95, len(finals) - 1, loc=stats.tmean(finals), scale=stats.sem(finals))
        checks.close(f"{row['method']}: interval = scipy's t.interval", (high - low) / 2, row["reward_pm"], tol=1e-12)
checks.close("DPO, seed 0, repeats the shipped DPO run: per-step losses", info["history"]["loss"],
             fam_dpo0["history"]["loss"], tol=1e-4)
checks.close("... and its final reward", info["final"]["reward"], fam_dpo0["final"]["reward"], tol=0.02)
checks.close("RLOO, seed 0: first batch's mean reward, recomputed (±0.02)", float(keyword_reward(first_samples, kw).mean()),
             rloo0["history"]["reward"][0], tol=0.02)
checks.close("RLOO's token passes = DPO's (forward, backward)", [fam_dpo0["compute"]["forward_tokens"],
             fam_dpo0["compute"]["backward_tokens"]], [rloo0["compute"]["forward_tokens"],
                                                       rloo0["compute"]["backward_tokens"]], tol=0)
checks

# %% [markdown]
# What the runs show, with the caveat that three seeds give wide intervals and that every
# method ran with one setting of its hyperparameters:
#
# * **DPO** is the steadiest: its three seeds end within 0.01 of each other, at 0.65
#   keywords per response and 0.48 nats, and seed 0 repeats the shipped run of 19.4 step for
#   step (the checks above), so the runs differ from 19.4 in nothing but the loss.
# * **IPO and KTO** move further from the reference (2.29 and 3.14 nats) and collect more
#   reward (1.09 and 1.25), every seed of them above every seed of DPO. But they do not learn
#   more per nat of KL: where their mean paths reach DPO's final KL their reward is 0.54 and
#   0.56, against DPO's 0.65 (those path points are scored on 128 prompts, so noisier than the
#   final ones). They travel further along much the same road, and how far the same 64
#   steps take them is decided by their settings ($\tau$, $\beta$, the learning rate) as
#   much as by their losses. IPO and KTO cannot be told apart: their intervals overlap.
# * **ORPO** hardly moves: 0.41 keywords at 0.10 nats. At $\lambda = 0.1$ most of its
#   gradient is the SFT term, which pulls the policy towards the chosen responses, and
#   those are samples of the base model itself, so towards where it already is.
# * **SimPO** goes furthest of the offline methods, 8.06 nats, for 1.40 keywords, within
#   noise of KTO's reward at more than twice the KL; its path lies below every other
#   (0.38 at DPO's final KL, 0.63 at IPO's). With no reference in its loss nothing holds it
#   near the base model, and the quantity it raises, the chosen response's average
#   log-probability relative to the rejected one's, is a property of the whole text, of
#   which the keywords are a small part.
# * **RLOO** is in another place altogether: 6.83 keywords per response at 15.97 nats, beyond
#   PPO's shipped run (4.44 at 9.86) in both reward and KL, with the same forward and
#   backward token passes as DPO and 196,608 generated tokens where PPO generated 46,080. Its
#   first steps are no better than DPO per nat (0.64 against 0.65 at DPO's KL), but it keeps
#   climbing, where the offline methods stop when the pairs run out: at IPO's final KL it has
#   1.49 keywords against IPO's 1.09. It samples from the current policy and is scored by the
#   exact reward, as PPO was in 19.6; with $\beta = 0.3$ the target $\pi_{\text{ref}}\,e^{r/0.3}/Z$
#   weighs every keyword by $e^{1/0.3}$, so it heads for keyword-dense responses, and whether
#   they still read like docstrings is not in these numbers (chapter 18 measured that for PPO).
#
# The seconds in the table are the training time of each run, measured while the runs shared
# the book's two cores with other jobs (heavily at first, hardly at the end): they are several
# times the 19.4 run's and say little about the methods. The token passes are exact. So on
# this task the offline family shares one reward-KL trade-off, on which the losses and their
# settings choose how far to go; the online method, with the true reward, is the one that
# changes the trade-off.

# %% [markdown]
# ## Summary
#
# * The KL-regularised objective $\mathbb E_\pi[r] - \beta\,\mathrm{KL}(\pi\|\pi_{\text{ref}})$
#   is maximised by $\pi^* = \pi_{\text{ref}}\,e^{r/\beta}/Z$, with value $\beta\log Z$; for
#   any other policy the loss is exactly $\beta\,\mathrm{KL}(\pi\|\pi^*)$ (SymPy, and L-BFGS
#   on six responses).
# * Read backwards, $r = \beta\log(\pi^*/\pi_{\text{ref}}) + \beta\log Z(x)$, and $Z(x)$
#   cancels in the Bradley–Terry probability of a preference: the DPO loss
#   $-\log\sigma(\hat r_w - \hat r_l)$ with the implicit reward
#   $\hat r = \beta\log(\pi_\theta/\pi_{\text{ref}})$ trains the policy on the pairs
#   directly. On six responses its minimiser is $\pi^*$.
# * Its gradient is $-\beta\,\mathbb E[\sigma(\hat r_l - \hat r_w)(\nabla\log\pi(y_w) -
#   \nabla\log\pi(y_l))]$: pairs the implicit reward ranks wrongly weigh most (SymPy,
#   autograd, finite differences through a transformer).
# * On the book's task, one pass over chapter 17's 4096 noisy pairs raises the keyword reward
#   from 0.33 to 0.65 at a KL of 0.46 nats, ranks 0.69 of the untied test pairs rightly, and
#   yields an implicit reward with Pearson correlation 0.31 with the true one; both the
#   chosen and the rejected responses lose probability.
# * Against PPO with the same $\beta$, DPO is efficient per nat of KL, but stops far short:
#   its offline, noisy data hold less about the reward than PPO's on-policy samples scored by
#   the exact reward. Nor is it cheaper here: it spent more forward and backward token passes
#   than the whole PPO run, and PPO matched its reward with a quarter of its own; DPO saves
#   only generation.
# * IPO bounds the margin DPO lets grow forever, KTO learns from unpaired labels, ORPO and
#   SimPO drop the reference model, RLOO returns to REINFORCE with a leave-one-out baseline;
#   each equals trl's implementation in the book's tests.
# * Trained like DPO on the book's task (three seeds each), IPO and KTO go further from the
#   reference for more reward but no more reward per nat of KL, ORPO hardly moves, SimPO
#   spends the most KL per keyword, and RLOO, with the same token passes as DPO plus
#   generation and the exact reward, passes PPO's reward.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/19_dpo.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 19` writes a stub
# of every function, `llmbook grade 19` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_19.py` runs
# the same checks on the reference.
#
# 1. (★★) **IPO's optimum.** For a single pair $(a, b)$ in which $a$ is preferred with
#    probability $p$, write the expected DPO loss $-p\log\sigma(\beta h) - (1-p)\log\sigma(-\beta h)$
#    and the expected IPO loss (Azar et al., 2023) $p\,(h - \frac{1}{2\tau})^2 + (1-p)(-h - \frac{1}{2\tau})^2$
#    as functions of the log-ratio margin $h = \log\frac{\pi(a)}{\pi_{\text{ref}}(a)} - \log\frac{\pi(b)}{\pi_{\text{ref}}(b)}$.
#    Find both minimisers with SymPy. Show that DPO's grows without bound as $p \to 1$ (a
#    pair that is always labelled the same way is pushed apart forever, whatever $\beta$),
#    while IPO's stays below $\frac{1}{2\tau}$.
# 2. (★★) **What β trades.** On the six responses of 19.1, compute the reward
#    $\mathbb E_{\pi^*}[r]$ and $\mathrm{KL}(\pi^*\|\pi_{\text{ref}})$ of the optimal policy for
#    $\beta \in \{0.1, 0.2, 0.5, 1, 2, 10\}$. Show that both fall as $\beta$ grows, that
#    $\mathrm{KL}(\pi^*\|\pi_{\text{ref}}) = \mathbb E_{\pi^*}[r]/\beta - \log Z$, and that
#    $\frac{d}{d\beta}\mathbb E_{\pi^*}[r] = -\mathrm{Var}_{\pi^*}(r)/\beta^2$ (check with autograd).
# 3. (★★★) **Why the weight matters.** On the six responses, run gradient descent on the
#    logits of a tabular policy, once on the expected DPO loss and once on the same pairs with
#    each pair's weight $\sigma(\hat r_l - \hat r_w)$ replaced by 1 (the loss
#    $-\mathbb E[\hat r_w - \hat r_l]$). Show that DPO converges to $\pi^*$, while the
#    unweighted loss is unbounded below: its policy collapses onto a single response, and not
#    even the one with the highest reward.

# %%
from llmbook.workbench import grade

grade("19", globals())
