"""A reward model: the book's text model with a scalar head, trained on preference pairs.

Introduced in notebooks/17_sft_reward_models. A reward model r_phi(x, y) scores a response y
to a prompt x with one number. It is trained on pairs (x, y_c, y_r) where a labeller
preferred y_c ("chosen") to y_r ("rejected"), by maximum likelihood under the
Bradley–Terry model (Bradley & Terry, 1952, "Rank Analysis of Incomplete Block Designs"):

    P(y_c > y_r | x) = sigma(r_phi(x, y_c) - r_phi(x, y_r)),

so the loss is -log sigma(r_c - r_r) (:func:`llmbook.alignment.losses.bradley_terry_loss`),
as for InstructGPT (Ouyang et al., 2022, "Training language models to follow instructions
with human feedback", section 3.5): a pretrained language model without its LM head, with a
linear head that reads one scalar off the final hidden state of the last token.

This module holds:

* :class:`RewardModel`: backbone + scalar head, ``forward(prompt_ids, response_ids) -> (B,)``;
* :func:`reward_model_loss`, :func:`reward_model_step`, :func:`train_reward_model`: the
  Bradley–Terry training, chosen and rejected responses in one forward pass;
* :func:`pairwise_accuracy`, :func:`bayes_optimal_accuracy`, :func:`pearson_correlation`,
  :func:`spearman_correlation`, :func:`evaluate_reward_model`: how good a reward model is,
  and the best accuracy any model can reach on noisy labels;
* the shipped artifact ``"reward_model"`` (:mod:`llmbook.alignment.shipped`), trained on
  :func:`~llmbook.alignment.preferences.preference_data`, and :func:`load_reward_model`.
"""

from __future__ import annotations

import copy
import math
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from llmbook.alignment.logprobs import _check_prompt_response
from llmbook.alignment.losses import bradley_terry_loss
from llmbook.alignment.preferences import PREFERENCE_RECIPE, PreferenceData, preference_data
from llmbook.alignment.shipped import load_artifact, register
from llmbook.transformer.model import TransformerLM
from llmbook.validation import (
    check_finite,
    check_nonnegative_number,
    check_positive_int,
    check_positive_number,
    check_token_ids,
)
from llmbook.validation import check_floating_tensor as _check_floating

__all__ = [
    "REWARD_MODEL_RECIPE",
    "RewardModel",
    "RewardModelLoss",
    "bayes_optimal_accuracy",
    "evaluate_reward_model",
    "load_reward_model",
    "pairwise_accuracy",
    "pearson_correlation",
    "reward_model_loss",
    "reward_model_step",
    "spearman_correlation",
    "train_reward_model",
]


class RewardModel(nn.Module):
    """A language model's final hidden state at the last token, mapped to one scalar reward.

    ``backbone`` is a :class:`~llmbook.transformer.model.TransformerLM` (used as it is, not
    copied; its LM head is not used). ``head`` is ``nn.Linear(d_model, 1)`` initialised to
    zero, so an untrained reward model gives every response the reward 0 and every pair the
    Bradley–Terry probability 1/2 (loss log 2). ``trainable_blocks`` = k trains the head, the
    final norm and the last k decoder blocks and freezes the rest (None: train everything),
    ``train_embeddings`` also the token and position embeddings; see :meth:`set_trainable`.

    ``forward(prompt_ids (B, P), response_ids (B, R)) -> rewards (B,)`` runs the backbone on
    [x; y] and applies the head to the hidden state of the last response token, which (by
    causal attention) has seen the whole prompt and response. Every row has the same P and
    R: responses are not padded.
    """

    def __init__(self, backbone: TransformerLM, trainable_blocks: int | None = None,
                 train_embeddings: bool = False) -> None:
        super().__init__()
        if not isinstance(backbone, TransformerLM):
            raise TypeError(f"backbone must be a TransformerLM, got {type(backbone).__name__}")
        self.backbone = backbone
        p = next(backbone.parameters())
        self.head = nn.Linear(backbone.config.d_model, 1, device=p.device, dtype=p.dtype)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.set_trainable(trainable_blocks, train_embeddings)

    def set_trainable(self, trainable_blocks: int | None, train_embeddings: bool = False) -> None:
        """Train the head, the final norm and the last ``trainable_blocks`` blocks (None: every
        parameter), and the token and position embeddings if ``train_embeddings``; freeze the rest.

        Freezing the lower blocks *and* the embeddings also saves their backward pass:
        autograd records nothing before the first tensor that needs a gradient.
        """
        L = len(self.backbone.blocks)
        k = trainable_blocks
        if k is not None:
            if isinstance(k, bool) or not isinstance(k, int):
                raise TypeError(f"trainable_blocks must be an int or None, got {k!r}")
            if not 0 <= k <= L:
                raise ValueError(f"trainable_blocks must lie in [0, {L}] (the number of blocks), "
                                 f"got {k}")
        if not isinstance(train_embeddings, bool):
            raise TypeError(f"train_embeddings must be a bool, got {train_embeddings!r}")
        self.trainable_blocks, self.train_embeddings = k, train_embeddings
        self.backbone.requires_grad_(k is None)
        if k is not None:
            for block in self.backbone.blocks[L - k:]:
                block.requires_grad_(True)
            self.backbone.final_norm.requires_grad_(True)
            if train_embeddings:
                self.backbone.embed.requires_grad_(True)
                if self.backbone.pos_embed is not None:
                    self.backbone.pos_embed.requires_grad_(True)
        self.head.requires_grad_(True)

    def forward(self, prompt_ids: Tensor, response_ids: Tensor) -> Tensor:
        """Rewards r(x, y) of responses (B, R) to prompts (B, P): (B,)."""
        _check_prompt_response(prompt_ids, response_ids, min_prompt=0)
        ids = torch.cat([prompt_ids.long(), response_ids.long()], dim=1)  # (B, P + R)
        h = self.backbone.hidden_states(ids)  # (B, P + R, d), P + R <= max_seq_len checked there
        return self.head(h[:, -1]).squeeze(-1)  # (B,)


class RewardModelLoss(NamedTuple):
    """The Bradley–Terry ``loss`` (a scalar), the pairwise ``accuracy`` (detached, ties 1/2),
    and the rewards ``r_chosen``, ``r_rejected`` (N,) of the pairs."""

    loss: Tensor
    accuracy: Tensor
    r_chosen: Tensor
    r_rejected: Tensor


def _check_pairs(prompts: Tensor, chosen: Tensor, rejected: Tensor) -> None:
    for name, t in (("prompts", prompts), ("chosen", chosen), ("rejected", rejected)):
        check_token_ids(t, name)
        if t.ndim != 2:
            raise ValueError(f"{name} must be 2-d, got shape {tuple(t.shape)}")
    if chosen.shape != rejected.shape or chosen.shape[0] != prompts.shape[0]:
        raise ValueError(f"need prompts (N, P) and chosen, rejected (N, R) of one shape; got "
                         f"{tuple(prompts.shape)}, {tuple(chosen.shape)}, {tuple(rejected.shape)}")
    if prompts.shape[0] == 0:
        raise ValueError("there are no pairs (N = 0)")


def _check_data(data: object, name: str) -> None:
    """A PreferenceData whose prompts (N, P), chosen and rejected (N, R) line up."""
    if not isinstance(data, PreferenceData):
        raise TypeError(f"{name} must be a PreferenceData, got {type(data).__name__}")
    try:
        _check_pairs(data.prompts, data.chosen, data.rejected)
    except (TypeError, ValueError) as err:
        raise type(err)(f"{name}: {err}") from None


def pairwise_accuracy(r_chosen: Tensor, r_rejected: Tensor) -> Tensor:
    """Fraction of pairs the rewards order like the label: mean of [r_c > r_r] + [r_c = r_r]/2.

    (N,), (N,) -> a () tensor. A tie counts one half: a model that cannot tell two
    responses apart is right half the time by guessing.
    """
    check_finite(_check_floating(r_chosen, "r_chosen"), "r_chosen")
    check_finite(_check_floating(r_rejected, "r_rejected"), "r_rejected")
    if r_chosen.shape != r_rejected.shape or r_chosen.ndim != 1 or r_chosen.numel() == 0:
        raise ValueError(f"r_chosen and r_rejected must be (N,) with N >= 1, of one shape; got "
                         f"{tuple(r_chosen.shape)} and {tuple(r_rejected.shape)}")
    right = (r_chosen > r_rejected).to(r_chosen.dtype) + 0.5 * (r_chosen == r_rejected).to(r_chosen.dtype)
    return right.mean()


def reward_model_loss(model: RewardModel, prompts: Tensor, chosen: Tensor, rejected: Tensor,
                      center_coefficient: float = 0.0) -> RewardModelLoss:
    """The Bradley–Terry loss of ``model`` on pairs: prompts (N, P), chosen and rejected (N, R).

    Chosen and rejected responses run as one batch of 2N sequences; the loss is
    :func:`~llmbook.alignment.losses.bradley_terry_loss` (mean over pairs of
    -log sigma(r_c - r_r), plus ``center_coefficient`` * mean((r_c + r_r)^2) if > 0).
    """
    _check_pairs(prompts, chosen, rejected)
    N = prompts.shape[0]
    rewards = model(torch.cat([prompts, prompts]), torch.cat([chosen, rejected]))  # (2N,)
    r_c, r_r = rewards[:N], rewards[N:]
    loss = bradley_terry_loss(r_c, r_r, center_coefficient=center_coefficient)
    return RewardModelLoss(loss, pairwise_accuracy(r_c.detach(), r_r.detach()), r_c, r_r)


def reward_model_step(model: RewardModel, optimizer: Optimizer, prompts: Tensor, chosen: Tensor,
                      rejected: Tensor, grad_clip: float | None = 1.0,
                      center_coefficient: float = 0.0) -> RewardModelLoss:
    """One optimiser step on a batch of pairs; returns the batch's loss, accuracy and rewards
    (detached), as computed before the step. ``grad_clip`` clips the global gradient norm."""
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"optimizer must be a torch Optimizer, got {type(optimizer).__name__}")
    if grad_clip is not None:
        check_positive_number("grad_clip", grad_clip)
    out = reward_model_loss(model, prompts, chosen, rejected, center_coefficient)
    optimizer.zero_grad(set_to_none=True)
    out.loss.backward()
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], grad_clip)
    optimizer.step()
    return RewardModelLoss(out.loss.detach(), out.accuracy, out.r_chosen.detach(), out.r_rejected.detach())


@torch.no_grad()
def _rewards(model: RewardModel, prompts: Tensor, responses: Tensor, batch_size: int = 256) -> Tensor:
    was = model.training
    model.eval()
    out = torch.cat([model(prompts[i:i + batch_size], responses[i:i + batch_size])
                     for i in range(0, prompts.shape[0], batch_size)])
    model.train(was)
    return out


def train_reward_model(model: RewardModel, data: PreferenceData, steps: int, batch_size: int,
                       lr: float, generator: torch.Generator, warmup_steps: int = 0,
                       weight_decay: float = 0.0, grad_clip: float | None = 1.0,
                       eval_data: PreferenceData | None = None, eval_every: int | None = None
                       ) -> dict[str, list[float]]:
    """Train ``model`` with AdamW for ``steps`` steps on random batches of pairs of ``data``.

    Each step draws ``batch_size`` pairs without replacement within an epoch (a fresh
    permutation from ``generator`` each epoch); the learning rate warms up linearly over
    ``warmup_steps`` and then decays along a cosine to 0. Returns the history: per step
    ``loss`` and ``accuracy`` of the batch, and, every ``eval_every`` steps if ``eval_data``
    is given, ``eval_step``, ``eval_loss`` and ``eval_accuracy`` on all of it.
    """
    if not isinstance(model, RewardModel):
        raise TypeError(f"model must be a RewardModel, got {type(model).__name__}")
    if not isinstance(data, PreferenceData):
        raise TypeError(f"data must be a PreferenceData, got {type(data).__name__}")
    steps = check_positive_int("steps", steps)
    batch_size = check_positive_int("batch_size", batch_size)
    for name, d in (("data", data), ("eval_data", eval_data)):
        if d is not None:
            _check_data(d, name)
    N = data.prompts.shape[0]
    if batch_size > N:
        raise ValueError(f"batch_size={batch_size} exceeds the number of pairs, {N}")
    check_positive_number("lr", lr)
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be an int >= 0, got warmup_steps={warmup_steps!r}")
    check_nonnegative_number("weight_decay", weight_decay)
    if eval_every is not None:
        eval_every = check_positive_int("eval_every", eval_every)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    history: dict[str, list[float]] = {"loss": [], "accuracy": [], "lr": [], "eval_step": [],
                                       "eval_loss": [], "eval_accuracy": []}
    order, cursor = torch.randperm(N, generator=generator), 0
    model.train()
    for step in range(steps):
        if cursor + batch_size > N:
            order, cursor = torch.randperm(N, generator=generator), 0
        idx = order[cursor:cursor + batch_size]
        cursor += batch_size
        rate = lr * (step + 1) / warmup_steps if step < warmup_steps else \
            lr * 0.5 * (1 + math.cos(math.pi * (step - warmup_steps) / max(1, steps - warmup_steps)))
        for group in optimizer.param_groups:
            group["lr"] = rate
        out = reward_model_step(model, optimizer, data.prompts[idx], data.chosen[idx],
                                data.rejected[idx], grad_clip)
        history["loss"].append(float(out.loss))
        history["accuracy"].append(float(out.accuracy))
        history["lr"].append(rate)
        if eval_data is not None and eval_every is not None and \
                ((step + 1) % eval_every == 0 or step + 1 == steps):
            r_c = _rewards(model, eval_data.prompts, eval_data.chosen)
            r_r = _rewards(model, eval_data.prompts, eval_data.rejected)
            history["eval_step"].append(step + 1)
            history["eval_loss"].append(float(bradley_terry_loss(r_c, r_r)))
            history["eval_accuracy"].append(float(pairwise_accuracy(r_c, r_r)))
    model.eval()
    return history


# ---------------------------------------------------------------- how good is a reward model


def bayes_optimal_accuracy(true_a: Tensor, true_b: Tensor, scale: float) -> Tensor:
    """The expected accuracy of the best possible predictor on Bradley–Terry labels: ().

    A labeller prefers a with probability sigma(s (r_a - r_b)). Any predictor can only
    pick a side; picking the one with the higher true reward is right with probability
    sigma(s |r_a - r_b|) >= 1/2, and no rule does better, because the label is independent
    of everything else given the rewards. On a tie every pick is right with probability
    sigma(0) = 1/2. So the ceiling is mean_i sigma(s |r_a,i - r_b,i|) over the pairs, whichever
    of the two was labelled chosen. ``true_a``, ``true_b``: (N,) true rewards; ``scale`` = s > 0.
    """
    check_finite(_check_floating(true_a, "true_a"), "true_a")
    check_finite(_check_floating(true_b, "true_b"), "true_b")
    if true_a.shape != true_b.shape or true_a.ndim != 1 or true_a.numel() == 0:
        raise ValueError(f"true_a and true_b must be (N,) with N >= 1, of one shape; got "
                         f"{tuple(true_a.shape)} and {tuple(true_b.shape)}")
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not 0 < scale < math.inf:
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    return torch.sigmoid(scale * (true_a - true_b).abs()).mean()


def _check_xy(x: Tensor, y: Tensor) -> None:
    check_finite(_check_floating(x, "x"), "x")
    check_finite(_check_floating(y, "y"), "y")
    if x.shape != y.shape or x.ndim != 1 or x.numel() < 2:
        raise ValueError(f"x and y must be (N,) with N >= 2, of one shape; got {tuple(x.shape)} "
                         f"and {tuple(y.shape)}")


def pearson_correlation(x: Tensor, y: Tensor) -> Tensor:
    """Pearson's correlation of two samples (N,): cov(x, y) / (std(x) std(y)), a () tensor.

    Computed in float64. A constant sample has no correlation: ``ValueError``.
    """
    _check_xy(x, y)
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()
    sx, sy = x.pow(2).sum().sqrt(), y.pow(2).sum().sqrt()
    if sx == 0 or sy == 0:
        raise ValueError("a constant sample has no correlation (zero standard deviation)")
    return (x * y).sum() / (sx * sy)


def _average_ranks(x: Tensor) -> Tensor:
    """Ranks 1..N of x, tied values sharing the mean of their ranks: (N,) -> (N,) float64."""
    x = x.double()
    ranks = torch.empty_like(x)
    ranks[torch.argsort(x, stable=True)] = torch.arange(1, x.numel() + 1, dtype=torch.float64)
    values, inverse = torch.unique(x, return_inverse=True)  # tied values share an index
    total = torch.zeros(values.numel(), dtype=torch.float64).index_add_(0, inverse, ranks)
    count = torch.zeros(values.numel(), dtype=torch.float64).index_add_(0, inverse, torch.ones_like(x))
    return (total / count)[inverse]


def spearman_correlation(x: Tensor, y: Tensor) -> Tensor:
    """Spearman's rank correlation (N,), (N,) -> (): Pearson's correlation of the ranks.

    Tied values get the mean of the ranks they span (the usual convention, as in
    ``scipy.stats.spearmanr`` and pandas), which matters here: a true reward that counts
    keywords is full of ties.
    """
    _check_xy(x, y)
    return pearson_correlation(_average_ranks(x), _average_ranks(y))


def evaluate_reward_model(model: RewardModel, data: PreferenceData, scale: float) -> dict[str, Any]:
    """How ``model`` does on the pairs of ``data`` against the true rewards and the labels.

    Returns floats: ``loss`` (Bradley–Terry), ``accuracy`` (on the labels, ties 1/2) and
    ``accuracy_non_tied`` (on the pairs whose true rewards differ), the Bayes ceilings
    ``bayes_accuracy`` and ``bayes_accuracy_non_tied`` (:func:`bayes_optimal_accuracy` with
    ``scale``), the accuracy ``true_reward_accuracy`` that the true reward itself reaches on
    these labels, and ``pearson`` and ``spearman`` correlations of learned with true rewards
    over all 2N responses; plus the lists ``learned_rewards`` and ``true_rewards`` (chosen
    responses first, then rejected).
    """
    if not isinstance(data, PreferenceData):
        raise TypeError(f"data must be a PreferenceData, got {type(data).__name__}")
    r_c = _rewards(model, data.prompts, data.chosen)
    r_r = _rewards(model, data.prompts, data.rejected)
    t_c, t_r = data.reward_chosen.double(), data.reward_rejected.double()
    untied = t_c != t_r
    if not bool(untied.any()):
        raise ValueError("every pair is tied in true reward: the non-tied accuracy is undefined")
    learned, true = torch.cat([r_c, r_r]).double(), torch.cat([t_c, t_r])
    return {
        "loss": float(bradley_terry_loss(r_c, r_r)),
        "accuracy": float(pairwise_accuracy(r_c, r_r)),
        "accuracy_non_tied": float(pairwise_accuracy(r_c[untied], r_r[untied])),
        "bayes_accuracy": float(bayes_optimal_accuracy(t_c, t_r, scale)),
        "bayes_accuracy_non_tied": float(bayes_optimal_accuracy(t_c[untied], t_r[untied], scale)),
        "true_reward_accuracy": float(pairwise_accuracy(t_c, t_r)),
        "pearson": float(pearson_correlation(learned, true)),
        "spearman": float(spearman_correlation(learned, true)),
        "learned_rewards": learned.tolist(),
        "true_rewards": true.tolist(),
    }


# ---------------------------------------------------------------- the shipped reward model

REWARD_MODEL_RECIPE: dict[str, Any] = {
    "base": "text", "preferences": PREFERENCE_RECIPE, "trainable_blocks": 2, "train_embeddings": True,
    "steps": 256, "batch_size": 32, "lr": 3e-4, "warmup_steps": 16, "weight_decay": 0.0,
    "grad_clip": 1.0, "eval_every": 32, "seed": 0, "threads": 1, "shipped_dtype": "float16",
}


def _train_shipped(recipe: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    from llmbook.training.pretrained import book_model

    torch.set_num_threads(recipe["threads"])
    torch.manual_seed(recipe["seed"])
    base, _ = book_model(recipe["base"])
    model = RewardModel(copy.deepcopy(base), recipe["trainable_blocks"], recipe["train_embeddings"])
    train, test = preference_data("train"), preference_data("test")
    gen = torch.Generator().manual_seed(recipe["seed"])
    history = train_reward_model(model, train, recipe["steps"], recipe["batch_size"], recipe["lr"],
                                 gen, recipe["warmup_steps"], recipe["weight_decay"],
                                 recipe["grad_clip"], test, recipe["eval_every"])
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    shipped_dtype = getattr(torch, recipe["shipped_dtype"])
    with torch.no_grad():  # round to the shipped precision first: the scores are the shipped model's
        for name, p in model.named_parameters():
            if name in trained:
                p.copy_(p.to(shipped_dtype))
    scores = evaluate_reward_model(model, test, recipe["preferences"]["bt_scale"])
    tensors = {k: v.to(shipped_dtype) for k, v in model.state_dict().items() if k in trained}
    facts = {"history": history, "test": scores, "shipped_tensors": sorted(tensors),
             "num_trained_parameters": sum(v.numel() for v in tensors.values())}
    return tensors, facts


register("reward_model", REWARD_MODEL_RECIPE, _train_shipped, __name__)


def load_reward_model() -> tuple[RewardModel, dict[str, Any]]:
    """The shipped reward model (eval mode, every parameter frozen) and its info dict.

    The artifact holds only the trained tensors (the head, the final norm, the last
    ``trainable_blocks`` blocks and the embeddings), in float16 (rounded before the final evaluation, so the
    stored scores are those of these weights); the frozen ones are the book's text model's,
    loaded with :func:`~llmbook.training.pretrained.book_model`. ``info`` holds the recipe, the training
    ``history`` (loss and accuracy per step, test loss and accuracy every ``eval_every``
    steps) and the ``test`` scores of :func:`evaluate_reward_model`.
    """
    from llmbook.training.pretrained import book_model

    tensors, info = load_artifact("reward_model")
    base, _ = book_model(REWARD_MODEL_RECIPE["base"])
    model = RewardModel(base, REWARD_MODEL_RECIPE["trainable_blocks"], REWARD_MODEL_RECIPE["train_embeddings"])
    missing = set(info["shipped_tensors"]) - set(tensors)
    if missing:
        raise ValueError(f"the shipped reward model lacks tensors {sorted(missing)}")
    state = model.state_dict()
    state.update({k: v.to(state[k].dtype) for k, v in tensors.items()})
    model.load_state_dict(state, strict=True)
    model.requires_grad_(False)
    return model.eval(), info
