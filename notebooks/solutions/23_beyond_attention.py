"""Reference solutions to the exercises of notebooks/23_beyond_attention.

Checked by tests/test_solutions_23.py.
"""

from __future__ import annotations

import sympy as sp
import torch
from torch import Tensor

from llmbook.scale.linear_attention import elu_feature_map
from llmbook.scale.ssm import scan_combine, ssm_kernel, zoh_discretize

# ---------------------------------------------------------------- exercise 1


def decay_mask(T: int, gamma: float, dtype: torch.dtype = torch.float64) -> Tensor:
    """D[t, s] = gamma^(t - s) for s <= t, else 0: the causal mask with forgetting."""
    t = torch.arange(T, dtype=dtype)
    lag = t[:, None] - t[None, :]
    return torch.where(lag >= 0, torch.tensor(gamma, dtype=dtype) ** lag.clamp(min=0), torch.zeros((), dtype=dtype))


def decayed_linear_attention_parallel(q: Tensor, k: Tensor, v: Tensor, gamma: float) -> Tensor:
    """y = ((phi(Q) phi(K)^T) * D) V / row sums, with D = decay_mask: unrolling
    S_t = gamma S_{t-1} + phi(k_t) v_t^T gives S_t = sum_{s<=t} gamma^(t-s) phi(k_s) v_s^T."""
    if not 0 < gamma <= 1:
        raise ValueError(f"gamma must lie in (0, 1], got {gamma}")
    scores = (elu_feature_map(q) @ elu_feature_map(k).transpose(-2, -1)) * decay_mask(q.shape[-2], gamma, q.dtype)
    return (scores @ v) / scores.sum(dim=-1, keepdim=True)


def decayed_linear_attention_recurrent(q: Tensor, k: Tensor, v: Tensor, gamma: float) -> Tensor:
    """S_t = gamma S_{t-1} + phi(k_t) v_t^T, z_t = gamma z_{t-1} + phi(k_t),
    y_t = S_t^T phi(q_t) / (z_t . phi(q_t))."""
    if not 0 < gamma <= 1:
        raise ValueError(f"gamma must lie in (0, 1], got {gamma}")
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    S = q.new_zeros(*q.shape[:-2], q.shape[-1], v.shape[-1])
    z = q.new_zeros(*q.shape[:-2], q.shape[-1])
    ys = []
    for t in range(q.shape[-2]):
        S = gamma * S + phi_k[..., t, :, None] * v[..., t, None, :]
        z = gamma * z + phi_k[..., t, :]
        ys.append((phi_q[..., t, :, None] * S).sum(-2) / (phi_q[..., t, :] * z).sum(-1, keepdim=True))
    return torch.stack(ys, dim=-2)


# ---------------------------------------------------------------- exercise 2


def blelloch_scan(a: Tensor, b: Tensor) -> tuple[Tensor, int]:
    """Inclusive scan of h_t = a_t h_{t-1} + b_t along dim 0 with Blelloch's work-efficient
    algorithm; returns h and the number of element combines of the up- and down-sweeps.

    T is padded to a power of two with the identity element (1, 0). The up-sweep leaves at
    each tree node the composition of its subtree; the down-sweep turns the root into the
    identity and hands each left child its parent's prefix and each right child the parent's
    prefix followed by the left subtree (order matters: the operator is not commutative).
    The exclusive prefix is then combined with each element to give the inclusive h.
    """
    if a.shape != b.shape or a.ndim < 1:
        raise ValueError(f"a and b must have the same shape (T, ...), got {tuple(a.shape)} and {tuple(b.shape)}")
    T = a.shape[0]
    n = 1 << max(T - 1, 0).bit_length()  # next power of two >= T
    pad = (n - T, *a.shape[1:])
    A = torch.cat([a, torch.ones(pad, dtype=a.dtype)])
    B = torch.cat([b, torch.zeros(pad, dtype=b.dtype)])
    combines, step = 0, 1
    while step < n:  # up-sweep
        right = torch.arange(2 * step - 1, n, 2 * step)
        A[right], B[right] = scan_combine((A[right - step], B[right - step]), (A[right], B[right]))
        combines += len(right)
        step *= 2
    A[n - 1], B[n - 1] = 1.0, 0.0  # identity at the root
    step = n // 2
    while step >= 1:  # down-sweep
        right = torch.arange(2 * step - 1, n, 2 * step)
        left = right - step
        left_total = (A[left].clone(), B[left].clone())
        A[left], B[left] = A[right], B[right]  # left child: the parent's prefix
        A[right], B[right] = scan_combine((A[right], B[right]), left_total)
        combines += len(right)
        step //= 2
    _, h = scan_combine((A[:T], B[:T]), (a, b))  # exclusive prefix, then the element itself
    return h, combines


def hillis_steele_combines(T: int) -> int:
    """Element combines of the Hillis-Steele scan: sum over rounds of (T - 2^r)."""
    total, offset = 0, 1
    while offset < T:
        total, offset = total + T - offset, 2 * offset
    return total


# ---------------------------------------------------------------- exercise 3


def bilinear_discretize(A: Tensor, B: Tensor, delta: float) -> tuple[Tensor, Tensor]:
    """Bilinear (Tustin) transform: A_bar = (I - delta/2 A)^{-1} (I + delta/2 A),
    B_bar = (I - delta/2 A)^{-1} delta B. ``A`` (N, N), ``B`` (N,)."""
    eye = torch.eye(A.shape[0], dtype=A.dtype)
    lhs = eye - delta / 2 * A
    return torch.linalg.solve(lhs, eye + delta / 2 * A), torch.linalg.solve(lhs, delta * B)


def bilinear_minus_zoh_series() -> tuple[sp.Expr, sp.Expr]:
    """Leading terms of bilinear minus zero-order hold, scalar case, in powers of Delta:
    the two agree through Delta^2 and differ by a^3 Delta^3 / 12 (A_bar) and
    a^2 b Delta^3 / 12 (B_bar)."""
    a, b = sp.symbols("a b")
    delta = sp.Symbol("Delta", positive=True)
    zoh_A, zoh_B = sp.exp(delta * a), (sp.exp(delta * a) - 1) / a * b
    bil_A, bil_B = (1 + delta * a / 2) / (1 - delta * a / 2), delta * b / (1 - delta * a / 2)
    diff_A = sp.series(bil_A - zoh_A, delta, 0, 4).removeO()
    diff_B = sp.series(bil_B - zoh_B, delta, 0, 4).removeO()
    return sp.expand(diff_A), sp.expand(diff_B)


def kernel_gap(A: Tensor, B: Tensor, C: Tensor, delta: float, length: int) -> float:
    """Max |K_bilinear - K_zoh| over the first ``length`` kernel entries."""
    K_zoh = ssm_kernel(*zoh_discretize(A, B, delta), C, length)
    K_bil = ssm_kernel(*bilinear_discretize(A, B, delta), C, length)
    return float((K_zoh - K_bil).abs().max())


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))
