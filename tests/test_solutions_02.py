"""The exercise solutions of notebooks/02_embeddings hold."""

import math

import pytest
import sympy as sp
import torch
import torch.nn.functional as F
from solution_loader import load_solutions

from llmbook.text.embedding import embedding_parameter_count

solutions = load_solutions("02_embeddings")


def test_exercise_1_nearest_neighbours_on_clustered_table():
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(3, 16, generator=g, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])  # V=10, d=16
    E = 5 * centres[labels] + 0.1 * torch.randn(10, 16, generator=g, dtype=torch.float64)
    assert sorted(solutions.nearest_neighbours(E, 0, 3)) == [3, 6, 9]
    assert sorted(solutions.nearest_neighbours(E, 4, 2)) == [1, 7]
    assert 0 not in solutions.nearest_neighbours(E, 0, 9)
    # ties broken by the smaller index: identical rows 1, 2 and 3 for query 0
    T = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    assert solutions.nearest_neighbours(T, 0, 2) == [1, 2]
    with pytest.raises(ValueError, match="k must lie"):
        solutions.nearest_neighbours(T, 0, 5)


def test_exercise_2_vocab_for_half_against_transformers():
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    total = sum(p.numel() for p in gpt2.parameters())
    embed = gpt2.transformer.wte.weight.numel() + gpt2.transformer.wpe.weight.numel()
    non_embedding = total - embed
    assert non_embedding == 85_056_000
    V = solutions.vocab_for_half(non_embedding)
    assert V == 109_726
    assert embedding_parameter_count(int(V), 768, context_length=1024) == non_embedding
    with torch.device("meta"):
        bigger = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=int(V)))
    new_total = sum(p.numel() for p in bigger.parameters())
    new_embed = bigger.transformer.wte.weight.numel() + bigger.transformer.wpe.weight.numel()
    assert 2 * new_embed == new_total


def test_exercise_3_cos_moments():
    fourth, var_cos2, d = solutions.cos_moments()
    assert sp.simplify(fourth - 3 / (d * (d + 2))) == 0
    assert sp.simplify(var_cos2 - 2 * (d - 1) / (d**2 * (d + 2))) == 0
    c = sp.Symbol("c", real=True)
    # d = 3: the cosine is uniform on [-1, 1]
    assert fourth.subs(d, 3) == sp.integrate(c**4 / 2, (c, -1, 1)) == sp.Rational(1, 5)
    # d = 2: cos of a uniform angle, E[cos^4] = 3/8
    theta = sp.Symbol("theta", real=True)
    assert fourth.subs(d, 2) == sp.integrate(sp.cos(theta) ** 4, (theta, 0, 2 * sp.pi)) / (
        2 * sp.pi
    )
    # d = 64: independent random pairs
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40_000, 64, generator=g, dtype=torch.float64)
    y = torch.randn(40_000, 64, generator=g, dtype=torch.float64)
    cos4 = F.cosine_similarity(x, y) ** 4
    sem = cos4.std().item() / math.sqrt(cos4.numel())
    assert abs(cos4.mean().item() - float(fourth.subs(d, 64))) < 4 * sem


def test_exercise_4_squared_error_gradient_is_derived():
    for N, V in [(2, 3), (3, 2)]:
        assert solutions.squared_error_gradient(N, V) == sp.zeros(N, V)


def test_exercise_4_tied_grad_by_hand_matches_autograd():
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
    assert torch.allclose(ours, E.grad, rtol=0, atol=1e-14)
    assert E.grad.abs().max() > 1e-2  # a real, nonzero gradient
    # the same loss through PyTorch's mse_loss (mean over N V entries, so scale by V / 2)
    E2 = E.detach().clone().requires_grad_(True)
    z2 = torch.tanh(E2[ids] @ A) @ E2.T
    (F.mse_loss(z2, y) * V / 2).backward()
    assert torch.allclose(ours, E2.grad, rtol=0, atol=1e-14)
    # untied into two copies: their gradients add up to ours, and neither alone is it
    E_in = E.detach().clone().requires_grad_(True)
    E_out = E.detach().clone().requires_grad_(True)
    (0.5 * (((torch.tanh(E_in[ids] @ A) @ E_out.T) - y) ** 2).sum() / N).backward()
    assert torch.allclose(ours, E_in.grad + E_out.grad, rtol=0, atol=1e-14)
    assert (ours - E_in.grad).abs().max() > 1e-3 and (ours - E_out.grad).abs().max() > 1e-3


def test_exercise_5_remove_top_directions():
    g = torch.Generator().manual_seed(5)
    E = torch.randn(60, 9, generator=g, dtype=torch.float64) + 3.0  # (V, d): a shared offset
    centred = E - E.mean(0)
    # the principal directions from the covariance's eigenvectors: another route than the SVD
    evals, evecs = torch.linalg.eigh(centred.T @ centred)  # ascending
    for k in (0, 1, 3):
        R = solutions.remove_top_directions(E, k)
        assert R.shape == E.shape
        top = evecs[:, evals.argsort(descending=True)[:k]]  # (d, k)
        assert torch.allclose(R @ top, torch.zeros(60, k, dtype=torch.float64), atol=1e-9)
        # the squared length removed is the sum of the k largest eigenvalues
        removed = centred.pow(2).sum() - R.pow(2).sum()
        assert removed.item() == pytest.approx(evals.sort(descending=True).values[:k].sum().item(), rel=1e-10,
                                               abs=1e-9)
    assert torch.allclose(solutions.remove_top_directions(E, 0).mean(0), torch.zeros(9, dtype=torch.float64),
                          atol=1e-12)
    with pytest.raises(ValueError, match="k must be an int"):
        solutions.remove_top_directions(E, 10)
    with pytest.raises(ValueError, match="floating"):
        solutions.remove_top_directions(E.long(), 1)
