# %% [markdown]
# # 15 Quantisation
#
# A trained model's weights are stored as 16- or 32-bit floats, but a language model's output
# changes little if every weight is rounded to one of only 16 or 8 values. Storing a weight in
# $b$ bits instead of 16 shrinks the model by about $16/b$, and since generating a token reads
# every weight once, it speeds up generation about as much. This chapter works out what the
# rounding costs and how to make it cost less:
#
# 1. **uniform quantisation**: absmax and zero-point codes, and the error of rounding,
#    $\Delta^2/12$ for a step $\Delta$, derived in SymPy and measured;
# 2. **granularity**: one scale per tensor, per channel, or per group of 32 or 64 weights;
# 3. **integer matrix multiplication**: int8 products summed in an int32 accumulator, and why
#    an int16 one would overflow after three terms;
# 4. **outliers**: a few large activation channels break per-tensor int8 activations;
# 5. **NF4**: QLoRA's 4-bit code book built from normal quantiles, checked against the
#    published table;
# 6. **GPTQ**: rounding one weight at a time and correcting the others with the optimal brain
#    surgeon update, derived with a Lagrange multiplier and a Schur complement, and checked
#    against least squares on the inputs and against the exact optimum found by enumeration;
# 7. **AWQ**: scaling up the weights that meet large activations;
# 8. the book's model at 8, 4 and 3 bits with the three methods (AWQ with one scale per
#    shared input, folded into the norms), and the memory saved;
# 9. the roofline of decoding: why $b$-bit weights make it about $16/b$ times faster;
# 10. **GGUF's block formats** on the real model's file: a Q4_1 block decoded by hand, every
#     format's bits per weight derived from its fields, the error of a block against its
#     scale, and the book's code bit-exact with ggml's own package;
# 11. **claim C5**: what "Q4_K_M" is, against a published description of it;
# 12. **bits per weight against perplexity** of the real model, SmolLM2-135M-Instruct, in
#     every ggml format, llama.cpp's Q4_K_M mixture, NF4, GPTQ and AWQ;
# 13. **outlier channels** in the real model's activations, and how AWQ uses them;
# 14. **claim C6**: how many numbers a SIMD instruction processes;
# 15. the file's own 4-bit codes run by a PyTorch kernel;
# 16. **floating-point codes**: FP8's two formats derived and rounded exactly as torch's
#     `float8` dtypes, and MXFP4's shared power-of-two scales, bit for bit with ggml;
# 17. **QuaRot**: a Hadamard rotation that spreads the real model's outlier channels and
#     makes its activations quantisable to 4 bits;
# 18. **LLM.int8()**: the outlier columns computed in float, the rest in int8.
#
# The code lives in `llmbook.inference.quant` (quantisers, integer matmul, NF4),
# `llmbook.inference.gptq` (GPTQ, AWQ, whole models), `llmbook.inference.gguf_file`,
# `ggml_quants` and `ggml_kquants` (GGUF and ggml's formats) and
# `llmbook.inference.real_quant` (the real model's sweep).

# %%
import copy
import json
import math
from pathlib import Path

import gguf.quants
import matplotlib.pyplot as plt
import numpy as np
import sympy as sp
import torch
from gguf import GGMLQuantizationType
from IPython.display import display

import llmbook
from llmbook.inference import ggml_quants
from llmbook.inference.fast_decode import Int4Linear
from llmbook.inference.ggml_kquants import q4_k_m_types
from llmbook.inference.gguf import load_model, read_gguf, smollm2_path, tensor_types
from llmbook.inference.gguf_file import block_layout
from llmbook.inference.gptq import (
    awq_scale_model,
    awq_scale_search,
    gptq_lstsq_reference,
    gptq_quantize,
    gptq_quantize_naive,
    hessian_from_inputs,
    layer_output_error,
    model_memory_bytes,
    quantize_brute_force,
    quantize_model,
    quantize_rtn,
)
from llmbook.inference.minifloat import (
    E4M3,
    E5M2,
    dequantize_mx,
    float_grid,
    quantize_mx,
    round_to_float,
)
from llmbook.inference.quant import (
    accumulator_overflow_length,
    dequantize,
    int8_matmul,
    int8_matmul_decomposed,
    nf4_levels,
    nf4_offset,
    quantize_absmax,
    quantize_zeropoint,
    roofline,
    stored_bits_per_weight,
)
from llmbook.inference.real_quant import (
    LINEAR_INPUTS,
    SWEEP_JSON,
    apply_state,
    build_variant,
    heldout_ids,
    ids_sha256,
    linear_inputs,
    perplexity,
    requantize_ggml,
)
from llmbook.inference.rotation import hadamard_rotate, kurtosis
from llmbook.nbtools import Checks, ClaimGrades, save_figure, seed_everything, show_source
from llmbook.text.data import default_source
from llmbook.training.pretrained import RECIPES, book_model
from llmbook.training.train import evaluate, get_batch

g = seed_everything(0)
torch.set_num_threads(1)  # every tensor here is small: one thread is steadier
f64 = torch.float64

# %% [markdown]
# ## 15.1 Uniform quantisation and the $\Delta^2/12$ rule
#
# A $b$-bit **uniform quantiser** represents a real $x$ by an integer code $q$ and a step
# $\Delta$ (the *scale*) shared by many values: $\hat x = \Delta\,(q - z)$. Two ways to choose
# $\Delta$ and the zero point $z$ are common:
#
# * **absmax** (symmetric): $\Delta = \max|x| / (2^{b-1}-1)$, $z = 0$,
#   $q = \mathrm{round}(x/\Delta) \in [-(2^{b-1}-1),\ 2^{b-1}-1]$ — one code of the $2^b$
#   is left unused so that the range is symmetric;
# * **zero-point** (asymmetric, "min-max"): the range $[\min(x,0), \max(x,0)]$ is cut into
#   $2^b-1$ steps, $\Delta = (\max-\min)/(2^b-1)$, $z = \mathrm{round}(-\min/\Delta)$,
#   $q = \mathrm{clamp}(\mathrm{round}(x/\Delta) + z,\ 0,\ 2^b-1)$. It uses all $2^b$ codes
#   and suits one-sided data such as the outputs of a ReLU or GELU.
#
# Rounding to the nearest level moves a value inside the range by at most half a step,
# $|e| = |\hat x - x| \le \Delta/2$. If the values fall anywhere within a step with equal
# probability, the error is uniform on $[-\Delta/2, \Delta/2]$, and SymPy gives its mean and
# mean square:

# %%
e, Delta = sp.symbols("e Delta", positive=True)
mean_e = sp.integrate(e / Delta, (e, -Delta / 2, Delta / 2))
mse_e = sp.integrate(e**2 / Delta, (e, -Delta / 2, Delta / 2))
assert mean_e == 0 and sp.simplify(mse_e - Delta**2 / 12) == 0
display(sp.Eq(sp.Symbol(r"\mathbb{E}[e]"), mean_e), sp.Eq(sp.Symbol(r"\mathbb{E}[e^2]"), mse_e))

# %% [markdown]
# Each extra bit halves $\Delta$ and divides the mean squared error by 4: about 6 dB per bit,
# the rule of thumb of signal processing. The package's quantisers return the codes together
# with the scale and zero point:

# %%
show_source(quantize_absmax)

# %%
show_source(quantize_zeropoint)

# %% [markdown]
# A worked example: five numbers at 8 bits absmax ($\Delta = 1.27/127 = 0.01$), and the same
# four non-negative numbers at 2 bits zero-point, where absmax would waste half of its codes
# on negative values that never occur.

# %%
x = torch.tensor([-1.0, -0.5, 0.0, 0.26, 1.27], dtype=f64)
qa = quantize_absmax(x, 8)
print("absmax, 8 bits:     q =", qa.q.tolist(), " scale =", round(qa.scale.item(), 6))
xp = torch.tensor([0.0, 0.9, 1.4, 3.0], dtype=f64)
qz = quantize_zeropoint(xp, 2)
print("zero-point, 2 bits: q =", qz.q.tolist(), " scale =", round(qz.scale.item(), 6),
      " zero =", int(qz.zero.item()), " x_hat =", dequantize(qz).tolist())

# %% [markdown]
# The rule measured: $n = 200\,000$ values spread evenly over $[-1, 1]$ (so every step is
# equally filled) at several bit widths, and the largest error against the bound $\Delta/2$.
# How close to 1 must the measured ratio $\mathrm{MSE}/(\Delta^2/12)$ be? The mean of $n$
# squared errors fluctuates with a relative standard deviation of
# $\sqrt{\mathrm{Var}(e^2)}/\mathbb E[e^2]\,/\sqrt n$, which SymPy gives before any
# rounding is done; the check allows five of them:

# %%
rel_sd_e2 = sp.sqrt(sp.integrate(e**4 / Delta, (e, -Delta / 2, Delta / 2)) - mse_e**2) / mse_e
n_uniform = 200_000
tol_mse = 5 * float(rel_sd_e2) / math.sqrt(n_uniform)
print(f"relative sd of e^2: {sp.nsimplify(rel_sd_e2)} = {float(rel_sd_e2):.4f}; "
      f"tolerance 5 sd / sqrt(n) = {tol_mse:.4f}")
x = torch.rand(n_uniform, generator=g, dtype=f64) * 2 - 1
checks = Checks("rounding error: MSE = Δ²/12 and |e| <= Δ/2")
for bits in (4, 6, 8):
    for name, quant in (("absmax", quantize_absmax), ("zero-point", quantize_zeropoint)):
        qt = quant(x, bits)
        err = dequantize(qt) - x
        ratio = float((err**2).mean() / (qt.scale**2 / 12))
        checks.close(f"{name} {bits} bits: MSE / (Δ²/12)", 1.0, ratio, tol=tol_mse)
        checks.true(f"{name} {bits} bits: max|e| / (Δ/2) <= 1", float(err.abs().max() / (qt.scale / 2)) <= 1 + 1e-9,
                    got=float(err.abs().max() / (qt.scale / 2)))
checks

# %% [markdown]
# ## 15.2 Per tensor, per channel, per group
#
# One scale for a whole weight matrix is set by its single largest entry: every other row
# then uses only part of the code range. A **per-channel** scale (one per output row of
# $W \in \mathbb R^{d_{out}\times d_{in}}$) adapts to each row; a **group-wise** scale (one per
# row and group of $g$ consecutive input columns, $g = 32$ to $128$ in practice) adapts
# further, at the price of storing $d_{out} d_{in}/g$ scales. The figure measures the three on
# a weight matrix of the book's trained model (the first MLP layer, $256 \times 64$), with
# the prediction $\Delta^2/12$ averaged over the blocks as dashed lines.

# %%
model, info = book_model("synthetic")
W_fc = model.blocks[0].mlp.fc.weight.detach().to(f64)  # (256, 64)
layouts = {"per tensor": {}, "per channel": {"dim": 0}, "groups of 16": {"group_size": 16}}
bit_range = list(range(2, 9))
mse, predicted = {k: [] for k in layouts}, {k: [] for k in layouts}
for name, kw in layouts.items():
    for bits in bit_range:
        qt = quantize_zeropoint(W_fc, bits, **kw)
        mse[name].append(float(((dequantize(qt) - W_fc) ** 2).mean()))
        predicted[name].append(float((qt.scale**2).mean() / 12))

# %%
fig, ax = plt.subplots(figsize=(6.4, 4))
for (name, values), colour in zip(mse.items(), ["C0", "C1", "C2"], strict=True):
    ax.semilogy(bit_range, values, "o-", color=colour, label=name)
    ax.semilogy(bit_range, predicted[name], "--", color=colour, alpha=0.6)
ax.set(xlabel="bits per weight b", ylabel="mean squared error (weight units²)",
       title="Zero-point quantisation of a 256×64 weight (dashed: Δ²/12)")
ax.legend()
save_figure(fig, "15_quantisation_granularity")
plt.show()

# %% [markdown]
# Every line falls by a factor of about 4 per bit, as $\Delta^2/12$ says, and the dashed
# predictions sit on the measurements except at 2 bits, where a step is so wide that values
# no longer fill it evenly. Finer blocks shift the whole line down: groups of 16 at $b$ bits
# are about as accurate as one scale per tensor at $b+1$ bits.
#
# ## 15.3 Integer matrix multiplication
#
# Quantising weights *and* activations to int8 lets the matrix product itself run on integer
# units. With per-row scales $s^A_m$ for the activations $A$ (M, K) (one per token) and
# $s^B_n$ for the weights $B$ (N, K) (one per output channel), the product factorises:
#
# $$ (A B^\top)_{mn} \approx \sum_k s^A_m q^A_{mk}\, s^B_n q^B_{nk}
#    = s^A_m s^B_n \sum_k q^A_{mk} q^B_{nk} , $$
#
# an integer dot product followed by one float multiplication per output. A product of two
# int8 codes is at most $127^2 = 16129$ in magnitude, so the running sum needs a wider
# accumulator: int16 ($\le 32767$) overflows after 3 worst-case terms, int32 after
# $\lfloor (2^{31}-1)/127^2 \rfloor + 1 = 133\,145$, far more than any model width.

# %%
show_source(int8_matmul)

# %% [markdown]
# The checks: the int32 result equals the float product of the dequantised matrices (the
# integer part is exact, so the only error is float round-off), and a row of eight codes of
# 127 summed in a simulated int16 accumulator wraps around to a wrong, even negative, value.
# The error of W8A8 against the float product is predicted from the scales alone by section
# 15.1's rule: to first order $\hat A\hat B^\top - AB^\top \approx E_A B^\top + A E_B^\top$ with
# independent rounding errors of variance $\Delta^2/12$, so
# $\mathbb E\lVert \hat A\hat B^\top - AB^\top\rVert_F^2 \approx \sum_m \frac{(s^A_m)^2}{12}\lVert B\rVert_F^2 +
# \sum_n \frac{(s^B_n)^2}{12}\lVert A\rVert_F^2$. The squared error is a sum over
# $16 \times 24 = 384$ outputs, each close to Gaussian, so it scatters by about
# $\sqrt{2/384} \approx 7\,\%$ and its root by half that; the check allows 15 %, fixed before
# the run.

# %%
A = torch.randn(16, 768, generator=g, dtype=f64)  # (M, K): 16 tokens
B = torch.randn(24, 768, generator=g, dtype=f64)  # (N, K): 24 output channels
aq, bq = quantize_absmax(A, 8, dim=0), quantize_absmax(B, 8, dim=0)
y_int = int8_matmul(aq, bq)  # (16, 24)
integer_part = (aq.q.to(torch.int64) @ bq.q.to(torch.int64).T).to(f64)
ones = quantize_absmax(torch.ones(1, 8, dtype=f64), 8)
checks = Checks("int8 matmul with int32 accumulation")
checks.close("int32 result = float product of dequantised", dequantize(aq) @ dequantize(bq).T, y_int, tol=1e-12)
checks.close("integer part exact", integer_part, y_int / (aq.scale * bq.scale.T), tol=1e-9)
checks.equal("int16 overflows at K =", 3, accumulator_overflow_length(16, 8))
checks.equal("int32 overflows at K =", 133_145, accumulator_overflow_length(32, 8))
checks.equal("8 × 127² in int16 wraps to", ((8 * 16129 + 2**15) % 2**16) - 2**15,
             round(int8_matmul(ones, ones, acc_bits=16).item() / ones.scale.item() ** 2))
w8a8_predicted = math.sqrt(float((aq.scale**2).sum() / 12 * (B**2).sum()
                                  + (bq.scale**2).sum() / 12 * (A**2).sum())) / float((A @ B.T).norm())
checks.close("relative error of W8A8 vs float: measured / predicted from Δ²/12", 1.0,
             float((y_int - A @ B.T).norm() / (A @ B.T).norm()) / w8a8_predicted, tol=0.15)
checks

# %% [markdown]
# ## 15.4 Outliers
#
# Weights are well behaved; activations of large language models are not. Dettmers et al.
# (2022, "LLM.int8(): 8-bit Matrix Multiplication for Transformers at Scale") found that
# beyond a few billion parameters a handful of hidden *channels* carry values up to 100 times
# larger than the rest, in almost every token. A per-tensor or per-token scale is then set by
# the outliers, and the ordinary channels are rounded to a few codes or to zero.
#
# A synthetic layer shows it: 512 tokens of width 256, of which 4 channels are 100 times
# larger. Four ways to quantise the activations to 8 bits (weights per channel, 8 bits):

# %%
X = torch.randn(512, 256, generator=g, dtype=f64)
X[:, :4] *= 100.0  # four outlier channels, in every token
W = torch.randn(128, 256, generator=g, dtype=f64) / 16
y_ref = X @ W.T  # (512, 128)
wq = quantize_absmax(W, 8, dim=0)


def measure(x_hat, y):
    """Relative error of the ordinary channels of X, and of the layer output."""
    ordinary = float((x_hat[:, 4:] - X[:, 4:]).norm() / X[:, 4:].norm())
    return ordinary, float((y - y_ref).norm() / y_ref.norm())


# %% [markdown]
# The four: one scale for the whole activation tensor; one per token (row); one per channel
# (column), which is accurate but cannot be pulled out of the sum over $k$, so it does not
# run on integer units; and **smoothing**, which moves the difficulty into the weights
# (Xiao et al., 2023, "SmoothQuant: Accurate and Efficient Post-Training Quantization for
# Large Language Models"; AWQ in section 15.7 uses the same identity for weight-only
# quantisation): $XW^\top = (X\,\mathrm{diag}(s)^{-1})(W\,\mathrm{diag}(s))^\top$ with
# $s_j = \sqrt{\max_n |X_{nj}| / \max_i |W_{ij}|}$, after which both factors are quantised
# per row.

# %%
s = (X.abs().amax(0) / W.abs().amax(0)).sqrt()  # (256,)
results = {}
for name, kw in (("per tensor", {}), ("per token", {"dim": 0})):
    xq = quantize_absmax(X, 8, **kw)
    results[name] = measure(dequantize(xq), int8_matmul(xq, wq))
xq = quantize_absmax(X, 8, dim=1)
results["per channel (float matmul)"] = measure(dequantize(xq), dequantize(xq) @ dequantize(wq).T)
xq = quantize_absmax(X / s, 8, dim=0)
results["smoothed, per token"] = measure(dequantize(xq) * s,
                                         int8_matmul(xq, quantize_absmax(W * s, 8, dim=0)))
print(f"{'activation scales':28s} {'ordinary channels':>18s} {'layer output':>13s}")
for name, (err_x, err_y) in results.items():
    print(f"{name:28s} {err_x:18.3e} {err_y:13.3e}")

# %% [markdown]
# With one scale per tensor the step is set by the outliers, $\Delta \approx 100 \cdot 4/127$,
# larger than most ordinary values: they round to zero and about three quarters of their
# content is lost.
# Per-token scales do not help much, since every token contains the outliers. Per-channel
# scales fix the activations, and smoothing, which stays integer-friendly, brings the output
# error down about five-fold (a measurement on this one layer, printed above).
#
# Two of these numbers can be predicted from the scales without rounding anything. An
# ordinary value is standard normal, and it rounds to code 0 when $|x| < \Delta/2$, which
# happens with probability $\operatorname{erf}(\Delta / 2\sqrt 2)$; with $n = 512 \times 252$
# values the measured share scatters by $\sqrt{p(1-p)/n} \approx 0.0011$ (the check allows
# 0.01). With one scale per channel the step is small against the spread of the values, so
# the rule $\Delta^2/12$ of section 15.1 predicts the error of the ordinary channels; the
# relative scatter of a mean of $n$ squared uniform errors is $\sqrt{4/5}/\sqrt n = 0.25\,\%$,
# and of its root half that (the check allows 1 %).

# %%
xq_tensor = quantize_absmax(X, 8)
p_zero = math.erf(float(xq_tensor.scale) / (2 * math.sqrt(2)))
xq_channel = quantize_absmax(X, 8, dim=1)
ordinary_predicted = math.sqrt(float(X.shape[0] * (xq_channel.scale.reshape(-1)[4:] ** 2).sum() / 12)) / float(X[:, 4:].norm())
checks = Checks("activation outliers, against predictions from the scales")
checks.close("per tensor: share of ordinary values rounded to 0 vs erf(Δ/2√2)", p_zero,
             float((xq_tensor.q[:, 4:] == 0).double().mean()), tol=0.01)
checks.close("per channel: ordinary channels' error / √(Σ Δ²/12)", 1.0,
             results["per channel (float matmul)"][0] / ordinary_predicted, tol=0.01)
checks

# %% [markdown]
# ## 15.5 NF4: levels from the normal distribution
#
# Trained weights are roughly normally distributed. Uniform levels spend as many codes on
# the rare tails as on the crowded centre. Dettmers et al. (2023, "QLoRA: Efficient
# Finetuning of Quantized LLMs", section 3) place the 16 levels of **4-bit NormalFloat** at
# quantiles of $\mathcal N(0,1)$ instead, so that each level receives about the same share
# of the weights, and normalise them to $[-1, 1]$ (a group is divided by its absmax first).
# The quantile function $\Phi^{-1}$ is infinite at 0 and 1, so the outermost level sits at
# quantile $1-\delta$ with $\delta = \frac12(\frac1{32}+\frac1{30})$, half-way between what
# 16 and 15 levels on one side would give. To make 0 exactly representable (padding and
# pruned weights are 0) the code is asymmetric: 8 positive levels from the quantiles
# $\mathrm{linspace}(1-\delta, \frac12, 9)$ without its last point, 7 negative levels mirrored
# from $\mathrm{linspace}(1-\delta, \frac12, 8)$, and 0:

# %%
show_source(nf4_levels)

# %%
NF4_PUBLISHED = torch.tensor([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=f64)
levels = nf4_levels()
checks = Checks("NF4 levels against QLoRA's table")
checks.close("offset 1 - δ", 0.9677083, nf4_offset(), tol=1e-7)
checks.close("16 levels vs the published table", NF4_PUBLISHED, levels, tol=1e-4)
p = torch.linspace(nf4_offset(), 0.5, 9, dtype=f64)[:-1]
checks.close("positive levels via torch.special.ndtri", levels[8:],
             torch.sort(torch.special.ndtri(p) / torch.special.ndtri(p).max()).values, tol=1e-12)
checks.equal("levels < 0, = 0, > 0", [7, 1, 8],
             [int((levels < 0).sum()), int((levels == 0).sum()), int((levels > 0).sum())])
checks

# %% [markdown]
# ## 15.6 GPTQ: rounding with second-order corrections
#
# Round-to-nearest (RTN) treats every weight alone. But what a layer $y = x W^\top$ must
# preserve is its output on real inputs: for calibration inputs $X$ ($N \times d_{in}$),
# the error $\lVert X(W-\hat W)^\top\rVert^2 = \sum_i \delta_i^\top (X^\top X)\, \delta_i$ is
# a sum of quadratic forms, one per row $\delta_i$ of $W - \hat W$, all with the Hessian
# $H = 2X^\top X$ (of $\lVert X\delta\rVert^2$). When the inputs are correlated, the error
# of one rounded weight can be partly cancelled by moving the others.
#
# **The optimal brain surgeon step** (Hassibi & Stork, 1993, "Second order derivatives for
# network pruning: Optimal Brain Surgeon"). Weight $q$ of a row must change by a fixed amount,
# from $w_q$ to its rounded value $\mathrm{quant}(w_q)$; the other weights may move freely.
# The cheapest change $\delta$ solves
#
# $$ \min_\delta \tfrac12 \delta^\top H \delta \quad\text{s.t.}\quad
#    e_q^\top\delta = \mathrm{quant}(w_q) - w_q . $$
#
# SymPy solves the Lagrangian for three weights with a general symmetric $H$:

# %%
a, b, c_, d_, f_, h_ = sp.symbols("a b c d f h", real=True)
H3 = sp.Matrix([[a, b, c_], [b, d_, f_], [c_, f_, h_]])
delta = sp.Matrix(sp.symbols("delta0:3", real=True))
lam, w_q, w_rounded = sp.symbols("lambda w_q \\mathrm{quant}(w_q)", real=True)
q = 1  # the weight being rounded
L = (delta.T * H3 * delta)[0] / 2 + lam * (delta[q] - (w_rounded - w_q))
sol = sp.solve([sp.diff(L, v) for v in [*delta, lam]], [*delta, lam], dict=True)[0]
Hinv = H3.inv()
obs = -(w_q - w_rounded) / Hinv[q, q] * Hinv[:, q]
assert all(sp.simplify(sol[delta[i]] - obs[i]) == 0 for i in range(3))
loss = sp.simplify((sp.Matrix([sol[v] for v in delta]).T * H3 * sp.Matrix([sol[v] for v in delta]))[0] / 2)
assert sp.simplify(loss - (w_q - w_rounded) ** 2 / (2 * Hinv[q, q])) == 0
display(sp.Eq(sp.Symbol(r"\delta"), sp.Symbol(r"-\frac{w_q - \mathrm{quant}(w_q)}{[H^{-1}]_{qq}}\, H^{-1}_{:,q}")),
        sp.Eq(sp.Symbol(r"\Delta\mathcal{L}"), sp.Symbol(r"\frac{(w_q - \mathrm{quant}(w_q))^2}{2\,[H^{-1}]_{qq}}")))

# %% [markdown]
# So rounding weight $q$ and compensating optimally moves the row by
# $\delta = -\frac{w_q - \mathrm{quant}(w_q)}{[H^{-1}]_{qq}} H^{-1}_{:,q}$ and costs
# $\frac{(w_q - \mathrm{quant}(w_q))^2}{2[H^{-1}]_{qq}}$. The stationary point is the
# minimiser: with $H$ positive definite the objective is strictly convex on the constraint's
# line. **GPTQ** (Frantar et al., 2023,
# "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained Transformers")
# applies this to the columns in a fixed order $q = 0, 1, \dots, d_{in}-1$, for all rows at
# once (they share $H$): round column $q$, push its error into the columns not yet rounded,
# then remove $q$ from the problem. The next step needs the inverse of $H$ with row and
# column $q$ deleted, and GPTQ obtains it from $H^{-1}$ by a rank-one **downdate**:
#
# $$ (H_{-q,-q})^{-1} = \Big(H^{-1} - \frac{H^{-1}_{:,q} H^{-1}_{q,:}}{[H^{-1}]_{qq}}\Big)_{-q,-q} . $$
#
# Why: order the variables so that $q$ comes last, $H = \begin{pmatrix} A & b \\ b^\top & c
# \end{pmatrix}$ with $A = H_{-q,-q}$. The block inverse is built on the **Schur complement**
# $s = c - b^\top A^{-1} b$: $H^{-1} = \begin{pmatrix} A^{-1} + A^{-1}bb^\top A^{-1}/s &
# -A^{-1}b/s \\ -b^\top A^{-1}/s & 1/s\end{pmatrix}$. SymPy checks, with $A$ and $b$ left as
# matrix symbols (any size), that this is the inverse, and that the downdate of it is
# $A^{-1}$; the bottom row of $HH^{-1} = I$ reduces to the scalar $u = b^\top A^{-1} b$:

# %%
n_ = 3  # the symbols stand for any size; SymPy needs one to build them
A_ = sp.MatrixSymbol("A", n_, n_)
b_ = sp.MatrixSymbol("b", n_, 1)
s_c, c_c, u_c = sp.symbols("s c u")  # Schur complement, corner, u = b^T A^-1 b
Ai = A_.I
top, col, row, corner = Ai + Ai * b_ * b_.T * Ai / s_c, -Ai * b_ / s_c, -b_.T * Ai / s_c, 1 / s_c
schur = {"top-left of H H^-1": sp.simplify((A_ * top + b_ * row).expand()),
         "top-right of H H^-1": sp.simplify(A_ * col + b_ * corner),
         # bottom row: b^T top + c row = b^T A^-1 (1 + u/s - c/s); b^T col + c/s = (c - u)/s
         "bottom-left factor": sp.simplify((1 + u_c / s_c - c_c / s_c).subs(s_c, c_c - u_c)),
         "bottom-right": sp.simplify(((c_c - u_c) / s_c).subs(s_c, c_c - u_c)),
         "downdate - A^-1": sp.simplify(top - col * row / corner - Ai)}
for k_, v_ in schur.items():
    print(f"{k_:22s} = {v_}")

# %% [markdown]
# The same identity on explicit matrices: a general symmetric $H$ of size 3 (every $q$) and
# 4 ($q = 1$), ten free entries, with $H^{-1} = \operatorname{adj}(H)/\det H$ so that the
# claim "downdate $\times\ H_{-q,-q} = I$" becomes a polynomial identity that `expand`
# decides:

# %%
def symmetric_matrix(n):
    """A general symmetric n x n matrix of n(n+1)/2 free symbols."""
    entries = iter(sp.symbols(f"h0:{n * (n + 1) // 2}", real=True))
    M = sp.zeros(n, n)
    for i in range(n):
        for j in range(i, n):
            M[i, j] = M[j, i] = next(entries)
    return M


downdate_ok = {}
for n_h, qs in ((3, (0, 1, 2)), (4, (1,))):
    Hs = symmetric_matrix(n_h)
    adj, det_h = Hs.adjugate(), sp.expand(Hs.det(method="berkowitz"))
    for q_ in qs:
        keep = [i for i in range(n_h) if i != q_]
        # det(H) [adj]_qq x downdate = adj_KK adj_qq - adj_Kq adj_qK  (K: the kept indices)
        numer = adj.extract(keep, keep) * adj[q_, q_] - adj.extract(keep, [q_]) * adj.extract([q_], keep)
        residual = (numer * Hs.extract(keep, keep) - det_h * adj[q_, q_] * sp.eye(n_h - 1)).applyfunc(sp.expand)
        downdate_ok[f"{n_h}x{n_h}, q = {q_}"] = residual.is_zero_matrix
checks = Checks("GPTQ's downdate, derived")
expected = {"top-left of H H^-1": sp.Identity(n_), "top-right of H H^-1": sp.ZeroMatrix(n_, 1),
            "bottom-left factor": 0, "bottom-right": 1, "downdate - A^-1": sp.ZeroMatrix(n_, n_)}
for k_, v_ in schur.items():
    checks.true(f"Schur block inverse: {k_} = {expected[k_]}", v_ == expected[k_], got=v_)
for k_, ok in downdate_ok.items():
    checks.true(f"downdate x H_-q,-q = I, {k_}", ok, got="residual expands to 0" if ok else "nonzero")
checks

# %% [markdown]
# The teaching version keeps $H^{-1}$ and applies the OBS update and the downdate column by
# column:

# %%
show_source(gptq_quantize_naive)

# %% [markdown]
# The downdates cost $O(d_{in}^3)$ in total and accumulate round-off. GPTQ's observation:
# the row $q$ of the downdated inverse that step $q$ needs, divided by
# $\sqrt{[H^{-1}]_{qq}}$, is row $q$ of the upper Cholesky factor $U$ of the *original*
# $H^{-1} = U^\top U$: the successive downdates are exactly the steps of a Cholesky
# factorisation. So one factorisation up front replaces them all, and in
# $\delta = -\mathrm{err}/U_{qq} \cdot U_{q,:}$ with $\mathrm{err} = (w_q -
# \mathrm{quant}(w_q))/U_{qq}$ every update is read off $U$. The updates of a block of
# $B = 128$ columns are applied inside the block, and to the later columns at once as one
# matrix product (*lazy batch updates*). A damping $\lambda = 0.01\cdot\mathrm{mean}(\mathrm{diag}\,H)$
# added to the diagonal keeps $H$ invertible.

# %%
show_source(gptq_quantize)

# %% [markdown]
# The checks on one layer with correlated inputs (1024 tokens, $d_{in} = 64$,
# $d_{out} = 48$, 3 bits, groups of 16): the Cholesky and the naive formulation agree to
# round-off, and GPTQ's output error is well below round-to-nearest's. The OBS costs that
# GPTQ adds up column by column must also add up to the final objective exactly: each step
# minimises the quadratic over the columns left, so the increments telescope to
# $\tfrac12\,\delta^\top (H + \lambda I)\,\delta$ summed over the rows, that is
# $\lVert X(W-\hat W)^\top\rVert_F^2 + \tfrac{\lambda}{2}\lVert W - \hat W\rVert_F^2$ with the damping
# $\lambda$, computed from the final weights alone:

# %%
mix = torch.randn(64, 64, generator=g, dtype=f64) / 8 + torch.eye(64, dtype=f64)
Xc = torch.randn(1024, 64, generator=g, dtype=f64) @ mix  # (N, d_in), correlated columns
Wl = torch.randn(48, 64, generator=g, dtype=f64)  # (d_out, d_in)
Hl = hessian_from_inputs(Xc)
W_chol, stats = gptq_quantize(Wl, Hl, 3, 16, block_size=32)
W_naive, _ = gptq_quantize_naive(Wl, Hl, 3, 16)
err_rtn, err_gptq = layer_output_error(Wl, quantize_rtn(Wl, 3, 16), Xc), layer_output_error(Wl, W_chol, Xc)
checks = Checks("GPTQ on one layer")
checks.close("Cholesky = naive (explicit inverse + downdates)", W_naive, W_chol, tol=1e-6)
checks.true("‖(W - Ŵ)Xᵀ‖: GPTQ < RTN", err_gptq < err_rtn, got=f"{err_gptq:.4g} vs {err_rtn:.4g}")
lam_damp = 0.01 * float(Hl.diagonal().mean())  # gptq_quantize's default damping
checks.close("Σ OBS costs = ‖X(W - Ŵ)ᵀ‖² + λ/2 ‖W - Ŵ‖²", err_gptq**2 + lam_damp / 2 * float(((Wl - W_chol) ** 2).sum()),
             stats["loss"], tol=1e-9, rel=True)
checks

# %% [markdown]
# ### Two references that do not share GPTQ's algebra
#
# "Cholesky = naive" only shows that two implementations of one algebra agree. Two
# checks that use none of it:
#
# **Least squares on $X$.** After column $q$ is rounded, the best values of the columns
# not yet rounded are those that make the layer's outputs closest to the original ones,
# $\min_{W_F} \lVert X W^\top - X_Q \hat W_Q^\top - X_F W_F^\top\rVert$, with $Q$ the rounded
# columns and $F$ the free ones: an ordinary least-squares problem in $X$ itself.
# `gptq_lstsq_reference` solves it with `torch.linalg.lstsq` after every column, and never
# forms $H$ or its inverse. If the OBS update and the downdate are right, it lands on the
# same $\hat W$. GPTQ's damping is a ridge term, reproduced by appending the rows
# $\sqrt{\lambda/2}\, I$ to $X$ (then $2X^\top X$ becomes $2X^\top X + \lambda I$):

# %%
show_source(gptq_lstsq_reference)

# %%
checks = Checks("GPTQ vs sequential least squares on X (no H⁻¹)")
for damp, group in ((0.0, None), (0.01, 16)):
    W_ls = gptq_lstsq_reference(Wl, Xc, 3, group, damp=damp)
    W_g, _ = gptq_quantize(Wl, Hl, 3, group, block_size=32, damp=damp)
    checks.close(f"damp {damp}, groups {group}: lstsq = GPTQ (Cholesky)", W_ls, W_g, tol=1e-10)
checks

# %% [markdown]
# **The true optimum.** GPTQ is greedy: each column is rounded once, and never revisited.
# On a layer small enough, one row of 6 weights at 2 bits, all $4^6 = 4096$ points of the
# quantisation grid can be tried (`quantize_brute_force`; the grid is the row's zero-point
# grid that RTN and GPTQ use too), which gives the exact minimum of
# $\lVert X(w - \hat w)^\top\rVert$. Over 200 random problems with correlated inputs,
# where do RTN and GPTQ land?

# %%
show_source(quantize_brute_force)

# %%
g_bf = torch.Generator().manual_seed(15)  # its own stream
gaps = {"rtn": [], "gptq": []}  # error / optimal error - 1
for _ in range(200):
    X6 = torch.randn(64, 6, generator=g_bf, dtype=f64) @ (torch.randn(6, 6, generator=g_bf, dtype=f64)
                                                          + 2 * torch.eye(6, dtype=f64))
    w6 = torch.randn(1, 6, generator=g_bf, dtype=f64)
    H6 = hessian_from_inputs(X6)
    e_opt = layer_output_error(w6, quantize_brute_force(w6, H6, 2), X6)
    gaps["rtn"].append(layer_output_error(w6, quantize_rtn(w6, 2), X6) / e_opt - 1)
    gaps["gptq"].append(layer_output_error(w6, gptq_quantize(w6, H6, 2, damp=0.0)[0], X6) / e_opt - 1)
gaps = {k: torch.tensor(v, dtype=f64) for k, v in gaps.items()}
print(f"{'':6s} {'optimal (of 200)':>17s} {'median excess':>14s} {'90th pct':>9s} {'worst':>7s}")
for k, v in gaps.items():
    print(f"{k:6s} {int((v < 1e-9).sum()):17d} {float(v.median()):14.1%} "
          f"{float(v.quantile(0.9)):9.1%} {float(v.max()):7.1%}")
checks = Checks("brute-force optimum, 1 x 6 weights, 2 bits, 200 problems")
checks.true("no method beats the enumerated optimum", bool(min(v.min() for v in gaps.values()) > -1e-9),
            got=float(min(v.min() for v in gaps.values())))
checks.true("GPTQ's median excess < RTN's", bool(gaps["gptq"].median() < gaps["rtn"].median()),
            got=f"{float(gaps['gptq'].median()):.3f} vs {float(gaps['rtn'].median()):.3f}")
checks.true("GPTQ no worse than RTN in most (> 100) problems", int((gaps["gptq"] <= gaps["rtn"] + 1e-12).sum()) > 100,
            got=int((gaps["gptq"] <= gaps["rtn"] + 1e-12).sum()))
checks

# %% [markdown]
# GPTQ sits between the two: it finds the exact optimum in 89 of the 200 problems (RTN in
# 55), and its median excess over the optimum is about 7 % against RTN's 30 %. It is not
# an optimiser, though: in 33 problems its greedy choice of an early column ends up worse
# than plain rounding, and its worst case is nearly three times the optimal error. On layers
# of realistic width the enumeration is impossible ($2^{b\,d_{in}}$ points), and GPTQ is the
# practical compromise.

# %% [markdown]
# ## 15.7 AWQ: protecting the weights that meet large activations
#
# Lin et al. (2024, "AWQ: Activation-aware Weight Quantization for LLM Compression and
# Acceleration") observe that the weights in the input channels with large activations
# matter most, and protect them without mixed precision: multiply input column $j$ of $W$
# by $s_j > 1$ before quantising and divide the activations by $s_j$ (section 15.8 folds the
# division into the operation that produces the input). The scaled weight's rounding error
# is divided by $s_j$ on the way out, so the salient channels lose less. The scales are
# $s = \overline{|X|}^{\,\alpha}$, the mean activation magnitude per channel to a power
# $\alpha \in [0,1]$ found by a grid search on the layer's output error ($\alpha = 0$ is RTN):

# %%
show_source(awq_scale_search)

# %% [markdown]
# On the outlier layer of section 15.4 at 3 bits with groups of 32, the search for this one
# layer picks a large $\alpha$ and cuts the output error; on the well-behaved layer above it
# has little to gain. Since $\alpha = 0$ is on the grid, AWQ can never do worse than RTN on
# the data it was searched on: that ratio is a measurement, not a test. The test is on fresh
# inputs from the same distribution (new tokens, the same four outlier channels), which the
# search never saw:

# %%
X_fresh = torch.randn(512, 256, generator=torch.Generator().manual_seed(157), dtype=f64)  # its own stream
X_fresh[:, :4] *= 100.0  # the same four outlier channels, new tokens
checks = Checks("AWQ at 3 bits, groups of 32, on inputs the search did not see")
awq_fit = {}
for name, (W_, X_) in {"outlier layer": (W, X), "correlated layer": (Wl, Xc)}.items():
    awq_fit[name], st = awq_scale_search(W_, X_, 3, 32)
    e_awq, e_rtn = layer_output_error(W_, awq_fit[name], X_), layer_output_error(W_, quantize_rtn(W_, 3, 32), X_)
    print(f"{name:17s} alpha = {st['alpha']:.2f}  error AWQ / RTN on its calibration data = {e_awq / e_rtn:.3f}")
fresh_ratio = layer_output_error(W, awq_fit["outlier layer"], X_fresh) / \
    layer_output_error(W, quantize_rtn(W, 3, 32), X_fresh)
checks.true("outlier layer, fresh inputs: AWQ error < RTN error", fresh_ratio < 1, got=f"{fresh_ratio:.3f}")
checks

# %% [markdown]
# ## 15.8 The book's model at 8, 4 and 3 bits
#
# Now the real test: every linear layer of the decoder blocks of the book's trained
# synthetic model (chapter 10: $d = 64$, 2 layers, trained on the order-2 Markov source of
# chapter 3) quantised by RTN, GPTQ and AWQ, with zero-point codes in groups of 32 input
# columns. The token embedding (tied with the output layer), positions and norms stay in
# float, as is common. `quantize_model` stores the dequantised weights in float ("fake
# quantisation"): the model computes what a kernel reading the codes would, so the loss
# measures exactly the quantisation error. GPTQ and AWQ calibrate on 256 windows of 16
# tokens of training data. GPTQ goes layer by layer in forward order, each layer seeing the
# outputs of the already-quantised layers before it; AWQ searches its scales on the float
# model's activations, as the authors' code does. The loss is measured on validation data,
# on the predictions that see the source's full context, as in chapter 10.

# %%
show_source(quantize_model)

# %%
d = RECIPES["synthetic"]["data"]
train_tokens, val_tokens = default_source().train_val(d["num_train"], d["num_val"], seed=d["seed"])
calib, _ = get_batch(train_tokens, 256, 16, "cpu", torch.Generator().manual_seed(0))

# %% [markdown]
# ### AWQ in a model: one scale per input, folded away
#
# A scale $s$ on the input of a layer is free only if something can divide the input by
# $s$ before it arrives. In a pre-norm block that is the norm: its output is
# $\hat x \odot \gamma + \beta$, and dividing $\gamma$ and $\beta$ by $s$ divides the
# output. But `q_proj`, `k_proj` and `v_proj` all read that *one* output, so they must
# share *one* $s$; three separately searched scales could not all be folded into one norm.
# So `awq_scale_model` groups the layers by their input, as Lin et al. (2024, section 3.2
# and their released code) do, and scores each $\alpha$ on the output of the sub-block the
# group feeds, not of each layer:
#
# | group | shares the input | $1/s$ folded into | $\alpha$ scored on |
# |---|---|---|---|
# | q, k, v | attention norm's output | the attention norm's $\gamma, \beta$ | the attention output |
# | o_proj | $PV$, the heads' outputs | the rows (and bias) of v_proj | o_proj's output |
# | fc | MLP norm's output | the MLP norm's $\gamma, \beta$ | the MLP output |
# | proj | GELU(fc $x$) | nothing: GELU$(x/s) \ne$ GELU$(x)/s$ | proj's output |
#
# The o_proj fold works because attention mixes the rows of $V$ with weights that do not
# depend on $V$: dividing the $j$-th output of v_proj by $s_j$ divides the $j$-th input of
# o_proj by $s_j$ exactly (not so under grouped-query attention, where one row of v_proj
# feeds several heads). The MLP's output layer has no such producer in a GELU MLP (in
# SwiGLU, down_proj's input is linear in up_proj, which takes the fold); its scale stays an
# explicit division of the input, $\hat W = Q(W\,\mathrm{diag}(s))\,\mathrm{diag}(s)^{-1}$,
# which a kernel applies to the activations (AWQ's code does the same for GELU models with a
# "scaled activation"). Folding must not change the float model at all, and in float64 it
# does not:

# %%
show_source(awq_scale_model)

# %%
scaled, awq_records = awq_scale_model(model, 3, 32, calib)
print(f"{'block':>5s}  {'group':8s} {'alpha':>5s}  {'1/s folded into':22s} {'sub-block error / RTN':>22s}")
for r in awq_records:
    print(f"{r['block']:5d}  {r['group']:8s} {r['alpha']:5.2f}  {str(r['folded_into']):22s} "
          f"{min(r['errors']) / r['errors'][0]:22.3f}")
model64 = copy.deepcopy(model).to(f64)
checks = Checks("AWQ scales folded into the float model (float64)")
checks.close("logits of the folded model vs the original", model64(calib), scaled(calib), tol=1e-12)
ratio = scaled.blocks[0].attn_norm.weight / model64.blocks[0].attn_norm.weight
checks.close("attention norm gain divided by the q/k/v scale", 1 / awq_records[0]["scales"], ratio,
             tol=1e-12)
checks


def val_loss(m):
    return evaluate(m, val_tokens, 256, 16, 8, torch.Generator().manual_seed(1234),
                    first_position=info["val_first_position"])


base = val_loss(model)
losses = {meth: {b: val_loss(quantize_model(model, meth, b, 32, calib)) for b in (8, 4, 3)}
          for meth in ("rtn", "gptq", "awq")}
print(f"float: loss {base:.4f} nats/token, perplexity {math.exp(base):.4f}")
for meth, row in losses.items():
    print(f"{meth:5s}", "  ".join(f"{b} bits: ppl {math.exp(v):.4f} ({math.exp(v) - math.exp(base):+.4f})"
                                  for b, v in row.items()))

# %%
fig, ax = plt.subplots(figsize=(6.4, 4))
for i, (meth, row) in enumerate(losses.items()):
    increase = [math.exp(row[b]) - math.exp(base) for b in (8, 4, 3)]
    ax.bar([j + (i - 1) * 0.27 for j in range(3)], increase, width=0.27, label=meth.upper())
ax.set_xticks(range(3), ["8 bits", "4 bits", "3 bits"])
ax.set(ylabel="perplexity increase over float", xlabel="bits per weight (groups of 32)",
       title=f"Quantised book model (float perplexity {math.exp(base):.3f})")
ax.legend()
save_figure(fig, "15_quantisation_perplexity")
plt.show()

# %% [markdown]
# At 8 bits every method is indistinguishable from the float model. At 4 and 3 bits
# round-to-nearest costs visibly more, and GPTQ recovers most of it: its perplexity increase
# is a fraction of RTN's. AWQ is no better than RTN here, and slightly worse at 3 bits. The
# reason is the model, not the bookkeeping of shared scales: it has no outlier channels to
# protect (the search picks small $\alpha$ and gains a few per cent per sub-block, and by
# construction never loses on its calibration data, since $\alpha = 0$ is RTN), and a
# sub-block's lower error on calibration data does not carry over to the loss of the whole
# model, where the errors of all layers combine. These increases are measurements of one
# model on one validation sample (printed above); the check below claims only the ordering
# that GPTQ's construction predicts.

# %%
checks = Checks("book model: GPTQ vs round-to-nearest")
for b in (4, 3):
    checks.true(f"{b} bits: GPTQ's increase < RTN's", losses["gptq"][b] - base < losses["rtn"][b] - base,
                got=(losses["gptq"][b] - base) / (losses["rtn"][b] - base))
checks

# %% [markdown]
# The memory saved. Each quantised weight costs $b$ bits plus, per row and group of 32, a
# 16-bit scale and a $b$-bit zero point; every other parameter is counted at 16 bits. The
# embeddings, norms and biases (a few thousand parameters here, but in a small real model the
# embedding table is a large share) stay in float:

# %%
n_bytes = {"float16": model_memory_bytes(model)}
n_bytes |= {f"{b} bits, groups of 32": model_memory_bytes(model, b, 32) for b in (8, 4, 3)}
n_lin = sum(m.weight.numel() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear))
print(f"{model.num_parameters()} parameters, {n_lin} of them in quantised linear layers")
print(f"{'storage':22s} {'bytes':>8s} {'vs float16':>11s} {'bits/weight':>12s}")
for name, nb in n_bytes.items():
    bits_per_weight = 16 if name == "float16" else (8 * (nb - 2 * (model.num_parameters() - n_lin))) / n_lin
    print(f"{name:22s} {nb:8d} {nb / n_bytes['float16']:11.3f} {bits_per_weight:12.3f}")

# %% [markdown]
# The group scales add $(16 + b)/32$ bits to every weight, 0.6 to 0.75 bits here: a 4-bit
# model with groups of 32 really stores about 4.6 bits per weight, and groups of 128 (common
# for large models) bring that down to about 4.2.
#
# ## 15.9 Why fewer bits decode faster: the roofline
#
# Generating one token at batch size 1 multiplies every weight matrix by one vector: each
# weight is read from memory once and used in one multiply-add. With $N$ weights stored at
# $w$ bits each, a token costs $F = 2N$ FLOPs and moves $B = Nw/8$ bytes (the KV cache is
# left out: small at short contexts). Its arithmetic intensity is $F/B = 16/w$ FLOP/byte:
# 1 in float16, 4 at 4 bits. A GPU's balance point (peak FLOP/s over bytes/s, the roofline
# of chapter 14) is in the hundreds, about 295 on an H100 SXM (989 TFLOP/s dense 16-bit over
# 3.35 TB/s; NVIDIA H100 datasheet, 2022), so decoding is memory-bound by two orders of
# magnitude and its time is $B/\beta$. Weight-only quantisation reduces $B$ and nothing else
# that matters: the dequantisation is arithmetic, which is idle anyway. SymPy takes the
# speed-up over float16 from the byte count with $w = b + (16 + b)/g$ (a 16-bit scale and a
# $b$-bit zero per group of $g$), and the batch $n^*$ at which the kernel stops being
# memory-bound (a batch of $n$ tokens reuses each weight $n$ times: $F = 2Nn$):

# %%
N_w, b_s, g_s, w_s, beta, peak, n_tok = sp.symbols("N b g w beta pi n", positive=True)
w_bits = b_s + (16 + b_s) / g_s
t_decode = (N_w * w_bits / 8) / beta  # memory-bound time per step
speedup = sp.simplify((N_w * 16 / 8 / beta) / t_decode)
n_star = sp.solve(sp.Eq(2 * N_w * n_tok / (N_w * w_s / 8), peak / beta), n_tok)[0]  # w bits/weight
display(sp.Eq(sp.Symbol("S"), speedup), sp.Eq(sp.Symbol("S_{g \\to \\infty}"), sp.limit(speedup, g_s, sp.oo)),
        sp.Eq(sp.Symbol("n^*"), n_star))
print(f"{'storage':18s} {'bits/weight':>11s} {'speed-up':>9s} {'memory-bound below batch (H100)':>32s}")
for bits_, group_ in ((16, None), (8, 128), (4, 128), (4, 32), (3, 128)):
    w_ = stored_bits_per_weight(None if bits_ == 16 else bits_, group_)
    n_ = float(n_star.subs({peak: 989e12, beta: 3.35e12, w_s: w_}))
    label = f"{bits_} bits" + (f", g = {group_}" if group_ else "")
    print(f"{label:18s} {w_:11.3f} {float(speedup.subs({b_s: bits_, g_s: group_ or sp.oo})) if bits_ < 16 else 1.0:9.2f} "
          f"{n_:32.0f}")
llama7b = roofline(2 * 6.74e9, 6.74e9 * stored_bits_per_weight(4, 128) / 8, 989e12, 3.35e12)
llama7b_fp16 = roofline(2 * 6.74e9, 6.74e9 * 2, 989e12, 3.35e12)
print(f"Llama 2 7B on an H100, batch 1: float16 {6.74e9 * 2 / 1e9:.1f} GB and >= "
      f"{llama7b_fp16['time'] * 1e3:.1f} ms per token; 4 bits, g = 128: "
      f"{6.74e9 * stored_bits_per_weight(4, 128) / 8 / 1e9:.1f} GB and >= {llama7b['time'] * 1e3:.1f} ms; "
      f"intensity {llama7b['intensity']:.2f} FLOP/B against a balance of {llama7b['balance']:.0f}: "
      f"{llama7b['bound']}-bound")

# %% [markdown]
# The whole argument rests on the byte count $w$ per weight, so it is checked against storage
# that exists rather than against the formula again: the bits held by the tensors that
# `quantize_zeropoint` returns for every linear layer of the book's model (codes, scales and
# zero points counted element by element), and the block sizes that ggml's own package
# publishes (`gguf.constants.GGML_QUANT_SIZES`, from `ggml-common.h`), for its layouts with a
# float16 minimum (Q4_1: `zero_bits=16`) and without one (Q8_0: `zero_bits=0`), together
# with the real file's bytes per weight in those two types (section 15.10 lists them):

# %%
counted_bits = 16 * (model.num_parameters() - n_lin)  # everything but the quantised weights in 16 bits
for _, lin in ((n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n.startswith("blocks.")):
    qt = quantize_zeropoint(lin.weight.detach(), 4, group_size=32)
    counted_bits += 4 * qt.q.numel() + 16 * qt.scale.numel() + 4 * qt.zero.numel()
ggml_sizes = {q: gguf.constants.GGML_QUANT_SIZES[GGMLQuantizationType[q]] for q in ("Q4_1", "Q8_0")}  # (block, bytes)
file_types = tensor_types(read_gguf(smollm2_path()))  # type -> (tensors, weights, bytes)
checks = Checks("stored bits per weight against storage that exists")
checks.true("SymPy: S -> 16/b as g -> oo", sp.limit(speedup, g_s, sp.oo) == 16 / b_s,
            got=sp.limit(speedup, g_s, sp.oo))
checks.close("book model, 4 bits g = 32: bits counted in the quantiser's tensors / 8 = model_memory_bytes",
             counted_bits / 8, n_bytes["4 bits, groups of 32"], tol=1.0)
checks.close("… and per quantised weight = stored_bits_per_weight(4, 32)", stored_bits_per_weight(4, 32),
             (counted_bits - 16 * (model.num_parameters() - n_lin)) / n_lin, tol=1e-12)
for q, (bits_, zero_) in {"Q4_1": (4, 16), "Q8_0": (8, 0)}.items():
    w_ = stored_bits_per_weight(bits_, ggml_sizes[q][0], zero_bits=zero_)
    checks.equal(f"{q}: stored_bits_per_weight({bits_}, 32, zero_bits={zero_}) = 8 × ggml's {ggml_sizes[q][1]} "
                 f"bytes / {ggml_sizes[q][0]}", 8 * ggml_sizes[q][1] / ggml_sizes[q][0], w_)
    checks.equal(f"{q}: = 8 × bytes / weights of the file's {q} tensors", 8 * file_types[q][2] / file_types[q][1], w_)
checks

# %% [markdown]
# A 4-bit model with groups of 128 should decode about 3.85 times faster than float16,
# not 4: the group scales cost 0.16 bits per weight. For Llama 2 7B (6.74 billion
# parameters; Touvron et al., 2023, "Llama 2: Open Foundation and Fine-Tuned Chat Models")
# that is 3.5 GB read per token instead of 13.5 GB, at least 1.0 ms per token on an H100
# instead of 4.0 ms. The gain lasts only while the kernel is memory-bound: a batch of
# $n$ tokens reuses every weight $n$ times, and since fewer bytes per weight raise the
# intensity, a 4-bit kernel reaches the compute roof at about a quarter of float16's batch
# (the last column). Serving many requests at once, the saving is memory capacity rather
# than speed.
#
# What can be measured on this machine is the memory-bound half. `benchmarks/quant_bandwidth.py`
# times one matrix-vector product with a weight as large as SmolLM2's output layer
# ($49152 \times 576$, 113 MB in float32, far larger than the CPU's caches) stored as float32,
# bfloat16, int8 with one scale per row (PyTorch's `_weight_int8pack_mm`) and int4 in groups
# of 32 (`_weight_int4pack_mm_for_cpu`), both of which dequantise as they read. A single
# timing on a shared machine varies from run to run by more than some of the differences it
# is meant to show, so the script repeats every variant in interleaved rounds and ships the
# median with its quartiles and extremes; the table reads that file, and a difference is
# claimed only where the interquartile ranges (the middle half of the rounds) do not
# overlap. The model predicts a speed-up equal to the bytes ratio; a CPU
# kernel gets there only if its arithmetic (converting every weight to float before the
# multiply-add) keeps pace with memory.

# %%
bench_q = json.loads((Path(llmbook.__file__).resolve().parents[1] / "benchmarks" / "results"
                      / "quant_bandwidth.json").read_text(encoding="utf-8"))
mv = bench_q["matvec"]["variants"]
made_q = bench_q["made"]
print(f"weight {' x '.join(map(str, bench_q['matvec']['shape']))}; "
      f"{made_q['cpu']}, {made_q['cores']} cores, {made_q['cpu_capability']}, 1 thread, "
      f"load average {made_q['load_average_1min']:.1f} while measuring; {bench_q['recipe']['repeats']} rounds, "
      f"{made_q['date'][:10]}")
print(f"{'storage':20s} {'bits/weight':>11s} {'GB/s':>5s} {'speed-up over float32: median [quartiles] (min-max)':>52s} "
      f"{'bytes ratio':>11s}  bytes ratio is")
for name, r in mv.items():
    s_ = r["speedup_vs_float32"]
    where = ("inside the quartiles" if s_["q1"] <= r["bytes_ratio_vs_float32"] <= s_["q3"]
             else "above the quartiles" if r["bytes_ratio_vs_float32"] > s_["q3"] else "below the quartiles")
    print(f"{name:20s} {r['bits_per_weight']:11.2f} {r['GBps']['median']:5.1f} {s_['median']:23.2f} "
          f"[{s_['q1']:.2f}, {s_['q3']:.2f}] ({s_['min']:.2f}-{s_['max']:.2f}) {r['bytes_ratio_vs_float32']:11.2f}  "
          f"{'-' if name == 'float32' else where}")
checks = Checks("weight-only matvec: differences larger than the spread (shipped benchmark)")
for name in ("bfloat16", "int8, row scales", "int4, groups of 32"):
    checks.true(f"{name}: faster than float32 in every round (min speed-up > 1)",
                mv[name]["speedup_vs_float32"]["min"] > 1, got=f"{mv[name]['speedup_vs_float32']['min']:.2f}")
for fewer, more in (("int8, row scales", "bfloat16"), ("int4, groups of 32", "int8, row scales")):
    checks.true(f"{fewer} beats {more}: interquartile ranges of the speed-up apart",
                mv[fewer]["speedup_vs_float32"]["q1"] > mv[more]["speedup_vs_float32"]["q3"],
                got=f"{mv[fewer]['speedup_vs_float32']['q1']:.2f} > {mv[more]['speedup_vs_float32']['q3']:.2f}")
checks

# %% [markdown]
# Fewer bytes do make the product faster, in the order of the bytes, beyond the spread. How
# close each kernel comes to its bytes ratio is in the last column: where the ratio lies
# inside the quartiles the kernel keeps pace with memory; where it lies above, the
# conversion of every weight costs more than the bytes it saves. The figures belong to the
# machine and the load recorded with them (a machine shared with other work, whose load
# lowers every bandwidth); rerun the script to measure yours.

# %% [markdown]
# ## 15.10 GGUF's block formats, on a real file
#
# Everything so far ran on the book's small model. The models people run on their own
# machines come as **GGUF** files, the single-file format of ggml and llama.cpp (the
# `ggml/docs/gguf.md` specification): a header, key/value metadata (architecture, sizes,
# the tokenizer), a table of tensors (name, shape, ggml type, offset) and the tensors' bytes.
# The book's real model, SmolLM2-135M-Instruct (chapter 7), is one; `read_gguf` parses it and
# memory-maps the data. Its tensors come in three types:

# %%
source = read_gguf(smollm2_path())
print(source)
print(f"{'type':5s} {'tensors':>7s} {'weights':>12s} {'bytes':>12s} {'bits/weight':>11s}")
for qtype, (count, weights, n_bytes) in tensor_types(source).items():
    print(f"{qtype:5s} {count:7d} {weights:12,d} {n_bytes:12,d} {8 * n_bytes / weights:11.3f}")
print("shapes of the Q4_1 tensors:", sorted({t.shape for t in source.tensors.values() if t.qtype == "Q4_1"}))

# %% [markdown]
# The 210 projections (q, k, v, o, gate, up and down in each of 30 layers) are Q4_1, the token
# embedding, which is also the output layer (tied weights, chapter 2), is Q8_0, and the 61
# RMSNorm gains are plain float32. A ggml tensor is cut, row by row, into **blocks** of 32
# weights (or 256 for the "K" formats); a block stores its weights as small integers and a
# few numbers that map them back to reals. A Q4_1 block is 20 bytes: a float16 scale $d$,
# a float16 minimum $m$ and 32 four-bit codes $q$, two to a byte (weight $i < 16$ in the low
# nibble of byte $i$, weight $i + 16$ in its high nibble), and $w = d\,q + m$: the
# zero-point quantiser of section 15.1 with $z = -m/d$, in groups of 32. The first block of
# the first query matrix, decoded by hand:

# %%
t_q = source.tensors["blk.0.attn_q.weight"]
raw = t_q.data[:20]  # row 0, weights 0..31
d_blk, m_blk = raw[0:2].view("<f2")[0], raw[2:4].view("<f2")[0]
codes = np.concatenate([raw[4:] & 0x0F, raw[4:] >> 4])  # weights 0-15, then 16-31
w_by_hand = np.float32(d_blk) * codes.astype(np.float32) + np.float32(m_blk)
print("bytes:", raw[:2].tobytes().hex(), raw[2:4].tobytes().hex(), raw[4:].tobytes().hex(" "))
print(f"d = {float(d_blk)!r}, m = {float(m_blk)!r}")
print("q =", codes.tolist())
print("w[:4] =", w_by_hand[:4].tolist())
w_library = ggml_quants.dequantize(t_q.data, "Q4_1", t_q.shape)[0, :32]
checks = Checks("one Q4_1 block by hand")
checks.equal("w = d q + m by hand = dequantize(), bit for bit", w_library.view(np.uint32).tolist(),
             w_by_hand.view(np.uint32).tolist())
checks.equal("smallest and largest code: min-max puts the block's extremes on 0 and 15", [0, 15],
             [int(codes.min()), int(codes.max())])
checks

# %% [markdown]
# **Bits per weight.** Each format is a struct in ggml's `ggml-common.h`; its size follows
# from its fields, $\sum(\text{count} \times \text{bits}) / \text{weights per block}$, which
# `bits_per_weight_symbolic` evaluates exactly in SymPy. The K formats (Kawrakow's
# k-quants, llama.cpp pull request 1684, 2023) have two levels of scales: Q4_K holds 256
# weights as 8 sub-blocks of 32, each with a 6-bit scale $s_j$ and a 6-bit minimum $m_j$,
# which are themselves scaled by two float16 numbers per 256 weights, $w = d\,s_j\,q -
# d_{\min} m_j$. The check: the bits, times the block, over 8, are ggml's own block sizes.

# %%
bpw = ggml_quants.bits_per_weight_symbolic()
checks = Checks("bits per weight from the fields = ggml's block sizes")
for qtype, fields in ggml_quants.BLOCK_FIELDS.items():
    block, size = block_layout(qtype)
    terms = " + ".join(f"{count}·{bits}" for _, count, bits in fields)
    value = f"{bpw[qtype]}" + ("" if bpw[qtype].is_integer else f" = {float(bpw[qtype]):.4g}")
    print(f"{qtype:6s} ({terms}) / {block} = {value} bits per weight")
    checks.equal(f"{qtype}: bits x {block} / 8 = {size} bytes", size, bpw[qtype] * block / 8)
q4k_parts = sp.Integer(4) + sp.Rational(6 + 6, 32) + sp.Rational(16 + 16, 256)
checks.equal("Q4_K = 4 (code) + 12/32 (s_j, m_j) + 32/256 (d, dmin)", bpw["Q4_K"], q4k_parts)
checks

# %% [markdown]
# So Q4_1 pays a full bit per weight for its two float16 numbers per 32 weights, Q4_0 half
# a bit (no minimum), and Q4_K half a bit for a scale *and* a minimum per 32, because they
# are 6-bit integers and only the two numbers that scale them are float16.
#
# **The error of a block as a function of its scale.** Q4_1's rule is min-max: the 16 levels
# span exactly $[\min, \max]$ of the block. Is that the best scale? Shrink the range by a
# factor $c$ about its centre, $d = c\,(\max - \min)/15$, so that values beyond the range
# are clamped to the end levels, and measure the mean squared error. Without clamping the
# error is $d^2/12$ (`rounding_mse`, section 15.1's rule), which grows as $c^2$; with
# clamping, the few largest values pay. The data: 2048 rows of the real embedding (its
# Q8_0 values are fine-grained enough to stand for continuous weights), in float64:

# %%
E_rows = ggml_quants.dequantize(source.tensors["token_embd.weight"].data[:2048 * 18 * 34], "Q8_0",
                                (2048, 576)).astype(np.float64)  # 18 Q8_0 blocks of 34 bytes per row


def shrunk_minmax_mse(x, group, c):
    """MSE of 4-bit min-max rounding of x in groups, the range shrunk by c about its centre."""
    blocks = x.reshape(-1, group)
    lo, hi = blocks.min(1, keepdims=True), blocks.max(1, keepdims=True)
    step, start = c * (hi - lo) / 15, (hi + lo) / 2 - c * (hi - lo) / 2
    q = np.clip(np.round((blocks - start) / step), 0, 15)
    return float(((q * step + start - blocks) ** 2).mean())


mse_of_step = ggml_quants.rounding_mse()  # d**2 / 12, in the step d
d_step, c_s = *mse_of_step.free_symbols, sp.Symbol("c", positive=True)
growth = sp.simplify(mse_of_step.subs(d_step, c_s * d_step) / mse_of_step)
assert growth == c_s**2
display(sp.Eq(sp.Symbol(r"\mathrm{MSE}(d)"), mse_of_step),
        sp.Eq(sp.Symbol(r"\mathrm{MSE}(c\,d) / \mathrm{MSE}(d)"), growth))
c_grid = np.linspace(0.5, 1.2, 71)
scale_curves = {g_: np.array([shrunk_minmax_mse(E_rows, g_, c) for c in c_grid]) for g_ in (32, 256, 576)}
print(f"{'group':>5s} {'best c':>7s} {'MSE(best) / MSE(min-max)':>25s}")
for g_, curve in scale_curves.items():
    at_one = curve[np.argmin(abs(c_grid - 1))]
    print(f"{g_:5d} {c_grid[curve.argmin()]:7.2f} {curve.min() / at_one:25.2f}")

# %%
fig, ax = plt.subplots(figsize=(6.4, 4))
for (g_, curve), colour in zip(scale_curves.items(), ["C0", "C1", "C2"], strict=True):
    at_one = curve[np.argmin(abs(c_grid - 1))]
    ax.plot(c_grid, curve / at_one, color=colour, label=f"groups of {g_}")
    ax.plot(c_grid[curve.argmin()], curve.min() / at_one, "o", color=colour)
ax.plot(c_grid, c_grid**2, "k--", alpha=0.5, label="$c^2$: rounding only, no clamping")
ax.axvline(1.0, color="grey", lw=0.8)
ax.set(xlabel="range factor c (1 = min-max, Q4_1's choice)", ylabel="MSE / MSE at c = 1",
       title="4-bit error of the real embedding against the block's scale", ylim=(0.6, 1.6))
ax.legend()
save_figure(fig, "15_quantisation_block_scale")
plt.show()

# %% [markdown]
# For groups of 32 the min-max choice is within a few per cent of the best: the extremes of
# 32 weights are not far from the rest. The larger the group, the more its range is set by
# a few outliers, the more it pays to clamp them (about a quarter of the error for whole
# 576-weight rows), and the more the left branch departs from the $c^2$ of pure rounding.
# That is why the K formats keep sub-blocks of 16 or 32 *and* search each sub-block's scale
# and minimum by weighted least squares (`fit_scale_offset`, llama.cpp's `make_qkx2_quants`)
# instead of taking min and max.
#
# **The same bits as ggml.** The book's decoder and encoders are checked against
# `gguf.quants`, the Python package that ships with ggml: every tensor of the real file
# decodes to the same float32 numbers bit for bit; the 32-weight formats encode to the same
# bytes; the K formats have no peer encoder in the package, so our bytes are decoded by it
# and must give our numbers:

# %%
W_down0 = ggml_quants.dequantize(source.tensors["blk.0.ffn_down.weight"].data, "Q4_1", (576, 1536))
E_f32 = E_rows.astype(np.float32)
checks = Checks("the book's ggml code against ggml's own package, gguf.quants")
same = all(np.array_equal(gguf.quants.dequantize(t.data, GGMLQuantizationType[t.qtype]).reshape(t.shape),
                          ggml_quants.dequantize(t.data, t.qtype, t.shape))
           for t in source.tensors.values())
checks.true(f"dequantize: all {len(source.tensors)} tensors of the file, bit for bit", same)
for qtype in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"):
    checks.true(f"quantize {qtype} (2048 embedding rows): same bytes",
                np.array_equal(gguf.quants.quantize(E_f32, GGMLQuantizationType[qtype]),
                               ggml_quants.quantize(E_f32, qtype)))
for qtype in ("Q4_K", "Q5_K", "Q6_K"):
    ours = ggml_quants.quantize(W_down0, qtype)
    checks.true(f"{qtype} bytes of ffn_down (layer 0): gguf decodes our numbers",
                np.array_equal(gguf.quants.dequantize(ours, GGMLQuantizationType[qtype]).reshape(576, 1536),
                               ggml_quants.dequantize(ours, qtype, (576, 1536))))
checks

# %% [markdown]
# ## 15.11 Claim C5: what "Q4_K_M" is
#
# One of the published texts this book was planned from (`source_claims.md`) presents
# "4-bit quantization (Q4_K_M)" as `scale = max(abs(weights)) / 7`,
# `quantized = round(weights / scale).clamp(-7, 7)` ("4-bit signed: −7 to 7"), dequantised as
# `quantized * scale`, and says that it "achieves ~8× compression" from 32-bit floats. What
# ggml defines, and what the real file measures:
#
# * **"_M" names a mixture.** Q4_K_M is not a format but a llama.cpp *file type*: a rule
#   (`llama_tensor_get_type`) that gives each tensor its own type. The output matrix gets
#   Q6_K; `attn_v` and `ffn_down` get Q6_K in the first and last eighth of the layers and in
#   every third layer between, Q4_K elsewhere; everything else Q4_K. Where a row is not a
#   multiple of 256 weights, as in most of SmolLM2's, llama.cpp falls back to a format with
#   blocks of 32 (Q4_K → Q5_0, Q6_K → Q8_0). `q4_k_m_types` encodes the rule.
# * **Q4_K** is the two-level block format above: unsigned codes 0..15 with a per-32 6-bit
#   scale *and* minimum, not one symmetric scale.
#
# The claim's scheme, applied as written (one scale for the whole matrix) to the 2048
# embedding rows, against ggml's formats on the same weights:

# %%
def relative_rmse(back):
    """RMS error over RMS weight of the 2048 rows, in float64."""
    return float(np.sqrt(((back.reshape(E_rows.shape) - E_rows) ** 2).mean() / (E_rows**2).mean()))


# The claim's rule is section 15.1's absmax quantiser at b = 4: scale = max|w| / 7, codes
# round(w / scale) in -7..7 (Q4_K below: blocks of 256 consecutive weights, 2.25 per row)
claim_q = quantize_absmax(torch.from_numpy(E_f32), 4)  # one scale for the whole matrix
block_q = quantize_absmax(torch.from_numpy(E_f32), 4, group_size=32)  # the same rule per block of 32
q_claim = claim_q.q.numpy()
q4_0_bytes = ggml_quants.quantize(E_f32, "Q4_0").reshape(-1, 18)[:, 2:]  # 16 bytes of codes per block
q4_0_codes = np.concatenate([q4_0_bytes & 0x0F, q4_0_bytes >> 4])
claim_stats = {"claim: absmax / 7, one scale per matrix": relative_rmse(dequantize(claim_q).numpy()),
               "claim's rule per block of 32": relative_rmse(dequantize(block_q).numpy()),
               **{f"ggml {q}": relative_rmse(requantize_ggml(E_f32, q)) for q in ("Q4_0", "Q4_1", "Q4_K")}}
print(f"{'4-bit scheme':40s} {'relative RMS error':>19s}")
for name, err in claim_stats.items():
    print(f"{name:40s} {err:19.3f}")
print(f"claim: {len(np.unique(q_claim))} distinct codes, {float((q_claim == 0).mean()):.0%} of the weights "
      f"rounded to 0; Q4_0: {len(np.unique(q4_0_codes))} distinct codes")

# %%
shapes = {n: t.shape for n, t in source.tensors.items()}
mixture = q4_k_m_types(list(source.tensors), 30, shapes)
mixture_counts = {q: sum(v == q for v in mixture.values()) for q in sorted(set(mixture.values()))}
mixture_text = ", ".join(f"{n} {q}" for q, n in sorted(mixture_counts.items(), key=lambda kv: -kv[1]))
sweep = json.loads(SWEEP_JSON.read_text(encoding="utf-8"))
entry = {v["name"]: v for v in sweep["variants"]}
q4km_bits = entry["Q4_K_M"]["bits_per_weight_model"]
print(f"Q4_K_M for SmolLM2, {len(mixture)} tensors: {mixture_text}")
print(f"bits per weight: Q4_K {float(bpw['Q4_K'])}, Q4_K_M as stored for SmolLM2 {q4km_bits:.2f} "
      f"(all {sweep['model']['parameters']:,} weights, embedding in Q8_0)")
claims = ClaimGrades("Claim C5 against ggml and the real file")
claims.grade("C5", "Q4_K_M is scale = max|w| / 7, q = round(w / scale) clamped to -7..7, w ≈ q scale",
             f"Q4_K_M is a per-tensor mixture: for SmolLM2 llama.cpp would store {mixture_text} "
             f"tensors (F32: the norms; Q5_0 and Q8_0: fallbacks for 576-wide rows). Its nominal "
             f"format Q4_K has unsigned codes 0..15 with a 6-bit scale and a "
             f"6-bit minimum per 32 weights under two fp16 numbers per 256. On 2048 real "
             f"embedding rows one absmax/7 scale per matrix rounds "
             f"{float((q_claim == 0).mean()):.0%} of the weights to 0: relative RMS error "
             f"{claim_stats['claim: absmax / 7, one scale per matrix']:.2f}, against "
             f"{claim_stats['ggml Q4_K']:.3f} for Q4_K", "wrong")
claims.grade("C5", "4-bit signed: -7 to 7",
             f"{len(np.unique(q_claim))} of the 16 codes of a nibble (log2 15 = {math.log2(15):.2f} bits); "
             f"ggml's Q4_0 uses all {len(np.unique(q4_0_codes))} (-8..7), Q4_K and Q4_1 the unsigned "
             f"0..15 with an offset", "wrong")
claims.grade("C5", "~8x compression from 32-bit floats",
             f"32/4 = 8 only if the scales cost nothing. Q4_K stores {bpw['Q4_K']} = "
             f"{float(bpw['Q4_K'])} bits: {32 / float(bpw['Q4_K']):.1f}x against float32, "
             f"{16 / float(bpw['Q4_K']):.1f}x against 16-bit weights; Q4_K_M as llama.cpp stores "
             f"SmolLM2: {q4km_bits:.2f} bits per weight, {32 / q4km_bits:.1f}x against float32",
             "true only under a condition")
claims

# %% [markdown]
# ## 15.12 The real model: bits per weight against perplexity
#
# How much does each format cost the real model? `python -m llmbook.inference.real_quant`
# (part of `make models`, about ten minutes on 2 cores) stores the 210 projections of
# SmolLM2 in each format and measures the perplexity on held-out English:
# `data/heldout_prose.txt`, 155 paragraphs of this book's own prose, written after the
# model was trained, 6,482 tokens, scored in windows of 512 tokens (each window's first
# token is not predicted). Three things to know before reading the table:
#
# * **The reference is the file, not the original model.** Only the Q4_1 file is shipped,
#   so every variant starts from its dequantised weights: a row measures the damage of
#   *re-quantising* a 4-bit model, on top of whatever Q4_1 already cost.
# * **The embedding** (28.3 million weights, also the output layer) keeps the file's Q8_0
#   in every row but one, as every llama.cpp file type keeps the output matrix at Q6_K or
#   Q8_0; "Q4_0 pure" quantises it too. Bits per weight are counted over all 134.5 million
#   weights, norms included at 32 bits ("model"), and over the projections alone.
# * **K formats and 576-wide rows.** Most rows here hold 576 weights, not a multiple of
#   256. A starred row (`Q4_K*`) encodes 256 *consecutive* weights in memory order (a block
#   may span two rows): the format's arithmetic, in a tensor ggml cannot store. The unstarred
#   row is what llama.cpp would store: its fallback (Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0)
#   on 576-wide rows, the K format only on `ffn_down`, whose rows hold 1536.
#
# NF4 uses groups of 64 with a float32 absmax (QLoRA's layout without double quantisation);
# RTN, GPTQ and AWQ use the zero-point codes of section 15.8 in groups of 32 (128, common for
# larger models, does not divide 576), calibrated on 2,048 tokens of the standard library's
# docstrings. "Weight error" is the relative RMS change of the 210 projections,
# $\lVert W' - W \rVert / \lVert W \rVert$; AWQ has none, since it stores the rescaled
# matrices $W\,\mathrm{diag}(s)$ with $1/s$ folded into the norms. The numbers come from the
# sweep's JSON, so they read the same on every machine:

# %%
ref = entry["file"]
print(f"held-out text: {sweep['heldout']['tokens']} tokens, windows of {sweep['heldout']['window']}, "
      f"{ref['predicted_tokens']} predicted; sweep made {sweep['made']['date']}")
print(f"{'variant':10s} {'projections stored as':27s} {'bits/weight':>11s} {'(model)':>7s} "
      f"{'weight error':>12s} {'perplexity':>10s} {'vs file':>8s}")
for v in sweep["variants"]:
    types = ", ".join(f"{q} x{n}" for q, n in v["projection_types"].items())
    print(f"{v['name']:10s} {types:27s} {v['bits_per_weight_projections']:11.3f} "
          f"{v['bits_per_weight_model']:7.3f} {'-' if v['weight_rel_rmse'] is None else format(v['weight_rel_rmse'], '.4f'):>12s} {v['perplexity']:10.2f} "
          f"{v['perplexity'] / ref['perplexity'] - 1:+8.1%}")

# %%
fig, ax = plt.subplots(figsize=(7.2, 4.6))
for v in sweep["variants"]:
    book_format = v["storable_by_ggml"] is None
    marker = "s" if book_format else "o"
    face = "none" if v["storable_by_ggml"] is False else ("C1" if book_format else "C0")
    ax.plot(v["bits_per_weight_model"], v["perplexity"], marker, mfc=face, mec="C1" if book_format else "C0")
    ax.annotate(v["name"], (v["bits_per_weight_model"], v["perplexity"]), fontsize="x-small",
                xytext=(4, 2), textcoords="offset points")
ax.axhline(ref["perplexity"], color="grey", ls="--", lw=0.8, label="the file (Q4_1), the reference")
ax.set(xlabel="bits per weight, whole model (embedding Q8_0 except 'pure')",
       ylabel="perplexity on held-out prose", yscale="log",
       title="SmolLM2-135M re-quantised: circles ggml (open: not storable), squares the book's")
ax.legend(loc="upper right")
save_figure(fig, "15_quantisation_real_bpw_ppl")
plt.show()

# %% [markdown]
# One entry recomputed here. The sweep also scored the file and Q4_0 on the first 256
# held-out tokens in float64, where the result does not depend on the CPU; the book's own
# loader and tokenizer (`load_model`, chapters 1 and 7) and `build_variant` redo it:

# %%
show_source(build_variant)

# %%
model_real, tokenizer_real = load_model()
ids_real = heldout_ids(tokenizer_real)
n_check = sweep["check"]["tokens"]
checks = Checks("the sweep's short slice, recomputed (float64)")
checks.equal("held-out tokens (the book's tokenizer)", sweep["heldout"]["tokens"], len(ids_real))
checks.equal("their SHA-256 = the sweep's", sweep["heldout"]["ids_sha256"][:16], ids_sha256(ids_real)[:16])
live = {}
for name in ("file", "Q4_0"):
    state, _ = build_variant(name, source, model_real)
    model64 = copy.deepcopy(model_real)
    apply_state(model64, state)
    live[name] = perplexity(model64.double(), ids_real[:n_check], n_check)
    checks.close(f"{name}: perplexity of the first {n_check} tokens", sweep["check"][name], live[name].ppl,
                 tol=1e-9, rel=True, digits=9)
del model64
checks

# %% [markdown]
# Reading the table (and the figure, where open circles are the starred, unstorable rows
# and squares the book's own formats):
#
# * **Q4_1 re-encoded gives the file back exactly**: its grid reproduces itself, the
#   weights do not move (weight error 0) and the perplexity is the file's to the last digit.
# * **Starting from a 4-bit model, other 4-bit grids hurt.** The file's weights sit on
#   Q4_1's 16 levels per block of 32; a different grid of similar resolution (Q4_0, the
#   book's zero-point codes, NF4) adds a rounding error as large as a fresh quantisation,
#   on top of the first one: 20 to 40 % more perplexity. Q4_K's sub-blocks of 32 line up
#   with Q4_1's blocks and also have a scale and a minimum, so it can nearly reproduce the
#   grid: its weight error is a fifth of Q4_0's and it costs about 1.5 %. That is a property
#   of re-quantising a Q4_1 file, not a ranking of the formats on full-precision weights.
# * **Even Q8_0 is not free** (+0.4 %): its grid does not contain Q4_1's levels either.
# * **llama.cpp's fallbacks cost.** The formats it must use on 576-wide rows (Q5_0, Q5_1,
#   Q8_0) lose most of what the K format would give, and the stored Q4_K_M (6.2 bits per
#   weight) is worse than the unstorable Q4_K* (5.3 bits). Q5_1 (the Q5_K fallback) is
#   the worst 5-bit row: its levels, 15/31 of Q4_1's step apart, miss Q4_1's levels by an
#   amount that grows with the code, an error that is the same in every block.
# * **The embedding matters.** Q4_0 on the embedding too ("pure") is far worse than Q4_0
#   on the projections alone: one matrix, 21 % of the weights, is both the input and the
#   output layer, which is why llama.cpp keeps it at 6 or 8 bits in every file type.
# * **GPTQ and AWQ.** GPTQ moves the weights further than plain rounding (RTN) does, yet
#   scores a little better: it minimises each layer's output error on the calibration
#   inputs, not the weight error, but a bias it cannot remove (another grid than the file's)
#   keeps it with the other 4-bit grids. AWQ is the one calibrated method that pays here: it
#   removes more than half of RTN's excess perplexity for a few thousandths of a bit per
#   weight (the unfolded o_proj scales). Its scales give the input channels that carry large
#   activations a finer grid; the next section shows those channels.
#
# ## 15.13 Outlier channels of the real model
#
# Section 15.4 planted outliers in a synthetic layer; a real model has its own. The inputs
# of every linear layer of SmolLM2 on the first 256 held-out tokens (float64, the file's
# weights), captured with forward pre-hooks: for each layer, the largest $|x|$ of every
# input channel over the tokens, and the ratio of the largest channel to the median one.

# %%
model64 = copy.deepcopy(model_real).double()
inputs = linear_inputs(model64, ids_real[:n_check])  # name -> (30, 256, d_in)
print(f"{'input of':16s} {'d_in':>5s} {'max/median, median layer':>25s} {'largest':>8s} {'in layer':>8s} "
      f"{'top channel (layers)':>21s}")
outlier_summary = {}
for kind, X_all in inputs.items():
    peak = X_all.abs().amax(1)  # (L, d_in): the largest |x| of each channel over the tokens
    ratio = peak.amax(1) / peak.median(1).values  # (L,)
    top = peak.argmax(1)  # (L,)
    channel, layers = torch.mode(top).values.item(), int((top == torch.mode(top).values).sum())
    outlier_summary[kind] = {"ratio": ratio, "peak": peak, "channel": channel}
    print(f"{kind:16s} {X_all.shape[-1]:5d} {float(ratio.median()):25.0f} {float(ratio.max()):8.0f} "
          f"{int(ratio.argmax()):8d} {f'{channel} ({layers} of 30)':>21s}")

# %%
worst_kind = max(outlier_summary, key=lambda k: float(outlier_summary[k]["ratio"].max()))
worst_layer = int(outlier_summary[worst_kind]["ratio"].argmax())
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
for kind, summary in outlier_summary.items():
    ax1.semilogy(range(30), summary["ratio"], "o-", ms=3, label=kind)
ax1.set(xlabel="layer", ylabel="largest channel / median channel (max |x|)",
        title="Outlier channels of SmolLM2's linear-layer inputs")
ax1.legend(fontsize="small")
peak = outlier_summary[worst_kind]["peak"][worst_layer]
ax2.plot(peak, lw=0.7)
for ch in peak.argsort(descending=True)[:3].tolist():
    ax2.annotate(str(ch), (ch, float(peak[ch])), fontsize="small", xytext=(3, 0), textcoords="offset points")
ax2.set(xlabel="input channel", ylabel="max |x| over 256 tokens", yscale="log",
        title=f"{worst_kind}, layer {worst_layer}")
save_figure(fig, "15_quantisation_real_outliers")
plt.show()

# %% [markdown]
# The inputs that come out of a norm (attention and MLP input) carry a few channels far
# above the rest in most layers; the input of `down_proj`, a product of two projections,
# has the most extreme ones. A per-tensor or per-token int8 scale for these activations
# would round the ordinary channels to a few levels, exactly as in section 15.4.
#
# AWQ turns the same statistic into weight protection: the input channel $j$ of a weight
# gets the scale $s_j = \overline{|x_j|}^{\,\alpha}$ before rounding, so the weights that
# meet large inputs are rounded on a finer relative grid (for any $\alpha > 0$ the largest
# scales sit, by construction, on the channels of largest mean $|x|$). On the most extreme
# layer, the scales are searched on the first 128 of the captured tokens, and the output
# error is measured both there (where $\alpha = 0$ on the grid guarantees that AWQ is no
# worse than RTN) and on the other 128 tokens, which the search never saw; then once more
# with the first token left out of the calibration:

# %%
W_worst = model64.blocks[worst_layer].get_submodule(LINEAR_INPUTS[worst_kind]).weight.detach()
X_worst = inputs[worst_kind][worst_layer]  # (256, d_in)
W_rtn = quantize_rtn(W_worst, 4, 32)
top_channel = int(X_worst.abs().amax(0).argmax())
print(f"{worst_kind}, layer {worst_layer}: channel {top_channel} peaks at token "
      f"{int(X_worst[:, top_channel].abs().argmax())} with |x| = {float(X_worst[:, top_channel].abs().max()):.0f}; "
      f"its largest value on any other token: {float(X_worst[1:, top_channel].abs().max()):.2f}")
print(f"{'calibration tokens':>18s} {'alpha':>5s} {'AWQ / RTN on calibration':>25s} {'on tokens 128-255':>18s}")
for label, X_cal in (("0-127", X_worst[:128]), ("1-127", X_worst[1:128])):
    W_awq, awq_stats = awq_scale_search(W_worst, X_cal, 4, 32)
    ratios = [layer_output_error(W_worst, W_awq, X_) / layer_output_error(W_worst, W_rtn, X_)
              for X_ in (X_cal, X_worst[128:])]
    print(f"{label:>18s} {awq_stats['alpha']:5.2f} {ratios[0]:25.2f} {ratios[1]:18.2f}")
checks = Checks("where the most extreme outlier of the real model sits")
checks.equal(f"channel {top_channel}'s largest |x| is on the first token", 0,
             int(X_worst[:, top_channel].abs().argmax()))
checks

# %% [markdown]
# The extreme outlier is one value: the first token of the text, in a few channels, is
# thousands of times larger than anything else (a "massive activation", which many
# language models put on their first token). AWQ's statistic, the mean $|x|$ of a channel,
# is then set by that one token, the search scales those channels up to $\alpha = 1$, and
# the output error it reports on its own calibration tokens is a small fraction of RTN's.
# On tokens it has not seen that gain turns into a loss, and with the first token left out
# the search finds almost nothing to gain at all. These are measurements on one layer: they
# show that a per-layer calibration error is no evidence on its own. AWQ's row in the sweep
# (section 15.12) is the evidence that counts, since it was scored on held-out prose, with
# scales searched on 2,048 tokens of other text and the o_proj scale left unfolded (under
# grouped-query attention a row of v_proj feeds three heads, section 15.8).
#
# ## 15.14 Claim C6: how many elements does SIMD process at once?
#
# The same published text says that a vectorised elementwise product "processes 8+
# elements simultaneously". A SIMD instruction applies one operation to every *lane* of a
# vector register, and the number of float32 lanes is the register's width over 32 bits:

# %%
register_bits = {"SSE (x86, 1999), NEON (Arm)": (128, 128), "AVX2 (x86, 2013)": (256, 256),
                 "AVX-512 (x86, 2017)": (512, 512), "SVE (Arm): chosen by the chip": (128, 2048)}


def span(lo, hi):
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


print(f"{'vector registers':32s} {'bits':>9s} {'float32 lanes':>14s} {'float64 lanes':>14s}")
for isa, (lo, hi) in register_bits.items():
    print(f"{isa:32s} {span(lo, hi):>9s} {span(lo // 32, hi // 32):>14s} {span(lo // 64, hi // 64):>14s}")

# %% [markdown]
# PyTorch compiles its elementwise kernels several times and picks one when it starts,
# by the CPU (`torch.backends.cpu.get_cpu_capability()`: "DEFAULT", "AVX2", "AVX512" on
# x86); the variable `ATEN_CPU_CAPABILITY` forces a lower one. `benchmarks/quant_bandwidth.py`
# times, in fresh processes on one thread, a compute-bound elementwise function (the sigmoid,
# on 16,384 float32 values that stay in cache) and a product (two loads and a store per
# element, limited by the cache's bandwidth), under each capability the measuring CPU has,
# each figure from many short samples; the table reads the shipped result, with each
# speed-up's range taken from the quartiles (the generic kernel's first quartile over the
# vectorised one's third, and the reverse):

# %%
simd = bench_q["simd"]["levels"]
print(f"measured on: {made_q['cpu']} ({bench_q['simd']['native']}), {bench_q['recipe']['simd_samples']} samples each")
print(f"{'kernels':8s} {'sigmoid ns/element':>19s} {'speed-up [range]':>18s} {'product ns/element':>19s} "
      f"{'speed-up [range]':>18s}")
simd_gain = {}
for capability, r in simd.items():
    row = f"{capability:8s}"
    for op in ("sigmoid", "product"):
        base_, this_ = simd["DEFAULT"][op]["summary"], r[op]["summary"]
        simd_gain[capability, op] = (base_["median"] / this_["median"], base_["q1"] / this_["q3"],
                                     base_["q3"] / this_["q1"])
        gain = simd_gain[capability, op]
        row += f" {this_['median']:19.3f} {gain[0]:6.1f} [{gain[1]:.1f}, {gain[2]:.1f}]"
    print(row)
simd_top = bench_q["simd"]["native"]
checks = Checks("SIMD levels: differences larger than the spread (shipped benchmark)")
checks.true(f"sigmoid: {simd_top} faster than DEFAULT (quartiles apart)", simd_gain[simd_top, "sigmoid"][1] > 1,
            got=f"{simd_gain[simd_top, 'sigmoid'][1]:.1f}")
checks.true(f"the product gains less from {simd_top} than the sigmoid (ranges apart)",
            simd_gain[simd_top, "product"][2] < simd_gain[simd_top, "sigmoid"][1],
            got=f"{simd_gain[simd_top, 'product'][2]:.1f} < {simd_gain[simd_top, 'sigmoid'][1]:.1f}")
if "AVX2" in simd and simd_top == "AVX512":
    checks.true("sigmoid: AVX512 faster than AVX2 (quartiles apart)",
                simd["AVX512"]["sigmoid"]["summary"]["q3"] < simd["AVX2"]["sigmoid"]["summary"]["q1"],
                got=f"{simd['AVX512']['sigmoid']['summary']['q3']:.3f} < "
                    f"{simd['AVX2']['sigmoid']['summary']['q1']:.3f} ns")
checks

# %% [markdown]
# Both operations gain from the vector kernels, but not alike. The sigmoid, whose cost is
# arithmetic, gains several times over, and more again from the wider AVX-512 registers:
# more lanes, though not in proportion, since part of each kernel is not lane-parallel. The
# product, with two loads and a store per multiplication, is held back by the cache's
# bandwidth rather than by the lanes and gains less; the checks compare interquartile
# ranges, not single timings. The grade therefore depends on the machine, the data type and the operation:

# %%
claims = ClaimGrades("Claim C6")
lanes = {isa.split(" (")[0]: lo // 32 for isa, (lo, hi) in register_bits.items() if lo == hi}
claims.grade("C6", "a vectorised elementwise product processes 8+ elements simultaneously",
             f"float32 lanes per instruction: {lanes}; float64 halves them. 8 or more holds on "
             f"x86 with AVX2 or AVX-512 kernels, not with 128-bit SSE or Arm NEON (4, as on "
             f"phones and Apple laptops), nor in a kernel that is not vectorised. Lanes are an "
             f"upper bound on the speed-up: a product that streams its operands is limited by "
             f"memory bandwidth (measured above)", "true only under a condition")
claims

# %% [markdown]
# ## 15.15 The file's 4-bit codes in a PyTorch kernel
#
# Everything above dequantised the file's codes to float32 and multiplied as usual. A
# kernel can instead read the codes themselves: PyTorch's CPU kernel
# `_weight_int4pack_mm_for_cpu` multiplies bfloat16 activations by 4-bit codes in groups of
# 32, $w = (q - 8)\,s + z$. Q4_1's $w = d\,q + m$ is the same code with $s = d$ and
# $z = m + 8d$, so `Int4Linear.from_q4_1` runs the very bits that llama.cpp runs, with $d$
# and $z$ rounded from float16 to bfloat16:

# %%
show_source(Int4Linear.from_q4_1)

# %% [markdown]
# The checks, on the gate projection of layer 0 and its inputs from the held-out text: the
# codes the kernel holds are the file's; the weights it multiplies by differ from the
# dequantised ones only by the bfloat16 rounding of $s$ and $z$; and its output equals
# dequantise-then-multiply within bfloat16's precision ($2^{-8} \approx 0.4\,\%$ per number).

# %%
t_gate = source.tensors["blk.0.ffn_gate.weight"]
int4 = Int4Linear.from_q4_1(t_gate.data, t_gate.shape)
W_gate = torch.from_numpy(ggml_quants.dequantize(t_gate.data, "Q4_1", t_gate.shape)).double()  # (1536, 576)
blocks_gate = t_gate.data.reshape(-1, 20)  # one row per Q4_1 block
d_gate = torch.from_numpy(blocks_gate[:, 0:2].copy().view("<f2").astype(np.float32))  # (blocks, 1)
m_gate = torch.from_numpy(blocks_gate[:, 2:4].copy().view("<f2").astype(np.float32))
q_gate = torch.from_numpy(np.concatenate([blocks_gate[:, 4:] & 0x0F, blocks_gate[:, 4:] >> 4], axis=1))
s_bf16, z_bf16 = d_gate.bfloat16().float(), (m_gate + 8 * d_gate).bfloat16().float()
w_expected = ((q_gate.float() - 8) * s_bf16 + z_bf16).reshape(t_gate.shape)  # (1536, 576)
X_gate = inputs["MLP input"][0]  # (256, 576), float64
y_kernel = int4(X_gate.float()).double()
y_reference = X_gate @ W_gate.T
rel_out = float((y_kernel - y_reference).norm() / y_reference.norm())
rel_w = float((int4.weight().double() - W_gate).norm() / W_gate.norm())
checks = Checks("the file's Q4_1 codes run by the int4 kernel")
checks.equal("kernel's weights = (q - 8) bf16(d) + bf16(m + 8d), file's q, bit for bit",
             w_expected.view(torch.int32).tolist(), int4.weight().view(torch.int32).tolist())
checks.true("weights: relative error from bf16 scales < 2^-8", rel_w < 2**-8, got=f"{rel_w:.0e}")
checks.true("output vs dequantise-then-matmul (float64): relative error < 1 %", rel_out < 0.01,
            got=f"{rel_out:.0e}")
checks.equal("storage: bits per weight (codes + bf16 s, z per 32)", 5.0,
             8 * int4.storage_bytes() / t_gate.n_elements)
checks

# %% [markdown]
# The kernel stores 5 bits per weight, as Q4_1 does, and reads them without ever building
# the float32 matrix: a decoding step reads about a sixth of the bytes (5 bits against 32).
# How much faster that makes decoding the whole model is measured by
# `benchmarks/real_model.py` (chapter 13, section 13.7, reads it too): greedy decoding of
# SmolLM2 in float32 and with every projection on this int4 kernel (the tied output layer
# on the int8 one), each against its roofline, the STREAM-copy bandwidth over the bytes it
# reads per token. The roofline is an upper bound derived before the run: no system may
# exceed it.

# %%
bench_real = json.loads((Path(llmbook.__file__).resolve().parents[1] / "benchmarks" / "results"
                         / "real_model.json").read_text(encoding="utf-8"))
print(f"{bench_real['machine']['cpu']}, {bench_real['date'][:10]}, best of {bench_real['repeats']}, "
      f"{bench_real['new_tokens']} new tokens; MB read per token: "
      + ", ".join(f"{k} {v['total'] / 1e6:.0f}" for k, v in bench_real["bytes_per_token"].items()))
print(f"{'threads':>7s} {'GB/s':>5s} {'system':28s} {'tokens/s':>8s} {'roofline':>8s} {'fraction':>8s}")
checks = Checks("decoding SmolLM2 against its roofline (shipped benchmark)")
for row in bench_real["rows"]:
    for system, roof_key in (("transformers_fp32", "fp32"), ("book_fp32_static", "fp32"),
                             ("book_int4_compiled", "int4_weights_int8_head")):
        roof = row["roofline_tok_s"][roof_key]
        print(f"{row['threads']:7d} {row['stream_copy_GBps']:5.1f} {system:28s} {row[system]:8.1f} {roof:8.1f} "
              f"{row[system] / roof:8.2f}")
        checks.true(f"{row['threads']} thread(s), {system}: at most its roofline", row[system] <= roof,
                    got=f"{row[system] / roof:.2f}")
checks

# %% [markdown]
# The float32 decode runs at most of its roofline: it is memory-bound, and the bytes are the
# cost. The int4 decode is faster in tokens per second but further from its own, lower
# roof: once the weights shrink sixfold, the time left is the per-token work that does not
# shrink with them (Python and dispatch, attention, norms), which `real_model.json`'s
# profile attributes. Fewer bytes per weight is the first step to a fast decode; a kernel
# that keeps pace with them is the second.

# %% [markdown]
# ## 15.16 Floating-point codes: FP8 and MXFP4
#
# Every code so far was an integer times a scale: its levels are evenly spaced. A
# **floating-point** code spends some of its bits on an exponent instead, so its levels are
# dense near zero and sparse far from it, with a roughly constant *relative* spacing. With
# $E$ exponent bits, $M$ mantissa bits and the bias $2^{E-1}-1$, a normal number is
# $\pm 2^{e-\text{bias}}(1 + f/2^M)$ and the spacing inside a binade $[2^e, 2^{e+1})$ is
# $2^{e-M}$. Two 8-bit formats are used for training and inference on current GPUs
# (Micikevicius et al., 2022, "FP8 Formats for Deep Learning"): **E4M3**, which reserves only
# one code per sign for NaN and so keeps the top binade for numbers (`torch.float8_e4m3fn`),
# and **E5M2**, which keeps IEEE 754's infinities and NaNs in its top exponent
# (`torch.float8_e5m2`). SymPy derives the largest value, the smallest normal and subnormal
# numbers and the relative spacing $2^{-M}$ from those two rules; torch's own limits
# (`torch.finfo`) are the peer:

# %%
E_s, M_s = sp.symbols("E M", positive=True, integer=True)
bias_s = 2 ** (E_s - 1) - 1
fp_rules = {  # the largest finite value under each convention for the top exponent
    "E4M3 (top binade kept, NaN = all ones)": (2 - 2 ** (1 - M_s)) * 2 ** (2**E_s - 1 - bias_s),
    "E5M2 (IEEE: top exponent reserved)": (2 - 2**-M_s) * 2 ** (2**E_s - 2 - bias_s)}
checks = Checks("FP8 limits derived in SymPy against torch.finfo")
for (name, max_expr), (fmt, dtype) in zip(fp_rules.items(), ((E4M3, torch.float8_e4m3fn),
                                                               (E5M2, torch.float8_e5m2)), strict=True):
    at = {E_s: fmt.exp_bits, M_s: fmt.man_bits}
    derived = {"max": max_expr.subs(at), "smallest normal": (2 ** (1 - bias_s)).subs(at),
               "smallest subnormal": (2 ** (1 - bias_s - M_s)).subs(at), "relative spacing": (2**-M_s).subs(at)}
    info = torch.finfo(dtype)
    print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in derived.items()))
    for (k, v), peer_value in zip(derived.items(), (info.max, info.smallest_normal,
                                                    float(torch.tensor(1, dtype=torch.uint8).view(dtype)),
                                                    info.eps), strict=True):
        checks.equal(f"{dtype}: {k}", peer_value, float(v))
checks

# %% [markdown]
# The book's rounding, `round_to_float`, puts a value on this grid: find its binade, round
# to the spacing there with ties to the even mantissa, and decide what happens above the
# largest value. Measured on torch's casts (float32 on the CPU): `float8_e4m3fn` saturates to
# $\pm 448$, `float8_e5m2` overflows to $\pm\infty$ from the midpoint between its largest value
# and the next power of two, as IEEE rounding does; the function takes that as an argument.

# %%
show_source(round_to_float)

# %% [markdown]
# The checks: the grid (`float_grid`) equals the 256 bit patterns of each torch dtype, read
# as numbers; and the 1,179,648 values of the real embedding rows of section 15.10, scaled
# so that their largest magnitude lands on the format's maximum (one scale per tensor, as
# FP8 inference does), round exactly as `Tensor.to(float8)` rounds them:

# %%
checks = Checks("FP8 grid and rounding against torch's float8 dtypes")
fp8_error = {}
for fmt, dtype in ((E4M3, torch.float8_e4m3fn), (E5M2, torch.float8_e5m2)):
    patterns = torch.arange(256, dtype=torch.uint8).view(dtype).double()
    finite = torch.unique(patterns[torch.isfinite(patterns) & (patterns >= 0)])
    checks.equal(f"{dtype}: float_grid = the finite non-negative bit patterns ({len(finite)})",
                 finite.tolist(), float_grid(fmt).tolist())
    scaled = torch.from_numpy(E_f32) * (fmt.max_value / float(np.abs(E_f32).max()))
    ours = round_to_float(scaled, fmt, saturate=fmt is E4M3)
    checks.equal(f"{dtype}: round_to_float = torch's cast, all {scaled.numel():,} values bit for bit",
                 True, bool(torch.equal(ours, scaled.to(dtype).float())))
    fp8_error[dtype] = float((ours.double() - scaled.double()).norm() / scaled.double().norm())
checks

# %% [markdown]
# **MXFP4.** Four bits leave a float only $E = 2$, $M = 1$: the eight magnitudes
# $0, \tfrac12, 1, \tfrac32, 2, 3, 4, 6$ of **E2M1**. The OCP Microscaling (MX) specification
# (Rouhani et al., 2023, "Microscaling Data Formats for Deep Learning") gives every block of
# 32 such elements one shared scale $2^k$, stored as an 8-bit exponent (E8M0), with
# $k = \lfloor \log_2 \max|x| \rfloor - 2$ (2 is the exponent of E2M1's largest binade), so
# the block's largest value lands in $[4, 8)$ and rounds, saturating, to the top of the grid.
# That is $4 + 8/32 = 4.25$ bits per weight. ggml calls the format MXFP4 (section 15.10's
# table), and the gguf package encodes it: the peer. One detail differs: a value exactly
# half-way between two E2M1 levels goes, in ggml's encoder, to the smaller magnitude (it
# takes the first of the tied levels), where IEEE's rule and torch's casts take the even
# mantissa. `quantize_mx` takes the policy as an argument; with ggml's it must give ggml's
# numbers bit for bit, and the count of ties shows how often the choice matters.

# %%
show_source(quantize_mx)

# %%
mx_back = dequantize_mx(*quantize_mx(torch.from_numpy(E_f32)))  # ties to even
mx_ggml_ties = dequantize_mx(*quantize_mx(torch.from_numpy(E_f32), ties="toward_zero"))
ggml_mx = gguf.quants.dequantize(gguf.quants.quantize(E_f32, GGMLQuantizationType.MXFP4),
                                 GGMLQuantizationType.MXFP4)
print(f"{'code':28s} {'bits/weight':>11s} {'relative RMS error':>19s}")
for name, bits_, err_ in (("E4M3, one scale per tensor", 8, fp8_error[torch.float8_e4m3fn]),
                          ("E5M2, one scale per tensor", 8, fp8_error[torch.float8_e5m2]),
                          ("MXFP4 (E2M1, E8M0 per 32)", 4.25, relative_rmse(mx_back.numpy())),
                          ("ggml Q4_0 (int4, fp16 per 32)", 4.5, claim_stats["ggml Q4_0"])):
    print(f"{name:28s} {bits_:11.2f} {err_:19.4f}")
checks = Checks("MXFP4: the OCP rule against ggml's MXFP4 (gguf.quants)")
checks.equal("2048 embedding rows, ties toward zero: = ggml, bit for bit", True,
             bool(np.array_equal(mx_ggml_ties.float().numpy(), ggml_mx)))
print(f"elements that the tie policy changes: {int((mx_back != mx_ggml_ties).sum()):,} of {mx_back.numel():,}")
checks.equal("bits per weight: stored_bits_per_weight(4, 32, scale_bits=8, zero_bits=0) = 8 × 17 bytes / 32",
             8 * block_layout("MXFP4")[1] / block_layout("MXFP4")[0],
             stored_bits_per_weight(4, 32, scale_bits=8, zero_bits=0))
checks

# %% [markdown]
# The FP8 codes need only one scale for a whole tensor, because their relative spacing is
# the same in every binade: small weights keep their relative precision without a block
# scale. E4M3, with one more mantissa bit, is about twice as accurate as E5M2, whose extra
# exponent range these weights do not need (it pays off for gradients, whose range is
# wider). At 4 bits the power-of-two scale of MXFP4 is coarser than Q4_0's float16 one
# (the block's largest value lands anywhere in $[4, 8)$ and is rounded to at most 6), and
# E2M1's levels are spread unevenly: MXFP4 saves a quarter of a bit per weight and pays
# for it in error. These are measurements on one matrix.

# %% [markdown]
# ## 15.17 Rotating the outliers away: QuaRot
#
# Section 15.13 found channels hundreds of times the median in SmolLM2's linear-layer inputs.
# Ashkboos et al. (2024, "QuaRot: Outlier-Free 4-Bit Inference in Rotated LLMs") remove them
# without changing the model: for any orthogonal $Q$, $xW^\top = (xQ)(WQ)^\top$, so a layer may
# read rotated inputs with rotated weights. With $Q$ a Hadamard matrix divided by $\sqrt n$
# (entries $\pm 1/\sqrt n$), every rotated coordinate is a signed average of all $n$ inputs:
# an outlier is shared out among them, and by Cauchy–Schwarz
# $|(xQ)_j| \le \lVert x \rVert_2$, a bound on the largest coordinate that holds before any
# measurement. SmolLM2's widths (576, 1536) are not powers of two; the rotation here is
# block-diagonal with Hadamard blocks of 64 (`scipy.linalg.hadamard` is the peer in the
# tests), so an outlier is spread over the 64 channels of its block and the bound holds per
# block. The measure of "outlier-ness" is the kurtosis of a token's values,
# $\mathbb E[(x-\bar x)^4]/\mathrm{Var}(x)^2$ (3 for a normal distribution), and the test is
# int4 with one absmax scale per token, the activation quantiser of QuaRot, on the layer's
# output; the same layers' weights at 4 bits (RTN, groups of 32) are measured too:

# %%
show_source(hadamard_rotate)

# %%
print(f"{'input of':16s} {'kurtosis (median token)':>24s} {'max/RMS':>12s} {'layer':>5s} "
      f"{'int4 activations: error':>24s} {'int4 weights: error':>20s}")
rotation_rows = {}
for kind, X_all in inputs.items():  # (30, 256, d_in)
    Xr_all = hadamard_rotate(X_all, 64)
    layer = int(outlier_summary[kind]["ratio"].argmax())
    W_ = model64.blocks[layer].get_submodule(LINEAR_INPUTS[kind]).weight.detach()  # (d_out, d_in)
    X_, Xr_, Wr_ = X_all[layer], Xr_all[layer], hadamard_rotate(W_, 64)
    y_ = X_ @ W_.T
    err_ = {"act": [dequantize(quantize_absmax(a, 4, dim=0)) @ w.T for a, w in ((X_, W_), (Xr_, Wr_))],
            "w": [a @ quantize_rtn(w, 4, 32).T for a, w in ((X_, W_), (Xr_, Wr_))]}
    row = {"kurtosis": [float(kurtosis(a).median()) for a in (X_all, Xr_all)],
           "max/rms": [float((a.abs().amax(-1) / a.pow(2).mean(-1).sqrt()).median()) for a in (X_all, Xr_all)],
           **{k: [float((v - y_).norm() / y_.norm()) for v in vs] for k, vs in err_.items()},
           "exact": float((Xr_ @ Wr_.T - y_).norm() / y_.norm()),
           "bound": bool((Xr_all.reshape(30, 256, -1, 64).abs().amax(-1)
                          <= X_all.reshape(30, 256, -1, 64).norm(dim=-1) * (1 + 1e-12)).all())}
    rotation_rows[kind] = row
    print(f"{kind:16s} {row['kurtosis'][0]:11.1f} -> {row['kurtosis'][1]:5.1f} {row['max/rms'][0]:5.1f} -> "
          f"{row['max/rms'][1]:4.1f} {layer:5d} {row['act'][0]:13.3f} -> {row['act'][1]:6.3f} "
          f"{row['w'][0]:11.4f} -> {row['w'][1]:6.4f}")
checks = Checks("Hadamard rotation of SmolLM2's linear-layer inputs (blocks of 64)")
for kind, row in rotation_rows.items():
    checks.true(f"{kind}: (xQ)(WQ)ᵀ = xWᵀ (relative error < 1e-12)", row["exact"] < 1e-12)
    checks.true(f"{kind}: |(xQ)_j| <= ‖x_block‖ in all 30 layers x 256 tokens", row["bound"])
    checks.true(f"{kind}: median kurtosis lower after rotation", row["kurtosis"][1] < row["kurtosis"][0],
                got=f"{row['kurtosis'][0]:.1f} -> {row['kurtosis'][1]:.1f}")
    checks.true(f"{kind}: int4 per-token activations, output error lower after rotation",
                row["act"][1] < row["act"][0], got=f"{row['act'][0]:.3f} -> {row['act'][1]:.3f}")
checks

# %% [markdown]
# The rotation takes the tokens' kurtosis from well above the normal distribution's 3 down
# to near it, and the largest value from many times the RMS to a few times. With one int4
# scale per token, that is what matters: the error of the layer's output falls severalfold
# for the inputs of the attention, of o_proj and of the MLP, and only a little for
# down_proj's, whose per-token error was small to begin with. For the weights, which had
# no outliers, the rotation changes the int4 error by a few per cent either way: it is the
# activations that the rotation makes quantisable; the weights are rotated only because the
# product needs the counter-rotation, which is folded into them once, offline. One caveat
# stays: a block rotation can only spread an outlier over its own block, so a full-width
# Hadamard (QuaRot builds them for widths that are not a power of two) spreads it further.

# %% [markdown]
# ## 15.18 LLM.int8(): the outlier columns in float
#
# Section 15.4 repaired outliers by smoothing. Dettmers et al. (2022, section 3.2) take a
# blunter route that needs no calibration: every input channel in which some $|x| \ge 6$ (the
# paper's threshold) is an *outlier dimension*, and its part of the product,
# $X_{:,O}W_{:,O}^\top$, is computed in 16-bit floats; the remaining columns are multiplied in
# int8 with one scale per token and one per output channel, as in section 15.3. Because
# the outliers sit in a few fixed channels, $O$ is small and almost all of the work stays in
# int8. On section 15.4's layer the decomposition must find exactly the four planted
# channels, and the error of its int8 part is predicted from its scales by section 15.3's
# $\Delta^2/12$ rule (the check allows the same 15 %, fixed before the run):

# %%
show_source(int8_matmul_decomposed)

# %%
y_dec, outlier_cols = int8_matmul_decomposed(X, W)
keep_cols = ~outlier_cols
xs_q, ws_q = quantize_absmax(X[:, keep_cols], 8, dim=0), quantize_absmax(W[:, keep_cols], 8, dim=0)
int8_part_predicted = math.sqrt(float((xs_q.scale**2).sum() / 12 * (W[:, keep_cols] ** 2).sum()
                                      + (ws_q.scale**2).sum() / 12 * (X[:, keep_cols] ** 2).sum()))
err_dec = float((y_dec - y_ref).norm() / y_ref.norm())
print(f"outlier columns: {outlier_cols.nonzero().flatten().tolist()} of {X.shape[1]}; output error: "
      f"LLM.int8() {err_dec:.2e}, per-token W8A8 {results['per token'][1]:.2e}, "
      f"smoothed {results['smoothed, per token'][1]:.2e}")
checks = Checks("LLM.int8() on section 15.4's outlier layer")
checks.equal("outlier columns = the four planted ones", [0, 1, 2, 3], outlier_cols.nonzero().flatten().tolist())
checks.close("int8 part's error: measured / predicted from Δ²/12", 1.0,
             float((y_dec - y_ref).norm()) / int8_part_predicted, tol=0.15)
checks.true("error below per-token W8A8's", err_dec < results["per token"][1],
            got=f"{err_dec:.1e} vs {results['per token'][1]:.1e}")
checks

# %% [markdown]
# On the real model the rule is a measurement rather than a design: how many of SmolLM2's
# input channels cross the threshold of 6, on the first 256 held-out tokens, in the layer
# with the most extreme outliers of each kind, and what the decomposition buys there over
# plain per-token int8:

# %%
print(f"{'input of':16s} {'layer':>5s} {'outlier columns':>16s} {'W8A8 error':>11s} {'LLM.int8() error':>17s}")
for kind, X_all in inputs.items():
    layer = int(outlier_summary[kind]["ratio"].argmax())
    W_ = model64.blocks[layer].get_submodule(LINEAR_INPUTS[kind]).weight.detach()
    X_ = X_all[layer]
    y_ = X_ @ W_.T
    y8 = int8_matmul(quantize_absmax(X_, 8, dim=0), quantize_absmax(W_, 8, dim=0))
    y_d, cols = int8_matmul_decomposed(X_, W_)
    print(f"{kind:16s} {layer:5d} {int(cols.sum()):9d} of {X_.shape[1]:4d} "
          f"{float((y8 - y_).norm() / y_.norm()):11.2e} {float((y_d - y_).norm() / y_.norm()):17.2e}")

# %% [markdown]
# In a model of 135 million parameters only a few channels cross the threshold, and where
# they do, keeping them in float cuts the int8 error of that layer's output; where none do,
# the decomposition is plain int8. Dettmers et al. found the outlier dimensions growing in
# size and number with the model, to the point where, beyond about 6.7 billion parameters,
# plain int8 inference breaks down and the decomposition is what keeps it working.

# %% [markdown]
# ## Summary
#
# * A $b$-bit uniform quantiser rounds to steps of $\Delta$; the error is at most $\Delta/2$
#   and, for values that fill the steps evenly, has mean square $\Delta^2/12$: each bit
#   divides it by 4.
# * Absmax is symmetric; zero-point uses all $2^b$ codes on one-sided data. Finer blocks
#   (per channel, per group) reduce the error for the cost of storing more scales.
# * int8 × int8 products summed in int32 reproduce the float product of the dequantised
#   matrices exactly up to round-off; int16 would overflow after 3 terms.
# * Activation outliers ruin per-tensor and per-token int8 scales; per-channel scales or
#   migrating the scale into the weights (smoothing) repair them.
# * NF4's levels are normal quantiles, matching QLoRA's table to $10^{-6}$.
# * GPTQ rounds column by column and corrects the remaining columns with the OBS update
#   $\delta = -\frac{w_q - \mathrm{quant}(w_q)}{[H^{-1}]_{qq}} H^{-1}_{:,q}$ and removes the
#   column with a rank-one downdate (a Schur complement, derived in SymPy), all read off the
#   Cholesky factor of $H^{-1}$. It equals sequential least squares on $X$ to $10^{-10}$; on
#   tiny layers it lands between RTN and the enumerated optimum. On the book's model it cuts
#   RTN's perplexity increase at 4 and 3 bits several times.
# * AWQ's activation-aware scaling helps where activations have outliers. In a model the
#   layers that read one input share one scale, scored on the sub-block's output and folded
#   into the norm (or v_proj) so that the float model is unchanged; the GELU MLP's output
#   layer keeps an explicit input scale. On the book's model, which has no outliers, it
#   does not beat RTN.
# * Decoding at batch 1 reads every weight once per token for 2 FLOPs: an intensity of
#   $16/w$ FLOP/byte, far below any GPU's balance point, so the time is the bytes over the
#   bandwidth and $b$-bit weights with groups of $g$ speed it up by $16/(b + (16+b)/g)$.
# * GGUF stores a model's tensors in ggml's block formats: Q4_1 is 32 four-bit codes with a
#   float16 scale and minimum (5 bits per weight), Q4_K two levels of scales (4.5 bits).
#   The book decodes the real file bit for bit like ggml's own package and encodes the
#   32-weight formats byte for byte.
# * Q4_K_M is a mixture of per-tensor types, not a format, and not absmax/7 (claim C5).
#   On a model whose rows are 576 wide llama.cpp must fall back to 32-weight formats.
# * Re-quantising the real 4-bit file: its own Q4_1 grid is free, the aligned Q4_K nearly
#   so; any other 4-bit grid (Q4_0, NF4, RTN, GPTQ) costs a fifth or more of the
#   perplexity and AWQ, which scales the channels with large activations, about a tenth;
#   keeping the embedding (also the output layer) at 8 bits matters.
# * The real model's linear-layer inputs have outlier channels, thousands of times the
#   median in the worst layer, where one token (the first) carries them; AWQ's scales
#   searched on that token fit it and lose on other tokens.
# * A SIMD instruction processes 4, 8 or 16 float32 numbers, by the register width
#   (claim C6: true only on AVX2 or wider), and a memory-bound kernel gains less.
# * PyTorch's int4 kernel runs the file's own Q4_1 codes within bfloat16 precision.
# * Weight-only kernels make a memory-bound matrix-vector product faster in the order of
#   the bytes they read, a claim made here only where the repeated measurements' ranges do
#   not overlap.
# * Floating-point codes space their levels by a constant relative step $2^{-M}$: E4M3
#   (largest value 448) and E5M2 (57344) follow from their exponent and mantissa bits and
#   round exactly as torch's casts; MXFP4 shares a power-of-two scale per 32 E2M1 elements
#   (4.25 bits per weight) and equals ggml's encoder once its tie rule is adopted.
# * An orthogonal rotation leaves a layer's output unchanged; a Hadamard one bounds every
#   rotated value by the norm of its block, brings SmolLM2's heavy-tailed activations close
#   to normal and cuts their per-token int4 error, while the weights gain little.
# * LLM.int8() computes the few input channels with $|x| \ge 6$ in float and the rest in int8:
#   it finds planted outliers exactly, and the error of its int8 part follows $\Delta^2/12$.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/15_quantisation.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 15` writes a stub
# of every function, `llmbook grade 15` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_15.py` runs
# the same checks on the reference.
#
# 1. (★) **Six decibels per bit.** For $x \sim U[-A, A]$ and $b$-bit absmax quantisation,
#    derive in SymPy the signal-to-quantisation-noise ratio
#    $\mathrm{SQNR} = \mathrm{Var}(x)/(\Delta^2/12) = 4(2^{b-1}-1)^2$, write `sqnr_db(bits)`,
#    and check it against a measurement for 4, 6 and 8 bits. What is the slope in dB per bit?
# 2. (★★) **Clipping.** For Gaussian data absmax wastes codes on the rare largest values.
#    Write `clipped_absmax(x, bits, ratio)` (range $\pm$ ratio $\cdot\max|x|$, values beyond it
#    clamped) and `best_clip_ratio(x, bits)` by grid search. Show that at 3 bits the best ratio
#    is well below 1 and halves the MSE, and that the best ratio grows with the bits.
# 3. (★★) **When does NF4 win?** Compare the MSE of NF4 and of symmetric int4, both group-wise
#    absmax with groups of 64, on Gaussian and on uniform data. Explain the result with the
#    density of the levels.
# 4. (★★★) **Act-order.** GPTQ's result depends on the order of the columns. Implement
#    `gptq_act_order(W, H, bits)`, which quantises the columns in order of decreasing
#    $H_{jj}$ (permute, run `gptq_quantize`, permute back), and show on inputs whose channel
#    scales span a factor of 30 that it beats the natural order. Why does it help to round the
#    columns with the largest inputs first?
# 5. (★★) **NVFP4.** NVIDIA's 4-bit format keeps MXFP4's E2M1 elements but gives every block
#    of 16 a scale stored in E4M3, which need not be a power of two:
#    $s = \mathrm{E4M3}(\max|x|/6)$. Write `quantize_nvfp4(x)` with `round_to_float` (it returns
#    the dequantised tensor) and compare its error with MXFP4's on Gaussian data. How many bits
#    per weight does each store, and where does NVFP4's lower error come from?

# %%
from llmbook.workbench import grade

grade("15", globals())
