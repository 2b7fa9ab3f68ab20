"""The exercise solutions of notebooks/24b_real_model_interpretability hold."""

import pytest
import sympy as sp
import torch
from solution_loader import load_solutions

from llmbook.scale.interpretability import attention_sink_score
from llmbook.transformer.attention import causal_mask
from llmbook.transformer.model import TransformerConfig, TransformerLM

solutions = load_solutions("24b_real_model_interpretability")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny():
    cfg = TransformerConfig.llama_style(vocab_size=29, d_model=16, n_layers=3, n_heads=4, n_kv_heads=2,
                                        d_ff=24, max_seq_len=16)
    return TransformerLM(cfg, generator=torch.Generator().manual_seed(0)).double().eval()


def test_exercise_1_move_site():
    recovered = torch.zeros(5, 3, dtype=torch.float64)
    recovered[:3, 1], recovered[3:, -1] = 1.0, 1.0
    assert solutions.move_site(recovered) == 3
    assert solutions.move_site(recovered, position=1) == 0
    with pytest.raises(ValueError, match="never recovers"):
        solutions.move_site(recovered, position=0)


def test_exercise_1_recovered_fraction_ends_at_one(tiny):
    clean = torch.tensor([[3, 7, 11, 2, 5]])
    corrupt = clean.clone()
    corrupt[0, 1] = 20
    r = solutions.recovered_fraction(tiny, clean, corrupt, 4, 9)
    assert r.shape == (4, 5)
    assert float(r[0, 1]) == pytest.approx(1.0, abs=1e-9)  # the differing embedding
    assert float(r[-1, -1]) == pytest.approx(1.0, abs=1e-9)  # the final stream
    assert float(r[:, 0].abs().max()) < 1e-9  # before the difference: nothing
    assert solutions.move_site(r) >= 1


def test_exercise_2_uniform_sink_score():
    T = sp.Symbol("T", integer=True, positive=True)
    closed = solutions.uniform_sink_score()
    for n in (2, 3, 9, 40):
        assert closed.subs(T, n) == solutions.uniform_sink_score_sum(n)
    assert solutions.uniform_sink_score(2) == sp.Rational(1, 2)
    mask = causal_mask(40).double()
    uniform = (mask / mask.sum(-1, keepdim=True))[None, None]  # (1, 1, T, T)
    got = float(attention_sink_score(uniform)[0])
    assert got == pytest.approx(float(solutions.uniform_sink_score(40)), abs=1e-14)
    assert 0.08 < got < 0.09


def test_exercise_3_the_units_rebuild_the_logit_gap(tiny):
    ids = torch.tensor([[1, 4, 9, 16, 25, 6]])
    split = solutions.logit_gap_split(tiny, ids, 3, 8)
    assert split["units"].shape == (24,)
    rebuilt = (split["rest"] + split["units"].sum()) / split["rms"]
    assert float(rebuilt) == pytest.approx(float(split["gap"]), abs=1e-10)
    unit = solutions.top_writer(tiny, ids, 3, 8)
    assert float(split["units"][unit]) == float(split["units"].max())
    assert not torch.allclose(split["units"], split["units"][0].expand(24))
