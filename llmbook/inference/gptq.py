"""Post-training weight quantisation that looks at the data: GPTQ and AWQ.

Introduced in notebooks/15_quantisation. Round-to-nearest (RTN) quantises every weight on
its own. For a linear layer y = x Wᵀ (W of shape (d_out, d_in)) fed calibration inputs X
(N, d_in), what matters is the output error ‖X (W - Ŵ)ᵀ‖², a quadratic form in each row's
weight error with Hessian H = 2 XᵀX (d_in, d_in):

* **GPTQ** (Frantar et al., 2023, "GPTQ: Accurate Post-Training Quantization for
  Generative Pre-trained Transformers") quantises the columns of W one at a time and, after
  each, moves the not-yet-quantised columns to compensate: the optimal-brain-surgeon update
  (Hassibi & Stork, 1993, "Second order derivatives for network pruning: Optimal Brain
  Surgeon") δw = -(w_q - quant(w_q)) / [H⁻¹]_qq · H⁻¹[:, q]. :func:`gptq_quantize_naive`
  keeps H⁻¹ explicitly and removes a row and column after every step;
  :func:`gptq_quantize` reads the same numbers off the upper Cholesky factor of H⁻¹ and
  applies the updates lazily block by block (the paper's Algorithm 1);
* **AWQ** (Lin et al., 2024, "AWQ: Activation-aware Weight Quantization for LLM
  Compression and Acceleration") scales the input channels with large activations up
  before quantising, s = mean|X|^α, Ŵ = Q(W diag(s)) diag(s)⁻¹, with α chosen on a grid
  (:func:`awq_scale_search` for one layer). In a model (:func:`awq_scale_model`) the layers
  that read one input share one s (q/k/v; the MLP's input layers), α is scored on the
  output of the sub-block they feed, and s is folded into the operation that produces the
  input (a norm's gain, or the rows of v_proj for o_proj) where one exists.

Two independent references for GPTQ: :func:`gptq_lstsq_reference` re-solves the least-squares
problem on X itself after every rounded column (no H⁻¹ anywhere), and
:func:`quantize_brute_force` finds the exact optimum on the grid by enumeration (tiny layers).

:func:`quantize_model` applies a method to every linear layer of a
:class:`~llmbook.transformer.model.TransformerLM` ("fake quantisation": the weights are replaced by
their dequantised values, so the model runs unchanged in float and the error is exactly
the quantisation error); :func:`model_memory_bytes` counts what storing the codes saves.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from llmbook.inference.quant import fake_quantize

__all__ = [
    "awq_scale_model",
    "awq_scale_search",
    "gptq_lstsq_reference",
    "gptq_quantize",
    "gptq_quantize_naive",
    "hessian_from_inputs",
    "layer_output_error",
    "model_memory_bytes",
    "quantize_brute_force",
    "quantize_model",
    "quantize_rtn",
]


def _check_weight(W: object, H: object | None, bits: object, group_size: object) -> None:
    if not isinstance(W, Tensor) or W.ndim != 2 or not W.is_floating_point():
        raise ValueError(f"W must be a 2-D float tensor (d_out, d_in), got "
                         f"{tuple(W.shape) if isinstance(W, Tensor) else type(W).__name__}")
    d_in = W.shape[1]
    if H is not None and (not isinstance(H, Tensor) or H.shape != (d_in, d_in)):
        raise ValueError(f"H must have shape (d_in, d_in) = ({d_in}, {d_in}), got "
                         f"{tuple(H.shape) if isinstance(H, Tensor) else type(H).__name__}")
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be an int in 2..8, got {bits!r}")
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int)
                                   or group_size <= 0 or d_in % group_size):
        raise ValueError(f"group_size must be a positive int dividing d_in={d_in}, got "
                         f"{group_size!r}")


def quantize_rtn(W: Tensor, bits: int, group_size: int | None = None) -> Tensor:
    """Round-to-nearest, zero-point, per output row (or per row and group of input columns)."""
    _check_weight(W, None, bits, group_size)
    return fake_quantize(W, bits, dim=0 if group_size is None else None, group_size=group_size)


def hessian_from_inputs(X: Tensor) -> Tensor:
    """H = 2 XᵀX for inputs X (N, d_in): the Hessian of ‖X (W - Ŵ)ᵀ‖² in one row of Ŵ."""
    if not isinstance(X, Tensor) or X.ndim != 2:
        raise ValueError(f"X must be 2-D (N, d_in), got "
                         f"{tuple(X.shape) if isinstance(X, Tensor) else type(X).__name__}")
    return 2 * X.T @ X  # (d_in, d_in)


def layer_output_error(W: Tensor, W_hat: Tensor, X: Tensor) -> float:
    """‖X Wᵀ - X Ŵᵀ‖_F: how far the quantised layer's outputs are from the original's."""
    return float(torch.linalg.norm(X @ (W - W_hat).T))


def _grid(w: Tensor, bits: int) -> tuple[Tensor, Tensor]:
    """Zero-point scale and zero per row of w (d_out, k) -> ((d_out, 1), (d_out, 1))."""
    levels = 2**bits - 1
    lo = w.amin(1, keepdim=True).clamp(max=0)
    hi = w.amax(1, keepdim=True).clamp(min=0)
    scale = torch.where(hi > lo, (hi - lo) / levels, torch.ones_like(hi))
    return scale, torch.round(-lo / scale)


def _snap(w: Tensor, scale: Tensor, zero: Tensor, bits: int) -> Tensor:
    """Quantise-dequantise a column w (d_out,) on the grid (scale, zero) of shape (d_out, 1)."""
    q = torch.clamp(torch.round(w / scale[:, 0]) + zero[:, 0], 0, 2**bits - 1)
    return scale[:, 0] * (q - zero[:, 0])


def _prepare(W: Tensor, H: Tensor, damp: float) -> tuple[Tensor, Tensor]:
    """Float64 copies; dead inputs (H_ii = 0) get H_ii = 1 and zero weights; H += λ I with
    λ = damp · mean(diag H), which keeps H invertible when X has fewer rows than d_in."""
    if not 0 <= damp < 1:
        raise ValueError(f"damp must be in [0, 1), got {damp!r}")
    W, H = W.detach().to(torch.float64).clone(), H.detach().to(torch.float64).clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    H += damp * torch.diag(H).mean() * torch.eye(H.shape[0], dtype=torch.float64)
    if torch.linalg.cholesky_ex(H).info != 0:  # H = 2 X^T X is PSD; an indefinite H is a bug
        raise ValueError(f"H is not positive definite even after damping by "
                         f"damp * mean(diag H) = {damp} * {float(torch.diag(H).mean()):.3g}: "
                         "H must be 2 X^T X from calibration inputs (raise damp if X is "
                         "nearly rank-deficient)")
    return W, H


def gptq_quantize_naive(W: Tensor, H: Tensor, bits: int, group_size: int | None = None,
                        damp: float = 0.01) -> tuple[Tensor, dict[str, float]]:
    """GPTQ with the inverse Hessian kept explicitly (the paper's eq. 2-3; teaching version).

    For q = 0, 1, ..., d_in - 1: quantise column q, then update the remaining columns by
    δW = -(err / [H⁻¹]_qq) H⁻¹[q, :] and remove q from H⁻¹ with the rank-one downdate
    H⁻¹ ← H⁻¹ - H⁻¹[:, q] H⁻¹[q, :] / [H⁻¹]_qq. The scale and zero of a group are set from
    the (updated) weights when its first column is reached. Returns (Ŵ, stats) with Ŵ of
    W's shape and dtype and stats["loss"] = Σ_q ‖err_q‖² / (2 [H⁻¹]_qq), the OBS estimate.
    """
    _check_weight(W, H, bits, group_size)
    Wd, Hd = _prepare(W, H, damp)
    Hinv = torch.linalg.inv(Hd)  # (d_in, d_in)
    Q = torch.zeros_like(Wd)
    loss = 0.0
    scale, zero = _grid(Wd, bits)
    for q in range(Wd.shape[1]):
        if group_size is not None and q % group_size == 0:
            scale, zero = _grid(Wd[:, q:q + group_size], bits)
        Q[:, q] = _snap(Wd[:, q], scale, zero, bits)
        err = (Wd[:, q] - Q[:, q]) / Hinv[q, q]  # (d_out,)
        loss += float((err**2).sum() * Hinv[q, q] / 2)
        Wd[:, q:] -= err[:, None] * Hinv[q, q:][None, :]  # OBS update of the columns left
        Hinv = Hinv - Hinv[:, q:q + 1] @ Hinv[q:q + 1, :] / Hinv[q, q]  # remove q
    return Q.to(W.dtype), {"loss": loss}


def gptq_quantize(W: Tensor, H: Tensor, bits: int, group_size: int | None = None,
                  block_size: int = 128, damp: float = 0.01) -> tuple[Tensor, dict[str, float]]:
    """GPTQ (Frantar et al., 2023, Algorithm 1): Ŵ for W (d_out, d_in) and H (d_in, d_in).

    Row q of the upper Cholesky factor U of H⁻¹ (H⁻¹ = UᵀU) is exactly row q of the
    downdated inverse of :func:`gptq_quantize_naive` divided by sqrt([H⁻¹]_qq), so every
    update can be read off U without any downdate. Inside a block of ``block_size``
    columns the updates are applied column by column; the columns after the block receive
    the block's errors at once, Err (d_out, B) @ U[block, after] (lazy batch updates).
    Returns (Ŵ in W's dtype, stats with the OBS loss estimate ``loss``).
    """
    _check_weight(W, H, bits, group_size)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if group_size is not None and block_size % group_size:
        raise ValueError(f"block_size={block_size} must be a multiple of group_size={group_size}")
    Wd, Hd = _prepare(W, H, damp)
    d_in = Wd.shape[1]
    Hinv = torch.cholesky_inverse(torch.linalg.cholesky(Hd))  # (d_in, d_in)
    U = torch.linalg.cholesky(Hinv, upper=True)  # (d_in, d_in), H⁻¹ = Uᵀ U
    Q = torch.zeros_like(Wd)
    loss = 0.0
    scale, zero = _grid(Wd, bits)
    for i1 in range(0, d_in, block_size):
        i2 = min(i1 + block_size, d_in)
        W1 = Wd[:, i1:i2].clone()  # (d_out, B)
        Err1 = torch.zeros_like(W1)
        U1 = U[i1:i2, i1:i2]  # (B, B)
        for i in range(i2 - i1):
            if group_size is not None and (i1 + i) % group_size == 0:
                scale, zero = _grid(W1[:, i:i + group_size], bits)
            w, d = W1[:, i], U1[i, i]
            Q[:, i1 + i] = _snap(w, scale, zero, bits)
            err = (w - Q[:, i1 + i]) / d  # (d_out,)
            loss += float((err**2).sum() / 2)
            W1[:, i:] -= err[:, None] * U1[i, i:][None, :]
            Err1[:, i] = err
        Wd[:, i2:] -= Err1 @ U[i1:i2, i2:]  # lazy update of every later column
    return Q.to(W.dtype), {"loss": loss}


def gptq_lstsq_reference(W: Tensor, X: Tensor, bits: int, group_size: int | None = None,
                         damp: float = 0.0) -> Tensor:
    """GPTQ's result recomputed without any inverse Hessian: sequential least squares on X.

    W (d_out, d_in), calibration inputs X (N, d_in) of full column rank (or ``damp`` > 0).
    For q = 0, 1, ..., d_in - 1: round column q on the grid (zero-point, per row or per row
    and group, the grid of a group set from the current weights when its first column is
    reached, as in :func:`gptq_quantize_naive`), then choose the columns not yet rounded to
    minimise ‖X Wᵀ - X_Q Ŵ_Qᵀ - X_F W_Fᵀ‖ (Q the rounded columns, F the rest), with
    ``torch.linalg.lstsq``. That the OBS update of GPTQ computes exactly this minimiser is
    what the comparison tests. ``damp`` adds GPTQ's ridge term: with λ = damp · mean(diag 2XᵀX)
    the rows sqrt(λ/2) I are appended to X, since 2 X_augᵀ X_aug = 2 XᵀX + λ I. Returns Ŵ
    (d_out, d_in) in float64. O(d_in) least-squares solves: for checking, not for use.
    """
    _check_weight(W, None, bits, group_size)
    if not isinstance(X, Tensor) or X.ndim != 2 or X.shape[1] != W.shape[1]:
        raise ValueError(f"X must have shape (N, d_in={W.shape[1]}), got "
                         f"{tuple(X.shape) if isinstance(X, Tensor) else type(X).__name__}")
    if not 0 <= damp < 1:
        raise ValueError(f"damp must be in [0, 1), got {damp!r}")
    Wd, Xd = W.detach().to(torch.float64).clone(), X.detach().to(torch.float64)
    d_in = Wd.shape[1]
    if damp > 0:
        lam = damp * float((2 * Xd.pow(2).sum(0)).mean())  # damp · mean(diag H), H = 2 XᵀX
        Xd = torch.cat([Xd, (lam / 2) ** 0.5 * torch.eye(d_in, dtype=torch.float64)])
    target = Xd @ Wd.T  # (N, d_out): the layer's original outputs
    Q = torch.zeros_like(Wd)
    scale, zero = _grid(Wd, bits)
    for q in range(d_in):
        if group_size is not None and q % group_size == 0:
            scale, zero = _grid(Wd[:, q:q + group_size], bits)
        Q[:, q] = _snap(Wd[:, q], scale, zero, bits)
        if q + 1 < d_in:
            rest = target - Xd[:, :q + 1] @ Q[:, :q + 1].T  # (N, d_out)
            Wd[:, q + 1:] = torch.linalg.lstsq(Xd[:, q + 1:], rest).solution.T
    return Q


def quantize_brute_force(W: Tensor, H: Tensor, bits: int) -> Tensor:
    """The exact minimiser of Σ_i (w_i - ŵ_i)ᵀ H (w_i - ŵ_i) on the quantisation grid.

    W (d_out, d_in), H (d_in, d_in) positive semi-definite (e.g. 2 XᵀX). Each row's grid is
    the zero-point grid of RTN and GPTQ without groups (one scale and zero per row), and all
    (2^bits)^d_in code vectors of a row are enumerated: the true optimum, against which
    round-to-nearest and GPTQ (both on the same grid) can be placed. Needs
    bits · d_in <= 16. Returns Ŵ (d_out, d_in) in float64.
    """
    _check_weight(W, H, bits, None)
    d_out, d_in = W.shape
    if bits * d_in > 16:
        raise ValueError(f"brute force enumerates 2^(bits d_in) codes per row; bits * d_in = "
                         f"{bits * d_in} > 16 is too many")
    Wd, Hd = W.detach().to(torch.float64), H.detach().to(torch.float64)
    scale, zero = _grid(Wd, bits)  # (d_out, 1) each
    levels = torch.arange(2**bits, dtype=torch.float64)
    codes = torch.cartesian_prod(*[levels] * d_in).reshape(-1, d_in)  # (2^(b d_in), d_in)
    best = torch.empty_like(Wd)
    for i in range(d_out):
        cand = scale[i] * (codes - zero[i])  # (n, d_in): every point of the grid
        D = Wd[i] - cand  # (n, d_in)
        best[i] = cand[torch.argmin(((D @ Hd) * D).sum(1))]
    return best


def awq_scale_search(W: Tensor, X: Tensor, bits: int, group_size: int | None = None,
                     grid: int = 20) -> tuple[Tensor, dict[str, object]]:
    """AWQ (Lin et al., 2024, section 3.2): activation-aware per-input-channel scaling.

    For α in {0, 1/grid, ..., 1}: s = mean_n |X[n, :]|^α (d_in,), normalised so that
    max(s) min(s) = 1, and Ŵ(α) = RTN(W diag(s)) diag(s)⁻¹; keep the α with the smallest
    ‖X Ŵ(α)ᵀ - X Wᵀ‖. α = 0 is plain RTN, so the result is never worse than RTN on X.
    Returns (Ŵ of W's shape, stats with ``alpha``, ``scales`` (d_in,) and ``errors``).
    """
    _check_weight(W, None, bits, group_size)
    if not isinstance(X, Tensor) or X.ndim != 2 or X.shape[1] != W.shape[1]:
        raise ValueError(f"X must have shape (N, d_in={W.shape[1]}), got "
                         f"{tuple(X.shape) if isinstance(X, Tensor) else type(X).__name__}")
    if isinstance(grid, bool) or not isinstance(grid, int) or grid < 1:
        raise ValueError(f"grid must be a positive int, got {grid!r}")
    x_mean = X.abs().mean(0).clamp(min=1e-8)  # (d_in,)
    G = X.T @ X  # (d_in, d_in): ‖X Dᵀ‖² = Σ (D G) ⊙ D, cheaper than forming X Dᵀ per α
    best: tuple[float, float, Tensor, Tensor] | None = None
    errors = []
    for k in range(grid + 1):
        alpha = k / grid
        s = x_mean**alpha
        s = s / torch.sqrt(s.max() * s.min())  # (d_in,)
        W_hat = quantize_rtn(W * s, bits, group_size) / s  # (d_out, d_in)
        D = W - W_hat  # (d_out, d_in)
        err = float(torch.sqrt(((D @ G) * D).sum().clamp(min=0)))
        errors.append(err)
        if best is None or err < best[0]:
            best = (err, alpha, W_hat, s)
    assert best is not None
    return best[2], {"alpha": best[1], "scales": best[3], "errors": errors}


# ---------------------------------------------------------------- whole models


def _linear_layers(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """The nn.Linear layers of the decoder blocks, in the order the forward pass uses them."""
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and n.startswith("blocks.")]


class _StopForward(Exception):
    """Raised by the capturing hook: the rest of the forward pass is not needed."""


def _capture_call(model: nn.Module, module: nn.Module,
                  ids: Tensor) -> tuple[tuple[object, ...], dict[str, object]]:
    """The positional and keyword arguments of ``module``'s call when ``model`` runs on ids."""
    captured: list[tuple[tuple[object, ...], dict[str, object]]] = []

    def hook(_module: nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        captured.append((args, dict(kwargs)))
        raise _StopForward

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        model(ids)
    except _StopForward:
        pass
    finally:
        handle.remove()
    return captured[0]


def _capture_inputs(model: nn.Module, layer: nn.Module, ids: Tensor) -> Tensor:
    """The inputs (B T, d_in) that ``layer`` receives when ``model`` runs on ``ids``."""
    x = _capture_call(model, layer, ids)[0][0]
    return x.reshape(-1, x.shape[-1])


def _awq_groups(block: nn.Module) -> list[dict[str, object]]:
    """The AWQ scaling groups of a decoder block, in forward order.

    A group is the linear layers that read one input, the operation that produces that
    input and can absorb 1/s (None if there is none), and the sub-block whose output
    scores α (Lin et al., 2024, section 3.2; the grouping of their released code).
    """
    attn, mlp = block.attn, block.mlp
    groups = [
        {"name": "q/k/v", "layers": ["attn.q_proj", "attn.k_proj", "attn.v_proj"],
         "prev": "attn_norm", "inspect": "attn"},
        # o_proj reads P V: dividing v_proj's output rows by s divides its input exactly,
        # unless heads share v (grouped-query attention), where one row feeds several heads
        {"name": "o_proj", "layers": ["attn.o_proj"],
         "prev": "attn.v_proj" if attn.n_kv_heads == attn.n_heads else None,
         "inspect": "attn.o_proj"},
    ]
    if hasattr(mlp, "gate_proj"):  # SwiGLU: down_proj reads silu(gate) * up, linear in up
        groups += [{"name": "gate/up", "layers": ["mlp.gate_proj", "mlp.up_proj"],
                    "prev": "mlp_norm", "inspect": "mlp"},
                   {"name": "down_proj", "layers": ["mlp.down_proj"], "prev": "mlp.up_proj",
                    "inspect": "mlp.down_proj"}]
    elif hasattr(mlp, "fc"):  # GELU MLP: proj reads gelu(fc x); GELU does not commute with s
        groups += [{"name": "fc", "layers": ["mlp.fc"], "prev": "mlp_norm", "inspect": "mlp"},
                   {"name": "proj", "layers": ["mlp.proj"], "prev": None, "inspect": "mlp.proj"}]
    else:
        raise ValueError(f"awq: unknown MLP {type(mlp).__name__}; expected fc/proj or "
                         f"gate_proj/up_proj/down_proj")
    return groups


def _fold_scale(prev: nn.Module, layers: list[nn.Linear], s: Tensor) -> None:
    """y = prev(x) / s, W <- W diag(s) for every layer reading y: the float function is kept."""
    for layer in layers:
        layer.weight.data = layer.weight.data * s  # columns scaled up
    if isinstance(prev, nn.Linear):
        prev.weight.data = prev.weight.data / s[:, None]  # output rows scaled down
    else:  # a norm: y = x_hat * weight (+ bias)
        prev.weight.data = prev.weight.data / s
    if getattr(prev, "bias", None) is not None:
        prev.bias.data = prev.bias.data / s


@torch.no_grad()
def awq_scale_model(model: nn.Module, bits: int, group_size: int | None,
                    calib_ids: Tensor, grid: int = 20) -> tuple[nn.Module, list[dict[str, object]]]:
    """AWQ's scale search on a whole model (Lin et al., 2024, section 3.2): a float64 copy
    with the scales folded in, and one record per group.

    For every decoder block and every group of layers that read one input (see
    :func:`_awq_groups`: q/k/v, o_proj, the MLP's input layer(s), its output layer), the
    input X (N, d_in) and the arguments of the sub-block it feeds are captured on
    ``calib_ids`` (B, T); for α in {0, 1/grid, ..., 1} one scale s = mean|X|^α (normalised
    to max(s) min(s) = 1) is shared by the group, the group's weights are replaced by
    RTN(W diag(s)) diag(s)⁻¹ and α is scored by ‖sub-block output - float output‖ (for
    q/k/v the whole attention, for the MLP's input layer the whole MLP). The best s is then
    folded: the producing norm's gain and bias (or v_proj's rows) are divided by s and the
    group's weight columns multiplied by s, which leaves the float model's function
    unchanged. A group without such a producer (a GELU MLP's output layer; o_proj under
    grouped-query attention) keeps its weights; its s is recorded with ``folded_into`` None
    and must be applied at quantisation as RTN(W diag(s)) diag(s)⁻¹, which a kernel does by
    dividing its input by s. Calibration inputs come from the float model, as in the
    authors' code. Records: ``block``, ``group``, ``layers``, ``folded_into``, ``alpha``,
    ``scales`` (d_in,) and ``errors`` (one per α; α = 0 is RTN).
    """
    _check_weight(torch.zeros(1, 1), None, bits, None)
    if not isinstance(calib_ids, Tensor) or calib_ids.ndim != 2:
        raise ValueError(f"calib_ids must have shape (B, T), got "
                         f"{tuple(calib_ids.shape) if isinstance(calib_ids, Tensor) else calib_ids}")
    if isinstance(grid, bool) or not isinstance(grid, int) or grid < 1:
        raise ValueError(f"grid must be a positive int, got {grid!r}")
    work = copy.deepcopy(model).to(torch.float64).eval()
    records: list[dict[str, object]] = []
    for b, block in enumerate(work.blocks):
        for group in _awq_groups(block):
            layers = [block.get_submodule(n) for n in group["layers"]]
            if group_size is not None and layers[0].in_features % group_size:
                raise ValueError(f"group_size={group_size} must divide d_in="
                                 f"{layers[0].in_features} of blocks.{b}.{group['layers'][0]}")
            inspect = block.get_submodule(group["inspect"])
            args, kwargs = _capture_call(work, inspect, calib_ids)
            X = args[0].reshape(-1, layers[0].in_features)  # (B T, d_in): the group's input
            target = inspect(*args, **kwargs)  # the float sub-block output
            G = X.T @ X if inspect is layers[0] else None  # one linear: ‖X Dᵀ‖² = Σ (D G) ⊙ D
            originals = [layer.weight.data.clone() for layer in layers]
            x_mean = X.abs().mean(0).clamp(min=1e-8)  # (d_in,)
            errors, best = [], None
            for k in range(grid + 1):
                s = x_mean ** (k / grid)
                s = s / torch.sqrt(s.max() * s.min())  # (d_in,)
                for layer, W in zip(layers, originals, strict=True):
                    layer.weight.data = quantize_rtn(W * s, bits, group_size) / s
                if G is not None:
                    D = originals[0] - layers[0].weight.data  # (d_out, d_in)
                    err = float(torch.sqrt(((D @ G) * D).sum().clamp(min=0)))
                else:
                    err = float(torch.linalg.norm(inspect(*args, **kwargs) - target))
                errors.append(err)
                if best is None or err < best[0]:
                    best = (err, k / grid, s)
            for layer, W in zip(layers, originals, strict=True):
                layer.weight.data = W
            assert best is not None
            prev = group["prev"]
            if prev is not None:
                _fold_scale(block.get_submodule(prev), layers, best[2])
            records.append({"block": b, "group": group["name"],
                            "layers": [f"blocks.{b}.{n}" for n in group["layers"]],
                            "folded_into": None if prev is None else f"blocks.{b}.{prev}",
                            "alpha": best[1], "scales": best[2], "errors": errors})
    return work, records


@torch.no_grad()
def quantize_model(model: nn.Module, method: str, bits: int, group_size: int | None = None,
                   calib_ids: Tensor | None = None, damp: float = 0.01,
                   block_size: int = 128, grid: int = 20) -> nn.Module:
    """A copy of ``model`` whose decoder-block linear layers hold quantised weights.

    ``method``: "rtn" (round-to-nearest), "gptq" or "awq"; weights are quantised with
    zero-point codes per output row, or per row and group of ``group_size`` input columns.
    The copy stores the *dequantised* weights in float ("fake quantisation"): it computes
    what a kernel reading the b-bit codes would compute, up to float round-off. The token
    embedding (tied with the output layer here), positions and norms stay in float.
    GPTQ and AWQ need ``calib_ids`` (B, T): the layers are quantised in forward order and
    each one's inputs are captured with a forward pre-hook while running the copy, so every
    layer is calibrated on what the already-quantised layers before it produce (GPTQ's
    sequential mode). AWQ searches one scale per shared input on the float model and
    folds it into the preceding norm or v_proj (:func:`awq_scale_model`), then rounds every
    layer; the returned copy then also holds the rescaled norms. The original model is not
    changed.
    """
    if method not in ("rtn", "gptq", "awq"):
        raise ValueError(f"method must be 'rtn', 'gptq' or 'awq', got {method!r}")
    if method != "rtn" and (not isinstance(calib_ids, Tensor) or calib_ids.ndim != 2):
        raise ValueError(f"method {method!r} needs calib_ids of shape (B, T), got "
                         f"{tuple(calib_ids.shape) if isinstance(calib_ids, Tensor) else calib_ids}")
    if method == "awq":  # scales searched and folded in float64, then every layer is RTN
        scaled, records = awq_scale_model(model, bits, group_size, calib_ids, grid=grid)
        explicit = {n: r["scales"] for r in records if r["folded_into"] is None
                    for n in r["layers"]}  # input rescales no earlier operation can absorb
        for name, layer in _linear_layers(scaled):
            s = explicit.get(name)
            W = layer.weight.data
            layer.weight.data = (quantize_rtn(W, bits, group_size) if s is None
                                 else quantize_rtn(W * s, bits, group_size) / s)
        dtype = next(model.parameters()).dtype
        return scaled.to(dtype)
    qmodel = copy.deepcopy(model).eval()
    for _name, layer in _linear_layers(qmodel):
        W = layer.weight.data  # (d_out, d_in)
        if method == "rtn":
            layer.weight.data = quantize_rtn(W, bits, group_size)
            continue
        X = _capture_inputs(qmodel, layer, calib_ids).to(torch.float64)  # (B T, d_in)
        W_hat, _ = gptq_quantize(W, hessian_from_inputs(X), bits, group_size,
                                 block_size=block_size, damp=damp)
        layer.weight.data = W_hat.to(W.dtype)
    return qmodel


def model_memory_bytes(model: nn.Module, bits: int | None = None,
                       group_size: int | None = None, float_bits: int = 16) -> int:
    """Bytes to store ``model`` with its decoder-block linear weights at ``bits`` bits.

    Every other parameter (embeddings, norms, biases), and every weight when ``bits`` is
    None, costs ``float_bits``. A quantised weight (d_out, d_in) costs d_out d_in b bits
    plus, per row and group (one group per row without ``group_size``), a float scale
    (``float_bits``) and a b-bit zero point. Rounded up to whole bytes.
    """
    if bits is not None and (isinstance(bits, bool) or not isinstance(bits, int)
                             or not 2 <= bits <= 8):
        raise ValueError(f"bits must be None or an int in 2..8, got {bits!r}")
    quantised = {id(m.weight): m.weight for _, m in _linear_layers(model)} if bits else {}
    total_bits = 0
    for p in model.parameters():
        if id(p) in quantised:
            d_out, d_in = p.shape
            if group_size is not None and d_in % group_size:
                raise ValueError(f"group_size={group_size} must divide d_in={d_in}")
            groups = d_out * (1 if group_size is None else d_in // group_size)
            total_bits += p.numel() * bits + groups * (float_bits + bits)
        else:
            total_bits += p.numel() * float_bits
    return (total_bits + 7) // 8
