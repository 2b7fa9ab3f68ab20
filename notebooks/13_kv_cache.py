# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 13 The KV cache and attention variants
#
# Chapter 12 introduced the key/value cache as the thing that makes generation cheap:
# the keys and values of a causal model's past positions never change, so they are kept
# instead of recomputed. This chapter measures what that buys and what it costs, and then
# studies the attention variants that exist mostly to make the cache smaller.
#
# 1. **Correctness**: cached generation equals recomputation, token for token.
# 2. **Compute**: the FLOPs per generated token, $O(T)$ with the cache against $O(T^2)$
#    without, derived in SymPy, counted by PyTorch's FLOP counter, and timed.
# 3. **Memory**: $2 L B T H_{kv} d_h$ elements, checked against the cache's tensors and
#    evaluated for published models.
# 4. **MQA and GQA**: fewer key/value heads, a cache $H / H_{kv}$ times smaller.
# 5. **Multi-head latent attention** (DeepSeek-V2): cache a low-rank latent instead of
#    keys and values, and attend in latent space by absorbing weights; the decoupled RoPE
#    key, and why absorbed MLA is multi-query attention with one wide shared key; checked
#    against Hugging Face's DeepSeek-V3 attention.
# 6. **Sliding-window attention** (Longformer, Mistral): a rolling cache of fixed size.
# 7. **The roofline**: arithmetic intensity, derived in SymPy, shows why decoding is
#    memory-bound and prefill compute-bound; measured on this CPU, and on the book's real
#    model, SmolLM2-135M-Instruct, whose cache (section 13.3) and decoding speed in float32
#    and 4 bits are measured against their roofline.
#
# The code is in `llmbook.inference.kvcache` (chapter 12), `llmbook.inference.attention_variants`
# and `llmbook.inference.fast_decode` (the real model's fast decoding).

# %%
import json
import math
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import sympy as sp
import torch
import torch.nn.functional as F
from IPython.display import display
from torch.utils.flop_counter import FlopCounterMode

import llmbook
from llmbook.inference.attention_variants import (
    MultiHeadLatentAttention,
    decode_step_flops,
    deepseek_v3_attention,
    generation_flops,
    kv_cache_bytes_per_token,
    latent_decode,
    mla_cache_bytes_per_token,
    sliding_window_decode,
    sliding_window_mask,
)
from llmbook.inference.kvcache import (
    Int8KVCache,
    KVCache,
    PagedKVCache,
    PagePool,
    SinkKVCache,
    kv_cache_bytes,
    sink_window_mask,
)
from llmbook.inference.real_quant import heldout_ids
from llmbook.inference.sampling import generate
from llmbook.nbtools import Checks, save_figure, seed_everything, show_source
from llmbook.training.pretrained import book_model
from llmbook.transformer.attention import (
    MultiHeadAttention,
    causal_mask,
    scaled_dot_product_attention,
)
from llmbook.transformer.model import TransformerConfig, TransformerLM
from llmbook.transformer.positional import rope_matrix
from llmbook.transformer.sizing import flops_per_token

g = seed_everything(0)
torch.set_num_threads(1)  # small tensors: one thread is as fast and steadier
text_model, text_info = book_model("text")
tok = text_info["tokenizer"]

# %% [markdown]
# ## 13.1 A cache that changes nothing
#
# At step $t$ a decoder needs, in every layer, the keys $k_j$ and values $v_j$ of all
# positions $j \le t$. Because the model is causal, $k_j$ and $v_j$ depend only on tokens
# $\le j$: once computed they are final. The cached forward pass therefore runs the
# network on the new token only, appends its key and value to the cache, and lets its
# query attend over all $T_k$ cached positions (the bottom-right aligned causal mask of
# chapter 12). The layer-level code is three lines once its arguments are checked (the shared
# `_check_new_kv` names a wrong layer, a wrong shape or a cache that is full):

# %%
show_source(KVCache.update)

# %% [markdown]
# The cache is an optimisation, so it must not change the output. On the book's text
# model, greedy decoding with and without it gives the same 48 tokens (what they say
# matters little here: greedy decoding of this small model soon loops, as chapter 12
# showed), and the logits of a prefill of 8 tokens followed by 48 single-token steps
# equal those of one full forward pass to float32 round-off.

# %%
prompt = torch.tensor([tok.encode("Return the value of the given object ")])[:, :8]  # (1, 8)
cached = generate(text_model, prompt, 48, temperature=0, use_cache=True)
plain = generate(text_model, prompt, 48, temperature=0, use_cache=False)
with torch.no_grad():
    full = text_model(cached)  # (1, 56, V)
    cache = KVCache.for_model(text_model, batch_size=1)
    steps = [text_model(cached[:, :8], cache=cache)]
    steps += [text_model(cached[:, t:t + 1], cache=cache) for t in range(8, 56)]
checks = Checks("KV cache = recomputation (book text model)")
checks.equal("greedy tokens, cache vs none", plain.tolist(), cached.tolist())
checks.close("logits: prefill 8 + 48 steps vs full (relative)", full, torch.cat(steps, dim=1),
             tol=1e-5, rel=True)  # float32 round-off over 4 layers
checks.equal("tokens cached", 56, cache.length)
checks

# %% [markdown]
# ## 13.2 Compute: O(T) per token instead of O(T²)
#
# Chapter 7 counted the forward FLOPs per token on a sequence of $T$ tokens (matrix
# products only, 2 per multiply-add):
#
# $$F(T) = 2 N + 4 L H d_h T,$$
#
# where $2N$ collects every weight matrix (projections, feed-forward, LM head) and
# $4 L H d_h T$ is the query's dot products with $T$ keys plus the weighted sum of $T$
# values. To produce the token after position $t$:
#
# * **with a cache** one token runs through the network and attends to $t$ keys: $F(t)$;
# * **without** the whole sequence of $t$ tokens is run again: $t \, F(t)$.
#
# Summing over $t = 1, \dots, T$ gives the cost of generating $T$ tokens:

# %%
t, T, N, L, H, d_h = sp.symbols("t T N L H d_h", positive=True, integer=True)
F_t = 2 * N + 4 * L * H * d_h * t
with_cache = sp.summation(F_t, (t, 1, T))
without_cache = sp.summation(t * F_t, (t, 1, T))
display(sp.Eq(sp.Symbol("C_cache"), sp.factor(with_cache)))
display(sp.Eq(sp.Symbol("C_recompute"), sp.factor(without_cache)))
weights_only_ratio = sp.simplify((without_cache / with_cache).subs(L, 0))
leading_ratio = sp.limit(without_cache / with_cache / T, T, sp.oo)
display(sp.Eq(sp.Symbol("C_recompute / C_cache (attention neglected)"), weights_only_ratio))
display(sp.Eq(sp.Symbol("lim C_recompute / (T C_cache)"), leading_ratio))

# %% [markdown]
# With the cache the total is $2NT + 2LHd_h T(T+1)$: linear in $T$ for the weights, and
# quadratic only through attention, whose share is small until $T$ approaches
# $N / (2 L H d_h)$ (exercise 2). Recomputation costs $N T(T+1) + \tfrac{2}{3} L H d_h
# T(T+1)(2T+1)$: quadratic in the weights' part and cubic in attention. The ratio grows
# linearly in $T$: $(T+1)/2$ while the weights dominate, $2T/3$ once attention does.
#
# The per-step formulas are `decode_step_flops`; we check them against PyTorch's
# `FlopCounterMode` on a real cached step of a small Llama-style model (the book's own
# attention, so that the counter sees every product), and the SymPy totals against the
# sum of per-step counts.

# %%
show_source(decode_step_flops)

# %%
small = TransformerConfig.llama_style(vocab_size=96, d_model=48, n_layers=3, n_heads=6,
                                      n_kv_heads=2, max_seq_len=64, fused_attention=False)
small_model = TransformerLM(small, generator=g).eval()
ids = torch.randint(0, 96, (1, 21), generator=g)
with torch.no_grad():
    step_cache = KVCache.for_model(small_model, 1)
    small_model(ids[:, :20], cache=step_cache)
    with FlopCounterMode(display=False) as counter:
        small_model(ids[:, 20:], cache=step_cache)  # one new token, 21 keys
    counted_cached = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter:
        small_model(ids)  # all 21 tokens again
    counted_full = counter.get_total_flops()
N_eff = (flops_per_token(small, 1) - 4 * small.n_layers * small.n_heads * small.d_head) // 2
vals = {N: N_eff, L: small.n_layers, H: small.n_heads, d_h: small.d_head, T: 50}
checks = Checks("FLOPs per generated token")
checks.equal("cached step (T_k = 21): formula vs FlopCounter", counted_cached,
             decode_step_flops(small, 21, use_cache=True))
checks.equal("recomputed step: formula vs FlopCounter", counted_full,
             decode_step_flops(small, 21, use_cache=False))
checks.equal("SymPy total with cache, T = 50", int(with_cache.subs(vals)),
             sum(decode_step_flops(small, s, True) for s in range(1, 51)))
checks.equal("SymPy total recompute, T = 50", int(without_cache.subs(vals)),
             sum(decode_step_flops(small, s, False) for s in range(1, 51)))
checks.equal("ratio, attention neglected", (T + 1) / 2, weights_only_ratio)
checks.equal("lim C_recompute / (T C_cache)", sp.Rational(2, 3), leading_ratio)
checks

# %% [markdown]
# FLOPs are not time: a cached step on the CPU multiplies a single row by every weight
# matrix, which is limited by reading the weights, while recomputation does large
# efficient products. So we also time it. The next cell generates 384 tokens with a
# randomly initialised model of width 256 and 4 layers (context 640, the model of
# `benchmarks/kvcache.py`) and times every step
# (timings vary from run to run; the figure is the point, and `benchmarks/kvcache.py`
# measures whole generations more carefully).

# %% tags=["nbval-ignore-output"]
mid = TransformerConfig.gpt2_style(vocab_size=512, d_model=256, n_layers=4, n_heads=4,
                                   max_seq_len=640)
mid_model = TransformerLM(mid, generator=torch.Generator().manual_seed(0)).eval()
seq = torch.randint(0, 512, (1, 448), generator=torch.Generator().manual_seed(1))
positions = np.arange(64, 448)
ms = {"cache": [], "recompute": []}
with torch.no_grad():
    cache_mid = KVCache.for_model(mid_model, 1)
    mid_model(seq[:, :64], cache=cache_mid)
    for p in positions:
        began = time.perf_counter()
        mid_model(seq[:, p:p + 1], cache=cache_mid)
        ms["cache"].append(1e3 * (time.perf_counter() - began))
        if p % 16 == 0:  # recomputation is slow: time every 16th position
            began = time.perf_counter()
            mid_model(seq[:, :p + 1])
            ms["recompute"].append(1e3 * (time.perf_counter() - began))
print(f"near position 440: cache {np.median(ms['cache'][-16:]):.2f} ms, "
      f"recompute {ms['recompute'][-1]:.1f} ms per token")

# %%
fig, ax = plt.subplots(figsize=(6.4, 3.8))
ax.plot(positions, ms["cache"], ".", ms=3, label="with KV cache (one token)")
ax.plot(positions[positions % 16 == 0], ms["recompute"], "o-", ms=3,
        label="without cache (whole prefix)")
ax.set_xlabel("position of the generated token")
ax.set_ylabel("time per token (ms)")
ax.set_yscale("log")
ax.set_title("Time per generated token, d = 256, L = 4, CPU (1 thread)")
ax.legend()
save_figure(fig, "13_kv_cache_time_per_token")
plt.show()

# %% [markdown]
# The cached step stays roughly flat (its attention part, linear in the position, is
# small next to the weight matrices at these lengths), while recomputation grows with the
# position, as the closed form says. `benchmarks/kvcache.py` times whole generations with
# `generate` on the book's text model and on this $d = 256$ model; its stored results
# (measured on a shared CPU, so indicative; `make bench` rewrites them, so the test suite
# does not compare this cell's output). The file records the configuration of each model it
# timed, and the cell stops if either differs from the models of this chapter: a stale
# file would otherwise describe a model the chapter no longer has. Next to each measured
# speed-up stands the FLOP ratio of the two ways (`generation_flops`, computed before and
# without any timing), and on a log-log scale the slope of the speed-up against the number
# $n$ of new tokens is fitted, as are the slopes of the two times.

# %% tags=["nbval-ignore-output"]
bench = json.loads((Path(llmbook.__file__).resolve().parents[1] / "benchmarks" / "results"
                    / "kvcache.json").read_text())
print(f"measured {bench['date_utc'][:10]}, {bench['machine']['threads']} thread(s), "
      f"best of {bench['repeats']}")
checks = Checks("benchmarks/kvcache.json against this chapter")
ours = {"book-text": text_model.config, "d256-L4": mid}
fits = {}
for run in bench["results"]:
    config = ours[run["name"]]
    checks.equal(f"{run['name']}: recorded configuration = the chapter's", config.to_dict(), run["config"])
    n = np.array([row["new_tokens"] for row in run["rows"]])
    speedup = np.array([row["speedup"] for row in run["rows"]])
    flop_ratio = np.array([generation_flops(config, run["prompt_len"], int(k), False)
                           / generation_flops(config, run["prompt_len"], int(k), True) for k in n])
    for k, s_, r_ in zip(n, speedup, flop_ratio, strict=True):
        print(f"{run['name']:10s} {k:4d} new tokens: speed-up {s_:5.2f}x, FLOP ratio {r_:6.1f}x")
    fits[run["name"]] = {what: np.polyfit(np.log(n), np.log(y), 1)[0] for what, y in
                         (("speed-up", speedup), ("FLOP ratio", flop_ratio),
                          ("time, cache", [row["seconds_cache"] for row in run["rows"]]),
                          ("time, no cache", [row["seconds_no_cache"] for row in run["rows"]]))}
    print("   log-log slopes against n: " + ", ".join(f"{k} {v:.2f}" for k, v in fits[run["name"]].items()))
    checks.true(f"{run['name']}: every speed-up below its FLOP ratio", bool(np.all(speedup < flop_ratio)),
                got=f"largest speed-up / FLOP ratio {np.max(speedup / flop_ratio):.2f}")
    checks.true(f"{run['name']}: speed-up grows more slowly than linearly (slope < 1)",
                fits[run["name"]]["speed-up"] < 1, got=round(fits[run["name"]]["speed-up"], 2))
checks

# %% [markdown]
# The speed-up grows with the number of generated tokens, but it is not linear: the fitted
# slope of $\log(\text{speed-up})$ against $\log n$ is well below 1, and every speed-up is
# far below the FLOP ratio, whose own slope approaches 1 once $n$ is large next to the
# 8-token prompt. The times say why. The cached generation's time grows about linearly in
# $n$ (slope near 1), as its FLOPs do, but each of its steps is a one-row product whose
# time is set by reading the weights and by per-operator overhead, not by arithmetic;
# recomputation's time grows with a slope well below its FLOPs' 2, because its long
# sequences make large, efficient matrix products whose cost per FLOP falls as they grow.
# On the book's small text model, with its 128-token context, the gain stays small.
#
# ## 13.3 Memory: 2 L B T H_kv d_h
#
# The price of the cache is memory. Every layer keeps a key and a value vector of width
# $d_h$ for each of $H_{kv}$ heads, each position and each sequence of the batch:
#
# $$M = 2 \cdot L \cdot B \cdot T \cdot H_{kv} \cdot d_h \cdot \text{bytes per element}.$$
#
# We check it against the bytes of the cache's real tensors (the sum of
# `numel() * element_size()`) for a few shapes and element types.

# %%
checks = Checks("KV memory formula vs the cache's tensors")
for (L_, B_, H_kv_, d_h_, T_, dtype) in [(2, 1, 4, 16, 64, torch.float32),
                                         (4, 3, 2, 32, 100, torch.bfloat16),
                                         (3, 2, 1, 8, 17, torch.float64)]:
    c_ = KVCache(L_, B_, H_kv_, T_, d_h_, dtype=dtype)
    real = sum(t_.numel() * t_.element_size() for t_ in (*c_.keys, *c_.values))
    checks.equal(f"L={L_} B={B_} H_kv={H_kv_} d_h={d_h_} T={T_} {dtype}",
                 B_ * T_ * kv_cache_bytes_per_token(L_, H_kv_, d_h_, dtype), real)
checks.equal("book text model, kv_cache_bytes vs tensors",
             kv_cache_bytes(text_model.config, 1, text_model.config.max_seq_len), cache.num_bytes())
checks

# %% [markdown]
# For published models the numbers are large. Shapes, from the papers and model cards:
# Llama 2 7B has 32 layers, 32 heads of 128 and multi-head attention (Touvron et al., 2023,
# "Llama 2: Open Foundation and Fine-Tuned Chat Models"); Llama 3 70B has 80 layers, 64
# query heads and 8 key/value heads of 128 (Dubey et al., 2024, "The Llama 3 Herd of
# Models", table 3); Qwen2-0.5B has 24 layers, 14 query heads and 2 key/value heads of 64
# (Yang et al., 2024, "Qwen2 Technical Report"); Mistral 7B has 32 layers, 8 key/value
# heads of 128 and a sliding window of 4096 (Jiang et al., 2023, "Mistral 7B"). At a 4096-token
# context in fp16 (2 bytes), batch 1:

# %%
published = [("Llama 2 7B (MHA)", 32, 32, 32, 128), ("Llama 3 70B (GQA)", 80, 64, 8, 128),
             ("Qwen2-0.5B (GQA)", 24, 14, 2, 64), ("Mistral 7B (GQA)", 32, 32, 8, 128)]
print(f"{'model':20s} {'L':>3s} {'H':>3s} {'H_kv':>4s} {'d_h':>4s} {'KiB/token':>10s} "
      f"{'GiB at 4k':>10s} {'H/H_kv':>6s}")
for name, L_, H_, H_kv_, d_h_ in published:
    per_token = kv_cache_bytes_per_token(L_, H_kv_, d_h_, torch.float16)
    print(f"{name:20s} {L_:3d} {H_:3d} {H_kv_:4d} {d_h_:4d} {per_token / 2**10:10.0f} "
          f"{4096 * per_token / 2**30:10.4g} {H_ // H_kv_:6d}")
llama70 = TransformerConfig.llama_style(vocab_size=128256, d_model=8192, n_layers=80,
                                        n_heads=64, n_kv_heads=8, d_ff=28672, max_seq_len=8192)
checks = Checks("published shapes")
checks.equal("Llama 3 70B at 4k, fp16, bytes (= 1.25 GiB)", int(1.25 * 2**30),
             kv_cache_bytes(llama70, 1, 4096, torch.float16))
checks.equal("Llama 2 7B at 4k, fp16, bytes (= 2 GiB)", 2 * 2**30,
             4096 * kv_cache_bytes_per_token(32, 32, 128, torch.float16))
checks

# %% [markdown]
# A 70B model with multi-head attention (64 key/value heads) would need 10 GiB per
# 4k-token sequence; grouped-query attention brings it to 1.25 GiB. The cache grows
# linearly in both $T$ and $B$, so at serving batch sizes it, not the weights, limits how
# many sequences fit on a device. The figure shows the cache of one sequence against the
# context length (DeepSeek-V2's latent cache, section 13.5, included).

# %%
T_grid = np.array([2**k for k in range(9, 18)])
fig, ax = plt.subplots(figsize=(6.4, 3.8))
for name, L_, _, H_kv_, d_h_ in published[:3]:
    ax.plot(T_grid, T_grid * kv_cache_bytes_per_token(L_, H_kv_, d_h_) / 2**30, "o-",
            ms=3, label=name)
ax.plot(T_grid, T_grid * mla_cache_bytes_per_token(60, 512, 64) / 2**30, "s--", ms=3,
        label="DeepSeek-V2 236B (MLA)")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("context length T (tokens)")
ax.set_ylabel("KV cache, batch 1, fp16 (GiB)")
ax.set_title("KV-cache memory of one sequence")
ax.legend(fontsize="small")
save_figure(fig, "13_kv_cache_memory")
plt.show()

# %% [markdown]
# ### A real model's cache, counted
#
# SmolLM2-135M-Instruct (chapter 7 loads it from its GGUF file) has $L = 30$ layers and 9
# query heads sharing $H_{kv} = 3$ key/value heads of $d_h = 64$: grouped-query attention
# with groups of three. The formula gives its cache per token and at its full 8,192-token
# context. Three measurements check it: the bytes the book's `KVCache` allocates, the bytes
# of the positions a prefill of a chat actually wrote, and the bytes of the cache that
# `transformers` returns for the same prompt. The `transformers` model is its own
# `LlamaForCausalLM`, given the book's weights by `to_hf_llama` (the inverse of chapter 7's
# `from_hf`): its attention, RoPE, norms and cache are its own code. Only the weights come
# from the book, and they are bit for bit the 273 tensors that `transformers`' own GGUF reader
# makes of the file (`tests/test_hf_export.py` compares them all), without reading and
# decoding the file a second time.

# %%
from llmbook.inference.gguf import load_model, smollm2_path  # noqa: E402
from llmbook.transformer.hf_loading import to_hf_llama  # noqa: E402

smol, smol_tok = load_model(smollm2_path())
sc = smol.config
per_token = kv_cache_bytes(sc, 1, 1)
print(f"SmolLM2-135M: L = {sc.n_layers}, H = {sc.n_heads}, H_kv = {sc.n_kv_heads}, "
      f"d_h = {sc.d_head}")
print(f"per token, fp32: 2 x {sc.n_layers} x {sc.n_kv_heads} x {sc.d_head} x 4 = "
      f"{per_token:,} bytes; with H_kv = H = {sc.n_heads} it would be "
      f"{per_token * sc.n_heads // sc.n_kv_heads:,}")
print(f"at T = {sc.max_seq_len}: {kv_cache_bytes(sc, 1, sc.max_seq_len) / 2**20:.0f} MiB "
      f"in fp32, {kv_cache_bytes(sc, 1, sc.max_seq_len, torch.bfloat16) / 2**20:.0f} MiB in "
      f"bf16; the weights are {smol.num_parameters() * 4 / 2**20:.0f} MiB in fp32")

# %%
chat = [{"role": "user", "content": "Name three uses of a lighthouse."}]
chat_ids = torch.tensor([smol_tok.encode_chat(chat)])  # (1, T)
T_chat = chat_ids.shape[1]
smol_cache = KVCache.for_model(smol, 1, 256)
with torch.no_grad():
    smol_prefill = smol(chat_ids, cache=smol_cache)  # (1, T, V)
hf_smol = to_hf_llama(smol)  # transformers' LlamaForCausalLM, the book's weights
with torch.no_grad():
    hf_prefill = hf_smol(chat_ids, use_cache=True)
hf_cache = hf_prefill.cache  # a DynamicCache
hf_bytes = sum(t_.numel() * t_.element_size() for layer in hf_cache.layers
               for t_ in (layer.keys, layer.values))
written = sum(t_[:, :, :smol_cache.length].numel() * t_.element_size()
              for t_ in (*smol_cache.keys, *smol_cache.values))
checks = Checks(f"SmolLM2's KV cache: 2 L B T H_kv d_h x 4 bytes, T = {T_chat}")
checks.equal("allocated by KVCache (T_max = 256) vs formula", kv_cache_bytes(sc, 1, 256),
             smol_cache.num_bytes())
checks.equal("written by the prefill vs formula", kv_cache_bytes(sc, 1, T_chat), written)
checks.equal("transformers' cache for the same prompt vs formula", kv_cache_bytes(sc, 1, T_chat),
             hf_bytes)
checks.equal("cache tensor shape (B, H_kv, T, d_h)", [1, 3, T_chat, 64],
             list(hf_cache.layers[0].keys.shape))
checks

# %% [markdown]
# **The cached decode against an independent one.** Section 13.1 compared the book's cached
# decoding with the book's own recomputation, which share every layer: a wrong RoPE
# frequency or norm epsilon would pass it. Here both models continue from the prefill
# above, the book's with its `KVCache`, `transformers` with its own Llama and its own
# `DynamicCache`, for 6 single-token steps fed the same (the book's greedy) tokens. The
# logits of every step must agree within $10^{-4}$, the tolerance `tests/test_real_model.py`
# sets for a full forward pass, and so must the greedy choices.

# %%
ours_l, theirs_l = smol_prefill[:, -1], hf_prefill.logits[:, -1]  # (1, V) each
worst, picks = [], {"book": [], "transformers": []}
with torch.no_grad():
    for _ in range(6):
        worst.append((ours_l - theirs_l).abs().max().item())
        picks["book"].append(ours_l.argmax().item())
        picks["transformers"].append(theirs_l.argmax().item())
        nxt = ours_l.argmax(-1, keepdim=True)  # (1, 1), fed to both
        ours_l = smol(nxt, cache=smol_cache)[:, -1]
        theirs_l = hf_smol(nxt, cache=hf_cache, use_cache=True).logits[:, -1]
    worst.append((ours_l - theirs_l).abs().max().item())
checks = Checks("SmolLM2: book KVCache decode vs transformers' DynamicCache decode")
checks.true("max |logit difference| over the prefill and 6 cached steps < 1e-4", max(worst) < 1e-4,
            got="yes" if max(worst) < 1e-4 else f"{max(worst):.1e}")
checks.equal("greedy tokens", picks["transformers"], picks["book"])
checks.equal("positions cached, book vs transformers", hf_cache.get_seq_length(), smol_cache.length)
checks

# %% [markdown]
# **Cached against recomputed decoding, on the real model.** Both must give the same tokens;
# the cached one runs the model on one new token per step, the other on the whole sequence.
# Timings depend on the machine, so this cell's output is not compared by the tests; the
# equality of the tokens is asserted in it.

# %% tags=["nbval-ignore-output"]
n_new = 16
for use_cache in (True, False):
    t0 = time.perf_counter()
    out = generate(smol, chat_ids, n_new, temperature=0, use_cache=use_cache)
    seconds = time.perf_counter() - t0
    if use_cache:
        cached_out = out
    print(f"use_cache={use_cache!s:5}: {n_new / seconds:6.1f} tokens/s "
          f"({seconds:.2f} s for {n_new} tokens after a {T_chat}-token prompt)")
assert torch.equal(cached_out, out), "cached and recomputed decoding differ"
print(repr(smol_tok.decode(cached_out[0, T_chat:].tolist())))

# %% [markdown]
# ## 13.4 MQA and GQA
#
# Multi-query attention (Shazeer, 2019, "Fast Transformer Decoding: One Write-Head is All
# You Need") shares one key/value head among all $H$ query heads; grouped-query attention
# (Ainslie et al., 2023, "GQA") shares each of $H_{kv}$ heads among a group of
# $H / H_{kv}$ query heads. Only the cache's $H_{kv}$ changes, so the memory falls by
# exactly $H / H_{kv}$ (the last column of the table above). Chapter 4 showed that GQA
# *is* multi-head attention whose key and value projections repeat each head's rows
# $H / H_{kv}$ times; we check it once more with the cache in place: a GQA layer and an
# MHA layer built with repeated rows give the same outputs, and the GQA cache is
# $H / H_{kv} = 3$ times smaller.

# %%
gqa = MultiHeadAttention(36, 6, 2).double()
mha = MultiHeadAttention(36, 6, 6).double()
with torch.no_grad():
    for name in ("q_proj", "o_proj"):
        getattr(mha, name).load_state_dict(getattr(gqa, name).state_dict())
    for name in ("k_proj", "v_proj"):
        w = getattr(gqa, name).weight  # (H_kv d_h, d) = (12, 36): 2 heads of 6 rows
        getattr(mha, name).weight.copy_(w.view(2, 6, 36).repeat_interleave(3, 0).reshape(36, 36))
x = torch.randn(2, 10, 36, generator=g, dtype=torch.float64)
checks = Checks("GQA = MHA with repeated KV heads")
checks.close("outputs, H = 6, H_kv = 2", mha(x), gqa(x), tol=1e-12)
checks.equal("cache bytes MHA / GQA", 3, KVCache(1, 2, 6, 10, 6).num_bytes()
             // KVCache(1, 2, 2, 10, 6).num_bytes())
checks

# %% [markdown]
# ## 13.5 Multi-head latent attention
#
# DeepSeek-V2 (DeepSeek-AI, 2024, "DeepSeek-V2: A Strong, Economical, and Efficient
# Mixture-of-Experts Language Model", section 2.1) shrinks the cache differently: keys and
# values of all heads are computed from one low-rank *latent*,
#
# $$c = x W_{DKV} \in \mathbb{R}^{d_c}, \qquad k_h = c\, W_{UK,h}, \qquad v_h = c\, W_{UV,h},$$
#
# with $d_c \ll H d_h$ ($d_c = 512$ against $H d_h = 16384$ in DeepSeek-V2), and only $c$
# is cached. Decompressing $k$ and $v$ at every step would cost $O(T H d_h d_c)$ per
# token; instead the up-projections are **absorbed**. For one head with query $q = x W_Q$,
#
# $$q\, k^\top = (x W_Q)(c\, W_{UK})^\top = (x W_Q W_{UK}^\top)\, c^\top,$$
#
# so the query is mapped into latent space and scored against the cached $c$ directly;
# and with attention weights $a$ the output is
#
# $$a\,(C W_{UV})\, W_O = (a\, C)(W_{UV} W_O),$$
#
# so the weights mix the latents and $W_{UV} W_O$ maps the result out. There is nothing
# deep to derive here: both lines are the rule $(AB)^\top = B^\top A^\top$ and the
# associativity of matrix products. SymPy applies them to symbolic matrices of any shape
# (`MatrixSymbol`): it turns the naive score into the product of four factors, and
# regrouping those factors is the absorbed form. That rewriting is SymPy's own rule, so it
# is confirmed independently, entry by entry: with matrices of distinct scalar symbols of
# unequal sizes ($T_q = 2$, $d = 3$, $d_h = 2$, $d_c = 4$, $T_k = 5$), every entry of
# $(X W_Q)(C W_{UK})^\top - (X W_Q W_{UK}^\top) C^\top$, and of the value path's
# $(A C W_{UV}) W_O - (A C)(W_{UV} W_O)$, expands to zero. What the code implements is
# checked numerically below, against keys and values that are really decompressed and
# against an independent implementation.

# %%
n_q, n_k, d_m, dh_, dc_ = sp.symbols("T_q T_k d d_h d_c", positive=True, integer=True)
X_ = sp.MatrixSymbol("X", n_q, d_m)  # the queries' inputs
C_ = sp.MatrixSymbol("C", n_k, dc_)  # the cached latents, one row per position
WQ_, WUK_ = sp.MatrixSymbol("W_Q", d_m, dh_), sp.MatrixSymbol("W_UK", dc_, dh_)
naive = (X_ * WQ_) * (C_ * WUK_).T  # queries times decompressed keys
expanded = naive.doit()  # SymPy applies (AB)^T = B^T A^T and flattens the product
display(sp.Eq(sp.Symbol(r"(X W_Q)(C W_{UK})^\top"), expanded, evaluate=False))
print("factors:", [str(f) for f in expanded.args])


def sym(name: str, rows: int, cols: int) -> sp.Matrix:
    """A matrix of independent symbols name_ij."""
    return sp.Matrix(rows, cols, lambda i, j: sp.Symbol(f"{name}_{i}{j}"))


Xe, WQe, WUKe, Ce = sym("x", 2, 3), sym("q", 3, 2), sym("k", 4, 2), sym("c", 5, 4)
Ae, WUVe, WOe = sym("a", 2, 5), sym("v", 4, 2), sym("o", 2, 3)  # weights over 5 positions
checks = Checks("absorption, entry by entry (T_q=2, d=3, d_h=2, d_c=4, T_k=5)")
checks.equal("scores: (X W_Q)(C W_UK)^T - (X W_Q W_UK^T) C^T, nonzero entries",
             0, sum(sp.expand(e) != 0 for e in (Xe * WQe) * (Ce * WUKe).T - (Xe * WQe * WUKe.T) * Ce.T))
checks.equal("outputs: (A C W_UV) W_O - (A C)(W_UV W_O), nonzero entries",
             0, sum(sp.expand(e) != 0 for e in (Ae * Ce * WUVe) * WOe - (Ae * Ce) * (WUVe * WOe)))
checks

# %% [markdown]
# **Positions, and why RoPE is not absorbed.** RoPE rotates the query at position $i$ and
# the key at position $j$ by orthogonal matrices $R_i$ and $R_j$ (chapter 5). Applied to the
# decompressed key, the score becomes
#
# $$(R_i q)^\top (R_j W_{UK}^\top c_j) = q^\top R_i^\top R_j\, W_{UK}^\top c_j
# = q^\top R_{j-i}\, W_{UK}^\top c_j,$$
#
# and the matrix between $q$ and $c_j$ now depends on the offset $j - i$: no single
# matrix can be folded into $W_Q$ once for all positions. SymPy derives the middle step
# for one rotation pair and shows that the product changes with $j$:

# %%
i_, j_, th = sp.symbols("i j theta", real=True)


def rotation(angle: sp.Expr) -> sp.Matrix:
    return sp.Matrix([[sp.cos(angle), -sp.sin(angle)], [sp.sin(angle), sp.cos(angle)]])


relative = sp.simplify(rotation(i_ * th).T * rotation(j_ * th))
W_uk2 = sym("u", 2, 2)
between = relative * W_uk2.T  # the matrix between q and c_j
display(sp.Eq(sp.Symbol("R_i^T R_j"), relative, evaluate=False))
checks = Checks("RoPE between the query and the latent")
checks.equal("R_i^T R_j = R_(j-i)", sp.zeros(2, 2), sp.simplify(relative - rotation((j_ - i_) * th)))
d_between = sp.simplify(sp.diff(between, j_))
nonzero = sum(1 for e in d_between if e != 0)
checks.true("d/dj (R_(j-i) W_UK^T): nonzero entries (of 4)", nonzero > 0, nonzero)
checks

# %% [markdown]
# DeepSeek-V2's answer (section 2.1.3, the *decoupled* RoPE) keeps the rotation out of the
# latent path. Each head gets an extra rotated query $q_{R,h} = R_i\, x W_{QR,h}$ of
# $d_R$ dimensions, and all heads share ONE rotated key $k_{R} = R_j\, x W_{KR}$ of $d_R$
# dimensions, cached next to $c$. The score adds the two parts,
#
# $$s_h(i, j) = \frac{q_h k_{h,j}^\top + q_{R,h}\, k_{R,j}^\top}{\sqrt{d_h + d_R}}
# = \frac{[\,q_h W_{UK,h}^\top \,;\, q_{R,h}\,] \cdot [\,c_j \,;\, k_{R,j}\,]}{\sqrt{d_h + d_R}},$$
#
# so after absorption every head's query is a vector of width $d_c + d_R$ and it meets the
# SAME key $[c_j ; k_{R,j}]$, the row that is cached: **absorbed MLA is multi-query
# attention with one wide shared key** (width $d_c + d_R$) and one shared value $c_j$
# (width $d_c$), followed by a per-head output map $W_{UV,h} W_{O,h}$. The cache holds
# $d_c + d_R$ numbers per token and layer. `MultiHeadLatentAttention(..., d_rope=d_R)`
# implements it; `mqa_form` returns those queries, the shared key and the shared value:

# %%
show_source(MultiHeadLatentAttention.mqa_form)

# %%
show_source(MultiHeadLatentAttention.forward)

# %% [markdown]
# The checks, in float64 on a layer with $d = 64$, $H = 4$, $d_h = 16$, $d_c = 24$,
# $d_R = 8$:
#
# * **naive = decompressed**: the naive path, rebuilt here by hand from the decompressed
#   $K = C W_{UK}$, $V = C W_{UV}$ and explicit rotation matrices `rope_matrix(i)`, equals
#   the module;
# * **absorbed = naive**, with and without RoPE, and in float32 to float32 round-off;
# * **the cache**: a prefill of 5 tokens and 7 cached single-token steps (absorbed) equal
#   the full pass, and the cache holds $d_c + d_R = 32$ numbers per token;
# * **MQA**: PyTorch's `scaled_dot_product_attention` with one key/value head, broadcast
#   to the four query heads, on the tensors of `mqa_form`, gives the layer's output;
# * **an independent peer**: Hugging Face's `DeepseekV3Attention` (the MLA of DeepSeek-V2
#   and V3; tiny config, no download), with our weights copied into its fused layout and
#   its RMSNorm on the latent replaced by the identity (our MLA has none), gives the same
#   output (`deepseek_v3_attention` builds it).

# %%
torch.manual_seed(0)
d_, H_, dh, dc, dr = 64, 4, 16, 24, 8
mla32 = MultiHeadLatentAttention(d_, H_, dh, dc, d_rope=dr, max_seq_len=16)
mla64 = MultiHeadLatentAttention(d_, H_, dh, dc, dtype=torch.float64, d_rope=dr, max_seq_len=16)
mla_plain = MultiHeadLatentAttention(d_, H_, dh, dc, dtype=torch.float64)
x32 = torch.randn(2, 12, d_)
x64 = x32.double()
with torch.no_grad():
    # the naive formula by hand: decompressed K and V, rotations from rope_matrix
    Tn = x64.shape[1]
    R = torch.stack([rope_matrix(i, dr) for i in range(Tn)])  # (T, d_R, d_R)
    C64 = x64 @ mla64.kv_down.weight.T  # (B, T, d_c)
    Kd = (C64 @ mla64.k_up.weight.T).view(2, Tn, H_, dh)  # decompressed keys
    Vd = (C64 @ mla64.v_up.weight.T).view(2, Tn, H_, dh)  # decompressed values
    Qd = (x64 @ mla64.q_proj.weight.T).view(2, Tn, H_, dh)
    QR = torch.einsum("tij,bthj->bthi", R, (x64 @ mla64.q_rope.weight.T).view(2, Tn, H_, dr))
    KR = torch.einsum("tij,btj->bti", R, x64 @ mla64.k_rope.weight.T)  # (B, T, d_R): one per token
    S = (torch.einsum("bihd,bjhd->bhij", Qd, Kd) + torch.einsum("bihd,bjd->bhij", QR, KR))
    S = S.masked_fill(~causal_mask(Tn), float("-inf")) / (dh + dr) ** 0.5
    by_hand = torch.einsum("bhij,bjhd->bihd", torch.softmax(S, -1), Vd).reshape(2, Tn, H_ * dh)
    by_hand = by_hand @ mla64.o_proj.weight.T

    stepped, lat = latent_decode(mla64, x64, prefill=5, absorbed=True)  # prefill 5, then 1 by 1

    q_w, k_w, v_w = mla64.mqa_form(x64)  # (B, H, T, d_c + d_R), (B, 1, T, d_c + d_R), (B, 1, T, d_c)
    z_mqa = F.scaled_dot_product_attention(q_w, k_w.expand(-1, H_, -1, -1), v_w.expand(-1, H_, -1, -1),
                                           is_causal=True, scale=mla64.scale)  # (B, H, T, d_c)
    out_mqa = torch.einsum("bhtc,hcd->btd", z_mqa, mla64.absorbed_weights()[1])

    peer = deepseek_v3_attention(mla64)
    angles = torch.arange(Tn, dtype=torch.float64)[:, None] * mla64.rope.inv_freq  # (T, d_R/2)
    emb = torch.cat((angles, angles), -1)[None]  # (1, T, d_R): Hugging Face's layout
    additive = torch.zeros(Tn, Tn, dtype=torch.float64).masked_fill(~causal_mask(Tn), float("-inf"))
    out_hf = peer(x64, position_embeddings=(emb.cos(), emb.sin()), attention_mask=additive[None, None])[0]

    full64 = mla64(x64)
    checks = Checks("multi-head latent attention with decoupled RoPE")
    checks.close("naive vs by hand (decompressed K, V; rope_matrix)", by_hand, full64, tol=1e-12)
    checks.close("absorbed vs naive, float64", full64, mla64(x64, absorbed=True), tol=1e-12)
    checks.close("absorbed vs naive, float64, no RoPE", mla_plain(x64), mla_plain(x64, absorbed=True),
                 tol=1e-12)
    checks.close("absorbed vs naive, float32", mla32(x32), mla32(x32, absorbed=True), tol=1e-5)
    checks.close("cache: prefill 5 + 7 steps (absorbed) vs full", full64, stepped, tol=1e-12)
    checks.close("MQA: one key head [c ; k_R] broadcast to 4 query heads", full64, out_mqa, tol=1e-12)
    checks.close("Hugging Face DeepseekV3Attention (same weights)", out_hf, full64, tol=1e-12)
checks.close("the shared MQA key is the cached row [c ; k_R]", k_w[:, 0], lat.latents[0], tol=1e-12)
checks.equal("numbers cached per token and layer: d_c + d_R", dc + dr, lat.width)
checks.equal("latent cache bytes = L B T (d_c + d_R) * 8", 1 * 2 * 12 * (dc + dr) * 8, lat.num_bytes())
checks

# %% [markdown]
# So the decode step of absorbed MLA does the work of MQA with a head width of
# $d_c + d_R$ (576 in DeepSeek-V2, against 128 for an ordinary head): all $H$ query heads
# read the same cached row, so its decode attention does far more arithmetic per byte read
# than GQA's (section 13.7). Per token and layer, multi-head attention caches $2 H d_h$
# numbers, GQA $2 H_{kv} d_h$, and MLA $d_c + d_R$. For DeepSeek-V2's shape ($L = 60$, $H = 128$, $d_h = 128$,
# $d_c = 512$, $d_R = 64$):

# %%
ds = {"MHA, 128 heads": kv_cache_bytes_per_token(60, 128, 128),
      "GQA, 8 KV heads": kv_cache_bytes_per_token(60, 8, 128),
      "MQA, 1 KV head": kv_cache_bytes_per_token(60, 1, 128),
      "MLA, d_c = 512, d_R = 64": mla_cache_bytes_per_token(60, 512, 64)}
for name, b in ds.items():
    print(f"{name:26s} {b / 2**10:8.1f} KiB/token (fp16)   MHA / this = {ds['MHA, 128 heads'] / b:6.2f}")

# %% [markdown]
# The latent cache is 57 times smaller than the MHA cache, about what GQA with 2.25 key/value
# heads would hold (exercise 3), while every query head still gets its own keys and values.
#
# ## 13.6 Sliding-window attention
#
# Longformer (Beltagy, Peters & Cohan, 2020, "Longformer: The Long-Document Transformer")
# and Mistral 7B (Jiang et al., 2023) let each position attend only to the $W$ most
# recent positions: query $i$ sees key $j$ when $i - W < j \le i$. The attention matrix
# becomes a band, the work per token $O(W)$, and the cache needs only $W$ slots. Stacking
# layers widens what a token can reach: information moves up to $W - 1$ positions per
# layer, so after $L$ layers $L (W - 1) + 1$ positions (exercise 4; Mistral quotes about
# 131k tokens for $W = 4096$, $L = 32$).

# %%
show_source(sliding_window_mask)

# %% [markdown]
# Mistral's **rolling buffer** stores position $p$ in slot $p \bmod W$, overwriting the
# position $p - W$ that no query will see again. The slots are out of order, which
# attention does not mind: the softmax-weighted sum is the same in any order (positions
# enter through RoPE before a key is cached). We check the mask against its definition
# and against PyTorch's fused attention with the same mask, and the rolling cache against
# full recomputation with the window mask, for a GQA layer.

# %%
T_q, T_k, W = 9, 13, 4
brute = torch.tensor([[0 <= (i + T_k - T_q) - j < W for j in range(T_k)] for i in range(T_q)])
q, k, v = (torch.randn(2, 3, n, 8, generator=g, dtype=torch.float64) for n in (T_q, T_k, T_k))
mask = sliding_window_mask(T_q, T_k, W, offset=T_k - T_q)
attn = MultiHeadAttention(32, 4, 2).double()
xs = torch.randn(2, 20, 32, generator=g, dtype=torch.float64)
with torch.no_grad():
    rolled, recomputed = sliding_window_decode(attn, xs, W), attn(xs, mask=sliding_window_mask(20, 20, W))
checks = Checks("sliding-window attention")
checks.equal("mask = brute-force definition", brute.tolist(), mask.tolist())
checks.close("attention with mask vs F.scaled_dot_product_attention",
             F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
             scaled_dot_product_attention(q, k, v, mask=mask), tol=1e-12)
checks.close("rolling cache of W = 4 vs recompute, T = 20", recomputed, rolled, tol=1e-12)
checks

# %%
fig, axes = plt.subplots(1, 2, figsize=(7.2, 3.4))
for ax, (title, m) in zip(axes, [("causal", sliding_window_mask(16, 16, 16)),
                                 ("sliding window W = 4", sliding_window_mask(16, 16, 4))],
                          strict=True):
    ax.imshow(m.numpy(), cmap="Blues")
    ax.set_title(title)
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
fig.suptitle("Which keys each query may attend to (blue)", y=1.03)
save_figure(fig, "13_kv_cache_sliding_window")
plt.show()

# %% [markdown]
# The left mask grows a full triangle; the right one is a band of width $W$, so both the
# work and the cache per token stay constant however long the text.

# %% [markdown]
# ### Attention sinks and StreamingLLM
#
# A window can also drop something a model relies on. Xiao et al. (2023) found that trained
# models put much of their attention on the first few tokens whatever they say (attention
# sinks: a softmax row must sum to 1, and the first tokens are visible to every query, so
# they become the place to park unneeded weight; section 4.7 of chapter 4 shows gpt-oss's
# learned alternative). Evicting them changes every row's normalisation. StreamingLLM keeps
# the first $k$ positions (the paper uses $k = 4$) next to the $W$ most recent ones, a
# cache of $k + W$ positions. `SinkKVCache` caches keys after RoPE, so every kept key keeps
# its **original position**; the paper re-numbers positions inside the cache instead, so
# that positions never exceed the cache's size. Ours is the simpler version and is valid
# only while the stream fits the model's context; its advantage is that decoding with it
# equals one full pass with the mask `sink_window_mask`, which makes measuring cheap.

# %%
show_source(sink_window_mask)

# %% [markdown]
# The check: decoding 60 tokens one at a time through a `SinkKVCache` ($k = 4$, $W = 16$)
# on the book's text model (in float64) must give the logits of one pass with the mask. Then the
# measurement on SmolLM2: the first 256 tokens of the book's own prose
# (`data/heldout_prose.txt`, no BOS token), with $W = 32$, scored on the tokens from
# position $k + W = 36$ on, where the three caches differ: (a) the window alone, (b) the
# $k = 4$ sinks and the window, (c) the full cache.

# %%
T_st, W_st, S_st = 60, 16, 4
ids_st = torch.randint(0, text_model.config.vocab_size, (1, T_st), generator=torch.Generator().manual_seed(13))
text64 = TransformerLM(text_model.config).double().eval()  # float64 copy: round-off far below the check
text64.load_state_dict(text_model.state_dict())
sink_cache = SinkKVCache.for_model(text64, 1, W_st, S_st)
with torch.no_grad():
    streamed = torch.cat([text64(ids_st[:, t:t + 1], cache=sink_cache) for t in range(T_st)], dim=1)
    one_pass = text64(ids_st, mask=sink_window_mask(T_st, T_st, W_st, S_st))
checks = Checks("StreamingLLM")
stream_err = (one_pass - streamed).abs().max().item()  # float64 round-off, CPU-dependent: not printed
checks.true(f"SinkKVCache decoding vs one pass with sink_window_mask (T = {T_st}, float64): "
            f"max |difference| < 1e-9", stream_err < 1e-9)
checks.equal("positions kept in the cache", S_st + W_st, sink_cache.keys[0].shape[2])

T_pp, W_pp, S_pp = 256, 32, 4
prose_ids = heldout_ids(smol_tok)[None, :T_pp]  # (1, T)
caches_st = {"(a) window only": sink_window_mask(T_pp, T_pp, W_pp, 0),
             "(b) 4 sinks + window": sink_window_mask(T_pp, T_pp, W_pp, S_pp),
             "(c) full cache": causal_mask(T_pp)}
ppl_st = {}
with torch.no_grad():
    for name, m_st in caches_st.items():
        logits_st = smol(prose_ids, mask=m_st)[0, S_pp + W_pp - 1:-1]  # predicts tokens 36..255
        ppl_st[name] = math.exp(F.cross_entropy(logits_st.double(), prose_ids[0, S_pp + W_pp:]).item())
for name, p_st in ppl_st.items():
    print(f"SmolLM2, {name:22s} perplexity {p_st:.0f} on {T_pp - S_pp - W_pp} tokens")
checks.true("Xiao et al.'s claim: sinks + window beat the window alone",
            ppl_st["(b) 4 sinks + window"] < ppl_st["(a) window only"])
checks

# %% [markdown]
# Removing the first four tokens from what a query may see multiplies SmolLM2's perplexity
# several times over, although each query still sees its 32 latest tokens; keeping them
# recovers most of the loss with a cache of 36 positions. The remaining gap to the full
# cache is the context beyond the window that the text really uses.

# %% [markdown]
# ## 13.7 The roofline: why decoding is memory-bound
#
# Section 13.2 noted that FLOPs are not time. The *roofline model* (Williams, Waterman &
# Patterson, 2009, "Roofline: An Insightful Visual Performance Model for Multicore
# Architectures") makes that precise. A kernel that does $F$ FLOPs and moves $M$ bytes
# between memory and the processor takes at least
#
# $$t \ge \max\Big(\frac{F}{\pi}, \frac{M}{\beta}\Big),$$
#
# with $\pi$ the peak FLOP rate and $\beta$ the memory bandwidth. Which term wins depends on
# the **arithmetic intensity** $I = F / M$ (FLOPs per byte) against the machine's
# **balance point** $\pi / \beta$: below it the kernel is *memory-bound* (the processor
# waits for bytes), above it *compute-bound*.
#
# The weight matrices dominate a decoder's work (section 13.2). Take one, $W \in
# \mathbb{R}^{d \times d}$ in a format of $b$ bytes per number, applied to $n$ input rows:
# $F = 2 n d^2$, and the bytes are the weights once plus the inputs and outputs,
# $M = b(d^2 + 2 n d)$. A **decode step** of a batch of $B$ sequences has $n = B$ (one new
# token each); a **prefill** of $B$ prompts of $T$ tokens has $n = T B$.

# %%
n_rows, d_w, b_w, B_s, T_s = sp.symbols("n d b B T", positive=True)
F_w = 2 * n_rows * d_w**2
M_w = b_w * (d_w**2 + 2 * n_rows * d_w)
intensity = sp.simplify(F_w / M_w)
display(sp.Eq(sp.Symbol("I(n)"), intensity))
small_batch = sp.limit(intensity.subs(b_w, 2), d_w, sp.oo)  # d >> n, bf16
huge_batch = sp.limit(intensity, n_rows, sp.oo)  # n >> d
display(sp.Eq(sp.Symbol("I_decode (bf16, d >> B)"), small_batch.subs(n_rows, B_s)))
display(sp.Eq(sp.Symbol("I_prefill (bf16, d >> TB)"), small_batch.subs(n_rows, T_s * B_s)))
display(sp.Eq(sp.Symbol("lim_{n -> oo} I"), huge_batch))

# %% [markdown]
# In bfloat16 ($b = 2$) a decode step does about $B$ FLOPs per byte, a prefill about
# $T B$, until $n$ approaches $d$; the intensity never exceeds $d/b$ (every weight
# reused by every row). The attention part of a decode step has its own intensity: per
# layer and per cached position it reads $2 H_{kv} d_h$ numbers (a key and a value per
# KV head) and does $4 H d_h$ FLOPs (a dot product and a weighted sum per query head), so
# $I = 4 H d_h / (2 b H_{kv} d_h) = H / H_{kv}$ in bf16, whatever $B$ and $T$ (each sequence
# has its own cache, so batching does not reuse it). For absorbed MLA every query head
# reads the same row of $d_c + d_R$ numbers and does $2(d_c + d_R) + 2 d_c$ FLOPs with
# it:

# %%
H_a, Hkv_a, dh_a, dc_a, dr_a = sp.symbols("H H_kv d_h d_c d_R", positive=True)
I_gqa = sp.simplify((4 * H_a * dh_a) / (2 * Hkv_a * dh_a * 2))
I_mla = sp.simplify(H_a * (2 * (dc_a + dr_a) + 2 * dc_a) / (2 * (dc_a + dr_a)))
display(sp.Eq(sp.Symbol("I_attention, GQA (bf16)"), I_gqa))
display(sp.Eq(sp.Symbol("I_attention, absorbed MLA (bf16)"), I_mla))
mla_v2 = I_mla.subs({H_a: 128, dc_a: 512, dr_a: 64})
print(f"DeepSeek-V2 (H = 128, d_c = 512, d_R = 64): {mla_v2} = {float(mla_v2):.1f} FLOP/byte; "
      f"Llama 3 70B (H/H_kv = 8): {I_gqa.subs({H_a: 64, Hkv_a: 8})} FLOP/byte")

# %% [markdown]
# **The balance point of a GPU.** NVIDIA's H100 SXM datasheet (NVIDIA, 2023, "NVIDIA H100
# Tensor Core GPU" datasheet) gives about 989 TFLOP/s of dense bf16 tensor-core throughput
# (the headline 1979 assumes 2:4 sparsity) and 3.35 TB/s of HBM3 bandwidth:

# %%
h100_flops, h100_bw = 989e12, 3.35e12  # dense bf16 FLOP/s, HBM3 bytes/s (SXM datasheet)
balance_h100 = h100_flops / h100_bw
d_llama = 8192  # Llama 3 70B's width
checks = Checks("roofline: where the intensity crosses the H100's balance point")
checks.close("H100 balance point pi / beta (FLOP/byte)", 295.2, balance_h100, tol=0.05, digits=4)
crossing = sp.solve(sp.Eq(intensity.subs({b_w: 2, d_w: d_llama}), balance_h100), n_rows)
n_star = float(crossing[0])
checks.close("rows n where a d = 8192 bf16 product turns compute-bound: SymPy vs n d/(d - 2n) solved by hand",
             balance_h100 * d_llama / (d_llama - 2 * balance_h100), n_star, tol=1e-9, digits=4)
checks.true("decode, B = 1..64: I < balance (memory-bound)",
            float(intensity.subs({b_w: 2, d_w: d_llama, n_rows: 64})) < balance_h100,
            round(float(intensity.subs({b_w: 2, d_w: d_llama, n_rows: 64})), 2))
checks.true("prefill, T = 2048, B = 1: I > balance (compute-bound)",
            float(intensity.subs({b_w: 2, d_w: d_llama, n_rows: 2048})) > balance_h100,
            round(float(intensity.subs({b_w: 2, d_w: d_llama, n_rows: 2048})), 1))
# GQA decode attention, counted: FLOPs by PyTorch's counter, bytes of the bf16 cache read
Hq, Hkv, dhq, Tc = 64, 8, 128, 256  # Llama 3 70B's heads, a 256-token cache, batch 2
k_c, v_c = (torch.randn(2, Hkv, Tc, dhq, dtype=torch.bfloat16) for _ in range(2))
q_1 = torch.randn(2, Hq, 1, dhq, dtype=torch.bfloat16)  # one new token per sequence
with FlopCounterMode(display=False) as counter:  # each KV head serves H/H_kv = 8 query heads
    scaled_dot_product_attention(q_1, k_c.repeat_interleave(Hq // Hkv, 1),
                                 v_c.repeat_interleave(Hq // Hkv, 1))
I_counted = counter.get_total_flops() / sum(t_.numel() * t_.element_size() for t_ in (k_c, v_c))
checks.close("GQA decode attention: counted FLOPs / cache bytes vs SymPy H/H_kv",
             float(I_gqa.subs({H_a: Hq, Hkv_a: Hkv})), I_counted, tol=1e-9, digits=4)
checks.true("GQA decode attention (counted) below the H100 balance point", I_counted < balance_h100,
            round(I_counted, 2))
checks

# %% [markdown]
# A decode step with fewer than about 300 sequences in the batch cannot use an H100's
# arithmetic: its time is the time to read the weights (and the KV cache), so it is almost
# independent of $B$ and the cost *per token* falls as $1/B$. That is why servers batch
# many users' requests, why the cache's memory (which limits $B$) matters so much, and why
# speculative decoding (chapter 12) can score several tokens for the price of one. A prompt
# of a few thousand tokens, on the other hand, is compute-bound. The KV-cache reads of GQA
# stay memory-bound at any batch size, which is one reason MLA, whose attention
# intensity ($\approx 2H$) is close to the balance point, pays off.
#
# **This CPU.** We measure the same two rates here: a large float32 matrix product (one
# thread) for $\pi$, and a large copy (bytes read plus bytes written, per second) for
# $\beta$; then the time of $y = x W$ for a $4096 \times 4096$ float32 matrix (64 MiB, more
# than the cache) against the number of rows $n$. Timings differ from machine to machine
# and run to run, so the next cell's output is not compared by the tests and the prose
# quotes none of its numbers; the figure comes from the same run.

# %% tags=["nbval-ignore-output"]
def best_time(fn, repeat: int = 2) -> float:
    """The fastest of ``repeat`` runs of fn(), in seconds."""
    fn()  # warm up
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


gen_r = torch.Generator().manual_seed(0)
A_big = torch.randn(1024, 1024, generator=gen_r)
peak = 2 * 1024**3 / best_time(lambda: A_big @ A_big)  # FLOP/s
src_buf = torch.ones(16 * 2**20)  # 64 MiB, twice the L3 cache
dst_buf = torch.empty_like(src_buf)
bandwidth = 2 * src_buf.numel() * 4 / best_time(lambda: dst_buf.copy_(src_buf))  # read + write
W_big = torch.randn(4096, 4096, generator=gen_r)
rows = [1, 2, 4, 8, 16, 32, 64, 128]
per_call = []
for n_ in rows:
    x_n = torch.randn(n_, 4096, generator=gen_r)
    per_call.append(best_time(lambda x_n=x_n: x_n @ W_big))
print(f"this CPU (1 thread): matmul {peak / 1e9:.1f} GFLOP/s, copy {bandwidth / 1e9:.1f} GB/s, "
      f"balance point {peak / bandwidth:.1f} FLOP/byte (float32: I = n/2 for n << d)")
for n_, t_ in zip(rows, per_call, strict=True):
    print(f"n = {n_:3d}: {1e3 * t_:7.2f} ms per product, {1e6 * t_ / n_:8.1f} us per row, "
          f"{2 * n_ * 4096**2 / t_ / 1e9:6.1f} GFLOP/s")

fig, ax = plt.subplots(figsize=(6.4, 3.8))
ax.plot(rows, [1e6 * t_ / n_ for n_, t_ in zip(rows, per_call, strict=True)], "o-",
        label="measured time per row (token)")
ax.plot(rows, [1e6 * 4096**2 * 4 / bandwidth / n_ for n_ in rows], ":",
        label="weights read once per product, shared by n rows")
ax.plot(rows, [1e6 * 2 * 4096**2 / peak for _ in rows], "--", label="compute at the measured peak")
ax.set(xscale="log", yscale="log", xlabel="rows n (batch of decoding sequences)",
       ylabel="time per row (us)",
       title="y = x W, W 4096 x 4096 float32, this CPU (1 thread)")
ax.set_xscale("log", base=2)
ax.legend(fontsize="small")
save_figure(fig, "13_kv_cache_roofline")
plt.show()

# %% [markdown]
# What to look for in the figure. The dotted line is the memory bound (the weights' bytes
# over the measured bandwidth, shared by the $n$ rows), the dashed line the compute bound
# (the arithmetic of one row at the measured peak); the roofline model says the time per
# row cannot lie below either. A single CPU core is a blurred example of it: its balance
# point is only a few FLOPs per byte, so at float32's intensity of $n/2$ the product is
# compute-bound after a handful of rows, and BLAS kernels for very thin matrices often
# reach neither bound, so for small $n$ the measured points can lie well above both lines.
# What carries over to a GPU is the trend: the time per row falls as rows share one read
# of the weights, towards the compute line. On an H100 the memory-bound stretch is a
# hundred times longer (balance point about 300), which is the regime every decode step
# with a modest batch lives in.

# %% [markdown]
# ### The real model at batch 1, against its roofline
#
# A decode step of SmolLM2-135M at batch 1 is the memory-bound case in its purest form: it
# reads every weight once (and the cache so far) to produce one token. Its roofline is
# therefore a number of tokens per second, the bandwidth $\beta$ over the bytes per token
# $M$. `decode_bytes_per_token` counts $M$ for the book's two ways of running it: float32
# weights, as loaded, and the file's own 4-bit codes kept packed (`quantize_for_decode`:
# `Int4Linear` with a bfloat16 scale and offset per 32 weights, chapter 15; the tied output
# layer in `Int8Linear`, one int8 per weight and a scale per row). These counts are exact and
# the same on every machine:

# %%
from llmbook.inference.fast_decode import decode_bytes_per_token, quantize_for_decode  # noqa: E402
from llmbook.inference.gguf import read_gguf  # noqa: E402

bench = json.loads((Path(llmbook.__file__).parents[1] / "benchmarks" / "results" /
                    "real_model.json").read_text(encoding="utf-8"))
context = bench["prompt_tokens"] + bench["new_tokens"]
smol_int4, _ = load_model(smollm2_path())
quantize_for_decode(smol_int4, read_gguf(smollm2_path()), head="int8")
counted = {"fp32": decode_bytes_per_token(smol, context),
           "int4_weights_int8_head": decode_bytes_per_token(smol_int4, context)}
print(f"bytes read per token at a context of {context} positions:")
for name, c in counted.items():
    print(f"  {name:24s} weights {c['weights'] / 2**20:6.1f} MiB + cache {c['kv_cache'] / 2**20:4.1f} MiB"
          f" = {c['total'] / 2**20:6.1f} MiB")
checks = Checks("bytes per token: counted here = what the benchmark used")
checks.equal("fp32 and int4 counts, to the byte", bench["bytes_per_token"], counted)
checks.equal("fp32 weights = 4 bytes x every parameter (the tied table is the output layer)",
             4 * smol.num_parameters(), counted["fp32"]["weights"])
proj_weights = sum(p_.numel() for n_, p_ in smol.blocks.named_parameters() if n_.endswith("proj.weight"))
norm_weights = smol.num_parameters() - proj_weights - sc.vocab_size * sc.d_model
checks.equal("int4 weights = 5/8 byte x projections + (V d + 2 V) int8 head + 4 x (norms + one row)",
             proj_weights * 5 // 8 + sc.vocab_size * (sc.d_model + 2) + 4 * (norm_weights + sc.d_model),
             counted["int4_weights_int8_head"]["weights"])
checks

# %% [markdown]
# `benchmarks/real_model.py` measured, in one run on one machine, the bandwidth of a large
# copy (a STREAM-style $\beta$) and the decoding speed of every system on the same chat
# prompt, greedy, 64 new tokens: `transformers` in float32 (the peer), the book's float32
# model with chapter 12's cache and with the preallocated cache of `fast_decode`, the book's
# int4 model eagerly and under `torch.compile`, and llama.cpp (through `llama-cpp-python`,
# used by the benchmark only) on the same Q4_1 file. The numbers below are read from the
# benchmark's JSON, so they are those of the machine it names, not of yours; run the script
# to measure your own.

# %%
systems = {"transformers_fp32": ("transformers, fp32", "fp32"),
           "book_fp32_dynamic": ("book fp32, KVCache", "fp32"),
           "book_fp32_static": ("book fp32, static cache", "fp32"),
           "book_int4_static": ("book int4, static cache", "int4_weights_int8_head"),
           "book_int4_compiled": ("book int4, compiled step", "int4_weights_int8_head"),
           "llama_cpp_q4_1": ("llama.cpp, Q4_1 file", None)}
print(f"machine: {bench['machine'].get('cpu', '?')}, {bench['machine'].get('cores', '?')} cores; "
      f"{bench['date'][:10]}; prompt {bench['prompt_tokens']} tokens, {bench['new_tokens']} new")
for row in bench["rows"]:
    print(f"\n{row['threads']} thread(s): copy bandwidth {row['stream_copy_GBps']:.1f} GB/s, roofline "
          f"fp32 {row['roofline_tok_s']['fp32']:.0f} tok/s, int4 "
          f"{row['roofline_tok_s']['int4_weights_int8_head']:.0f} tok/s")
    for key, (label, config) in systems.items():
        if key in row:
            frac = f"{row[key] / row['roofline_tok_s'][config]:5.0%} of its roofline" if config else ""
            print(f"  {label:26s} {row[key]:6.1f} tok/s  {row[key] / row['transformers_fp32']:4.1f}x "
                  f"transformers  {frac}")
quality = bench["int4_quality"]
print(f"\nint4 against fp32: mean next-token KL {quality['mean_kl_nats']:.4f} nats, same greedy token "
      f"{quality['greedy_agreement_teacher_forced']:.0%} of the time (teacher-forced)")

# %%
fig, axes = plt.subplots(1, len(bench["rows"]), figsize=(5.2 * len(bench["rows"]), 3.8), squeeze=False)
for ax, row in zip(axes[0], bench["rows"], strict=True):
    shown = [k for k in systems if k in row]
    ax.barh([systems[k][0] for k in shown], [row[k] for k in shown],
            color=["C7" if k.startswith(("transformers", "llama")) else "C0" for k in shown])
    for config, style in (("fp32", ":"), ("int4_weights_int8_head", "--")):
        ax.axvline(row["roofline_tok_s"][config], color="C3", ls=style,
                   label=f"roofline, {config.split('_')[0]} bytes")
    ax.set(xlabel="tokens per second (batch 1)", title=f"{row['threads']} thread(s)")
    ax.invert_yaxis()
    ax.legend(fontsize="x-small", loc="lower right")
fig.suptitle("SmolLM2-135M decoding on the benchmark's CPU, against bandwidth / bytes per token",
             fontsize=10)
fig.tight_layout()
save_figure(fig, "13_kv_cache_real_roofline")
plt.show()

# %% [markdown]
# Where the time of one step goes, by `torch.profiler` (`profile_decode_step`): the linear
# layers, attention, the elementwise operations and norms, and what is left of the wall
# time outside any operator, the Python and dispatch overhead of about 600 small operator
# calls per step. That last part is what a compiled step removes.

# %%
for row in bench["rows"]:
    for name in ("fp32", "int4"):
        prof = row[f"profile_{name}"]
        parts = ", ".join(f"{k} {1e3 * v:.1f}" for k, v in prof.items() if k != "wall")
        print(f"{row['threads']} thread(s), {name}: {1e3 * prof['wall']:.1f} ms per step = {parts} (ms)")

# %% [markdown]
# Reading the measurements:
#
# * **The float32 systems run close to their roofline.** At batch 1 a float model of 135
#   million parameters is memory-bound on a CPU, as the roofline predicts: `transformers`
#   and the book's model read the same 538 MB per token and run at nearly the same speed,
#   and no float32 code could be much faster.
# * **Four-bit weights raise the roofline about sixfold, and the eager step does not reach
#   it.** The int4 model's matrix products take about a third of the float32 ones' time,
#   but everything else, several hundred operator calls per step, each paying PyTorch's dispatch
#   and Python's interpreter, and the small elementwise operations between them, stays as
#   it was and now takes most of the step. Fewer bytes only help once the overhead is gone.
# * **A compiled step removes most of the overhead.** `torch.compile` traces `decode_step`
#   once into a single graph (the static cache keeps every shape fixed), fuses the
#   elementwise work into a few C++ loops and calls the int4 kernel directly. One lesson
#   from making it fast: with the cache held as one $(L, B, H_{kv}, T, d_h)$ tensor written
#   in place, the compiled graph copied the whole tensor at every layer and ran *slower*
#   than the eager step; one buffer per layer (`StaticKVCache`) fixed it.
# * **llama.cpp is the anchor**: its step is one C++ loop over its own kernels, with the
#   activations rounded to 8 bits so that the products run on integers. What remains
#   between it and the compiled book is the overhead still left and the 8-bit output
#   layer, which reads 28 MB per token, more than 40 % of what the 210 int4 projections
#   read together.

# %% [markdown]
# ## 13.8 Paged KV cache and prefix caching
#
# `KVCache` reserves $T_{max}$ positions per sequence before the first token: a server that
# does not know how long each answer will be either reserves the whole context for every
# request, and most of it stays empty, or fails when a request outgrows its slot.
# PagedAttention (Kwon et al., 2023, "Efficient Memory Management for Large Language Model
# Serving with PagedAttention", the memory manager of vLLM) borrows the operating system's
# answer: the cache lives in fixed-size **pages** of $P$ positions in one shared pool, a
# **block table** per sequence lists its pages in order, and a **free list** hands pages
# out as positions arrive and takes them back when a request ends. Position $p$ of a
# sequence lives in page `table[p // P]`, row `p % P`; attention gathers the keys and values
# through the table.
#
# A sequence of $T$ tokens holds $\lceil T/P \rceil$ pages, so at most $P - 1$ positions of
# its last page are empty. If $T \bmod P$ is equally likely to be any residue, SymPy gives
# the mean waste per sequence, derived before any measurement:

# %%
P_, r_ = sp.symbols("P r", positive=True, integer=True)
waste_mean = sp.simplify(sp.summation(P_ - r_, (r_, 1, P_ - 1)) / P_)  # residue 0 wastes nothing
waste_var = sp.simplify(sp.summation((P_ - r_) ** 2, (r_, 1, P_ - 1)) / P_ - waste_mean**2)
display(sp.Eq(sp.Symbol("E[waste]"), sp.factor(waste_mean)),
        sp.Eq(sp.Symbol("Var[waste]"), sp.factor(waste_var)))

# %%
show_source(PagedKVCache.update)

# %% [markdown]
# Three checks. **Same numbers**: the small GQA model of section 13.2 decoded through a
# paged cache (pages of 5 positions, a prefill of 7 and 13 single steps, a batch of 2)
# gives logits *bitwise* equal to the contiguous cache's; the same keys and values are
# only stored elsewhere. **The waste**: 400 requests with lengths drawn uniformly from 1 to
# 1000, written into pages of 16, leave empty rows whose mean must lie within 4 standard
# errors of the SymPy mean $(P-1)/2 = 7.5$ (the standard error from the SymPy variance, so
# the tolerance is fixed before the draw). **Prefix caching**: requests that begin with the
# same prompt (a system prompt, a few-shot preamble) share its pages: `from_prefix` adds a
# reference to each, and the first write into the shared, partly filled last page copies it
# (copy-on-write). On the real model, two chats with one system prompt are run that
# way, and their logits must equal those of running each whole chat through
# `transformers` within $10^{-4}$ (the tolerance of `tests/test_real_model.py`).

# %%
ids_p = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(13))
with torch.no_grad():
    contiguous = [small_model(ids_p[:, :7], cache=(kc := KVCache.for_model(small_model, 2)))]
    contiguous += [small_model(ids_p[:, t:t + 1], cache=kc) for t in range(7, 20)]
    paged_cache = PagedKVCache(PagePool.for_model(small_model, num_pages=10, page_size=5), 2)
    paged = [small_model(ids_p[:, :7], cache=paged_cache)]
    paged += [small_model(ids_p[:, t:t + 1], cache=paged_cache) for t in range(7, 20)]
checks = Checks("paged KV cache")
checks.equal("logits, paged vs contiguous (bitwise)", True, torch.equal(torch.cat(paged, 1), torch.cat(contiguous, 1)))
checks.equal("block tables: 4 pages each, handed out in order of need", [[0, 1, 4, 6], [2, 3, 5, 7]],
             paged_cache.block_tables)
lengths = torch.randint(1, 1001, (400,), generator=torch.Generator().manual_seed(8)).tolist()
pool16 = PagePool(n_layers=1, n_kv_heads=1, d_head=1, num_pages=26000, page_size=16)
for T_req in lengths:  # write each request's positions (the values do not matter)
    PagedKVCache(pool16).update(0, torch.zeros(1, 1, T_req, 1), torch.zeros(1, 1, T_req, 1))
empty_rows = (pool16.num_pages - pool16.num_free) * 16 - sum(lengths)
mean_w, sd_w = float(waste_mean.subs(P_, 16)), float(sp.sqrt(waste_var.subs(P_, 16)))
print(f"400 requests, {sum(lengths):,} positions in {pool16.num_pages - pool16.num_free:,} pages "
      f"of 16: {empty_rows / 400:.2f} empty rows per request (SymPy: {mean_w}); a contiguous "
      f"cache reserving 1000 per request would leave {1000 - sum(lengths) / 400:.1f}")
checks.close("mean empty rows per request vs SymPy (P - 1)/2, tol 4 standard errors",
             mean_w, empty_rows / 400, tol=4 * sd_w / 400**0.5)
checks

# %%
system = [{"role": "system", "content": "You are the keeper of an old lighthouse on a rocky coast. "
           "You answer visitors' questions about the light, the lenses, the weather and the "
           "ships, briefly and in plain words."}]
chats = [system + [{"role": "user", "content": q}] for q in ("What do you do at night?", "Why is the lamp red?")]
chat_tokens = [smol_tok.encode_chat(c) for c in chats]
shared_len = next(i for i, (a_, b_) in enumerate(zip(*chat_tokens, strict=False)) if a_ != b_)
smol_pool = PagePool.for_model(smol, num_pages=32, page_size=8)
prefix_cache = PagedKVCache(smol_pool)
with torch.no_grad():
    smol(torch.tensor([chat_tokens[0][:shared_len]]), cache=prefix_cache)  # the prefix, once
    worst_prefix = 0.0
    for toks in chat_tokens:
        child = PagedKVCache.from_prefix(prefix_cache, shared_len)
        ours_tail = smol(torch.tensor([toks[shared_len:]]), cache=child)  # only the rest runs
        theirs_full = hf_smol(torch.tensor([toks])).logits[:, shared_len:]
        worst_prefix = max(worst_prefix, (ours_tail - theirs_full).abs().max().item())
used_pages = smol_pool.num_pages - smol_pool.num_free
alone = sum(-(-len(t) // 8) for t in chat_tokens)
print(f"common prefix {shared_len} tokens; chats of {[len(t) for t in chat_tokens]} tokens; "
      f"pages in use {used_pages} (prefix cache included) against {alone} for two separate caches")
checks = Checks("prefix caching on SmolLM2 vs transformers, whole chats")
checks.true("max |logit difference| of the tails < 1e-4", worst_prefix < 1e-4,
            got="yes" if worst_prefix < 1e-4 else f"{worst_prefix:.1e}")
checks.equal("reference counts of the prefix's full pages (prefix + 2 chats)",
             [3] * (shared_len // 8), [smol_pool.refs[pg] for pg in prefix_cache.block_tables[0][:shared_len // 8]])
checks

# %% [markdown]
# The measured waste agrees with $(P-1)/2$ per request, a few rows against hundreds for a
# contiguous reservation; serving systems choose $P$ of 16 or so, small enough to waste
# little and large enough for a kernel to read a page as one block. Prefix caching computes
# and stores the shared prompt once: each chat runs only its own tokens and holds its own
# pages only from the first page that differs.
#
# ### An int8 cache
#
# The cache can also hold fewer bits. `Int8KVCache` stores every key and value vector (one
# token, one head) as int8 numbers with one absmax scale $s = \max_c |x_c| / 127$, so
# rounding moves each element by at most $s/2$: a bound derived before any run, checked on
# the first layer, whose keys and values both caches compute from the same inputs (from the
# second layer on, the inputs themselves carry the rounding of the layers below). Per position
# and layer it holds $2 H_{kv}(d_h + 4)$ bytes against $2 H_{kv} \cdot 4 d_h$ in float32.
# On the real model the chat of section 13.3 is prefilled and decoded for 6 steps with
# both caches; the check compares the int8 cache's dequantised keys with the float cache's
# keys (the bound), and the logit error is printed as a measurement.

# %%
smol_f = KVCache.for_model(smol, 1, 64)
smol_q = Int8KVCache.for_model(smol, 1, 64)
with torch.no_grad():
    step_f, step_q = smol(chat_ids, cache=smol_f), smol(chat_ids, cache=smol_q)
    logit_err, agree = [(step_f[0] - step_q[0]).abs().max().item()], [0]
    for _ in range(6):
        nxt = step_f[:, -1:].argmax(-1)  # (1, 1): the float cache's greedy token, fed to both
        agree[0] += int(nxt.item() == step_q[0, -1].argmax().item())
        step_f, step_q = smol(nxt, cache=smol_f), smol(nxt, cache=smol_q)
        logit_err.append((step_f[0] - step_q[0]).abs().max().item())
n_cached = smol_f.length
within = [bool(((q_[0][:, :, :n_cached].float() * s_[0][:, :, :n_cached] - f_[0][:, :, :n_cached]).abs()
                <= s_[0][:, :, :n_cached] / 2 * (1 + 1e-6)).all())  # layer 0
          for q_, s_, f_ in ((smol_q.keys, smol_q.key_scales, smol_f.keys),
                             (smol_q.values, smol_q.value_scales, smol_f.values))]
checks = Checks("int8 KV cache on SmolLM2")
checks.equal("layer 0: every cached key, value within s/2 of the float cache's", [True, True], within)
checks.equal("bytes per position and layer, int8 + scale: 2 H_kv (d_h + 4)", 2 * 3 * (64 + 4),
             smol_q.num_bytes() // (sc.n_layers * 64))
checks

# %% tags=["nbval-ignore-output"]
print(f"int8 cache: {smol_q.num_bytes() / smol_f.num_bytes():.3f} of the float32 cache's bytes; "
      f"max |logit error| {max(logit_err):.3f} (logits span about "
      f"{(step_f.max() - step_f.min()).item():.0f}); greedy token agrees at {agree[0]} of 6 steps")
channel_max = torch.stack([k_[0, :, :n_cached].abs().amax(dim=1) for k_ in smol_f.keys])  # (L, H_kv, d_h)
spread = (channel_max.amax(-1) / channel_max.median(-1).values).median().item()
print(f"keys: largest channel / median channel (absmax over tokens), median over layers and heads: "
      f"{spread:.1f}")

# %% [markdown]
# The memory falls by almost four times against float32 (two against 16 bits). The error
# is not negligible: the logits move by a few percent of their spread, although the greedy
# tokens here still follow the float cache's. The last line says why: in every head a few
# channels of SmolLM2's keys are several times larger than the typical one, and one scale per
# token, set by the largest channel, leaves the small channels only a few of the 255 levels.
# Scales per channel for the keys (per token for the values) avoid that.
#
# ## Summary
#
# * The KV cache changes nothing in the output (checked to round-off) and turns the cost
#   of generating $T$ tokens from $\Theta(N T^2)$ into $\Theta(N T)$ plus attention.
# * Its memory is $2 L B T H_{kv} d_h$ elements: gigabytes per sequence for large models
#   at long contexts, which is why serving is memory-bound.
# * GQA/MQA divide it by $H / H_{kv}$; MLA caches a $d_c$-dimensional latent plus a
#   $d_R$-dimensional rotated key shared by all heads, absorbs the up-projections into the
#   query and output maps, and then attends like MQA with one key of width $d_c + d_R$
#   (equal to Hugging Face's DeepSeek-V3 attention to float64 round-off); sliding windows
#   cap the cache at $W$. Evicting the first tokens hurts: on SmolLM2 a window alone
#   scores far worse than the same window plus the first four tokens (StreamingLLM's
#   attention sinks), which comes close to the full cache.
# * Arithmetic intensity decides what limits a step: about $B$ FLOPs per byte for a bf16
#   decode step, about $T B$ for a prefill, against some 300 for an H100. Decoding is
#   memory-bound (its time is the time to read the weights and the cache), prefill is
#   compute-bound.
# * On a real model at batch 1 on a CPU, float32 decoding runs near its roofline; 4-bit
#   weights raise the roofline sixfold, and the speed follows only once the per-operator
#   overhead is compiled away.
# * A paged cache (Kwon et al., 2023) stores the same keys and values in fixed-size pages
#   listed in a block table: it wastes $(P-1)/2$ positions per request on average, and
#   requests with a common prompt share its pages (prefix caching), copying a shared page
#   only when they write into it. An int8 cache with one absmax scale per token and head
#   quarters the float32 cache, within half a step per element, but moves SmolLM2's logits
#   by a few percent: its keys have a few large channels.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/13_kv_cache.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 13` writes a stub
# of every function, `llmbook grade 13` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_13.py` runs
# the same checks on the reference.
#
# 1. (★) **How many sequences fit?** Write `max_batch(budget_bytes, n_layers,
#    n_kv_heads, d_head, seq_len, bytes_per_element)`, the largest batch whose KV cache fits
#    in the budget. How many 8192-token sequences of Llama 3 70B fit in 40 GiB of cache in
#    fp16? How many would with multi-head attention (64 KV heads)?
# 2. (★★) **When does attention dominate?** In a cached step $F(T) = 2N + 4 L H d_h T$.
#    Write `attention_crossover(config)`, the smallest $T$ at which the attention part is
#    at least the weights' part, and check it with `flops_per_token`. Evaluate it for the
#    book's text model and for Llama 2 7B's shape.
# 3. (★) **MLA as GQA.** Write `mla_equivalent_kv_heads(d_latent, d_rope, d_head)`, the
#    number of GQA key/value heads whose cache equals MLA's. DeepSeek-V2 reports 2.25.
# 4. (★★) **Receptive field of stacked windows.** Write `receptive_field(n_layers,
#    window)` = $L(W-1)+1$ and `reachable_positions(n_layers, window, T)`, which composes
#    the boolean window mask $L$ times (a boolean matrix product) and counts the positions
#    the last token can reach. Show that both agree.
# 5. (★★) **Decoding on the roofline.** A decode step reads every weight once ($b N$
#    bytes) and does $2N$ FLOPs per sequence. Write `decode_tokens_per_second(n_params,
#    batch, bytes_per_param, peak_flops, bandwidth)` from $t = \max(2 N B / \pi,\, b N /
#    \beta)$ and `roofline_batch(bytes_per_param, peak_flops, bandwidth)`, the batch at which
#    the two terms meet. For Llama 2 7B ($N = 6.74 \times 10^9$) in bf16 on the H100 of
#    section 13.7, how many tokens per second does one sequence get, and from which batch
#    size on does adding sequences stop raising the throughput? (The KV cache is ignored.)
# 6. (★★) **Pages with a shared prefix.** $n$ requests of lengths $T_1, \dots, T_n$ all begin
#    with the same $S$-token prompt, cached once and shared with `PagedKVCache.from_prefix`.
#    Write `pages_with_prefix(lengths, prefix_len, page_size)`, the pages in use once every
#    request is written (the prompt's own cache included), and check it against a
#    `PagePool`. How many pages do 8 requests of 1,000 tokens with a 600-token common prompt
#    need with pages of 16, with and without sharing?

# %%
from llmbook.workbench import grade

grade("13", globals())
