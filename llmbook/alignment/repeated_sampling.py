"""Test-time compute: majority voting, best-of-N, pass@k, and the formulas that predict them.

Introduced in notebooks/20_grpo. A model that answers a question right with probability p
can be made more accurate *at inference* by sampling several answers:

* **self-consistency** (Wang et al., 2023, "Self-Consistency Improves Chain of Thought
  Reasoning in Language Models"): sample n answers and return the most frequent one
  (:func:`plurality_vote`, :func:`vote_accuracy`). With only two possible answers this is a
  majority vote, right with probability
  P_n(p) = sum_{k > n/2} C(n, k) p^k (1 - p)^(n - k) (:func:`majority_probability`,
  :func:`majority_probability_symbolic`), which tends to 1 if p > 1/2 and to 0 if p < 1/2:
  by Hoeffding's inequality the wrong side wins with probability at most
  exp(-2 n (p - 1/2)^2) (:func:`hoeffding_majority_bound`);
* **best-of-N with a verifier**: sample N answers and keep one the verifier accepts; with
  an exact verifier that succeeds iff some answer is right, with probability
  pass@N = 1 - (1 - p)^N (:func:`pass_at_n`). With a continuous score instead, the kept
  score is the maximum of N draws, whose mean is found from the CDF F^N
  (:func:`expected_max_uniform_symbolic`: N / (N + 1) for uniform scores;
  :func:`expected_max_gaussian`: about sqrt(2 ln N) for Gaussian ones);
* **pass@k from n >= k samples** of which c are right: the unbiased estimator
  1 - C(n - c, k) / C(n, k) of Chen et al., 2021, "Evaluating Large Language Models
  Trained on Code" (:func:`pass_at_k`), whose expectation over c ~ Binomial(n, p) is
  exactly 1 - (1 - p)^k (:func:`expected_pass_at_k_symbolic`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence

import sympy as sp
import torch
from torch import Tensor

from llmbook.validation import check_probability

__all__ = [
    "expected_max_gaussian",
    "expected_max_uniform_symbolic",
    "expected_pass_at_k_symbolic",
    "hoeffding_majority_bound",
    "majority_probability",
    "majority_probability_symbolic",
    "pass_at_k",
    "pass_at_n",
    "plurality",
    "plurality_vote",
    "vote_accuracy",
]


def _count(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {name}={value}")
    return value


def _probability(p: object) -> float:
    return check_probability("p", p)


def _probability_tensor(p: Tensor) -> Tensor:
    """``p`` in float64 if it is a floating tensor with every entry in [0, 1] (no NaN)."""
    if not p.is_floating_point() or not bool(((p >= 0) & (p <= 1)).all()):
        raise ValueError(f"p must be a floating tensor with entries in [0, 1], got {p.dtype} "
                         f"{p.tolist() if p.numel() <= 8 else tuple(p.shape)}")
    return p.double()


# ---------------------------------------------------------------- self-consistency


def plurality(answers: Iterable[Hashable | None]) -> Hashable | None:
    """The most frequent of ``answers`` (any hashable values; None, "no answer", never wins).

    Ties go to the answer that reached the top count first in the given order, so the
    vote is deterministic. Returns None if no answer was given at all. This is the counting
    that :func:`plurality_vote` (integer answers) and
    :func:`llmbook.alignment.answers.majority_vote` (answers parsed from text) share.
    """
    counts: Counter[Hashable] = Counter()
    best, best_count = None, 0
    for a in answers:
        if a is None:
            continue
        counts[a] += 1
        if counts[a] > best_count:
            best, best_count = a, counts[a]
    return best


def plurality_vote(answers: Sequence[int | None]) -> int | None:
    """The most frequent answer among ``answers`` (None, "no answer", never wins).

    Ties go to the answer that reached the top count first in the given order, so the
    vote is deterministic (:func:`plurality`). Returns None if no answer was given at all.
    """
    if isinstance(answers, str | bytes) or not isinstance(answers, Sequence):
        raise TypeError(f"answers must be a sequence of ints or None, got {type(answers).__name__}")
    if len(answers) == 0:
        raise ValueError("answers is empty: a vote needs at least one sample")
    for a in answers:
        if a is not None and (isinstance(a, bool) or not isinstance(a, int)):
            raise TypeError(f"answers must be ints or None, found {a!r}")
    return plurality(answers)  # type: ignore[return-value]


def vote_accuracy(answers: Sequence[Sequence[int | None]], truths: Sequence[int], num_votes: int) -> float:
    """Accuracy of the plurality vote over ``num_votes`` samples, averaged over disjoint blocks.

    ``answers[i]`` holds the S sampled answers to problem i (None where a sample gave no
    answer) and ``truths[i]`` its right answer. Each problem's samples are cut into
    S // num_votes disjoint blocks of ``num_votes`` (leftovers unused); every block is a
    vote, and the result is the fraction of votes, over all blocks of all problems, that
    return the right answer. ``num_votes=1`` is the plain sampled accuracy.
    """
    num_votes = _count("num_votes", num_votes)
    if len(answers) != len(truths) or len(answers) == 0:
        raise ValueError(f"answers and truths need one list of answers per truth and at least one problem, "
                         f"got len(answers)={len(answers)} and len(truths)={len(truths)}")
    right = total = 0
    for samples, truth in zip(answers, truths, strict=True):
        if len(samples) < num_votes:
            raise ValueError(f"a problem has {len(samples)} samples, fewer than num_votes={num_votes}")
        for start in range(0, len(samples) - num_votes + 1, num_votes):
            right += plurality_vote(samples[start:start + num_votes]) == truth
            total += 1
    return right / total


def majority_probability_symbolic(n: int) -> sp.Expr:
    """P(more than half of n votes are right), for votes right independently with prob. p.

    The SymPy expression sum_{k > n/2} C(n, k) p^k (1 - p)^(n - k) in the symbol ``p``: the
    accuracy of a majority vote when there are only two answers (for even n a tie counts as
    a loss).
    """
    n = _count("n", n)
    p, k = sp.Symbol("p", positive=True), sp.Symbol("k", integer=True)
    return sp.Sum(sp.binomial(n, k) * p**k * (1 - p) ** (n - k), (k, n // 2 + 1, n))


def majority_probability(p: float | Tensor, n: int) -> float | Tensor:
    """The value of :func:`majority_probability_symbolic`: P(Binomial(n, p) > n / 2).

    ``p`` is a number in [0, 1] or a tensor of them (one per problem); computed in float64
    as an explicit sum, each term exp(log C(n, k) + k log p + (n - k) log(1 - p)) (with
    0 log 0 = 0), so that large n neither overflows nor loses the small terms.
    """
    n = _count("n", n)
    if isinstance(p, Tensor):
        q = _probability_tensor(p)
    else:
        q = torch.tensor(_probability(p), dtype=torch.float64)
    total = torch.zeros_like(q)
    for k in range(n // 2 + 1, n + 1):  # each term in log space: C(n, k) overflows for large n
        log_term = math.log(math.comb(n, k)) + torch.xlogy(torch.tensor(float(k)), q) \
            + torch.xlogy(torch.tensor(float(n - k)), 1 - q)
        total = total + torch.exp(log_term)
    return total if isinstance(p, Tensor) else float(total)


def hoeffding_majority_bound(p: float, n: int) -> float:
    """Hoeffding's bound exp(-2 n (p - 1/2)^2) on P(majority of n votes on the less likely side)."""
    p, n = _probability(p), _count("n", n)
    return math.exp(-2 * n * (p - 0.5) ** 2)


# ---------------------------------------------------------------- best-of-N and pass@k


def pass_at_n(p: float | Tensor, n: int) -> float | Tensor:
    """1 - (1 - p)^n: the probability that at least one of n independent samples is right."""
    n = _count("n", n)
    if isinstance(p, Tensor):
        return 1 - (1 - _probability_tensor(p)) ** n
    return 1 - (1 - _probability(p)) ** n


def pass_at_k(num_samples: int, num_correct: int | Tensor, k: int) -> float | Tensor:
    """The unbiased pass@k estimate from n samples of which c are right (Chen et al., 2021).

    pass@k = 1 - C(n - c, k) / C(n, k): one minus the probability that k samples drawn
    without replacement from the n are all wrong. Computed as
    1 - prod_{i = n - c + 1}^{n} (1 - k / i) (Chen et al.'s numerically stable form; the
    binomials themselves overflow float64 for n in the hundreds). ``num_correct`` is an int
    or a tensor of ints (one per problem); needs 1 <= k <= n and 0 <= c <= n.
    """
    n = _count("num_samples", num_samples)
    k = _count("k", k)
    if k > n:
        raise ValueError(f"k={k} exceeds num_samples={n}: pass@k needs at least k samples")
    if isinstance(num_correct, Tensor):
        if num_correct.is_floating_point() or num_correct.dtype == torch.bool:
            raise TypeError(f"num_correct must hold integers, got dtype {num_correct.dtype}")
        c = num_correct.long()
        if bool(((c < 0) | (c > n)).any()):
            raise ValueError(f"num_correct must lie in [0, {n}], got {c.tolist()}")
        i = torch.arange(1, n + 1, dtype=torch.float64)  # (n,)
        factors = torch.where(i[None, :] > (n - c)[:, None], 1 - k / i[None, :],
                              torch.ones(1, dtype=torch.float64))  # (M, n)
        return 1 - factors.prod(dim=1)
    c = _count("num_correct", num_correct, minimum=0)
    if c > n:
        raise ValueError(f"num_correct={c} exceeds num_samples={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1 - k / i for i in range(n - c + 1, n + 1))


def expected_pass_at_k_symbolic(n: int, k: int) -> sp.Expr:
    """E[pass@k estimate] over c ~ Binomial(n, p), as an explicit SymPy polynomial in ``p``.

    sum_c C(n, c) p^c (1 - p)^(n - c) (1 - C(n - c, k) / C(n, k)), which simplifies to
    1 - (1 - p)^k: the estimator is unbiased.
    """
    n, k = _count("n", n), _count("k", k)
    if k > n:
        raise ValueError(f"k={k} exceeds n={n}")
    p = sp.Symbol("p", positive=True)
    return sum(sp.binomial(n, c) * p**c * (1 - p) ** (n - c)
               * (1 - sp.binomial(n - c, k) / sp.binomial(n, k)) for c in range(n + 1))


def expected_max_uniform_symbolic() -> sp.Expr:
    """E[max of N i.i.d. Uniform(0, 1)] = int_0^1 x d(x^N) = N / (N + 1), derived by SymPy.

    The maximum is below x iff all N draws are, so its CDF is F(x)^N = x^N and its density
    N x^(N - 1); the result is in the positive symbol ``N``.
    """
    N, x = sp.Symbol("N", positive=True), sp.Symbol("x", positive=True)
    return sp.simplify(sp.integrate(x * sp.diff(x**N, x), (x, 0, 1)))


def expected_max_gaussian(n: int) -> float:
    """E[max of n i.i.d. standard normal draws], by numerical integration (mpmath).

    E[max] = int x d(Phi(x)^n) = int x n phi(x) Phi(x)^(n - 1) dx. It grows like
    sqrt(2 ln n), slowly: the ratio to sqrt(2 ln n) tends to 1 only logarithmically.
    """
    import mpmath

    n = _count("n", n)
    phi = lambda x: mpmath.exp(-x * x / 2) / mpmath.sqrt(2 * mpmath.pi)  # noqa: E731
    Phi = lambda x: mpmath.ncdf(x)  # noqa: E731
    value = mpmath.quad(lambda x: x * n * phi(x) * Phi(x) ** (n - 1), [-mpmath.inf, 0, 2, 4, mpmath.inf])
    return float(value)
