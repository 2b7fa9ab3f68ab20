"""The exercise solutions of notebooks/17_sft_reward_models hold."""

import math

import pytest
import sympy as sp
import torch
from seeded import gen
from solution_loader import load_solutions

from llmbook.alignment.preferences import label_preferences
from llmbook.alignment.sft import pack_examples, sft_loss

solutions = load_solutions("17_sft_reward_models")

f64 = torch.float64

pytestmark = pytest.mark.usefixtures("one_thread")


def test_exercise_1_per_sequence_normalisation():
    g = gen(0)
    logits = torch.randn(2, 6, 5, generator=g, dtype=f64, requires_grad=True)
    targets = torch.randint(0, 5, (2, 6), generator=g)
    equal = torch.tensor([[0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0]]).bool()
    assert torch.allclose(solutions.per_sequence_sft_loss(logits, targets, equal),
                          sft_loss(logits, targets, equal), atol=1e-15)
    unequal = torch.tensor([[0, 1, 0, 0, 0, 0], [0, 1, 1, 1, 1, 1]]).bool()  # 1 and 5 tokens
    a = solutions.per_sequence_sft_loss(logits, targets, unequal)
    b = sft_loss(logits, targets, unequal)
    assert abs(float((a - b).detach())) > 1e-3
    # the weights: d loss / d nll of a token is 1/(B n_b) per sequence and 1/N per token
    (g_seq,) = torch.autograd.grad(a, logits)
    (g_tok,) = torch.autograd.grad(b, logits)
    p = torch.softmax(logits.detach(), -1)
    d_nll = (p - torch.nn.functional.one_hot(targets, 5))  # gradient of one token's nll
    assert torch.allclose(g_seq[0, 1], d_nll[0, 1] / (2 * 1), atol=1e-15)
    assert torch.allclose(g_seq[1, 3], d_nll[1, 3] / (2 * 5), atol=1e-15)
    assert torch.allclose(g_tok[0, 1], d_nll[0, 1] / 6, atol=1e-15)
    per_token, per_sequence, diff = solutions.token_weights_symbolic()
    n1, n2 = sp.symbols("n_1 n_2", positive=True, integer=True)
    assert diff.subs(n1, n2) == 0
    assert sp.simplify(diff - (n2 - n1) / (2 * n1 * (n1 + n2))) == 0
    assert per_sequence.subs({n1: 1, n2: 5}) == sp.Rational(1, 2)
    assert per_token.subs({n1: 1, n2: 5}) == sp.Rational(1, 6)


def test_exercise_2_ceiling_against_scale():
    deltas = torch.tensor([0.0, 0.0, 1.0, 2.0, 1.0], dtype=f64)
    scales = torch.tensor([1e-9, 1.0, 1e9], dtype=f64)
    c = solutions.bayes_ceiling_vs_scale(deltas, scales)
    assert float(c[0]) == pytest.approx(0.5, abs=1e-9)  # a coin-flipping labeller
    assert float(c[1]) == pytest.approx((1 + 2 / (1 + math.exp(-1)) + 1 / (1 + math.exp(-2))) / 5, abs=1e-15)
    assert float(c[2]) == pytest.approx((2 * 0.5 + 3 * 1.0) / 5, abs=1e-12)  # ties stay at 1/2
    assert bool((c[1:] > c[:-1]).all())
    s = solutions.scale_for_pair_accuracy(sp.Rational(9, 10))
    assert sp.simplify(s - sp.log(9)) == 0
    assert float(1 / (1 + sp.exp(-s))) == pytest.approx(0.9, abs=1e-15)


@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_exercise_3_maximum_likelihood_recovers_the_scale(scale):
    g = gen(int(scale * 10))
    ra = torch.randint(0, 4, (20_000,), generator=g).to(f64)
    rb = torch.randint(0, 4, (20_000,), generator=g).to(f64)
    wins = label_preferences(ra, rb, scale, g)
    a = solutions.fit_bt_scale(ra - rb, wins)
    assert abs(a - scale) < 0.08 * scale
    # the estimate is a stationary point of the log-likelihood
    d = (ra - rb)
    assert abs(float((d * (wins.double() - torch.sigmoid(a * d))).sum())) < 1e-6


def test_exercise_4_padding_fraction():
    ex = [([1], [1] * (n - 1)) for n in (3, 5, 2, 4, 2)]
    in_order = pack_examples(ex, 6, strategy="in_order")
    bfd = pack_examples(ex, 6, strategy="best_fit_decreasing")
    assert solutions.padding_fraction(in_order) == pytest.approx(1 - 16 / 24)
    assert solutions.padding_fraction(bfd) == pytest.approx(1 - 16 / 18)
    g = gen(1)
    for _ in range(5):
        lengths = torch.randint(2, 40, (60,), generator=g).tolist()
        ex = [([1], [1] * (n - 1)) for n in lengths]
        assert solutions.padding_fraction(pack_examples(ex, 64, strategy="best_fit_decreasing")) <= \
            solutions.padding_fraction(pack_examples(ex, 64, strategy="in_order"))
