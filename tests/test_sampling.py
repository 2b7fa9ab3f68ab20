"""Tests of llmbook.inference.sampling: the filters, generate and stream, beam search,
speculative sampling. Equality with transformers' processors on the real model's logits is
in test_sampling_real.py."""

import copy
import itertools
import math
from fractions import Fraction

import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from llmbook.inference.sampling import (
    BigramLM,
    IncrementalDecoder,
    PromptLookupDraft,
    SpeculativeStats,
    apply_temperature,
    beam_search,
    chi_square_sf,
    chi_square_test,
    early_exit_draft,
    expected_tokens_per_step,
    generate,
    min_p_filter,
    no_repeat_ngram_filter,
    process_logits,
    repeated_ngram_fraction,
    repetition_penalty,
    residual_distribution,
    sample_categorical,
    sample_next,
    sample_text,
    sequence_log_prob,
    speculative_generate,
    speculative_sample,
    speculative_speedup,
    stream,
    top_k_filter,
    top_p_filter,
)
from llmbook.transformer.model import TransformerConfig, TransformerLM

Z = torch.tensor([-0.336, 0.261, 0.260, -0.004, 0.341], dtype=torch.float64)

pytestmark = pytest.mark.usefixtures("one_thread")


logit_rows = st.lists(st.floats(-8, 8, allow_nan=False), min_size=2, max_size=12).map(
    lambda xs: torch.tensor(xs, dtype=torch.float64))


# ---------------------------------------------------------------- worked examples


def test_temperature_table() -> None:
    p1 = torch.softmax(apply_temperature(Z, 1.0), -1)
    p05 = torch.softmax(apply_temperature(Z, 0.5), -1)
    torch.testing.assert_close(p1, torch.tensor([0.1251, 0.2273, 0.2270, 0.1744, 0.2462],
                                                dtype=torch.float64), atol=5e-5, rtol=0)
    torch.testing.assert_close(p05, torch.tensor([0.0746, 0.2461, 0.2456, 0.1449, 0.2888],
                                                 dtype=torch.float64), atol=5e-5, rtol=0)
    assert abs(float(p05.sum()) - 1) < 1e-12
    # T -> 0 tends to the arg max, T -> infinity to uniform
    assert float(torch.softmax(apply_temperature(Z, 1e-3), -1)[4]) > 0.999
    torch.testing.assert_close(torch.softmax(apply_temperature(Z, 1e4), -1),
                               torch.full((5,), 0.2, dtype=torch.float64), atol=1e-4, rtol=0)


def test_nucleus_worked_example() -> None:
    # sorted: 4 (0.2462), 1 (0.2273), 2 (0.2270) -> 0.7005 < 0.75, so 3 (0.1744) joins
    kept = torch.softmax(top_p_filter(Z, 0.75), -1)
    assert kept[0] == 0 and bool((kept[1:] > 0).all())
    p = torch.softmax(Z, -1)
    torch.testing.assert_close(kept[1:], p[1:] / p[1:].sum())
    torch.testing.assert_close(kept, torch.tensor([0, 0.2598, 0.2595, 0.1993, 0.2814],
                                                  dtype=torch.float64), atol=5e-5, rtol=0)
    assert int(torch.isfinite(top_p_filter(Z, 0.7)).sum()) == 3
    assert int(torch.isfinite(top_p_filter(Z, 0.2)).sum()) == 1


def test_top_k_worked_example_and_ties() -> None:
    out = top_k_filter(Z, 2)
    assert torch.isfinite(out).tolist() == [False, True, False, False, True]
    tied = torch.tensor([1.0, 3.0, 3.0, 3.0, 0.0])
    assert torch.isfinite(top_k_filter(tied, 2)).tolist() == [False, True, True, False, False]
    assert torch.equal(top_k_filter(Z, 9), Z)


def test_sample_next_greedy_and_filters() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0], [5.0, 5.0, -1.0]])
    assert sample_next(logits, temperature=0).tolist() == [1, 0]
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([sample_next(logits, top_k=1, generator=g) for _ in range(20)])
    assert bool((draws[:, 0] == 1).all()) and bool((draws[:, 1] == 0).all())  # ties: lower index


# ---------------------------------------------------------------- properties


@settings(max_examples=60, deadline=None)
@given(logit_rows, st.integers(1, 14))
def test_top_k_keeps_exactly_k(z: torch.Tensor, k: int) -> None:
    out = top_k_filter(z, k)
    kept = torch.isfinite(out)
    assert int(kept.sum()) == min(k, z.numel())
    if not bool(kept.all()):
        assert float(z[kept].min()) >= float(z[~kept].max())
    assert abs(float(torch.softmax(out, -1).sum()) - 1) < 1e-12


@settings(max_examples=60, deadline=None)
@given(logit_rows, st.floats(0.01, 0.999))
def test_top_p_keeps_minimal_prefix(z: torch.Tensor, p: float) -> None:
    out = top_p_filter(z, p)
    kept = torch.isfinite(out)
    probs = torch.softmax(z, -1)
    order = torch.sort(probs, descending=True, stable=True).indices
    n = int(kept.sum())
    assert kept[order[:n]].all()  # a prefix of the sorted order
    assert float(probs[order[:n]].sum()) >= p - 1e-12  # reaches p
    assert float(probs[order[:n - 1]].sum()) < p  # and no shorter prefix does
    assert abs(float(torch.softmax(out, -1).sum()) - 1) < 1e-12


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.01, 1.0), min_size=2, max_size=8),
       st.lists(st.floats(0.01, 1.0), min_size=2, max_size=8))
def test_residual_mass_is_rejection_probability(a: list[float], b: list[float]) -> None:
    n = min(len(a), len(b))
    p = torch.tensor(a[:n], dtype=torch.float64)
    q = torch.tensor(b[:n], dtype=torch.float64)
    p, q = p / p.sum(), q / q.sum()
    # sum max(0, p - q) = 1 - sum min(p, q), and the speculative law reproduces p exactly
    assert abs(float(torch.clamp(p - q, min=0).sum()) - (1 - float(torch.minimum(p, q).sum()))) < 1e-12
    law = torch.minimum(p, q) + (1 - torch.minimum(p, q).sum()) * residual_distribution(p, q)
    torch.testing.assert_close(law, p, atol=1e-12, rtol=0)


# ---------------------------------------------------------------- beam search


def _beam_model() -> BigramLM:
    probs = torch.tensor([[0.02, 0.55, 0.41, 0.02],   # after 0: greedy takes 1 ...
                          [0.34, 0.33, 0.01, 0.32],   # ... but nothing after 1 is likely
                          [0.01, 0.01, 0.01, 0.97],   # after 2 the next token is almost sure
                          [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    return BigramLM.from_probs(probs)


def test_beam_beats_greedy_and_finds_the_exact_optimum() -> None:
    model, prompt = _beam_model(), torch.tensor([[0]])
    greedy = generate(model, prompt, 2, temperature=0)
    beams = beam_search(model, prompt, num_beams=2, max_new_tokens=2, length_penalty=0.0)
    all_seqs = torch.tensor([[0, a, b] for a, b in itertools.product(range(4), repeat=2)])
    logps = sequence_log_prob(model, all_seqs, 1)
    best = all_seqs[int(logps.argmax())]
    assert greedy[0].tolist() == [0, 1, 0]
    assert beams[0].tokens.tolist() == best.tolist() == [0, 2, 3]
    assert math.isclose(beams[0].log_prob, math.log(0.41 * 0.97), rel_tol=1e-12)
    assert float(sequence_log_prob(model, greedy, 1)) < beams[0].log_prob
    assert beam_search(model, prompt, 1, 2)[0].tokens.tolist() == greedy[0].tolist()


def test_exhaustive_beam_equals_enumeration() -> None:
    g = torch.Generator().manual_seed(0)
    model = BigramLM(torch.randn(3, 3, generator=g, dtype=torch.float64) * 2)
    prompt = torch.tensor([[1]])
    seqs = torch.tensor([[1, *s] for s in itertools.product(range(3), repeat=3)])
    logps = sequence_log_prob(model, seqs, 1)
    beams = beam_search(model, prompt, num_beams=9, max_new_tokens=3, length_penalty=0.0)
    assert beams[0].tokens.tolist() == seqs[int(logps.argmax())].tolist()
    assert math.isclose(beams[0].log_prob, float(logps.max()), rel_tol=1e-12)
    assert [h.score for h in beams] == sorted((h.score for h in beams), reverse=True)


def test_beam_length_penalty_with_eos() -> None:
    # token 3 is the end: stopping at once is likelier in total, continuing likelier per token
    probs = torch.tensor([[0.05, 0.45, 0.05, 0.45],
                          [0.01, 0.97, 0.01, 0.01],
                          [0.25, 0.25, 0.25, 0.25],
                          [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    model, prompt = BigramLM.from_probs(probs), torch.tensor([[0]])
    total = beam_search(model, prompt, 3, 4, length_penalty=0.0, eos_token_id=3)
    mean = beam_search(model, prompt, 3, 4, length_penalty=1.0, eos_token_id=3)
    assert total[0].tokens.tolist() == [0, 3]
    assert mean[0].tokens.tolist() == [0, 1, 1, 1, 1]
    assert math.isclose(mean[0].score, math.log(0.45 * 0.97**3) / 4, rel_tol=1e-12)


# ---------------------------------------------------------------- speculative sampling


def test_speculative_sample_matches_target_chi_square() -> None:
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    q = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    samples = speculative_sample(p, q, 40_000, g)
    stat, df, pval = chi_square_test(samples, p)
    assert df == 3 and pval > 1e-3
    # the same test rejects the draft's own samples: it has power
    _, _, p_bad = chi_square_test(torch.multinomial(q, 40_000, True, generator=g), p)
    assert p_bad < 1e-10


def test_speculative_generate_is_exact_on_a_bigram() -> None:
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(4, 4, generator=g, dtype=torch.float64) * 1.5, -1)
    q = torch.softmax(torch.randn(4, 4, generator=g, dtype=torch.float64) * 1.5, -1)
    target, draft = BigramLM.from_probs(p), BigramLM.from_probs(q)
    prompt = torch.tensor([[2]])
    second = [int(speculative_generate(target, draft, prompt, 2, gamma=1, generator=g)[0][0, 2])
              for _ in range(3000)]
    stat, df, pval = chi_square_test(torch.tensor(second), p[2] @ p)  # P(x_2) = sum p(x_1|2) p(x_2|x_1)
    assert pval > 1e-3


def test_speculative_stats_and_identical_draft() -> None:
    g = torch.Generator().manual_seed(2)
    p = torch.softmax(torch.randn(5, 5, generator=g, dtype=torch.float64), -1)
    same = BigramLM.from_probs(p)
    ids, stats = speculative_generate(same, same, torch.tensor([[0]]), 13, gamma=3, generator=g)
    assert ids.shape == (1, 14)
    assert stats.accepted == stats.proposed == [3, 3, 3, 0]  # 4 + 4 + 4 + 1 tokens
    assert sum(stats.tokens_per_step) == 13


def _tiny_lm(seed: int, n_layers: int) -> TransformerLM:
    config = TransformerConfig.llama_style(vocab_size=11, d_model=16, n_layers=n_layers,
                                           n_heads=2, n_kv_heads=1, max_seq_len=40)
    return TransformerLM(config, generator=torch.Generator().manual_seed(seed)).double().eval()


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_speculative_generate_cache_equals_recompute(gamma: int) -> None:
    """With KV caches for both models (truncated after rejections) the same tokens and
    acceptances come out as when both rerun the whole sequence."""
    target, draft = _tiny_lm(0, 2), _tiny_lm(1, 1)
    prompt = torch.tensor([[3, 1, 4]])
    runs = []
    for use_cache in (True, False):
        g = torch.Generator().manual_seed(10 + gamma)
        runs.append(speculative_generate(target, draft, prompt, 30, gamma, generator=g,
                                         use_cache=use_cache))
    (ids_c, st_c), (ids_r, st_r) = runs
    assert ids_c.shape == (1, 33)
    assert torch.equal(ids_c, ids_r)
    assert st_c.accepted == st_r.accepted and st_c.proposed == st_r.proposed
    assert 0 < sum(st_c.accepted) < sum(st_c.proposed)  # both accepts and rejects happened


def test_speculative_generate_cache_with_a_bigram_draft() -> None:
    """A cached TransformerLM target with a cache-less draft: same tokens as without caches."""
    target = _tiny_lm(2, 2)
    draft = BigramLM.from_probs(torch.full((11, 11), 1 / 11, dtype=torch.float64))
    outs = [speculative_generate(target, draft, torch.tensor([[5]]), 20, 2,
                                 generator=torch.Generator().manual_seed(4), use_cache=c)[0]
            for c in (True, False)]
    assert torch.equal(outs[0], outs[1])


def test_prompt_lookup_draft_worked_example() -> None:
    draft = PromptLookupDraft(vocab_size=10, max_ngram=3)
    ids = torch.tensor([[5, 1, 2, 3, 9, 1, 2],    # "9 1 2" is new, "1 2" was followed by 3
                        [4, 4, 4, 4, 4, 4, 4],    # "4 4 4" first at 0, followed by 4
                        [1, 2, 3, 4, 5, 6, 7]])   # nothing repeats: no guess
    assert draft.guess(ids) == [3, 4, None]
    logits = draft.next_token_logits(ids)  # (3, 10)
    assert torch.isfinite(logits).tolist()[0] == [i == 3 for i in range(10)]
    assert torch.equal(logits[2], torch.zeros(10, dtype=torch.float64))  # uniform q
    assert PromptLookupDraft(10, max_ngram=1).guess(torch.tensor([[1, 2, 1, 3, 1]])) == [2]
    every = draft(ids[:1, :5])  # (1, 5, 10): the guess after each prefix
    assert every.shape == (1, 5, 10)
    assert [draft.guess(ids[:1, :t + 1])[0] for t in range(5)] == [None, None, None, None, None]
    assert torch.equal(every[0, 4], draft.next_token_logits(ids[:1, :5])[0])
    with pytest.raises(ValueError, match="max_ngram"):
        PromptLookupDraft(10, max_ngram=0)
    with pytest.raises(TypeError, match="ids"):
        draft.guess(torch.tensor([[1.0, 2.0]]))


def test_prompt_lookup_first_guess_is_transformers_candidate() -> None:
    """The guess = the first token of transformers' prompt-lookup candidates (the same
    longest-suffix, leftmost-match rule), on random sequences with many repeats."""
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    g = torch.Generator().manual_seed(0)
    matched = 0
    for trial in range(200):
        T, V, n = 2 + trial % 20, 3 + trial % 5, 1 + trial % 3
        ids = torch.randint(0, V, (1, T), generator=g)
        peer = PromptLookupCandidateGenerator(num_output_tokens=1, max_matching_ngram_size=n,
                                              max_length=T + 5, vocab_size=V)
        candidates, _ = peer.get_candidates(ids)
        theirs = int(candidates[0, T]) if candidates.shape[1] > T else None
        assert PromptLookupDraft(V, max_ngram=n).guess(ids) == [theirs], ids
        matched += theirs is not None
    assert 50 < matched < 200  # both kinds of case occurred


def test_speculative_with_prompt_lookup_is_exact_at_a_temperature() -> None:
    """A one-hot draft exercises the residual path (p with the guess removed): the tokens
    still follow the target at temperature T, softmax(log p / T), by a chi-square test."""
    p = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    target = BigramLM.from_probs(p.expand(4, 4))  # the same p after every token
    draft = PromptLookupDraft(4, max_ngram=2)
    for t in (1.0, 0.5):
        ids, stats = speculative_generate(target, draft, torch.tensor([[0, 1, 0]]), 1500, 3,
                                          generator=torch.Generator().manual_seed(3), temperature=t)
        law = torch.softmax(torch.log(p) / t, -1)
        assert chi_square_test(ids[0, 3:], law)[2] > 1e-3
        assert 0 < sum(stats.accepted) < sum(stats.proposed)
    with pytest.raises(ValueError, match="temperature"):
        speculative_generate(target, draft, torch.tensor([[0]]), 5, 2, temperature=0)


def test_speculative_temperature_cache_equals_recompute() -> None:
    target, draft = _tiny_lm(0, 2), _tiny_lm(1, 1)
    outs = [speculative_generate(target, draft, torch.tensor([[3, 1]]), 20, 3, temperature=0.6,
                                 generator=torch.Generator().manual_seed(5), use_cache=c)
            for c in (True, False)]
    assert torch.equal(outs[0][0], outs[1][0]) and outs[0][1].accepted == outs[1][1].accepted


def test_speculative_speedup() -> None:
    # Leviathan et al. (2023): alpha = 0.8, gamma = 1, a free draft: 1.8 tokens per pass
    assert math.isclose(speculative_speedup(0.8, 1, 0.0), 1.8)
    # gamma = 3, c = 0.1: (1 - 0.8^4) / 0.2 / 1.3 = 2.952 / 1.3
    assert math.isclose(speculative_speedup(0.8, 3, 0.1), (1 - 0.8**4) / 0.2 / 1.3)
    assert math.isclose(speculative_speedup(0.0, 4, 0.25), 0.5)  # nothing accepted: a slow-down
    assert speculative_speedup(1.0, 4, 0.0) == 5.0
    a, gam, c = sp.symbols("alpha gamma c", positive=True)
    formula = (1 - a ** (gam + 1)) / ((1 - a) * (gam * c + 1))
    for alpha, gamma, cost in ((0.3, 2, 0.5), (0.9, 6, 0.05), (0.6, 1, 1.0)):
        assert math.isclose(speculative_speedup(alpha, gamma, cost),
                            float(formula.subs({a: alpha, gam: gamma, c: cost})), rel_tol=1e-12)
    with pytest.raises(ValueError, match="cost_ratio"):
        speculative_speedup(0.5, 2, -0.1)


def test_early_exit_draft() -> None:
    target = _tiny_lm(3, 3)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        assert torch.equal(early_exit_draft(target, 3)(ids), target(ids))  # all layers: a copy
        draft = early_exit_draft(target, 1)
        skipped = copy.deepcopy(target)  # the target with blocks 1 and 2 made identities
        for block in skipped.blocks[1:]:
            block.forward = lambda x, *args, **kwargs: x
        assert torch.allclose(draft(ids), skipped(ids), atol=1e-12, rtol=0)
        assert not torch.allclose(draft(ids), target(ids), atol=1e-3)
    assert draft.config.n_layers == 1 and len(draft.blocks) == 1
    assert draft.embed.weight.data_ptr() != target.embed.weight.data_ptr()  # copied, not shared
    with pytest.raises(ValueError, match=r"n_layers must be an int in \[1, 3\]"):
        early_exit_draft(target, 4)
    with pytest.raises(TypeError, match="TransformerLM"):
        early_exit_draft(BigramLM.from_probs(torch.eye(3)), 1)


def test_expected_tokens_per_step_formula_and_measurement() -> None:
    a, n = sp.symbols("alpha n", positive=True)
    for gamma in range(1, 7):  # E = sum_{n<gamma} (n+1) a^n (1-a) + (gamma+1) a^gamma
        e = sum((k + 1) * a**k * (1 - a) for k in range(gamma)) + (gamma + 1) * a**gamma
        assert sp.simplify(e - (1 - a ** (gamma + 1)) / (1 - a)) == 0
        assert math.isclose(expected_tokens_per_step(0.6, gamma), float(e.subs(a, 0.6)))
    assert expected_tokens_per_step(1.0, 4) == 5.0
    p = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    q = torch.tensor([0.3, 0.3, 0.4], dtype=torch.float64)
    alpha = float(torch.minimum(p, q).sum())  # 0.7
    target, draft = BigramLM.from_probs(p.expand(3, 3)), BigramLM.from_probs(q.expand(3, 3))
    g = torch.Generator().manual_seed(3)
    _, stats = speculative_generate(target, draft, torch.tensor([[0]]), 3000, gamma=3, generator=g)
    full = [t for t, n_ in zip(stats.tokens_per_step, stats.proposed, strict=True) if n_ == 3]
    assert abs(sum(full) / len(full) - expected_tokens_per_step(alpha, 3)) < 0.08


# ---------------------------------------------------------------- chi-square


def test_chi_square_sf_against_sympy() -> None:
    for df in (1, 2, 3, 4, 7, 15):
        for x in (0.5, 3.0, 11.0, 40.0):
            exact = float(sp.uppergamma(sp.Rational(df, 2), sp.Float(x) / 2) / sp.gamma(sp.Rational(df, 2)))
            assert math.isclose(chi_square_sf(x, df), exact, rel_tol=1e-10, abs_tol=1e-300)
    assert chi_square_sf(0.0, 3) == 1.0
    assert math.isclose(chi_square_sf(3.841458820694124, 1), 0.05, rel_tol=1e-9)


def test_chi_square_sf_large_statistic_and_df_does_not_overflow() -> None:
    # y^i / i! alone passes the float range here (x = 7e4, df = 472: e^1400); the sum is
    # taken in log space, so the tail comes out as the tiny number it is
    for df in (472, 473, 1000):
        for x in (df * 0.9, df * 1.1, 7e4):
            exact = float(sp.uppergamma(sp.Rational(df, 2), sp.Float(x, 30) / 2) / sp.gamma(sp.Rational(df, 2)))
            assert math.isclose(chi_square_sf(x, df), exact, rel_tol=1e-9, abs_tol=1e-300)


def test_chi_square_statistic_worked_example() -> None:
    samples = torch.tensor([0] * 30 + [1] * 50 + [2] * 20)
    stat, df, _ = chi_square_test(samples, torch.tensor([0.25, 0.5, 0.25]))
    assert df == 2 and math.isclose(stat, (30 - 25) ** 2 / 25 + 0 + (20 - 25) ** 2 / 25)
    assert chi_square_test(torch.tensor([2]), torch.tensor([0.5, 0.5, 0.0]))[0] == math.inf


# ---------------------------------------------------------------- generate and errors


def test_generate_shapes_and_determinism() -> None:
    config = TransformerConfig.gpt2_style(vocab_size=11, d_model=16, n_layers=1, n_heads=2,
                                          max_seq_len=20)
    model = TransformerLM(config, generator=torch.Generator().manual_seed(0))
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    a = generate(model, prompt, 7, top_p=0.8, generator=torch.Generator().manual_seed(5))
    b = generate(model, prompt, 7, top_p=0.8, generator=torch.Generator().manual_seed(5))
    assert a.shape == (2, 10) and torch.equal(a, b) and torch.equal(a[:, :3], prompt)
    assert torch.equal(generate(model, prompt, 0), prompt)
    assert model.training  # restored


def test_errors() -> None:
    config = TransformerConfig.gpt2_style(vocab_size=11, d_model=16, n_layers=1, n_heads=2,
                                          max_seq_len=8)
    model = TransformerLM(config)
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        generate(model, prompt, 2, temperature=-1.0)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        apply_temperature(Z, 0.0)
    with pytest.raises(ValueError, match="top_k must be >= 1, got top_k=0"):
        top_k_filter(Z, 0)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="top_p must lie in \\(0, 1\\]"):
            top_p_filter(Z, bad)
    with pytest.raises(ValueError, match="the prompt = 9 tokens exceed the model's context max_seq_len=8"):
        generate(model, torch.zeros(1, 9, dtype=torch.long), 1)
    with pytest.raises(ValueError, match="prompt \\+ max_new_tokens = 10 tokens exceed"):
        generate(model, prompt, 7)
    with pytest.raises(ValueError, match="prompt_ids must have shape \\(B, T\\)"):
        generate(model, torch.tensor([1, 2]), 1)
    with pytest.raises(TypeError, match="integer tensor"):
        generate(model, torch.zeros(1, 2), 1)
    with pytest.raises(ValueError, match="logits must have shape \\(B, V\\)"):
        sample_next(Z, 1.0)
    with pytest.raises(ValueError, match="one prompt"):
        beam_search(model, torch.zeros(2, 2, dtype=torch.long), 2, 2)
    with pytest.raises(ValueError, match="gamma must be >= 1"):
        speculative_generate(model, model, prompt, 2, gamma=0)
    other_vocab = TransformerLM(TransformerConfig.gpt2_style(
        vocab_size=13, d_model=16, n_layers=1, n_heads=2, max_seq_len=8))
    with pytest.raises(ValueError, match=r"draft's vocabulary \(V=13\) differs from the target's \(V=11\)"):
        speculative_generate(model, other_vocab, prompt, 2, gamma=1)
    with pytest.raises(ValueError, match="p and q must have the same shape"):
        residual_distribution(torch.ones(3) / 3, torch.ones(4) / 4)
    with pytest.raises(ValueError, match="alpha must lie in"):
        expected_tokens_per_step(1.5, 2)
    with pytest.raises(ValueError, match="probs must be a distribution"):
        chi_square_test(torch.tensor([0, 1]), torch.tensor([0.5, 0.6]))


# ---------------------------------------------------------------- min-p, penalties, the chain


def test_min_p_worked_example() -> None:
    # p / p_max = exp(z - 0.341) >= 0.8  <=>  z >= 0.341 + log 0.8 = 0.1179: tokens 1, 2, 4
    out = min_p_filter(Z, 0.8)
    assert torch.isfinite(out).tolist() == [False, True, True, False, True]
    assert torch.equal(out[[1, 2, 4]], Z[[1, 2, 4]])  # kept logits are untouched
    kept = torch.softmax(out, -1)
    torch.testing.assert_close(kept[[1, 2, 4]], torch.tensor([0.3244, 0.3241, 0.3515],
                                                             dtype=torch.float64), atol=5e-5, rtol=0)
    # a shift changes nothing; a temperature of 0.1 moves the cut to 0.341 + 0.1 log 0.8
    assert torch.equal(torch.isfinite(min_p_filter(Z + 7.0, 0.8)), torch.isfinite(out))
    assert torch.isfinite(min_p_filter(apply_temperature(Z, 0.1), 0.8)).tolist() == \
        [False, False, False, False, True]
    assert torch.isfinite(min_p_filter(Z, 0.55)).tolist() == [False, True, True, True, True]
    assert torch.equal(min_p_filter(Z, 0.0), Z)  # 0 keeps everything, 1 only the arg max
    assert int(torch.isfinite(min_p_filter(Z, 1.0)).sum()) == 1
    tied = torch.tensor([[1.0, 3.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert torch.isfinite(min_p_filter(tied, 1.0)).tolist() == [[False, True, True, False],
                                                                [True, True, True, True]]


def test_repetition_penalty_worked_example() -> None:
    z = torch.tensor([[2.0, -1.0, 0.5, -0.2, 3.0, 0.0],
                      [2.0, -1.0, 0.5, -0.2, 3.0, 0.0]], dtype=torch.float64)  # (B=2, V=6)
    history = torch.tensor([[0, 1, 1, 5], [4, 3, 3, 3]])  # (B=2, T=4): different per row
    out = repetition_penalty(z, history, 2.0)
    assert out.tolist() == [[1.0, -2.0, 0.5, -0.2, 3.0, 0.0],  # 2 / 2, -1 * 2, 0 stays 0
                            [2.0, -1.0, 0.5, -0.4, 1.5, 0.0]]
    assert repetition_penalty(z, history, 0.5).tolist() == [[4.0, -0.5, 0.5, -0.2, 3.0, 0.0],
                                                            [2.0, -1.0, 0.5, -0.1, 6.0, 0.0]]
    assert torch.equal(repetition_penalty(z, history, 1.0), z)
    assert torch.equal(repetition_penalty(z, history[:, :0], 3.0), z)  # no history: no change
    one = repetition_penalty(z[0], history[0], 2.0)  # a single row (V,) with (T,)
    assert torch.equal(one, out[0])
    # sign-aware, so it commutes with a temperature (up to round-off)
    torch.testing.assert_close(apply_temperature(repetition_penalty(z, history, 1.3), 0.7),
                               repetition_penalty(apply_temperature(z, 0.7), history, 1.3))


def test_no_repeat_ngram_worked_example() -> None:
    z = torch.zeros(1, 7, dtype=torch.float64)
    history = torch.tensor([[1, 2, 3, 1, 2]])  # the next token after "1 2" may not be 3 again

    def banned(n: int, h: torch.Tensor = history) -> list[int]:
        return torch.nonzero(~torch.isfinite(no_repeat_ngram_filter(z, h, n))[0]).flatten().tolist()

    assert banned(3) == [3]  # "1 2 3" occurred
    assert banned(2) == [3]  # "2 3" occurred; the last token 2 was followed by 3
    assert banned(1) == [1, 2, 3]  # every token seen
    assert banned(6) == []  # a history shorter than n bans nothing
    assert banned(2, torch.tensor([[4, 4, 4]])) == [4]


def test_process_logits_follows_the_hugging_face_order() -> None:
    z = torch.tensor([[1.5, 0.2, -0.7, 2.1, 0.9, -2.0, 0.4],
                      [0.1, 0.3, 0.2, -0.5, 1.0, 0.0, 0.8]], dtype=torch.float64)  # (2, 7)
    history = torch.tensor([[3, 0, 3], [4, 6, 4]])
    rules = dict(temperature=0.8, top_k=5, top_p=0.9, min_p=0.2, repetition_penalty=1.3,
                 no_repeat_ngram_size=2)
    by_hand = no_repeat_ngram_filter(repetition_penalty(z, history, 1.3), history, 2)
    by_hand = min_p_filter(top_p_filter(top_k_filter(apply_temperature(by_hand, 0.8), 5), 0.9), 0.2)
    assert torch.equal(process_logits(z, history, **rules), by_hand)
    # greedy: only the history rules, on the model's own scale
    greedy = process_logits(z, history, **{**rules, "temperature": 0})
    assert torch.equal(greedy, no_repeat_ngram_filter(repetition_penalty(z, history, 1.3), history, 2))
    assert torch.equal(process_logits(z), apply_temperature(z, 1.0))
    # top-p and min-p do not commute: the nucleus of the min-p survivors is smaller
    w = torch.log(torch.tensor([0.3, 0.3, 0.2] + [0.01] * 20, dtype=torch.float64))
    hf_order = min_p_filter(top_p_filter(w, 0.7), 0.1)  # 0.3 + 0.3 < 0.7: three tokens
    other = top_p_filter(min_p_filter(w, 0.1), 0.7)  # 0.375 + 0.375 >= 0.7: two
    assert torch.isfinite(hf_order).sum() == 3 and torch.isfinite(other).sum() == 2
    with pytest.raises(ValueError, match="need previous_ids"):
        process_logits(z, repetition_penalty=1.2)


# ---------------------------------------------------------------- against transformers' processors


def _hf_chain(temperature: float, top_k: int | None, top_p: float | None,
              min_p: float | None) -> LogitsProcessorList:
    """transformers' warpers in the order its ``generate`` builds them (temperature, top-k,
    top-p, min-p), for the same settings as :func:`process_logits`."""
    chain = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_k is not None:
        chain.append(TopKLogitsWarper(top_k))
    if top_p is not None:
        chain.append(TopPLogitsWarper(top_p))
    if min_p is not None:
        chain.append(MinPLogitsWarper(min_p))
    return chain


# every combination, on logits without ties (continuous normal draws, float64), whose scale
# runs from flat (0.3) to peaked (4): V >= 32, and k below and above the nucleus' size
CHAIN_CASES = [(V, scale, t, k, p, m) for V in (32, 97) for scale in (0.3, 1.5, 4.0)
               for t in (0.5, 2.0) for k in (None, 6, 24) for p in (None, 0.6, 0.95)
               for m in (None, 0.05)]


def _chain_logits(V: int, scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(V * 100 + int(10 * scale))
    return torch.randn(6, V, generator=g, dtype=torch.float64) * scale  # (6, V)


def test_process_logits_is_transformers_chain_and_the_order_matters() -> None:
    """Combined rules = transformers' LogitsProcessorList, bit for bit; and the test has
    power: applying top-p before top-k, or the temperature after the filters, changes the
    kept sets in some of these cases (so either slip would fail the equality)."""
    swapped = late_temperature = 0
    for V, scale, t, k, p, m in CHAIN_CASES:
        z = _chain_logits(V, scale)
        ours = process_logits(z, temperature=t, top_k=k, top_p=p, min_p=m)
        theirs = _hf_chain(t, k, p, m)(None, z.clone())
        assert torch.equal(ours, theirs), (V, scale, t, k, p, m)
        if k is not None and p is not None:  # the planted slip: top-p first, then top-k
            wrong = top_k_filter(top_p_filter(apply_temperature(z, t), p), k)
            wrong = wrong if m is None else min_p_filter(wrong, m)
            swapped += not torch.equal(torch.isfinite(wrong), torch.isfinite(ours))
        if p is not None or m is not None:  # the other slip: filters on z, then z / T
            w = z if k is None else top_k_filter(z, k)
            w = w if p is None else top_p_filter(w, p)
            w = w if m is None else min_p_filter(w, m)
            late_temperature += not torch.equal(torch.isfinite(w), torch.isfinite(ours))
    assert swapped >= 10 and late_temperature >= 10, (swapped, late_temperature)


def test_sample_next_draws_from_the_transformers_chain() -> None:
    """sample_next's draw = torch.multinomial on softmax(transformers' chain), same generator."""
    for i, (V, scale, t, k, p, m) in enumerate(CHAIN_CASES[::3]):
        z = _chain_logits(V, scale)
        ours = sample_next(z, t, k, p, torch.Generator().manual_seed(i), min_p=m)
        probs = torch.softmax(_hf_chain(t, k, p, m)(None, z.clone()), dim=-1)
        theirs = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(i))[:, 0]
        assert torch.equal(ours, theirs), (V, scale, t, k, p, m)


def _tied_logits(V: int, seed: int) -> torch.Tensor:
    """(4, V) logits with only five distinct values: every boundary is a tie."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 5, (4, V), generator=g).double() * 0.7


@pytest.mark.parametrize("V", [17, 32, 64, 257])
def test_top_k_ties_policy_against_transformers(V: int) -> None:
    """The book keeps exactly k tokens, tied ones by lower index (a stable sort);
    TopKLogitsWarper keeps every token tied with the k-th largest. So the book's set is
    theirs less the tied tokens of highest index. At V >= 17 an unstable sort would put
    tied tokens out of index order, and the set would differ."""
    z = _tied_logits(V, V)
    for k in (1, 3, V // 3, V - 2):
        ours = torch.isfinite(top_k_filter(z, k))
        theirs = torch.isfinite(TopKLogitsWarper(k)(None, z.clone()))
        kth = torch.sort(z, dim=-1, descending=True).values[:, k - 1:k]  # (4, 1)
        assert torch.equal(ours.sum(-1), torch.full((4,), k))
        assert torch.equal(theirs, z >= kth)  # their policy, restated from their docs
        assert bool((ours <= theirs).all()) and bool(ours[z > kth].all())
        for r in range(4):  # among the tied tokens, the lowest indices are the kept ones
            tied = torch.nonzero(z[r] == kth[r]).flatten()
            n_tied_kept = k - int((z[r] > kth[r]).sum())
            assert ours[r, tied].tolist() == [True] * n_tied_kept + [False] * (len(tied) - n_tied_kept)
    # the test has power: from V = 17 on, torch's default (unstable) sort reorders ties
    unstable = torch.sort(z, dim=-1, descending=True).indices
    stable = torch.sort(z, dim=-1, descending=True, stable=True).indices
    assert not torch.equal(unstable, stable)


@pytest.mark.parametrize("V", [32, 64, 257])
def test_top_p_ties_policy_against_transformers(V: int) -> None:
    """With ties, TopPLogitsWarper and the book keep the same *number* of tokens (the
    smallest prefix reaching p, counted in exact arithmetic); the book keeps tied ones
    by lower index, transformers leaves it to an ascending sort. Away from ties the sets
    are equal. The p are chosen so that no running sum of these logits lies within 1e-9."""
    z = _tied_logits(V, 7 * V)
    for p in (0.31, 0.58, 0.87):
        ours = torch.isfinite(top_p_filter(z, p))
        theirs = torch.isfinite(TopPLogitsWarper(p)(None, z.clone()))
        assert torch.equal(ours.sum(-1), theirs.sum(-1))
        boundary = z.masked_fill(~ours, float("inf")).amin(-1, keepdim=True)  # smallest kept
        assert torch.equal(ours & (z > boundary), theirs & (z > boundary))
        kept_ties = ours & (z == boundary)
        for r in range(4):  # the book: the lowest-index tied tokens
            tied = torch.nonzero(z[r] == boundary[r]).flatten()
            n = int(kept_ties[r].sum())
            assert ours[r, tied].tolist() == [True] * n + [False] * (len(tied) - n)
        probs = torch.sort(torch.softmax(z, -1), descending=True).values
        margin = (torch.cumsum(probs, -1) - p).abs().min()
        assert float(margin) > 1e-9


def test_sample_categorical_is_torch_multinomial_draw_for_draw() -> None:
    g = torch.Generator().manual_seed(0)
    for trial in range(30):
        V = 3 + trial % 7
        probs = torch.rand(4, V, generator=g, dtype=torch.float64) ** 3  # unnormalised rows
        probs[:, trial % V] = 0.0
        seed = 100 + trial
        ours = sample_categorical(probs, torch.Generator().manual_seed(seed))
        theirs = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed))[:, 0]
        assert torch.equal(ours, theirs)
        assert bool((probs.gather(-1, ours[:, None]) > 0).all())
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    g = torch.Generator().manual_seed(1)
    draws = torch.cat([sample_categorical(p.expand(1000, 4), g) for _ in range(20)])
    assert chi_square_test(draws, p)[2] > 1e-3
    with pytest.raises(ValueError, match="non-negative"):
        sample_categorical(torch.tensor([0.5, -0.1]))


def test_repeated_ngram_fraction() -> None:
    assert repeated_ngram_fraction([1, 2, 3, 1, 2, 3], 3) == 0.25  # 4 trigrams, 3 distinct
    assert repeated_ngram_fraction([1, 2, 3, 1, 2, 3], 1) == 0.5
    assert repeated_ngram_fraction(torch.tensor([4, 5, 6, 7]), 2) == 0.0
    assert repeated_ngram_fraction([4, 5], 3) == 0.0
    loop = [7, 8, 9, 10] * 25  # 25 copies of a loop of 4: 97 4-grams, 4 distinct
    assert math.isclose(repeated_ngram_fraction(loop, 4), 1 - 4 / 97)
    with pytest.raises(ValueError, match="one sequence"):
        repeated_ngram_fraction(torch.zeros(2, 3, dtype=torch.long), 2)


@settings(max_examples=60, deadline=None)
@given(logit_rows, st.floats(0.001, 1.0))
def test_min_p_keeps_the_tokens_above_the_cut(z: torch.Tensor, m: float) -> None:
    kept = torch.isfinite(min_p_filter(z, m))
    ratio = torch.exp(z - z.max())  # p / p_max
    assert bool(kept[int(z.argmax())])
    assert bool((ratio[kept] >= m * (1 - 1e-12)).all()) and bool((ratio[~kept] < m * (1 + 1e-12)).all())
    if not bool(kept.all()):  # an upper set of the logits
        assert float(z[kept].min()) > float(z[~kept].max())


@settings(max_examples=60, deadline=None)
@given(logit_rows, st.lists(st.integers(0, 11), min_size=0, max_size=6), st.floats(1.01, 3.0))
def test_repetition_penalty_properties(z: torch.Tensor, seen: list[int], theta: float) -> None:
    history = torch.tensor([s % z.numel() for s in seen], dtype=torch.long)
    out = repetition_penalty(z, history, theta)
    mask = torch.zeros_like(z, dtype=torch.bool)
    mask[history] = True
    assert torch.equal(out[~mask], z[~mask])  # unseen tokens untouched
    assert bool((out[mask] <= z[mask]).all())  # seen tokens never gain
    assert float(torch.softmax(out, -1)[mask].sum()) <= float(torch.softmax(z, -1)[mask].sum()) + 1e-12
    torch.testing.assert_close(repetition_penalty(out, history, 1 / theta), z)  # 1/theta undoes it


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=0, max_size=14), st.integers(1, 4))
def test_no_repeat_ngram_bans_exactly_the_repeats(history: list[int], n: int) -> None:
    z = torch.zeros(5, dtype=torch.float64)
    banned = ~torch.isfinite(no_repeat_ngram_filter(z, torch.tensor(history, dtype=torch.long), n))
    seen = {tuple(history[i:i + n]) for i in range(len(history) - n + 1)}
    for token in range(5):
        would_repeat = len(history) >= n and tuple(history[len(history) - n + 1:] + [token]) in seen
        assert bool(banned[token]) == would_repeat


# ---------------------------------------------------------------- stream, stops, generate


class CountingBigram(BigramLM):
    """A bigram model that counts its forward passes."""

    calls = 0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(ids)


def _stop_model() -> CountingBigram:
    probs = torch.tensor([[0.1, 0.3, 0.3, 0.2, 0.1],
                          [0.2, 0.1, 0.3, 0.3, 0.1],
                          [0.3, 0.3, 0.1, 0.1, 0.2],
                          [0.2, 0.2, 0.2, 0.2, 0.2],
                          [0.2, 0.2, 0.2, 0.2, 0.2]], dtype=torch.float64)  # token 4 is "end"
    return CountingBigram.from_probs(probs)


def test_stream_yields_the_generate_tokens_one_step_at_a_time() -> None:
    config = TransformerConfig.llama_style(vocab_size=13, d_model=16, n_layers=1, n_heads=2,
                                           n_kv_heads=1, max_seq_len=24)
    model = TransformerLM(config, generator=torch.Generator().manual_seed(0)).eval()
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    rules = dict(temperature=0.9, top_p=0.95, min_p=0.05, repetition_penalty=1.2)
    steps = list(stream(model, prompt, 9, generator=torch.Generator().manual_seed(3), **rules))
    assert len(steps) == 9 and all(s.shape == (2,) for s in steps)
    full = generate(model, prompt, 9, generator=torch.Generator().manual_seed(3), **rules)
    assert torch.equal(full, torch.cat([prompt, torch.stack(steps, 1)], 1))
    uncached = generate(model, prompt, 9, generator=torch.Generator().manual_seed(3),
                        use_cache=False, **rules)
    assert torch.equal(full, uncached)
    banned_repeats = generate(model, prompt, 9, temperature=0, no_repeat_ngram_size=1)
    for row, start in zip(banned_repeats[:, 3:].tolist(), prompt.tolist(), strict=True):
        assert len(set(row)) == 9 and not set(row) & set(start)  # n = 1: no token twice


def test_stop_token_ends_a_single_row_at_once() -> None:
    model = _stop_model()
    prompt = torch.tensor([[0]])
    free = generate(model, prompt, 40, generator=torch.Generator().manual_seed(2))[0, 1:].tolist()
    first = free.index(4)  # seed 2 reaches the end token early, then goes on
    assert 0 < first < 39
    model.calls = 0
    stopped = generate(model, prompt, 40, generator=torch.Generator().manual_seed(2), stop_ids=4)
    assert stopped[0, 1:].tolist() == free[:first + 1]  # same draws, cut after the stop token
    assert model.calls == first + 1  # prefill + one pass per token before it: none after it
    assert torch.equal(generate(model, prompt, 40, generator=torch.Generator().manual_seed(2),
                                stop_ids=[9, 4]), stopped)


def test_stopped_rows_are_padded_and_others_go_on() -> None:
    model = _stop_model()
    prompt = torch.tensor([[0], [1], [2]])
    free = generate(model, prompt, 30, generator=torch.Generator().manual_seed(5))[:, 1:]
    out = generate(model, prompt, 30, generator=torch.Generator().manual_seed(5), stop_ids=4,
                   pad_id=0)[:, 1:]
    ends = [row.tolist().index(4) if 4 in row.tolist() else 29 for row in free]
    assert out.shape == (3, max(ends) + 1)
    for b, end in enumerate(ends):
        assert out[b, :end + 1].tolist() == free[b, :end + 1].tolist()
        assert bool((out[b, end + 1:] == 0).all())
    assert len(set(ends)) > 1  # the rows did stop at different steps


def test_stream_is_lazy_and_restores_training_mode() -> None:
    model = _stop_model().train()
    it = stream(model, torch.tensor([[1]]), 10, generator=torch.Generator().manual_seed(0))
    assert model.calls == 0  # nothing runs before the first token is asked for
    next(it), next(it)
    assert model.calls == 2 and not model.training
    it.close()  # the caller stops early
    assert model.training


def test_stream_errors_are_raised_at_the_call() -> None:
    model = _stop_model()
    two = torch.tensor([[0], [1]])
    with pytest.raises(ValueError, match="pad_id is needed with stop_ids when B = 2"):
        stream(model, two, 5, stop_ids=4)
    with pytest.raises(ValueError, match="pad_id only pads rows that stopped"):
        stream(model, two, 5, pad_id=0)
    with pytest.raises(ValueError, match="stop_ids must be one or more token ids"):
        stream(model, two, 5, stop_ids=[], pad_id=0)
    with pytest.raises(TypeError, match="stop_ids must be an int or an iterable"):
        stream(model, two, 5, stop_ids="4", pad_id=0)
    with pytest.raises(ValueError, match="min_p must lie in"):
        stream(model, two, 5, min_p=1.5)
    with pytest.raises(ValueError, match="repetition penalty must be a positive"):
        generate(model, two, 5, repetition_penalty=0.0)
    lm = TransformerLM(TransformerConfig.gpt2_style(vocab_size=11, d_model=16, n_layers=1,
                                                   n_heads=2, max_seq_len=8))
    with pytest.raises(ValueError, match=r"pad_id must be a token id in \[0, 11\)"):
        stream(lm, torch.tensor([[1], [2]]), 3, stop_ids=2, pad_id=11)
    with pytest.raises(ValueError, match=r"previous_ids must lie in \[0, V=5\)"):
        repetition_penalty(torch.zeros(1, 5), torch.tensor([[5]]), 1.2)
    with pytest.raises(ValueError, match="leading shape of logits"):
        repetition_penalty(torch.zeros(2, 5), torch.tensor([[1]]), 1.2)


# ---------------------------------------------------------------- text in, text out


class ByteTokenizer:
    """One token per byte: multi-byte characters always span tokens."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode(errors="replace")


class ChunkTokenizer:
    """Tokens are fixed byte chunks (a token may end, and begin, inside a character)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def decode(self, ids: list[int]) -> str:
        return b"".join(self.chunks[i] for i in ids).decode(errors="replace")


def test_sample_text_starts_with_the_prompt() -> None:
    cfg = TransformerConfig.gpt2_style(vocab_size=256, d_model=16, n_layers=1, n_heads=2,
                                       max_seq_len=16)
    model = TransformerLM(cfg, generator=torch.Generator().manual_seed(0))
    text = sample_text(model, ByteTokenizer(), "abc", 5, temperature=0)
    ids = generate(model, torch.tensor([list(b"abc")]), 5, temperature=0)
    assert text == ByteTokenizer().decode(ids[0].tolist()) and text.startswith("abc")
    with pytest.raises(ValueError, match="prompt must encode"):
        sample_text(model, ByteTokenizer(), "", 5)


def test_incremental_decoder_emits_whole_characters() -> None:
    text = "héllo, 海 🌊!"
    decoder = IncrementalDecoder(ByteTokenizer())
    pieces = [decoder.push(b) for b in text.encode()] + [decoder.flush()]
    assert "".join(pieces) == text
    assert [p for p in pieces if p] == list(text)  # one character at a time, each whole
    assert pieces[text.encode().index("🌊".encode()):][:4] == ["", "", "", "🌊"]
    broken = IncrementalDecoder(ByteTokenizer())  # a stray lead byte stays U+FFFD at the end
    assert [broken.push(b) for b in b"a\xe6"] == ["a", ""] and broken.flush() == "\ufffd"
    assert broken.push(torch.tensor(98)) == "b"


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=30).filter(lambda s: "\ufffd" not in s), st.integers(1, 5))
def test_incremental_decoder_joins_to_the_full_decode(text: str, size: int) -> None:
    data = text.encode()
    chunks = [data[i:i + size] for i in range(0, len(data), size)]  # cut across characters
    tokenizer = ChunkTokenizer(chunks)
    decoder = IncrementalDecoder(tokenizer)
    pieces = [decoder.push(i) for i in range(len(chunks))] + [decoder.flush()]
    assert "".join(pieces) == text == tokenizer.decode(list(range(len(chunks))))
    assert not any("\ufffd" in p for p in pieces)


def test_sample_next_names_the_position_of_nan_or_inf_logits():
    logits = torch.zeros(2, 5)
    logits[1, 3] = float("nan")
    with pytest.raises(ValueError, match=r"logits\[1, 3\] = nan"):
        sample_next(logits)
    logits[1, 3] = float("inf")
    with pytest.raises(ValueError, match=r"logits\[1, 3\] = inf"):
        sample_next(logits, temperature=0)
    masked = torch.zeros(2, 5)
    masked[0, :4] = float("-inf")  # -inf masks a token: allowed while one token is left
    assert sample_next(masked, temperature=0).tolist() == [4, 0]
    masked[1] = float("-inf")
    with pytest.raises(ValueError, match="row 1 of logits is -inf for every token"):
        sample_next(masked)


# ---------------------------------------------------------------- measured acceptance rate


def test_acceptance_rate_worked_example() -> None:
    # step 1 accepts all 3, step 2 rejects its 2nd draft (1 accepted + 1 rejected, the 3rd never
    # tested), step 3 accepts its 2 (cut short near the end), step 4 drafts nothing: 6 / 7
    stats = SpeculativeStats(proposed=[3, 3, 2, 0], accepted=[3, 1, 2, 0])
    assert stats.acceptance_rate == 6 / 7
    assert SpeculativeStats(proposed=[2, 2], accepted=[0, 0]).acceptance_rate == 0.0
    assert math.isnan(SpeculativeStats().acceptance_rate)


def test_acceptance_rate_estimates_sum_of_min_p_q() -> None:
    # context-free p and q with exact fractions: alpha = sum_x min(p(x), q(x)) = 1/8 + 1/4 + 1/4 = 5/8
    p = [Fraction(1, 2), Fraction(1, 4), Fraction(1, 8), Fraction(1, 8)]
    q = [Fraction(1, 8), Fraction(1, 4), Fraction(1, 4), Fraction(3, 8)]
    alpha = sum(min(a, b) for a, b in zip(p, q, strict=True))
    assert alpha == Fraction(5, 8)
    p_t, q_t = (torch.tensor([float(x) for x in d], dtype=torch.float64) for d in (p, q))
    assert float(torch.minimum(p_t, q_t).sum()) == float(alpha)  # dyadic: exact in binary
    target, draft = BigramLM.from_probs(p_t.expand(4, 4)), BigramLM.from_probs(q_t.expand(4, 4))
    _, stats = speculative_generate(target, draft, torch.tensor([[0]]), 3000, gamma=3,
                                    generator=torch.Generator().manual_seed(11))
    tested = sum(stats.accepted) + sum(a < n for a, n in zip(stats.accepted, stats.proposed, strict=True))
    # independent Bernoulli(alpha) trials: 5 standard errors, fixed before the run
    assert abs(stats.acceptance_rate - float(alpha)) < 5 * math.sqrt(float(alpha * (1 - alpha)) / tested)
    # a draft equal to the target is always accepted (u q(x) < p(x) for u < 1)
    _, same = speculative_generate(target, BigramLM.from_probs(p_t.expand(4, 4)), torch.tensor([[0]]), 50,
                                   gamma=4, generator=torch.Generator().manual_seed(0))
    assert same.acceptance_rate == 1.0
