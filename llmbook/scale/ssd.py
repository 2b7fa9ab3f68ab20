"""State-space duality (SSD): Mamba-2's scalar-decay SSM as a recurrence, a masked matrix and chunks.

Dao & Gu (2024, "Transformers are SSMs: Generalized Models and Efficient Algorithms Through
Structured State Space Duality") restrict Mamba's diagonal A to a *scalar* times the identity
per head. Per head, with a state H_t of P x N numbers,

    H_t = a_t H_{t-1} + x_t B_t^T,     y_t = H_t C_t,     a_t = exp(Delta_t A) in (0, 1],

where x_t (P,) is the (already Delta-scaled) input, B_t, C_t (N,) the input-dependent
projections. Unrolling from H_{-1} = 0 gives y_t = sum_{s<=t} (prod_{k=s+1..t} a_k)(C_t . B_s) x_s,
that is

    y = (L o C B^T) x,     L_ts = prod_{k=s+1..t} a_k  (t >= s),  0 otherwise,

a *masked attention* whose mask L is 1-semiseparable (every submatrix below the diagonal has
rank 1). Their section 6 algorithm splits the sequence into chunks of Q positions: the
quadratic (attention-like) form inside each chunk, the recurrence between chunks.

* :func:`segsum`, :func:`semiseparable_mask`: log L and L, from log a.
* :func:`ssd_recurrent`, :func:`ssd_step`: the recurrence (T steps; one step).
* :func:`ssd_quadratic`: the dual form y = (L o C B^T) x, O(T^2).
* :func:`ssd_chunked`: the chunked algorithm, O(T Q) work and T / Q sequential steps.

Layout everywhere (Hugging Face ``Mamba2Mixer``'s): ``x`` (batch, T, H, P), ``log_a``
(batch, T, H) = Delta_t A <= 0, ``B`` and ``C`` (batch, T, G, N) with G groups dividing the H
heads (heads h share group h // (H / G)), states (batch, H, P, N).

Introduced in notebooks/23b_mamba2_ssd.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from llmbook.validation import (
    check_finite,
    check_floating_tensor,
    check_positive_int,
    check_same_dtype,
)

__all__ = ["segsum", "semiseparable_mask", "ssd_chunked", "ssd_quadratic", "ssd_recurrent", "ssd_step"]


def segsum(log_a: Tensor) -> Tensor:
    """Segment sums S_ts = sum_{k=s+1..t} log_a_k for t >= s, -inf for t < s.

    ``log_a`` (..., T) -> (..., T, T). Computed as a masked cumulative sum (no differences of
    cumulative sums, which lose digits when the sums are large). exp(S) is the mask L.
    """
    check_floating_tensor(log_a, "log_a")
    if log_a.ndim < 1 or log_a.shape[-1] == 0:
        raise ValueError(f"log_a must have shape (..., T) with T >= 1, got {tuple(log_a.shape)}")
    T = log_a.shape[-1]
    rep = log_a[..., :, None].expand(*log_a.shape, T)  # rep[k, s] = log_a_k
    strictly_lower = torch.ones(T, T, dtype=torch.bool, device=log_a.device).tril(-1)  # k > s
    S = rep.masked_fill(~strictly_lower, 0).cumsum(dim=-2)  # S[t, s] = sum_{s<k<=t} log_a_k
    causal = torch.ones(T, T, dtype=torch.bool, device=log_a.device).tril()
    return S.masked_fill(~causal, -torch.inf)


def semiseparable_mask(log_a: Tensor) -> Tensor:
    """The 1-semiseparable mask L_ts = prod_{k=s+1..t} a_k (t >= s), 0 above the diagonal.

    ``log_a`` (..., T) = log a -> L (..., T, T), with ones on the diagonal.
    """
    return torch.exp(segsum(log_a))


def _check_ssd(x: object, log_a: object, B: object, C: object) -> tuple[int, int, int, int, int, int]:
    for name, t in (("x", x), ("log_a", log_a), ("B", B), ("C", C)):
        check_finite(check_floating_tensor(t, name), name)
        if t is not x:
            check_same_dtype(t, name, x, "x")
    if x.ndim != 4:
        raise ValueError(f"x must have shape (batch, T, H, P), got {tuple(x.shape)}")
    batch, T, H, P = x.shape
    if T == 0:
        raise ValueError(f"x has no positions (T = 0), got shape {tuple(x.shape)}")
    if log_a.shape != (batch, T, H):
        raise ValueError(f"log_a must have shape (batch, T, H) = {(batch, T, H)}, got {tuple(log_a.shape)}")
    if bool((log_a > 0).any()):
        raise ValueError(f"log_a must be <= 0 (a decay a = exp(log_a) <= 1), found {float(log_a.max())}")
    if B.ndim != 4 or B.shape[:2] != (batch, T) or C.shape != B.shape:
        raise ValueError(f"B and C must have the same shape (batch, T, G, N) with batch, T = {batch}, {T}; "
                         f"got B {tuple(B.shape)} and C {tuple(C.shape)}")
    G, N = B.shape[2], B.shape[3]
    if G == 0 or H % G != 0 or N == 0:
        raise ValueError(f"the number of groups G = {G} must divide the number of heads H = {H} (and N >= 1)")
    return batch, T, H, P, G, N


def _heads(M: Tensor, H: int) -> Tensor:
    """(batch, T, G, N) -> (batch, T, H, N): head h reads group h // (H / G)."""
    return M.repeat_interleave(H // M.shape[2], dim=2)


def _check_state(state: object, batch: int, H: int, P: int, N: int, like: Tensor) -> Tensor:
    check_finite(check_floating_tensor(state, "initial_state"), "initial_state")
    check_same_dtype(state, "initial_state", like, "x")
    if state.shape != (batch, H, P, N):
        raise ValueError(f"initial_state must have shape (batch, H, P, N) = {(batch, H, P, N)}, "
                         f"got {tuple(state.shape)}")
    return state


def ssd_step(state: Tensor, x: Tensor, log_a: Tensor, B: Tensor, C: Tensor) -> tuple[Tensor, Tensor]:
    """One step of the recurrence: H = a H_prev + x B^T, y = H C.

    ``state`` (batch, H, P, N), ``x`` (batch, H, P), ``log_a`` (batch, H), ``B``, ``C``
    (batch, G, N) -> y (batch, H, P), new state (batch, H, P, N). The state does not grow.
    """
    check_floating_tensor(x, "x")
    if x.ndim != 3:
        raise ValueError(f"x must have shape (batch, H, P), got {tuple(x.shape)}")
    batch, H, P = x.shape
    if not isinstance(B, Tensor) or B.ndim != 3 or not isinstance(C, Tensor) or C.ndim != 3:
        raise ValueError("B and C must be tensors of shape (batch, G, N)")
    if not isinstance(log_a, Tensor) or log_a.ndim != 2:
        raise ValueError("log_a must be a tensor of shape (batch, H)")
    _check_ssd(x[:, None], log_a[:, None], B[:, None], C[:, None])
    _check_state(state, batch, H, P, B.shape[-1], x)
    Bh, Ch = _heads(B[:, None], H)[:, 0], _heads(C[:, None], H)[:, 0]  # (batch, H, N)
    new = torch.exp(log_a)[..., None, None] * state + x[..., :, None] * Bh[..., None, :]
    return (new * Ch[..., None, :]).sum(-1), new


def ssd_recurrent(x: Tensor, log_a: Tensor, B: Tensor, C: Tensor,
                  initial_state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The recurrence, one position at a time: T calls of :func:`ssd_step`.

    Shapes as the module docstring -> y (batch, T, H, P) and the final state (batch, H, P, N),
    from ``initial_state`` (zeros when None).
    """
    batch, T, H, P, G, N = _check_ssd(x, log_a, B, C)
    state = x.new_zeros(batch, H, P, N) if initial_state is None else \
        _check_state(initial_state, batch, H, P, N, x)
    ys = []
    for t in range(T):
        y, state = ssd_step(state, x[:, t], log_a[:, t], B[:, t], C[:, t])
        ys.append(y)
    return torch.stack(ys, dim=1), state


def ssd_quadratic(x: Tensor, log_a: Tensor, B: Tensor, C: Tensor) -> Tensor:
    """The dual, attention-like form y = (L o C B^T) x (Dao & Gu, 2024, section 3), from a zero state.

    Materialises the (batch, H, T, T) matrix M = L o C B^T: O(T^2 N) work, no loop.
    Shapes as the module docstring -> y (batch, T, H, P).
    """
    batch, T, H, P, G, N = _check_ssd(x, log_a, B, C)
    L = semiseparable_mask(log_a.transpose(1, 2))  # (batch, H, T, T)
    M = L * torch.einsum("bthn,bshn->bhts", _heads(C, H), _heads(B, H))
    return torch.einsum("bhts,bshp->bthp", M, x)


def ssd_chunked(x: Tensor, log_a: Tensor, B: Tensor, C: Tensor, chunk_size: int,
                initial_state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The SSD algorithm (Dao & Gu, 2024, section 6): quadratic within chunks, recurrent across.

    Split T into chunks of Q = ``chunk_size`` positions (zero-padded at the end: a = 1 and
    x = 0 change nothing). For chunk c with start state S_c:

    1. within the chunk, the quadratic form y_diag = (L_c o C B^T) x           (batch, H, Q, Q)
    2. the state the chunk alone leaves: R_c = sum_l (prod_{k>l} a_k) x_l B_l^T
    3. across chunks, the recurrence S_{c+1} = (prod_{k in c} a_k) S_c + R_c    (T / Q steps)
    4. what the start state contributes: y_off,l = (prod_{k<=l} a_k) S_c C_l

    y = y_diag + y_off. Shapes as the module docstring -> y (batch, T, H, P) and the final
    state (batch, H, P, N).
    """
    batch, T, H, P, G, N = _check_ssd(x, log_a, B, C)
    Q = check_positive_int("chunk_size", chunk_size)
    state = x.new_zeros(batch, H, P, N) if initial_state is None else \
        _check_state(initial_state, batch, H, P, N, x)
    pad = (-T) % Q
    n_chunks = (T + pad) // Q

    def chunks(t: Tensor) -> Tensor:  # (batch, T, ...) -> (batch, n_chunks, Q, ...)
        t = F.pad(t, (0, 0) * (t.ndim - 2) + (0, pad))
        return t.reshape(batch, n_chunks, Q, *t.shape[2:])

    xc, Bc, Cc = chunks(x), chunks(_heads(B, H)), chunks(_heads(C, H))  # (b, c, Q, H, .)
    la = chunks(log_a).permute(0, 3, 1, 2)  # (b, H, c, Q)
    cum = la.cumsum(dim=-1)  # log prod_{k<=l} a_k within the chunk
    # 1. diagonal blocks: quadratic form inside each chunk
    L = torch.exp(segsum(la))  # (b, H, c, Q, Q)
    y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", Cc, Bc, L, xc)
    # 2. each chunk's own contribution to the state at its end
    decay_to_end = torch.exp(cum[..., -1:] - cum)  # (b, H, c, Q)
    R = torch.einsum("bclhn,bhcl,bclhp->bchpn", Bc, decay_to_end, xc)
    # 3. recurrence across chunks
    chunk_decay = torch.exp(cum[..., -1])  # (b, H, c)
    starts = []
    for c in range(n_chunks):
        starts.append(state)
        state = chunk_decay[:, :, c, None, None] * state + R[:, c]
    S = torch.stack(starts, dim=1)  # (b, c, H, P, N)
    # 4. off-diagonal blocks: the start state, decayed to each position, read by C
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", Cc, S, torch.exp(cum))
    y = (y_diag + y_off).reshape(batch, n_chunks * Q, H, P)[:, :T]
    return y, state
