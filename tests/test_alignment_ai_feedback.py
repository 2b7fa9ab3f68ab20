"""AI feedback (notebooks/19b_constitutional_ai): the judge's read-out, batching, statistics, the noisy-label target."""

from __future__ import annotations

import math

import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.alignment.ai_feedback import (
    PRINCIPLE,
    ai_label_probability,
    ai_label_probability_symbolic,
    best_of_n_gold,
    best_of_n_kl,
    calibrated_preference,
    choice_probability,
    critique_and_revise,
    greedy_generate,
    judge_both_orders,
    judge_messages,
    judge_statistics,
    left_pad,
    next_token_logits,
    wilson_interval,
)
from llmbook.inference.sampling import generate
from llmbook.transformer.model import TransformerConfig, TransformerLM

f64 = torch.float64
pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_model(positions: str = "rope", seed: int = 0) -> TransformerLM:
    torch.manual_seed(seed)
    c = TransformerConfig(vocab_size=61, d_model=24, n_layers=2, n_heads=3, n_kv_heads=1, d_head=8, d_ff=40,
                          max_seq_len=512, positions=positions, norm="rmsnorm", mlp="swiglu")
    return TransformerLM(c).eval()


class CharTokenizer:
    """A stand-in for the chat tokenizer: one token per character (mod 60), 60 = end of turn."""

    stop_token_ids = (60,)

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 60 for c in text]

    def encode_chat(self, messages, add_generation_prompt: bool = True) -> list[int]:
        ids = []
        for m in messages:
            ids += self.encode(m["role"][0] + m["content"]) + [60]
        return ids + (self.encode("a") if add_generation_prompt else [])

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(48 + i % 60) for i in ids if not (skip_special_tokens and i == 60))


# ---------------------------------------------------------------- the read-out


def test_choice_probability_worked_example():
    logits = torch.tensor([[0.0, 2.0, math.log(3.0), 5.0], [1.0, 1.0, 1.0, -9.0]], dtype=f64)
    # first = token 2 (log 3), second = token 0 (0): P = 3 / (3 + 1)
    assert choice_probability(logits, 2, 0).tolist() == pytest.approx([0.75, 0.5], abs=1e-15)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-20, 20), min_size=5, max_size=5))
def test_choice_probability_is_a_two_token_softmax(values):
    z = torch.tensor(values, dtype=f64)
    p = choice_probability(z, 1, 3)
    assert float(p) == pytest.approx(float(torch.softmax(z[[1, 3]], 0)[0]), abs=1e-12)
    assert float(p + choice_probability(z, 3, 1)) == pytest.approx(1.0, abs=1e-12)


def test_choice_probability_bad_input():
    with pytest.raises(ValueError, match="first_id"):
        choice_probability(torch.zeros(4), 4, 0)
    with pytest.raises(ValueError, match="differ"):
        choice_probability(torch.zeros(4), 1, 1)
    with pytest.raises(TypeError, match="logits must be a floating-point tensor"):
        choice_probability(torch.zeros(4, dtype=torch.long), 0, 1)


def test_judge_messages_shows_both_texts_in_order():
    m = judge_messages(" first text", "second text ")
    assert m[0]["role"] == "system" and m[1]["role"] == "user"
    body = m[1]["content"]
    assert body.startswith(PRINCIPLE)
    assert body.index("Text A: first text") < body.index("Text B: second text")
    with pytest.raises(TypeError, match="second"):
        judge_messages("a", 3)


# ---------------------------------------------------------------- batching with left padding


def test_left_pad_worked_example():
    ids, pos, real = left_pad([[5, 6, 7], [9]], pad_id=1)
    assert ids.tolist() == [[5, 6, 7], [1, 1, 9]]
    assert pos.tolist() == [[0, 1, 2], [0, 0, 0]]
    assert real.tolist() == [[True, True, True], [False, False, True]]
    with pytest.raises(ValueError, match=">= 1 token"):
        left_pad([[1], []])
    with pytest.raises(ValueError, match="non-empty"):
        left_pad([])


@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_next_token_logits_match_each_sequence_alone(positions):
    model = tiny_model(positions)
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 61, (n,), generator=gen).tolist() for n in (7, 3, 11, 1, 5)]
    batched = next_token_logits(model, seqs, batch_size=3)
    assert batched.shape == (5, 61)
    with torch.no_grad():
        alone = torch.stack([model(torch.tensor([s]))[0, -1] for s in seqs])
    assert torch.allclose(batched, alone, atol=1e-5)


def test_greedy_generate_matches_unbatched_greedy_decoding():
    model = tiny_model()
    gen = torch.Generator().manual_seed(2)
    seqs = [torch.randint(0, 61, (n,), generator=gen).tolist() for n in (6, 2, 9)]
    out = greedy_generate(model, seqs, 7, stop_ids=[], batch_size=2)
    for s, o in zip(seqs, out, strict=True):
        ref = generate(model, torch.tensor([s]), 7, temperature=0)[0, len(s):].tolist()
        assert o == ref
    # a stop token ends a row before it: stop on each row's third greedy token
    stops = {o[2] for o in out}
    cut = greedy_generate(model, seqs, 7, stop_ids=sorted(stops), batch_size=3)
    for o, c in zip(out, cut, strict=True):
        first = min(i for i, t in enumerate(o) if t in stops)
        assert c == o[:first]
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_generate(model, seqs, 0, stop_ids=[])
    with pytest.raises(TypeError, match="TransformerLM"):
        greedy_generate(torch.nn.Linear(2, 2), seqs, 2, stop_ids=[])


# ---------------------------------------------------------------- the judge on a stand-in model


def test_judge_both_orders_reads_the_two_answer_tokens():
    model, tok = tiny_model(), CharTokenizer()
    a, b = ["x value", "list list", "q"], ["yy", "none", "string key"]
    p_ab, p_ba = judge_both_orders(model, tok, a, b, batch_size=2)
    assert p_ab.shape == p_ba.shape == (3,) and p_ab.dtype == f64
    A, B = tok.encode("A")[0], tok.encode("B")[0]
    with torch.no_grad():
        for i in range(3):
            for p, (x, y) in ((p_ab, (a[i], b[i])), (p_ba, (b[i], a[i]))):
                z = model(torch.tensor([tok.encode_chat(judge_messages(x, y))]))[0, -1].double()
                assert float(p[i]) == pytest.approx(float(torch.softmax(z[[A, B]], 0)[0]), abs=1e-5)
    with pytest.raises(ValueError, match="one length"):
        judge_both_orders(model, tok, a, b[:2])
    with pytest.raises(TypeError, match="list of strings"):
        judge_both_orders(model, tok, "ab", "cd")


def test_critique_and_revise_runs_two_turns():
    model, tok = tiny_model(), CharTokenizer()
    critiques, revisions = critique_and_revise(model, tok, ["one", "two texts"], critique_tokens=3,
                                               revision_tokens=4, batch_size=2)
    assert len(critiques) == len(revisions) == 2
    assert all(len(c) <= 3 for c in critiques) and all(len(r) <= 4 for r in revisions)
    with pytest.raises(TypeError, match="texts"):
        critique_and_revise(model, tok, "one")


# ---------------------------------------------------------------- statistics


def test_calibrated_preference_cancels_a_constant_first_slot_pull():
    p_ab = torch.tensor([0.9, 0.6, 0.8], dtype=f64)
    p_ba = torch.tensor([0.7, 0.8, 0.8], dtype=f64)
    assert calibrated_preference(p_ab, p_ba).tolist() == pytest.approx([0.6, 0.4, 0.5], abs=1e-15)
    # a consistent judge (p_ba = 1 - p_ab) is left as it is
    assert torch.allclose(calibrated_preference(p_ab, 1 - p_ab), p_ab)
    with pytest.raises(ValueError, match="probabilities"):
        calibrated_preference(torch.tensor([1.2]), torch.tensor([0.5]))
    with pytest.raises(ValueError, match="one shape"):
        calibrated_preference(torch.tensor([0.2, 0.3]), torch.tensor([0.5]))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-40, 40), min_size=3, max_size=8), st.floats(-3, 3))
def test_calibration_removes_an_additive_logit_bias(logits, bias):
    """A judge whose logit of 'first' is u(first) - u(second) + bias: the calibrated label
    of a pair is on the same side of 1/2 as the unbiased judgement."""
    u = torch.tensor(logits, dtype=f64) / 10
    d = u - u.roll(1)
    p_ab, p_ba = torch.sigmoid(d + bias), torch.sigmoid(-d + bias)
    c = calibrated_preference(p_ab, p_ba)
    assert torch.equal(c[d != 0] > 0.5, d[d != 0] > 0)


def test_wilson_interval_worked_examples_and_scipy():
    from scipy.stats import binomtest

    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(1.96**2 / (10 + 1.96**2), abs=1e-15)  # k = 0: z^2 / (n + z^2)
    for k, n in ((0, 10), (7, 13), (55, 112), (40, 40)):
        ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        lo, hi = wilson_interval(k, n, z=1.959963984540054)
        assert (lo, hi) == pytest.approx((ci.low, ci.high), abs=1e-12)
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(5, 4)
    with pytest.raises(ValueError, match="trials"):
        wilson_interval(0, 0)


def test_judge_statistics_worked_example():
    # pairs: a better, a better, tie, b better
    true_a = torch.tensor([2.0, 1.0, 0.0, 0.0], dtype=f64)
    true_b = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=f64)
    p_ab = torch.tensor([0.9, 0.8, 0.7, 0.6], dtype=f64)  # always "A" in order (a, b)
    p_ba = torch.tensor([0.2, 0.9, 0.6, 0.7], dtype=f64)  # "B" (= a) once, "A" (= b) three times
    s = judge_statistics(p_ab, p_ba, true_a, true_b)
    assert s.num_untied == 3
    assert s.agreement_first_order == pytest.approx(2 / 3)  # says a on all three; a better on two
    # calibrated: (0.9 + 0.8) / 2 = 0.85, (0.8 + 0.1) / 2 = 0.45, (0.6 + 0.3) / 2 = 0.45
    assert s.agreement_calibrated == pytest.approx(2 / 3)
    assert s.first_slot_rate == pytest.approx(7 / 8)
    assert s.order_disagreement == pytest.approx(3 / 4)  # pairs 2, 3, 4 pick the first slot twice
    assert s.mean_confidence == pytest.approx((0.85 + 0.55 + 0.55 + 0.55) / 4)
    assert s.agreement_calibrated_interval == pytest.approx(wilson_interval(2, 3))
    with pytest.raises(ValueError, match="tied"):
        judge_statistics(p_ab, p_ba, true_a, true_a)
    with pytest.raises(ValueError, match="true_b"):
        judge_statistics(p_ab, p_ba, true_a, true_b[:3])


# ---------------------------------------------------------------- the noisy-label target


def test_symbolic_target_slope_ceiling_and_clean_limit():
    out = ai_label_probability_symbolic()
    s, d, eps, b = out["symbols"]
    assert sp.simplify(out["slope"] - (1 - b) * (1 - 2 * eps) * s) == 0
    # no noise: the learned reward difference is the true one, s * Delta
    assert sp.simplify(out["learned"].subs({eps: 0, b: 0}) - s * d) == 0
    m = b / 2 + (1 - b) * eps
    assert sp.simplify(sp.limit(out["q"], d, sp.oo) - (1 - m)) == 0
    val = {s: 1.3, eps: 0.1, b: 0.4}
    lim = sp.limit(out["learned"].subs(val), d, sp.oo)
    assert float(lim) == pytest.approx(float(out["ceiling"].subs(val)), abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(st.floats(-4, 4), st.floats(0.1, 3), st.floats(0, 0.45), st.floats(0, 0.9))
def test_ai_label_probability_matches_the_symbolic_q(delta, scale, flip, bias):
    out = ai_label_probability_symbolic()
    s, d, eps, b = out["symbols"]
    expected = float(out["q"].subs({s: scale, d: delta, eps: flip, b: bias}))
    got = float(ai_label_probability(torch.tensor(delta, dtype=f64), scale, flip, bias))
    assert got == pytest.approx(expected, abs=1e-12)


def test_learned_reward_slope_by_autograd():
    delta = torch.zeros((), dtype=f64, requires_grad=True)
    q = ai_label_probability(delta, 1.5, 0.2, 0.3)
    torch.log(q / (1 - q)).backward()
    assert float(delta.grad) == pytest.approx((1 - 0.3) * (1 - 2 * 0.2) * 1.5, abs=1e-12)
    assert torch.autograd.gradcheck(lambda x: ai_label_probability(x, 0.7, 0.1, 0.2),
                                    torch.tensor([-1.0, 0.3, 2.0], dtype=f64, requires_grad=True))


def test_ai_label_probability_bad_input():
    with pytest.raises(ValueError, match="flip"):
        ai_label_probability(torch.zeros(2), 1.0, 1.5, 0.0)
    with pytest.raises(ValueError, match="scale"):
        ai_label_probability(torch.zeros(2), 0.0, 0.1, 0.0)


# ---------------------------------------------------------------- best-of-n


def test_best_of_n_gold_worked_example():
    gold = torch.tensor([[0.0, 2.0, 1.0, 3.0], [1.0, 0.0, 0.0, 4.0]])
    scores = torch.tensor([[0.1, 0.5, 0.9, 0.2], [0.3, 0.3, 0.0, 0.1]])
    # n=1: first column; n=2: argmax of first two (row 2 tie -> first); n=4: argmax of all
    assert best_of_n_gold(gold, scores, [1, 2, 4]) == pytest.approx([0.5, 1.5, 1.0])
    with pytest.raises(ValueError, match="each n"):
        best_of_n_gold(gold, scores, [5])
    with pytest.raises(ValueError, match="one shape"):
        best_of_n_gold(gold, scores[:, :3], [1])


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.integers(2, 7), st.integers(0, 10_000))
def test_best_of_n_by_gold_never_decreases(m, n, seed):
    gold = torch.randint(0, 4, (m, n), generator=torch.Generator().manual_seed(seed)).double()
    values = best_of_n_gold(gold, gold, list(range(1, n + 1)))
    assert all(a <= b for a, b in zip(values, values[1:], strict=False))


def test_best_of_n_kl():
    assert best_of_n_kl(1) == 0.0
    assert best_of_n_kl(4) == pytest.approx(math.log(4) - 0.75, abs=1e-15)
    with pytest.raises(ValueError, match="^n must be positive"):
        best_of_n_kl(0)


# ---------------------------------------------------------------- the real judge against transformers


def test_smollm2_judgement_equals_transformers_softmax(smollm2_peer):
    """SmolLM2-135M-Instruct as the book runs it (batched, left-padded, last position only)
    gives the judge's P(A) that transformers' own Llama gives on the same two prompts."""
    from llmbook.inference.gguf import load_model

    model, tok = load_model()
    peer, peer_tok = smollm2_peer  # conftest.py: transformers' load, shared
    a, b = " a list of string values", "x = 3\n\nReturn the file"
    p_ab, p_ba = judge_both_orders(model, tok, [a], [b])
    A, B = peer_tok.convert_tokens_to_ids("A"), peer_tok.convert_tokens_to_ids("B")
    assert (A, B) == (tok.encode("A")[0], tok.encode("B")[0])
    for p, (x, y) in ((p_ab, (a, b)), (p_ba, (b, a))):
        ids = peer_tok.apply_chat_template(judge_messages(x, y), add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        assert list(ids) == tok.encode_chat(judge_messages(x, y))
        with torch.no_grad():
            z = peer(torch.tensor([list(ids)])).logits[0, -1].double()
        assert float(p[0]) == pytest.approx(float(torch.softmax(z[[A, B]], 0)[0]), abs=1e-4)


# ---------------------------------------------------------------- the whole pipeline, tiny


def test_run_ai_feedback_on_a_tiny_recipe(monkeypatch):
    """The pipeline of data/make_ai_feedback.py end to end, with a stand-in judge and the
    smallest sizes: every part is there, JSON-able, and consistent with itself."""
    import json

    import llmbook.inference.gguf as gguf
    from llmbook.alignment.ai_feedback import AI_FEEDBACK_RECIPE, run_ai_feedback

    monkeypatch.setattr(gguf, "load_model", lambda *a, **k: (tiny_model(), CharTokenizer()))
    recipe = {**AI_FEEDBACK_RECIPE, "judge_pairs": 6, "revise": 2, "critique_tokens": 2, "revision_tokens": 3,
              "sft_steps": 1, "rm_steps": 1, "rm_batch_size": 2, "best_of": [1, 2], "best_of_prompts": 2,
              "ppo_iterations": 1, "eval_prompts": 4}
    out = run_ai_feedback(recipe)
    json.dumps(out)  # JSON-able
    j = out["judge"]
    assert len(j["p_first_ab"]) == len(j["p_first_ba"]) == 6
    stats = judge_statistics(*(torch.tensor(j[k], dtype=f64) for k in ("p_first_ab", "p_first_ba", "true_a", "true_b")))
    assert json.dumps(stats._asdict()) == json.dumps(j["statistics"])
    assert len(out["revision"]["revisions"]) == 2 and all(n <= 24 for n in out["revision"]["revision_tokens"])
    assert out["base"]["kl"] == 0.0 and out["base"]["num"] == 4
    assert set(out["reward_models"]) == {"ai", "true", "shipped"}
    bon = out["best_of_n"]
    assert bon["gold"][0] == bon["ai"][0] == bon["true"][0] == bon["shipped"][0]  # n = 1: the first sample
    assert bon["gold"][1] >= bon["gold"][0]
    assert all(len(out["ppo"][k]["history"]["gold"]) == 1 for k in ("ai", "true"))
