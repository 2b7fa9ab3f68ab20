"""Checks of chapter 12b's exercises (notebooks/12b_multi_token_prediction), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are torch's ``FlopCounterMode`` on the book's ``ParallelMTP``, the closed form
``expected_tokens_per_step`` of speculative decoding and the exact per-head entropy
floors of the Markov source.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from llmbook.inference.sampling import expected_tokens_per_step
from llmbook.text.data import default_source
from llmbook.training.mtp import ParallelMTP, head_entropy_floors
from llmbook.transformer.model import TransformerConfig
from llmbook.workbench.checks import raises


def exercise_1_extra_flops_fraction_matches_the_flop_counter(solutions) -> None:
    cfg = TransformerConfig.gpt2_style(vocab_size=16, d_model=32, n_layers=2, n_heads=2, max_seq_len=16,
                                       fused_attention=False)
    ids = torch.zeros(2, 16, dtype=torch.long)
    for n in (1, 2, 4):
        counted = []
        for k in (1, n):
            model = ParallelMTP(cfg, k)
            with FlopCounterMode(display=False) as c, torch.no_grad():
                model(ids)
            counted.append(c.get_total_flops())
        measured = counted[1] / counted[0] - 1
        got = solutions.extra_flops_fraction(cfg, n, 16)
        assert abs(measured - got) < 1e-12, (
            f"n_future = {n}: expected the extra fraction torch's FLOP counter measures, "
            f"{measured!r} (to 1e-12), got {got!r}")


def exercise_2_expected_tokens_per_pass(solutions) -> None:
    none = solutions.expected_tokens_per_pass([])
    assert none == 1.0, f"expected 1.0 token per pass with no extra heads, got {none!r}"
    halves = solutions.expected_tokens_per_pass([0.5, 0.5])
    assert abs(halves - 1.75) < 1e-12, f"expected 1 + 0.5 + 0.25 = 1.75 for [0.5, 0.5], got {halves!r}"
    for a in (0.2, 0.7):
        got, want = solutions.expected_tokens_per_pass([a] * 3), expected_tokens_per_step(a, 3)
        assert abs(got - want) < 1e-12, (
            f"expected [{a}] * 3 to give speculative decoding's {want!r} (to 1e-12), got {got!r}")
    with raises(ValueError, what="expected_tokens_per_pass([1.5])"):
        solutions.expected_tokens_per_pass([1.5])


def exercise_3_empirical_head_floor(solutions) -> None:
    src = default_source()
    exact = head_entropy_floors(src, 3)
    for k in (1, 3):
        est = solutions.empirical_head_floor(src, k, 200_000)
        assert abs(est - exact[k - 1]) < 0.02, (
            f"head {k}: expected the estimate within 0.02 nats of the exact floor "
            f"{exact[k - 1]:.4f}, got {est:.4f}")
        assert est < exact[k - 1] + 1e-3, (  # the plug-in estimate is biased low
            f"head {k}: expected the plug-in estimate not above the exact floor {exact[k - 1]:.4f} "
            f"(+ 1e-3), got {est:.4f}")
