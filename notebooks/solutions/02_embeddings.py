"""Reference solutions to the exercises of notebooks/02_embeddings (checked by tests/test_solutions_02.py)."""

from __future__ import annotations

import sympy as sp
import torch
from sympy.stats import Beta
from sympy.stats import E as expectation

from llmbook.text.embedding import embedding_grad, pairwise_cosine


def nearest_neighbours(E: torch.Tensor, i: int, k: int) -> list[int]:
    """Exercise 1: the k rows of E (V, d) with the highest cosine to row i, excluding i.

    Ties are broken by the smaller index (a stable sort on the negated cosines).
    """
    V = E.shape[0]
    if not 0 <= i < V:
        raise ValueError(f"row index i={i} is out of range for V={V}")
    if not 0 < k < V:
        raise ValueError(f"k must lie in [1, {V - 1}], got k={k}")
    cos = pairwise_cosine(E)[i].clone()  # (V,)
    cos[i] = -float("inf")
    order = torch.sort(-cos, stable=True).indices
    return order[:k].tolist()


def vocab_for_half(
    non_embedding: int, d_model: int = 768, context_length: int = 1024
) -> sp.Integer:
    """Exercise 2: V such that V d + T_max d equals the non-embedding parameters.

    Then the tied token embedding plus the position table are exactly half of the model.
    For GPT-2 small (85,056,000 non-embedding parameters) the answer is V = 109,726.
    """
    V = sp.Symbol("V", positive=True)
    (solution,) = sp.solve(sp.Eq(V * d_model + context_length * d_model, non_embedding), V)
    return sp.nsimplify(solution)


def cos_moments() -> tuple[sp.Expr, sp.Expr, sp.Symbol]:
    """Exercise 3: (E[cos^4], Var(cos^2), d) for two independent isotropic Gaussian vectors.

    cos^2 ~ Beta(1/2, (d-1)/2), so E[cos^4] = 3 / (d (d + 2)) and
    Var(cos^2) = 2 (d - 1) / (d^2 (d + 2)).
    """
    d = sp.Symbol("d", integer=True, positive=True)
    cos2 = Beta("C2", sp.Rational(1, 2), (d - 1) / 2)
    fourth = sp.simplify(expectation(cos2**2))
    var_cos2 = sp.factor(sp.simplify(fourth - expectation(cos2) ** 2))
    return fourth, var_cos2, d


def squared_error_gradient(N: int = 2, V: int = 3) -> sp.Matrix:
    """Exercise 4, first step: dL/dz for L = (1/2N) sum_t ||z_t - y_t||^2, derived by SymPy.

    Every entry of z (N, V) is a free symbol ``z_tv`` (``sp.Symbol(f"z_{t}{v}")``) and y is
    a one-hot matrix (token t -> t mod V). Returns the N x V matrix dL/dz, differentiated
    entry by entry from L (it simplifies to (z - y) / N).
    """
    z = sp.Matrix(N, V, lambda t, v: sp.Symbol(f"z_{t}{v}"))
    y = sp.Matrix(N, V, lambda t, v: 1 if v == t % V else 0)
    L = sum((z - y).applyfunc(lambda e: e**2)) / (2 * N)
    return sp.Matrix(N, V, lambda t, v: sp.diff(L, z[t, v]))


def tied_grad_by_hand(
    E: torch.Tensor, A: torch.Tensor, ids: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Exercise 4: dL/dE for z = tanh(E[ids] A) E^T and L = (1/2N) sum_t ||z_t - y_t||^2.

    y_t is the one-hot vector of targets[t]; no autograd. Shapes: E (V, d), A (d, d), ids
    and targets (N,) -> (V, d). Backward pass: G_z = (z - y) / N; output use G_z^T h; then
    G_h = G_z E, G_a = G_h * (1 - h^2) (tanh' = 1 - tanh^2), G_x = G_a A^T, scattered into
    the rows of ids; the tied gradient is the sum of the two uses (section 2.4).
    """
    V = E.shape[0]
    N = ids.shape[0]
    x = E[ids]  # (N, d)
    h = torch.tanh(x @ A)  # (N, d)
    z = h @ E.T  # (N, V)
    y = torch.nn.functional.one_hot(targets, V).to(E.dtype)  # (N, V)
    G_z = (z - y) / N  # (N, V)
    grad_output_use = G_z.T @ h  # (V, d)
    G_a = (G_z @ E) * (1 - h**2)  # (N, d)
    G_x = G_a @ A.T  # (N, d)
    return grad_output_use + embedding_grad(ids, G_x, V)  # (V, d)


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))


def remove_top_directions(E: torch.Tensor, k: int) -> torch.Tensor:
    """Exercise 5: the rows of E (V, d), centred, with their k leading principal directions
    projected out ("all but the top").

    Subtract the mean row, take the right singular vectors of the centred matrix (its
    principal directions), and remove each row's components along the first k. ``k = 0`` only
    centres. Returns a (V, d) tensor of E's dtype.
    """
    if not isinstance(E, torch.Tensor) or E.ndim != 2 or not E.is_floating_point():
        raise ValueError("E must be a floating (V, d) tensor")
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= min(E.shape):
        raise ValueError(f"k must be an int in [0, {min(E.shape)}], got {k!r}")
    centred = E - E.mean(0)  # (V, d)
    if k == 0:
        return centred
    top = torch.linalg.svd(centred, full_matrices=False).Vh[:k]  # (k, d), orthonormal rows
    return centred - (centred @ top.T) @ top
