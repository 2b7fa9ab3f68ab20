"""The exercise solutions of notebooks/23b_mamba2_ssd hold."""

import pytest
import torch
from seeded import gen
from solution_loader import load_solutions

from llmbook.inference.kvcache import kv_cache_bytes
from llmbook.scale.mamba2 import Mamba2Config, Mamba2Mixer, state_bytes
from llmbook.scale.ssd import ssd_chunked, ssd_quadratic
from llmbook.transformer.model import TransformerConfig

solutions = load_solutions("23b_mamba2_ssd")

pytestmark = pytest.mark.usefixtures("one_thread")
D = torch.float64


def inputs(T=19, seed=0):
    g = gen(seed)
    return (torch.randn(2, T, 4, 3, generator=g, dtype=D), -torch.rand(2, T, 4, generator=g, dtype=D),
            torch.randn(2, T, 4, 5, generator=g, dtype=D), torch.randn(2, T, 4, 5, generator=g, dtype=D))


def test_exercise_1_no_decay_is_linear_attention():
    x, _, B, C = inputs()
    y = solutions.unnormalised_linear_attention(x, B, C)
    torch.testing.assert_close(y, ssd_quadratic(x, torch.zeros(2, 19, 4, dtype=D), B, C), rtol=1e-12, atol=1e-12)
    # position 1 by hand: y_1 = (C_1 . B_0) x_0 + (C_1 . B_1) x_1
    want = (C[:, 1] * B[:, 0]).sum(-1, keepdim=True) * x[:, 0] + (C[:, 1] * B[:, 1]).sum(-1, keepdim=True) * x[:, 1]
    torch.testing.assert_close(y[:, 1], want, rtol=1e-12, atol=1e-12)
    # with decay the two differ
    x, la, B, C = inputs()
    assert (ssd_quadratic(x, la, B, C) - y).abs().max() > 1e-3


@pytest.mark.parametrize("piece", [1, 4, 5, 8, 19, 30])
def test_exercise_2_streaming_prefill(piece):
    x, la, B, C = inputs()
    y, s = ssd_chunked(x, la, B, C, 4)
    y_s, s_s = solutions.streaming_ssd(x, la, B, C, piece, 4)
    torch.testing.assert_close(y_s, y, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s_s, s, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="piece"):
        solutions.streaming_ssd(x, la, B, C, 0, 4)


def test_exercise_3_breakeven_length():
    m2 = Mamba2Config(vocab_size=256, d_model=768, n_layers=24, d_state=128, head_dim=64)
    mha = TransformerConfig.llama_style(vocab_size=256, d_model=768, n_layers=24, n_heads=12)
    gqa = TransformerConfig.llama_style(vocab_size=256, d_model=768, n_layers=24, n_heads=12, n_kv_heads=4)
    small = Mamba2Config(vocab_size=10, d_model=16, n_layers=3, d_state=4, head_dim=8)
    assert solutions.mamba2_state_numbers(small, 2) * 8 == state_bytes(
        [Mamba2Mixer(small).double().init_state(2)] * 3)
    assert solutions.breakeven_length(m2, mha) == 132  # printed by the chapter
    for tf in (mha, gqa):
        T = solutions.breakeven_length(m2, tf)
        state = 4 * solutions.mamba2_state_numbers(m2)
        assert kv_cache_bytes(tf, 1, T) > state >= kv_cache_bytes(tf, 1, T - 1)
    assert solutions.breakeven_length(m2, gqa) == 19_390_464 // 49_152 + 1 == 395  # a third of the cache
