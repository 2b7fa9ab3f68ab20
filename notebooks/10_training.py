# %% [markdown]
# # 10 Training a small language model
#
# Chapters 7 to 9 built a transformer, its gradients and its optimiser. This chapter puts
# them together into a training run, and asks of every piece the question the book asks of
# formulas: how do we know it is right?
#
# 1. **Data**: a tokenised corpus as one long array of ids on disk, memory-mapped, and
#    random windows cut from it into a batch of inputs $x$ and targets $y$ shifted by one.
# 2. **The loop**: forward, cross-entropy in nats, backward, clipping, AdamW with weight
#    decay on the matrices only, warmup + cosine schedule; evaluation; logging.
# 3. **Checkpoints** that a crash cannot destroy and that cannot run code when opened, and a
#    resumed run that is *bit for bit* the run that was never interrupted.
# 4. **The entropy floor**: on chapter 3's synthetic source no model can beat the entropy
#    rate $H = 1.6184$ nats/token. The book's model gets within 3 % of it in under half a
#    minute on a laptop CPU, and becomes the starting point of later chapters.
# 5. **Real text**: a BPE tokenizer (chapter 1) on the Python standard library's
#    docstrings, a model trained for a few seconds, and what it writes.
# 6. **Mixed precision and memory**: the 16-bit formats derived from their bit layouts,
#    float32 master weights, loss scaling, the 16 bytes per parameter of AdamW, the
#    activations a step saves (counted, and measured with autograd's hooks), and
#    activation checkpointing.
# 7. **Packing**: documents packed into fixed-length chunks without leaking across their
#    boundaries, and a batch order that resumes exactly.
# 8. **The z-loss**: PaLM's penalty on the softmax's normaliser, which the cross-entropy
#    leaves free.
#
# The code lives in `llmbook.training.train` (the loop), `llmbook.training.checkpoint` (saving and loading),
# `llmbook.training.pretrained` (the book's shipped models), `llmbook.training.memory`
# (mixed precision and memory) and `llmbook.training.packing` (packing and batch order).

# %%
import dataclasses
import functools
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import sympy as sp
import torch
from IPython.display import display

import llmbook.training.checkpoint as checkpoint_module
from llmbook.inference.sampling import sample_text
from llmbook.nbtools import Checks, save_figure, seed_everything, show_source
from llmbook.text.corpus import load_stdlib_docs
from llmbook.text.data import default_source
from llmbook.text.functional import cross_entropy
from llmbook.text.ngram import NGramModel
from llmbook.training.checkpoint import (
    atomic_save,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from llmbook.training.memory import (
    DynamicLossScaler,
    MasterWeightOptimizer,
    activation_elements_per_layer_symbolic,
    float_format_symbolic,
    half_ulp,
    mixed_precision_bytes_symbolic,
    saved_activation_bytes,
    scaler_trajectory,
    training_state_bytes,
)
from llmbook.training.optim import AdamW, gradient_vector
from llmbook.training.packing import ResumableBatches, pack_documents
from llmbook.training.pretrained import book_model
from llmbook.training.train import (
    TrainConfig,
    evaluate,
    get_batch,
    load_tokens,
    param_groups,
    save_tokens,
    train,
    train_step,
    z_loss,
)
from llmbook.transformer.model import TransformerConfig, TransformerLM

g = seed_everything(0)
torch.set_num_threads(1)  # the models here are small: one thread is as fast and steadier
workdir = Path(tempfile.mkdtemp())  # token files and checkpoints of this notebook
source = default_source()
H = source.entropy_rate()
print(f"synthetic source: V = {source.vocab_size}, order {source.order}, H = {H:.4f} nats/token")

# %% [markdown]
# ## 10.1 From a token array to a batch
#
# A language model is trained on one long sequence of token ids $x_0, x_1, \dots, x_{N-1}$
# (documents concatenated, in practice separated by an end-of-text token). Stored as
# `uint16` (ids below $2^{16} = 65{,}536$, enough for GPT-2's 50,257) it takes two bytes per
# token on disk; `np.memmap` maps the file into memory so that only the pages a batch
# touches are read, and a corpus larger than RAM is no problem. `save_tokens` writes such a
# file and `load_tokens` opens it:

# %%
train_ids, val_ids = source.train_val(1_000_000, 100_000)
path = save_tokens(workdir / "train.bin", train_ids)
tokens = load_tokens(path)
print(type(tokens).__name__, tokens.dtype, tokens.shape, f"{path.stat().st_size:,} bytes")
print("first ids:", tokens[:12].tolist())

# %% [markdown]
# A batch is $B$ windows of $T + 1$ consecutive tokens at random offsets. The first $T$
# tokens of a window are the input $x$ and the last $T$ the target $y$: position $t$ of
# the window is trained to predict the token at $t + 1$, so one window holds $T$ training
# examples, each with the whole prefix before it as context (the causal mask of chapter 4
# makes the model see only that prefix).

# %%
show_source(get_batch)

# %%
x, y = get_batch(tokens, batch_size=4, context_length=8, generator=torch.Generator().manual_seed(0))
print("x =", x[0].tolist(), "\ny =", y[0].tolist())
checks = Checks("batches")
checks.equal("shapes of x and y", [[4, 8], [4, 8]], [list(x.shape), list(y.shape)])
checks.equal("y[:, t] == x[:, t + 1]: mismatching entries", 0, int((x[:, 1:] != y[:, :-1]).sum()))
x2, y2 = get_batch(train_ids, 4, 8, generator=torch.Generator().manual_seed(0))
checks.equal("memmap vs in-memory tensor: mismatching entries of x and y", 0,
             int((x != x2).sum() + (y != y2).sum()))
checks

# %% [markdown]
# ## 10.2 The training step, and where it starts
#
# One step draws a batch, computes the logits $z = f_\theta(x)$ of shape $(B, T, V)$ and the
# mean cross-entropy over all $BT$ positions,
#
# $$ \mathcal L(\theta) = -\frac{1}{BT}\sum_{b,t} \log \operatorname{softmax}(z_{b,t})_{y_{b,t}}
#    \quad\text{nats/token}, $$
#
# back-propagates, clips the global gradient norm (chapter 9) and takes an AdamW step at
# the learning rate of the schedule. The loss is the book's own `cross_entropy`
# (chapter 3); in our measurement a whole training step with it is within a few percent
# of one with PyTorch's fused `F.cross_entropy`, because the model, not the loss,
# dominates the step.

# %%
show_source(train_step)

# %% [markdown]
# Weight decay is applied only to the parameters with two or more axes, the weight
# matrices and embedding tables, as in GPT-2 and nanoGPT: decaying a LayerNorm gain
# towards 0 or a bias towards 0 does not make the function simpler, it only fights the
# normalisation.

# %%
show_source(param_groups)

# %% [markdown]
# Where does training start? GPT-2's initialisation makes every logit small
# ($\lVert z\rVert \ll 1$), so the first prediction is close to uniform, $p \approx 1/V$, and
# the first loss close to $-\log(1/V) = \log V$ (expanding to second order, small logits
# add about half their variance across the vocabulary, a few hundredths of a nat).
# SymPy confirms the uniform value; the loss of a fresh model is printed beside it as a
# measurement (chapter 7 studies the loss at initialisation and its excess over $\log V$):

# %%
V_, j = sp.symbols("V j", positive=True, integer=True)
loss_uniform = -sp.log(sp.exp(0) / sp.Sum(sp.exp(0), (j, 1, V_)).doit())
assert sp.simplify(loss_uniform - sp.log(V_)) == 0
display(sp.Eq(sp.Symbol(r"\mathcal{L}_{z=0}"), sp.simplify(loss_uniform)))
model0 = TransformerLM(TransformerConfig.gpt2_style(vocab_size=16, d_model=64, n_layers=2,
                                                    n_heads=4, max_seq_len=16), generator=g)
loss0 = evaluate(model0, val_ids, 64, 16, 4)
print(f"fresh model: loss {loss0:.3f} nats/token, log V = {np.log(16):.3f}, excess {loss0 - np.log(16):+.3f}")

# %% [markdown]
# ## 10.3 The loop: schedule, evaluation, logging
#
# `train` runs `TrainConfig.steps` such steps. A `TrainConfig` is checked when it is
# built: a negative learning rate or a warmup longer than the schedule is an error at
# once, not a silent NaN an hour later.

# %%
for bad in (dict(lr=-1e-3), dict(steps=100, warmup_steps=200)):
    try:
        TrainConfig(**bad)
    except ValueError as err:
        print("ValueError:", err)

# %% [markdown]
# Every `eval_every` steps the loop measures the validation loss with `evaluate`: the
# mean cross-entropy on `eval_batches` batches of *held-out* tokens, in eval mode and
# without gradients. The same windows are scored each time (a generator with a fixed
# seed), so the validation curve moves only because the model does.

# %%
show_source(evaluate)

# %% [markdown]
# A short run on the synthetic source, printing a log line every 20 steps. The printed
# format is fixed (no timings), so these lines are the same on every run; `progress=True`
# adds a `tqdm` progress bar on stderr for interactive use.

# %%
small = TransformerConfig.gpt2_style(vocab_size=16, d_model=32, n_layers=1, n_heads=2, max_seq_len=16)
short = TrainConfig(steps=80, batch_size=32, context_length=16, lr=1e-2, min_lr=1e-3,
                    warmup_steps=8, eval_every=20, eval_batches=4, log_every=20,
                    checkpoint_every=20)
model_a = TransformerLM(small, generator=torch.Generator().manual_seed(1))
history_a = train(model_a, tokens, val_ids, short)

# %% [markdown]
# ## 10.4 Checkpoints: atomic, safe, exact
#
# A checkpoint must satisfy three demands.
#
# **It survives a crash.** `torch.save(obj, path)` truncates `path` first and then writes;
# a crash (power, out of disk, a killed job) in between leaves neither the old checkpoint
# nor the new one. `atomic_save` writes a temporary file in the same directory, flushes
# and `fsync`s it, and then renames it over the old file with `os.replace`, which the
# operating system performs atomically: at every instant `path` is the old file or the new
# one.

# %%
show_source(atomic_save)

# %% [markdown]
# **It does not run code.** A `.pt` file is a zip of tensors plus a pickle, and unpickling
# can call any function the file names. `read_checkpoint` loads with
# `torch.load(..., weights_only=True)`, PyTorch's restricted unpickler, which builds only
# tensors, numbers, strings and containers. A file that asks for anything else is refused
# and reported, as is a truncated or corrupt one, and a checkpoint of a different model
# is reported with the offending keys before anything is loaded.
#
# **It resumes exactly.** Besides the weights it holds AdamW's moments and step counts,
# the state of the batch sampler's random generator, PyTorch's global one, and the
# history; `train(..., resume=True)` restores all of it into *fresh* objects. We run the
# short training above again, "crash" it after 40 of its 80 steps, and resume from the
# checkpoint with a new model object whose random initial weights differ:

# %%
ckpt = workdir / "run.pt"
model_b = TransformerLM(small, generator=torch.Generator().manual_seed(1))
train(model_b, tokens, val_ids, short, checkpoint_path=ckpt, stop_at=40)
print("--- interrupted; resuming from", ckpt.name, "at step", read_checkpoint(ckpt)["step"])
model_c = TransformerLM(small, generator=torch.Generator().manual_seed(99))
history_c = train(model_c, tokens, val_ids, short, checkpoint_path=ckpt, resume=True)

# %% [markdown]
# Now the crash during a save: we make `torch.save` write half a file and fail, as a full
# disk would; then a truncated file, a file carrying a pickled call to `os.system`, and a
# checkpoint loaded into a model of another shape.

# %%
def crashing_save(obj, f, *args, **kwargs):
    f.write(b"PK\x03\x04 the first bytes of a zip file")
    raise OSError("disk full (simulated)")


before = ckpt.read_bytes()
checkpoint_module.torch.save, real_save = crashing_save, checkpoint_module.torch.save
try:
    save_checkpoint(ckpt, model_a, None, 999)
except OSError as err:
    print("save failed:", err)
finally:
    checkpoint_module.torch.save = real_save
intact = ckpt.read_bytes() == before
print("previous checkpoint intact:", intact, "| loads at step", load_checkpoint(ckpt, model_b))


# %%
class Payload:
    def __reduce__(self):  # unpickling this object would call os.system("echo pwned")
        import os
        return (os.system, ("echo pwned",))


(workdir / "truncated.pt").write_bytes(before[: len(before) // 3])
torch.save({"format": checkpoint_module.FORMAT, "extra": Payload()}, workdir / "evil.pt")
other = TransformerLM(TransformerConfig.gpt2_style(vocab_size=16, d_model=48, n_layers=1,
                                                   n_heads=2, max_seq_len=16))
errors = {}
for name, attempt in [("truncated", lambda: load_checkpoint(workdir / "truncated.pt", model_b)),
                      ("evil", lambda: load_checkpoint(workdir / "evil.pt", model_b)),
                      ("wrong model", lambda: load_checkpoint(ckpt, other))]:
    try:
        attempt()
    except ValueError as err:
        errors[name] = str(err).replace(str(workdir), "<dir>")
        print(f"{name}: ValueError: {errors[name][:150]}")

# %%
resume_gap = max((p - q).abs().max().item()
                 for p, q in zip(model_a.parameters(), model_c.parameters(), strict=True))
checks = Checks("checkpoints and exact resume")
checks.close("resumed parameters vs uninterrupted: max |difference|", 0.0, resume_gap, tol=0)
checks.equal("resumed training losses == uninterrupted", history_a.train_loss, history_c.train_loss)
checks.equal("resumed validation losses == uninterrupted", history_a.val_loss, history_c.val_loss)
checks.equal("crash mid-save: bytes of the checkpoint changed", 0,
             sum(a != b for a, b in zip(ckpt.read_bytes(), before, strict=True)))
checks.true("truncated file: ValueError naming it", "truncated.pt is corrupt" in errors["truncated"],
            got=errors["truncated"][:40])
checks.true("pickled os.system call refused", "refuses" in errors["evil"] and "system" in errors["evil"],
            got=errors["evil"][:40])
checks.true("wrong model: ValueError naming keys", "embed.weight" in errors["wrong model"],
            got=errors["wrong model"][:40])
checks

# %% [markdown]
# ## 10.5 Training to the entropy floor
#
# How good can a model of the synthetic source get? Chapter 3 computed its entropy rate
# $H = -\sum_c \pi(c) \sum_x P(x\mid c) \log P(x\mid c)$: the expected loss of the *true*
# conditional distribution, which is the lowest expected cross-entropy any model can have
# on a prediction that sees the whole past. Inside a training window the first
# predictions see less. The source has order $k = 2$, so position $t = 0$ predicts $x_1$
# from $x_0$ alone, with conditional entropy $H(X_1 \mid X_0)$, and every later position
# has both tokens it needs. The floor of the loss averaged over a window of length $T$ is
#
# $$ \mathcal L_T^{\min} = \frac{1}{T}\Bigl(H(X_1\mid X_0) + (T-1)\,H\Bigr)
#    \xrightarrow[T\to\infty]{} H , $$
#
# which is why the book measures the model on the predictions with full context,
# positions $t \ge k - 1$, and compares *those* with $H$. SymPy checks the limit and the
# size of the correction, and the conditional entropy comes from the stationary
# distribution $\pi(x_0, x_1)$ over contexts:

# %%
T_, H_s, H1_s = sp.symbols("T H H_1", positive=True)
floor_T = (H1_s + (T_ - 1) * H_s) / T_
assert sp.limit(floor_T, T_, sp.oo) == H_s
assert sp.simplify(floor_T - H_s - (H1_s - H_s) / T_) == 0
display(sp.Eq(sp.Symbol(r"\mathcal{L}_T^{\min}"), H_s + (H1_s - H_s) / T_))
pi = source.stationary.reshape(16, 16)  # pi[x0, x1]
entropy = lambda p: float(-(p[p > 0] * p[p > 0].log()).sum())  # noqa: E731
H1 = entropy(pi) - entropy(pi.sum(1))  # H(X0, X1) - H(X0)
print(f"H(X1 | X0) = {H1:.4f}, H = {H:.4f}, window floor for T = 16: "
      f"{(H1 + 15 * H) / 16:.4f} nats/token")

# %% [markdown]
# The book's model: GPT-2's block (chapter 7), 2 layers, $d = 64$, 4 heads, trained for
# 600 steps of $128 \times 16$ tokens with AdamW at a peak rate of $10^{-2}$.
# `book_model("synthetic")` loads its weights from `data/models/synthetic/`, where the
# book ships them, instead of training it on your machine. The reason is worth a
# paragraph. Training is deterministic on one machine, but not across machines: a CPU
# with wider vector registers, or another matrix-multiply kernel, adds the same numbers
# in another order, and the last bit of a sum changes. One step later the weights differ
# by $10^{-7}$; hundreds of steps amplify that into a model whose losses differ in the
# third decimal and whose samples differ outright. Shipping the weights gives every
# reader the same model. The training log that came with them:

# %%
model, info = book_model("synthetic")
hist = info["history"]
print(f"{model.num_parameters():,} parameters, {hist['tokens_seen']:,} training tokens")
for s, v in zip(hist["val_steps"], hist["val_loss"], strict=True):
    if s % 100 == 0:
        print(f"step {s:3d}  val {v:.4f}  ({v / H:.3f} H)")

# %% [markdown]
# For comparison, the classical answer of chapter 3: $n$-gram models fitted by counting
# on the same million training tokens. The trigram model has exactly the right context
# (two tokens) and is the strongest baseline a model of this source can have.

# %%
ngram_loss = {n: NGramModel(n, 16, add_k=0.1).fit(train_ids).cross_entropy(val_ids) for n in (1, 2, 3)}
for n, v in ngram_loss.items():
    print(f"{n}-gram: {v:.4f} nats/token ({v / H:.3f} H)")
full_context = evaluate(model, val_ids, 256, 16, 20, torch.Generator().manual_seed(1234),
                        first_position=1)
all_positions = evaluate(model, val_ids, 256, 16, 20, torch.Generator().manual_seed(1234))
print(f"transformer, full-context predictions: {full_context:.4f} nats/token "
      f"(gap to H: {100 * (full_context / H - 1):.2f} %)")
print(f"transformer, all 16 positions: {all_positions:.4f} (window floor {(H1 + 15 * H) / 16:.4f})")

# %% [markdown]
# The figure shows the run: the training loss of every step (each on a fresh batch, so
# noisy), the validation loss, the entropy floor and the $n$-gram baselines. The model
# passes the bigram level early, once attention has learned to look two tokens back, and
# then closes in on the floor as the learning rate decays.

# %%
fig, ax = plt.subplots(figsize=(7.5, 4.2))
ax.plot(hist["steps"], hist["train_loss"], color="tab:blue", alpha=0.35, lw=0.8, label="training loss (one batch)")
ax.plot(hist["val_steps"], hist["val_loss"], "o-", color="tab:blue", ms=3, label="validation loss (all positions)")
ax.axhline(H, color="black", lw=1.2, label=f"entropy rate H = {H:.4f}")
ax.axhline((H1 + 15 * H) / 16, color="black", lw=1, ls=":", label="window floor, T = 16")
for n, style in ((2, "--"), (3, "-.")):
    ax.axhline(ngram_loss[n], color="tab:orange", ls=style, lw=1, label=f"{n}-gram ({ngram_loss[n]:.3f})")
ax.set(xlabel="optimiser step", ylabel="cross-entropy (nats/token)", ylim=(1.5, 2.9),
       title="The book's model on the synthetic source: loss against the entropy floor")
ax.legend(fontsize="small", loc="upper right")
save_figure(fig, "10_training_synthetic_loss")
plt.show()

# %%
checks = Checks("the book's model against the entropy floor")
checks.true("full-context val loss within 3 % of H", full_context / H < 1.03, got=full_context / H)
checks.true("no better than H (up to sampling noise)", full_context > H - 0.01, got=full_context)
checks.true("all positions within 3 % of the window floor", all_positions / ((H1 + 15 * H) / 16) < 1.03,
            got=all_positions / ((H1 + 15 * H) / 16))
checks.true("transformer beats the bigram model", full_context < ngram_loss[2], got=full_context)
checks.close("shipped info agrees with a fresh evaluation", info["val_loss"], full_context, tol=1e-6)
checks

# %% [markdown]
# Training from the recipe is one argument away: `book_model("synthetic", retrain=True)`
# runs the same 600 steps here, in about half a minute (`make models` does it for both
# models and rewrites the shipped files). The model it gives is not the shipped one bit
# for bit unless your CPU is the one that made it, but it is as good: its validation loss
# lands within a fraction of a percent of the shipped one (the test suite asserts 0.5 %).
# That the run here repeats the recipe is checked on its first step: the loss of the
# initial weights on the first batch depends on the initialisation seed, the data and
# the batch sampler, and must agree with the shipped log to float32 round-off (we allow
# $10^{-5}$ relative, about a hundred float32 ulps), while the later steps are free to drift.

# %%
retrained, retrained_info = book_model("synthetic", retrain=True)
gap = retrained_info["val_loss"] / info["val_loss"] - 1
checks = Checks("retrained here against the shipped model")
checks.close("the same start: loss of the first step (initial weights, first batch), relative",
             info["history"]["train_loss"][0], retrained_info["history"]["train_loss"][0], tol=1e-5, rel=True)
checks.true("validation loss within 0.5 % of the shipped model's", abs(gap) < 0.005,
            got=f"{retrained_info['val_loss']:.2f} vs {info['val_loss']:.2f} nats/token")
checks

# %% [markdown]
# The remaining gap of about 2 % is the price of a finite run: the trigram table, which
# needs only counting, comes within 0.2 % of $H$ from the same data. A longer run closes
# more of it (the exercises measure how much).
#
# ## 10.6 Real text
#
# The same loop on English. `book_model("text")` is chapter 1's byte-level BPE tokenizer
# with $V = 1024$, trained on the 1.3 MB of standard-library docstrings, and a GPT-2-style
# model of 4 layers, $d = 192$, 6 heads and a context of $T = 128$ (2.0M parameters),
# trained on the first 90 % of the encoded corpus (about 470,000 tokens, 2.5 bytes of text
# per token) for 1000 steps of $32 \times 128$ tokens, and validated on the last 10 %.
# That run took about a quarter of an hour on 2 CPU cores, which is why its weights ship
# with the book (`make models` repeats it). Its log:

# %%
text_model, text_info = book_model("text")
tok = text_info["tokenizer"]
print(tok, f"| {text_model.num_parameters():,} parameters | {text_info['num_train_tokens']:,} "
      f"training and {text_info['num_val_tokens']:,} validation tokens")
th = text_info["history"]
for s, v in zip(th["val_steps"], th["val_loss"], strict=True):
    if s % 200 == 0:
        print(f"step {s:4d}  val {v:.3f} nats/token (perplexity {np.exp(v):6.1f})")
print(f"final: {text_info['val_loss']:.3f} nats/token = {text_info['val_bits_per_byte']:.3f} "
      f"bits per byte of held-out text")
train_bytes = len(load_stdlib_docs().encode("utf-8")) - text_info["val_bytes"]
print(f"bytes of text per token: {train_bytes / text_info['num_train_tokens']:.2f} (training), "
      f"{text_info['val_bytes'] / text_info['num_val_tokens']:.2f} (validation)")

# %%
text_recipe = text_info["recipe"]["train"]
recipe_tokens = text_recipe["steps"] * text_recipe["batch_size"] * text_recipe["context_length"]
last_train = np.array(th["train_loss"][-100:])  # one fresh training batch per step
gap = th["val_loss"][-1] - last_train.mean()
train_fall = np.mean(th["train_loss"][-300:-200]) - last_train.mean()  # steps 700-799 against 900-999
val_fall = th["val_loss"][-3] - th["val_loss"][-1]  # step 800 against step 1000
checks = Checks("the text model: epochs and the train-validation gap")
checks.equal("tokens the loop counted = steps x B x T from the recipe", th["tokens_seen"], recipe_tokens)
checks.true("validation minus training loss > 10 x the spread of one batch's loss",
            gap > 10 * last_train.std(), got=f"{gap:.2f} vs {last_train.std():.2f}")
print(f"{text_recipe['steps']} steps x {text_recipe['batch_size']} x {text_recipe['context_length']} tokens "
      f"= {recipe_tokens / text_info['num_train_tokens']:.1f} passes over the {text_info['num_train_tokens']:,} "
      f"training tokens")
print(f"last 100 steps: training loss {last_train.mean():.2f} +- {last_train.std():.2f} (one batch); "
      f"validation at step 1000: {th['val_loss'][-1]:.2f}; gap {gap:.2f} nats")
print(f"over the last 200 steps: training loss -{train_fall:.3f}, validation loss -{val_fall:.3f} "
      f"(ratio {train_fall / val_fall:.1f})")
checks  # the table comes after the lines printed above

# %%
fig, ax = plt.subplots(figsize=(7, 3.8))
ax.plot(th["steps"], th["train_loss"], color="tab:green", alpha=0.4, lw=0.8, label="training loss (one batch)")
ax.plot(th["val_steps"], th["val_loss"], "o-", color="tab:green", ms=3, label="validation loss")
ax.axhline(np.log(1024), color="gray", ls="--", lw=1, label="uniform guess, log 1024")
ax.set(xlabel="optimiser step", ylabel="cross-entropy (nats/token)",
       title="A 2M-parameter model on the standard library's docstrings")
ax.legend(fontsize="small")
save_figure(fig, "10_training_text_loss")
plt.show()

# %% [markdown]
# The validation loss falls from $\log 1024 = 6.93$ to 3.67 nats per token. The held-out
# text has 2.57 bytes per token, so per byte that is $3.67 / (2.57 \ln 2) \approx 2.06$
# bits: a unit that does not depend on the tokenizer, so it compares models with different
# vocabularies (a loss per *token* does not: a larger vocabulary packs more text into a
# token and so more surprise).
#
# The model is over-fitted. The recipe's 1000 steps of $32 \times 128$ tokens pass over the
# 470,885 training tokens 8.7 times, and by the end the training loss (2.26 on the last
# 100 batches) lies far below the validation loss (3.64): a gap of 1.38 nats, more than ten
# times the spread of the loss from one training batch to the next, so it is not noise. The
# model has begun to memorise the training docstrings: over the last 200 steps it lowered
# its training loss 7.6 times as much as its validation loss. The validation loss was
# still falling at step 1000, so stopping there is not early stopping in the strict
# sense; a model that generalised better would need more data, not more steps
# (chapter 11 measures the trade-off). Samples with a fixed generator (greedy
# decoding, then temperature 0.8), drawn by `sample_text` from `llmbook.inference.sampling`,
# the decoding module of Part IV that chapter 12 studies:

# %%
for prompt in ("Return the ", "The default value is"):
    greedy = sample_text(text_model, tok, prompt, 24, temperature=0)
    sampled = sample_text(text_model, tok, prompt, 24, temperature=0.8,
                          generator=torch.Generator().manual_seed(0))
    print(f"greedy : {greedy!r}\nsampled: {sampled!r}")

# %% [markdown]
# The samples read as docstrings: the model has learned the corpus's layout (blank lines,
# `###` headers), its vocabulary and stock phrases ("The default value is used to",
# "specified by the pickle data"), and how sentences of the standard library begin. It has
# not learned what they mean: greedy decoding soon repeats itself, and sampled phrases
# drift from one topic to another. Chapter 11 asks how the loss falls as the model and the
# data grow; chapter 12 compares the decoding rules on this model.
#
# ## 10.7 Mixed precision and the memory budget of training
#
# Everything above ran in float32, 4 bytes a number. Large models are trained with most
# of the arithmetic in 16 bits, which halves the memory of activations and runs faster on
# the matrix units built for it. This section asks what the 16-bit formats can hold,
# what breaks when a model is trained in them and how it is repaired (Micikevicius et al.,
# 2018, "Mixed Precision Training"), and then where the memory of a training step goes:
# weights, gradients, optimiser state and activations. The code is in
# `llmbook.training.memory`.
#
# ### Range and precision from the bit layout
#
# A binary float with $e$ exponent bits and $m$ stored mantissa bits holds, in its normal
# range, $(-1)^s\, 2^{E - \text{bias}} (1 + M/2^m)$ with bias $= 2^{e-1} - 1$, exponent field
# $E \in \{1, \dots, 2^e - 2\}$ (the all-zeros code is kept for zero and the subnormals, the
# all-ones code for inf and NaN) and mantissa field $M \in \{0, \dots, 2^m - 1\}$. Below
# the normals come the subnormals $2^{1-\text{bias}} M/2^m$. Substituting the extreme fields
# gives the largest number, the smallest normal and subnormal ones and the spacing
# $\epsilon$ just above 1; SymPy does it, and `torch.finfo` (an independent source) must
# agree:

# %%
show_source(float_format_symbolic)

# %%
formats = {"float32": (8, 23, torch.float32), "float16": (5, 10, torch.float16),
           "bfloat16": (8, 7, torch.bfloat16)}
checks = Checks("float formats: derived from the bit layout vs torch.finfo")
print(f"{'format':9s}{'e':>3s}{'m':>4s}{'max':>11s}{'min normal':>12s}{'min subnormal':>15s}"
      f"{'eps':>10s}{'digits':>8s}")
for name, (e_bits, m_bits, dtype) in formats.items():
    fmt, info = float_format_symbolic(e_bits, m_bits), torch.finfo(dtype)
    print(f"{name:9s}{e_bits:3d}{m_bits:4d}{float(fmt['max']):11.3g}{float(fmt['min_normal']):12.3g}"
          f"{float(fmt['min_subnormal']):15.3g}{float(fmt['eps']):10.3g}{float(fmt['digits']):8.2f}")
    checks.close(f"{name}: max", info.max, float(fmt["max"]), tol=0, rel=True)
    checks.close(f"{name}: smallest normal", info.tiny, float(fmt["min_normal"]), tol=0, rel=True)
    checks.close(f"{name}: eps", info.eps, float(fmt["eps"]), tol=0, rel=True)
    checks.equal(f"{name}: smallest subnormal is representable, half of it rounds to 0",
                 [True, True], [torch.tensor(float(fmt["min_subnormal"]), dtype=dtype).item() > 0,
                                torch.tensor(float(fmt["min_subnormal"]) / 2, dtype=dtype).item() == 0])
checks

# %% [markdown]
# The two 16-bit formats split their bits differently. **float16** keeps 10 mantissa bits
# (3.3 decimal digits) but only 5 exponent bits: nothing above 65504, and below
# $6 \times 10^{-5}$ it loses precision until $6 \times 10^{-8}$, under which everything is 0.
# **bfloat16** keeps float32's 8 exponent bits, and with them its whole range, but only 7
# mantissa bits: 2.4 decimal digits, $\epsilon = 2^{-7} \approx 0.008$.
#
# ### Why the master weights stay in float32
#
# An update $\Delta$ added to a weight $w$ is lost when $|\Delta|$ is below half the spacing
# of the format at $w$ (round to nearest). In bfloat16 that threshold is $2^{-8} \approx 0.004$
# at $w = 1$, while a typical step of AdamW moves a weight by about the learning rate,
# $10^{-3}$ to $10^{-4}$. A thousand updates of $10^{-3}$ each, applied to $w = 1$ in each
# format:

# %%
show_source(half_ulp)

# %%
update_results = {}
for dtype in (torch.bfloat16, torch.float16, torch.float32):
    w = torch.tensor(1.0, dtype=dtype)
    for _ in range(1000):
        w = w + torch.tensor(1e-3, dtype=dtype)
    update_results[dtype] = w.item()
    print(f"{str(dtype):15s} w = {w.item():.4f}   half an ulp at 1: {half_ulp(torch.tensor(1.0), dtype).item():.3g}")
checks = Checks("small updates in 16 bits")
checks.close("bfloat16: every update rounds away, w stays 1", 1.0, update_results[torch.bfloat16], tol=0)
checks.close("float32: w reaches 2", 2.0, update_results[torch.float32], tol=1e-4)
checks

# %% [markdown]
# bfloat16 never moves. float16 moves, but every sum is rounded to its grid (spacing
# $2^{-10}$ between 1 and 2), so it ends at 1.977 rather than 2; from $w = 4$ on, where half
# its spacing exceeds $10^{-3}$, it would stop as well. float32 arrives. Mixed precision therefore keeps a
# float32 **master copy** of every weight: the forward and backward passes use the 16-bit
# copy, the optimiser updates the master copy, and the 16-bit copy is re-cast from it
# after each step. `MasterWeightOptimizer` does this around any optimiser:

# %%
show_source(MasterWeightOptimizer.step)

# %% [markdown]
# ### A bfloat16 run with `torch.autocast`, and what stays in float32
#
# PyTorch's automatic mixed precision casts per operation: inside
# `torch.autocast(device_type="cpu", dtype=torch.bfloat16)` a matrix product casts its
# inputs to bfloat16 and returns bfloat16, while the parameters remain float32 tensors (the
# master weights), so their gradients and AdamW's moments are float32 too. Which other
# operations it promotes to float32 depends on the device. On one batch, with the model
# trained in section 10.3:

# %%
xa, ya = get_batch(tokens, 32, 16, generator=torch.Generator().manual_seed(0))
with torch.no_grad(), torch.autocast(device_type="cpu", dtype=torch.bfloat16):
    z16 = model_a(xa)  # (32, 16, 16)
    autocast_out = {"logits (matrix products)": z16, "softmax": torch.softmax(z16, -1),
                    "log_softmax": torch.log_softmax(z16, -1),
                    "F.cross_entropy": torch.nn.functional.cross_entropy(z16.reshape(-1, 16), ya.reshape(-1))}
for name, out in autocast_out.items():
    print(f"{name:26s} {out.dtype}")

# %% [markdown]
# The CPU's autocast keeps `softmax` and `log_softmax` in bfloat16 and promotes only
# PyTorch's fused `F.cross_entropy`. The book's `cross_entropy` is built from
# `log_softmax`, so it would compute the loss in bfloat16; `train_step(...,
# autocast_dtype=torch.bfloat16)` casts the logits to float32 first. What that buys, for
# these same bfloat16 logits (the float64 loss of them is the reference):

# %%
loss_ref = cross_entropy(z16.double(), ya).item()  # exact up to float64
loss_f32 = cross_entropy(z16.float(), ya)
loss_b16 = cross_entropy(z16, ya)
rows_b16 = torch.softmax(z16, -1).double().sum(-1)  # (32, 16) bf16 probabilities, summed exactly
print(f"loss from bf16 logits: float64 {loss_ref:.5f}, float32 {loss_f32.item():.5f}, "
      f"all in bfloat16 {loss_b16.item():.5f}")
print(f"bfloat16 softmax rows sum to 1 +- {(rows_b16 - 1).abs().max().item():.0e} "
      f"(float32: +- {(torch.softmax(z16.float(), -1).double().sum(-1) - 1).abs().max().item():.0e})")
checks = Checks("the loss under autocast")
checks.close("book's float32 loss vs torch's F.cross_entropy under autocast", autocast_out["F.cross_entropy"],
             loss_f32, tol=1e-6, rel=True)
checks.close("float32 loss vs float64 (a few float32 ulps)", loss_ref, loss_f32, tol=1e-6, rel=True)
checks.true("bfloat16 loss is off by more than float32's", abs(loss_b16.item() - loss_ref) > 100 * abs(loss_f32.item() - loss_ref),
            got=f"{abs(loss_b16.item() - loss_ref):.0e} nats")
checks

# %% [markdown]
# In bfloat16 the loss itself is a number with 8 significant bits: near 2.5 its spacing is
# $2^{-6} \approx 0.016$ nats, more than the differences between the runs this chapter
# compares, and the softmax probabilities no longer sum to 1 (measured above). Now the same
# 80 steps as section 10.3, from the same initial weights and on the same batches, with the
# forward pass under bfloat16 autocast (validation in float32):

# %%
model_bf = TransformerLM(small, generator=torch.Generator().manual_seed(1))
history_bf = train(model_bf, tokens, val_ids, dataclasses.replace(short, log_every=None),
                   autocast_dtype=torch.bfloat16)
for s_, va_, vb_ in zip(history_a.val_steps, history_a.val_loss, history_bf.val_loss, strict=True):
    print(f"step {s_:2d}  val float32 {va_:.3f}  bfloat16 autocast {vb_:.3f}")
curve_gap = np.abs(np.array(history_a.train_loss) - np.array(history_bf.train_loss))
loss_resolution = half_ulp(torch.tensor(2.5), torch.bfloat16).item()  # half a bf16 spacing at the loss
checks = Checks("80 steps: float32 against bfloat16 autocast")
checks.true("every training loss within half a bfloat16 spacing (at 2.5) of float32's",
            0 < curve_gap.max() < loss_resolution, got=f"max {curve_gap.max():.3f} < {loss_resolution:.4f}")
checks

# %% [markdown]
# The two runs agree: at no step do their training losses differ by as much as half a
# bfloat16 spacing at the loss, the bound set before the run (the differences are not 0:
# the two runs round differently at every step). The rounding of the logits averages out
# over the $32 \times 16$ positions of a batch. Autocast kept the weights in float32, and
# that matters: an update is lost in a bfloat16 weight when it is
# below half the format's spacing at the weight (`half_ulp`). We take one more AdamW step
# of the model of section 10.4 from its checkpoint (weights and moments of step 80), at the
# final rate $10^{-3}$, and ask of every one of its updates $\Delta$ whether a bfloat16
# copy of the weight would keep it; `half_ulp` predicts, and adding $\Delta$ in bfloat16 (torch's
# rounding) decides:

# %%
model_d = TransformerLM(small)
opt_d = AdamW(param_groups(model_d, short.weight_decay), lr=short.min_lr, betas=short.betas)
load_checkpoint(ckpt, model_d, opt_d)
w_before = torch.cat([q.detach().reshape(-1).clone() for q in model_d.parameters()])
train_step(model_d, opt_d, xa, ya, short.min_lr, short.grad_clip)
delta_w = torch.cat([q.detach().reshape(-1) for q in model_d.parameters()]) - w_before
w16 = w_before.to(torch.bfloat16)
keep = (w16 != 0) & (delta_w != 0)
w16, delta_k = w16[keep], delta_w[keep]
predicted_lost = delta_k.double().abs() < half_ulp(w16.float(), torch.bfloat16)
rounded_lost = (w16.float() + delta_k).to(torch.bfloat16) == w16
at_power_of_two = torch.log2(w16.float().abs()).frac() == 0  # spacing below is half the spacing above
lost_f32 = (w_before[keep] + delta_k == w_before[keep])
print(f"{int(keep.sum()):,} updates, median |Delta| = {delta_k.abs().median().item():.1e}: "
      f"{100 * rounded_lost.double().mean().item():.1f} % lost in bfloat16 weights, "
      f"{int(lost_f32.sum())} in float32")
checks = Checks("updates a bfloat16 weight cannot hold")
checks.equal("half_ulp's prediction vs torch's rounding: disagreements (w not a power of 2)", 0,
             int((predicted_lost != rounded_lost)[~at_power_of_two].sum()))
checks

# %% [markdown]
# About a third of the step (31.1 % of its updates, a measurement) would vanish in
# bfloat16 weights, and which ones `half_ulp` predicts exactly; float32 master weights
# keep every update. This is the division of labour of mixed precision: 16-bit matrix products
# (most of the FLOPs), float32 for what accumulates or normalises, the weights, the
# optimiser's moments, the loss and its softmax.
#
# %% [markdown]
# ### Loss scaling: gradients that underflow float16
#
# float16 has the precision but not the range. Take the gradients of the fresh small
# model of section 10.3 on one batch, computed in float64, and ask what float16 would make
# of them: how many become 0, how many land among the subnormals (fewer than 10
# significant bits), how many overflow to inf. Multiplying the loss by $S$ multiplies every
# gradient by $S$ (the chain rule is linear), so the same question for $S g$ tells what
# **loss scaling** buys:

# %%
model_g = TransformerLM(small, generator=torch.Generator().manual_seed(1)).double()
xg, yg = get_batch(tokens, 32, 16, generator=torch.Generator().manual_seed(0))
torch.nn.functional.cross_entropy(model_g(xg).reshape(-1, 16), yg.reshape(-1)).backward()
grads = gradient_vector(model_g)
grads = grads[grads != 0]
print(f"{grads.numel():,} non-zero gradient entries, |g| from {grads.abs().min().item():.1e} "
      f"to {grads.abs().max().item():.3f}")
print(f"{'loss scale S':>13s}{'-> 0':>8s}{'subnormal':>11s}{'-> inf':>8s}")
underflow = {}
for log_s in (0, 8, 16, 20):
    g16 = (grads * 2.0**log_s).half()
    zero, sub = (g16 == 0).double().mean().item(), ((g16.abs() < 2**-14) & (g16 != 0)).double().mean().item()
    underflow[log_s] = (zero, sub, torch.isinf(g16).double().mean().item())
    print(f"{'2^' + str(log_s):>13s}{100 * zero:7.2f}%{100 * sub:10.2f}%{100 * underflow[log_s][2]:7.2f}%")

# %% [markdown]
# At $S = 1$ almost a fifth of the gradient entries are subnormal in float16 and some are
# flushed to 0; at $S = 2^8$ almost none are, at $2^{16}$ none, and at $2^{20}$ the largest
# gradients overflow to inf. (The few entries that stay 0 at every scale are below
# $10^{-13}$: round-off in quantities whose exact gradient is zero.) The right scale
# depends on the model and changes as training goes, so it is chosen **dynamically**:
# start high; when a step's gradients hold an inf or NaN, skip that step and halve $S$;
# after a run of good steps, double it. The scaled gradients are divided by $S$ in float32
# before the optimiser sees them.

# %%
show_source(DynamicLossScaler.update)

# %%
g_max = grads.abs().max().item()
trajectory = scaler_trajectory(DynamicLossScaler(init_scale=2.0**20, growth_interval=3), [g_max] * 10)
print("step  scale  stepped")
for t, (scale, stepped) in enumerate(trajectory):
    print(f"{t:4d}  2^{int(np.log2(scale)):<4d} {stepped}")

# %% [markdown]
# Driven with this model's largest gradient, the scaler starts at $2^{20}$, overflows,
# skips the step and halves to $2^{19}$, which fits; three good steps later it tries
# $2^{20}$ again, overflows again and backs off: it keeps $S$ within a factor 2 of the
# largest scale that does not overflow. Chapter 22 compares it with PyTorch's
# `torch.amp.GradScaler`, step for step. bfloat16, with float32's range, needs no loss
# scaling, which is one reason it is widely used for training large models.
#
# ### Sixteen bytes per parameter
#
# With AdamW and mixed precision, a step holds for each parameter its 16-bit weight and
# gradient, the float32 master weight, and AdamW's two float32 moments $m$ and $v$:

# %%
per_param = mixed_precision_bytes_symbolic()
display(sp.Eq(sp.Symbol("bytes/parameter"),
              sp.Add(*[sp.Symbol(k.replace(" ", r"\ ")) for k in per_param if k not in ("total", "K (optimizer states)")]),
              evaluate=False),
        sp.Eq(sp.Symbol("bytes/parameter"), per_param["total"]))

# %% [markdown]
# Measured on the small model: cast it to bfloat16, wrap the book's `AdamW` in
# `MasterWeightOptimizer`, take one step, and add up the bytes of every tensor the step
# left behind (`training_state_bytes`):

# %%
show_source(training_state_bytes)

# %%
model_mp = TransformerLM(small, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
opt_mp = MasterWeightOptimizer(model_mp.parameters(), lambda ps: AdamW(ps, lr=1e-3))
xb, yb = get_batch(tokens, 8, 16, generator=torch.Generator().manual_seed(0))
torch.nn.functional.cross_entropy(model_mp(xb).float().reshape(-1, 16), yb.reshape(-1)).backward()
opt_mp.step()
state_bytes = training_state_bytes(model_mp, opt_mp.optimizer, opt_mp.masters)
n_params, n_tensors = model_mp.num_parameters(), len(list(model_mp.parameters()))
for k, v in state_bytes.items():
    print(f"{k:24s}{v:10,d} bytes{v / n_params:8.3f} per parameter")
checks = Checks(f"the state of one mixed-precision AdamW step, N = {n_params:,}")
checks.equal("weights + gradients + master + m + v = 16 N",
             int(per_param["total"]) * n_params, state_bytes["total"] - state_bytes["optimizer (scalars)"])
checks.equal("AdamW's step counters: one 4-byte scalar per parameter tensor",
             4 * n_tensors, state_bytes["optimizer (scalars)"])
checks

# %% [markdown]
# Exactly $16N$, plus one float32 step counter per parameter tensor. For a 7B-parameter
# model that is 112 GB before a single activation is stored: more than one accelerator
# holds, which is what chapter 22's sharding (ZeRO) is for. Mixed precision does not
# shrink this part (float32 training holds $4 + 4 + 4 + 4 = 16$ bytes too); it shrinks the
# activations.
#
# ### Activation memory, counted and measured
#
# The backward pass needs tensors from the forward pass: a matrix product $Y = XW$ needs
# $X$ to form $\partial \mathcal L/\partial W = X^\top \partial \mathcal L/\partial Y$, a
# softmax needs its output, a GELU its input. Autograd keeps each such tensor until the
# backward pass has used it. `torch.autograd.graph.saved_tensors_hooks` sees every one of
# them, and `saved_activation_bytes` adds up their distinct storages (a tensor read by
# three projections is stored once; parameters are not activations):

# %%
show_source(saved_activation_bytes)

# %% [markdown]
# Going through the book's GPT-2 block operation by operation (chapter 7; unfused
# attention, no dropout) gives what it must save. With $b$ the batch, $s$ the sequence
# length, $h = d_{model}$, $a$ heads and $f = d_{ff}$, in elements:

# %%
act = activation_elements_per_layer_symbolic()
b_s, s_s, h_s, a_s, f_s = sp.symbols("b s h a f", positive=True, integer=True)
for k, v in act.items():
    display(sp.Eq(sp.Symbol(k.replace(" ", r"\ ")), v, evaluate=False))
act_bytes = 4 * act["floats"] + act["mask bytes"]  # float32 activations, 1-byte booleans

# %% [markdown]
# Each term is the accounting of one operation: the book's LayerNorm is written in
# elementary operations (chapter 6), so it saves $x - \mu$ twice (it computes it twice)
# and $\hat x$; its tanh GELU saves four intermediate tensors of width $f$; the attention
# weights are saved twice (by the softmax, and after masking by the product with $V$).
# The measurement checks the accounting on blocks of several non-square shapes:

# %%
checks = Checks("saved activations of one block: formula vs saved_tensors_hooks (bytes)")
print(f"{'b':>3s}{'s':>4s}{'h':>4s}{'a':>3s}{'f':>5s}{'formula':>10s}{'measured':>10s}{'fused attn':>12s}")
for b_, s_, h_, a_ in ((2, 10, 24, 3), (3, 16, 32, 4), (1, 7, 40, 5), (4, 13, 16, 2)):
    blk_model = TransformerLM(TransformerConfig.gpt2_style(vocab_size=16, d_model=h_, n_layers=1,
                                                           n_heads=a_, max_seq_len=16), generator=g)
    blk_model.set_fused_attention(False)
    x_in = torch.randn(b_, s_, h_, generator=g, requires_grad=True)
    run_block = functools.partial(blk_model.blocks[0], x_in)
    got = saved_activation_bytes(run_block, exclude=blk_model.parameters())
    blk_model.set_fused_attention(True)
    fused = saved_activation_bytes(run_block, exclude=blk_model.parameters())
    expected = int(act_bytes.subs({b_s: b_, s_s: s_, h_s: h_, a_s: a_, f_s: 4 * h_}))
    print(f"{b_:3d}{s_:4d}{h_:4d}{a_:3d}{4 * h_:5d}{expected:10,d}{got['bytes']:10,d}{fused['bytes']:12,d}")
    checks.equal(f"b={b_}, s={s_}, h={h_}, a={a_}", expected, got["bytes"])
checks

# %% [markdown]
# The formula is exact. With $f = 4h$ it is $4\,bsh\,(32 + 2as/h) + 8bs$ bytes plus the
# masks: the term in $s^2$ is the attention matrix, which PyTorch's fused attention
# (the last column) does not store. Korthikanti et al. (2022, "Reducing Activation
# Recomputation in Large Transformer Models", section 4.1) count $sbh\,(34 + 5as/h)$ bytes
# for their 16-bit block with dropout; the coefficients differ from ours because the
# implementations save different tensors (a fused LayerNorm or GELU kernel saves only its
# input), but the shape of the law is the same: linear in $b$, in $h$ and in the depth,
# and quadratic in $s$ unless attention is fused. For GPT-2 small ($h = 768$, $a = 12$,
# $s = 1024$) the book's block would save $4 \cdot 1024 \cdot 768\,(32 + 32) \approx 201$ MB
# per sequence per layer, 2.4 GB per sequence for 12 layers: activations, not weights,
# are what fill memory at large batch.
#
# ### Activation checkpointing
#
# **Activation checkpointing** (Chen et al., 2016, "Training Deep Nets with Sublinear
# Memory Cost") trades compute for that memory: keep only each block's input, and during
# the backward pass run the block's forward again to regenerate what it would have saved.
# `torch.utils.checkpoint.checkpoint(block, x)` does it for one block. On a 4-layer model
# in float64 we measure the saved bytes, compare the gradients with the plain run and
# count the FLOPs with `FlopCounterMode`:

# %%
from torch.utils.checkpoint import checkpoint  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

deep = TransformerLM(TransformerConfig.gpt2_style(vocab_size=16, d_model=32, n_layers=4, n_heads=4,
                                                  max_seq_len=16), generator=g).double()
deep.set_fused_attention(False)
ids_c = torch.randint(0, 16, (8, 16), generator=g)


def deep_loss(use_checkpoint):
    x = torch.nn.functional.embedding(ids_c, deep.embed.weight) + deep.pos_embed.weight[:16]
    for block in deep.blocks:
        x = checkpoint(block, x, use_reentrant=False) if use_checkpoint else block(x)
    logits = torch.nn.functional.linear(deep.final_norm(x), deep.embed.weight)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, 16), ids_c.reshape(-1))


ckpt_results = {}
for use_checkpoint in (False, True):
    saved = saved_activation_bytes(functools.partial(deep_loss, use_checkpoint), exclude=deep.parameters())
    deep.zero_grad()
    with FlopCounterMode(display=False) as counter:
        deep_loss(use_checkpoint).backward()
    ckpt_results[use_checkpoint] = (saved["bytes"], counter.get_total_flops(),
                                    [p.grad.clone() for p in deep.parameters()])
with FlopCounterMode(display=False) as counter:
    x_ = torch.nn.functional.embedding(ids_c, deep.embed.weight)
    for block in deep.blocks:
        x_ = block(x_)
blocks_forward = counter.get_total_flops()
for use_checkpoint, (nbytes, flops, _) in ckpt_results.items():
    print(f"checkpointing {str(use_checkpoint):5s}: {nbytes:9,d} bytes saved, {flops:11,d} FLOPs")
print(f"forward of the 4 blocks alone: {blocks_forward:,d} FLOPs")
grad_err = max((a - b).abs().max().item() for a, b in zip(ckpt_results[False][2], ckpt_results[True][2],
                                                          strict=True))
checks = Checks("activation checkpointing, float64")
checks.true("saved bytes fall by more than 10x", ckpt_results[True][0] * 10 < ckpt_results[False][0],
            got=f"{ckpt_results[False][0] / ckpt_results[True][0]:.1f}x")
checks.close("gradients equal to the plain run", 0.0, grad_err, tol=1e-12)
b_c, s_c, h_c, L_c = 8, 16, 32, 4  # batch, sequence, width, layers; f = 4h
block_flops = 2 * b_c * s_c * h_c * (3 * h_c + h_c + 2 * 4 * h_c) + 2 * 2 * b_c * s_c**2 * h_c  # QKV, out, MLP; QK^T, AV
last_projection = 2 * b_c * s_c * 4 * h_c * h_c
checks.equal("forward FLOPs of the blocks: L (24 bsh^2 + 4 bs^2 h)", L_c * block_flops, blocks_forward)
checks.equal("extra FLOPs = forward of the blocks without their last projection", L_c * (block_flops - last_projection),
             ckpt_results[True][1] - ckpt_results[False][1])
checks

# %% [markdown]
# The saved activations fall from 4.9 MB to 0.28 MB (what is left is each block's input,
# the embedding, the final norm and the output layer), the gradients are the same, and the
# price is a second forward pass through the blocks, so training costs about $4/3$ of its
# FLOPs instead of $1$ (forward 1, backward 2, recomputation 1). The recomputation here is
# $1 - 8bsh^2/(24bsh^2 + 4bs^2h) = 0.69$ of a forward, not 1 (the last check counts it
# exactly): PyTorch's default (non-reentrant) checkpoint stops recomputing a block as
# soon as it has regenerated every tensor the backward needs, and nothing needs the output
# of a block's last projection, the MLP's second matrix. Real systems checkpoint selectively:
# Korthikanti et al. (2022) recompute only the attention's $s^2$ part ("selective
# activation recomputation"), which is much of the memory and little of the compute.

# %% [markdown]
# ## 10.8 Packing documents, and a batch order that resumes
#
# The windows of section 10.1 are cut from one long stream, so a window may start in one
# document and end in the next. For pretraining on a web-sized corpus that is harmless, and
# it is what GPT-2 and most pretraining runs did. When documents are short and unrelated
# (chat examples, instructions, separate files), two things go wrong: a token attends to
# the end of an unrelated document, and the loss asks the model to predict a document's
# first token from the previous one. Padding each document to the longest avoids both but
# spends compute on padding. *Packing* keeps the stream's density and removes the leak
# (Krell et al., 2021): each token carries the id of its *segment* (the part of one document
# in one chunk), attention is causal **and** within a segment, positions restart at each
# segment, and the last token of a segment has no target. (Chapter 17 packs fine-tuning
# examples by the same rule, whole and with a loss mask on the responses.) Three documents,
# a separator token 1, chunks of 6:

# %%
show_source(pack_documents)

# %%
packed = pack_documents([[5, 6, 7], [8, 9], [10, 11, 12, 13, 14, 15, 16]], chunk_len=6, sep_id=1)
for name in ("ids", "segments", "positions", "targets"):
    print(f"{name:9s}", getattr(packed, name).tolist())
print("attention mask of chunk 1 (1 = may attend):")
print(packed.attention_mask()[1, 0].int().numpy())

# %% [markdown]
# Chunk 1 holds the end of the second document and the start of the third: its mask is
# two causal triangles, not one. The claim to check is that a packed chunk computes, for
# every segment, exactly what the segment computes alone, and that the plain causal mask
# does not. A small Llama-style model in float64, on documents of uneven length:

# %%
tiny = TransformerLM(TransformerConfig.llama_style(vocab_size=32, d_model=24, n_layers=2,
                                                    n_heads=4, max_seq_len=16),
                     generator=torch.Generator().manual_seed(0)).double().eval()
docs = [[3, 4, 5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]]
packed = pack_documents(docs, chunk_len=10, sep_id=1)
with torch.no_grad():
    together = tiny(packed.ids, positions=packed.positions, mask=packed.attention_mask())
    apart = [tiny(packed.ids[packed.segments == s][None])[0]
             for s in range(int(packed.segments.max()) + 1)]
    leaky = tiny(packed.ids)
gap = max(float((together[packed.segments == s] - a).abs().max()) for s, a in enumerate(apart))
checks = Checks("packing")
checks.true("packed = each segment alone, every segment (float64, max |diff| < 1e-12)", gap < 1e-12)
checks.true("the plain causal mask changes the logits of later segments (max |diff| > 1e-3)",
            bool((leaky - together).abs().max() > 1e-3))
checks.equal("targets kept (tokens minus one per segment)",
             int(packed.segments.ge(0).sum()) - len(apart), int((packed.targets != -100).sum()))
print(f"{len(docs)} documents, {int(packed.segments.ge(0).sum())} tokens with separators, "
      f"{packed.ids.shape[0]} chunks of {packed.ids.shape[1]}, "
      f"{packed.padding_fraction:.0%} padding")
checks

# %% [markdown]
# Section 10.4 made a resumed run equal to the uninterrupted one by saving the random
# number generators. A data order drawn from the generator that also drives dropout or
# sampling ties the two together; `ResumableBatches` instead fixes each epoch's order by the
# seed and the epoch number alone (a fresh permutation per epoch), and its state is two
# integers. A run stopped after 7 batches and restarted from `state_dict()` sees the same
# batches as a run never stopped:

# %%
straight = ResumableBatches(num_items=packed.ids.shape[0] * 4, batch_size=3, seed=0)
expected = [next(straight).tolist() for _ in range(12)]
first = ResumableBatches(num_items=packed.ids.shape[0] * 4, batch_size=3, seed=0)
for _ in range(7):
    next(first)
state = first.state_dict()
resumed = ResumableBatches(num_items=packed.ids.shape[0] * 4, batch_size=3, seed=0)
resumed.load_state_dict(state)
print("state:", state)
checks = Checks("resumable batch order")
checks.equal("batches 8-12 after a restart", expected[7:], [next(resumed).tolist() for _ in range(5)])
checks.equal("each epoch visits every item once", list(range(12)),
             sorted(i for b in expected[:4] for i in b))
checks

# %% [markdown]
# ## 10.9 The z-loss: keeping the softmax's normaliser near 1
#
# The cross-entropy does not change when the same constant $c$ is added to every logit of
# a position: $\log\operatorname{softmax}(z + c) = z - \log Z(z)$ with
# $\log Z(z) = \log\sum_j e^{z_j}$, and $c$ cancels. Nothing in the loss then stops the
# logits from drifting together to large values, where a 16-bit softmax loses precision
# (section 10.7). PaLM (Chowdhery et al., 2022, section 5) adds an auxiliary
# **z-loss**, $w\,(\log Z)^2$ averaged over positions, with $w = 10^{-4}$, which pulls
# $\log Z$ towards 0 and so makes $\log\operatorname{softmax}(z) \approx z$. SymPy shows
# the shift invariance of the cross-entropy, the lack of it in the z-loss, and the gradient
# $\partial (\log Z)^2/\partial z_i = 2 \log Z\,\operatorname{softmax}(z)_i$ (for $V = 3$):

# %%
zs = sp.symbols("z_1:4", real=True)
c_sym = sp.Symbol("c", real=True)
log_Z = sp.log(sum(sp.exp(zi) for zi in zs))
ce_first = log_Z - zs[0]  # cross-entropy when the target is token 1
shifted = {zi: zi + c_sym for zi in zs}
assert sp.simplify(sp.expand_log(ce_first.subs(shifted), force=True) - ce_first) == 0  # invariant
assert sp.simplify(sp.diff(log_Z.subs(shifted), c_sym) - 1) == 0  # log Z moves with c
softmax_sym = [sp.exp(zi) / sum(sp.exp(zj) for zj in zs) for zi in zs]
for zi, p_i in zip(zs, softmax_sym, strict=True):
    assert sp.simplify(sp.diff(log_Z**2, zi) - 2 * log_Z * p_i) == 0
display(sp.Eq(sp.Derivative(sp.Symbol(r"(\log Z)^2"), zs[0]), 2 * sp.Symbol(r"\log Z") * softmax_sym[0]))

# %% [markdown]
# `z_loss` in `llmbook.training.train` computes it (skipping positions whose target is
# ignored, as the cross-entropy does), and `train_step(..., z_loss_weight=w)` adds
# $w$ times it to the loss it differentiates, while the loss it returns and logs stays the
# cross-entropy. The same penalty on a router's logits is ST-MoE's router z-loss
# (Zoph et al., 2022), which `transformers` implements for the Switch Transformer
# (`router_z_loss_func`): our peer.
# The gradient is checked against the closed form just derived:

# %%
show_source(z_loss)

# %%
from transformers.models.switch_transformers.modeling_switch_transformers import router_z_loss_func  # noqa: E402

z_logits = (3 * torch.randn(4, 16, 16, generator=torch.Generator().manual_seed(3), dtype=torch.float64)).requires_grad_(True)
z_loss(z_logits).backward()
closed_form = 2 * torch.logsumexp(z_logits, -1, keepdim=True) * torch.softmax(z_logits, -1) / (4 * 16)
checks = Checks("z-loss")
checks.close("z_loss vs transformers' router_z_loss_func (float64)", router_z_loss_func(z_logits.detach()),
             z_loss(z_logits.detach()), tol=1e-13, rel=True)
checks.close("autograd gradient vs 2 log Z softmax(z) / n", closed_form, z_logits.grad, tol=1e-14)
checks

# %% [markdown]
# What it does to a run: the 80 steps of section 10.3 again, from the same initial weights
# and on the same batches, with $w = 10^{-2}$ (a hundred times PaLM's weight, so that a run
# this short shows the effect), and $\log Z$ measured on held-out windows:

# %%
model_z = TransformerLM(small, generator=torch.Generator().manual_seed(1))
history_z = train(model_z, tokens, val_ids, dataclasses.replace(short, log_every=None), z_loss_weight=1e-2)
xz, _ = get_batch(val_ids, 64, 16, generator=torch.Generator().manual_seed(5))
with torch.no_grad():
    log_z_plain, log_z_z = torch.logsumexp(model_a(xz), -1), torch.logsumexp(model_z(xz), -1)
for name, lz, hist_ in (("without z-loss", log_z_plain, history_a), ("z-loss w = 1e-2", log_z_z, history_z)):
    print(f"{name:16s} mean log Z {lz.mean().item():.2f}, mean (log Z)^2 {lz.pow(2).mean().item():.2f}, "
          f"validation loss {hist_.val_loss[-1]:.3f}")
checks = Checks("the z-loss pulls log Z towards 0")
checks.true("mean (log Z)^2 on held-out windows: smaller with the z-loss",
            log_z_z.pow(2).mean().item() < log_z_plain.pow(2).mean().item(),
            got=f"{log_z_z.pow(2).mean().item():.2f} vs {log_z_plain.pow(2).mean().item():.2f}")
checks

# %% [markdown]
# A fresh model starts at $\log Z \approx \log 16 = 2.77$ (its logits are near zero), and
# plain training leaves it near that value; with the z-loss the normaliser moves towards 1 while the
# validation loss stays where it was (a measurement on one short run): the penalty acts
# on the one direction the cross-entropy cannot see.

# %% [markdown]
# ## Summary
#
# * A corpus is a flat `uint16` file opened with `np.memmap`; a batch is $B$ random
#   windows of $T + 1$ tokens, with $y$ the input shifted by one, so a window holds $T$
#   next-token examples.
# * A step: logits $(B, T, V)$, mean cross-entropy in nats, backward, global-norm
#   clipping, AdamW (decay on matrices only) at the warmup + cosine rate. A fresh model
#   starts near $\log V$.
# * Checkpoints are written atomically (temporary file, `fsync`, `os.replace`), loaded
#   with `weights_only=True`, checked against the model's keys and shapes, and hold the
#   RNG states, so a resumed run equals the uninterrupted one bit for bit.
# * The shipped text model passes 8.7 times over its training tokens and is over-fitted:
#   training loss 2.26 against 3.64 on held-out text.
# * The book's synthetic model comes within 3 % of the entropy rate on predictions with
#   full context; the average over a window has the higher floor
#   $H + (H(X_1\mid X_0) - H)/T$.
# * Range and precision follow from the bit layout: float16 (5 exponent, 10 mantissa bits)
#   is precise but overflows above 65504 and underflows below $6 \times 10^{-8}$; bfloat16
#   (8, 7) has float32's range and 2-3 digits. Updates below half an ulp vanish, so the
#   optimiser steps float32 master weights; float16 needs dynamic loss scaling.
#   `torch.autocast` in bfloat16 runs the matrix products in 16 bits and leaves the weights
#   in float32; on the CPU it keeps `log_softmax` in bfloat16, so the loss is computed from
#   float32 logits. An 80-step bfloat16 run follows the float32 one to a few hundredths
#   of a nat.
# * Mixed-precision AdamW holds $2 + 2 + 4 + 4 + 4 = 16$ bytes per parameter (measured:
#   exactly $16N$ plus the step counters). Activations grow with batch, width, depth and
#   (unfused attention) $s^2$: for the book's GPT-2 block $4bsh(32 + 2as/h)$ bytes plus
#   small terms, measured exactly with `saved_tensors_hooks`. Checkpointing keeps only the
#   block inputs, for about one extra forward pass of the blocks.
# * Packing fills chunks with whole documents and separators; a causal mask within each
#   segment, positions that restart, and no target across a boundary make a packed chunk
#   compute exactly what its segments compute alone. A batch order fixed by (seed, epoch)
#   resumes from two integers.
# * The cross-entropy ignores a common shift of a position's logits; PaLM's z-loss
#   $w(\log Z)^2$ fixes it, with gradient $2w\log Z\,\operatorname{softmax}(z)$, and pulls
#   $\log Z$ towards 0 without costing validation loss in our short run.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/10_training.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 10` writes a stub
# of every function, `llmbook grade 10` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_10.py` runs
# the same checks on the reference.
#
# 1. (★) **The token budget.** Write `tokens_and_epochs(steps, batch_size, context_length,
#    num_tokens)` returning the number of training tokens a run processes and how many
#    passes over the data that is. Evaluate it for both book models; which one sees its
#    data more than once?
# 2. (★★) **The window floor for any order.** For a source of order $k$, the prediction at
#    position $t < k - 1$ sees $t + 1$ tokens and has conditional entropy
#    $H(X_{t+1} \mid X_0, \dots, X_t) = H(X_0..X_{t+1}) - H(X_0..X_t)$, computable from the
#    stationary distribution over contexts. Write `window_floor(source, T)` returning the
#    floor of the window-averaged loss, check it equals the formula above for the book's
#    source, tends to $H$ as $T$ grows, and is never beaten by the book's model.
# 3. (★★) **Gradient accumulation.** When a batch does not fit in memory it is split into
#    $m$ micro-batches whose gradients are summed before the step. Write
#    `accumulated_train_step(model, optimizer, x, y, lr, micro_batches, grad_clip)` and
#    show it gives the same parameters as `train_step` on the whole batch (in float64, to
#    $10^{-10}$: the sums are the same, their rounding is not, and Adam's division by
#    $\sqrt{\hat v}$ magnifies float32 round-off in tiny gradients). Which scaling of each
#    micro-batch's loss makes this true?
# 4. (★★★) **Where is the gap?** Write `per_position_loss(model, tokens, context_length,
#    num_windows, generator)` returning the model's mean loss at each position
#    $t = 0..T-1$ of a window, and `per_position_floor(source, T)` returning the exact
#    floor at each position (exercise 2's conditional entropies). For the book's model,
#    show that position 0 is within 2 % of $H(X_1 \mid X_0)$, that no position beats its
#    floor by more than sampling noise, and find the position with the largest excess.
# 5. (★★) **Korthikanti's count.** Korthikanti et al. (2022, section 4.1) count the
#    activation memory of a 16-bit layer with dropout (1-byte masks after the softmax,
#    the attention output and the MLP) whose LayerNorm and GELU are fused kernels that
#    save only their inputs, with $d_{ff} = 4h$. Write `korthikanti_activation_bytes()`
#    returning their per-operation table in SymPy, show that it sums to
#    $sbh\,(34 + 5as/h)$ bytes, and compare it with the book's block of section 10.7 in
#    16 bits at GPT-2 small's shape: which terms make the difference?
# 6. (★★) **The z-loss's gradient and the shift that zeroes it.** Write
#    `z_loss_gradient(logits)` returning $2\log Z\,\operatorname{softmax}(z)/n$ and check it
#    against autograd on non-square logits; show that summed over the vocabulary it is
#    $2\log Z/n$ per position (the gradient a bias shared by all logits would receive). Write
#    `logit_shift_for_zero_z(logits)` returning the shift $c = -\log Z$ per position, and
#    show that the shifted logits have z-loss 0 and the same cross-entropy.

# %%
from llmbook.workbench import grade

grade("10", globals())
