"""State-space models: discretisation, recurrence = convolution, Mamba's selective scan.

A continuous linear state-space model maps an input signal u(t) to an output y(t) through a
state x(t) in R^N:

    x'(t) = A x(t) + B u(t),     y(t) = C x(t)     (+ D u(t)).

* **Discretisation** (:func:`zoh_discretize`, :func:`zoh_discretize_diagonal`). Holding u
  constant over a step of length Delta (zero-order hold) gives the exact recurrence
  x_k = A_bar x_{k-1} + B_bar u_k with A_bar = exp(Delta A) and
  B_bar = (Delta A)^{-1} (exp(Delta A) - I) Delta B (Gu, Goel & Re, 2021, "Efficiently Modeling
  Long Sequences with Structured State Spaces", S4; Gu & Dao, 2023, "Mamba: Linear-Time
  Sequence Modeling with Selective State Spaces", eq. 4). Mamba replaces B_bar by its
  first-order term Delta B.
* **Recurrence = convolution** (:func:`ssm_recurrent`, :func:`ssm_kernel`,
  :func:`causal_convolution`). With A_bar, B_bar, C fixed in time, unrolling the recurrence
  gives y = K * u with the kernel K = (C B_bar, C A_bar B_bar, C A_bar^2 B_bar, ...) (S4's
  eq. 4-5), computable with an FFT in O(T log T).
* **Selective scan** (:func:`selective_scan`). Mamba makes Delta, B and C functions of the
  input: no fixed kernel any more, but the recurrence h_t = a_t h_{t-1} + b_t is still a
  *scan* with the associative operator (a1, b1) o (a2, b2) = (a1 a2, a2 b1 + b2)
  (:func:`scan_combine`), which :func:`associative_scan` evaluates in log2(T) parallel steps
  (Hillis & Steele, 1986, "Data Parallel Algorithms"; Blelloch, 1990, "Prefix Sums and
  Their Applications").
* **The Mamba model** (:class:`MambaConfig`, :class:`MambaMixer`, :class:`MambaBlock`,
  :class:`MambaLM`, :func:`mamba_from_hf`): the architecture of Gu & Dao's Figure 3, with
  the parameter names of Hugging Face ``MambaForCausalLM``, so its weights load directly;
  :func:`mamba_num_parameters` counts its parameters from the configuration alone, to size a
  Mamba against a transformer of equal parameters.

Introduced in notebooks/23_beyond_attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from llmbook.transformer.layers import RMSNorm
from llmbook.validation import (
    check_finite,
    check_floating_tensor,
    check_nonempty,
    check_positive_int,
    check_positive_number,
    check_same_dtype,
    check_sequence,
    check_token_ids,
)

__all__ = [
    "CausalDepthwiseConv1d",
    "MambaBlock",
    "MambaConfig",
    "MambaLM",
    "MambaMixer",
    "associative_scan",
    "causal_convolution",
    "linear_recurrence",
    "mamba_from_hf",
    "mamba_num_parameters",
    "scan_combine",
    "selective_scan",
    "ssm_kernel",
    "ssm_recurrent",
    "zoh_discretize",
    "zoh_discretize_diagonal",
]


def _check_delta(delta: object) -> float:
    if isinstance(delta, Tensor):
        if delta.numel() != 1:
            raise ValueError(f"delta must be a scalar step size, got shape {tuple(delta.shape)}")
        delta = float(delta)
    if isinstance(delta, bool) or not isinstance(delta, int | float):
        raise TypeError(f"delta must be a number, got {type(delta).__name__}")
    if not (math.isfinite(delta) and delta > 0):
        raise ValueError(f"delta must be a positive finite step size, got delta={delta}")
    return float(delta)


# ---------------------------------------------------------------- discretisation


def zoh_discretize(A: Tensor, B: Tensor, delta: float) -> tuple[Tensor, Tensor]:
    """Zero-order-hold discretisation of x' = A x + B u with step ``delta``.

    A_bar = exp(delta A),  B_bar = (delta A)^{-1} (exp(delta A) - I) delta B.
    Shapes: ``A`` (N, N), invertible; ``B`` (N,) or (N, M) -> A_bar (N, N), B_bar like B.
    """
    check_floating_tensor(A, "A")
    check_floating_tensor(B, "B")
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"A must be a square matrix (N, N), got shape {tuple(A.shape)}")
    if B.ndim not in (1, 2) or B.shape[0] != A.shape[0]:
        raise ValueError(f"B must have shape (N,) or (N, M) with N = {A.shape[0]}, got {tuple(B.shape)}")
    delta = _check_delta(delta)
    dA = delta * A
    A_bar = torch.linalg.matrix_exp(dA)  # (N, N)
    eye = torch.eye(A.shape[0], dtype=A.dtype, device=A.device)
    Bm = B[:, None] if B.ndim == 1 else B
    B_bar = torch.linalg.solve(dA, (A_bar - eye) @ (delta * Bm))  # (N, M)
    return A_bar, (B_bar[:, 0] if B.ndim == 1 else B_bar)


def zoh_discretize_diagonal(A: Tensor, B: Tensor, delta: Tensor | float) -> tuple[Tensor, Tensor]:
    """Zero-order hold for a diagonal A (the case of S4D and Mamba), elementwise.

    A_bar = exp(delta A),  B_bar = (exp(delta A) - 1) / A * B  (the deltas cancel), computed
    with ``expm1`` so that small delta A loses no digits. ``A`` and ``B`` (..., N) of the same
    shape, nonzero A; ``delta`` a positive number or a tensor of shape (...) (one step per
    leading index, as Mamba's per-channel Delta). Returns A_bar, B_bar (..., N).
    """
    check_floating_tensor(A, "A")
    check_floating_tensor(B, "B")
    if A.shape != B.shape or A.ndim < 1:
        raise ValueError(f"A and B must have the same shape (..., N), got A {tuple(A.shape)} "
                         f"and B {tuple(B.shape)}")
    if bool((A == 0).any()):
        raise ValueError("A has a zero entry: (exp(delta A) - 1) / A is then delta (take the limit)")
    if isinstance(delta, Tensor):
        if delta.shape != A.shape[:-1] or not bool((delta > 0).all()):
            raise ValueError(f"delta must be positive with shape A.shape[:-1] = {tuple(A.shape[:-1])}, "
                             f"got shape {tuple(delta.shape)}")
        dA = delta[..., None] * A
    else:
        dA = _check_delta(delta) * A
    return torch.exp(dA), torch.expm1(dA) / A * B


# ---------------------------------------------------------------- LTI: recurrence = convolution


def _check_lti(A_bar: Tensor, B_bar: Tensor, C: Tensor) -> None:
    for name, t in (("A_bar", A_bar), ("B_bar", B_bar), ("C", C)):
        check_finite(check_floating_tensor(t, name), name)
    N = A_bar.shape[0] if A_bar.ndim == 2 else -1
    if A_bar.shape != (N, N) or B_bar.shape != (N,) or C.shape != (N,):
        raise ValueError(f"need A_bar (N, N), B_bar (N,) and C (N,), got {tuple(A_bar.shape)}, "
                         f"{tuple(B_bar.shape)} and {tuple(C.shape)}")


def ssm_recurrent(A_bar: Tensor, B_bar: Tensor, C: Tensor, u: Tensor) -> Tensor:
    """Run the discrete SSM x_k = A_bar x_{k-1} + B_bar u_k, y_k = C x_k from x_{-1} = 0.

    Single input, single output: ``A_bar`` (N, N), ``B_bar`` (N,), ``C`` (N,), ``u`` (..., T)
    -> y (..., T). O(T N^2) time, a state of N numbers.
    """
    _check_lti(A_bar, B_bar, C)
    check_finite(check_floating_tensor(u, "u"), "u")
    check_same_dtype(u, "u", A_bar, "A_bar")
    if u.ndim < 1 or u.shape[-1] == 0:
        raise ValueError(f"u must have shape (..., T) with T >= 1, got {tuple(u.shape)}")
    x = u.new_zeros(*u.shape[:-1], A_bar.shape[0])  # (..., N)
    ys = []
    for k in range(u.shape[-1]):
        x = x @ A_bar.T + u[..., k, None] * B_bar  # (..., N)
        ys.append(x @ C)
    return torch.stack(ys, dim=-1)  # (..., T)


def ssm_kernel(A_bar: Tensor, B_bar: Tensor, C: Tensor, length: int) -> Tensor:
    """The SSM convolution kernel K_j = C A_bar^j B_bar for j = 0 .. length-1 (S4, eq. 5).

    Shapes: ``A_bar`` (N, N), ``B_bar`` (N,), ``C`` (N,) -> K (length,).
    """
    _check_lti(A_bar, B_bar, C)
    length = check_positive_int("length", length)
    K, v = [], B_bar
    for _ in range(length):
        K.append(C @ v)  # C A_bar^j B_bar
        v = A_bar @ v
    return torch.stack(K)


def _check_convolution(u: object, K: object) -> None:
    check_floating_tensor(u, "u")
    check_floating_tensor(K, "K")
    if u.ndim < 1 or K.shape != (u.shape[-1],):
        raise ValueError(f"K must have shape (T,) with T = u.shape[-1], got u {tuple(u.shape)} "
                         f"and K {tuple(K.shape)}")
    if u.shape[-1] == 0:
        raise ValueError(f"u has no positions (T = 0), got shape {tuple(u.shape)}")
    check_same_dtype(K, "K", u, "u")
    check_finite(u, "u")
    check_finite(K, "K")


def causal_convolution(u: Tensor, K: Tensor, method: str = "fft") -> Tensor:
    """y_t = sum_{j=0}^{t} K_j u_{t-j}: the causal convolution of ``u`` with the kernel ``K``.

    ``u`` (..., T), ``K`` (T,) -> y (..., T). ``method="fft"`` multiplies the spectra, zero-
    padded to 2T so that the circular convolution does not wrap around (O(T log T), as S4);
    ``method="direct"`` sums the products (O(T^2)).
    """
    _check_convolution(u, K)
    T = u.shape[-1]
    if method == "fft":
        n = 2 * T
        y = torch.fft.irfft(torch.fft.rfft(u, n=n) * torch.fft.rfft(K, n=n), n=n)
        return y[..., :T]
    if method == "direct":
        idx = torch.arange(T)
        lag = idx[:, None] - idx[None, :]  # (T, T): t - s
        Kmat = torch.where(lag >= 0, K[lag.clamp(min=0)], K.new_zeros(()))  # Toeplitz, lower
        return u @ Kmat.T
    raise ValueError(f"method must be 'fft' or 'direct', got {method!r}")


# ---------------------------------------------------------------- scans


def scan_combine(left: tuple[Tensor, Tensor], right: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """The scan operator of a linear recurrence: (a1, b1) o (a2, b2) = (a1 a2, a2 b1 + b2).

    An element (a, b) stands for the affine map h -> a h + b; ``left`` acts first, so the
    composition is h -> a2 (a1 h + b1) + b2. Composition of maps is associative, hence so is
    the operator. Elementwise on tensors of one shape.
    """
    (a1, b1), (a2, b2) = left, right
    return a1 * a2, a2 * b1 + b2


def _check_ab(a: object, b: object, dim: int) -> int:
    check_floating_tensor(a, "a")
    check_floating_tensor(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"a and b must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    if not -a.ndim <= dim < a.ndim:
        raise ValueError(f"dim={dim} is out of range for a tensor with {a.ndim} dimensions")
    if a.shape[dim] == 0:
        raise ValueError(f"a and b have no steps along dim={dim} (shape {tuple(a.shape)})")
    return dim % a.ndim


def linear_recurrence(a: Tensor, b: Tensor, dim: int = 1) -> Tensor:
    """h_t = a_t h_{t-1} + b_t along ``dim``, from h_{-1} = 0, one step at a time (T steps).

    ``a`` and ``b`` of the same shape -> h of that shape.
    """
    dim = _check_ab(a, b, dim)
    h = torch.zeros_like(b.select(dim, 0))
    hs = []
    for t in range(a.shape[dim]):
        h = a.select(dim, t) * h + b.select(dim, t)
        hs.append(h)
    return torch.stack(hs, dim=dim)


def associative_scan(a: Tensor, b: Tensor, dim: int = 1) -> tuple[Tensor, Tensor]:
    """Inclusive scan of (a_t, b_t) under :func:`scan_combine`, Hillis-Steele style.

    After round r (offsets 1, 2, 4, ...), element t holds the composition of elements
    max(0, t - 2^r + 1) .. t; after ceil(log2 T) rounds, of 0 .. t. Each round is one
    vectorised :func:`scan_combine` over all positions: log2(T) sequential steps instead of T
    (O(T log T) work; Blelloch's two-sweep scan does O(T)). Returns the cumulative products
    prod_{s<=t} a_s and the states h_t = a_t h_{t-1} + b_t (h_{-1} = 0), both shaped like a.
    """
    dim = _check_ab(a, b, dim)
    T = a.shape[dim]
    offset = 1
    while offset < T:
        a_prev, b_prev = a.narrow(dim, 0, T - offset), b.narrow(dim, 0, T - offset)
        a_cur, b_cur = a.narrow(dim, offset, T - offset), b.narrow(dim, offset, T - offset)
        a_new, b_new = scan_combine((a_prev, b_prev), (a_cur, b_cur))
        a = torch.cat([a.narrow(dim, 0, offset), a_new], dim=dim)
        b = torch.cat([b.narrow(dim, 0, offset), b_new], dim=dim)
        offset *= 2
    return a, b


def selective_scan(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                   D: Tensor | None = None, method: str = "sequential") -> Tensor:
    """Mamba's selective SSM (Gu & Dao, 2023, Algorithm 2), one independent SSM per channel.

        h_t = exp(delta_t A) h_{t-1} + delta_t B_t u_t,    y_t = C_t h_t + D u_t,

    per channel e with a diagonal A[e] (N states): Delta, B, C depend on t (selection), A and D
    do not. B_bar = delta B is the first-order term of the zero-order hold.
    Shapes: ``u``, ``delta`` (batch, T, E); ``A`` (E, N); ``B``, ``C`` (batch, T, N);
    ``D`` (E,) or None -> y (batch, T, E). ``method``: "sequential" (a loop over t) or
    "parallel" (:func:`associative_scan`); they agree to round-off.
    """
    for name, t in (("u", u), ("delta", delta), ("A", A), ("B", B), ("C", C), ("D", D)):
        if t is not None:
            check_finite(check_floating_tensor(t, name), name)
            check_same_dtype(t, name, u, "u")
    if u.ndim != 3 or delta.shape != u.shape:
        raise ValueError(f"u and delta must have the same shape (batch, T, E), got u {tuple(u.shape)} "
                         f"and delta {tuple(delta.shape)}")
    if u.shape[1] == 0:
        raise ValueError(f"u has no positions (T = 0), got shape {tuple(u.shape)}")
    if bool((delta < 0).any()):
        raise ValueError(f"delta must hold step sizes >= 0 (softplus outputs), found {float(delta.min())}")
    batch, T, E = u.shape
    if A.ndim != 2 or A.shape[0] != E:
        raise ValueError(f"A must have shape (E, N) with E = {E}, got {tuple(A.shape)}")
    N = A.shape[1]
    if B.shape != (batch, T, N) or C.shape != (batch, T, N):
        raise ValueError(f"B and C must have shape (batch, T, N) = {(batch, T, N)}, got "
                         f"{tuple(B.shape)} and {tuple(C.shape)}")
    if D is not None and D.shape != (E,):
        raise ValueError(f"D must have shape (E,) = ({E},), got {tuple(D.shape)}")
    a = torch.exp(delta[..., None] * A)  # A_bar: (batch, T, E, N)
    b = (delta * u)[..., None] * B[:, :, None, :]  # B_bar u: (batch, T, E, N)
    if method == "sequential":
        h = linear_recurrence(a, b, dim=1)
    elif method == "parallel":
        h = associative_scan(a, b, dim=1)[1]
    else:
        raise ValueError(f"method must be 'sequential' or 'parallel', got {method!r}")
    y = (h * C[:, :, None, :]).sum(dim=-1)  # C_t h_t: (batch, T, E)
    return y + u * D if D is not None else y


# ---------------------------------------------------------------- the Mamba model


@dataclass
class MambaConfig:
    """Sizes of a Mamba language model (names as Gu & Dao; Hugging Face's in brackets).

    ``d_model`` (hidden_size), ``n_layers`` (num_hidden_layers), ``d_state`` N (state_size),
    ``expand`` (E = expand * d_model, intermediate_size), ``d_conv`` (conv_kernel),
    ``dt_rank`` R of the low-rank Delta projection (time_step_rank; ceil(d_model / 16) when
    None), ``bias`` of in/out projections (use_bias), ``conv_bias`` (use_conv_bias).
    """

    vocab_size: int
    d_model: int = 64
    n_layers: int = 2
    d_state: int = 16
    expand: int = 2
    d_conv: int = 4
    dt_rank: int | None = None
    bias: bool = False
    conv_bias: bool = True
    eps: float = 1e-5
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "d_state", "expand", "d_conv"):
            check_positive_int(name, getattr(self, name))
        if self.dt_rank is None:
            self.dt_rank = math.ceil(self.d_model / 16)
        check_positive_int("dt_rank", self.dt_rank)
        check_positive_number("eps", self.eps)

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model


def mamba_num_parameters(config: MambaConfig) -> int:
    """The number of parameters of ``MambaLM(config)``, from the sizes alone.

    With d = d_model, E = expand * d, N = d_state, R = dt_rank, K = d_conv, each of the
    ``n_layers`` blocks holds in_proj d * 2E (+ 2E bias), the depthwise conv E * K (+ E),
    x_proj E (R + 2N), dt_proj R E + E, A_log E N, D E, out_proj E d (+ d) and its RMSNorm
    gain d; around them the V x d embedding, the final norm d and, untied, a V x d head
    (Gu & Dao, 2023, Figure 3; the layout of Hugging Face ``MambaForCausalLM``).
    """
    if not isinstance(config, MambaConfig):
        raise TypeError(f"config must be a MambaConfig, got {type(config).__name__}")
    c = config
    d, E, N, R, K = c.d_model, c.d_inner, c.d_state, c.dt_rank, c.d_conv
    block = (d * 2 * E + (2 * E if c.bias else 0)  # in_proj
             + E * K + (E if c.conv_bias else 0)  # conv1d
             + E * (R + 2 * N)  # x_proj
             + R * E + E  # dt_proj
             + E * N + E  # A_log, D
             + E * d + (d if c.bias else 0)  # out_proj
             + d)  # the block's RMSNorm
    head = 0 if c.tie_embeddings else c.vocab_size * d
    return c.vocab_size * d + c.n_layers * block + d + head


class CausalDepthwiseConv1d(nn.Module):
    """A causal convolution of width K applied to each channel separately.

    y[t, e] = bias[e] + sum_{j=0}^{K-1} weight[e, 0, j] x[t - (K-1) + j, e], with x = 0 before
    t = 0: the same as ``nn.Conv1d(E, E, K, groups=E, padding=K-1)`` cut to the first T outputs.
    ``weight`` (E, 1, K) as in ``nn.Conv1d``. Shapes: (batch, T, E) -> (batch, T, E).
    """

    def __init__(self, channels: int, kernel_size: int, bias: bool = True) -> None:
        super().__init__()
        self.channels = check_positive_int("channels", channels)
        self.kernel_size = check_positive_int("kernel_size", kernel_size)
        bound = 1 / math.sqrt(kernel_size)
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.zeros(channels)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != 3 or x.shape[-1] != self.channels:
            raise ValueError(f"expected (batch, T, {self.channels}), got {tuple(x.shape)}")
        K, T = self.kernel_size, x.shape[1]
        padded = F.pad(x, (0, 0, K - 1, 0))  # K-1 zeros before t = 0: (batch, T+K-1, E)
        y = sum(self.weight[:, 0, j] * padded[:, j:j + T] for j in range(K))
        return y + self.bias if self.bias is not None else y


class MambaMixer(nn.Module):
    """The Mamba mixer (Gu & Dao, 2023, Figure 3 and section 3.4), on (batch, T, d_model).

        x, z   = in_proj(h) split in two                       (batch, T, E) each
        x      = silu(causal depthwise conv(x))
        dt, B, C = x_proj(x) split into R, N, N
        Delta  = softplus(dt_proj(dt))                          (batch, T, E), positive
        y      = selective_scan(x, Delta, A = -exp(A_log), B, C, D)
        out    = out_proj(y * silu(z))                          the gate

    A is kept as A_log so that A = -exp(A_log) stays negative (a decaying state).
    """

    def __init__(self, config: MambaConfig, scan_method: str = "sequential") -> None:
        super().__init__()
        c = config
        E, N, R = c.d_inner, c.d_state, c.dt_rank
        if scan_method not in ("sequential", "parallel"):
            raise ValueError(f"scan_method must be 'sequential' or 'parallel', got {scan_method!r}")
        self.d_state, self.dt_rank, self.scan_method = N, R, scan_method
        self.in_proj = nn.Linear(c.d_model, 2 * E, bias=c.bias)
        self.conv1d = CausalDepthwiseConv1d(E, c.d_conv, bias=c.conv_bias)
        self.x_proj = nn.Linear(E, R + 2 * N, bias=False)
        self.dt_proj = nn.Linear(R, E, bias=True)
        # S4D-real initialisation: A[e, n] = -(n + 1)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, N + 1, dtype=torch.float32)).repeat(E, 1))
        self.D = nn.Parameter(torch.ones(E))
        self.out_proj = nn.Linear(E, c.d_model, bias=c.bias)

    def forward(self, h: Tensor) -> Tensor:
        check_sequence(h, "h", self.in_proj.in_features, self.in_proj.weight)
        x, z = self.in_proj(h).chunk(2, dim=-1)  # (batch, T, E) each
        x = F.silu(self.conv1d(x))
        dt, B, C = self.x_proj(x).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = F.softplus(self.dt_proj(dt))  # (batch, T, E)
        A = -torch.exp(self.A_log)  # (E, N)
        y = selective_scan(x, delta, A, B, C, self.D, method=self.scan_method)
        return self.out_proj(y * F.silu(z))  # (batch, T, d_model)


class MambaBlock(nn.Module):
    """A residual Mamba block: h + mixer(RMSNorm(h)). Shapes: (batch, T, d) -> (batch, T, d)."""

    def __init__(self, config: MambaConfig, scan_method: str = "sequential") -> None:
        super().__init__()
        self.norm = RMSNorm(config.d_model, eps=config.eps)
        self.mixer = MambaMixer(config, scan_method)

    def forward(self, h: Tensor) -> Tensor:
        return h + self.mixer(self.norm(h))


class MambaLM(nn.Module):
    """A Mamba language model: embeddings, ``n_layers`` :class:`MambaBlock`, RMSNorm, LM head.

    ``forward(ids)``: token ids (batch, T) -> logits (batch, T, V). With ``tie_embeddings``
    the head is the embedding matrix. Parameter names follow Hugging Face ``MambaModel``.
    """

    def __init__(self, config: MambaConfig, scan_method: str = "sequential") -> None:
        super().__init__()
        self.config = config
        self.embeddings = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(MambaBlock(config, scan_method) for _ in range(config.n_layers))
        self.norm_f = RMSNorm(config.d_model, eps=config.eps)
        self.lm_head = None if config.tie_embeddings else nn.Linear(config.d_model, config.vocab_size,
                                                                    bias=False)

    def forward(self, ids: Tensor) -> Tensor:
        check_nonempty(check_token_ids(ids, "ids", ndim=2, vocab_size=self.embeddings.num_embeddings), "ids")
        h = self.embeddings(ids)  # (batch, T, d)
        for layer in self.layers:
            h = layer(h)
        h = self.norm_f(h)
        head = self.embeddings.weight if self.lm_head is None else self.lm_head.weight
        return h @ head.T  # (batch, T, V)


def mamba_from_hf(hf_model: Any, scan_method: str = "sequential") -> MambaLM:
    """A :class:`MambaLM` with the configuration and weights of a Hugging Face
    ``MambaForCausalLM`` (in the dtype of its weights)."""
    c = hf_model.config
    config = MambaConfig(vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                         d_state=c.state_size, expand=c.expand, d_conv=c.conv_kernel,
                         dt_rank=int(c.time_step_rank), bias=c.use_bias, conv_bias=c.use_conv_bias,
                         eps=c.layer_norm_epsilon, tie_embeddings=bool(c.tie_word_embeddings))
    if config.d_inner != c.intermediate_size:
        raise ValueError(f"intermediate_size {c.intermediate_size} != expand * hidden_size {config.d_inner}")
    sd = {k.removeprefix("backbone."): v for k, v in hf_model.state_dict().items()}
    if config.tie_embeddings:
        sd.pop("lm_head.weight", None)
    dtype = sd["embeddings.weight"].dtype
    model = MambaLM(config, scan_method).to(dtype)
    model.load_state_dict(sd, strict=True)
    return model
