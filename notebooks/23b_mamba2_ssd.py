# %% [markdown]
# # 23b Mamba-2: state-space duality and recurrent decoding
#
# Chapter 23 ran Mamba's selective scan as a recurrence, one step or one scan round at a
# time. Mamba-2 (Dao & Gu, 2024, "Transformers are SSMs: Generalized Models and Efficient
# Algorithms Through Structured State Space Duality") restricts the state matrix to a scalar
# per head, and in exchange the same model can be written as a *masked matrix product*, like
# attention, which runs on matrix-multiply hardware. This chapter:
#
# 1. **derives** the duality: the scalar-decay recurrence equals $y = (L\circ CB^\top)\,x$ with
#    a 1-semiseparable mask $L_{ts} = \prod_{k=s+1}^{t} a_k$ (SymPy, symbolically, for small $T$);
# 2. **implements** the chunked algorithm, quadratic inside a chunk and recurrent across
#    chunks, and checks it against the step-by-step recurrence and the SSD reference path of
#    Hugging Face `transformers`;
# 3. **verifies** a whole Mamba-2 language model against `Mamba2ForCausalLM` with the same
#    weights;
# 4. **measures** recurrent decoding: a state of constant size against a KV cache that
#    grows with every token.

# %%
import matplotlib.pyplot as plt
import sympy as sp
import torch
import transformers
from IPython.display import display
from transformers import Mamba2Config as HFMamba2Config
from transformers import Mamba2ForCausalLM
from transformers.models.mamba2.modeling_mamba2 import mamba2_chunk_scan

from llmbook.inference.kvcache import KVCache, kv_cache_bytes
from llmbook.nbtools import Checks, best_time, save_figure, seed_everything, show_source
from llmbook.scale.mamba2 import Mamba2Config, Mamba2LM, Mamba2Mixer, mamba2_from_hf, state_bytes
from llmbook.scale.ssd import semiseparable_mask, ssd_chunked, ssd_quadratic, ssd_recurrent
from llmbook.transformer.hf_loading import randomize_parameters_
from llmbook.transformer.model import TransformerConfig, TransformerLM

g = seed_everything(0)
torch.set_num_threads(1)
f64 = torch.float64
transformers.logging.set_verbosity_error()

# %% [markdown]
# ## 23b.1 The recurrence is a masked matrix
#
# Mamba's $A$ is diagonal, one decay per channel and state. Mamba-2 makes it a scalar times
# the identity per head: $\bar A_t = a_t I$ with $a_t = e^{\Delta_t A}\in(0, 1]$. A head's state
# is then a $P\times N$ matrix (head width $P$, state size $N$), and
#
# $$ H_t = a_t H_{t-1} + x_t B_t^\top, \qquad y_t = H_t C_t , $$
#
# with $x_t$ already multiplied by $\Delta_t$. Unrolling from $H_{-1} = 0$,
# $H_t = \sum_{s\le t}\big(\prod_{k=s+1}^{t} a_k\big) x_s B_s^\top$, so
#
# $$ y_t = \sum_{s\le t} \underbrace{\Big(\prod_{k=s+1}^{t} a_k\Big)}_{L_{ts}} (C_t^\top B_s)\, x_s,
#    \qquad y = (L\circ CB^\top)\,x . $$
#
# This is causal attention with the softmax replaced by a mask $L$ that decays with distance
# (Dao & Gu's "state space duality"). $L$ is **1-semiseparable**: every block below the
# diagonal has rank one, since $L_{ts} = c_t / c_s$ with $c_t = \prod_{k\le t} a_k$. SymPy builds
# both sides for $T = 4$ positions and a state of size $N = 2$ (one head, $P = 1$), every
# $a_t$, $B_t$, $C_t$, $x_t$ a separate symbol:

# %%
T_, N_ = 4, 2
a_s = sp.symbols("a_0:4", positive=True)
x_s = sp.symbols("x_0:4")
B_s = sp.Matrix(T_, N_, lambda t, n: sp.Symbol(f"B_{t}{n}"))
C_s = sp.Matrix(T_, N_, lambda t, n: sp.Symbol(f"C_{t}{n}"))
L_s = sp.Matrix(T_, T_, lambda t, s: sp.prod(a_s[s + 1:t + 1]) if s <= t else 0)
y_dual = (L_s.multiply_elementwise(C_s * B_s.T)) * sp.Matrix(x_s)

h, y_rec = sp.zeros(1, N_), []
for t in range(T_):
    h = a_s[t] * h + x_s[t] * B_s[t, :]  # H_t = a_t H_{t-1} + x_t B_t^T
    y_rec.append((h * C_s[t, :].T)[0])
assert all(sp.expand(y_dual[t] - y_rec[t]) == 0 for t in range(T_))
assert sp.simplify(L_s[2:, :2].det()) == 0  # the 2x2 block below the diagonal: rank 1
display(L_s)

# %% [markdown]
# The package computes $\log L$ as *segment sums* of $\log a$, by a masked cumulative sum
# (a difference of two cumulative sums would cancel catastrophically when the sums are large),
# and offers the recurrence and the dual form:

# %%
show_source(ssd_quadratic)

# %% [markdown]
# In float64, with random inputs ($T = 50$, 4 heads of width $P = 3$, $N = 5$, the heads in two
# groups sharing $B$ and $C$, as Mamba-2's multi-value heads do), the two forms agree to
# round-off, and the mask matches the SymPy formula:

# %%
def ssd_inputs(batch, T, H, P, G, N, dtype=f64, gen=g):
    return (torch.randn(batch, T, H, P, generator=gen, dtype=dtype), -torch.rand(batch, T, H, generator=gen, dtype=dtype),
            torch.randn(batch, T, G, N, generator=gen, dtype=dtype), torch.randn(batch, T, G, N, generator=gen, dtype=dtype))


x, log_a, B, C = ssd_inputs(2, 50, 4, 3, 2, 5)
y_rec, state_rec = ssd_recurrent(x, log_a, B, C)
a_num = torch.exp(log_a[0, :4, 0])
L_sym = torch.tensor(sp.matrix2numpy(L_s.subs(dict(zip(a_s, a_num.tolist(), strict=True))), float))
checks = Checks("state-space duality: recurrence = (L o C B^T) x")
checks.close("mask L (T = 4) vs SymPy", L_sym, semiseparable_mask(log_a[0, :4, 0]), tol=1e-15)
checks.close("dual form vs recurrence (T = 50)", y_rec, ssd_quadratic(x, log_a, B, C), tol=1e-13)
checks

# %% [markdown]
# ## 23b.2 The chunked algorithm
#
# The recurrence does $T$ small sequential steps; the dual form does $O(T^2)$ work. Dao &
# Gu's algorithm (their section 6) cuts the sequence into chunks of $Q$ positions and uses
# each form where it is good: the mask $L$ splits into $Q\times Q$ blocks, the diagonal
# blocks are small quadratic problems (matrix multiplies, all chunks at once), and every
# block below the diagonal has rank one, so it factors through the state at the chunk
# boundary. Four steps:
#
# 1. inside each chunk, $y^{\text{diag}} = (L_c\circ CB^\top)x$;
# 2. the state each chunk would leave from a zero start, $R_c = \sum_{l}\big(\prod_{k>l}a_k\big) x_l B_l^\top$;
# 3. across chunks, the recurrence $S_{c+1} = \big(\prod_{k\in c}a_k\big) S_c + R_c$: $T/Q$ steps, not $T$;
# 4. the start state's contribution, $y^{\text{off}}_l = \big(\prod_{k\le l}a_k\big) S_c C_l$.
#
# The figure shows the mask for $T = 24$, $Q = 6$: the diagonal blocks are what step 1
# computes; the rest is never formed.

# %%
fig, ax = plt.subplots(figsize=(4.4, 4))
L_demo = semiseparable_mask(-0.15 * torch.rand(24, generator=g, dtype=f64))
ax.imshow(torch.log10(L_demo.clamp(min=1e-3)), cmap="viridis")
for edge in range(6, 24, 6):
    ax.axhline(edge - 0.5, color="w", lw=1)
    ax.axvline(edge - 0.5, color="w", lw=1)
ax.set(xlabel="source position s", ylabel="output position t", title="log10 L, chunks of Q = 6")
save_figure(fig, "23b_mamba2_ssd_mask")
plt.show()

# %%
show_source(ssd_chunked)

# %% [markdown]
# Checks: against the recurrence for a chunk size that divides $T$, one that does not (the
# last chunk is zero-padded) and $Q = 1$ (pure recurrence) and $Q = T$ (pure dual form); the
# final states too. Then against Hugging Face's `mamba2_chunk_scan`, the pure-PyTorch SSD path
# `Mamba2Mixer` runs without the CUDA kernels; it takes $\Delta$ and $A$ separately and
# computes in float32.

# %%
checks = Checks("chunked SSD vs the recurrence and vs transformers")
for Q in (1, 7, 10, 50):
    y_c, state_c = ssd_chunked(x, log_a, B, C, Q)
    checks.close(f"y, Q = {Q} vs recurrence", y_rec, y_c, tol=1e-13)
checks.close("final state, Q = 7 vs recurrence", state_rec, ssd_chunked(x, log_a, B, C, 7)[1], tol=1e-13)
x32, _, B32, C32 = ssd_inputs(2, 37, 6, 4, 3, 5, dtype=torch.float32)
dt32, A32 = torch.rand(2, 37, 6, generator=g), -torch.rand(6, generator=g) - 0.1
ref, ref_state = mamba2_chunk_scan(x32, dt32, A32, B32, C32, chunk_size=8, return_final_states=True)
y32, state32 = ssd_chunked(x32 * dt32[..., None], dt32 * A32, B32, C32, 8)
ssd_vs_hf = checks.close("y vs transformers mamba2_chunk_scan (float32)", ref, y32, tol=1e-5)
checks.close("final state vs transformers", ref_state, state32, tol=1e-5)
checks

# %% [markdown]
# ## 23b.3 The Mamba-2 block against Hugging Face
#
# A Mamba-2 block (Dao & Gu, section 7) differs from Mamba's in three ways. All of the
# block's data-dependent inputs, the gate $z$, the signal $x$, $B$, $C$ and one $\Delta$ per
# head, come from *one* input projection, in parallel (Mamba computed $\Delta, B, C$ from
# $x$); $x$, $B$ and $C$ share the short causal convolution; and an RMSNorm of the gated
# output $y\odot\operatorname{SiLU}(z)$ is added before the output projection, for stability.
# The SSD runs per head with $\log a_t = \Delta_t A$, input $\Delta_t x_t$ and a skip $Dx_t$.
# The convolution is chapter 23's `CausalDepthwiseConv1d`.

# %%
show_source(Mamba2Mixer.forward)

# %% [markdown]
# The peer is `Mamba2ForCausalLM` built from a tiny random configuration ($d = 24$, 6 heads of
# width 8, 2 groups, $N = 5$, a convolution of width 3, chunks of 4, two layers, $V = 50$),
# every parameter perturbed, the sequence 11 tokens long so that the last chunk is partial.
# The book's model loads its state dict, and runs once with the chunked algorithm and once
# with the plain recurrence.

# %%
torch.manual_seed(0)
hf_cfg = HFMamba2Config(vocab_size=50, hidden_size=24, state_size=5, num_hidden_layers=2, expand=2, head_dim=8,
                        num_heads=6, n_groups=2, conv_kernel=3, chunk_size=4, residual_in_fp32=False,
                        tie_word_embeddings=False)
hf_mamba2 = randomize_parameters_(Mamba2ForCausalLM(hf_cfg), 0.1, torch.Generator().manual_seed(1)).eval()
ids = torch.randint(0, 50, (2, 11), generator=g)
checks = Checks("the book's Mamba-2 against transformers.Mamba2ForCausalLM")
model_errors = {}
for dtype in (torch.float32, torch.float64):
    hf = hf_mamba2.to(dtype)
    for method in ("chunked", "recurrent"):
        ours = mamba2_from_hf(hf, method).eval()
        with torch.no_grad():
            model_errors[method, dtype] = checks.close(
                f"logits (2 × 11 × 50), {method}, {dtype}", hf(ids, use_cache=False).logits.double(),
                ours(ids).double(), tol=1e-4)
checks

# %% tags=["nbval-ignore-output"]
print(f"SSD kernel vs mamba2_chunk_scan: {ssd_vs_hf:.1e}; "
      + ", ".join(f"{m} {str(d)[6:]}: {e:.1e}" for (m, d), e in model_errors.items()))

# %% [markdown]
# The agreement is at float32 round-off (the cell above prints the errors on this machine;
# the tolerance is $10^{-4}$), in float64 too: the reference path casts the SSD inputs and
# the gated norm to float32 whatever the model's dtype.
#
# ## 23b.4 Recurrent decoding with a constant-size state
#
# To generate, a Mamba-2 layer needs only (i) the last $K - 1$ inputs of its convolution,
# $(K-1)(E + 2GN)$ numbers, and (ii) the SSM state, $H\,P\,N$ numbers; a new token updates
# both in $O(1)$ (`Mamba2Mixer.step`: one `ssd_step`). A transformer's KV cache instead
# keeps $2\,T\,H_{kv}\,d_{\text{head}}$ numbers per layer after $T$ tokens (chapter 13).
# First, decoding one token at a time from the state the prompt leaves must give the logits
# of the full forward pass, and those of Hugging Face's own cached decoding:

# %%
ids_long = torch.randint(0, 50, (2, 16), generator=g)
hf = hf_mamba2.to(torch.float32)
ours = mamba2_from_hf(hf).eval()
with torch.no_grad():
    full = ours(ids_long)
    logits, state = ours.prefill(ids_long[:, :5])
    out = hf(ids_long[:, :5], use_cache=True)
    steps, hf_steps, sizes = [], [], set()
    for t in range(5, 16):
        lt, state = ours.step(ids_long[:, t], state)
        steps.append(lt)
        sizes.add(state_bytes(state))
        out = hf(ids_long[:, t:t + 1], cache=out.cache, use_cache=True)
        hf_steps.append(out.logits[:, -1])
checks = Checks("recurrent decoding")
checks.close("11 decoded steps vs full forward", full[:, 5:], torch.stack(steps, 1), tol=1e-5)
checks.close("11 decoded steps vs transformers' cached decoding", torch.stack(hf_steps, 1), torch.stack(steps, 1),
             tol=1e-5)
checks.equal("distinct state sizes over 11 steps", 1, len(sizes))
checks

# %% [markdown]
# Now the bytes, for a model of a realistic shape: a Mamba-2 of width $d = 768$ and 24 layers
# ($E = 1536$, 24 heads of width 64, $N = 128$, one group, $K = 4$: the default head width and
# state size of Dao & Gu's code), against a Llama-style transformer of the same width and depth with 12 heads of 64
# (multi-head attention), both in float32, batch 1. The Mamba-2 state is read off a real state
# tensor; the KV cache off an allocated `KVCache` and chapter 13's formula.

# %%
m2_cfg = Mamba2Config(vocab_size=256, d_model=768, n_layers=24, d_state=128, expand=2, head_dim=64, n_groups=1,
                      d_conv=4, chunk_size=256)
tf_cfg = TransformerConfig.llama_style(vocab_size=256, d_model=768, n_layers=24, n_heads=12, max_seq_len=8192)
m2_state = [Mamba2Mixer(m2_cfg).init_state(1)] * m2_cfg.n_layers  # every layer's state has this shape
m2_bytes = state_bytes(m2_state)
per_layer = (m2_cfg.d_conv - 1) * m2_cfg.conv_dim + m2_cfg.n_heads * m2_cfg.head_dim * m2_cfg.d_state
checks = Checks("state bytes")
checks.equal("Mamba-2 state: tensors vs formula 4 L ((K-1)(E+2GN) + HPN)", 4 * m2_cfg.n_layers * per_layer, m2_bytes)
checks.equal("KV cache at T = 1024: KVCache vs formula", kv_cache_bytes(tf_cfg, 1, 1024),
             KVCache(tf_cfg.n_layers, 1, tf_cfg.n_kv_heads, 1024, tf_cfg.d_head).num_bytes())
checks

# %%
print(f"{'T':>6} {'KV cache (MiB)':>15} {'Mamba-2 state (MiB)':>20}")
for T in (1, 64, 256, 1024, 4096, 8192):
    print(f"{T:>6} {kv_cache_bytes(tf_cfg, 1, T) / 2**20:>15.3f} {m2_bytes / 2**20:>20.3f}")
breakeven = next(T for T in range(1, 10**5) if kv_cache_bytes(tf_cfg, 1, T) > m2_bytes)
print(f"Mamba-2 state per layer: conv {(m2_cfg.d_conv - 1) * m2_cfg.conv_dim:,} + SSM "
      f"{m2_cfg.n_heads * m2_cfg.head_dim * m2_cfg.d_state:,} numbers; KV cache per token "
      f"{kv_cache_bytes(tf_cfg, 1, 1) // 1024} KiB; the KV cache is larger from T = {breakeven} on; "
      f"ratio at T = 8192: {kv_cache_bytes(tf_cfg, 1, 8192) / m2_bytes:.1f}")

# %% [markdown]
# The Mamba-2 state is fixed, almost all of it the SSM state $HPN$; the KV cache grows by a
# fixed amount per token, passes the state after little more than a hundred tokens, and is
# dozens of times larger at the longest context printed.
#
# Time per token: two small models of the same family, width 256 and 2 layers (a Mamba-2 with
# 8 heads of 64 and $N = 128$; a transformer with 4 heads of 64), randomly initialised. Each
# reads a prompt of $T$ tokens in one call (the Mamba-2 with the chunked algorithm, the
# transformer into a `KVCache`) and then the time of *one* more decoding step is taken, best
# of five (the cache is truncated back after each). Times vary by machine and load, so this
# cell and its figure are not compared by the tests.

# %% tags=["nbval-ignore-output"]
small_m2 = Mamba2LM(Mamba2Config(vocab_size=256, d_model=256, n_layers=2, d_state=128, head_dim=64,
                                 chunk_size=128)).eval()
small_tf = TransformerLM(TransformerConfig.llama_style(vocab_size=256, d_model=256, n_layers=2, n_heads=4,
                                                       max_seq_len=4097), generator=torch.Generator().manual_seed(0)).eval()
prompt_lengths = [16, 128, 512, 2048, 4096]
tok = torch.randint(0, 256, (1, max(prompt_lengths) + 1), generator=torch.Generator().manual_seed(1))
ms = {"Mamba-2 step": [], "transformer + KV cache": []}
with torch.no_grad():
    for T in prompt_lengths:
        st = small_m2.prefill(tok[:, :T])[1]
        ms["Mamba-2 step"].append(1e3 * best_time(lambda st=st, T=T: small_m2.step(tok[:, T], st), repeats=5)[0])
        cache = KVCache.for_model(small_tf, 1, T + 1)
        small_tf(tok[:, :T], cache=cache)

        def one_step(cache=cache, T=T):
            small_tf(tok[:, T:T + 1], cache=cache)
            cache.truncate(T)
        ms["transformer + KV cache"].append(1e3 * best_time(one_step, repeats=5)[0])
for name, v in ms.items():
    print(f"{name:24s} ms/token at T = {prompt_lengths}: " + ", ".join(f"{t:.2f}" for t in v))

# %% tags=["nbval-ignore-output"]
fig, ax = plt.subplots(figsize=(6.4, 3.8))
for name, v in ms.items():
    ax.loglog(prompt_lengths, v, "o-", label=name)
ax.set(xlabel="tokens already seen T", ylabel="time of the next step (ms, best of 5)",
       title="One decoding step, d = 256, 2 layers, float32, CPU (1 thread)")
ax.legend()
save_figure(fig, "23b_mamba2_ssd_time_per_token")
plt.show()

# %% [markdown]
# The Mamba-2 step costs the same whatever $T$ is. The cached transformer step grows with
# $T$: its weight matrices cost the same at every position, but its attention reads all
# $T$ cached keys and values, and at a few thousand tokens that reading is the larger part.
#
# ## Summary
#
# * With a scalar decay per head, the SSM $H_t = a_tH_{t-1} + x_tB_t^\top$, $y_t = H_tC_t$ is
#   exactly the masked product $y = (L\circ CB^\top)x$, $L_{ts} = \prod_{k=s+1}^t a_k$: a
#   1-semiseparable mask in place of attention's softmax (SymPy for $T = 4$; float64 to round-off).
# * The chunked algorithm computes the diagonal blocks of $L$ as small quadratic problems and
#   passes a state between chunks: $T/Q$ sequential steps instead of $T$; it equals the
#   recurrence in float64 and Hugging Face's reference `mamba2_chunk_scan` in float32.
# * The book's Mamba-2 gives the logits of `Mamba2ForCausalLM` with the same weights, chunked
#   or recurrent, within $10^{-4}$ (at float32 round-off).
# * Decoding needs a state of fixed size, $L\big((K-1)(E+2GN) + HPN\big)$ numbers, where a KV
#   cache grows by $2LH_{kv}d_{\text{head}}$ numbers per token.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/23b_mamba2_ssd.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 23b` writes a stub
# of every function, `llmbook grade 23b` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_23b.py` runs
# the same checks on the reference.
#
# 1. (★) **No decay is linear attention.** Set $a_t = 1$ for all $t$. Show that the SSD is then
#    causal linear attention without the normaliser, $y = \operatorname{tril}(CB^\top)x$ (chapter
#    23.1 with $\phi(q) = C$, $\phi(k) = B$, $v = x$), and check it numerically against
#    `ssd_quadratic`.
# 2. (★★) **Streaming prefill.** A long prompt need not be processed in one call: split it into
#    pieces, run `ssd_chunked` on each from the state the previous piece left
#    (`initial_state`), and show that the outputs and the final state equal one call on the
#    whole prompt, for piece lengths that are and are not multiples of the chunk size.
# 3. (★★) **Break-even length.** Write the number of bytes of a Mamba-2 state and of a KV cache
#    as functions of the model's sizes, and find the shortest context for which the KV cache
#    is larger, for the two models of section 23b.4 and for the same transformer with
#    grouped-query attention (4 key-value heads).

# %%
from llmbook.workbench import grade

grade("23b", globals())
