"""Checks of chapter 2's exercises (notebooks/02_embeddings), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are ``transformers``' GPT-2 (built on the meta device), SymPy integrals, a Monte
Carlo estimate, PyTorch's autograd and ``mse_loss``, and ``torch.linalg.eigh``.
"""

from __future__ import annotations

import math

import sympy as sp
import torch
import torch.nn.functional as F

from llmbook.text.embedding import embedding_parameter_count
from llmbook.workbench.checks import raises


def exercise_1_nearest_neighbours_on_clustered_table(solutions) -> None:
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(3, 16, generator=g, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])  # V=10, d=16
    E = 5 * centres[labels] + 0.1 * torch.randn(10, 16, generator=g, dtype=torch.float64)
    got = sorted(solutions.nearest_neighbours(E, 0, 3))
    assert got == [3, 6, 9], f"expected row 0's cluster mates [3, 6, 9], got {got}"
    got = sorted(solutions.nearest_neighbours(E, 4, 2))
    assert got == [1, 7], f"expected row 4's cluster mates [1, 7], got {got}"
    got = solutions.nearest_neighbours(E, 0, 9)
    assert 0 not in got, f"expected the query row 0 itself to be left out, got {got!r}"
    # ties broken by the smaller index: identical rows 1, 2 and 3 for query 0
    T = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    got = solutions.nearest_neighbours(T, 0, 2)
    assert got == [1, 2], f"expected [1, 2] (rows 1, 2, 3 tie at cos 1; smaller index first), got {got!r}"
    with raises(ValueError, match="k must lie", what="nearest_neighbours(T, 0, 5) with 5 rows"):
        solutions.nearest_neighbours(T, 0, 5)


def exercise_2_vocab_for_half_against_transformers(solutions) -> None:
    import transformers

    with torch.device("meta"):
        gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    total = sum(p.numel() for p in gpt2.parameters())
    embed = gpt2.transformer.wte.weight.numel() + gpt2.transformer.wpe.weight.numel()
    non_embedding = total - embed
    assert non_embedding == 85_056_000, f"transformers' GPT-2 small has {non_embedding} non-embedding parameters"
    V = solutions.vocab_for_half(non_embedding)
    assert V == 109_726, f"expected V = 109726 for GPT-2 small, got {V!r}"
    tokens = embedding_parameter_count(int(V), 768, context_length=1024)
    assert tokens == non_embedding, (
        f"expected the embeddings of V = {V} to hold {non_embedding} parameters, got {tokens}")
    with torch.device("meta"):
        bigger = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=int(V)))
    new_total = sum(p.numel() for p in bigger.parameters())
    new_embed = bigger.transformer.wte.weight.numel() + bigger.transformer.wpe.weight.numel()
    assert 2 * new_embed == new_total, (
        f"expected transformers' GPT-2 with V = {V} to be half embeddings: {new_embed} of {new_total}")


def exercise_3_cos_moments(solutions) -> None:
    fourth, var_cos2, d = solutions.cos_moments()
    gap = sp.simplify(fourth - 3 / (d * (d + 2)))
    assert gap == 0, f"expected E[cos^4] = 3 / (d (d + 2)), got {fourth} (difference {gap})"
    gap = sp.simplify(var_cos2 - 2 * (d - 1) / (d**2 * (d + 2)))
    assert gap == 0, f"expected Var(cos^2) = 2 (d - 1) / (d^2 (d + 2)), got {var_cos2} (difference {gap})"
    c = sp.Symbol("c", real=True)
    # d = 3: the cosine is uniform on [-1, 1]
    at_3, uniform = fourth.subs(d, 3), sp.integrate(c**4 / 2, (c, -1, 1))
    assert at_3 == uniform == sp.Rational(1, 5), (
        f"expected E[cos^4] at d = 3 to be 1/5 (cos uniform on [-1, 1]), got {at_3}")
    # d = 2: cos of a uniform angle, E[cos^4] = 3/8
    theta = sp.Symbol("theta", real=True)
    at_2, circle = fourth.subs(d, 2), sp.integrate(sp.cos(theta) ** 4, (theta, 0, 2 * sp.pi)) / (2 * sp.pi)
    assert at_2 == circle, f"expected E[cos^4] at d = 2 to be {circle} (a uniform angle), got {at_2}"
    # d = 64: independent random pairs
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40_000, 64, generator=g, dtype=torch.float64)
    y = torch.randn(40_000, 64, generator=g, dtype=torch.float64)
    cos4 = F.cosine_similarity(x, y) ** 4
    sem = cos4.std().item() / math.sqrt(cos4.numel())
    sampled, formula = cos4.mean().item(), float(fourth.subs(d, 64))
    assert abs(sampled - formula) < 4 * sem, (
        f"expected E[cos^4] at d = 64 within 4 standard errors ({4 * sem:.2g}) of the mean over "
        f"40,000 random pairs, {sampled:.6g}; got {formula:.6g}")


def exercise_4_squared_error_gradient_is_derived(solutions) -> None:
    for N, V in [(2, 3), (3, 2)]:
        gradient = solutions.squared_error_gradient(N, V)
        assert gradient.shape == (N, V), f"expected an {N} x {V} matrix, got shape {gradient.shape}"
        z = sp.Matrix(N, V, lambda t, v: sp.Symbol(f"z_{t}{v}"))
        y = sp.Matrix(N, V, lambda t, v, V=V: 1 if v == t % V else 0)
        residual = sp.simplify(gradient - (z - y) / N)
        assert residual == sp.zeros(N, V), (
            f"expected dL/dz = (z - y)/N for N = {N}, V = {V}; the difference is {residual}")


def exercise_4_tied_grad_by_hand_matches_autograd(solutions) -> None:
    g = torch.Generator().manual_seed(2)
    V, d, N = 11, 6, 9  # V != d != N
    E = (0.5 * torch.randn(V, d, generator=g, dtype=torch.float64)).requires_grad_(True)
    A = torch.randn(d, d, generator=g, dtype=torch.float64)
    ids = torch.randint(0, V, (N,), generator=g)
    targets = torch.randint(0, V, (N,), generator=g)
    z = torch.tanh(E[ids] @ A) @ E.T
    y = F.one_hot(targets, V).to(torch.float64)
    (0.5 * ((z - y) ** 2).sum() / N).backward()
    ours = solutions.tied_grad_by_hand(E.detach(), A, ids, targets)
    error = (ours - E.grad).abs().max().item()
    assert torch.allclose(ours, E.grad, rtol=0, atol=1e-14), (
        f"expected tied_grad_by_hand to equal autograd's gradient to 1e-14, largest difference {error:.3g}")
    largest = E.grad.abs().max().item()
    assert largest > 1e-2, f"the reference gradient is too small to test: {largest:.3g}"  # a real, nonzero one
    # the same loss through PyTorch's mse_loss (mean over N V entries, so scale by V / 2)
    E2 = E.detach().clone().requires_grad_(True)
    z2 = torch.tanh(E2[ids] @ A) @ E2.T
    (F.mse_loss(z2, y) * V / 2).backward()
    error = (ours - E2.grad).abs().max().item()
    assert torch.allclose(ours, E2.grad, rtol=0, atol=1e-14), (
        f"expected the gradient of F.mse_loss * V / 2 to 1e-14, largest difference {error:.3g}")
    # untied into two copies: their gradients add up to ours, and neither alone is it
    E_in = E.detach().clone().requires_grad_(True)
    E_out = E.detach().clone().requires_grad_(True)
    (0.5 * (((torch.tanh(E_in[ids] @ A) @ E_out.T) - y) ** 2).sum() / N).backward()
    error = (ours - (E_in.grad + E_out.grad)).abs().max().item()
    assert torch.allclose(ours, E_in.grad + E_out.grad, rtol=0, atol=1e-14), (
        f"expected the sum of the input and output copies' gradients to 1e-14, largest difference {error:.3g}")
    off_in, off_out = (ours - E_in.grad).abs().max().item(), (ours - E_out.grad).abs().max().item()
    assert off_in > 1e-3 and off_out > 1e-3, (
        f"expected the tied gradient to differ from each copy's alone, got differences {off_in:.3g}, {off_out:.3g}")


def exercise_5_remove_top_directions(solutions) -> None:
    g = torch.Generator().manual_seed(5)
    E = torch.randn(60, 9, generator=g, dtype=torch.float64) + 3.0  # (V, d): a shared offset
    centred = E - E.mean(0)
    # the principal directions from the covariance's eigenvectors: another route than the SVD
    evals, evecs = torch.linalg.eigh(centred.T @ centred)  # ascending
    for k in (0, 1, 3):
        R = solutions.remove_top_directions(E, k)
        assert R.shape == E.shape, f"expected shape {tuple(E.shape)} for k = {k}, got {tuple(R.shape)}"
        top = evecs[:, evals.argsort(descending=True)[:k]]  # (d, k)
        left = (R @ top).abs().max().item() if k else 0.0
        assert torch.allclose(R @ top, torch.zeros(60, k, dtype=torch.float64), atol=1e-9), (
            f"expected nothing left along the top {k} principal directions (to 1e-9), got up to {left:.3g}")
        # the squared length removed is the sum of the k largest eigenvalues
        removed = (centred.pow(2).sum() - R.pow(2).sum()).item()
        want = evals.sort(descending=True).values[:k].sum().item()
        assert abs(removed - want) <= max(1e-10 * abs(want), 1e-9), (
            f"expected k = {k} to remove the sum of the {k} largest eigenvalues, {want!r} "
            f"(to 1e-10 relative), got {removed!r}")
    mean = solutions.remove_top_directions(E, 0).mean(0)
    assert torch.allclose(mean, torch.zeros(9, dtype=torch.float64), atol=1e-12), (
        f"expected k = 0 to centre the table (column means 0 to 1e-12), got means {mean.tolist()}")
    with raises(ValueError, match="k must be an int", what="remove_top_directions(E, 10) with d = 9"):
        solutions.remove_top_directions(E, 10)
    with raises(ValueError, match="floating", what="remove_top_directions on an integer table"):
        solutions.remove_top_directions(E.long(), 1)
