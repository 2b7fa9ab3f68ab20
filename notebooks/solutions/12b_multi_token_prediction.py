"""Reference solutions to the exercises of notebooks/12b_multi_token_prediction."""

from __future__ import annotations

import numpy as np

from llmbook.text.data import MarkovSource, context_ids
from llmbook.transformer.model import TransformerConfig
from llmbook.transformer.sizing import flops_shares


def extra_flops_fraction(config: TransformerConfig, n_future: int, seq_len: int) -> float:
    """Forward FLOPs of ParallelMTP(config, n) over those of its next-token model, minus 1.

    The n - 1 extra heads are each one more block and one more unembedding per token:
    (L + n - 1) blocks + n heads versus L blocks + 1 head.
    """
    if n_future < 1:
        raise ValueError(f"n_future must be >= 1, got {n_future}")
    s = flops_shares(config, seq_len)
    block = (s["total"] - s["lm_head"]) / config.n_layers
    return (n_future - 1) * (block + s["lm_head"]) / s["total"]


def expected_tokens_per_pass(acceptance: list[float]) -> float:
    """1 + a_1 + a_1 a_2 + ...: tokens per pass when slot i is kept with probability a_i
    given that the slots before it were."""
    total, run = 1.0, 1.0
    for a in acceptance:
        if not 0 <= a <= 1:
            raise ValueError(f"acceptance rates must lie in [0, 1], got {a}")
        run *= a
        total += run
    return total


def empirical_head_floor(source: MarkovSource, k: int, num_tokens: int = 200_000, seed: int = 0) -> float:
    """Plug-in estimate of H(X_{t+k} | context at t) from a sample of the source (nats)."""
    tokens = source.sample(num_tokens, seed=seed).numpy()
    ctx = context_ids(tokens, source.order, source.vocab_size)[: len(tokens) - source.order - k + 1]
    nxt = tokens[source.order + k - 1 :][: len(ctx)]
    counts = np.zeros((source.num_contexts, source.vocab_size))
    np.add.at(counts, (ctx, nxt), 1)
    rows = counts.sum(1, keepdims=True)
    p = np.divide(counts, rows, out=np.zeros_like(counts), where=rows > 0)
    logp = np.log(p, out=np.zeros_like(p), where=p > 0)
    return float(-(counts * logp).sum() / counts.sum())
