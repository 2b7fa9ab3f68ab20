"""Checks of chapter 24b's exercises (notebooks/24b_real_model_interpretability), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are a recovered-fraction table built by hand, the ends that activation patching
must reach on a small random model of the book's (the differing embedding and the final
stream recover everything, the positions before the difference nothing), the explicit
sum of the uniform sink score (exact rationals in SymPy) and the book's
:func:`llmbook.scale.interpretability.attention_sink_score` on a uniform causal pattern,
and the logit gap that the units' contributions must rebuild.
"""

from __future__ import annotations

import torch

from llmbook.scale.interpretability import attention_sink_score
from llmbook.transformer.model import TransformerConfig, TransformerLM
from llmbook.workbench.checks import raises
from llmbook.workbench.checks.ch24 import uniform_baseline


def _tiny() -> TransformerLM:
    """A small random float64 Llama-style model (3 layers, 4 heads, 2 KV heads, d_ff 24), in eval
    mode; a fresh copy for each check, so that no answer sees another's changes to it."""
    cfg = TransformerConfig.llama_style(vocab_size=29, d_model=16, n_layers=3, n_heads=4, n_kv_heads=2,
                                        d_ff=24, max_seq_len=16)
    return TransformerLM(cfg, generator=torch.Generator().manual_seed(0)).double().eval()


def exercise_1_move_site(solutions) -> None:
    recovered = torch.zeros(5, 3, dtype=torch.float64)
    recovered[:3, 1], recovered[3:, -1] = 1.0, 1.0
    site = solutions.move_site(recovered)
    assert site == 3, (
        f"expected layer 3, the first at which the last position recovers half, on a table whose "
        f"last column is 1 from layer 3 on, got {site!r}")
    at_one = solutions.move_site(recovered, position=1)
    assert at_one == 0, f"expected layer 0 at position 1 (recovered from the start), got {at_one!r}"
    with raises(ValueError, match="never recovers", what="move_site at a position that never recovers"):
        solutions.move_site(recovered, position=0)


def exercise_1_recovered_fraction_ends_at_one(solutions) -> None:
    clean = torch.tensor([[3, 7, 11, 2, 5]])
    corrupt = clean.clone()
    corrupt[0, 1] = 20
    r = solutions.recovered_fraction(_tiny(), clean, corrupt, 4, 9)
    assert r.shape == (4, 5), f"expected a (layers + 1, T) = (4, 5) table, got shape {tuple(r.shape)}"
    embedding, final = float(r[0, 1]), float(r[-1, -1])
    assert abs(embedding - 1.0) <= 1e-9, (  # the differing embedding
        f"expected 1 (to 1e-9) at layer 0, position 1, the embedding that differs, got {embedding!r}")
    assert abs(final - 1.0) <= 1e-9, (  # the final stream
        f"expected 1 (to 1e-9) at the last layer and position, the final stream, got {final!r}")
    before = float(r[:, 0].abs().max())
    assert before < 1e-9, (  # before the difference: nothing
        f"expected 0 (to 1e-9) at position 0, before the difference, got up to {before!r}")
    site = solutions.move_site(r)
    assert site >= 1, f"expected the information to move at layer 1 or later, got {site!r}"


def exercise_2_uniform_sink_score(solutions) -> None:
    uniform_baseline(solutions.uniform_sink_score, solutions.uniform_sink_score_sum,
                     solutions.uniform_sink_score, attention_sink_score,
                     (2, 3, 9, 40), 40, 0.08, 0.09, "sink score")


def exercise_3_the_units_rebuild_the_logit_gap(solutions) -> None:
    tiny = _tiny()
    ids = torch.tensor([[1, 4, 9, 16, 25, 6]])
    split = solutions.logit_gap_split(tiny, ids, 3, 8)
    units = split["units"]
    assert units.shape == (24,), f"expected one contribution per unit, shape (24,), got {tuple(units.shape)}"
    rebuilt = float((split["rest"] + units.sum()) / split["rms"])
    gap = float(split["gap"])
    assert abs(rebuilt - gap) <= 1e-10, (  # pytest.approx(gap, abs=1e-10)
        f"expected (rest + the units' sum) / rms to rebuild the logit gap {gap!r} (to 1e-10), got {rebuilt!r}")
    unit = solutions.top_writer(_tiny(), ids, 3, 8)
    assert float(units[unit]) == float(units.max()), (
        f"expected top_writer to name the unit of the largest contribution, {int(units.argmax())}, got {unit!r}")
    assert not torch.allclose(units, units[0].expand(24)), "expected the 24 units' contributions to differ"
