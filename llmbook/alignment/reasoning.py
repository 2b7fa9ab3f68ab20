"""RL with verifiable rewards on a task the book's models learn on a CPU: two-number addition.

Introduced in notebooks/20_grpo. Reasoning models are trained by reinforcement learning
against rewards that a *program* computes: an answer is right or wrong, and a checker says
which (Shao et al., 2024, "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in
Open Language Models"; DeepSeek-AI, 2025, "DeepSeek-R1"). The book's version of that
setting is small enough to train in a minute on one core:

* the task: ``"07+12="`` → ``"19$"``, sums of two operands in [0, 99] written with two
  digits each, answers in ordinary decimal followed by the end token ``$``
  (:func:`format_problem`, :func:`format_answer`, :func:`parse_problem`,
  :func:`parse_answer`), drawn by seeded integer arithmetic (:func:`problem_split`);
* a character vocabulary of 14 tokens (:data:`VOCAB`, :func:`encode`, :func:`decode`);
* the verifiable reward: :func:`verify_answer` (one response) and :func:`correctness_rewards`
  (a batch): 1 if the decoded answer is exactly the sum, else 0;
* a tiny GPT-2-style :class:`~llmbook.transformer.model.TransformerLM`
  (:func:`arithmetic_model`, 0.1M parameters), trained by supervised fine-tuning to only
  *partial* accuracy (:func:`sft_loss`, :func:`train_sft`; artifact ``"arithmetic_sft"``),
  so that RL has room to improve it;
* sampling and scoring: :func:`sample_responses` (G answers per prompt, cut at the first
  end token), :func:`answer_mask`, :func:`accuracy`;
* GRPO: :func:`grpo_microbatch_step`, one gradient of the GRPO loss
  (:func:`llmbook.alignment.losses.grpo_loss`) accumulated over micro-batches so that it
  equals the full-batch gradient under each aggregation, and :func:`train_grpo`, the loop
  (artifact ``"arithmetic_grpo"``);
* a toy that isolates the length bias of the aggregations (:class:`LengthToyPolicy`,
  :func:`run_length_toy`; Liu et al., 2025, "Understanding R1-Zero-like Training: A
  Critical Perspective").

Test-time compute (majority voting, best-of-N, pass@k) is in
:mod:`llmbook.alignment.repeated_sampling`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from llmbook.alignment.logprobs import masked_mean, response_logprobs
from llmbook.alignment.losses import GRPO_AGGREGATIONS, group_normalized_rewards, grpo_loss
from llmbook.alignment.shipped import load_artifact, register
from llmbook.inference.sampling import generate
from llmbook.training.optim import SGD, AdamW, clip_grad_norm_, cosine_schedule, set_lr
from llmbook.training.train import param_groups
from llmbook.transformer.model import TransformerConfig, TransformerLM
from llmbook.validation import check_positive_int, check_positive_number

__all__ = [
    "END",
    "END_ID",
    "GRPOBatch",
    "GRPO_RECIPE",
    "LengthToyPolicy",
    "MAX_OPERAND",
    "PAD",
    "PAD_ID",
    "PROMPT_LENGTH",
    "RESPONSE_LENGTH",
    "SFT_RECIPE",
    "VOCAB",
    "accuracy",
    "answer_mask",
    "arithmetic_model",
    "correctness_rewards",
    "decode",
    "encode",
    "format_answer",
    "format_problem",
    "grpo_microbatch_step",
    "load_arithmetic_model",
    "make_grpo_batch",
    "parse_answer",
    "parse_problem",
    "problem_split",
    "prompt_ids",
    "run_length_toy",
    "sample_responses",
    "sft_loss",
    "target_ids",
    "train_grpo",
    "train_sft",
    "verify_answer",
]

# ---------------------------------------------------------------- the task and its vocabulary

#: Operands lie in [0, MAX_OPERAND] and are written with two digits ("07").
MAX_OPERAND = 99
END, PAD = "$", "_"
#: The 14 characters, one token each: digits 0-9 are ids 0-9, then "+", "=", end, pad.
VOCAB = "0123456789+=" + END + PAD
END_ID, PAD_ID = VOCAB.index(END), VOCAB.index(PAD)
_WIDTH = len(str(MAX_OPERAND))
#: "07+12=": every prompt has the same length.
PROMPT_LENGTH = 2 * _WIDTH + 2
#: Room for the longest answer, "198$", and one more token: a model may ramble past it.
RESPONSE_LENGTH = len(str(2 * MAX_OPERAND)) + 2


def encode(text: str) -> Tensor:
    """The token ids of ``text``, one per character: str (n chars) -> (n,) long."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    bad = sorted(set(text) - set(VOCAB))
    if bad:
        raise ValueError(f"characters {bad} are not in the vocabulary {VOCAB!r}")
    return torch.tensor([VOCAB.index(c) for c in text], dtype=torch.long)


def decode(ids: Tensor | Sequence[int]) -> str:
    """The text of token ids (a 1-d tensor or a list of ints in [0, 14))."""
    values = ids.tolist() if isinstance(ids, Tensor) else list(ids)
    if isinstance(ids, Tensor) and ids.ndim != 1:
        raise ValueError(f"decode takes one sequence (n,), got shape {tuple(ids.shape)}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < len(VOCAB):
            raise ValueError(f"token ids must be ints in [0, {len(VOCAB)}), found {v!r}")
    return "".join(VOCAB[v] for v in values)


def format_problem(a: int, b: int) -> str:
    """The prompt of a + b, operands written with two digits: (7, 12) -> "07+12="."""
    for name, v in (("a", a), ("b", b)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {v!r}")
        if not 0 <= v <= MAX_OPERAND:
            raise ValueError(f"{name} must lie in [0, {MAX_OPERAND}], got {name}={v}")
    return f"{a:0{_WIDTH}d}+{b:0{_WIDTH}d}="


def format_answer(total: int) -> str:
    """The target response: the sum in decimal (no leading zeros) and the end token: 19 -> "19$"."""
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise ValueError(f"total must be a non-negative int, got {total!r}")
    return f"{total}{END}"


def parse_problem(prompt: str) -> tuple[int, int]:
    """The operands of a prompt: "07+12=" -> (7, 12); a malformed prompt is a ``ValueError``."""
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
    parts = prompt[:-1].split("+")
    ok = (len(prompt) == PROMPT_LENGTH and prompt.endswith("=") and len(parts) == 2
          and all(len(p) == _WIDTH and p.isdigit() and p.isascii() for p in parts))
    if not ok:
        raise ValueError(f"malformed problem {prompt!r}: expected two {_WIDTH}-digit operands "
                         f"as in {format_problem(7, 12)!r}")
    return int(parts[0]), int(parts[1])


def parse_answer(response: str) -> int | None:
    """The integer a response answers, or None if it gives none.

    The answer is the text before the first end token; it counts only if it is a
    non-empty run of digits without a leading zero ("0" itself is fine) and the end token
    was written. "19$__" -> 19; "19" (unfinished), "$", "019$", "1+9$" -> None.
    """
    if not isinstance(response, str):
        raise TypeError(f"response must be a str, got {type(response).__name__}")
    head, found, _ = response.partition(END)
    if not found or not head or not (head.isdigit() and head.isascii()):
        return None
    if len(head) > 1 and head[0] == "0":
        return None
    return int(head)


def verify_answer(prompt: str, response: str) -> bool:
    """The verifiable reward of one response: is its answer exactly the sum asked for?"""
    a, b = parse_problem(prompt)
    return parse_answer(response) == a + b


def problem_split(split: str, seed: int = 0) -> Tensor:
    """The operand pairs of ``split``: (N, 2) long.

    All (MAX_OPERAND + 1)^2 = 10 000 pairs, shuffled by a seeded ``randperm`` (integer
    arithmetic, the same on every machine): the first 500 are the held-out ``"test"``
    problems, the other 9 500 the ``"train"`` problems that SFT and RL draw from.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    n = MAX_OPERAND + 1
    order = torch.randperm(n * n, generator=torch.Generator().manual_seed(seed))
    pairs = torch.stack([order // n, order % n], dim=1)  # (n^2, 2)
    return pairs[:500] if split == "test" else pairs[500:]


def _check_problems(problems: object) -> Tensor:
    if not isinstance(problems, Tensor) or problems.dtype != torch.long:
        raise TypeError("problems must be a (N, 2) torch.long tensor of operands")
    if problems.ndim != 2 or problems.shape[1] != 2 or problems.shape[0] == 0:
        raise ValueError(f"problems must have shape (N, 2) with N >= 1, got {tuple(problems.shape)}")
    if bool((problems < 0).any()) or bool((problems > MAX_OPERAND).any()):
        raise ValueError(f"problems must hold operands in [0, {MAX_OPERAND}], found "
                         f"{int(problems.min())}..{int(problems.max())}")
    return problems


def prompt_ids(problems: Tensor) -> Tensor:
    """The prompts of operand pairs as token ids: (N, 2) -> (N, PROMPT_LENGTH).

    Row i is ``encode(format_problem(a_i, b_i))``, built with integer arithmetic (the id of
    a digit is the digit itself).
    """
    problems = _check_problems(problems)
    powers = 10 ** torch.arange(_WIDTH - 1, -1, -1)  # (W,): 10, 1

    def digits(x: Tensor) -> Tensor:
        return (x[:, None] // powers) % 10  # (N, W)

    a, b = problems.unbind(1)
    plus, equals = (torch.full_like(a[:, None], VOCAB.index(c)) for c in "+=")
    return torch.cat([digits(a), plus, digits(b), equals], dim=1)  # (N, P)


def target_ids(problems: Tensor) -> tuple[Tensor, Tensor]:
    """The correct responses of operand pairs, right-padded: (N, 2) -> (targets, mask).

    ``targets`` (N, RESPONSE_LENGTH) long holds the answer and the end token, then padding;
    ``mask`` (N, RESPONSE_LENGTH) bool marks the answer and the end token (what SFT trains on).
    """
    problems = _check_problems(problems)
    rows = [format_answer(a + b) for a, b in problems.tolist()]
    targets = torch.stack([encode(r.ljust(RESPONSE_LENGTH, PAD)) for r in rows])
    mask = torch.arange(RESPONSE_LENGTH)[None, :] < torch.tensor([len(r) for r in rows])[:, None]
    return targets, mask


def answer_mask(responses: Tensor) -> Tensor:
    """Which response tokens count: those up to and including the first end token.

    ``responses`` (N, R) long -> (N, R) bool. A response without an end token counts in
    full (it was cut at R tokens; its answer is then None and its reward 0). These are the
    tokens a policy-gradient loss is averaged over: the response's length is the row sum.
    """
    if not isinstance(responses, Tensor) or responses.dtype != torch.long or responses.ndim != 2:
        raise TypeError("responses must be a (N, R) torch.long tensor of token ids")
    is_end = responses == END_ID  # (N, R)
    ends_before = torch.cumsum(is_end.long(), dim=1) - is_end.long()  # end tokens strictly before t
    return ends_before == 0


def correctness_rewards(problems: Tensor, responses: Tensor) -> Tensor:
    """The verifiable reward of each response: 1.0 if its answer is the sum, else 0.0.

    ``problems`` (N, 2) long operands and ``responses`` (N, R) long token ids -> (N,) in the
    default float dtype. Each response is decoded and checked by :func:`parse_answer`.
    """
    problems = _check_problems(problems)
    if not isinstance(responses, Tensor) or responses.dtype != torch.long or responses.ndim != 2:
        raise TypeError("responses must be a (N, R) torch.long tensor of token ids")
    if responses.shape[0] != problems.shape[0]:
        raise ValueError(f"{problems.shape[0]} problems but {responses.shape[0]} responses")
    right = [parse_answer(decode(r)) == a + b for (a, b), r in zip(problems.tolist(), responses, strict=True)]
    return torch.tensor(right, dtype=torch.get_default_dtype())


# ---------------------------------------------------------------- the model and its SFT


def arithmetic_model(d_model: int = 64, n_layers: int = 2, n_heads: int = 4,
                     generator: torch.Generator | None = None) -> TransformerLM:
    """A tiny GPT-2-style model over the 14-token vocabulary, context PROMPT + RESPONSE = 11."""
    config = TransformerConfig.gpt2_style(vocab_size=len(VOCAB), d_model=d_model, n_layers=n_layers,
                                          n_heads=n_heads, max_seq_len=PROMPT_LENGTH + RESPONSE_LENGTH,
                                          activation="gelu")
    return TransformerLM(config, generator=generator)


def sft_loss(model: nn.Module, problems: Tensor) -> Tensor:
    """Supervised fine-tuning loss: mean -log p(answer token | prompt, earlier answer tokens).

    The mean runs over the answer and end tokens of the batch (N, 2) (padding excluded): the
    maximum-likelihood objective of chapter 3, restricted to the response.
    """
    targets, mask = target_ids(problems)
    logp = response_logprobs(model, prompt_ids(problems), targets)  # (N, R)
    return -masked_mean(logp, mask)


@torch.no_grad()
def sample_responses(model: nn.Module, problems: Tensor, num_samples: int = 1,
                     temperature: float = 1.0, generator: torch.Generator | None = None) -> Tensor:
    """``num_samples`` responses to each problem: (N, 2) -> (N * num_samples, RESPONSE_LENGTH).

    The rows of problem i are rows i*G ... i*G + G - 1 (G = ``num_samples``): the group
    layout of :func:`~llmbook.alignment.losses.group_normalized_rewards`. Tokens after the
    first end token are replaced by padding. ``temperature=0`` is greedy decoding.
    """
    num_samples = check_positive_int("num_samples", num_samples)
    prompts = prompt_ids(problems).repeat_interleave(num_samples, dim=0)  # (N G, P)
    out = generate(model, prompts, RESPONSE_LENGTH, temperature=temperature,
                   generator=generator)[:, PROMPT_LENGTH:]  # (N G, R)
    return torch.where(answer_mask(out), out, torch.full_like(out, PAD_ID))


def accuracy(model: nn.Module, problems: Tensor, temperature: float = 0.0, num_samples: int = 1,
             generator: torch.Generator | None = None) -> float:
    """The fraction of correct responses: greedy (``temperature=0``) or sampled."""
    responses = sample_responses(model, problems, num_samples, temperature, generator)
    rewards = correctness_rewards(problems.repeat_interleave(num_samples, dim=0), responses)
    return float(rewards.double().mean())


def _adamw(model: nn.Module, lr: float, weight_decay: float) -> AdamW:
    return AdamW(param_groups(model, weight_decay), lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)


SFT_RECIPE: dict[str, Any] = {
    "model": {"d_model": 64, "n_layers": 2, "n_heads": 4}, "init_seed": 0, "data_seed": 1,
    "steps": 400, "batch_size": 64, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 20,
    "weight_decay": 0.1, "grad_clip": 1.0, "eval_every": 25,
}


def train_sft(recipe: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Supervised fine-tuning from random weights; the trainer of artifact ``"arithmetic_sft"``.

    ``steps`` AdamW updates (warmup + cosine) on batches of ``batch_size`` problems drawn
    with replacement from the ``"train"`` split, minimising :func:`sft_loss`. The run is
    deliberately short, so the model ends *partly* right. Returns the state dict and the
    loss per step with the held-out greedy accuracy every ``eval_every`` steps.
    """
    torch.set_num_threads(1)
    model = arithmetic_model(**recipe["model"], generator=torch.Generator().manual_seed(recipe["init_seed"]))
    opt = _adamw(model, recipe["lr"], recipe["weight_decay"])
    train, test = problem_split("train"), problem_split("test")
    g = torch.Generator().manual_seed(recipe["data_seed"])
    losses, eval_steps, test_acc = [], [], []
    for step in range(recipe["steps"]):
        if step % recipe["eval_every"] == 0:
            eval_steps.append(step)
            test_acc.append(accuracy(model, test))
        set_lr(opt, cosine_schedule(step, recipe["lr"], recipe["min_lr"], recipe["warmup_steps"],
                                    recipe["steps"]))
        batch = train[torch.randint(len(train), (recipe["batch_size"],), generator=g)]
        loss = sft_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        clip_grad_norm_(model.parameters(), recipe["grad_clip"])
        opt.step()
        losses.append(loss.item())
    eval_steps.append(recipe["steps"])
    test_acc.append(accuracy(model, test))
    info = {"loss": losses, "eval_steps": eval_steps, "test_accuracy": test_acc,
            "test_accuracy_greedy": test_acc[-1], "num_parameters": model.num_parameters()}
    return dict(model.state_dict()), info


register("arithmetic_sft", SFT_RECIPE, train_sft, __name__)


def load_arithmetic_model(name: str = "arithmetic_sft") -> tuple[TransformerLM, dict[str, Any]]:
    """A shipped arithmetic model (``"arithmetic_sft"`` or ``"arithmetic_grpo"``) and its info."""
    if name not in ("arithmetic_sft", "arithmetic_grpo"):
        raise ValueError(f"name must be 'arithmetic_sft' or 'arithmetic_grpo', got {name!r}")
    tensors, info = load_artifact(name)
    model = arithmetic_model(**SFT_RECIPE["model"])  # GRPO fine-tunes the SFT model: one shape
    model.load_state_dict(tensors)
    return model.eval(), info


# ---------------------------------------------------------------- GRPO


class GRPOBatch(NamedTuple):
    """One batch of GRPO rollouts: G responses to each of M problems (N = M G rows).

    ``prompts`` (N, P) and ``responses`` (N, R) token ids; ``mask`` (N, R) bool, the tokens
    that count (:func:`answer_mask`); ``rewards`` and ``advantages`` (N,); ``old_logprobs``
    (N, R), the sampling policy's per-token log-probabilities; ``ref_logprobs`` (N, R) the
    reference model's, or None when there is no KL penalty.
    """

    prompts: Tensor
    responses: Tensor
    mask: Tensor
    rewards: Tensor
    advantages: Tensor
    old_logprobs: Tensor
    ref_logprobs: Tensor | None


@torch.no_grad()
def make_grpo_batch(policy: nn.Module, reference: nn.Module | None, problems: Tensor, group_size: int,
                    temperature: float = 1.0, normalize_std: bool = True,
                    generator: torch.Generator | None = None) -> GRPOBatch:
    """Sample G = ``group_size`` responses per problem from ``policy``, score and normalise them.

    Rewards are :func:`correctness_rewards`; advantages are GRPO's group-relative
    (r - mean) / std, or r - mean with ``normalize_std=False`` (Dr. GRPO), from
    :func:`~llmbook.alignment.losses.group_normalized_rewards`.
    """
    group_size = check_positive_int("group_size", group_size)
    if group_size < 2:
        raise ValueError(f"group_size must be at least 2 (a group of one has no baseline), "
                         f"got group_size={group_size}")
    responses = sample_responses(policy, problems, group_size, temperature, generator)
    prompts = prompt_ids(problems).repeat_interleave(group_size, dim=0)
    rewards = correctness_rewards(problems.repeat_interleave(group_size, dim=0), responses)
    advantages = group_normalized_rewards(rewards, group_size, normalize_std)
    old = response_logprobs(policy, prompts, responses)
    ref = None if reference is None else response_logprobs(reference, prompts, responses)
    return GRPOBatch(prompts, responses, answer_mask(responses), rewards, advantages, old, ref)


def _check_batch(batch: object) -> GRPOBatch:
    if not isinstance(batch, GRPOBatch):
        raise TypeError(f"batch must be a GRPOBatch, got {type(batch).__name__}")
    N, R = batch.responses.shape
    shapes = {"prompts": (N, batch.prompts.shape[-1]), "mask": (N, R), "rewards": (N,),
              "advantages": (N,), "old_logprobs": (N, R)}
    if batch.ref_logprobs is not None:
        shapes["ref_logprobs"] = (N, R)
    for name, shape in shapes.items():
        got = tuple(getattr(batch, name).shape)
        if got != shape:
            raise ValueError(f"batch.{name} must have shape {shape} (N = {N} responses of "
                             f"R = {R} tokens), got {got}")
    if batch.mask.dtype != torch.bool:
        raise TypeError(f"batch.mask must be boolean, got {batch.mask.dtype}")
    if bool((batch.mask.sum(1) == 0).any()):
        raise ValueError("batch.mask has a row with no tokens: every response needs at least one")
    return batch


def grpo_microbatch_step(policy: nn.Module, batch: GRPOBatch, micro_batch_size: int, clip_eps: float,
                         beta: float = 0.0, aggregation: str = "sequence_mean",
                         max_length: int | None = None,
                         clip_eps_high: float | None = None) -> dict[str, float]:
    """Accumulate the gradient of the GRPO loss of ``batch`` in ``policy``'s ``.grad``, in micro-batches.

    The batch's N rows are cut into slices of ``micro_batch_size`` rows; each slice is run
    through the policy (trimmed to its own longest response: slices have *uneven* lengths)
    and its :func:`~llmbook.alignment.losses.grpo_loss` is back-propagated with a weight
    chosen so that the accumulated gradient is the full batch's under ``aggregation``:

    * ``"sequence_mean"`` (GRPO): the loss is a mean over sequences, so a slice of b rows
      weighs b / N;
    * ``"token_mean"`` (DAPO): a mean over all tokens of the batch, so a slice holding n
      of the batch's N_tok tokens weighs n / N_tok. Averaging the slices' token means
      instead (weight b / N) would count a token of a slice of short responses more;
    * ``"constant"`` (Dr. GRPO): a sum over tokens / (N * max_length), with ``max_length``
      (default R) the same for every slice; a slice weighs b / N.

    Call ``zero_grad`` before and ``optimizer.step()`` after. Returns the full batch's
    ``loss``, token-mean ``kl`` (None without ``ref_logprobs``) and ``clip_fraction``.
    """
    batch = _check_batch(batch)
    micro_batch_size = check_positive_int("micro_batch_size", micro_batch_size)
    if aggregation not in GRPO_AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {GRPO_AGGREGATIONS}, got {aggregation!r}")
    N, R = batch.responses.shape
    if aggregation == "constant":
        max_length = R if max_length is None else check_positive_int("max_length", max_length)
    elif max_length is not None:
        raise ValueError("max_length applies to aggregation='constant' only")
    lengths = batch.mask.sum(1)  # (N,)
    total_tokens = int(lengths.sum())
    loss_sum, kl_sum, clip_sum = 0.0, 0.0, 0.0
    for start in range(0, N, micro_batch_size):
        rows = slice(start, min(start + micro_batch_size, N))
        b, T = rows.stop - rows.start, int(lengths[rows].max())  # this slice's longest response
        n_tokens = int(lengths[rows].sum())
        logp = response_logprobs(policy, batch.prompts[rows], batch.responses[rows, :T])  # (b, T)
        ref = None if batch.ref_logprobs is None else batch.ref_logprobs[rows, :T]
        out = grpo_loss(logp, batch.old_logprobs[rows, :T], ref, batch.advantages[rows],
                        batch.mask[rows, :T], clip_eps, beta, aggregation, clip_eps_high,
                        max_length if aggregation == "constant" else None)
        weight = n_tokens / total_tokens if aggregation == "token_mean" else b / N
        (weight * out.loss).backward()
        loss_sum += weight * out.loss.item()
        if out.kl is not None:
            kl_sum += out.kl.item() * n_tokens / total_tokens
        clip_sum += out.clip_fraction.item() * n_tokens / total_tokens
    return {"loss": loss_sum, "kl": kl_sum if batch.ref_logprobs is not None else None,
            "clip_fraction": clip_sum}


GRPO_RECIPE: dict[str, Any] = {
    "start": "arithmetic_sft", "seed": 0, "steps": 200, "prompts_per_step": 64, "group_size": 8,
    "temperature": 1.0, "updates_per_batch": 2, "micro_batch_size": 128, "lr": 5e-4,
    "warmup_steps": 10, "weight_decay": 0.0, "grad_clip": 1.0, "clip_eps": 0.2, "beta": 0.04,
    "aggregation": "sequence_mean", "normalize_std": True, "eval_every": 10,
    "eval_samples": 8, "eval_seed": 1234,
}


def train_grpo(recipe: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """GRPO from the shipped SFT model; the trainer of artifact ``"arithmetic_grpo"``.

    Each step draws ``prompts_per_step`` training problems, samples ``group_size``
    responses to each from the current policy (:func:`make_grpo_batch`, reward = exact
    correctness) and takes ``updates_per_batch`` AdamW steps on that batch with
    :func:`grpo_microbatch_step` (PPO-style reuse, so the ratio and its clipping are
    active from the second update on). The SFT model is the frozen KL reference. Records per
    step the mean reward, mean response length, KL and clip fraction, every ``eval_every``
    steps the held-out greedy accuracy, and at the end the held-out greedy and sampled
    accuracy of the start and the final model.
    """
    torch.set_num_threads(1)
    reference, _ = load_arithmetic_model(recipe["start"])
    policy, _ = load_arithmetic_model(recipe["start"])
    policy.train()
    for p in reference.parameters():
        p.requires_grad_(False)
    opt = _adamw(policy, recipe["lr"], recipe["weight_decay"])
    train, test = problem_split("train"), problem_split("test")
    g = torch.Generator().manual_seed(recipe["seed"])
    curve: dict[str, list] = {"reward": [], "length": [], "kl": [], "clip_fraction": [],
                              "eval_steps": [], "test_accuracy": []}
    for step in range(recipe["steps"]):
        if step % recipe["eval_every"] == 0:
            curve["eval_steps"].append(step)
            curve["test_accuracy"].append(accuracy(policy, test))
        set_lr(opt, cosine_schedule(step, recipe["lr"], recipe["lr"], recipe["warmup_steps"],
                                    recipe["steps"]))  # linear warmup, then constant
        problems = train[torch.randint(len(train), (recipe["prompts_per_step"],), generator=g)]
        batch = make_grpo_batch(policy, reference if recipe["beta"] else None, problems,
                                recipe["group_size"], recipe["temperature"], recipe["normalize_std"], g)
        for _ in range(recipe["updates_per_batch"]):
            opt.zero_grad(set_to_none=True)
            stats = grpo_microbatch_step(policy, batch, recipe["micro_batch_size"], recipe["clip_eps"],
                                         recipe["beta"], recipe["aggregation"])
            clip_grad_norm_(policy.parameters(), recipe["grad_clip"])
            opt.step()
        curve["reward"].append(float(batch.rewards.mean()))
        curve["length"].append(float(batch.mask.sum(1).double().mean()))
        curve["kl"].append(stats["kl"])
        curve["clip_fraction"].append(stats["clip_fraction"])
    curve["eval_steps"].append(recipe["steps"])
    curve["test_accuracy"].append(accuracy(policy, test))
    start, _ = load_arithmetic_model(recipe["start"])
    scores = {}
    for name, model in (("sft", start), ("grpo", policy)):
        scores[f"{name}_greedy"] = accuracy(model, test)
        scores[f"{name}_sampled"] = accuracy(model, test, 1.0, recipe["eval_samples"],
                                             torch.Generator().manual_seed(recipe["eval_seed"]))
    return dict(policy.state_dict()), {"curve": curve, "scores": scores}


register("arithmetic_grpo", GRPO_RECIPE, train_grpo, __name__)


# ---------------------------------------------------------------- a toy for the length bias


class LengthToyPolicy(nn.Module):
    """A two-class "answer" policy whose only learnable choice is how long to go on.

    A response is a class token (right, with the fixed probability ``p_correct``, or wrong),
    then "digit" tokens, then an end token; it has L tokens in all, 2 <= L <= ``max_length``.
    At position t = 1, ..., max_length - 2 it writes a digit with probability
    sigmoid(h[c, t - 1]) and otherwise ends, where c is 1 for a right and 0 for a wrong
    response; at position max_length - 1 it must end. The reward (1 if right) does not depend
    on the length, so an unbiased policy gradient leaves the logits h (2, max_length - 2)
    where they are: whatever moves them is a bias of the loss.
    """

    def __init__(self, max_length: int = 8, p_correct: float = 0.5) -> None:
        super().__init__()
        self.max_length = check_positive_int("max_length", max_length)
        if max_length < 3:
            raise ValueError(f"max_length must be at least 3 (class, digit, end), got {max_length}")
        if not 0 < p_correct < 1:
            raise ValueError(f"p_correct must lie in (0, 1), got {p_correct}")
        self.p_correct = float(p_correct)
        self.continue_logits = nn.Parameter(torch.zeros(2, max_length - 2, dtype=torch.float64))

    @torch.no_grad()
    def sample(self, num: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """``num`` responses as (correct (num,) bool, lengths (num,) long)."""
        num = check_positive_int("num", num)
        correct = torch.rand(num, generator=generator, dtype=torch.float64) < self.p_correct
        q = torch.sigmoid(self.continue_logits[correct.long()])  # (num, max_length - 2)
        go_on = torch.rand(q.shape, generator=generator, dtype=torch.float64) < q
        digits = torch.cumprod(go_on.long(), dim=1).sum(1)  # digits written before the first stop
        return correct, digits + 2

    def token_logprobs(self, correct: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """Per-token log-probabilities of responses and their mask: (num, max_length) each.

        Position 0 is the class token (a constant here); positions 1 .. L - 2 the digits,
        log sigmoid(h); position L - 1 the end token, log(1 - sigmoid(h)), or 0 where ending
        is forced (L = max_length).
        """
        if correct.shape != lengths.shape or correct.ndim != 1:
            raise ValueError(f"correct and lengths must be (num,) of one shape, got "
                             f"{tuple(correct.shape)} and {tuple(lengths.shape)}")
        if bool(((lengths < 2) | (lengths > self.max_length)).any()):
            raise ValueError(f"lengths must lie in [2, {self.max_length}], got {lengths.tolist()}")
        num, T = correct.shape[0], self.max_length
        h = self.continue_logits[correct.long()]  # (num, T - 2)
        t = torch.arange(1, T - 1)[None, :]  # positions 1 .. T - 2
        digit = nn.functional.logsigmoid(h) * (t < lengths[:, None] - 1)
        end = nn.functional.logsigmoid(-h) * (t == lengths[:, None] - 1)
        p = torch.tensor(self.p_correct, dtype=h.dtype)
        first = torch.log(torch.where(correct, p, 1 - p))  # (num,)
        logprobs = torch.cat([first[:, None], digit + end, torch.zeros(num, 1, dtype=h.dtype)], dim=1)
        mask = torch.arange(T)[None, :] < lengths[:, None]
        return logprobs, mask  # (num, T) each

    @torch.no_grad()
    def expected_lengths(self) -> tuple[float, float]:
        """Exact E[L | right] and E[L | wrong]: 2 + sum_t P(still writing digits at position t)."""
        survive = torch.cumprod(torch.sigmoid(self.continue_logits), dim=1)  # (2, T - 2)
        mean = 2 + survive.sum(1)
        return float(mean[1]), float(mean[0])


def run_length_toy(aggregation: str, steps: int = 150, group_size: int = 8, num_groups: int = 16,
                   lr: float = 2.0, max_length: int = 8, normalize_std: bool = True,
                   seed: int = 0) -> dict[str, list[float]]:
    """GRPO on :class:`LengthToyPolicy` under one ``aggregation``; the exact mean lengths per step.

    Each step samples ``num_groups`` groups of ``group_size`` responses, computes GRPO's
    group-relative advantages of the 0/1 rewards, and takes one SGD step of size ``lr`` on
    :func:`~llmbook.alignment.losses.grpo_loss` (on-policy, so the ratio is 1 and nothing
    is clipped). Returns ``{"right": [...], "wrong": [...]}``, E[L | right] and
    E[L | wrong] before each step and after the last (``steps + 1`` values each).
    """
    if aggregation not in GRPO_AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {GRPO_AGGREGATIONS}, got {aggregation!r}")
    steps = check_positive_int("steps", steps)
    check_positive_int("num_groups", num_groups)
    check_positive_number("lr", lr)
    policy = LengthToyPolicy(max_length)
    opt = SGD(policy.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    history: dict[str, list[float]] = {"right": [], "wrong": []}
    for _ in range(steps):
        right, wrong = policy.expected_lengths()
        history["right"].append(right)
        history["wrong"].append(wrong)
        correct, lengths = policy.sample(group_size * num_groups, g)
        adv = group_normalized_rewards(correct.double(), group_size, normalize_std)
        logprobs, mask = policy.token_logprobs(correct, lengths)
        opt.zero_grad()
        grpo_loss(logprobs, None, None, adv, mask, 0.2, 0.0, aggregation).loss.backward()
        opt.step()
    right, wrong = policy.expected_lengths()
    history["right"].append(right)
    history["wrong"].append(wrong)
    return history
