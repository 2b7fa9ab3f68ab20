# %% [markdown]
# # 19b Constitutional AI and RLAIF
#
# Chapters 17–19 learned from preferences drawn from a known reward, standing in for human
# labellers. Constitutional AI (Bai et al., 2022, "Constitutional AI: Harmlessness from AI
# Feedback") removes the human from the loop: a language model reads a written principle
# and does the labeller's work itself, in two stages. In the *supervised* stage it
# critiques a response against the principle, revises it, and the policy is fine-tuned on
# the revisions. In the *RL* stage it compares two responses under the principle; its
# comparisons train a preference model, and the policy is trained against that model with
# RL. Lee et al. (2023, "RLAIF vs. RLHF") compare the second stage with human labels. This
# chapter runs both stages at the book's scale, with SmolLM2-135M-Instruct as critic and
# judge, on chapter 17's task, where the true reward is known:
#
# 1. **the judge**: its verdict read from the next-token logits of "A" and "B", checked
#    against `transformers`; on 256 pairs in both orders, its agreement with the true
#    preference and its *position bias* (Zheng et al., 2023);
# 2. **derives** what a judge that errs with probability $\varepsilon$ and prefers the first
#    slot with probability $b$ does to the Bradley–Terry target of a reward model (SymPy);
# 3. **critique → revision → SFT**: the gold reward of the revisions and of the policy
#    fine-tuned on them;
# 4. **RLAIF**: a reward model from the AI labels, and best-of-$n$ and PPO against it,
#    compared with the same pipeline fed the true labels of the same pairs;
# 5. **grades** claim C17, which describes Constitutional AI by its first stage alone.
#
# The code is in `llmbook.alignment.ai_feedback`; `data/make_ai_feedback.py` ran the
# experiments on one thread and ships their results in `data/ai_feedback/results.json`,
# which this chapter loads. Only the judgement of one pair runs live.

# %%
import json

import matplotlib.pyplot as plt
import sympy as sp
import torch
from IPython.display import display

from llmbook.alignment.ai_feedback import (
    ai_label_probability,
    ai_label_probability_symbolic,
    calibrated_preference,
    choice_probability,
    judge_both_orders,
    judge_messages,
    judge_statistics,
    wilson_interval,
)
from llmbook.alignment.preferences import preference_data
from llmbook.inference.gguf import load_model
from llmbook.nbtools import Checks, ClaimGrades, save_figure, seed_everything, show_source
from llmbook.paths import data_path
from llmbook.training.pretrained import book_model

g = seed_everything(0)
torch.set_num_threads(1)
f64 = torch.float64
results = json.loads(data_path("ai_feedback", "results.json").read_text())
recipe = results["recipe"]
print(f"made by {results['made']['command']} in {results['seconds']['ppo'] / 60:.0f} minutes on one thread "
      f"({results['made']['date']}); recipe:")
print(", ".join(f"{k} {v}" for k, v in recipe.items()))

# %% [markdown]
# ## 19b.1 The judge: a verdict read from two logits
#
# The judge sees a chat: a system line, then the principle and the two responses as
# "Text A" and "Text B", and the question "Which text is better, A or B? Answer with one
# letter." Its answer is the next token. Rather than sample it, we read the probability
# the model gives each of the two allowed answers and renormalise over them:
#
# $$ P(\text{A}) = \frac{e^{z_\text{A}}}{e^{z_\text{A}} + e^{z_\text{B}}} = \sigma(z_\text{A} - z_\text{B}), $$
#
# with $z$ the logits at the last position. Bai et al. (2022, section 4.1) label their
# comparisons the same way: the normalised probabilities of the two answers, used as soft
# labels. The principle is the book's reward in words: chapter 17's true reward counts
# twelve programming keywords in a 24-token continuation, so the constitution asks for
# "more programming words" and lists them. The judge does not see the prompt (the
# principle concerns the response alone, and it saves tokens).

# %%
show_source(choice_probability)
judge, jtok = load_model(dtype=f64)  # float64: the checks below compare at round-off
base, binfo = book_model("text")
btok = binfo["tokenizer"]
train = preference_data("train")
a_text, b_text = btok.decode(train.chosen[1].tolist()), btok.decode(train.rejected[1].tolist())
print(jtok.render_chat(judge_messages(a_text, b_text), add_generation_prompt=True))
print(f"true rewards: A {train.reward_chosen[1]:.0f}, B {train.reward_rejected[1]:.0f}")

# %% [markdown]
# The book's batched judge left-pads the two orders of this pair into one batch, runs only
# the last position through the LM head and takes the two-token softmax. The check below
# recomputes each order alone, with the full-vocabulary softmax, and renormalises
# $p_\text{A}/(p_\text{A} + p_\text{B})$; the tests compare the same read-out with
# `transformers`' own Llama on this model. The printed line also shows how much of the
# whole next-token distribution the two letters hold; the rest goes to other openings of
# an answer ("The", "Text"), which the read-out ignores.

# %%
p_ab, p_ba = judge_both_orders(judge, jtok, [a_text], [b_text])
A_id, B_id = jtok.encode("A")[0], jtok.encode("B")[0]
checks = Checks("the judge's read-out")
mass = []
for p, (x, y) in ((p_ab, (a_text, b_text)), (p_ba, (b_text, a_text))):
    with torch.no_grad():
        probs = torch.softmax(judge(torch.tensor([jtok.encode_chat(judge_messages(x, y))]))[0, -1].double(), -1)
    checks.close("P(A), batched two-token softmax vs full softmax renormalised", probs[A_id] / (probs[A_id] + probs[B_id]),
                 p[0], tol=1e-10)
    mass.append(float(probs[A_id] + probs[B_id]))
print(f"P(judge answers A): a first {p_ab[0]:.2f}, b first {p_ba[0]:.2f};  "
      f"mass on the two letters: {min(mass):.2f} or more")
checks

# %% [markdown]
# A consistent judge would give $P(\text{A}\mid a \text{ first}) = 1 - P(\text{A}\mid b \text{ first})$.
# Here it answers "A" in both orders: whichever text comes first. That is *position bias*,
# which Zheng et al. (2023, "Judging LLM-as-a-Judge with MT-Bench and Chatbot Arena")
# measured in GPT-4 and other judges by swapping the two answers. The standard remedy
# judges both orders and averages,
#
# $$ \hat P(a \succ b) = \tfrac12\left[P(\text{A}\mid a\ \text{first}) + 1 - P(\text{A}\mid b\ \text{first})\right], $$
#
# which cancels any constant pull towards one slot: if the judge's logit difference is
# $u_a - u_b + \beta_\text{pos}$, then $\hat P > \tfrac12$ exactly when $u_a > u_b$ (a
# property test in the book's tests). Lee et al. (2023) average the two orders in the
# same way.

# %% [markdown]
# ## 19b.2 The judge on 256 pairs
#
# `data/make_ai_feedback.py` judged the first 256 training pairs of chapter 17 in both
# orders. Two facts about those pairs matter. First, many are *tied* (both responses have
# the same keyword count), and the judge's agreement is measured on the untied ones.
# Second, slot $a$ holds the response chapter 17's simulated labeller chose, which has the
# higher true reward more often than not; so a judge that always answers "A" in the order
# $(a, b)$ agrees with the truth as often as those labels do, knowing nothing. The fair
# single-order number averages the two orders (a random order per pair, in expectation).

# %%
J = results["judge"]
p_ab, p_ba = torch.tensor(J["p_first_ab"], dtype=f64), torch.tensor(J["p_first_ba"], dtype=f64)
true_a, true_b = torch.tensor(J["true_a"], dtype=f64), torch.tensor(J["true_b"], dtype=f64)
stats = judge_statistics(p_ab, p_ba, true_a, true_b)
untied = true_a != true_b
a_better = (true_a > true_b)[untied]
agree_ab = ((p_ab[untied] > 0.5) == a_better).double().mean().item()
agree_ba = ((p_ba[untied] <= 0.5) == a_better).double().mean().item()
rows = [("judge, order (a, b) only", agree_ab), ("judge, order (b, a) only", agree_ba),
        ("judge, one random order (mean of the two)", (agree_ab + agree_ba) / 2),
        ("judge, both orders averaged", stats.agreement_calibrated),
        ("always 'A' in order (a, b)", a_better.double().mean().item()),
        ("the longer text (characters)", J["length_heuristic_agreement"]), ("a coin", 0.5)]
print(f"{stats.num_untied} untied pairs of {len(p_ab)}; agreement with the true preference:")
for name, value in rows:
    print(f"  {name:44s} {value:.3f}")
lo, hi = stats.agreement_calibrated_interval
print(f"both orders averaged: 95% interval [{lo:.2f}, {hi:.2f}]")
print(f"answers 'A' in {stats.first_slot_rate:.1%} of the {2 * len(p_ab)} judgements; "
      f"the two orders pick the same text (a consistent verdict) for {1 - stats.order_disagreement:.1%} of the pairs")

# %% [markdown]
# Averaging the two orders is an independent way to read the calibrated label's sign:
# $\hat P > \tfrac12 \iff P(\text{A}\mid a\text{ first}) > P(\text{A}\mid b\text{ first})$.
# Counted that way, with a fresh Wilson interval, the agreement must match.

# %%
k = int(((p_ab[untied] > p_ba[untied]) == a_better).sum())
checks = Checks("the calibrated label, two ways")
checks.close("agreement: sign of p_ab - p_ba vs calibrated > 1/2", k / stats.num_untied,
             stats.agreement_calibrated, tol=1e-12)
checks.close("Wilson interval", wilson_interval(k, stats.num_untied), stats.agreement_calibrated_interval, tol=1e-12)
checks.close("calibrated = (p_ab + 1 - p_ba) / 2", (p_ab - p_ba + 1) / 2, calibrated_preference(p_ab, p_ba), tol=1e-15)
checks

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
axes[0].scatter(p_ab[untied & (true_a > true_b)], p_ba[untied & (true_a > true_b)], s=10, label="a has more keywords")
axes[0].scatter(p_ab[untied & (true_a < true_b)], p_ba[untied & (true_a < true_b)], s=10, label="b has more keywords")
axes[0].plot([0, 1], [1, 0], "k:", lw=1, label="a consistent judge")
axes[0].set(xlim=(0, 1), ylim=(0, 1), xlabel="P(A | a shown first)", ylabel="P(A | b shown first)",
            title="SmolLM2-135M as judge, both orders")
axes[0].legend(fontsize=8, loc="lower left")
calibrated = calibrated_preference(p_ab, p_ba)
diff = (true_a - true_b)[untied]
for d in sorted(set(diff.tolist())):
    sel = diff == d
    axes[1].errorbar(d, calibrated[untied][sel].mean(), yerr=calibrated[untied][sel].std() if sel.sum() > 1 else 0,
                     fmt="o", color="C2")
axes[1].axhline(0.5, color="k", lw=0.8, ls=":")
axes[1].set(xlabel="true reward difference r(a) - r(b) (keywords)", ylabel="calibrated P(a better)",
            title="order-averaged label against the truth")
fig.tight_layout()
save_figure(fig, "19b_constitutional_ai_judge")
plt.show()

# %% [markdown]
# SmolLM2-135M answers "A" in every one of the 512 judgements and is never consistent: its
# verdict is the slot, not the text. Read in the order $(a, b)$ alone it seems to agree
# with the truth 0.712 of the time, exactly the "always A" baseline, and read in the order
# $(b, a)$ alone 0.288; a study that showed each pair once, in the order the data happened
# to hold, would have reported a capable judge. Averaging the two orders removes the bias
# and leaves 0.486, with an interval that contains one half: no measurable knowledge of
# which text holds more keywords. The right panel says the same: the calibrated
# probability stays within a few hundredths of one half (mark the scale of its axis),
# with no trend in the true difference. A one-line heuristic,
# "prefer the longer text", agrees 0.704 of the time (a longer decoded string holds more
# whole words, and the keywords are whole words). In the terms of the next section the
# judge has $b$ near 1, or equivalently $\varepsilon$ near one half. Bai et al. (2022) and
# Lee et al. (2023) judge with far larger models, and both report that labelling
# accuracy grows with the labeller's size.

# %% [markdown]
# ## 19b.3 What a noisy, biased judge does to the reward model
#
# Model the judge. A true labeller prefers $a$ with probability
# $p = \sigma(s\Delta)$, $\Delta = r(a) - r(b)$ (chapter 17). The judge answers "first slot"
# with probability $b$ whatever it reads; otherwise it reports a true-labeller draw,
# flipped with probability $\varepsilon$. Shown in a random order (or with both orders
# averaged), its label prefers $a$ with probability
#
# $$ q = \tfrac b2 + (1-b)\big(\varepsilon + (1-2\varepsilon)\,p\big). $$
#
# A reward model trained by maximum likelihood on such labels learns the difference
# $\hat r(a) - \hat r(b) = \operatorname{logit} q$ (the minimiser of the expected
# Bradley–Terry loss, chapter 17). SymPy finds its slope at $\Delta = 0$ and its ceiling:

# %%
show_source(ai_label_probability_symbolic)
sym = ai_label_probability_symbolic()
s, d, eps, b = sym["symbols"]
display(sp.Eq(sp.Symbol("q"), sym["q"]), sp.Eq(sp.Symbol("slope"), sym["slope"]),
        sp.Eq(sp.Symbol("ceiling"), sym["ceiling"]))
slope_num = sp.lambdify((s, eps, b), sym["slope"])
delta = torch.zeros((), dtype=f64, requires_grad=True)
q = ai_label_probability(delta, 1.0, 0.2, 0.3)
torch.log(q / (1 - q)).backward()
checks = Checks("the learned reward under AI labels")
checks.close("slope at Delta = 0: SymPy vs autograd (s = 1, eps = 0.2, b = 0.3)", slope_num(1.0, 0.2, 0.3),
             float(delta.grad), tol=1e-12)
checks.close("no noise: logit q = s Delta (SymPy, at Delta = 1.7)",
             1.7, float(sym["learned"].subs({s: 1, eps: 0, b: 0, d: 1.7})), tol=1e-12)
checks

# %% [markdown]
# Three consequences. The learned reward is a monotone function of the true one whenever
# $(1-b)(1-2\varepsilon) > 0$, so with unlimited data the reward model ranks responses as
# the truth does and its accuracy on *true* labels can still reach chapter 17's Bayes
# ceiling: noise and bias do not move the target's order. But each AI label carries less
# signal: the slope, the gradient of the target at a tie, shrinks by the factor
# $(1-b)(1-2\varepsilon)$, and exercise 2 shows that the number of labels needed grows by
# its inverse square. And the learned reward saturates at
# $\log\frac{1-m}{m}$, $m = b/2 + (1-b)\varepsilon$: a response can never look much
# better than another, however many more keywords it has. At $b = 1$ (the judge always
# answers by slot) or $\varepsilon = \tfrac12$ (a coin) there is nothing left to learn.

# %%
grid = torch.linspace(-4, 4, 161, dtype=f64)
fig, ax = plt.subplots(figsize=(6, 3.8))
for flip, bias in ((0.0, 0.0), (0.2, 0.0), (0.0, 0.6), (0.2, 0.6), (0.4, 0.6)):
    qq = ai_label_probability(grid, 1.0, flip, bias)
    ax.plot(grid, torch.log(qq / (1 - qq)), label=f"eps = {flip}, b = {bias}")
ax.set(xlabel="true reward difference Delta (s = 1)", ylabel="learned difference logit q",
       title="the Bradley–Terry target under AI labels")
ax.legend(fontsize=8)
fig.tight_layout()
save_figure(fig, "19b_constitutional_ai_target")
plt.show()

# %% [markdown]
# ## 19b.4 Critique, revision and SFT
#
# The supervised stage, as Bai et al. (2022, section 3) run it: the model sees a response
# and the principle, writes a critique, is asked to rewrite the response, and the policy
# is fine-tuned on the rewrites. Here SmolLM2 critiques and revises (greedily) 32
# responses of the book's text model; each revision is re-tokenised with the text model's
# tokenizer and cut at 24 tokens, the response length of the task, so that its keyword
# count is comparable with the original's. Two examples:

# %%
rev = results["revision"]
for i in range(2):
    print(f"original ({rev['gold_original'][i]:.0f} keywords): {rev['originals'][i]!r}")
    print(f"critique: {rev['critiques'][i]!r}")
    print(f"revision ({rev['gold_revised'][i]} keywords in its first 24 tokens): {rev['revisions'][i]!r}\n")

# %%
gold_o, gold_r = torch.tensor(rev["gold_original"], dtype=f64), torch.tensor(rev["gold_revised"], dtype=f64)
n_rev = len(gold_o)
print(f"{n_rev} responses: mean keywords, original {gold_o.mean():.2f}, revised {gold_r.mean():.2f}; "
      f"revision better {int((gold_r > gold_o).sum())}, equal {int((gold_r == gold_o).sum())}, "
      f"worse {int((gold_r < gold_o).sum())}")
sft = results["sft"]
print(f"{'policy':34s}{'gold reward':>12s}{'KL (nats)':>11s}")
for name, key in (("LoRA SFT on the 32 revisions", "revisions"), ("LoRA SFT on the 32 originals", "originals")):
    f = sft[key]["final"]
    print(f"{name:34s}{f['reward']:12.2f}{f['kl']:11.2f}")
print(f"{'the base model':34s}{results['base']['reward']:12.2f}{0:11.2f}")

# %% [markdown]
# The revisions are not revisions. Asked for a critique, SmolLM2 writes a comment about
# the text ("The text could be rewritten using more programming words ..."); asked to
# rewrite, it repeats the comment. So the "improved" responses hold 0.19 keywords on
# average against 0.69 for the originals, and the text model fine-tuned on them learns to
# write such comments: its samples are 45.41 nats from the base model, with a gold reward
# (0.36) no better than the base model's (0.33). The control, the same fine-tuning on the
# 32 originals, ends at 0.46: those originals are the *chosen* responses of chapter 17's
# pairs, richer in keywords than a typical sample, and 30 steps on 32 examples copy them
# (a KL of 15.64 nats). Critique and revision improve a response only if the model can
# already do what the principle asks; the loop feeds on the reviser's ability, it does not
# create it.

# %% [markdown]
# ## 19b.5 RLAIF: AI labels, a reward model, and RL
#
# The second stage. The order-averaged judgement labels each of the 256 pairs (the text
# with $\hat P > \tfrac12$ is "chosen"), and chapter 17's trainer fits a reward model to
# them (the last two blocks and the embeddings of the text model, 64 steps of 32 pairs).
# The control is the same trainer on the *true* Bradley–Terry labels of the same 256
# pairs; chapter 17's shipped reward model, trained on 4096 pairs, shows what more true
# labels buy. Each is scored on chapter 17's 512 test pairs.

# %%
rm = results["reward_models"]
print(f"{'reward model':38s}{'accuracy (untied)':>18s}{'Bayes ceiling':>15s}{'Pearson r':>11s}")
for name, label in (("ai", "256 AI labels"), ("true", "256 true labels"), ("shipped", "4096 true labels (chapter 17)")):
    print(f"{label:38s}{rm[name]['accuracy_non_tied']:18.3f}{rm[name]['bayes_accuracy_non_tied']:15.3f}"
          f"{rm[name]['pearson']:11.3f}")

# %% [markdown]
# Then the policy. **Best-of-$n$** is the cheapest RL: sample $n$ responses from the base
# model, keep the one the reward model scores highest. Its distribution is at most
# $\log n - (n-1)/n$ nats from the base model (Beirami et al., 2024), and its gold reward
# shows directly how much of the truth a reward model's *ranking* holds. On 128 test
# prompts with 16 samples each:

# %%
bon = results["best_of_n"]
print(f"{'n':>3s}{'KL bound':>10s}" + "".join(f"{k:>10s}" for k in ("gold", "true", "shipped", "ai")))
for i, n in enumerate(bon["n"]):
    print(f"{n:3d}{bon['kl_bound'][i]:10.2f}" + "".join(f"{bon[k][i]:10.2f}" for k in ("gold", "true", "shipped", "ai")))

# %% [markdown]
# And **PPO**, chapter 18's recipe ($\beta = 0.3$, LoRA policy, separate critic) for
# 24 iterations of 32 prompts, with the reward model's score standardised (mean 0, standard
# deviation 1 over the best-of-$n$ samples of the base model) so that $\beta$ means the
# same against both reward models. The gold reward is measured, never optimised.
# PPO costs about two minutes per run here; best-of-$n$ a few seconds.

# %%
ppo = results["ppo"]
print(f"{'PPO against':24s}{'gold reward':>12s}{'KL (nats)':>11s}{'gold gained per nat':>21s}")
for name, label in (("true", "RM on true labels"), ("ai", "RM on AI labels")):
    f = ppo[name]["final"]
    gain = (f["reward"] - results["base"]["reward"]) / f["kl"]
    print(f"{label:24s}{f['reward']:12.2f}{f['kl']:11.2f}{gain:21.2f}")

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
for key, label in (("gold", "oracle (the true reward)"), ("shipped", "RM, 4096 true labels"),
                   ("true", "RM, 256 true labels"), ("ai", "RM, 256 AI labels")):
    axes[0].plot(bon["kl_bound"], bon[key], "o-", label=label)
axes[0].set(xlabel="KL bound log n - (n-1)/n (nats)", ylabel="gold reward (keywords)",
            title="best-of-n, n = 1 ... 16")
axes[0].legend(fontsize=8)
for name, label in (("true", "RM on true labels"), ("ai", "RM on AI labels")):
    h = ppo[name]["history"]
    axes[1].plot(range(1, len(h["gold"]) + 1), h["gold"], "o-", ms=3, label=label)
axes[1].axhline(results["base"]["reward"], color="k", ls=":", lw=1, label="base model (256 test prompts)")
axes[1].set(xlabel="PPO iteration", ylabel="gold reward of the rollout (32 prompts)",
            title="PPO against each reward model")
axes[1].legend(fontsize=8)
fig.tight_layout()
save_figure(fig, "19b_constitutional_ai_rlaif")
plt.show()

# %% [markdown]
# Three things to read. First, 256 labels are too few for this reward model whatever
# their source: the model trained on the true labels of the 256 pairs is at chance on
# the test pairs (0.505), as is the one trained on the AI labels, while chapter 17's
# model, trained on 4096 pairs, reaches 0.729. Second, best-of-$n$ reads the rankings more
# finely than accuracy: at $n = 16$ the true-label model's pick has 0.45 keywords, up from
# 0.38 at $n = 1$, while the AI-label model's falls to 0.28, below the base model (the
# oracle reaches 1.75, chapter 17's model 1.39). Third, PPO against either reward model
# spends about a nat and a half of KL and moves the gold reward by no more than the noise
# of a 256-sample estimate. The AI labels carry nothing to learn: with the judge at chance,
# 19b.3's slope is zero, and exercise 2's count of labels needed is infinite. RLAIF
# inherits its judge's accuracy, which is why Lee et al. (2023) measure *AI labeller
# alignment* before they train anything.

# %% [markdown]
# ## 19b.6 Claim C17
#
# A claim met in tutorials (C17) describes Constitutional AI as "self-improvement through
# AI feedback": generate a response, critique it against principles, revise it, train on
# the improved responses.

# %%
claims = ClaimGrades("Claim C17")
claims.grade("C17", "Constitutional AI is: 1 generate, 2 critique against principles, 3 revise, 4 train on the revisions",
             "that is only the supervised stage (SL-CAI) of Bai et al. (2022); their method continues with AI "
             "comparisons -> a preference model -> RL (RL-CAI, RLAIF), run here in 19b.5",
             "true only under a condition")
claims.grade("C17", "the loop is self-improvement through AI feedback",
             f"with SmolLM2-135M as critic the revisions hold {gold_r.mean():.2f} keywords against "
             f"{gold_o.mean():.2f} for the originals, and SFT on them gives gold {sft['revisions']['final']['reward']:.2f} "
             f"(base {results['base']['reward']:.2f}) at {sft['revisions']['final']['kl']:.0f} nats; as judge it agrees "
             f"{stats.agreement_calibrated:.2f} with the truth (both orders). Improvement needs a model that can "
             "already critique, revise and judge by the principle", "true only under a condition")
claims

# %% [markdown]
# C17 lists the steps of Constitutional AI's supervised stage correctly but calls it the
# whole method. Bai et al. (2022) run the critique and revision stage to get a policy to
# start from, then train a preference model on the model's own comparisons and fine-tune
# the policy against it with RL; their "RL-CAI" models are the result. Both stages are
# *self*-improvement only in a conditional sense: the model that critiques, revises and
# judges must already be good at the principle, as the large pretrained models of the
# paper are and as SmolLM2-135M is not for counting programming words. The book's
# measurements show what happens below that threshold: revisions that are worse than the
# originals, a judge whose verdicts are its position bias, and reward models that learn
# nothing from its labels.

# %% [markdown]
# ## Summary
#
# * A model judges a pair by the two logits of its answer letters:
#   $P(\text{A}) = \sigma(z_\text{A} - z_\text{B})$, the same as `transformers` gives.
# * Judged in both orders, SmolLM2-135M answers "A" every time: complete position bias.
#   One order alone would have shown a 0.71 "agreement" that is only the data's order;
#   averaging both orders leaves 0.49, chance, below a length heuristic (0.70).
# * A judge that errs with probability $\varepsilon$ and picks the first slot with
#   probability $b$ changes the Bradley–Terry target to $\operatorname{logit} q$, whose slope
#   shrinks by $(1-b)(1-2\varepsilon)$ and which saturates; the order, and so the Bayes
#   accuracy, are kept, but each label is worth $((1-b)(1-2\varepsilon))^2$ of a true one.
# * Critique and revision by SmolLM2 produce comments, not revisions (0.19 keywords against
#   0.69); SFT on them moves the policy far (45 nats) without raising the gold reward.
# * Reward models from 256 AI labels and from 256 true labels are both at chance on the test
#   pairs; with best-of-16 the true-label model gains a little gold reward and the AI-label
#   model loses some; short PPO runs against either gain nothing beyond noise.
# * C17 describes only the supervised stage of Constitutional AI, and its "self-improvement"
#   needs a model already able to critique, revise and judge by the principle.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/19b_constitutional_ai.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 19b` writes a stub
# of every function, `llmbook grade 19b` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_19b.py` runs
# the same checks on the reference.
#
# 1. (★★) **Position bias from order disagreement.** Under the judge model of 19b.3, write
#    the probability that the two orders of one pair pick the same text (a consistent
#    verdict: different slots) as a function of $b$ and $\tilde p = \varepsilon + (1-2\varepsilon)p$,
#    the two verdicts drawn independently. Show with SymPy that for an uninformative
#    judge ($\tilde p = \tfrac12$) it is $(1 - b^2)/2$, and invert it to estimate $b$ from
#    the rate of consistent verdicts measured in 19b.2.
# 2. (★★) **What an AI label is worth.** The Fisher information about $\Delta$ near a tie
#    in one Bradley–Terry label with probability $q(\Delta)$ is $q'(0)^2 / (q(0)(1-q(0)))$.
#    Compute it with SymPy for the judge model of 19b.3, and show that the number of AI
#    labels worth one true label is $1/((1-b)(1-2\varepsilon))^2$. How many labels from a
#    judge with $b = 0$ that agrees with the true labeller 70% of the time equal one true label?

# %%
from llmbook.workbench import grade

grade("19b", globals())
