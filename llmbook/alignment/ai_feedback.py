"""AI feedback: a language model as judge, critic and reviser (Constitutional AI, RLAIF).

Introduced in notebooks/19b_constitutional_ai. Constitutional AI (Bai et al., 2022,
"Constitutional AI: Harmlessness from AI Feedback") replaces the human labeller of RLHF
with a model that reads a written principle (a *constitution*) in two stages:

1. supervised: the model critiques a response against a principle, revises it, and the
   policy is fine-tuned on the revisions (:func:`critique_and_revise`);
2. RL from AI feedback (RLAIF): the model compares two responses under a principle, the
   comparisons train a preference model, and the policy is trained with RL against it
   (Lee et al., 2023, "RLAIF vs. RLHF: Scaling Reinforcement Learning from Human Feedback
   with AI Feedback", compare it with human labels).

The judge reads its answer off the next-token logits: after a prompt that ends "answer A
or B", the probability that the first response is better is the softmax over the two
tokens "A" and "B" only (:func:`choice_probability`). LLM judges prefer a slot regardless
of content (*position bias*, Zheng et al., 2023, "Judging LLM-as-a-Judge with MT-Bench and
Chatbot Arena"), so each pair is judged in both orders and the two probabilities are
averaged (:func:`judge_both_orders`, :func:`judge_statistics`).

:func:`ai_label_probability_symbolic` derives what a judge that flips with probability ε
and answers "first" with probability b regardless of content does to the Bradley–Terry
target of the reward model.

The judge in the book is SmolLM2-135M-Instruct (:func:`llmbook.inference.gguf.load_model`);
the prompts are rendered with its chat template (``tokenizer.encode_chat``). Sequences of
different lengths run together, left-padded (:func:`left_pad`), with the padding masked
(:func:`next_token_logits`, :func:`greedy_generate`).

:func:`run_ai_feedback` runs both stages on chapter 17's task (:data:`AI_FEEDBACK_RECIPE`,
driven by ``data/make_ai_feedback.py``): reward models from AI and from true labels (chapter
17's trainer), then best-of-n (:func:`best_of_n_gold`; its KL from chapter 18b's
:func:`~llmbook.alignment.overoptimisation.best_of_n_kl`) and chapter
18's PPO against each.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import sympy as sp
import torch
from torch import Tensor

from llmbook.alignment.overoptimisation import best_of_n_kl  # chapter 18b derives it
from llmbook.inference.kvcache import KVCache
from llmbook.transformer.model import TransformerLM
from llmbook.validation import check_finite, check_positive_int
from llmbook.validation import check_floating_tensor as _check_floating

__all__ = [
    "AI_FEEDBACK_RECIPE",
    "CRITIQUE_REQUEST",
    "PRINCIPLE",
    "REVISION_REQUEST",
    "JudgeStatistics",
    "ai_label_probability",
    "ai_label_probability_symbolic",
    "best_of_n_gold",
    "best_of_n_kl",
    "calibrated_preference",
    "choice_probability",
    "critique_and_revise",
    "greedy_generate",
    "judge_both_orders",
    "judge_messages",
    "judge_statistics",
    "left_pad",
    "next_token_logits",
    "run_ai_feedback",
    "wilson_interval",
]

#: The constitution: one principle, the book's task (chapter 17's keyword reward) in words.
PRINCIPLE = ("Prefer the text that uses more programming words, such as value, string, list, "
             "object, name, None, True, number, data, key, type and file.")
#: What the critic is asked after it sees a response (Bai et al., 2022, section 3.1, shortened).
CRITIQUE_REQUEST = "Point out in one sentence how this text could use more programming words."
#: What the reviser is asked after the critique.
REVISION_REQUEST = ("Rewrite the text so that it uses more programming words. "
                    "Reply with the rewritten text only.")
_SYSTEM = "You are a careful judge of short texts."


# ---------------------------------------------------------------- prompts


def _check_texts(texts: object, name: str) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError(f"{name} must be a list of strings, got {type(texts).__name__}")
    if not all(isinstance(t, str) for t in texts):
        raise TypeError(f"{name} must hold strings only")
    return list(texts)


def judge_messages(first: str, second: str, principle: str = PRINCIPLE) -> list[dict[str, str]]:
    """The chat that asks the judge to compare ``first`` (slot A) and ``second`` (slot B)
    under ``principle``; the assistant's answer is one letter, A or B."""
    for name, text in (("first", first), ("second", second), ("principle", principle)):
        if not isinstance(text, str):
            raise TypeError(f"{name} must be a str, got {type(text).__name__}")
    user = (f"{principle}\n\nText A: {first.strip()}\n\nText B: {second.strip()}\n\n"
            "Which text is better, A or B? Answer with one letter.")
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]


def choice_probability(logits: Tensor, first_id: int, second_id: int) -> Tensor:
    """P(first) from next-token logits (..., V): the softmax over the two answer tokens only,

        P(A) = exp(z_A) / (exp(z_A) + exp(z_B)) = sigma(z_A - z_B)   -> (...),

    the rest of the vocabulary ignored (the judge's preference among the two answers it
    was allowed to give).
    """
    _check_floating(logits, "logits")
    V = logits.shape[-1] if logits.ndim else 0
    for name, i in (("first_id", first_id), ("second_id", second_id)):
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < V:
            raise ValueError(f"{name} must be a token id in [0, {V}), got {i!r}")
    if first_id == second_id:
        raise ValueError(f"first_id and second_id must differ, both are {first_id}")
    return torch.sigmoid(logits[..., first_id] - logits[..., second_id])


# ---------------------------------------------------------------- batched forward passes


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """Left-pad token lists to one length T: ``(ids, positions, real)``, each (B, T).

    ``positions`` count from 0 at each sequence's first real token (0 on the padding), so
    every sequence sees the rotary angles it would see alone; ``real`` is True on real
    tokens. Left padding puts every sequence's last token at position T - 1.
    """
    if isinstance(seqs, Tensor) or not isinstance(seqs, Sequence) or len(seqs) == 0:
        raise ValueError("seqs must be a non-empty list of token-id lists")
    lengths = [len(s) for s in seqs]
    if min(lengths) < 1:
        raise ValueError(f"every sequence needs >= 1 token, got lengths {lengths}")
    T = max(lengths)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    real = torch.zeros((len(seqs), T), dtype=torch.bool)
    for b, s in enumerate(seqs):
        ids[b, T - len(s):] = torch.as_tensor(list(s), dtype=torch.long)
        real[b, T - len(s):] = True
    positions = (real.long().cumsum(1) - 1).clamp(min=0)  # (B, T)
    return ids, positions, real


def _attention_mask(real_keys: Tensor, T_q: int) -> Tensor:
    """(B, 1, T_q, T_k): a query may attend to real keys, and always to itself (so that a
    padding query is never left with no key at all); causality is added by the model."""
    B, T_k = real_keys.shape
    eye = torch.zeros(T_q, T_k, dtype=torch.bool)
    eye[torch.arange(T_q), torch.arange(T_k - T_q, T_k)] = True
    return (real_keys[:, None, :] | eye)[:, None]  # (B, 1, T_q, T_k)


def _head(model: TransformerLM, h: Tensor) -> Tensor:
    return model.lm_head(h) if model.lm_head is not None else h @ model.embed.weight.T


@torch.no_grad()
def next_token_logits(model: TransformerLM, seqs: Sequence[Sequence[int]], batch_size: int = 16) -> Tensor:
    """Logits of the token after each sequence: a list of N token lists -> (N, V).

    Runs left-padded batches of ``batch_size``; only the last position goes through the LM
    head (a V x d product per sequence rather than per token).
    """
    if not isinstance(model, TransformerLM):
        raise TypeError(f"model must be a TransformerLM, got {type(model).__name__}")
    batch_size = check_positive_int("batch_size", batch_size)
    out = []
    for i in range(0, len(seqs), batch_size):
        ids, pos, real = left_pad(seqs[i:i + batch_size])
        h = model.hidden_states(ids, pos, mask=_attention_mask(real, ids.shape[1]))  # (b, T, d)
        out.append(_head(model, h[:, -1]))  # (b, V)
    if not out:
        raise ValueError("seqs is empty")
    return torch.cat(out)


@torch.no_grad()
def greedy_generate(model: TransformerLM, seqs: Sequence[Sequence[int]], max_new_tokens: int,
                    stop_ids: Sequence[int], batch_size: int = 16) -> list[list[int]]:
    """Greedy continuations of token lists, batched with left padding and a KV cache.

    Each continuation ends before its first stop token or after ``max_new_tokens``; returns
    one list of new token ids per sequence. The same tokens as decoding each sequence
    alone (up to float rounding in near-ties).
    """
    if not isinstance(model, TransformerLM):
        raise TypeError(f"model must be a TransformerLM, got {type(model).__name__}")
    max_new_tokens = check_positive_int("max_new_tokens", max_new_tokens)
    batch_size = check_positive_int("batch_size", batch_size)
    stops = torch.tensor(list(stop_ids), dtype=torch.long)
    results: list[list[int]] = []
    for i in range(0, len(seqs), batch_size):
        ids, pos, real = left_pad(seqs[i:i + batch_size])
        B, T = ids.shape
        cache = KVCache.for_model(model, B, T + max_new_tokens)
        h = model.hidden_states(ids, pos, cache, _attention_mask(real, T))
        logits = _head(model, h[:, -1])
        new = [[] for _ in range(B)]
        done = torch.zeros(B, dtype=torch.bool)
        last = pos[:, -1]
        for step in range(max_new_tokens):
            nxt = logits.argmax(-1)  # (B,)
            done = done | torch.isin(nxt, stops)
            for b in range(B):
                if not done[b]:
                    new[b].append(int(nxt[b]))
            if bool(done.all()) or step == max_new_tokens - 1:
                break
            real = torch.cat([real, torch.ones(B, 1, dtype=torch.bool)], dim=1)
            last = last + 1
            h = model.hidden_states(nxt[:, None], last[:, None], cache, _attention_mask(real, 1))
            logits = _head(model, h[:, -1])
        results.extend(new)
    return results


# ---------------------------------------------------------------- the judge


def _answer_ids(tokenizer: Any) -> tuple[int, int]:
    a, b = tokenizer.encode("A"), tokenizer.encode("B")
    if len(a) != 1 or len(b) != 1:
        raise ValueError(f"'A' and 'B' must be one token each, got {a} and {b}")
    return a[0], b[0]


def judge_both_orders(model: TransformerLM, tokenizer: Any, texts_a: Sequence[str], texts_b: Sequence[str],
                      principle: str = PRINCIPLE, batch_size: int = 16) -> tuple[Tensor, Tensor]:
    """The judge on N pairs, each in both orders: ``(p_first_ab, p_first_ba)``, (N,) each.

    ``p_first_ab[i]`` = P(judge answers A) when ``texts_a[i]`` is shown first;
    ``p_first_ba[i]`` = P(judge answers A) when ``texts_b[i]`` is shown first. An unbiased,
    consistent judge has p_first_ba = 1 - p_first_ab. Float64.
    """
    texts_a, texts_b = _check_texts(texts_a, "texts_a"), _check_texts(texts_b, "texts_b")
    if len(texts_a) != len(texts_b) or not texts_a:
        raise ValueError(f"texts_a and texts_b must be non-empty and of one length, got "
                         f"{len(texts_a)} and {len(texts_b)}")
    first_id, second_id = _answer_ids(tokenizer)
    seqs = [tokenizer.encode_chat(judge_messages(x, y, principle)) for x, y in zip(texts_a, texts_b, strict=True)]
    seqs += [tokenizer.encode_chat(judge_messages(y, x, principle)) for x, y in zip(texts_a, texts_b, strict=True)]
    p = choice_probability(next_token_logits(model, seqs, batch_size), first_id, second_id).double()
    n = len(texts_a)
    return p[:n], p[n:]


def _check_probabilities(p: Tensor, name: str) -> Tensor:
    check_finite(_check_floating(p, name), name)
    if p.ndim != 1 or p.numel() == 0:
        raise ValueError(f"{name} must be (N,) with N >= 1, got shape {tuple(p.shape)}")
    if bool(((p < 0) | (p > 1)).any()):
        raise ValueError(f"{name} must hold probabilities in [0, 1]")
    return p


def calibrated_preference(p_first_ab: Tensor, p_first_ba: Tensor) -> Tensor:
    """P(a is better) averaged over both orders: (p_first_ab + 1 - p_first_ba) / 2, (N,).

    A judge that adds a constant pull towards the first slot raises p_first_ab and
    p_first_ba alike; the average cancels that pull to first order.
    """
    _check_probabilities(p_first_ab, "p_first_ab")
    _check_probabilities(p_first_ba, "p_first_ba")
    if p_first_ab.shape != p_first_ba.shape:
        raise ValueError(f"p_first_ab and p_first_ba must have one shape, got "
                         f"{tuple(p_first_ab.shape)} and {tuple(p_first_ba.shape)}")
    return (p_first_ab + 1 - p_first_ba) / 2


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's score interval for a binomial proportion (Wilson, 1927): (low, high).

    The set of p with |k/n - p| <= z sqrt(p(1-p)/n), which stays inside [0, 1] and is
    sensible at k = 0 or n, unlike the Wald interval k/n +- z sqrt(k/n (1 - k/n)/n).
    """
    trials = check_positive_int("trials", trials)
    if isinstance(successes, bool) or not isinstance(successes, int) or not 0 <= successes <= trials:
        raise ValueError(f"successes must be an int in [0, trials={trials}], got {successes!r}")
    if not (isinstance(z, int | float) and 0 < z < math.inf):
        raise ValueError(f"z must be a positive number, got {z!r}")
    p, n = successes / trials, trials
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


class JudgeStatistics(NamedTuple):
    """How a judge does on N pairs with true rewards (see :func:`judge_statistics`).

    ``agreement_*``: fraction of non-tied pairs (``num_untied``) on which a label picks the
    response with the higher true reward, with a 95% Wilson interval (``*_interval``):
    ``agreement_first_order`` uses only the order a-first, ``agreement_calibrated`` the
    order-averaged probability. ``first_slot_rate``: fraction of the 2N judgements that
    answer A. ``order_disagreement``: fraction of pairs whose two orders pick different
    responses. ``mean_confidence``: mean |P - 1/2| + 1/2 of the calibrated label.
    """

    agreement_first_order: float
    agreement_first_order_interval: tuple[float, float]
    agreement_calibrated: float
    agreement_calibrated_interval: tuple[float, float]
    num_untied: int
    first_slot_rate: float
    order_disagreement: float
    mean_confidence: float


def judge_statistics(p_first_ab: Tensor, p_first_ba: Tensor, true_a: Tensor, true_b: Tensor) -> JudgeStatistics:
    """Agreement with the true preference and position bias of a judge: a :class:`JudgeStatistics`.

    ``p_first_ab``, ``p_first_ba`` (N,) as returned by :func:`judge_both_orders`; ``true_a``,
    ``true_b`` (N,) the true rewards of the two responses. A judgement picks a when its
    probability of a exceeds 1/2.
    """
    calibrated = calibrated_preference(p_first_ab, p_first_ba)
    for name, t in (("true_a", true_a), ("true_b", true_b)):
        check_finite(_check_floating(t, name), name)
        if t.shape != p_first_ab.shape:
            raise ValueError(f"{name} must have shape {tuple(p_first_ab.shape)}, got {tuple(t.shape)}")
    untied = true_a != true_b
    n = int(untied.sum())
    if n == 0:
        raise ValueError("every pair is tied in true reward: agreement is undefined")
    a_better = (true_a > true_b)[untied]
    k1 = int(((p_first_ab[untied] > 0.5) == a_better).sum())
    kc = int(((calibrated[untied] > 0.5) == a_better).sum())
    picks_a_ab, picks_a_ba = p_first_ab > 0.5, p_first_ba <= 0.5
    return JudgeStatistics(
        k1 / n, wilson_interval(k1, n), kc / n, wilson_interval(kc, n), n,
        float(torch.cat([p_first_ab, p_first_ba]).gt(0.5).double().mean()),
        float((picks_a_ab != picks_a_ba).double().mean()),
        float(((calibrated - 0.5).abs() + 0.5).mean()))


# ---------------------------------------------------------------- what a noisy judge does to the target


def ai_label_probability_symbolic() -> dict[str, sp.Expr]:
    """The Bradley–Terry target under AI labels, derived with SymPy.

    A true labeller prefers a with p = sigma(s Delta), Delta = r(a) - r(b). The judge
    answers "first slot" with probability b whatever it reads (position bias), and
    otherwise reports a true-labeller draw flipped with probability eps. With the order
    shown at random (or both orders averaged), the AI label prefers a with

        q = b/2 + (1 - b) (eps + (1 - 2 eps) p).

    A reward model trained by maximum likelihood on such labels learns r_a - r_b = logit q
    (``learned``), whose slope at Delta = 0 is (1 - b)(1 - 2 eps) s (``slope``) and which
    saturates at log((1 - m) / m), m = b/2 + (1 - b) eps (``ceiling``): noise compresses the
    learned reward but keeps its order, so the Bayes accuracy on true labels is unchanged
    while the signal per label shrinks. ``agreement``: P(AI label = true label) for one pair.
    """
    s = sp.Symbol("s", positive=True)
    d, eps, b = sp.symbols("Delta epsilon b", real=True)
    p = 1 / (1 + sp.exp(-s * d))
    q = b / 2 + (1 - b) * (eps + (1 - 2 * eps) * p)
    learned = sp.log(q / (1 - q))
    m = b / 2 + (1 - b) * eps
    return {"symbols": (s, d, eps, b), "p": p, "q": q, "learned": learned,
            "slope": sp.simplify(sp.diff(learned, d).subs(d, 0)),
            "ceiling": sp.log((1 - m) / m),
            "agreement": sp.expand(q * p + (1 - q) * (1 - p))}


def ai_label_probability(delta: Tensor, scale: float, flip: float, bias: float) -> Tensor:
    """q = b/2 + (1 - b)(eps + (1 - 2 eps) sigma(s Delta)) elementwise: (...) -> (...).

    ``delta`` = r(a) - r(b); ``scale`` = s > 0; ``flip`` = eps and ``bias`` = b in [0, 1].
    """
    check_finite(_check_floating(delta, "delta"), "delta")
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not 0 < scale < math.inf:
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    for name, v in (("flip", flip), ("bias", bias)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1:
            raise ValueError(f"{name} must be a number in [0, 1], got {v!r}")
    return bias / 2 + (1 - bias) * (flip + (1 - 2 * flip) * torch.sigmoid(scale * delta))


# ---------------------------------------------------------------- critique and revision


def critique_and_revise(model: TransformerLM, tokenizer: Any, texts: Sequence[str],
                        principle: str = PRINCIPLE, critique_tokens: int = 32,
                        revision_tokens: int = 40, batch_size: int = 16) -> tuple[list[str], list[str]]:
    """Constitutional AI's supervised stage on ``texts``: ``(critiques, revisions)``.

    Turn 1 shows the text and asks :data:`CRITIQUE_REQUEST` under ``principle``; the model's
    greedy answer is the critique. Turn 2 appends it and asks :data:`REVISION_REQUEST`; the
    greedy answer is the revision (Bai et al., 2022, section 3: critique, then revision,
    in one conversation).
    """
    texts = _check_texts(texts, "texts")
    stops = list(tokenizer.stop_token_ids)

    def chat(i: int, extra: list[dict[str, str]]) -> list[int]:
        user = f"{principle}\n\nText: {texts[i].strip()}\n\n{CRITIQUE_REQUEST}"
        return tokenizer.encode_chat([{"role": "user", "content": user}, *extra])

    first = [chat(i, []) for i in range(len(texts))]
    critiques = [tokenizer.decode(t, skip_special_tokens=True).strip()
                 for t in greedy_generate(model, first, critique_tokens, stops, batch_size)]
    second = [chat(i, [{"role": "assistant", "content": c}, {"role": "user", "content": REVISION_REQUEST}])
              for i, c in enumerate(critiques)]
    revisions = [tokenizer.decode(t, skip_special_tokens=True).strip()
                 for t in greedy_generate(model, second, revision_tokens, stops, batch_size)]
    return critiques, revisions


# ---------------------------------------------------------------- the book's runs (data/make_ai_feedback.py)

#: The scale of data/make_ai_feedback.py: about 8 minutes on one thread (21 on a busy 2-core machine).
AI_FEEDBACK_RECIPE: dict[str, Any] = {
    "judge_pairs": 256, "revise": 32, "critique_tokens": 32, "revision_tokens": 40,
    "sft_steps": 30, "sft_lr": 1e-3, "rm_steps": 64, "rm_batch_size": 32, "rm_lr": 3e-4,
    "rm_warmup_steps": 8, "best_of": [1, 2, 4, 8, 16], "best_of_prompts": 128,
    "ppo_iterations": 24, "eval_prompts": 256, "seed": 0,
}


def best_of_n_gold(gold: Tensor, scores: Tensor, ns: Sequence[int]) -> list[float]:
    """Mean gold reward of best-of-n selection by ``scores``: gold, scores (M, N) -> one
    value per n in ``ns``.

    For each of the M prompts the response with the highest score among the first n of
    its N samples is kept (the first on a tie), and its gold reward is averaged over the
    prompts. Best-of-n moves a policy by KL <= log n - (n - 1)/n from the sampler
    (Beirami et al., 2024).
    """
    for name, t in (("gold", gold), ("scores", scores)):
        check_finite(_check_floating(t, name), name)
    if gold.ndim != 2 or gold.shape != scores.shape:
        raise ValueError(f"gold and scores must be (M, N) of one shape, got {tuple(gold.shape)} "
                         f"and {tuple(scores.shape)}")
    out = []
    for n in ns:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= gold.shape[1]:
            raise ValueError(f"each n must be an int in [1, {gold.shape[1]}], got {n!r}")
        pick = scores[:, :n].argmax(1)  # (M,): the first maximum
        out.append(float(gold[torch.arange(gold.shape[0]), pick].double().mean()))
    return out


def _train_rm(base: TransformerLM, data: Any, recipe: dict[str, Any], test: Any) -> tuple[Any, dict[str, Any]]:
    """A reward model trained as chapter 17's (its trainer, two top blocks and the embeddings)
    on ``data``, and its scores on ``test`` (without the per-response lists)."""
    from llmbook.alignment.reward_model import (
        RewardModel,
        evaluate_reward_model,
        train_reward_model,
    )

    torch.manual_seed(recipe["seed"])
    model = RewardModel(copy.deepcopy(base), 2, True)
    gen = torch.Generator().manual_seed(recipe["seed"])
    train_reward_model(model, data, recipe["rm_steps"], recipe["rm_batch_size"], recipe["rm_lr"], gen,
                       recipe["rm_warmup_steps"])
    scores = evaluate_reward_model(model, test, 1.0)
    return model.requires_grad_(False).eval(), {k: v for k, v in scores.items() if not isinstance(v, list)}


def _ppo_against(reference: TransformerLM, reward_model: Any, shift: float, spread: float,
                 recipe: dict[str, Any], eval_prompts: Tensor, keywords: Tensor) -> dict[str, Any]:
    """Chapter 18's PPO recipe for ``recipe["ppo_iterations"]`` iterations, the score being the
    reward model's, standardised by ``shift`` and ``spread``; the gold reward is only measured."""
    from llmbook.alignment.ppo import PPO_RECIPE, ValueModel, make_policy, ppo_update, rollout
    from llmbook.alignment.preferences import evaluate_policy, keyword_reward, preference_data

    pr = PPO_RECIPE
    gen = torch.Generator().manual_seed(recipe["seed"])
    policy = make_policy(reference, pr["lora_targets"], pr["lora_r"], pr["lora_alpha"], gen)
    critic = ValueModel(copy.deepcopy(reference).requires_grad_(True))
    policy_opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=pr["lr"])
    critic_opt = torch.optim.Adam(critic.parameters(), lr=pr["critic_lr"])
    prompts_all = preference_data("train").prompts
    order = torch.randperm(len(prompts_all), generator=gen)
    gold: list[float] = []

    @torch.no_grad()
    def reward_fn(prompts: Tensor, responses: Tensor) -> Tensor:
        gold.append(float(keyword_reward(responses, keywords).mean()))
        return (reward_model(prompts, responses) - shift) / spread

    history: dict[str, list[float]] = {"score": [], "gold": [], "kl": []}
    B = pr["batch_size"]
    for it in range(recipe["ppo_iterations"]):
        batch = rollout(policy, reference, critic, prompts_all[order[it * B:(it + 1) * B]],
                        pr["response_tokens"], reward_fn, gen)
        history["score"].append(float(batch.scores.mean()))
        history["gold"].append(gold[-1])
        history["kl"].append(float((batch.logprobs - batch.ref_logprobs).double().sum(1).mean()))
        ppo_update(policy, critic, batch, policy_opt, critic_opt, beta=pr["beta"], gamma=pr["gamma"],
                   lam=pr["lam"], clip_eps=pr["clip_eps"], value_clip=pr["value_clip"], epochs=pr["epochs"],
                   minibatch_size=pr["minibatch_size"], max_grad_norm=pr["max_grad_norm"],
                   whiten_advantages=pr["whiten_advantages"], generator=gen)
    policy.eval()
    return {"history": history, "final": evaluate_policy(policy, reference, eval_prompts, keywords)._asdict()}


def _sft_on(reference: TransformerLM, prompts: Tensor, responses: list[list[int]], recipe: dict[str, Any],
            eval_prompts: Tensor, keywords: Tensor) -> dict[str, Any]:
    """LoRA SFT (chapter 17's loss, chapter 18's adapters) on (prompt, response) examples;
    the policy's gold reward and KL from the reference on ``eval_prompts``."""
    from llmbook.alignment.ppo import PPO_RECIPE, make_policy
    from llmbook.alignment.preferences import evaluate_policy
    from llmbook.alignment.sft import pack_examples, sft_step

    pr = PPO_RECIPE
    gen = torch.Generator().manual_seed(recipe["seed"])
    policy = make_policy(reference, pr["lora_targets"], pr["lora_r"], pr["lora_alpha"], gen)
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=recipe["sft_lr"])
    examples = [(p.tolist(), r) for p, r in zip(prompts, responses, strict=True) if r]
    batch = pack_examples(examples, prompts.shape[1] + max(len(r) for _, r in examples))
    losses = [float(sft_step(policy, opt, [batch], grad_clip=1.0).loss) for _ in range(recipe["sft_steps"])]
    policy.eval()
    return {"loss": losses, "final": evaluate_policy(policy, reference, eval_prompts, keywords)._asdict()}


def run_ai_feedback(recipe: dict[str, Any]) -> dict[str, Any]:
    """Constitutional AI's two stages at the book's scale, with SmolLM2-135M-Instruct as the
    judge and the critic and chapter 17's task; returns a JSON-able dict (data/make_ai_feedback.py).

    1. judge ``judge_pairs`` training pairs in both orders (:func:`judge_both_orders`);
    2. critique and revise ``revise`` base responses (:func:`critique_and_revise`), re-tokenise
       the revisions for the text model (at most ``response_tokens`` tokens), LoRA-SFT the text
       model on them and, as a control, on the original responses;
    3. train one reward model on the AI labels (the order-averaged judgement) and one on the
       true Bradley–Terry labels of the same pairs; select best-of-n with each (and with
       chapter 17's shipped reward model, trained on 16 times more pairs) and run PPO against
       each; everything scored by the gold (keyword) reward and the KL from the base model.
    """
    import time

    from llmbook.alignment.preferences import (
        PREFERENCE_RECIPE,
        PreferenceData,
        evaluate_policy,
        keyword_ids,
        keyword_reward,
        preference_data,
        sample_responses,
    )
    from llmbook.alignment.reward_model import load_reward_model
    from llmbook.inference.gguf import load_model
    from llmbook.training.pretrained import book_model

    torch.set_num_threads(1)
    clock, seconds = time.perf_counter(), {}
    judge, jtok = load_model()
    base, binfo = book_model("text")
    base.requires_grad_(False)
    btok = binfo["tokenizer"]
    kw = keyword_ids(btok, tuple(PREFERENCE_RECIPE["keywords"]))
    R = PREFERENCE_RECIPE["response_tokens"]
    train, test = preference_data("train"), preference_data("test")
    eval_prompts = test.prompts[:recipe["eval_prompts"]]
    out: dict[str, Any] = {"recipe": recipe}

    # 1. the judge, both orders
    n = recipe["judge_pairs"]
    texts_a = [btok.decode(t.tolist()) for t in train.chosen[:n]]
    texts_b = [btok.decode(t.tolist()) for t in train.rejected[:n]]
    p_ab, p_ba = judge_both_orders(judge, jtok, texts_a, texts_b)
    true_a, true_b = train.reward_chosen[:n].double(), train.reward_rejected[:n].double()
    stats = judge_statistics(p_ab, p_ba, true_a, true_b)
    length_right = [(len(a) > len(b)) == (ra > rb) for a, b, ra, rb in zip(texts_a, texts_b, true_a.tolist(), true_b.tolist(), strict=True)
                    if ra != rb and len(a) != len(b)]
    out["judge"] = {"p_first_ab": p_ab.tolist(), "p_first_ba": p_ba.tolist(), "true_a": true_a.tolist(),
                    "true_b": true_b.tolist(), "statistics": stats._asdict(),
                    "length_heuristic_agreement": sum(length_right) / len(length_right)}
    seconds["judge"] = time.perf_counter() - clock

    # 2. critique -> revision -> SFT, against the base model on the same prompts
    out["base"] = evaluate_policy(base, base, eval_prompts, kw)._asdict()
    m = recipe["revise"]
    rev_prompts, originals = train.prompts[n:n + m], train.chosen[n:n + m]
    original_texts = [btok.decode(t.tolist()) for t in originals]
    critiques, revisions = critique_and_revise(judge, jtok, original_texts, critique_tokens=recipe["critique_tokens"],
                                               revision_tokens=recipe["revision_tokens"])
    revision_ids = [btok.encode(" " + r)[:R] for r in revisions]
    gold_revised = [int(torch.isin(torch.tensor(r, dtype=torch.long), kw).sum()) for r in revision_ids]
    out["revision"] = {"originals": original_texts, "critiques": critiques, "revisions": revisions,
                       "gold_original": keyword_reward(originals, kw).tolist(), "gold_revised": gold_revised,
                       "revision_tokens": [len(r) for r in revision_ids]}
    seconds["critique_revision"] = time.perf_counter() - clock
    out["sft"] = {"revisions": _sft_on(base, rev_prompts, revision_ids, recipe, eval_prompts, kw),
                  "originals": _sft_on(base, rev_prompts, [t.tolist() for t in originals], recipe, eval_prompts, kw)}
    seconds["sft"] = time.perf_counter() - clock

    # 3. RLAIF: AI labels -> reward model -> best-of-n and PPO, against true labels
    ai_a = calibrated_preference(p_ab, p_ba) > 0.5
    pick = ai_a[:, None]
    sl = slice(0, n)
    ai_data = PreferenceData(train.prompts[sl], torch.where(pick, train.chosen[sl], train.rejected[sl]),
                             torch.where(pick, train.rejected[sl], train.chosen[sl]),
                             torch.where(ai_a, true_a, true_b).float(), torch.where(ai_a, true_b, true_a).float())
    true_data = PreferenceData(*(t[sl] for t in train))
    rms = {}
    out["reward_models"] = {}
    for name, data in (("ai", ai_data), ("true", true_data)):
        rms[name], out["reward_models"][name] = _train_rm(base, data, recipe, test)
    rms["shipped"], shipped_info = load_reward_model()
    out["reward_models"]["shipped"] = {k: v for k, v in shipped_info["test"].items() if not isinstance(v, list)}
    seconds["reward_models"] = time.perf_counter() - clock

    N, M = max(recipe["best_of"]), recipe["best_of_prompts"]
    gen = torch.Generator().manual_seed(recipe["seed"])
    bo_prompts = test.prompts[:M].repeat_interleave(N, 0)  # (M N, P)
    samples = sample_responses(base, bo_prompts, R, 1.0, gen)
    gold = keyword_reward(samples, kw).view(M, N)
    out["best_of_n"] = {"n": recipe["best_of"], "kl_bound": [best_of_n_kl(k) for k in recipe["best_of"]],
                        "gold": best_of_n_gold(gold, gold, recipe["best_of"])}
    spread = {}
    with torch.no_grad():
        for name, rm in rms.items():
            scores = torch.cat([rm(bo_prompts[i:i + 256], samples[i:i + 256]) for i in range(0, M * N, 256)])
            spread[name] = (float(scores.mean()), float(scores.std()))
            out["best_of_n"][name] = best_of_n_gold(gold, scores.view(M, N), recipe["best_of"])
    seconds["best_of_n"] = time.perf_counter() - clock

    out["ppo"] = {name: _ppo_against(base, rms[name], *spread[name], recipe, eval_prompts, kw)
                  for name in ("ai", "true")}
    seconds["ppo"] = time.perf_counter() - clock
    out["seconds"] = seconds
    return out
