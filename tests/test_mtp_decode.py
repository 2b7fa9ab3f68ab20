"""Tests for llmbook.inference.mtp_decode: self-speculative decoding with multi-token heads."""

import pytest
import torch

from llmbook.inference.mtp_decode import (
    continuation_distribution,
    ideal_acceptance_rate,
    pooled_chi_square,
    self_speculative_batch,
    self_speculative_generate,
)
from llmbook.inference.sampling import chi_square_test, generate
from llmbook.text.data import MarkovSource
from llmbook.training.mtp import ParallelMTP
from llmbook.transformer.model import TransformerConfig

pytestmark = pytest.mark.usefixtures("one_thread")

V = 5
PROMPT = torch.tensor([[1, 2]])


def peaky_model(n=3, seed=0, style="gpt2"):
    make = TransformerConfig.gpt2_style if style == "gpt2" else TransformerConfig.llama_style
    cfg = make(vocab_size=V, d_model=12, n_layers=2, n_heads=2, max_seq_len=12, init_std=0.5)
    return ParallelMTP(cfg, n, generator=torch.Generator().manual_seed(seed)).eval()


@pytest.mark.parametrize("n,seed,style", [(2, 0, "gpt2"), (3, 1, "gpt2"), (4, 2, "llama")])
def test_greedy_equals_greedy_base_token_for_token(n, seed, style):
    model = peaky_model(n, seed, style)
    want = generate(model.lm, PROMPT, 9, temperature=0)
    got, stats = self_speculative_generate(model, PROMPT, 9, temperature=0)
    assert torch.equal(got, want)
    assert sum(stats.tokens_per_step) == 9
    batch, bstats = self_speculative_batch(model, PROMPT, 9, 3, temperature=0)
    assert torch.equal(batch, want.expand(3, -1))
    assert bstats.tokens_per_pass >= 1


def test_samples_follow_the_base_distribution():
    model = peaky_model(3, 0)
    probs = continuation_distribution(model, PROMPT, 3)
    index = lambda c: c[:, 0] * 25 + c[:, 1] * 5 + c[:, 2]  # noqa: E731
    out, stats = self_speculative_batch(model, PROMPT, 3, 20_000, generator=torch.Generator().manual_seed(1))
    _, df, p = pooled_chi_square(index(out[:, 2:]), probs)
    assert p > 1e-3 and df > 20
    assert stats.reached[0] > 0 and 0 < stats.acceptance[0] < 1
    # the loop version too (fewer samples: it is slow)
    g = torch.Generator().manual_seed(2)
    loop = torch.cat([self_speculative_generate(model, PROMPT, 3, generator=g)[0] for _ in range(400)])
    assert pooled_chi_square(index(loop[:, 2:]), probs)[2] > 1e-3
    # power: sampling the heads' drafts without verification fails the same test
    with torch.no_grad():
        heads = torch.softmax(model(PROMPT)[:, 0, -1].double(), -1)  # (3, V)
    gen = torch.Generator().manual_seed(3)
    drafts = torch.stack([torch.multinomial(heads[k], 20_000, replacement=True, generator=gen)
                          for k in range(3)], dim=1)
    assert pooled_chi_square(index(drafts), probs)[2] < 1e-6


def test_stats_count_every_pass():
    model = peaky_model(4, 5)
    out, stats = self_speculative_generate(model, PROMPT, 8, generator=torch.Generator().manual_seed(0))
    assert out.shape == (1, 10) and sum(stats.tokens_per_step) == 8
    assert all(0 <= a <= p <= 3 for a, p in zip(stats.accepted, stats.proposed, strict=True))
    _, stats0 = self_speculative_generate(model, PROMPT, 5, n_draft=0, generator=torch.Generator().manual_seed(0))
    assert stats0.tokens_per_step == [1] * 5
    _, b = self_speculative_batch(model, PROMPT, 8, 50, n_draft=2, generator=torch.Generator().manual_seed(0))
    assert b.reached.shape == (2,) and bool((b.accepted <= b.reached).all())
    assert b.reached[1] <= b.accepted[0]  # slot 2 is scored only after slot 1 was kept
    assert abs(b.tokens_per_pass - 8 * 50 / float(b.passes.sum())) < 1e-12


def test_continuation_distribution_is_the_chain_rule():
    model = peaky_model(2, 0)
    probs = continuation_distribution(model, PROMPT, 2)
    assert probs.shape == (V * V,) and abs(float(probs.sum()) - 1) < 1e-12
    with torch.no_grad():
        p1 = torch.softmax(model.lm(PROMPT)[0, -1].double(), -1)
        p2 = torch.softmax(model.lm(torch.tensor([[1, 2, 3]]))[0, -1].double(), -1)
    assert abs(float(probs[3 * V + 4]) - float(p1[3] * p2[4])) < 1e-6


def test_pooled_chi_square_without_pooling_is_chi_square_test():
    probs = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    samples = torch.multinomial(probs, 300, replacement=True, generator=torch.Generator().manual_seed(0))
    assert pooled_chi_square(samples, probs) == chi_square_test(samples, probs)
    rare = torch.tensor([0.98, 0.01, 0.01], dtype=torch.float64)  # 100 samples: expected 1, 1
    s = torch.zeros(100, dtype=torch.long)
    s[:2] = torch.tensor([1, 2])
    stat, df, p = pooled_chi_square(s, rare)
    assert df == 1 and abs(stat - 0.0) < 1e-12 and p == 1.0


def test_ideal_acceptance_rate():
    # a deterministic cycle: every draft is right
    cycle = MarkovSource.from_transition(torch.roll(torch.eye(3, dtype=torch.float64), 1, 1), order=1)
    assert abs(ideal_acceptance_rate(cycle, 2) - 1.0) < 1e-12
    # i.i.d. tokens: p = q, every draft accepted
    iid = MarkovSource.from_transition(torch.tensor([[0.2, 0.8]] * 2, dtype=torch.float64), order=1)
    assert abs(ideal_acceptance_rate(iid, 3) - 1.0) < 1e-12
    # brute force for k = 2, order 1
    P = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]], dtype=torch.float64)
    src = MarkovSource.from_transition(P, order=1)
    pi, P2 = src.stationary, P @ P
    want = sum(float(pi[a] * P[a, b] * torch.minimum(P[b], P2[a]).sum()) for a in range(3) for b in range(3))
    assert abs(ideal_acceptance_rate(src, 2) - want) < 1e-12


def test_bad_input():
    model = peaky_model(2)
    with pytest.raises(TypeError, match="ParallelMTP"):
        self_speculative_generate(model.lm, PROMPT, 3)
    with pytest.raises(ValueError, match="prompt_ids"):
        self_speculative_generate(model, torch.tensor([1, 2]), 3)
    with pytest.raises(ValueError, match="n_draft"):
        self_speculative_batch(model, PROMPT, 3, 4, n_draft=2)
    with pytest.raises(ValueError, match="max_seq_len"):
        self_speculative_generate(model, PROMPT, 20)
    with pytest.raises(ValueError, match="temperature"):
        self_speculative_generate(model, PROMPT, 3, temperature=-1.0)
    with pytest.raises(ValueError, match="samples"):
        pooled_chi_square(torch.tensor([0, 7]), torch.tensor([0.5, 0.5]))
    with pytest.raises(ValueError, match="k must be >= 2"):
        ideal_acceptance_rate(MarkovSource(3, 1), 1)
    with pytest.raises(ValueError, match="too many"):
        continuation_distribution(model, PROMPT, 9)


def test_pooled_chi_square_far_in_the_tail_is_p_zero():
    probs = torch.full((200,), 1 / 200, dtype=torch.float64)
    samples = torch.zeros(100_000, dtype=torch.long)  # everything in one cell
    stat, df, p = pooled_chi_square(samples, probs)
    assert df == 199 and p == 0.0 and abs(stat - 199 * 100_000) < 1e-3 * stat
