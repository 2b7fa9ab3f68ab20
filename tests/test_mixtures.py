"""llmbook.training.mixtures: temperature sampling, epochs, the sampler, the data-mixing law."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.inference.sampling import chi_square_test
from llmbook.training.mixtures import (
    CATEGORIES,
    PUBLISHED_MIXTURES,
    SYNTHETIC_OFFSET,
    book_sources,
    category_shares,
    epochs_per_source,
    fit_mixing_law,
    mixing_law,
    mixture_batch,
    sample_sources,
    synthetic_mixture_source,
    temperature_weights,
    total_variation,
    train_on_mixture,
)
from llmbook.training.train import TrainConfig
from llmbook.transformer.model import TransformerConfig, TransformerLM

pytestmark = pytest.mark.usefixtures("one_thread")

sizes_strategy = st.lists(st.floats(1.0, 1e12), min_size=1, max_size=6)


# ---------------------------------------------------------------- temperature and epochs


def test_temperature_weights_worked_example():
    # sizes 1, 4, 16: alpha = 1 -> 1/21, 4/21, 16/21; alpha = 1/2 -> 1/7, 2/7, 4/7
    np.testing.assert_allclose(temperature_weights([1, 4, 16], 1), [1 / 21, 4 / 21, 16 / 21],
                               rtol=1e-15)
    np.testing.assert_allclose(temperature_weights([1, 4, 16], 0.5), [1 / 7, 2 / 7, 4 / 7],
                               rtol=1e-15)
    np.testing.assert_allclose(temperature_weights([1, 4, 16], 0), [1 / 3] * 3, rtol=1e-15)


@settings(max_examples=60, deadline=None)
@given(sizes_strategy, st.floats(0.0, 2.0))
def test_temperature_weights_properties(sizes, alpha):
    p = temperature_weights(sizes, alpha)
    assert p.shape == (len(sizes),) and np.all(p > 0)
    assert abs(p.sum() - 1) < 1e-12
    # ratios follow (n_i / n_j)^alpha; order follows size for alpha > 0
    i, j = int(np.argmax(sizes)), int(np.argmin(sizes))
    assert math.isclose(p[i] / p[j], (sizes[i] / sizes[j]) ** alpha, rel_tol=1e-9)


@settings(max_examples=40, deadline=None)
@given(sizes_strategy, st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_lower_alpha_moves_weight_to_the_smallest_source(sizes, a1, a2):
    lo, hi = sorted((a1, a2))
    j = int(np.argmin(sizes))
    assert temperature_weights(sizes, lo)[j] >= temperature_weights(sizes, hi)[j] - 1e-12


def test_temperature_weights_huge_sizes_do_not_overflow():
    p = temperature_weights([1e300, 1e300, 1.0], 2.0)
    np.testing.assert_allclose(p, [0.5, 0.5, 0.0], atol=1e-300)


def test_epochs_worked_example_and_gpt3_rows():
    np.testing.assert_allclose(epochs_per_source([0.5, 0.5], [100, 10], 1000), [5.0, 50.0])
    # GPT-3's Table 2.2: Common Crawl 60 % of 300B tokens over 410B tokens = 0.44 epochs
    comps = PUBLISHED_MIXTURES["GPT-3"]["components"]
    weights = [v[0] / 100 for v in comps.values()]
    sizes = [v[1] for v in comps.values()]
    # weights sum to 101 %, so pass the unnormalised shares as a budget scale
    e = np.array(weights) * 300 / np.array(sizes)
    assert e[0] == pytest.approx(0.44, abs=0.005)
    assert epochs_per_source(weights, sizes, 300)[0] == pytest.approx(e[0] / 1.01)


@settings(max_examples=40, deadline=None)
@given(sizes_strategy, st.floats(1.0, 1e13))
def test_proportional_sampling_gives_equal_epochs(sizes, budget):
    e = epochs_per_source(temperature_weights(sizes, 1.0), sizes, budget)
    np.testing.assert_allclose(e, budget / sum(sizes), rtol=1e-9)


def test_temperature_and_epochs_bad_input():
    with pytest.raises(ValueError, match="sizes must be positive"):
        temperature_weights([1, 0], 1)
    with pytest.raises(ValueError, match="alpha must be"):
        temperature_weights([1, 2], -1)
    with pytest.raises(ValueError, match="alpha must be"):
        temperature_weights([1, 2], float("nan"))
    with pytest.raises(TypeError, match="sizes must be a sequence"):
        temperature_weights("12", 1)
    with pytest.raises(ValueError, match="same length"):
        epochs_per_source([0.5, 0.5], [1, 2, 3], 10)
    with pytest.raises(ValueError, match="budget must be"):
        epochs_per_source([0.5, 0.5], [1, 2], 0)
    with pytest.raises(ValueError, match="weights must be non-negative"):
        epochs_per_source([-0.5, 1.5], [1, 2], 10)
    with pytest.raises(ValueError, match="weights must have a positive sum"):
        epochs_per_source([0, 0], [1, 2], 10)


# ---------------------------------------------------------------- the sampler


def test_sample_sources_chi_square_and_seeding():
    p = np.array([0.5, 0.3, 0.15, 0.05])
    draws = sample_sources(p, 40_000, torch.Generator().manual_seed(0))
    assert draws.shape == (40_000,) and draws.dtype == torch.long
    stat, df, pvalue = chi_square_test(draws, torch.from_numpy(p))
    assert df == 3 and pvalue > 1e-3
    # a wrong distribution is rejected by the same test
    assert chi_square_test(draws, torch.tensor([0.25, 0.25, 0.25, 0.25]))[2] < 1e-10
    again = sample_sources(p, 40_000, torch.Generator().manual_seed(0))
    assert torch.equal(draws, again)
    # unnormalised weights mean the same distribution
    assert torch.equal(sample_sources(p * 7, 1000, torch.Generator().manual_seed(3)),
                       sample_sources(p, 1000, torch.Generator().manual_seed(3)))


def test_sample_sources_zero_weight_is_never_drawn():
    draws = sample_sources([0.0, 1.0, 0.0], 500, torch.Generator().manual_seed(1))
    assert bool((draws == 1).all())


def test_mixture_batch_rows_come_from_their_source():
    # three sources with disjoint id ranges: each row's ids name the source it came from
    sources = [np.arange(0, 50, dtype=np.int64), np.arange(100, 133, dtype=np.int64),
               torch.arange(200, 290)]
    x, y, src = mixture_batch(sources, [0.2, 0.3, 0.5], 64, 7, torch.Generator().manual_seed(0))
    assert x.shape == (64, 7) and y.shape == (64, 7) and src.shape == (64,)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    assert torch.equal(y - x, torch.ones_like(x))  # consecutive ids within each source
    assert torch.equal(x // 100, src[:, None].expand_as(x))
    assert set(src.tolist()) == {0, 1, 2}


def test_mixture_batch_proportions_chi_square():
    sources = [np.arange(20), np.arange(30), np.arange(40)]
    g = torch.Generator().manual_seed(5)
    p = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    src = torch.cat([mixture_batch(sources, p.numpy(), 100, 5, g)[2] for _ in range(100)])
    assert chi_square_test(src, p)[2] > 1e-3


def test_mixture_batch_bad_input():
    with pytest.raises(ValueError, match="weights has 2 entries for 3 sources"):
        mixture_batch([np.arange(10)] * 3, [0.5, 0.5], 2, 4)
    with pytest.raises(ValueError, match=r"sources\[1\] has 4 tokens"):
        mixture_batch([np.arange(10), np.arange(4)], [0.5, 0.5], 2, 4)
    with pytest.raises(TypeError, match=r"sources\[0\] must hold integer"):
        mixture_batch([np.zeros(10)], [1.0], 2, 4)
    with pytest.raises(TypeError, match="sources must be a non-empty sequence"):
        mixture_batch([], [1.0], 2, 4)
    with pytest.raises(ValueError, match="batch_size must be"):
        mixture_batch([np.arange(10)], [1.0], 0, 4)
    with pytest.raises(ValueError, match="num_draws must be"):
        sample_sources([1.0], 0)


def test_train_on_mixture_is_seeded_and_learns():
    sources = [np.arange(300) % 7, (np.arange(300) % 5) + 7]
    cfg = TransformerConfig.gpt2_style(vocab_size=12, d_model=16, n_layers=1, n_heads=2,
                                       max_seq_len=8)
    tc = TrainConfig(steps=40, batch_size=8, context_length=8, lr=1e-2, min_lr=1e-3,
                     warmup_steps=5, eval_every=None)
    runs = []
    for _ in range(2):
        model = TransformerLM(cfg, generator=torch.Generator().manual_seed(0))
        runs.append(train_on_mixture(model, sources, [0.5, 0.5], tc))
    assert runs[0] == runs[1] and len(runs[0]) == 40
    # stop_at replays the first steps of the same schedule exactly
    model = TransformerLM(cfg, generator=torch.Generator().manual_seed(0))
    assert train_on_mixture(model, sources, [0.5, 0.5], tc, stop_at=12) == runs[0][:12]
    with pytest.raises(ValueError, match="stop_at must be"):
        train_on_mixture(model, sources, [0.5, 0.5], tc, stop_at=0)
    assert runs[0][-1] < 0.5 * runs[0][0]  # the periodic sequences are learnable
    with pytest.raises(TypeError, match="config must be a TrainConfig"):
        train_on_mixture(model, sources, [0.5, 0.5], {"steps": 1})


def test_synthetic_mixture_source_entropies():
    src = synthetic_mixture_source()
    assert src.order == 1 and src.vocab_size == 16
    p = src.stationary
    unigram = float(-(p * p.log()).sum())
    assert src.entropy_rate() == pytest.approx(1.7744, abs=1e-4)
    assert unigram == pytest.approx(2.6806, abs=1e-4) and unigram > src.entropy_rate()


def test_book_sources_shapes_and_vocabulary():
    src = book_sources(num_synthetic=5000)
    assert list(src) == ["synthetic", "prose", "docs"]
    for train, val in src.values():
        assert train.dtype == np.uint16 and val.dtype == np.uint16
        assert len(val) == pytest.approx(len(train) / 9, rel=1e-3, abs=2)
    syn = np.concatenate(src["synthetic"])
    assert syn.min() >= SYNTHETIC_OFFSET and syn.max() < SYNTHETIC_OFFSET + 16
    assert np.concatenate(src["prose"]).max() < 256 and len(src["docs"][0]) > 10 * len(src["prose"][0])
    with pytest.raises(ValueError, match="val_fraction"):
        book_sources(val_fraction=1.0)
    with pytest.raises(ValueError, match="num_synthetic"):
        book_sources(num_synthetic=10)


# ---------------------------------------------------------------- the data-mixing law


def test_mixing_law_worked_example():
    r = np.array([[0.5, 0.5], [1.0, 0.0], [0.25, 0.75]])
    c, k, t = np.array([1.0, 2.0]), np.array([0.5, 3.0]), np.array([[-2.0, 0.0], [0.0, -1.0]])
    got = mixing_law(r, c, k, t)
    expected = np.array([[1 + 0.5 * math.exp(-1), 2 + 3 * math.exp(-0.5)],
                         [1 + 0.5 * math.exp(-2), 2 + 3.0],
                         [1 + 0.5 * math.exp(-0.5), 2 + 3 * math.exp(-0.75)]])
    np.testing.assert_allclose(got, expected, rtol=1e-15)
    with pytest.raises(ValueError, match="need c"):
        mixing_law(r, c, k, t[:, :1])
    with pytest.raises(ValueError, match="r must be"):
        mixing_law(r[0], c, k, t)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_recovers_known_parameters_off_the_simplex(seed):
    rng = np.random.default_rng(seed)
    r = rng.uniform(0, 1, size=(15, 3))  # off the simplex: every parameter is identifiable
    c = rng.uniform(0.5, 3, size=2)
    k = rng.uniform(0.2, 2, size=2)
    t = rng.uniform(-3, 1, size=(2, 3))
    fit = fit_mixing_law(r, mixing_law(r, c, k, t))
    np.testing.assert_allclose(fit.c, c, atol=1e-7)
    np.testing.assert_allclose(fit.k, k, rtol=1e-6)
    np.testing.assert_allclose(fit.t, t, atol=1e-6)
    assert np.all(fit.rmse < 1e-9)


def test_fit_on_the_simplex_predicts_a_held_out_mixture():
    rng = np.random.default_rng(3)
    r = rng.dirichlet(np.ones(3), size=9)  # (9, 3) on the simplex
    c, k = np.array([1.6, 2.2, 2.9]), np.array([1.0, 0.7, 1.5])
    t = np.array([[-3.0, 0.2, 0.1], [0.3, -2.0, 0.0], [0.0, 0.4, -1.5]])
    losses = mixing_law(r, c, k, t)
    fit = fit_mixing_law(r[:8], losses[:8])
    np.testing.assert_allclose(fit.predict(r[8:]), losses[8:], atol=1e-6)
    np.testing.assert_allclose(fit.c, c, atol=1e-5)
    # only k exp(t_iK) and the differences t_ij - t_iK are identified on the simplex
    np.testing.assert_allclose(np.log(fit.k) + fit.t[:, 2], np.log(k) + t[:, 2], atol=1e-5)
    np.testing.assert_allclose(fit.t - fit.t[:, 2:], t - t[:, 2:], atol=1e-5)


def test_fit_with_noise_is_within_the_noise():
    rng = np.random.default_rng(4)
    r = rng.dirichlet(np.ones(3), size=30)
    c, k, t = np.array([2.0]), np.array([1.0]), np.array([[-2.5, 0.5, 0.0]])
    clean = mixing_law(r, c, k, t)
    noisy = clean + 0.003 * rng.standard_normal(clean.shape)
    fit = fit_mixing_law(r, noisy)
    assert 0.002 < fit.rmse[0] < 0.004
    assert np.abs(fit.predict(r) - clean).max() < 0.004


def test_fit_bad_input():
    r = np.full((4, 3), 1 / 3)
    with pytest.raises(ValueError, match="same M"):
        fit_mixing_law(r, np.ones((5, 1)))
    with pytest.raises(ValueError, match="at least 3 mixtures"):
        fit_mixing_law(r[:2], np.ones((2, 1)))
    with pytest.raises(ValueError, match="finite"):
        fit_mixing_law(r, np.full((4, 1), np.nan))
    with pytest.raises(ValueError, match="iterations"):
        fit_mixing_law(r, np.ones((4, 1)), iterations=0)


# ---------------------------------------------------------------- published mixtures


def test_published_weights_sum_to_100_percent():
    sums = {name: sum(v[0] for v in m["components"].values())
            for name, m in PUBLISHED_MIXTURES.items()}
    # GPT-3's printed weights sum to 101 % (each rounded to a whole percent)
    assert sums["GPT-3"] == pytest.approx(101.0)
    assert sums["LLaMA"] == pytest.approx(100.0)
    assert sums["The Pile"] == pytest.approx(100.0, abs=0.01)


def test_pile_weights_are_effective_size_over_total():
    # Gao et al. (2020), Table 1: weight = raw size x epochs / 1254.20 GiB, to the printed 0.01 %
    comps = PUBLISHED_MIXTURES["The Pile"]["components"]
    effective = {n: v[1] * v[2] for n, v in comps.items()}
    total = sum(effective.values())
    assert total == pytest.approx(1254.20, abs=0.02)
    for name, (weight, *_rest) in comps.items():
        assert 100 * effective[name] / total == pytest.approx(weight, abs=0.011), name


def test_gpt3_and_llama_epoch_columns():
    gpt3 = PUBLISHED_MIXTURES["GPT-3"]["components"]
    computed = {n: v[0] / 100 * 300 / v[1] for n, v in gpt3.items()}
    # the table's own epochs follow from weight x 300B / size for three rows ...
    for name in ("Common Crawl (filtered)", "Books1", "Books2"):
        assert computed[name] == pytest.approx(gpt3[name][2], rel=0.06), name
    # ... and not for WebText2 and Wikipedia
    assert abs(computed["WebText2"] / gpt3["WebText2"][2] - 1) > 0.15
    llama = PUBLISHED_MIXTURES["LLaMA"]["components"]
    assert all(0.5 < v[2] < 2.5 for v in llama.values())
    assert sum(v[0] for v in llama.values() if v[-1] == "web") == pytest.approx(82.0)


def test_category_shares():
    shares = category_shares({"a": (10.0, "web"), "b": (5.0, 3.0, "code"), "c": (2.5, "web")})
    assert list(shares) == list(CATEGORIES)
    assert shares["web"] == 12.5 and shares["code"] == 5.0 and shares["books"] == 0.0
    for m in PUBLISHED_MIXTURES.values():
        total = sum(v[0] for v in m["components"].values())
        assert sum(category_shares(m["components"]).values()) == pytest.approx(total)
    with pytest.raises(ValueError, match="category 'blogs'"):
        category_shares({"a": (1.0, "blogs")})
    with pytest.raises(TypeError, match="non-empty mapping"):
        category_shares({})
    with pytest.raises(ValueError, match=r"components\['a'\] must be a tuple"):
        category_shares({"a": 3.0})


def test_total_variation_worked_examples_and_properties():
    assert total_variation({"a": 60, "b": 40}, {"a": 0.5, "b": 0.5}) == pytest.approx(0.1, abs=1e-15)
    assert total_variation({"a": 1, "b": 0}, {"a": 0, "b": 3}) == 1.0  # disjoint
    assert total_variation({"x": 2, "y": 2}, {"y": 5, "x": 5}) == 0.0  # order and scale do not matter
    a, b, c = {"p": 1, "q": 2, "r": 3}, {"p": 3, "q": 2, "r": 1}, {"p": 0, "q": 1, "r": 0}
    assert total_variation(a, b) == pytest.approx(1 / 3, abs=1e-15)
    assert total_variation(a, b) == total_variation(b, a)
    assert total_variation(a, c) <= total_variation(a, b) + total_variation(b, c) + 1e-15


def test_total_variation_bad_input():
    with pytest.raises(ValueError, match="same categories"):
        total_variation({"a": 1}, {"b": 1})
    with pytest.raises(TypeError, match="a must be a non-empty mapping"):
        total_variation({}, {"b": 1})
    with pytest.raises(ValueError, match="b must be non-negative"):
        total_variation({"a": 1, "b": 1}, {"a": 2, "b": -1})
    with pytest.raises(ValueError, match="a must have a positive sum"):
        total_variation({"a": 0, "b": 0}, {"a": 2, "b": 1})
