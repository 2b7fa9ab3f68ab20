"""Reference solutions to the exercises of notebooks/05_positions (checked by tests/test_solutions_05.py)."""

from __future__ import annotations

import torch

from llmbook.transformer.positional import rope_frequencies, rope_permutation, sinusoidal_positions


def sinusoidal_dot(offset: int, d_model: int, base: float = 10000.0) -> float:
    """Exercise 1: PE_m . PE_n for m - n = offset, as sum_i cos(offset * w_i).

    Pair i contributes sin(m w) sin(n w) + cos(m w) cos(n w) = cos((m - n) w): the
    cosine of a difference. So the dot product depends on the offset alone (and is even
    in it); at offset 0 it is d/2.
    """
    omega = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d/2,)
    return float(torch.cos(offset * omega).sum())


def shift_matrix_lstsq(
    offset: int, num_positions: int, d_model: int, base: float = 10000.0
) -> tuple[torch.Tensor, float]:
    """Exercise 2: M_k recovered from the table by least squares, and cond(PE[0:T-k]).

    Solves PE[:-k] X = PE[k:] for X = M_k^T in float64. The error of the solution scales
    with the condition number of PE[:-k]: with a large base the low-frequency columns
    hardly change over T positions (cos ~ 1, sin ~ linear), so the columns are nearly
    dependent and the least-squares problem is ill-conditioned although the exact
    answer exists.
    """
    if not 0 < offset < num_positions:
        raise ValueError(f"offset must lie in [1, {num_positions - 1}], got {offset}")
    pe = sinusoidal_positions(num_positions, d_model, base=base, dtype=torch.float64)  # (T, d)
    A, Y = pe[:-offset], pe[offset:]  # (T - k, d) each
    X = torch.linalg.lstsq(A, Y).solution  # (d, d) = M_k^T
    return X.T, float(torch.linalg.cond(A))


def interleaved_to_half_split(W: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Exercise 3: reorder the rows of W_q or W_k (H d_k, d) from interleaved to half-split.

    With perm = rope_permutation(d_k), half-split RoPE satisfies
    half(y) = interleaved(y[perm])[argsort(perm)]. Taking y = q_int[argsort(perm)] (so that
    y[perm] = q_int) gives half(y) = interleaved(q_int)[argsort(perm)]: a fixed permutation
    of the rotated vector, applied to q and k alike, which leaves every dot product
    unchanged. So each head's rows are reordered by pi^{-1} = argsort(perm): the even
    rows first, then the odd ones. (Hugging Face's Llama conversion does the same with a
    view/transpose.)
    """
    rows, d_model = W.shape
    if rows % n_heads:
        raise ValueError(f"W has {rows} rows, not a multiple of n_heads={n_heads}")
    d_head = rows // n_heads
    inv = torch.argsort(rope_permutation(d_head))  # (d_k,): 0, 2, 4, ..., 1, 3, 5, ...
    return W.reshape(n_heads, d_head, d_model)[:, inv].reshape(rows, d_model)


def roformer_decay_bound(
    distances: torch.Tensor, d_head: int, base: float = 10000.0
) -> torch.Tensor:
    """Exercise 4: RoFormer's relative upper bound (2/d_k) sum_{j=1}^{d_k/2} |S_j| per distance.

    S_j = sum_{l<j} e^{i r theta_l} are the partial sums of the rotation phases at distance r.
    Shapes: distances (N,) -> (N,) float64. At r = 0, |S_j| = j and the bound is
    (d_k/2 + 1) / 2.
    """
    theta = rope_frequencies(d_head, base)  # (d/2,)
    phases = torch.polar(torch.ones(len(distances), d_head // 2, dtype=torch.float64),
                         distances.double()[:, None] * theta)  # (N, d/2)
    partial = torch.cumsum(phases, dim=1)  # (N, d/2): S_1, ..., S_{d/2}
    return partial.abs().mean(dim=1)  # (N,)


def abel_bound_holds(q: torch.Tensor, k: torch.Tensor, distance: int, base: float = 10000.0
                     ) -> tuple[float, float]:
    """Exercise 4: (|sum_j h_j e^{i r theta_j}|, max_j |h_{j+1} - h_j| sum_j |S_j|) for one q, k.

    q and k are (d_k,) in the interleaved layout; h_j = q~_j conj(k~_j), h_{d/2} = 0.
    The first number is at most the second (Abel summation), and the RoPE score at
    offset r is the real part of the sum inside the first.
    """
    d = q.shape[-1]
    qc = torch.view_as_complex(q.double().reshape(d // 2, 2).contiguous())  # (d/2,)
    kc = torch.view_as_complex(k.double().reshape(d // 2, 2).contiguous())
    h = qc * kc.conj()  # (d/2,)
    theta = rope_frequencies(d, base)
    phases = torch.polar(torch.ones(d // 2, dtype=torch.float64), distance * theta)
    total = (h * phases).sum().abs().item()
    h_ext = torch.cat((h, h.new_zeros(1)))  # h_{d/2} = 0
    S = torch.cumsum(phases, 0)  # S_1..S_{d/2}
    bound = ((h_ext[1:] - h_ext[:-1]).abs().max() * S.abs().sum()).item()
    return total, bound


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))


def pair_rotations(d_head: int, base: float, context: int) -> torch.Tensor:
    """Exercise 5: the number of turns r_j = L theta_j / (2 pi) each RoPE pair makes over L tokens.

    YaRN (Peng et al., 2023) sorts the pairs by this count over the trained context L_0:
    r_j > beta_fast (32) keeps theta_j, r_j < beta_slow (1) divides it by the factor, and a
    linear ramp in the pair index blends the two in between.
    """
    return context * rope_frequencies(d_head, base) / (2 * torch.pi)  # (d/2,)
