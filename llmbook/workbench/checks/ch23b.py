"""Checks of chapter 23b's exercises (notebooks/23b_mamba2_ssd), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are the book's state-space duality (:func:`llmbook.scale.ssd.ssd_quadratic` with
zero decay, :func:`~llmbook.scale.ssd.ssd_chunked` in one call), a position computed by
hand, the bytes of a real Mamba-2 state (:func:`llmbook.scale.mamba2.state_bytes`) and
the book's KV-cache size (:func:`llmbook.inference.kvcache.kv_cache_bytes`).
"""

from __future__ import annotations

import torch

from llmbook.inference.kvcache import kv_cache_bytes
from llmbook.scale.mamba2 import Mamba2Config, Mamba2Mixer, state_bytes
from llmbook.scale.ssd import ssd_chunked, ssd_quadratic
from llmbook.transformer.model import TransformerConfig
from llmbook.workbench.checks import raises

D = torch.float64


def _inputs(T: int = 19, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """x (2, T, 4, 3), log decays (2, T, 4) <= 0, B and C (2, T, 4, 5): the same on every run."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, T, 4, 3, generator=g, dtype=D), -torch.rand(2, T, 4, generator=g, dtype=D),
            torch.randn(2, T, 4, 5, generator=g, dtype=D), torch.randn(2, T, 4, 5, generator=g, dtype=D))


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """``torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)`` (shapes and dtypes too),
    with ``what`` and torch's report on one line in the message."""
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12,
                               msg=lambda m: f"expected {what} (to 1e-12): "
                               + "; ".join(line.strip() for line in m.splitlines() if line.strip()))


def exercise_1_no_decay_is_linear_attention(solutions) -> None:
    x, _, B, C = _inputs()
    y = solutions.unnormalised_linear_attention(x, B, C)
    _close(y, ssd_quadratic(x, torch.zeros(2, 19, 4, dtype=D), B, C),
           "the book's SSD with zero log decay")
    # position 1 by hand: y_1 = (C_1 . B_0) x_0 + (C_1 . B_1) x_1
    want = (C[:, 1] * B[:, 0]).sum(-1, keepdim=True) * x[:, 0] + (C[:, 1] * B[:, 1]).sum(-1, keepdim=True) * x[:, 1]
    _close(y[:, 1], want, "y_1 = (C_1 . B_0) x_0 + (C_1 . B_1) x_1 at position 1")
    # with decay the two differ
    x, la, B, C = _inputs()
    gap = float((ssd_quadratic(x, la, B, C) - y).abs().max())
    assert gap > 1e-3, f"expected SSD with decay to differ from the answer by more than 1e-3, got {gap:.3g}"


def exercise_2_streaming_prefill(solutions) -> None:
    x, la, B, C = _inputs()
    y, s = ssd_chunked(x, la, B, C, 4)
    for piece in (1, 4, 5, 8, 19, 30):
        y_s, s_s = solutions.streaming_ssd(x, la, B, C, piece, 4)
        _close(y_s, y, f"the outputs of ssd_chunked in one call, with pieces of {piece}")
        _close(s_s, s, f"the final state of ssd_chunked in one call, with pieces of {piece}")
        with raises(ValueError, match="piece", what="streaming_ssd with piece = 0"):
            solutions.streaming_ssd(x, la, B, C, 0, 4)


def exercise_3_breakeven_length(solutions) -> None:
    m2 = Mamba2Config(vocab_size=256, d_model=768, n_layers=24, d_state=128, head_dim=64)
    mha = TransformerConfig.llama_style(vocab_size=256, d_model=768, n_layers=24, n_heads=12)
    gqa = TransformerConfig.llama_style(vocab_size=256, d_model=768, n_layers=24, n_heads=12, n_kv_heads=4)
    small = Mamba2Config(vocab_size=10, d_model=16, n_layers=3, d_state=4, head_dim=8)
    numbers = solutions.mamba2_state_numbers(small, 2)
    measured = state_bytes([Mamba2Mixer(small).double().init_state(2)] * 3)
    assert numbers * 8 == measured, (
        f"expected 8 bytes x the state's numbers to be the {measured} bytes of a real float64 state "
        f"(3 layers, batch 2), got {numbers!r} numbers")
    T = solutions.breakeven_length(m2, mha)
    assert T == 132, f"expected a break-even length of 132 against multi-head attention (the chapter's), got {T!r}"
    for name, tf in (("multi-head", mha), ("grouped-query", gqa)):
        T = solutions.breakeven_length(m2, tf)
        state = 4 * solutions.mamba2_state_numbers(m2)
        longer, shorter = kv_cache_bytes(tf, 1, T), kv_cache_bytes(tf, 1, T - 1)
        assert longer > state >= shorter, (
            f"expected T = {T!r} to be the first length whose KV cache ({name} attention) exceeds the "
            f"{state} bytes of the float32 state: cache {longer} bytes at T, {shorter} at T - 1")
    T = solutions.breakeven_length(m2, gqa)
    assert T == 19_390_464 // 49_152 + 1 == 395, (  # a third of the cache
        f"expected a break-even length of 395 against grouped-query attention, got {T!r}")
