"""The alignment task of chapters 17–19: a known reward, prompts, and preference pairs.

To measure what reward modelling, PPO and DPO learn, the book needs a *ground-truth*
reward it can compute exactly. The task: continue a prompt taken from the book's text
corpus (the Python standard library's docstrings) with the book's text model
(:func:`llmbook.training.pretrained.book_model` ``("text")``), and score the continuation by

    r(x, y) = number of tokens of y that are one of :data:`KEYWORDS`

(words that name Python values: " value", " string", " list", ...). The reward is
programmatic, so a learned reward can be correlated with it, and it is *hackable*: a
policy that only says " object object object" scores the maximum while no longer writing
docstrings (chapter 18's PPO finds it when the KL penalty is too weak).

Preferences are drawn as a human labeller is modelled in RLHF (Ouyang et al., 2022,
"Training language models to follow instructions with human feedback"): two responses
to the same prompt, and the first is preferred with probability
σ(s·(r(x, y₁) − r(x, y₂))) (the Bradley–Terry model, Bradley & Terry, 1952), with a
known scale s. The pairs are sampled once from the base model and shipped
(artifact ``"preferences"``, :mod:`llmbook.alignment.shipped`), so chapters 17 and 19 train on
the same data on every machine.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from llmbook.alignment.shipped import load_artifact, register
from llmbook.validation import check_finite, check_positive_int, check_token_ids

__all__ = ["KEYWORDS", "PREFERENCE_RECIPE", "PolicyScore", "PreferenceData", "corpus_prompts",
           "evaluate_policy", "keyword_ids", "keyword_reward", "label_preferences", "preference_data",
           "sample_responses"]

#: The rewarded words; each is one token of the book's 1024-token BPE vocabulary.
KEYWORDS: tuple[str, ...] = (" value", " string", " list", " object", " name", " None",
                             " True", " number", " data", " key", " type", " file")

PREFERENCE_RECIPE: dict[str, Any] = {
    "base": "text", "keywords": list(KEYWORDS), "prompt_tokens": 8, "response_tokens": 24,
    "temperature": 1.0, "num_train": 4096, "num_test": 512, "bt_scale": 1.0,
    "corpus_bytes": 2_000_000, "seed": 0,
}


def keyword_ids(tokenizer: Any, keywords: tuple[str, ...] | list[str] = KEYWORDS) -> Tensor:
    """The token ids of ``keywords`` (each must encode to exactly one token): (K,) long."""
    ids = []
    for word in keywords:
        enc = tokenizer.encode(word)
        if len(enc) != 1:
            raise ValueError(f"keyword {word!r} is {len(enc)} tokens, not one: {enc}")
        ids.append(enc[0])
    return torch.tensor(sorted(set(ids)), dtype=torch.long)


def _check_keywords(keywords: object) -> None:
    if not isinstance(keywords, Tensor) or keywords.dtype != torch.long or keywords.ndim != 1:
        raise TypeError("keywords must be a (K,) torch.long tensor")


def keyword_reward(response_ids: Tensor, keywords: Tensor, mask: Tensor | None = None) -> Tensor:
    """r = number of response tokens in ``keywords``: (B, R) long -> (B,) float.

    ``mask`` (B, R), if given, counts only the positions where it is true (padding out).
    """
    if not isinstance(response_ids, Tensor) or response_ids.dtype != torch.long or response_ids.ndim != 2:
        raise TypeError("response_ids must be a (B, R) torch.long tensor")
    _check_keywords(keywords)
    hit = torch.isin(response_ids, keywords)  # (B, R)
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.shape != response_ids.shape:
            raise ValueError(f"mask must be a tensor of shape {tuple(response_ids.shape)}, "
                             f"got {getattr(mask, 'shape', type(mask).__name__)}")
        hit = hit & mask.bool()
    return hit.sum(-1).to(torch.get_default_dtype())


def corpus_prompts(tokenizer: Any, text: str, num: int, length: int, seed: int) -> Tensor:
    """``num`` prompts of ``length`` tokens: the first tokens of distinct corpus lines.

    Lines of ``text`` that are at least 40 characters long and encode to at least
    ``length`` tokens are candidates; ``num`` of them are drawn without replacement by a
    seeded permutation (integer arithmetic only, so the same on every machine): (num, length).
    """
    if num < 1 or length < 1:
        raise ValueError(f"num and length must be >= 1, got {num}, {length}")
    lines = sorted({ln.strip() for ln in text.splitlines() if len(ln.strip()) >= 40})
    order = torch.randperm(len(lines), generator=torch.Generator().manual_seed(seed)).tolist()
    out: list[list[int]] = []
    for i in order:
        ids = tokenizer.encode(lines[i])
        if len(ids) >= length:
            out.append(ids[:length])
            if len(out) == num:
                return torch.tensor(out, dtype=torch.long)
    raise ValueError(f"the text has only {len(out)} usable lines, {num} prompts were asked for")


@torch.no_grad()
def sample_responses(policy: torch.nn.Module, prompts: Tensor, length: int, temperature: float = 1.0,
                     generator: torch.Generator | None = None, batch_size: int = 256) -> Tensor:
    """Sample a ``length``-token response to each prompt: (N, P) -> (N, length).

    Uses :func:`llmbook.inference.sampling.generate` (with the KV cache) in batches of
    ``batch_size``.
    """
    from llmbook.inference.sampling import generate

    check_token_ids(prompts, "prompts", ndim=2)
    check_positive_int("length", length)
    check_positive_int("batch_size", batch_size)
    parts = []
    for i in range(0, prompts.shape[0], batch_size):
        chunk = prompts[i:i + batch_size]
        parts.append(generate(policy, chunk, length, temperature=temperature,
                              generator=generator)[:, chunk.shape[1]:])
    return torch.cat(parts)


def label_preferences(r_a: Tensor, r_b: Tensor, scale: float, generator: torch.Generator) -> Tensor:
    """Bradley–Terry labels: True where a is preferred, drawn with P = σ(scale·(r_a − r_b)).

    ``r_a``, ``r_b``: (N,) -> (N,) bool. The uniform draws come from ``generator``, so a
    label is deterministic given the rewards (which are integers here).
    """
    for name, r in (("r_a", r_a), ("r_b", r_b)):
        if not isinstance(r, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(r).__name__}")
        check_finite(r, name)
    if r_a.shape != r_b.shape or r_a.ndim != 1:
        raise ValueError(f"r_a and r_b must be (N,) of one shape, got {tuple(r_a.shape)}, "
                         f"{tuple(r_b.shape)}")
    if not scale > 0:  # NaN too
        raise ValueError(f"scale must be > 0, got {scale}")
    u = torch.rand(r_a.shape, generator=generator, dtype=torch.float64)
    return u < torch.sigmoid(scale * (r_a - r_b).double())


class PreferenceData(NamedTuple):
    """Preference pairs: ``prompts`` (N, P), ``chosen`` and ``rejected`` responses (N, R),
    and their true rewards ``reward_chosen``, ``reward_rejected`` (N,) float."""

    prompts: Tensor
    chosen: Tensor
    rejected: Tensor
    reward_chosen: Tensor
    reward_rejected: Tensor


def _make_preferences(recipe: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    from llmbook.text.corpus import load_stdlib_docs
    from llmbook.training.pretrained import book_model

    model, info = book_model(recipe["base"])
    tok = info["tokenizer"]
    kw = keyword_ids(tok, tuple(recipe["keywords"]))
    n = recipe["num_train"] + recipe["num_test"]
    prompts = corpus_prompts(tok, load_stdlib_docs(recipe["corpus_bytes"]), n,
                             recipe["prompt_tokens"], recipe["seed"])
    gen = torch.Generator().manual_seed(recipe["seed"])
    a = sample_responses(model, prompts, recipe["response_tokens"], recipe["temperature"], gen)
    b = sample_responses(model, prompts, recipe["response_tokens"], recipe["temperature"], gen)
    ra, rb = keyword_reward(a, kw), keyword_reward(b, kw)
    a_wins = label_preferences(ra, rb, recipe["bt_scale"], gen)
    pick = a_wins[:, None]
    small = torch.int16  # V = 1024 fits; stored small, returned as long
    tensors = {"prompts": prompts.to(small), "chosen": torch.where(pick, a, b).to(small),
               "rejected": torch.where(pick, b, a).to(small),
               "reward_chosen": torch.where(a_wins, ra, rb), "reward_rejected": torch.where(a_wins, rb, ra)}
    both = torch.cat([ra, rb])
    facts = {"mean_reward": both.mean().item(), "reward_histogram": torch.bincount(both.long()).tolist(),
             "fraction_ties": (ra == rb).double().mean().item(),
             "fraction_chosen_higher": (tensors["reward_chosen"] > tensors["reward_rejected"]).double().mean().item()}
    return tensors, facts


register("preferences", PREFERENCE_RECIPE, _make_preferences, __name__)


def preference_data(split: str = "train") -> PreferenceData:
    """The shipped preference pairs of ``split`` ("train": the first ``num_train``; "test")."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    tensors, _ = load_artifact("preferences")
    n = PREFERENCE_RECIPE["num_train"]
    sl = slice(0, n) if split == "train" else slice(n, None)
    return PreferenceData(*(tensors[k][sl].long() if tensors[k].dtype == torch.int16 else tensors[k][sl]
                            for k in PreferenceData._fields))


class PolicyScore(NamedTuple):
    """How a policy does on the task: mean true ``reward`` of its sampled responses, and
    ``kl``, the Monte Carlo estimate of KL(π‖π_ref) over whole responses (nats per
    response), with its standard error ``kl_stderr``, from ``num`` samples."""

    reward: float
    kl: float
    kl_stderr: float
    num: int


@torch.no_grad()
def evaluate_policy(policy: torch.nn.Module, reference: torch.nn.Module, prompts: Tensor,
                    keywords: Tensor, response_tokens: int = PREFERENCE_RECIPE["response_tokens"],
                    seed: int = 0) -> PolicyScore:
    """Score ``policy`` on ``prompts`` (N, P): sample one response each at temperature 1,

        reward = mean_i r(x_i, y_i),     kl = mean_i Σ_t [log π(y_it | ·) − log π_ref(y_it | ·)],

    the second being the unbiased sequence-level (k1) estimate of KL(π‖π_ref), since
    y ~ π. Chapters 18 (PPO) and 19 (DPO) compare their policies with this one function.
    """
    from llmbook.alignment.logprobs import response_logprobs

    check_positive_int("response_tokens", response_tokens)
    _check_keywords(keywords)
    gen = torch.Generator().manual_seed(seed)
    responses = sample_responses(policy, prompts, response_tokens, 1.0, gen)
    reward = keyword_reward(responses, keywords)
    log_ratio = (response_logprobs(policy, prompts, responses)
                 - response_logprobs(reference, prompts, responses)).double().sum(-1)  # (N,)
    n = prompts.shape[0]
    stderr = log_ratio.std().item() / n ** 0.5 if n > 1 else float("nan")
    return PolicyScore(reward.double().mean().item(), log_ratio.mean().item(), stderr, n)
