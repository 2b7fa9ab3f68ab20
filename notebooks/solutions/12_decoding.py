"""Reference solutions to the exercises of notebooks/12_decoding."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from llmbook.inference.constrained import compile_regex
from llmbook.inference.kvcache import kv_cache_bytes
from llmbook.inference.sampling import apply_temperature, speculative_speedup
from llmbook.transformer.model import TransformerConfig


def typical_filter(logits: Tensor, mass: float) -> Tensor:
    """Exercise 1: locally typical sampling (Meister et al., 2023): (..., V) -> (..., V).

    Tokens are ordered by how far their surprisal -log p(x) lies from the entropy H, and
    the shortest prefix of that order whose probability reaches ``mass`` is kept (a token
    is kept while the mass before it is below ``mass``, as in top-p). The most likely token
    can be dropped: its surprisal is the smallest, often far below H.
    """
    if not 0 < mass <= 1:
        raise ValueError(f"mass must lie in (0, 1], got {mass}")
    logp = torch.log_softmax(logits.double(), dim=-1)  # (..., V)
    p = logp.exp()
    entropy = torch.special.entr(p).sum(dim=-1, keepdim=True)  # (..., 1) nats; 0 log 0 = 0
    order = torch.sort((-logp - entropy).abs(), dim=-1, stable=True).indices
    sorted_p = p.gather(-1, order)
    keep_sorted = torch.cumsum(sorted_p, dim=-1) - sorted_p < mass
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return logits.masked_fill(~keep, float("-inf"))


def entropy_at(logits: Tensor, temperature: float) -> float:
    """H(softmax(z / T)) in nats."""
    logp = torch.log_softmax(apply_temperature(logits.double(), temperature), dim=-1)
    return float(-(logp.exp() * logp).sum())


def temperature_for_entropy(logits: Tensor, h: float, lo: float = 1e-4, hi: float = 1e4,
                            iters: int = 200) -> float:
    """Exercise 2: the T with H(softmax(z / T)) = h, by bisection on log T (H increases in T)."""
    if not entropy_at(logits, lo) <= h <= entropy_at(logits, hi):
        raise ValueError(f"h={h} is outside the entropies reachable in [{lo}, {hi}]")
    a, b = math.log(lo), math.log(hi)
    for _ in range(iters):
        mid = (a + b) / 2
        if entropy_at(logits, math.exp(mid)) < h:
            a = mid
        else:
            b = mid
    return math.exp((a + b) / 2)


def best_gamma(alpha: float, c: float, max_gamma: int = 20) -> int:
    """Exercise 3: the draft length 1..max_gamma with the largest expected speed-up.

    A cheaper draft (smaller c) makes each extra drafted token cost less, so longer drafts
    pay until alpha^gamma, the chance that the draft survives to its end, is too small."""
    return max(range(1, max_gamma + 1), key=lambda g: speculative_speedup(alpha, g, c))


def llama_cache_gib(n_kv_heads: int = 32, seq_len: int = 4096) -> float:
    """Exercise 4: the KV cache of Llama 2 7B (L = 32, d_head = 128) in bfloat16, B = 1, GiB."""
    config = TransformerConfig.llama_style(n_kv_heads=n_kv_heads)
    return kv_cache_bytes(config, 1, seq_len, torch.bfloat16) / 2**30


def count_matches(pattern: str, alphabet: str, length: int) -> int:
    """Exercise 5: how many strings of ``length`` characters from ``alphabet`` the pattern
    matches in full, by dynamic programming over its DFA (``compile_regex``).

    counts[s] is the number of strings read so far that end in state s; each character
    moves every count along one transition, dead ends (-1) dropped. The calendar pattern
    accepts 10^4 * 12 * 31 = 3,720,000 strings, 372 per year, where a year has 365 or 366
    dates: a regular expression cannot know that April has 30 days without listing them."""
    dfa = compile_regex(pattern)
    counts = {0: 1}
    for _ in range(length):
        nxt: dict[int, int] = {}
        for state, n in counts.items():
            for c in alphabet:
                t = dfa.step(state, c)
                if t >= 0:
                    nxt[t] = nxt.get(t, 0) + n
        counts = nxt
    return sum(n for state, n in counts.items() if dfa.accepting[state])


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))
