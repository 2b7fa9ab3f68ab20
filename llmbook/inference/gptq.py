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
  (:func:`awq_scale_search`).

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
    "awq_scale_search",
    "gptq_quantize",
    "gptq_quantize_naive",
    "hessian_from_inputs",
    "layer_output_error",
    "model_memory_bytes",
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


def _capture_inputs(model: nn.Module, layer: nn.Module, ids: Tensor) -> Tensor:
    """The inputs (B T, d_in) that ``layer`` receives when ``model`` runs on ``ids``."""
    captured: list[Tensor] = []

    def hook(_module: nn.Module, inputs: tuple[Tensor, ...]) -> None:
        captured.append(inputs[0].reshape(-1, inputs[0].shape[-1]))
        raise _StopForward

    handle = layer.register_forward_pre_hook(hook)
    try:
        model(ids)
    except _StopForward:
        pass
    finally:
        handle.remove()
    return captured[0]


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
    sequential mode). The original model is not changed.
    """
    if method not in ("rtn", "gptq", "awq"):
        raise ValueError(f"method must be 'rtn', 'gptq' or 'awq', got {method!r}")
    if method != "rtn" and (not isinstance(calib_ids, Tensor) or calib_ids.ndim != 2):
        raise ValueError(f"method {method!r} needs calib_ids of shape (B, T), got "
                         f"{tuple(calib_ids.shape) if isinstance(calib_ids, Tensor) else calib_ids}")
    qmodel = copy.deepcopy(model).eval()
    for _name, layer in _linear_layers(qmodel):
        W = layer.weight.data  # (d_out, d_in)
        if method == "rtn":
            layer.weight.data = quantize_rtn(W, bits, group_size)
            continue
        X = _capture_inputs(qmodel, layer, calib_ids).to(torch.float64)  # (B T, d_in)
        if method == "gptq":
            W_hat, _ = gptq_quantize(W, hessian_from_inputs(X), bits, group_size,
                                     block_size=block_size, damp=damp)
        else:
            W_hat, _ = awq_scale_search(W.to(torch.float64), X, bits, group_size, grid=grid)
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
