"""The count-based n-gram language model with add-k smoothing: the book's first baseline.

Introduced in notebooks/03_language_modelling. An n-gram model assumes that a token
depends only on the ``n - 1`` tokens before it, and estimates

.. math::  \\hat P(x \\mid c) = \\frac{N(c, x) + k}{N(c) + kV}

from the counts :math:`N(c, x)` of context ``c`` followed by token ``x`` in the training
data. With ``k = 0`` this is the maximum-likelihood estimate (the empirical frequency);
``k = 1`` is Laplace's rule of succession and ``0 < k < 1`` Lidstone's (Jurafsky &
Martin, *Speech and Language Processing*, 3rd ed. draft, ch. 3). It is also the
posterior-mean estimate under a symmetric ``Dirichlet(k)`` prior on each row, which is
why ``k`` equal to the concentration of :class:`llmbook.text.data.MarkovSource` is the Bayes
choice for that source.

Counting and scoring are vectorised (``numpy.bincount`` over context numbers from
:func:`llmbook.text.data.context_ids`): there is no Python loop over tokens.
"""

from __future__ import annotations

import numpy as np
import torch

from llmbook.text.data import as_token_array, context_ids

__all__ = ["NGramModel"]

_MAX_TABLE = 2**26  # entries of the (V**(n-1), V) count table: 512 MiB of float64 at most


class NGramModel:
    """An order-``n`` model: ``P(x_t | x_{t-n+1}, ..., x_{t-1})`` from smoothed counts.

    ``order = 1`` is the unigram model (no context), ``order = 2`` the bigram, and so on.
    The counts are a dense ``(V**(n-1), V)`` table, so ``V**n`` is limited to 2**26.
    """

    def __init__(self, order: int, vocab_size: int, add_k: float = 1.0) -> None:
        if not isinstance(order, int) or order < 1:
            raise ValueError(f"order must be an int >= 1, got {order!r}")
        if not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be an int >= 1, got {vocab_size!r}")
        if vocab_size**order > _MAX_TABLE:
            raise ValueError(f"a dense table of V**n = {vocab_size}**{order} = "
                             f"{vocab_size**order} counts is too large (at most 2**26)")
        if not add_k >= 0:
            raise ValueError(f"add_k must be >= 0, got {add_k!r}")
        self.order = order
        self.vocab_size = vocab_size
        self.add_k = float(add_k)
        self.num_contexts = vocab_size ** (order - 1)
        self.counts = np.zeros((self.num_contexts, vocab_size), dtype=np.int64)  # N(c, x)

    def fit(self, tokens: torch.Tensor | np.ndarray) -> NGramModel:
        """Count every (context, next token) pair of a 1-D token sequence; returns ``self``.

        Replaces any earlier counts. Positions ``t >= n - 1`` are counted.
        """
        self.counts[:] = 0
        return self.update(tokens)

    def update(self, tokens: torch.Tensor | np.ndarray) -> NGramModel:
        """Add the counts of another sequence to the ones already held; returns ``self``."""
        arr = as_token_array(tokens)
        k, v = self.order - 1, self.vocab_size
        ctx = context_ids(arr, k, v)  # (N - k,), also validates the token range
        pair = ctx * v + arr[k:]  # (N - k,) index into the flattened table
        self.counts += np.bincount(pair, minlength=self.counts.size).reshape(self.counts.shape)
        return self

    def probability_table(self) -> np.ndarray:
        """The ``(V**(n-1), V)`` float64 table ``(N(c, x) + k) / (N(c) + kV)``.

        A context never seen with ``add_k = 0`` has no estimate; its row is uniform.
        """
        num = self.counts + self.add_k  # (C, V)
        den = num.sum(axis=1, keepdims=True)  # (C, 1)
        uniform = np.full_like(num, 1.0 / self.vocab_size, dtype=np.float64)
        return np.divide(num, den, out=uniform, where=den > 0)

    def probs(self, context: torch.Tensor | np.ndarray | list[int]) -> torch.Tensor:
        """``P(. | context)`` as a ``(V,)`` float64 tensor; ``context`` has the last ``n - 1`` tokens."""
        arr = as_token_array(np.asarray(context, dtype=np.int64) if isinstance(context, list)
                            else context, name="context")
        if arr.size != self.order - 1:
            raise ValueError(f"an order-{self.order} model needs a context of {self.order - 1} "
                             f"tokens, got {arr.size}")
        c = context_ids(np.append(arr, 0), self.order - 1, self.vocab_size)[0]
        row = self.counts[c] + self.add_k
        total = row.sum()
        if total == 0:
            return torch.full((self.vocab_size,), 1.0 / self.vocab_size, dtype=torch.float64)
        return torch.from_numpy(row / total)

    def log_prob(self, tokens: torch.Tensor | np.ndarray) -> torch.Tensor:
        """``log P(x_t | context)`` for every ``t >= n - 1``: a ``(N - n + 1,)`` float64 tensor.

        With ``add_k = 0`` a pair never seen in training gets ``-inf``.
        """
        arr = as_token_array(tokens)
        k, v = self.order - 1, self.vocab_size
        ctx = context_ids(arr, k, v)  # (N - k,)
        table = self.probability_table()
        with np.errstate(divide="ignore"):
            return torch.from_numpy(np.log(table[ctx, arr[k:]]))

    def cross_entropy(self, tokens: torch.Tensor | np.ndarray) -> float:
        """Mean negative log-likelihood of a held-out sequence, in nats per token."""
        lp = self.log_prob(tokens)
        if lp.numel() == 0:
            raise ValueError(f"an order-{self.order} model needs at least {self.order} tokens "
                             "to score one")
        return float(-lp.mean())

    def __repr__(self) -> str:
        return (f"NGramModel(order={self.order}, vocab_size={self.vocab_size}, "
                f"add_k={self.add_k}, tokens_counted={int(self.counts.sum())})")
