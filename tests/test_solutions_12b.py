"""The exercise solutions of notebooks/12b_multi_token_prediction hold."""

import pytest
import torch
from solution_loader import load_solutions
from torch.utils.flop_counter import FlopCounterMode

from llmbook.inference.sampling import expected_tokens_per_step
from llmbook.text.data import default_source
from llmbook.training.mtp import ParallelMTP, head_entropy_floors
from llmbook.transformer.model import TransformerConfig

solutions = load_solutions("12b_multi_token_prediction")


@pytest.mark.parametrize("n", [1, 2, 4])
def test_extra_flops_fraction_matches_the_flop_counter(n):
    cfg = TransformerConfig.gpt2_style(vocab_size=16, d_model=32, n_layers=2, n_heads=2, max_seq_len=16,
                                       fused_attention=False)
    ids = torch.zeros(2, 16, dtype=torch.long)
    counted = []
    for k in (1, n):
        model = ParallelMTP(cfg, k)
        with FlopCounterMode(display=False) as c, torch.no_grad():
            model(ids)
        counted.append(c.get_total_flops())
    assert abs(counted[1] / counted[0] - 1 - solutions.extra_flops_fraction(cfg, n, 16)) < 1e-12


def test_expected_tokens_per_pass():
    assert solutions.expected_tokens_per_pass([]) == 1.0
    assert abs(solutions.expected_tokens_per_pass([0.5, 0.5]) - 1.75) < 1e-12
    for a in (0.2, 0.7):
        assert abs(solutions.expected_tokens_per_pass([a] * 3) - expected_tokens_per_step(a, 3)) < 1e-12
    with pytest.raises(ValueError):
        solutions.expected_tokens_per_pass([1.5])


def test_empirical_head_floor():
    src = default_source()
    exact = head_entropy_floors(src, 3)
    for k in (1, 3):
        est = solutions.empirical_head_floor(src, k, 200_000)
        assert abs(est - exact[k - 1]) < 0.02
        assert est < exact[k - 1] + 1e-3  # the plug-in estimate is biased low
