"""Checks of chapter 17's exercises (notebooks/17_sft_reward_models), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are the book's per-token ``sft_loss`` and autograd through it, SymPy, the
Bradley-Terry labeller of :mod:`llmbook.alignment.preferences` and the packer of
:mod:`llmbook.alignment.sft`.
"""

from __future__ import annotations

import math

import sympy as sp
import torch

from llmbook.alignment.preferences import label_preferences
from llmbook.alignment.sft import pack_examples, sft_loss

f64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def exercise_1_per_sequence_normalisation(solutions) -> None:
    g = _gen(0)
    logits = torch.randn(2, 6, 5, generator=g, dtype=f64, requires_grad=True)
    targets = torch.randint(0, 5, (2, 6), generator=g)
    equal = torch.tensor([[0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0]]).bool()
    got, want = solutions.per_sequence_sft_loss(logits, targets, equal), sft_loss(logits, targets, equal)
    assert torch.allclose(got, want, atol=1e-15), (
        f"with 3 answer tokens in each sequence, expected the per-token loss {float(want)!r} "
        f"(to 1e-15), got {float(got)!r}")
    unequal = torch.tensor([[0, 1, 0, 0, 0, 0], [0, 1, 1, 1, 1, 1]]).bool()  # 1 and 5 tokens
    a = solutions.per_sequence_sft_loss(logits, targets, unequal)
    b = sft_loss(logits, targets, unequal)
    gap = abs(float((a - b).detach()))
    assert gap > 1e-3, (
        f"with 1 and 5 answer tokens, expected the per-sequence loss to differ from the per-token "
        f"one {float(b)!r} by more than 1e-3, got {float(a)!r}")
    # the weights: d loss / d nll of a token is 1/(B n_b) per sequence and 1/N per token
    (g_seq,) = torch.autograd.grad(a, logits)
    (g_tok,) = torch.autograd.grad(b, logits)
    p = torch.softmax(logits.detach(), -1)
    d_nll = (p - torch.nn.functional.one_hot(targets, 5))  # gradient of one token's nll
    assert torch.allclose(g_seq[0, 1], d_nll[0, 1] / (2 * 1), atol=1e-15), (
        "expected the lone answer token of sequence 0 to get weight 1 / (B n_0) = 1/2 in the gradient")
    assert torch.allclose(g_seq[1, 3], d_nll[1, 3] / (2 * 5), atol=1e-15), (
        "expected each of sequence 1's 5 answer tokens to get weight 1 / (B n_1) = 1/10 in the gradient")
    assert torch.allclose(g_tok[0, 1], d_nll[0, 1] / 6, atol=1e-15), (
        "the book's per-token loss no longer gives each of the 6 tokens weight 1/6")
    per_token, per_sequence, diff = solutions.token_weights_symbolic()
    n1, n2 = sp.symbols("n_1 n_2", positive=True, integer=True)
    at_equal = diff.subs(n1, n2)
    assert at_equal == 0, f"expected no difference in weight when n_1 = n_2, got {at_equal}"
    residual = sp.simplify(diff - (n2 - n1) / (2 * n1 * (n1 + n2)))
    assert residual == 0, f"expected diff = (n_2 - n_1) / (2 n_1 (n_1 + n_2)), off by {residual}"
    seq = per_sequence.subs({n1: 1, n2: 5})
    assert seq == sp.Rational(1, 2), f"expected a per-sequence weight 1/2 at n_1 = 1, n_2 = 5, got {seq}"
    tok = per_token.subs({n1: 1, n2: 5})
    assert tok == sp.Rational(1, 6), f"expected a per-token weight 1/6 at n_1 = 1, n_2 = 5, got {tok}"


def exercise_2_ceiling_against_scale(solutions) -> None:
    deltas = torch.tensor([0.0, 0.0, 1.0, 2.0, 1.0], dtype=f64)
    scales = torch.tensor([1e-9, 1.0, 1e9], dtype=f64)
    c = solutions.bayes_ceiling_vs_scale(deltas, scales)
    assert abs(float(c[0]) - 0.5) <= 1e-9, (  # a coin-flipping labeller
        f"expected a ceiling of 1/2 at scale 1e-9 (a coin flip), got {float(c[0])!r}")
    want = (1 + 2 / (1 + math.exp(-1)) + 1 / (1 + math.exp(-2))) / 5
    assert abs(float(c[1]) - want) <= 1e-15, (
        f"expected the mean of max(sigma(d), 1 - sigma(d)) at scale 1, {want!r}, got {float(c[1])!r}")
    want = (2 * 0.5 + 3 * 1.0) / 5
    assert abs(float(c[2]) - want) <= 1e-12, (  # ties stay at 1/2
        f"expected {want} at scale 1e9 (ties stay at 1/2, the rest at 1), got {float(c[2])!r}")
    assert bool((c[1:] > c[:-1]).all()), f"expected the ceiling to rise with the scale, got {c.tolist()}"
    s = solutions.scale_for_pair_accuracy(sp.Rational(9, 10))
    residual = sp.simplify(s - sp.log(9))
    assert residual == 0, f"expected the scale log 9 for 90% pair accuracy, got {s}"
    accuracy = float(1 / (1 + sp.exp(-s)))
    assert abs(accuracy - 0.9) <= 1e-15, f"expected sigma(s) = 0.9 at the returned scale, got {accuracy!r}"


def exercise_3_maximum_likelihood_recovers_the_scale(solutions) -> None:
    for scale in (1.0, 2.5):
        g = _gen(int(scale * 10))
        ra = torch.randint(0, 4, (20_000,), generator=g).to(f64)
        rb = torch.randint(0, 4, (20_000,), generator=g).to(f64)
        wins = label_preferences(ra, rb, scale, g)
        a = solutions.fit_bt_scale(ra - rb, wins)
        assert abs(a - scale) < 0.08 * scale, (
            f"expected the fitted scale within 8% of the true {scale} (20,000 labels), got {a!r}")
        # the estimate is a stationary point of the log-likelihood
        d = (ra - rb)
        score = abs(float((d * (wins.double() - torch.sigmoid(a * d))).sum()))
        assert score < 1e-6, (
            f"scale {scale}: expected the log-likelihood's derivative to vanish at the fitted "
            f"{a!r} (below 1e-6), got {score:.3g}")


def exercise_4_padding_fraction(solutions) -> None:
    ex = [([1], [1] * (n - 1)) for n in (3, 5, 2, 4, 2)]
    in_order = pack_examples(ex, 6, strategy="in_order")
    bfd = pack_examples(ex, 6, strategy="best_fit_decreasing")
    got, want = solutions.padding_fraction(in_order), 1 - 16 / 24
    assert math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-12), (
        f"expected 16 tokens in 4 rows of 6 in order to leave {want!r} padding, got {got!r}")
    got, want = solutions.padding_fraction(bfd), 1 - 16 / 18
    assert math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-12), (
        f"expected 16 tokens in 3 rows of 6 by best fit decreasing to leave {want!r} padding, got {got!r}")
    g = _gen(1)
    for _ in range(5):
        lengths = torch.randint(2, 40, (60,), generator=g).tolist()
        ex = [([1], [1] * (n - 1)) for n in lengths]
        bfd_pad = solutions.padding_fraction(pack_examples(ex, 64, strategy="best_fit_decreasing"))
        in_order_pad = solutions.padding_fraction(pack_examples(ex, 64, strategy="in_order"))
        assert bfd_pad <= in_order_pad, (
            f"expected best fit decreasing to pad no more than packing in order ({in_order_pad!r}) "
            f"for lengths {lengths}, got {bfd_pad!r}")
