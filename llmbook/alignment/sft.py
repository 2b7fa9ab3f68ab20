"""Supervised fine-tuning: the prompt-masked loss, packing, and gradient accumulation.

Introduced in notebooks/17_sft_reward_models. Supervised fine-tuning (SFT) trains a
pretrained language model on demonstrations, (prompt x, response y) pairs, by maximum
likelihood of the response *given* the prompt (Ouyang et al., 2022, "Training language
models to follow instructions with human feedback", section 3.5):

    log p(y | x) = sum_t log p(y_t | x, y_<t),

so only the response tokens enter the loss; the prompt is context, and a *loss mask*
removes its tokens. This module holds:

* :func:`sft_batch`: a rectangular batch of prompts and responses as inputs, next-token
  targets and a loss mask (the shift by one done once, here);
* :func:`pack_examples`: several examples of different lengths packed into rows of a fixed
  length, with positions that restart at 0 for each example and a block-diagonal attention
  mask, so that each example sees only itself and packing changes no log-probability
  (Krell et al., 2021, "Efficient Sequence Packing without Cross-contamination"); two
  strategies: in order (next fit) and best fit decreasing, trl's default;
* :func:`sft_loss`: the mean negative log-likelihood per response token, or any other
  reduction of the per-token losses (:func:`~llmbook.alignment.logprobs.reduce_tokens`);
  :func:`sft_loss_from_logprobs`: the same from per-token log-probabilities (B, T) of the
  targets instead of logits;
* :func:`sft_step`: one optimiser step on several micro-batches (gradient accumulation)
  whose gradient equals the gradient of the whole batch's per-token mean;
* :func:`response_values`: per-token values of a packed batch split back into examples;
* :func:`stop_model_logprobs`, :func:`stop_model_lengths`, :func:`fit_stop_model`,
  :func:`fitted_length_distribution`: the smallest model of a response's length (stop or
  continue at each position), to show what each reduction of the loss does to the lengths
  SFT teaches (section 17.8): a per-sequence mean fits q(L) proportional to p(L) / L.

Conventions. An example of prompt length P and response length R occupies L = P + R
positions: ``ids`` hold the example itself, ``targets[t]`` the token at t + 1 of the *same*
example (``pad_id`` after its last token, where nothing is predicted), and
``loss_mask[t]`` is True exactly where ``targets[t]`` is a response token, i.e. at
t = P - 1, ..., L - 2 (the logits at t predict the token at t + 1). Attention masks are
boolean, True where a query may attend to a key, of shape (N, 1, T, T) so that they
broadcast over the heads; the model ands them with its causal mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim import Optimizer

from llmbook.alignment.logprobs import (
    _check_mask,
    _check_prompt_response,
    check_reduction,
    reduce_tokens,
    token_logprobs,
)
from llmbook.validation import check_floating_tensor as _check_floating
from llmbook.validation import check_positive_int, check_token_ids

__all__ = [
    "PACKING_STRATEGIES",
    "SFTBatch",
    "SFTStepOutput",
    "pack_examples",
    "fit_stop_model",
    "fitted_length_distribution",
    "response_values",
    "sft_batch",
    "sft_loss",
    "sft_loss_from_logprobs",
    "sft_step",
    "stop_model_lengths",
    "stop_model_logprobs",
]

PACKING_STRATEGIES = ("in_order", "best_fit_decreasing")
NORMALIZATIONS = ("global", "per_micro_batch")


class SFTBatch(NamedTuple):
    """A batch for supervised fine-tuning; every tensor is (N, T) except ``attention_mask``.

    ``ids`` the input tokens; ``targets`` the next token of the same example; ``loss_mask``
    (bool) True where ``targets`` is a response token; ``positions`` the position of each
    token within its example (None: 0, 1, ..., T-1); ``attention_mask`` (N, 1, T, T) bool,
    True where a query may attend to a key (None: causal attention only); ``example_ids``
    the index of the example each token belongs to (-1 for padding).
    """

    ids: Tensor
    targets: Tensor
    loss_mask: Tensor
    positions: Tensor | None = None
    attention_mask: Tensor | None = None
    example_ids: Tensor | None = None


class SFTStepOutput(NamedTuple):
    """What :func:`sft_step` reports: the ``loss`` it minimised (detached, a scalar), the
    number of response tokens ``num_tokens`` over all micro-batches, and the gradient norm
    ``grad_norm`` before clipping (None without clipping)."""

    loss: Tensor
    num_tokens: int
    grad_norm: Tensor | None


# ---------------------------------------------------------------- building batches


def _as_ids(x: object, name: str) -> Tensor:
    """A 1-d long tensor of token ids from a tensor or a list of ints."""
    if isinstance(x, list | tuple):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in x):
            raise TypeError(f"{name} must hold int token ids, got {x!r}")
        x = torch.tensor(x, dtype=torch.long)
    check_token_ids(x, name)
    if x.ndim != 1:
        raise ValueError(f"{name} must be 1-d (one example), got shape {tuple(x.shape)}")
    if x.numel() and int(x.min()) < 0:
        raise ValueError(f"{name} must hold token ids >= 0, found {int(x.min())}")
    return x.long()


def sft_batch(prompt_ids: Tensor, response_ids: Tensor, pad_id: int = 0) -> SFTBatch:
    """Prompts (B, P) and responses (B, R) as one SFT batch of length T = P + R.

    ``ids`` = [x; y]; ``targets`` = ids shifted left by one (``pad_id`` at the last position,
    which predicts nothing); ``loss_mask`` True at t = P - 1, ..., T - 2, where the target
    is a response token. ``positions`` and ``attention_mask`` are None (plain causal
    attention); ``example_ids[b] = b``. Needs P >= 1 (the first response token is predicted
    from the last prompt token) and R >= 1.
    """
    B, P, R = _check_prompt_response(prompt_ids, response_ids)
    if B < 1:
        raise ValueError(f"need B >= 1 rows, got B={B}")
    pad_id = _check_pad_id(pad_id)
    ids = torch.cat([prompt_ids.long(), response_ids.long()], dim=1)  # (B, T)
    targets = torch.cat([ids[:, 1:], torch.full((B, 1), pad_id, dtype=torch.long)], dim=1)
    t = torch.arange(P + R)
    loss_mask = ((t >= P - 1) & (t < P + R - 1)).expand(B, -1).clone()  # (B, T)
    example_ids = torch.arange(B)[:, None].expand(B, P + R).clone()
    return SFTBatch(ids, targets, loss_mask, None, None, example_ids)


def _check_pad_id(pad_id: object) -> int:
    if isinstance(pad_id, bool) or not isinstance(pad_id, int) or pad_id < 0:
        raise ValueError(f"pad_id must be a token id (an int >= 0), got {pad_id!r}")
    return pad_id


def _bins(lengths: list[int], row_length: int, strategy: str) -> list[list[int]]:
    """Which examples go into which row: a list of rows, each a list of example indices."""
    rows: list[list[int]] = []
    space: list[int] = []  # free positions left in each row
    if strategy == "in_order":  # next fit: open a new row when the example does not fit
        for i, n in enumerate(lengths):
            if not rows or space[-1] < n:
                rows.append([])
                space.append(row_length)
            rows[-1].append(i)
            space[-1] -= n
        return rows
    # best fit decreasing (Johnson, 1973): longest first, each into the fullest row that
    # still has room, else into a new row; among rows with equally little room, the one
    # that has had it longest (as trl's pack_dataset breaks ties)
    since: list[int] = []  # when each row last changed
    for step, i in enumerate(sorted(range(len(lengths)), key=lambda j: -lengths[j])):  # stable
        n = lengths[i]
        fits = [(space[r], since[r], r) for r in range(len(rows)) if space[r] >= n]
        if fits:
            r = min(fits)[2]
        else:
            rows.append([])
            space.append(row_length)
            since.append(step)
            r = len(rows) - 1
        rows[r].append(i)
        space[r] -= n
        since[r] = step
    return rows


def pack_examples(examples: Sequence[tuple[Tensor | list[int], Tensor | list[int]]],
                  row_length: int, pad_id: int = 0, strategy: str = "in_order") -> SFTBatch:
    """Pack (prompt, response) examples into N rows of ``row_length`` tokens: an SFTBatch.

    Each example (two 1-d tensors or lists of token ids, the prompt of length P >= 1 and the
    response of length R >= 1) occupies P + R consecutive positions of one row and is never
    split; an example longer than ``row_length`` is a ``ValueError``. Within a row:

    * ``positions`` restart at 0 at the start of each example, so each sees the position
      embeddings it would see alone;
    * ``attention_mask`` (N, 1, T, T) is block diagonal: True where query and key belong to
      the same example (the model adds causality); the padding at the end of a row forms
      its own block, so no query is left with nothing to attend to;
    * ``targets`` and ``loss_mask`` follow :func:`sft_batch` within each example: the last
      token of an example predicts nothing (it must not be trained to predict the next
      example's first token).

    ``strategy`` "in_order" fills the rows in the order of ``examples`` (a new row when the
    next example does not fit); "best_fit_decreasing" places the longest examples first,
    each into the row with the least room that still fits it, as trl's ``pack_dataset``
    (strategy "bfd") does, which wastes less padding. ``example_ids`` says which example
    each position holds (its index in ``examples``; -1 for padding).
    """
    row_length = check_positive_int("row_length", row_length)
    pad_id = _check_pad_id(pad_id)
    if strategy not in PACKING_STRATEGIES:
        raise ValueError(f"strategy must be one of {PACKING_STRATEGIES}, got {strategy!r}")
    if isinstance(examples, Tensor) or not isinstance(examples, Sequence):
        raise TypeError(f"examples must be a list of (prompt, response) pairs, got "
                        f"{type(examples).__name__}")
    if len(examples) == 0:
        raise ValueError("examples is empty: there is nothing to pack")
    pairs = []
    for i, ex in enumerate(examples):
        if not isinstance(ex, tuple | list) or len(ex) != 2:
            raise TypeError(f"examples[{i}] must be a (prompt, response) pair, got {ex!r}")
        prompt, response = _as_ids(ex[0], f"examples[{i}] prompt"), _as_ids(ex[1], f"examples[{i}] response")
        if prompt.numel() < 1 or response.numel() < 1:
            raise ValueError(f"examples[{i}] needs a prompt of >= 1 and a response of >= 1 tokens, "
                             f"got P={prompt.numel()}, R={response.numel()}")
        if prompt.numel() + response.numel() > row_length:
            raise ValueError(f"examples[{i}] has P + R = {prompt.numel()} + {response.numel()} = "
                             f"{prompt.numel() + response.numel()} tokens, longer than "
                             f"row_length={row_length}")
        pairs.append((prompt, response))
    rows = _bins([p.numel() + r.numel() for p, r in pairs], row_length, strategy)
    N, T = len(rows), row_length
    ids = torch.full((N, T), pad_id, dtype=torch.long)
    targets = torch.full((N, T), pad_id, dtype=torch.long)
    positions = torch.zeros((N, T), dtype=torch.long)
    loss_mask = torch.zeros((N, T), dtype=torch.bool)
    example_ids = torch.full((N, T), -1, dtype=torch.long)
    for n, row in enumerate(rows):
        start = 0
        for i in row:
            prompt, response = pairs[i]
            P, L = prompt.numel(), prompt.numel() + response.numel()
            seq = torch.cat([prompt, response])  # (L,)
            ids[n, start:start + L] = seq
            targets[n, start:start + L - 1] = seq[1:]
            positions[n, start:start + L] = torch.arange(L)
            loss_mask[n, start + P - 1:start + L - 1] = True
            example_ids[n, start:start + L] = i
            start += L
        positions[n, start:] = torch.arange(T - start)  # the padding block
    block = example_ids.clone()
    block[block < 0] = len(pairs)  # padding: one more block of its own
    attention_mask = (block[:, :, None] == block[:, None, :])[:, None]  # (N, 1, T, T)
    return SFTBatch(ids, targets, loss_mask, positions, attention_mask, example_ids)


def response_values(values: Tensor, batch: SFTBatch) -> list[Tensor]:
    """Per-token ``values`` (N, T) of ``batch`` split back into examples: a list of 1-d tensors.

    Entry i holds the values at the response positions (``loss_mask``) of example i, in
    order, e.g. the per-token log-probabilities of its response; so a packed batch and the
    same examples run one by one can be compared token by token.
    """
    if not isinstance(batch, SFTBatch) or batch.example_ids is None:
        raise TypeError("batch must be an SFTBatch with example_ids (from sft_batch or pack_examples)")
    if not isinstance(values, Tensor) or tuple(values.shape) != tuple(batch.loss_mask.shape):
        raise ValueError(f"values must have the batch's shape {tuple(batch.loss_mask.shape)}, got "
                         f"{tuple(values.shape) if isinstance(values, Tensor) else type(values).__name__}")
    n = int(batch.example_ids.max()) + 1
    return [values[(batch.example_ids == i) & batch.loss_mask] for i in range(n)]


# ---------------------------------------------------------------- the loss and the step


def sft_loss(logits: Tensor, targets: Tensor, loss_mask: Tensor,
             num_tokens: int | float | Tensor | None = None, *, reduction: str = "token_mean",
             normaliser: float | None = None) -> Tensor:
    """The SFT loss: -sum over response tokens of log p(target) / number of response tokens.

    ``logits`` (B, T, V), ``targets`` (B, T) token ids, ``loss_mask`` (B, T) (boolean or 0/1,
    exactly the shape of ``targets``) True at the response tokens. The sum runs over every
    masked position of the batch and is divided by their number, so that every response
    token of the batch has the same weight 1 / (number of response tokens), whatever the
    length of its response: the per-token mean over the batch, which is what a maximum
    likelihood estimate over the tokens asks for. (A mean per sequence first, then over
    sequences, would weight the tokens of short responses more.)

    ``num_tokens`` replaces the divisor: gradient accumulation (:func:`sft_step`) divides each
    micro-batch's sum by the number of response tokens of the *whole* batch (the same as
    ``reduction="constant", normaliser=num_tokens``).

    ``reduction`` chooses how the per-token losses -log p(target) are combined, as in
    :func:`~llmbook.alignment.logprobs.reduce_tokens`: "token_mean" (default, above), "sum",
    "sequence_mean" (the per-sequence mean just described, which up-weights short
    responses), "constant" (divide by ``normaliser``), or "none" (the per-token losses,
    (B, T), 0 off the mask). An all-false ``loss_mask`` is a ``ValueError`` under the means
    and gives 0 under "sum" and "constant". :func:`sft_loss_from_logprobs` is this loss from
    the per-token log-probabilities instead of the logits.
    """
    _check_floating(logits, "logits")
    check_token_ids(targets, "targets")
    if logits.ndim != 3 or tuple(targets.shape) != tuple(logits.shape[:2]):
        raise ValueError(f"logits must be (B, T, V) and targets (B, T) with the same B, T; got "
                         f"{tuple(logits.shape)} and {tuple(targets.shape)}")
    _check_mask(loss_mask, targets, "loss_mask", "targets")
    check_reduction(reduction)
    logp = token_logprobs(logits, targets)  # (B, T)
    return sft_loss_from_logprobs(logp, loss_mask, num_tokens, reduction=reduction, normaliser=normaliser)


def sft_loss_from_logprobs(logprobs: Tensor, loss_mask: Tensor,
                           num_tokens: int | float | Tensor | None = None, *,
                           reduction: str = "token_mean", normaliser: float | None = None) -> Tensor:
    """The SFT loss from per-token log-probabilities of the targets: (B, T), (B, T) -> loss.

    ``logprobs[b, t]`` = log p(targets[b, t] | ...), e.g. from
    :func:`~llmbook.alignment.logprobs.token_logprobs` or a production model's gathered
    log-softmax; ``loss_mask`` (B, T) (boolean or 0/1, exactly that shape) True at the
    response tokens. Returns :func:`sft_loss` (same ``num_tokens``, ``reduction`` and
    ``normaliser``): the reduction of the per-token losses -logprobs. Masked-out positions
    may hold anything, NaN included; the masked ones must be log-probabilities (<= 0 or
    -inf, not NaN). Gradients flow to ``logprobs``.
    """
    _check_floating(logprobs, "logprobs")
    if logprobs.ndim != 2:
        raise ValueError(f"logprobs must be (B, T), got shape {tuple(logprobs.shape)}")
    mask = _check_mask(loss_mask, logprobs, "loss_mask", "logprobs")
    reduction = check_reduction(reduction)
    kept = logprobs.detach()[mask > 0]
    if bool((torch.isnan(kept) | (kept > 0)).any()):
        bad = kept[torch.isnan(kept) | (kept > 0)][0].item()
        raise ValueError(f"logprobs must hold log-probabilities (<= 0, not NaN) at the masked "
                         f"positions, found {bad}")
    if num_tokens is not None:
        if reduction != "token_mean" or normaliser is not None:
            raise ValueError("num_tokens is reduction='constant' with normaliser=num_tokens: pass "
                             f"one or the other, got reduction={reduction!r}, normaliser={normaliser!r}")
        divisor = float(num_tokens)
        if not divisor > 0 or divisor == float("inf"):
            raise ValueError(f"num_tokens must be a positive finite number, got {num_tokens}")
        reduction, normaliser = "constant", divisor
    elif reduction == "token_mean" and float(mask.sum()) == 0:
        raise ValueError("loss_mask has no response tokens: the SFT loss (a mean over them) "
                         "is undefined")
    return reduce_tokens(-logprobs, mask, reduction, normaliser)


def _forward(model: nn.Module, batch: SFTBatch) -> Tensor:
    """The model's logits on ``batch``, with its positions and attention mask if it has them."""
    kwargs = {}
    if batch.positions is not None:
        kwargs["positions"] = batch.positions
    if batch.attention_mask is not None:
        kwargs["mask"] = batch.attention_mask
    return model(batch.ids, **kwargs)  # (N, T, V)


def sft_step(model: nn.Module, optimizer: Optimizer | None, micro_batches: Sequence[SFTBatch],
             grad_clip: float | None = None, normalization: str = "global") -> SFTStepOutput:
    """One SFT update on a batch given as micro-batches (gradient accumulation).

    The batch's loss is the per-token mean over *all* its response tokens,
    L = sum_m S_m / N with S_m the summed negative log-likelihood of micro-batch m and
    N = sum_m N_m its total number of response tokens. So each micro-batch's sum is divided
    by N (not by its own N_m) before ``backward``, and the accumulated gradient equals the
    gradient of L computed on the whole batch at once. ``normalization="per_micro_batch"``
    instead averages the micro-batch means, (1/M) sum_m S_m / N_m: the common mistake, kept to
    show it; it weights a token by 1/(M N_m) instead of 1/N, which differs whenever the
    micro-batches hold different numbers of response tokens.

    The model is called as ``model(ids, positions=..., mask=...)`` (the keywords only when the
    batch has them). The gradients are zeroed first; with ``grad_clip`` the global gradient
    norm is clipped; ``optimizer.step()`` is taken unless ``optimizer`` is None (then the
    accumulated gradient is left in ``.grad``). Returns an :class:`SFTStepOutput`.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, Optimizer):
        raise TypeError(f"optimizer must be a torch Optimizer or None, got {type(optimizer).__name__}")
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    if isinstance(micro_batches, SFTBatch) or not isinstance(micro_batches, Sequence):
        raise TypeError("micro_batches must be a list of SFTBatch (one per micro-batch)")
    if len(micro_batches) == 0:
        raise ValueError("micro_batches is empty: there is nothing to train on")
    counts = []
    for m, mb in enumerate(micro_batches):
        if not isinstance(mb, SFTBatch):
            raise TypeError(f"micro_batches[{m}] must be an SFTBatch, got {type(mb).__name__}")
        counts.append(int(mb.loss_mask.sum()))
        if counts[-1] == 0:
            raise ValueError(f"micro_batches[{m}] has no response tokens (its loss_mask is all False)")
    if grad_clip is not None and not (isinstance(grad_clip, int | float) and grad_clip > 0):
        raise ValueError(f"grad_clip must be a positive number or None, got {grad_clip!r}")
    total = sum(counts)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    loss: Tensor | None = None
    for mb, n_m in zip(micro_batches, counts, strict=True):
        divisor = total if normalization == "global" else n_m * len(micro_batches)
        part = sft_loss(_forward(model, mb), mb.targets, mb.loss_mask, num_tokens=divisor)
        part.backward()  # gradients add up in .grad
        loss = part.detach() if loss is None else loss + part.detach()
    norm = None
    if grad_clip is not None:
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    if optimizer is not None:
        optimizer.step()
    return SFTStepOutput(loss, total, norm)


# ---------------------------------------------------------------- what a reduction does to lengths


def _check_stop_logits(stop_logits: object) -> Tensor:
    _check_floating(stop_logits, "stop_logits")
    if stop_logits.ndim != 1 or stop_logits.numel() < 1:
        raise ValueError(f"stop_logits must be 1-d (T - 1,) with T >= 2, got shape {tuple(stop_logits.shape)}")
    return stop_logits


def _check_lengths(lengths: object, T: int, bound: str) -> Tensor:
    """Response lengths (B,), B >= 1, integers in [1, T]."""
    check_token_ids(lengths, "lengths", ndim=1)
    if lengths.numel() == 0 or bool((lengths < 1).any()) or bool((lengths > T).any()):
        raise ValueError(f"lengths must be a non-empty (B,) tensor of ints in [1, {bound}={T}], got "
                         f"{lengths.tolist()}")
    return lengths.long()


def stop_model_logprobs(stop_logits: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """Per-token log-probabilities of responses of the given lengths under a stop model.

    The model decides only when to stop: at position t = 1, ..., T - 1 it stops with
    probability h_t = sigma(``stop_logits[t - 1]``) and at t = T it always stops. A response of
    L tokens is L - 1 "continue" decisions and one "stop": its per-token log-probabilities
    are log(1 - h_t) for t < L and log h_L at t = L (0 at t = T), so that
    sum_t logprobs = log q(L), q the model's length distribution (:func:`stop_model_lengths`).
    ``stop_logits`` (T - 1,), ``lengths`` (B,) integers in [1, T]. Returns
    ``(logprobs, mask)``, both (B, T); mask True at t <= L_b. Differentiable in
    ``stop_logits``.
    """
    stop_logits = _check_stop_logits(stop_logits)
    T = stop_logits.numel() + 1
    L = _check_lengths(lengths, T, "T")[:, None]  # (B, 1)
    zero = stop_logits.new_zeros(1)
    log_stop = torch.cat([F.logsigmoid(stop_logits), zero])  # (T,): log h_t, h_T = 1
    log_go = torch.cat([F.logsigmoid(-stop_logits), zero])  # (T,): log(1 - h_t); unused at T
    t = torch.arange(1, T + 1)  # (T,)
    logprobs = torch.where(t == L, log_stop, torch.where(t < L, log_go, torch.zeros_like(log_go)))
    return logprobs, t <= L  # (B, T), (B, T)


def stop_model_lengths(stop_logits: Tensor) -> Tensor:
    """The stop model's length distribution q(L), L = 1, ..., T: (T - 1,) -> (T,).

    q(L) = h_L prod_{t < L} (1 - h_t), with h_T = 1; it sums to 1.
    """
    stop_logits = _check_stop_logits(stop_logits)
    T = stop_logits.numel() + 1
    logprobs, mask = stop_model_logprobs(stop_logits, torch.arange(1, T + 1))
    return torch.exp((logprobs * mask).sum(dim=1))  # (T,)


def fit_stop_model(lengths: Tensor, max_length: int, reduction: str = "token_mean",
                   steps: int = 50) -> Tensor:
    """Fit the stop model to observed ``lengths`` (B,) by minimising the SFT loss: (T - 1,).

    The loss is :func:`sft_loss_from_logprobs` of :func:`stop_model_logprobs` under
    ``reduction`` ("sum", "token_mean", "sequence_mean"; "constant" and "sum" have the same
    minimiser as the token mean), minimised in float64 by L-BFGS (``steps`` iterations, with
    a strong Wolfe line search) from stop logits 0. Returns the fitted stop logits; their
    length distribution is :func:`stop_model_lengths`. A length that never occurs sends
    its stop logit towards -inf, so give every length 1, ..., T - 1 at least one example
    for a finite optimum.
    """
    T = check_positive_int("max_length", max_length)
    if T < 2:
        raise ValueError(f"max_length must be at least 2, got max_length={T}")
    reduction = check_reduction(reduction, ("sum", "token_mean", "sequence_mean"))
    steps = check_positive_int("steps", steps)
    theta = torch.zeros(T - 1, dtype=torch.float64, requires_grad=True)
    stop_model_logprobs(theta.detach(), lengths)  # validate once, before the optimiser runs
    opt = torch.optim.LBFGS([theta], lr=1.0, max_iter=steps, tolerance_grad=1e-12,
                            tolerance_change=1e-15, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        logprobs, mask = stop_model_logprobs(theta, lengths)
        loss = sft_loss_from_logprobs(logprobs, mask, reduction=reduction)
        loss.backward()
        return loss

    opt.step(closure)
    return theta.detach()


def fitted_length_distribution(lengths: Tensor, max_length: int, reduction: str = "token_mean") -> Tensor:
    """Where :func:`fit_stop_model` should land, in closed form: q(L), L = 1, ..., T, float64.

    A model free to fit any length distribution, trained on responses whose lengths have
    the empirical distribution p(L), minimises -sum_b w_b log q(L_b) with w_b the weight
    the reduction gives sequence b's log-likelihood: the same for every sequence under
    "sum" and "token_mean" (so q = p, maximum likelihood), 1 / L_b under "sequence_mean"
    (every token weighs 1 / (B L_b)). The minimiser is q(L) = p(L) w(L) / sum_L' p(L') w(L')
    (a Lagrange multiplier for sum q = 1), so the per-sequence mean fits q(L) proportional
    to p(L) / L, whose mean is the harmonic mean of the observed lengths.
    """
    T = check_positive_int("max_length", max_length)
    reduction = check_reduction(reduction, ("sum", "token_mean", "sequence_mean"))
    counts = torch.bincount(_check_lengths(lengths, T, "max_length") - 1, minlength=T).double()  # (T,)
    if reduction == "sequence_mean":
        counts = counts / torch.arange(1, T + 1, dtype=torch.float64)
    return counts / counts.sum()
