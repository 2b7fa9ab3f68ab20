"""Tests for llmbook.alignment.reward_model: the scalar-head model, its training and its scores.

The reward model is checked on small random transformers (float64 where an identity is
exact): it reads the final hidden state of the last token, starts at reward 0 (Bradley–Terry
loss log 2), freezes what it is told to, and learns a simple rule (reward = number of one
token) from preference pairs. The Bradley–Terry gradient is checked in closed form
(dL/dr_c = -sigma(r_r - r_c) / N). The Bayes ceiling is checked against a Monte Carlo
simulation of the labeller and against every other prediction rule; the correlations
against NumPy (Pearson) and pandas (Spearman with tied ranks). The shipped artifact is
loaded and its recorded test scores recomputed.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import gen

from llmbook.alignment.losses import bradley_terry_loss
from llmbook.alignment.preferences import PreferenceData, label_preferences
from llmbook.alignment.reward_model import (
    REWARD_MODEL_RECIPE,
    RewardModel,
    bayes_optimal_accuracy,
    evaluate_reward_model,
    load_reward_model,
    pairwise_accuracy,
    pearson_correlation,
    reward_model_loss,
    reward_model_step,
    spearman_correlation,
    train_reward_model,
)
from llmbook.alignment.shipped import ARTIFACTS
from llmbook.training.pretrained import models_dir
from llmbook.transformer.model import TransformerConfig, TransformerLM

pytestmark = pytest.mark.usefixtures("one_thread")

D = torch.float64
V, P, R = 11, 3, 5  # vocabulary, prompt and response lengths: nothing square


def backbone(seed: int = 0, n_layers: int = 2, dtype=D) -> TransformerLM:
    cfg = TransformerConfig.gpt2_style(vocab_size=V, d_model=16, n_layers=n_layers, n_heads=2,
                                       max_seq_len=12)
    return TransformerLM(cfg, generator=gen(seed)).to(dtype)


def random_head(model: RewardModel, seed: int = 1) -> RewardModel:
    with torch.no_grad():
        model.head.weight.copy_(torch.randn(model.head.weight.shape, generator=gen(seed), dtype=D))
        model.head.bias.fill_(0.3)
    return model


def keyword_pairs(n: int, seed: int, token: int = 3) -> PreferenceData:
    """Pairs whose true reward counts ``token``; the response with more of it is chosen (ties
    broken at random): a rule a small transformer can learn."""
    g = gen(seed)
    prompts = torch.randint(0, V, (n, P), generator=g)
    a, b = torch.randint(0, V, (n, R), generator=g), torch.randint(0, V, (n, R), generator=g)
    # more of the token in half of the responses, so that rewards spread out
    boost = torch.rand(n, R, generator=g) < 0.3
    a = torch.where(boost & (torch.rand(n, 1, generator=g) < 0.5), token, a)
    ra, rb = (a == token).sum(1).to(D), (b == token).sum(1).to(D)
    a_wins = (ra > rb) | ((ra == rb) & (torch.rand(n, generator=g) < 0.5))
    pick = a_wins[:, None]
    return PreferenceData(prompts, torch.where(pick, a, b), torch.where(pick, b, a),
                          torch.where(a_wins, ra, rb), torch.where(a_wins, rb, ra))


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


# ---------------------------------------------------------------- RewardModel


def test_untrained_reward_model_gives_zero_and_loss_log_2():
    model = RewardModel(backbone())
    data = keyword_pairs(6, seed=0)
    r = model(data.prompts, data.chosen)
    assert r.shape == (6,) and r.dtype == D and torch.equal(r, torch.zeros(6, dtype=D))
    out = reward_model_loss(model, data.prompts, data.chosen, data.rejected)
    assert float(out.loss.detach()) == pytest.approx(math.log(2), abs=1e-15)
    assert float(out.accuracy) == 0.5  # every pair tied


def test_reward_reads_the_last_token_hidden_state():
    model = random_head(RewardModel(backbone()))
    g = gen(2)
    prompts, responses = torch.randint(0, V, (4, P), generator=g), torch.randint(0, V, (4, R), generator=g)
    h = model.backbone.hidden_states(torch.cat([prompts, responses], 1))  # (4, P + R, d)
    expected = h[:, -1] @ model.head.weight[0] + model.head.bias[0]
    assert torch.allclose(model(prompts, responses), expected, rtol=0, atol=1e-14)
    # it depends on the whole prompt and response: change the first prompt token
    changed = prompts.clone()
    changed[:, 0] = (changed[:, 0] + 1) % V
    assert float((model(changed, responses) - expected).detach().abs().min()) > 1e-8


def test_reward_of_a_batch_equals_rewards_one_by_one():
    model = random_head(RewardModel(backbone()))
    data = keyword_pairs(5, seed=3)
    batch = model(data.prompts, data.chosen)
    alone = torch.stack([model(data.prompts[i:i + 1], data.chosen[i:i + 1])[0] for i in range(5)])
    assert torch.allclose(batch, alone, rtol=0, atol=1e-14)


def test_set_trainable_freezes_the_rest():
    model = RewardModel(backbone(n_layers=3), trainable_blocks=1)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in model.named_parameters()
                         if n.startswith(("backbone.blocks.2.", "backbone.final_norm.", "head."))}
    model.set_trainable(0)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        "backbone.final_norm.weight", "backbone.final_norm.bias", "head.weight", "head.bias"}
    model.set_trainable(0, train_embeddings=True)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        "backbone.embed.weight", "backbone.pos_embed.weight", "backbone.final_norm.weight",
        "backbone.final_norm.bias", "head.weight", "head.bias"}
    model.set_trainable(None)
    assert all(p.requires_grad for p in model.parameters())
    # frozen blocks get no gradient at all (autograd records nothing before block 2)
    model.set_trainable(1)
    random_head(model)
    data = keyword_pairs(4, seed=4)
    reward_model_loss(model, data.prompts, data.chosen, data.rejected).loss.backward()
    assert model.backbone.blocks[0].attn.q_proj.weight.grad is None
    assert model.backbone.embed.weight.grad is None
    assert float(model.backbone.blocks[2].attn.q_proj.weight.grad.abs().max()) > 0


def test_reward_model_bad_input():
    with pytest.raises(TypeError, match="TransformerLM"):
        RewardModel(torch.nn.Linear(3, 3))
    model = RewardModel(backbone())
    for k, err in ((3, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(err, match="trainable_blocks"):
            model.set_trainable(k)
    with pytest.raises(TypeError, match="train_embeddings"):
        model.set_trainable(1, train_embeddings=1)
    ids = torch.zeros(2, P, dtype=torch.long)
    with pytest.raises(ValueError, match="2 rows but response_ids has 3"):
        model(ids, torch.zeros(3, R, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(B, P\) and \(B, R\)"):
        model(ids, torch.zeros(R, dtype=torch.long))
    with pytest.raises(TypeError, match="integer"):
        model(ids.float(), torch.zeros(2, R, dtype=torch.long))
    with pytest.raises(ValueError, match="R >= 1"):
        model(ids, torch.zeros(2, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="max_seq_len"):
        model(ids, torch.zeros(2, 10, dtype=torch.long))  # P + R = 13 > 12


# ---------------------------------------------------------------- the loss and its gradient


@torch.no_grad()
def test_reward_model_loss_is_bradley_terry_of_the_rewards():
    model = random_head(RewardModel(backbone()))
    data = keyword_pairs(7, seed=5)
    out = reward_model_loss(model, data.prompts, data.chosen, data.rejected)
    r_c, r_r = model(data.prompts, data.chosen), model(data.prompts, data.rejected)
    assert torch.allclose(out.r_chosen, r_c, rtol=0, atol=1e-14)
    assert torch.allclose(out.r_rejected, r_r, rtol=0, atol=1e-14)
    by_hand = sum(-math.log(sigmoid(float(c - r))) for c, r in zip(r_c, r_r, strict=True)) / 7
    assert float(out.loss) == pytest.approx(by_hand, abs=1e-13)
    assert float(out.accuracy) == float(pairwise_accuracy(r_c.detach(), r_r.detach()))
    centred = reward_model_loss(model, data.prompts, data.chosen, data.rejected, center_coefficient=0.1)
    assert float(centred.loss) == pytest.approx(by_hand + 0.1 * float(((r_c + r_r) ** 2).mean()), abs=1e-13)


def test_bradley_terry_gradient_in_closed_form():
    r_c = torch.randn(6, generator=gen(6), dtype=D, requires_grad=True)
    r_r = torch.randn(6, generator=gen(7), dtype=D, requires_grad=True)
    g_c, g_r = torch.autograd.grad(bradley_terry_loss(r_c, r_r), (r_c, r_r))
    s = torch.sigmoid(r_r - r_c).detach() / 6  # the probability of the *wrong* order
    assert torch.allclose(g_c, -s, rtol=0, atol=1e-16) and torch.allclose(g_r, s, rtol=0, atol=1e-16)


def test_reward_model_loss_bad_input():
    model = RewardModel(backbone())
    ids = torch.zeros(3, P, dtype=torch.long)
    resp = torch.zeros(3, R, dtype=torch.long)
    with pytest.raises(ValueError, match="one shape"):
        reward_model_loss(model, ids, resp, resp[:, :2])
    with pytest.raises(ValueError, match="one shape"):
        reward_model_loss(model, ids[:2], resp, resp)
    with pytest.raises(ValueError, match="2-d"):
        reward_model_loss(model, ids, resp[0], resp[0])
    with pytest.raises(ValueError, match="no pairs"):
        reward_model_loss(model, ids[:0], resp[:0], resp[:0])


# ---------------------------------------------------------------- training


def test_reward_model_step_moves_only_trainable_parameters():
    model = RewardModel(backbone(), trainable_blocks=1)
    first_frozen = next(model.backbone.blocks[0].parameters())
    frozen = first_frozen.clone()
    data = keyword_pairs(16, seed=8)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    out = reward_model_step(model, opt, data.prompts, data.chosen, data.rejected)
    assert float(out.loss) == pytest.approx(math.log(2), abs=1e-15)  # computed before the step
    assert not out.loss.requires_grad and not out.r_chosen.requires_grad
    assert torch.equal(first_frozen, frozen)
    assert float(model.head.weight.detach().abs().max()) > 0  # the head moved off zero
    with pytest.raises(TypeError, match="Optimizer"):
        reward_model_step(model, "sgd", data.prompts, data.chosen, data.rejected)
    with pytest.raises(ValueError, match="grad_clip"):
        reward_model_step(model, opt, data.prompts, data.chosen, data.rejected, grad_clip=-1.0)


def test_train_reward_model_learns_a_counting_rule():
    torch.manual_seed(0)
    model = RewardModel(backbone(seed=1, n_layers=1, dtype=torch.float32))
    train, test = keyword_pairs(256, seed=9), keyword_pairs(128, seed=10)
    hist = train_reward_model(model, train, steps=120, batch_size=32, lr=1e-2, generator=gen(0),
                              warmup_steps=5, eval_data=test, eval_every=40)
    assert len(hist["loss"]) == len(hist["accuracy"]) == len(hist["lr"]) == 120
    assert hist["eval_step"] == [40, 80, 120]
    assert hist["lr"][0] == pytest.approx(1e-2 / 5) and hist["lr"][4] == pytest.approx(1e-2)
    assert hist["lr"][-1] < 1e-4  # cosine decay to 0
    assert hist["eval_accuracy"][-1] > 0.8 and hist["eval_loss"][-1] < 0.45
    assert not model.training
    scores = evaluate_reward_model(model, test, scale=1.0)
    assert scores["accuracy"] == pytest.approx(hist["eval_accuracy"][-1], abs=1e-12)
    assert scores["spearman"] > 0.7 and scores["pearson"] > 0.7


def test_train_reward_model_bad_input():
    model, data = RewardModel(backbone()), keyword_pairs(8, seed=11)
    with pytest.raises(ValueError, match="exceeds the number of pairs"):
        train_reward_model(model, data, 1, 9, 1e-3, gen(0))
    with pytest.raises(ValueError, match="steps"):
        train_reward_model(model, data, 0, 4, 1e-3, gen(0))
    with pytest.raises(ValueError, match="^lr must be a positive"):
        train_reward_model(model, data, 1, 4, 0.0, gen(0))
    with pytest.raises(TypeError, match="PreferenceData"):
        train_reward_model(model, tuple(data), 1, 4, 1e-3, gen(0))
    with pytest.raises(TypeError, match="RewardModel"):
        train_reward_model(model.backbone, data, 1, 4, 1e-3, gen(0))


# ---------------------------------------------------------------- accuracy and its ceiling


def test_pairwise_accuracy_worked_example():
    r_c = torch.tensor([2.0, 0.0, 1.0, -1.0])
    r_r = torch.tensor([1.0, 0.0, 3.0, -2.0])
    assert float(pairwise_accuracy(r_c, r_r)) == (1 + 0.5 + 0 + 1) / 4
    with pytest.raises(ValueError, match="one shape"):
        pairwise_accuracy(r_c, r_r[:3])
    with pytest.raises(ValueError, match="N >= 1"):
        pairwise_accuracy(r_c[:0], r_r[:0])
    with pytest.raises(TypeError, match="floating"):
        pairwise_accuracy(r_c.long(), r_r.long())


def test_bayes_optimal_accuracy_worked_example():
    a, b = torch.tensor([0.0, 1.0, 0.0, 3.0], dtype=D), torch.tensor([0.0, 0.0, 2.0, 3.0], dtype=D)
    expected = (0.5 + sigmoid(1) + sigmoid(2) + 0.5) / 4
    assert float(bayes_optimal_accuracy(a, b, 1.0)) == pytest.approx(expected, abs=1e-15)
    assert float(bayes_optimal_accuracy(b, a, 1.0)) == pytest.approx(expected, abs=1e-15)
    expected2 = (0.5 + sigmoid(2) + sigmoid(4) + 0.5) / 4  # a sharper labeller: higher ceiling
    assert float(bayes_optimal_accuracy(a, b, 2.0)) == pytest.approx(expected2, abs=1e-15)
    for bad in (0.0, -1.0, math.inf, True, "1"):
        with pytest.raises(ValueError, match="scale"):
            bayes_optimal_accuracy(a, b, bad)
    with pytest.raises(ValueError, match="one shape"):
        bayes_optimal_accuracy(a, b[:2], 1.0)


def test_bayes_ceiling_is_what_the_true_reward_scores_on_simulated_labels():
    g = gen(12)
    ra = torch.randint(0, 4, (400,), generator=g).to(D)
    rb = torch.randint(0, 4, (400,), generator=g).to(D)
    ceiling = float(bayes_optimal_accuracy(ra, rb, 1.0))
    scores = []
    for _ in range(200):  # relabel the same pairs 200 times; predict with the true reward
        a_wins = label_preferences(ra, rb, 1.0, g)
        r_c, r_r = torch.where(a_wins, ra, rb), torch.where(a_wins, rb, ra)
        scores.append(float(pairwise_accuracy(r_c, r_r)))
    # mean of 200 x 400 Bernoulli-like scores: standard error < 0.002
    assert abs(np.mean(scores) - ceiling) < 0.008


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4), st.floats(0, 1)), min_size=1, max_size=20),
       st.floats(0.1, 5.0))
@settings(max_examples=50, deadline=None)
def test_no_prediction_rule_beats_the_bayes_ceiling(pairs, scale):
    """A rule that picks a with probability q is right with probability
    q sigma(s d) + (1 - q) sigma(-s d), never more than sigma(s |d|)."""
    ra = torch.tensor([p[0] for p in pairs], dtype=D)
    rb = torch.tensor([p[1] for p in pairs], dtype=D)
    q = torch.tensor([p[2] for p in pairs], dtype=D)
    p_a = torch.sigmoid(scale * (ra - rb))
    rule = (q * p_a + (1 - q) * (1 - p_a)).mean()
    assert float(rule) <= float(bayes_optimal_accuracy(ra, rb, scale)) + 1e-15


# ---------------------------------------------------------------- correlations


def test_pearson_against_numpy_and_invariances():
    g = gen(13)
    x = torch.randn(50, generator=g, dtype=D)
    y = 0.7 * x + torch.randn(50, generator=g, dtype=D)
    r = float(pearson_correlation(x, y))
    assert r == pytest.approx(float(np.corrcoef(x.numpy(), y.numpy())[0, 1]), abs=1e-14)
    assert float(pearson_correlation(3 * x + 1, y)) == pytest.approx(r, abs=1e-14)
    assert float(pearson_correlation(x, -y)) == pytest.approx(-r, abs=1e-14)
    assert float(pearson_correlation(x, x)) == pytest.approx(1.0, abs=1e-15)
    assert float(pearson_correlation(x.float(), y.float())) == pytest.approx(r, abs=1e-6)


def test_spearman_with_ties_against_pandas():
    pd = pytest.importorskip("pandas")
    g = gen(14)
    true = torch.randint(0, 4, (60,), generator=g).to(D)  # many ties, like keyword counts
    learned = true + 0.8 * torch.randn(60, generator=g, dtype=D)
    ours = float(spearman_correlation(learned, true))
    # pandas' average ranks (scipy, which pandas' own Spearman needs, is not installed)
    ranks = [pd.Series(v.numpy()).rank(method="average").to_numpy() for v in (learned, true)]
    peer = float(np.corrcoef(*ranks)[0, 1])
    assert ours == pytest.approx(peer, abs=1e-14)
    # rank-based: any increasing transformation leaves it unchanged
    assert float(spearman_correlation(torch.exp(learned), true ** 3)) == pytest.approx(ours, abs=1e-14)
    # tied ranks are averaged: [10, 20, 20, 30] has ranks [1, 2.5, 2.5, 4]
    x = torch.tensor([10.0, 20.0, 20.0, 30.0], dtype=D)
    assert float(spearman_correlation(x, torch.tensor([1.0, 2.5, 2.5, 4.0], dtype=D))) == pytest.approx(1.0, abs=1e-15)


def test_correlation_bad_input():
    x = torch.arange(5.0)
    with pytest.raises(ValueError, match="constant"):
        pearson_correlation(x, torch.ones(5))
    with pytest.raises(ValueError, match="constant"):
        spearman_correlation(torch.ones(5), x)
    with pytest.raises(ValueError, match="N >= 2"):
        pearson_correlation(x[:1], x[:1])
    with pytest.raises(ValueError, match="one shape"):
        spearman_correlation(x, x[:4])
    with pytest.raises(TypeError, match="floating"):
        pearson_correlation(x.long(), x.long())


# ---------------------------------------------------------------- evaluation


def test_evaluate_reward_model_reports_every_score():
    model = random_head(RewardModel(backbone()))
    data = keyword_pairs(20, seed=15)
    s = evaluate_reward_model(model, data, scale=1.0)
    untied = data.reward_chosen != data.reward_rejected
    assert s["true_reward_accuracy"] == float(pairwise_accuracy(data.reward_chosen, data.reward_rejected))
    assert s["bayes_accuracy_non_tied"] == pytest.approx(
        float(torch.sigmoid((data.reward_chosen - data.reward_rejected)[untied].abs()).mean()), abs=1e-15)
    assert len(s["learned_rewards"]) == len(s["true_rewards"]) == 40
    assert s["true_rewards"][:20] == data.reward_chosen.tolist()
    r_c = model(data.prompts, data.chosen).detach()
    assert s["learned_rewards"][:20] == pytest.approx(r_c.tolist(), abs=1e-14)
    assert 0 <= s["accuracy"] <= 1 and -1 <= s["pearson"] <= 1 and -1 <= s["spearman"] <= 1
    assert model.training  # evaluation leaves the mode as it found it
    tied = data._replace(reward_rejected=data.reward_chosen.clone())
    with pytest.raises(ValueError, match="tied"):
        evaluate_reward_model(model, tied, 1.0)
    with pytest.raises(TypeError, match="PreferenceData"):
        evaluate_reward_model(model, tuple(data), 1.0)


# ---------------------------------------------------------------- the shipped artifact


def test_artifact_is_registered_with_a_json_recipe():
    art = ARTIFACTS["reward_model"]
    assert art.module == "llmbook.alignment.reward_model" and art.recipe is REWARD_MODEL_RECIPE


@pytest.mark.skipif(not (models_dir() / "reward_model" / "info.json").is_file(),
                    reason="the reward_model artifact is not written yet")
def test_shipped_reward_model_loads_and_reproduces_its_scores():
    from llmbook.alignment.preferences import preference_data
    from llmbook.training.pretrained import book_model

    model, info = load_reward_model()
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    base, _ = book_model("text")
    k = REWARD_MODEL_RECIPE["trainable_blocks"]
    first_frozen = len(base.blocks) - k - 1
    assert torch.equal(model.backbone.blocks[first_frozen].attn.q_proj.weight,
                       base.blocks[first_frozen].attn.q_proj.weight)  # frozen: the text model's
    assert not torch.equal(model.backbone.blocks[-k].attn.q_proj.weight, base.blocks[-k].attn.q_proj.weight)
    assert not torch.equal(model.backbone.embed.weight, base.embed.weight)  # trained
    size = (models_dir() / "reward_model" / "tensors.safetensors").stat().st_size
    assert size < 3_000_000
    test = preference_data("test")
    scores = evaluate_reward_model(model, test, 1.0)
    shipped = info["test"]
    assert abs(scores["accuracy"] - shipped["accuracy"]) <= 2 / 512
    assert scores["pearson"] == pytest.approx(shipped["pearson"], abs=1e-4)
    assert len(info["history"]["loss"]) == REWARD_MODEL_RECIPE["steps"]
    assert shipped["accuracy"] < shipped["bayes_accuracy"] + 0.05
    assert shipped["pearson"] > 0.3
