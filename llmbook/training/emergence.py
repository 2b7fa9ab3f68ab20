"""Emergence as a property of the metric, and the published training runs chapter 11 grades.

Introduced in notebooks/11_scaling_laws (section 11.8). Schaeffer, Miranda and Koyejo (2023,
"Are Emergent Abilities of Large Language Models a Mirage?") observe that an answer of
``L`` tokens is exactly right only if every token is: with per-token accuracy ``p``,
exact match is ``p^L`` (:func:`exact_match_from_per_token`), which stays near 0 while
``p`` climbs steadily and then shoots up. A metric linear in the tokens (per-token accuracy,
the token edit distance, the mean log-probability of the answer) shows no jump.

This module holds the pieces of that demonstration:

* a task with several-token answers: recalling a random ``L``-digit answer for each key of
  a table (:func:`fact_table`), a stand-in for stored facts whose per-token accuracy is
  limited by how much the model can memorise, and so grows with its size;
* the metrics, from the logits a model gives the answer tokens under teacher forcing
  (:func:`answer_logits`): :func:`answer_log_probs`, :func:`per_token_accuracy`,
  :func:`exact_match`, :func:`token_edit_distance`; :func:`greedy_answers` decodes, and
  its exact match equals the teacher-forced one (every greedy token is right exactly when
  every teacher-forced argmax is);
* :func:`emergence_sweep`, which trains the book's Llama-style model at several widths on
  the table and scores each; ``data/make_emergence.py`` runs it and writes
  :data:`EMERGENCE_RESULTS` (``data/emergence/fact_recall_sweep.json``).

:data:`PUBLISHED_RUNS` lists parameters and training tokens of named models as their papers
give them (``None`` where a paper does not publish a number), for claims C8 and C9.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from llmbook.paths import data_path
from llmbook.validation import check_positive_int

__all__ = [
    "CODEX_PASS_AT_1",
    "EMERGENCE_RESULTS",
    "EMERGENT_SCALES",
    "FACT_VOCAB",
    "PUBLISHED_RUNS",
    "PublishedRun",
    "answer_log_probs",
    "answer_logits",
    "edit_distance",
    "emergence_sweep",
    "exact_match",
    "exact_match_from_per_token",
    "fact_table",
    "greedy_answers",
    "per_token_accuracy",
    "score_answers",
    "token_edit_distance",
    "train_fact_model",
]

# ---------------------------------------------------------------- the task

FACT_VOCAB = ("0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "=")
"""Token ids 0-9 are the digits, 10 is ``=``."""
_EQUALS = 10


def fact_table(key_digits: int, answer_length: int, generator: torch.Generator
               ) -> tuple[Tensor, Tensor]:
    """Every ``key_digits``-digit key with a random ``answer_length``-digit answer to recall.

    ``prompts`` (10^key_digits, key_digits + 1): each key in order, ``0..0 =`` to ``9..9 =``.
    ``answers`` (10^key_digits, answer_length): uniform random digits drawn from
    ``generator``, one row per key. The table is a stand-in for facts a model must store:
    nothing relates one answer to another, so each answer token is right only as far as
    the model has memorised it, and how much it can memorise grows with its size.
    """
    key_digits = check_positive_int("key_digits", key_digits)
    answer_length = check_positive_int("answer_length", answer_length)
    if key_digits > 5:
        raise ValueError(f"key_digits must be at most 5 (a table of 10^key_digits rows), got {key_digits}")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    n = 10**key_digits
    powers = 10 ** torch.arange(key_digits - 1, -1, -1)  # most significant digit first
    keys = (torch.arange(n)[:, None] // powers) % 10  # (n, key_digits)
    prompts = torch.cat([keys, torch.full((n, 1), _EQUALS)], dim=1)
    answers = torch.randint(0, 10, (n, answer_length), generator=generator)
    return prompts, answers


# ---------------------------------------------------------------- metrics


def _check_answers(answers: object, name: str = "answers") -> Tensor:
    if not isinstance(answers, Tensor) or answers.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must be an int64 or int32 tensor of token ids")
    if answers.ndim != 2 or answers.shape[0] == 0 or answers.shape[1] == 0:
        raise ValueError(f"{name} must have shape (n, L) with n, L >= 1, got {tuple(answers.shape)}")
    return answers


def _check_correct(correct: object) -> Tensor:
    if not isinstance(correct, Tensor) or correct.dtype != torch.bool:
        raise TypeError("correct must be a bool tensor of shape (n, L)")
    if correct.ndim != 2 or correct.shape[0] == 0 or correct.shape[1] == 0:
        raise ValueError(f"correct must have shape (n, L) with n, L >= 1, got {tuple(correct.shape)}")
    return correct


def answer_logits(model: nn.Module, prompts: Tensor, answers: Tensor) -> Tensor:
    """Logits the model gives each answer token under teacher forcing: (n, L, V).

    The model reads ``prompts`` (n, P) followed by ``answers[:, :-1]``; the logits at
    positions ``P-1 .. P+L-2`` predict ``answers[:, 0] .. answers[:, L-1]``, each given the
    prompt and the *true* answer tokens before it. One forward pass, no gradient.
    """
    prompts = _check_answers(prompts, "prompts")
    answers = _check_answers(answers)
    if prompts.shape[0] != answers.shape[0]:
        raise ValueError(f"prompts and answers must have the same number of rows, got "
                         f"{prompts.shape[0]} and {answers.shape[0]}")
    P, L = prompts.shape[1], answers.shape[1]
    with torch.no_grad():
        logits = model(torch.cat([prompts, answers[:, :-1]], dim=1))  # (n, P + L - 1, V)
    return logits[:, P - 1:P + L - 1]  # (n, L, V)


def answer_log_probs(logits: Tensor, answers: Tensor) -> Tensor:
    """``log p(answer token | everything before it)`` for every answer token: (n, L).

    ``logits`` (n, L, V) as :func:`answer_logits` returns them. The mean of the result is
    the negative per-token cross-entropy on the answers; its row sum is the log-probability
    of the whole answer (chain rule), whose exponential is the probability of an exact match
    when sampling at temperature 1.
    """
    answers = _check_answers(answers)
    if not isinstance(logits, Tensor) or not logits.is_floating_point():
        raise TypeError("logits must be a floating-point tensor of shape (n, L, V)")
    if logits.ndim != 3 or logits.shape[:2] != answers.shape:
        raise ValueError(f"logits must have shape (n, L, V) with (n, L) = {tuple(answers.shape)} "
                         f"(the answers' shape), got {tuple(logits.shape)}")
    if int(answers.min()) < 0 or int(answers.max()) >= logits.shape[2]:
        raise ValueError(f"answers must be token ids in [0, V={logits.shape[2]})")
    return F.log_softmax(logits, dim=-1).gather(2, answers[..., None].long())[..., 0]


def per_token_accuracy(correct: Tensor) -> float:
    """Fraction of answer tokens predicted right: the mean of ``correct`` (n, L), bool."""
    return float(_check_correct(correct).double().mean())


def exact_match(correct: Tensor) -> float:
    """Fraction of answers with *every* token right: rows of ``correct`` (n, L) all True."""
    return float(_check_correct(correct).all(dim=1).double().mean())


def exact_match_from_per_token(p: float | np.ndarray, L: int) -> float | np.ndarray:
    """``p^L``: the exact-match rate of ``L``-token answers whose tokens are each right with
    probability ``p``, independently (Schaeffer et al., 2023, section 2). ``p`` a
    probability or an array of them."""
    L = check_positive_int("L", L)
    arr = np.asarray(p, dtype=np.float64)
    if not np.all(np.isfinite(arr)) or np.any((arr < 0) | (arr > 1)):
        raise ValueError(f"p must hold probabilities in [0, 1], got {p!r}")
    out = arr**L
    return float(out) if out.ndim == 0 else out


def edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    """Levenshtein distance between two token sequences: the fewest insertions, deletions
    and substitutions that turn ``a`` into ``b`` (dynamic programming, O(len a len b))."""
    a, b = list(a), list(b)
    previous = list(range(len(b) + 1))  # distances from a[:0] to b[:j]
    for i, x in enumerate(a, start=1):
        current = [i]
        for j, y in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def token_edit_distance(predicted: Tensor, answers: Tensor) -> float:
    """Mean Levenshtein distance between each predicted answer and the true one, in tokens.

    ``predicted`` and ``answers`` are (n, L) token ids. The metric Schaeffer et al. (2023)
    use as a continuous alternative to exact match: 0 for a perfect answer, at most L.
    """
    predicted = _check_answers(predicted, "predicted")
    answers = _check_answers(answers)
    if predicted.shape[0] != answers.shape[0]:
        raise ValueError(f"predicted and answers must have the same number of rows, got "
                         f"{predicted.shape[0]} and {answers.shape[0]}")
    return float(np.mean([edit_distance(p, a) for p, a in zip(predicted.tolist(), answers.tolist(),
                                                              strict=True)]))


def greedy_answers(model: nn.Module, prompts: Tensor, L: int) -> Tensor:
    """Decode ``L`` tokens greedily after each prompt: (n, L) token ids (no cache; tiny models)."""
    prompts = _check_answers(prompts, "prompts")
    L = check_positive_int("L", L)
    ids = prompts
    with torch.no_grad():
        for _ in range(L):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids[:, prompts.shape[1]:]


# ---------------------------------------------------------------- the sweep


EMERGENCE_RESULTS = data_path("emergence", "fact_recall_sweep.json")


def train_fact_model(prompts: Tensor, answers: Tensor, d_model: int, n_layers: int = 2,
                     steps: int = 300, lr: float = 1e-2, seed: int = 0) -> nn.Module:
    """Train a Llama-style model (d_model // 8 heads, at least one) to recall ``answers`` after ``prompts``.

    Full-batch training on the whole table (see :func:`fact_table`): the loss is the
    cross-entropy of the answer tokens under teacher forcing (the keys carry nothing to
    learn); AdamW without weight decay, linear warmup over a tenth of the steps and a cosine
    decay to ``lr / 10`` (chapter 9's schedule). Returns the model in eval mode.
    """
    from llmbook.nbtools import seed_everything
    from llmbook.training.optim import cosine_schedule, set_lr
    from llmbook.transformer.model import TransformerConfig, TransformerLM

    prompts, answers = _check_answers(prompts, "prompts"), _check_answers(answers)
    d_model, n_layers, steps = (check_positive_int(k, v) for k, v in
                                (("d_model", d_model), ("n_layers", n_layers), ("steps", steps)))
    seed_everything(seed)
    vocab = int(max(prompts.max(), answers.max())) + 1
    config = TransformerConfig.llama_style(vocab_size=vocab, d_model=d_model, n_layers=n_layers,
                                           n_heads=max(1, d_model // 8),
                                           max_seq_len=prompts.shape[1] + answers.shape[1])
    model = TransformerLM(config, generator=torch.Generator().manual_seed(seed))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    inputs = torch.cat([prompts, answers[:, :-1]], dim=1)  # (n, P + L - 1)
    model.train()
    for step in range(steps):
        set_lr(optimizer, cosine_schedule(step, lr, lr / 10, max(1, steps // 10), steps))
        logits = model(inputs)[:, prompts.shape[1] - 1:]  # (n, L, V)
        loss = F.cross_entropy(logits.reshape(-1, vocab), answers.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return model.eval()


def score_answers(model: nn.Module, prompts: Tensor, answers: Tensor) -> dict[str, Any]:
    """Every metric of this module for one model on one test set (greedy decoding for the
    edit distance); per-position accuracy is listed in answer order."""
    logits = answer_logits(model, prompts, answers)  # (n, L, V)
    log_probs = answer_log_probs(logits, answers)  # (n, L)
    correct = logits.argmax(-1) == answers  # (n, L)
    greedy = greedy_answers(model, prompts, answers.shape[1])
    return {"per_token_accuracy": per_token_accuracy(correct),
            "per_position_accuracy": correct.double().mean(0).tolist(),
            "mean_log_prob": float(log_probs.mean()),
            "exact_match": exact_match(correct),
            "exact_match_greedy": exact_match(greedy == answers),
            "token_edit_distance": token_edit_distance(greedy, answers)}


def emergence_sweep(widths: Sequence[int] = (8, 12, 16, 20, 24, 32), n_layers: int = 2,
                    key_digits: int = 3, answer_length: int = 6, steps: int = 300,
                    lr: float = 1e-2, seed: int = 0,
                    log: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train one model per width on the same :func:`fact_table` and score each on it.

    Every model gets the same table, steps and schedule; only the width (and so the
    parameter count) changes. One thread, seeded: the same numbers on one machine, close
    (not bit-equal) on another. ``log(run)`` is called after each model.
    """
    from llmbook.transformer.sizing import parameter_shares

    torch.set_num_threads(1)
    prompts, answers = fact_table(key_digits, answer_length, torch.Generator().manual_seed(seed))
    runs = []
    for d in widths:
        began = time.perf_counter()
        model = train_fact_model(prompts, answers, d, n_layers, steps, lr, seed=seed)
        shares = parameter_shares(model.config)
        runs.append({"d_model": d, "n_layers": n_layers,
                     "N": shares["total"] - shares["embeddings"], "N_total": shares["total"],
                     **score_answers(model, prompts, answers),
                     "train_seconds": round(time.perf_counter() - began, 1)})
        if log is not None:
            log(runs[-1])
    return {"task": f"recall a random {answer_length}-digit answer for each of the "
                    f"{10**key_digits} {key_digits}-digit keys",
            "answer_length": answer_length, "n_facts": 10**key_digits, "steps": steps, "lr": lr,
            "seed": seed, "runs": runs, "made_by": "python data/make_emergence.py"}


# ---------------------------------------------------------------- published runs


@dataclass(frozen=True)
class PublishedRun:
    """A trained model's size and data as its paper states them.

    ``params`` and ``tokens`` are counts (``None`` where the paper does not publish the
    number); ``source`` names the paper and the place in it.
    """

    model: str
    params: float | None
    tokens: float | None
    source: str

    @property
    def tokens_per_parameter(self) -> float | None:
        """``tokens / params``, or ``None`` if either is unpublished."""
        if self.params is None or self.tokens is None:
            return None
        return self.tokens / self.params


PUBLISHED_RUNS: tuple[PublishedRun, ...] = (
    PublishedRun("Chinchilla", 70e9, 1.4e12, "Hoffmann et al. (2022), section 4 and Table 1"),
    PublishedRun("Gopher", 280e9, 300e9, "Rae et al. (2021); Hoffmann et al. (2022), Table 1"),
    PublishedRun("GPT-3 175B", 175e9, 300e9, "Brown et al. (2020), Table 2.1 and section 2.2"),
    PublishedRun("LLaMA 7B", 6.7e9, 1.0e12, "Touvron et al. (2023a), Table 2"),
    PublishedRun("LLaMA 13B", 13.0e9, 1.0e12, "Touvron et al. (2023a), Table 2"),
    PublishedRun("LLaMA 33B", 32.5e9, 1.4e12, "Touvron et al. (2023a), Table 2"),
    PublishedRun("LLaMA 65B", 65.2e9, 1.4e12, "Touvron et al. (2023a), Table 2"),
    PublishedRun("Llama 2 7B", 7e9, 2.0e12, "Touvron et al. (2023b), Table 1"),
    PublishedRun("Llama 2 70B", 70e9, 2.0e12, "Touvron et al. (2023b), Table 1"),
    PublishedRun("PaLM 2", None, None, "Anil et al. (2023): sizes and token counts not published"),
    PublishedRun("Mistral 7B", 7e9, None,
                 "Jiang et al. (2023), abstract: 7 billion parameters; training tokens not published"),
)
"""Parameters and training tokens of the models claims C8 and C9 name, from their papers."""


EMERGENT_SCALES: tuple[tuple[str, str, float, str], ...] = (
    ("few-shot: toxicity classification (CivilComments)", "Gopher", 7.1e9, "Wei et al. (2022), Table 1"),
    ("few-shot: 3-digit addition/subtraction", "GPT-3", 13e9, "Wei et al. (2022), Table 1"),
    ("few-shot: MMLU (57-topic average)", "GPT-3", 175e9, "Wei et al. (2022), Table 1"),
    ("few-shot: Word in Context", "PaLM", 540e9, "Wei et al. (2022), Table 1"),
    ("instruction following (finetuning)", "FLAN (LaMDA)", 68e9, "Wei et al. (2022), Table 1"),
    ("chain-of-thought: math word problems", "LaMDA", 68e9, "Wei et al. (2022), Table 1"),
    ("chain-of-thought: StrategyQA", "PaLM", 62e9, "Wei et al. (2022), Table 1"),
    ("ask-me-anything prompting", "EleutherAI", 6e9, "Wei et al. (2022), Table 1"),
)
"""(ability, model family, parameters at which it emerged, source): rows of the table of
emergent abilities of Wei et al. (2022, "Emergent Abilities of Large Language Models"),
for claim C14."""

CODEX_PASS_AT_1: tuple[tuple[float, float], ...] = ((25e6, 0.0321), (300e6, 0.1317), (12e9, 0.2881))
"""(parameters, HumanEval pass@1) of three Codex models, Chen et al. (2021), Table 1."""


def _check_published(runs: Sequence[PublishedRun]) -> None:
    for run in runs:
        for name in ("params", "tokens"):
            value = getattr(run, name)
            if value is not None and not (isinstance(value, float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{run.model}: {name} must be a positive float or None")


_check_published(PUBLISHED_RUNS)
