"""Per-token log-probabilities, entropies and masked reductions over responses.

Introduced in notebooks/17_sft_reward_models and used by every later chapter of Part V
(notebooks/18_rlhf_ppo, notebooks/19_dpo, notebooks/20_grpo). Every alignment objective
scores a *response* y = (y_1, ..., y_R) to a *prompt* x with the policy's log-probability

.. math::  \\log \\pi_\\theta(y \\mid x) = \\sum_{t=1}^{R} \\log \\pi_\\theta(y_t \\mid x, y_{<t}),

a sum of per-token terms read off the logits of a causal language model. The logits at
position i predict the token at position i + 1, so for a prompt of length P the response
tokens are predicted by the logits at positions P - 1, ..., P + R - 2: the "shift by one"
that every RLHF code base gets wrong at least once.

This module holds:

* :func:`token_logprobs`: log softmax(z)[y] at every position, (B, T, V), (B, T) -> (B, T);
* :func:`response_outputs`: a model's outputs at the positions that predict the response
  tokens (the shift by one, once, for logits and for a critic's values alike);
* :func:`response_logprobs`: the per-token log-probabilities of a response given a prompt,
  computed by running a causal LM on the concatenation and shifting by one;
* :func:`token_entropy`: the entropy -sum_v p_v log p_v of the next-token distribution;
* :func:`masked_sum`, :func:`masked_mean`, :func:`masked_normalize`: reductions over the
  response tokens only (padding and prompt excluded);
* :func:`reduce_tokens`: the one reduction every alignment loss uses to turn per-token
  values (B, T) into its loss: "none", "sum", "token_mean", "sequence_mean" or "constant"
  (:data:`REDUCTIONS`). The choice between a per-sequence mean, a per-batch token mean and
  a division by a constant is the "aggregation" of chapter 20, and the source of the
  length bias analysed by Liu et al., 2025, "Understanding R1-Zero-like Training: A
  Critical Perspective" (Dr. GRPO); :func:`reduction_weights` gives the gradient weight
  each token receives and :func:`reduction_weights_symbolic` derives it (chapter 17,
  section 17.8); :func:`reduce_sequences` is the same for per-sequence losses (B,) ("none",
  "sum", "mean"), and :func:`sequence_values` turns per-token values into one per sequence
  (the summed log pi(y|x) of DPO, or SimPO's and ORPO's length-normalised mean);
* :func:`response_mask`: the (B, T) mask of response positions from prompt lengths.

Masks are boolean tensors, or numeric tensors holding only 0 and 1, of exactly the shape of
the tensor they mask: a mask of another shape is a ``ValueError``, never a broadcast, and a
mean over a mask with no ones is a ``ValueError``, never a NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy as sp
import torch
from torch import Tensor

from llmbook.text.functional import log_softmax
from llmbook.validation import check_finite, check_positive_int, check_token_ids
from llmbook.validation import check_floating_tensor as _check_floating

__all__ = [
    "REDUCTIONS",
    "SEQUENCE_REDUCTIONS",
    "check_reduction",
    "masked_mean",
    "masked_normalize",
    "masked_sum",
    "reduce_sequences",
    "reduce_tokens",
    "reduction_weights",
    "reduction_weights_symbolic",
    "response_logprobs",
    "response_mask",
    "response_outputs",
    "sequence_values",
    "token_entropy",
    "token_logprobs",
]

#: The reductions of per-token values (B, T) that :func:`reduce_tokens` knows.
REDUCTIONS = ("none", "sum", "token_mean", "sequence_mean", "constant")
#: The reductions of per-sequence (per-pair) values (N,) that :func:`reduce_sequences` knows.
SEQUENCE_REDUCTIONS = ("mean", "sum", "none")

# ---------------------------------------------------------------- validation


def _check_prompt_response(prompt_ids: object, response_ids: object, prompt_name: str = "prompt_ids",
                           response_name: str = "response_ids", min_prompt: int = 1) -> tuple[int, int, int]:
    """Check prompts (B, P) and responses (B, R) of token ids; return (B, P, R).

    Needs P >= ``min_prompt`` (1 for a language model: the first response token is predicted
    at the last prompt token) and R >= 1. Shared by every function of Part V that takes a
    batch of prompts and responses.
    """
    check_token_ids(prompt_ids, prompt_name)
    check_token_ids(response_ids, response_name)
    if prompt_ids.ndim != 2 or response_ids.ndim != 2:
        raise ValueError(f"{prompt_name} and {response_name} must be 2-d (2 dimensions: (B, P) and "
                         f"(B, R)), got shapes {tuple(prompt_ids.shape)} and {tuple(response_ids.shape)}")
    (B, P), (B2, R) = prompt_ids.shape, response_ids.shape
    if B2 != B:
        raise ValueError(f"{prompt_name} has batch size {B}: {B} rows but {response_name} has {B2}")
    if P < min_prompt or R < 1:
        raise ValueError(f"{prompt_name} and {response_name} need P >= {min_prompt} and R >= 1 tokens "
                         f"per row (the first response token is predicted at the last prompt "
                         f"token), got P={P}, R={R}")
    for name, ids in ((prompt_name, prompt_ids), (response_name, response_ids)):
        if ids.numel() and int(ids.min()) < 0:
            raise ValueError(f"{name} must hold token ids >= 0, found {int(ids.min())}")
    return B, P, R


def _check_logits(logits: object) -> Tensor:
    """Floating logits (..., V) with V >= 1, holding no NaN and no +inf (-inf is a masked-out
    token, of probability 0): a NaN logit turns the whole log-softmax row into NaN."""
    _check_floating(logits, "logits")
    if logits.ndim == 0 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have a non-empty vocabulary axis (..., V), got shape "
                         f"{tuple(logits.shape)}")
    check_finite(logits, "logits", allow_inf=True)
    if bool((logits == float("inf")).any()):
        raise ValueError("logits must not hold +inf (its softmax is inf/inf = NaN)")
    return logits


def _check_mask(mask: object, like: Tensor, name: str = "mask",
                like_name: str = "x") -> Tensor:
    """Return ``mask`` as a tensor of ``like``'s dtype, holding 0 and 1, of ``like``'s shape."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if tuple(mask.shape) != tuple(like.shape):
        raise ValueError(f"{name} must have the shape of {like_name}, {tuple(like.shape)}, "
                         f"got {tuple(mask.shape)} (masks are never broadcast)")
    if mask.dtype != torch.bool:
        if mask.is_complex():
            raise TypeError(f"{name} must be boolean or hold only 0 and 1, got dtype {mask.dtype}")
        if not bool(((mask == 0) | (mask == 1)).all()):
            bad = mask[(mask != 0) & (mask != 1)][0].item()
            raise ValueError(f"{name} must hold only 0 and 1 (or be boolean), found {bad}")
    return mask.to(like.dtype)


def _check_reduce_dim(x: Tensor, dim: int | None) -> int | None:
    if dim is None:
        return None
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim must be an int or None, got {dim!r} ({type(dim).__name__})")
    if x.ndim == 0 or not -x.ndim <= dim < x.ndim:
        raise ValueError(f"dim={dim} is out of range for a tensor of shape {tuple(x.shape)}")
    return dim % x.ndim


# ---------------------------------------------------------------- log-probabilities


def token_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """log softmax(logits)[target] at every position: (B, T, V), (B, T) -> (B, T).

    Any leading shape works: ``logits`` (..., V) and integer ``targets`` (...) in [0, V).
    Equals ``torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]`` and is
    differentiable in ``logits``.
    """
    _check_logits(logits)
    check_token_ids(targets, "targets")
    if tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"logits of shape {tuple(logits.shape)} need targets of shape "
                         f"{tuple(logits.shape[:-1])}, got targets of shape {tuple(targets.shape)}")
    V = logits.shape[-1]
    if targets.numel() and (bool((targets < 0).any()) or bool((targets >= V).any())):
        bad = targets[(targets < 0) | (targets >= V)][0].item()
        raise ValueError(f"targets must be token ids in [0, {V}), found {bad}")
    logp = log_softmax(logits, dim=-1)  # (..., V)
    return logp.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)  # (...)


def _logits_of(output: object) -> Tensor:
    """A model's output as a logits tensor: the tensor itself, or its ``.logits``."""
    if isinstance(output, Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, Tensor):
        return logits
    raise TypeError("model must return a logits tensor of shape (B, T, V) or an object with a "
                    f"`.logits` tensor, got {type(output).__name__}")


def response_outputs(model: Callable[[Tensor], object], prompt_ids: Tensor,
                     response_ids: Tensor) -> Tensor:
    """A model's outputs at the positions that predict the response: (B, P), (B, R) -> (B, R, ...).

    ``model`` is called once on the concatenation [x; y] (B, P + R) and returns one output
    per position, (B, P + R, ...): next-token logits (B, T, V), or an object with a
    ``.logits`` attribute as Hugging Face models return, or a critic's values (B, T). The
    output at position P - 1 + t has seen x and y_<t, the state in which y_t is chosen, so

        out[:, t] = model([x; y])[:, P - 1 + t],   t = 0, ..., R - 1.

    Every row has the same P and R. The prompt must hold at least one token, and if
    ``model.config.max_seq_len`` exists then P + R must not exceed it.
    """
    if not callable(model):
        raise TypeError(f"model must be callable on token ids, got {type(model).__name__}")
    B, P, R = _check_prompt_response(prompt_ids, response_ids)
    config = getattr(model, "config", None)
    max_len = getattr(config, "max_seq_len", None)
    if isinstance(max_len, int) and P + R > max_len:
        raise ValueError(f"prompt plus response has length P + R = {P} + {R} = {P + R}, which "
                         f"exceeds the model's context max_seq_len={max_len}")
    ids = torch.cat([prompt_ids, response_ids.to(prompt_ids.dtype)], dim=1)  # (B, P + R)
    out = _logits_of(model(ids))  # (B, P + R, ...)
    if out.ndim < 2 or tuple(out.shape[:2]) != (B, P + R):
        raise ValueError(f"model must return one output per position, (B, T, ...) = ({B}, {P + R}, "
                         f"...), e.g. logits (B, T, V); got {tuple(out.shape)}")
    return out[:, P - 1:P + R - 1]  # (B, R, ...)


def response_logprobs(model: Callable[[Tensor], object], prompt_ids: Tensor,
                      response_ids: Tensor) -> Tensor:
    """Per-token log pi(y_t | x, y_<t) of a response given a prompt: (B, P), (B, R) -> (B, R).

    ``model`` is a causal language model called on token ids (B, T) and returning the
    next-token logits (B, T, V) (or an object with a ``.logits`` attribute, as Hugging Face
    models return). It is run once on the concatenation [x; y] of length P + R; the logits
    at position P - 1 + t score the response token y_t (:func:`response_outputs`), so

        out[b, t] = log softmax(logits[b, P - 1 + t])[y_t],   t = 0, ..., R - 1.

    Every row has the same P and R. Right-padded responses are fine (a causal model's
    logits at a position do not depend on later tokens): mask the padding afterwards, e.g.
    with :func:`masked_sum`. Prompts are taken as they are, with no attention mask. The
    prompt must hold at least one token, and if ``model.config.max_seq_len`` exists then
    P + R must not exceed it.
    """
    logits = response_outputs(model, prompt_ids, response_ids)  # (B, R, V)
    if logits.ndim != 3:
        raise ValueError(f"model must return logits of shape (B, T, V), got outputs of shape "
                         f"{tuple(logits.shape[:1])} + (T,) + {tuple(logits.shape[2:])}")
    return token_logprobs(logits, response_ids)  # (B, R)


def token_entropy(logits: Tensor) -> Tensor:
    """Entropy -sum_v p_v log p_v of softmax(logits) at every position: (B, T, V) -> (B, T).

    In nats; any leading shape. Computed from the stable log-softmax; vocabulary entries
    with logit -inf (probability 0) contribute 0 (the limit of p log p), not NaN.
    """
    _check_logits(logits)
    logp = log_softmax(logits, dim=-1)  # (..., V)
    p = torch.exp(logp)
    plogp = torch.where(p > 0, p * logp, torch.zeros_like(p))
    return -plogp.sum(dim=-1)  # (...)


# ---------------------------------------------------------------- masked reductions


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum(x * mask) over all entries (a scalar) or along ``dim``; mask has x's shape.

    Masked-out entries contribute exactly 0, even when they hold inf or NaN.
    """
    _check_floating(x, "x")
    m = _check_mask(mask, x)
    dim = _check_reduce_dim(x, dim)
    kept = torch.where(m > 0, x, torch.zeros_like(x))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum(x * mask) / sum(mask), over all entries or along ``dim`` (one mean per row).

    A mask with no ones (anywhere, or in one row when ``dim`` is given) is a
    ``ValueError``: the mean of nothing is undefined.
    """
    _check_floating(x, "x")
    m = _check_mask(mask, x)
    dim = _check_reduce_dim(x, dim)
    count = m.sum() if dim is None else m.sum(dim=dim)
    if bool((count == 0).any()):
        where = "" if dim is None else f" along dim={dim} (a row with no ones)"
        raise ValueError(f"mask has no ones{where}: the masked mean is undefined")
    return masked_sum(x, m, dim) / count


def masked_normalize(x: Tensor, mask: Tensor, constant: float, dim: int | None = None) -> Tensor:
    """sum(x * mask) / constant, over all entries or along ``dim``.

    Dividing by a fixed constant (e.g. the maximum response length) instead of the number of
    unmasked tokens gives every token the same weight whatever the length of its response:
    the aggregation of Dr. GRPO (Liu et al., 2025).
    """
    if isinstance(constant, bool) or not isinstance(constant, int | float):
        raise TypeError(f"constant must be a number, got {constant!r} ({type(constant).__name__})")
    if not constant > 0 or constant == float("inf"):
        raise ValueError(f"constant must be a positive finite number, got constant={constant}")
    return masked_sum(x, mask, dim) / constant


def response_mask(prompt_lengths: Tensor, total_length: int,
                  sequence_lengths: Tensor | None = None) -> Tensor:
    """Boolean (B, total_length) mask of response positions: prompt_lengths[b] <= t < end_b.

    ``prompt_lengths`` (B,) holds the number of prompt tokens of each row of a
    prompt-plus-response sequence of length ``total_length``; ``end_b`` is
    ``sequence_lengths[b]`` (B,) when given (right padding after the response), else
    ``total_length``. Requires 0 <= prompt_lengths <= sequence_lengths <= total_length.
    """
    total_length = check_positive_int("total_length", total_length)
    check_token_ids(prompt_lengths, "prompt_lengths")
    if prompt_lengths.ndim != 1:
        raise ValueError(f"prompt_lengths must be 1-d (B,), got shape {tuple(prompt_lengths.shape)}")
    if sequence_lengths is None:
        end = torch.full_like(prompt_lengths, total_length)
    else:
        check_token_ids(sequence_lengths, "sequence_lengths")
        if tuple(sequence_lengths.shape) != tuple(prompt_lengths.shape):
            raise ValueError(f"sequence_lengths must have the shape of prompt_lengths, "
                             f"{tuple(prompt_lengths.shape)}, got {tuple(sequence_lengths.shape)}")
        end = sequence_lengths
    if bool((prompt_lengths < 0).any()):
        raise ValueError(f"prompt_lengths must be >= 0, got {prompt_lengths.tolist()}")
    if bool((end > total_length).any()) or bool((prompt_lengths > end).any()):
        raise ValueError(f"need prompt_lengths <= sequence_lengths <= total_length={total_length}, "
                         f"got prompt_lengths={prompt_lengths.tolist()}, "
                         f"sequence_lengths={end.tolist()}")
    t = torch.arange(total_length, device=prompt_lengths.device)  # (T,)
    return (t >= prompt_lengths[:, None]) & (t < end[:, None])  # (B, T)


# ---------------------------------------------------------------- the reduction of a loss


def check_reduction(reduction: object, allowed: tuple[str, ...] = REDUCTIONS,
                    name: str = "reduction") -> str:
    """Return ``reduction`` if it is one of ``allowed`` (a ``str``), else raise naming it."""
    if not isinstance(reduction, str):
        raise TypeError(f"{name} must be a str, one of {allowed}, got {reduction!r} "
                        f"({type(reduction).__name__})")
    if reduction not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {reduction!r}")
    return reduction


def reduce_tokens(values: Tensor, mask: Tensor, reduction: str = "token_mean",
                  normaliser: float | None = None) -> Tensor:
    """Per-token values (B, T) and their mask (B, T) -> the loss under ``reduction``.

    With m the mask, L_b = sum_t m_bt the number of tokens of sequence b and B the number
    of sequences (all leading dimensions together; the last one is the token axis):

    * ``"none"``: the per-token values (B, T) with masked-out positions set to exactly 0
      (even where they held inf or NaN), so that ``reduce_tokens(v, m, "none").sum()`` is
      the ``"sum"``;
    * ``"sum"``: sum_bt m_bt v_bt, a scalar: a token weighs 1;
    * ``"token_mean"``: the sum / sum_b L_b, every token of the batch weighted alike
      (the SFT loss, PPO, DAPO; trl's "bnpo");
    * ``"sequence_mean"``: mean over sequences of each sequence's own token mean,
      (1/B) sum_b (1/L_b) sum_t m_bt v_bt (the GRPO paper): a token of sequence b weighs
      1 / (B L_b), so tokens of short sequences weigh more;
    * ``"constant"``: the sum / ``normaliser`` C, a number fixed in advance, e.g. B times
      the longest allowed response (Dr. GRPO, Liu et al., 2025) or the whole batch's token
      count when ``values`` is one micro-batch of it: a token weighs 1/C whatever its
      sequence.

    ``normaliser`` (a positive finite number) is required by ``"constant"`` and refused by
    the others. The mask is boolean or 0/1, exactly the shape of ``values`` (never
    broadcast). What an empty mask does: ``"sum"`` and ``"constant"`` of no tokens are 0
    (a micro-batch without response tokens adds nothing), and ``"none"`` is all zeros; a
    mean over no tokens is undefined, so ``"token_mean"`` with an all-false mask, and
    ``"sequence_mean"`` with any sequence that has no tokens, raise ``ValueError`` (as
    :func:`masked_mean` does), never return NaN. Differentiable in ``values``; the weights
    of the gradient are :func:`reduction_weights`.
    """
    _check_floating(values, "values")
    reduction = check_reduction(reduction)
    if values.ndim == 0:
        raise ValueError("values must have a token axis, (..., T), got a 0-d tensor")
    m = _check_mask(mask, values, "mask", "values")
    if reduction != "constant" and normaliser is not None:
        raise ValueError(f"normaliser applies to reduction='constant' only, got "
                         f"reduction={reduction!r} with normaliser={normaliser!r}")
    if reduction == "none":
        return torch.where(m > 0, values, torch.zeros_like(values))
    if reduction == "sum":
        return masked_sum(values, m)
    if reduction == "token_mean":
        if float(m.sum()) == 0:
            raise ValueError("mask has no ones: reduction='token_mean' (a mean over the tokens) "
                             "is undefined")
        return masked_mean(values, m)
    if reduction == "sequence_mean":
        return masked_mean(values, m, dim=-1).mean()
    if normaliser is None:
        raise ValueError("reduction='constant' needs a normaliser (e.g. B * max_length)")
    return masked_normalize(values, m, normaliser)


def reduction_weights(mask: Tensor, reduction: str = "token_mean",
                      normaliser: float | None = None) -> Tensor:
    """The weight w_bt = d reduce_tokens(v, mask) / d v_bt of every token: (B, T) -> (B, T).

    Every reduction is linear in the values, reduce = sum_bt w_bt v_bt, so the weights are
    its gradient: m_bt for ``"sum"``, m_bt / sum L for ``"token_mean"``, m_bt / (B L_b) for
    ``"sequence_mean"``, m_bt / C for ``"constant"``, all in float64. ``"none"`` has no
    single gradient (it returns a tensor) and is refused. Same validation as
    :func:`reduce_tokens`.
    """
    if reduction == "none":
        raise ValueError("reduction='none' returns per-token values, not a loss: it has no weights")
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    values = torch.zeros(tuple(mask.shape), dtype=torch.float64, requires_grad=True)
    reduce_tokens(values, mask, reduction, normaliser).backward()
    return values.grad


def reduction_weights_symbolic(lengths: list[int] | None = None) -> dict[str, Any]:
    """The weight of one token of sequence b under each reduction, derived with SymPy.

    A batch of B sequences of L_1, ..., L_B tokens with symbolic per-token losses l_bt;
    each reduction is written out as the loss it is and differentiated with respect to
    l_b1. Returns ``{"sum": 1, "token_mean": 1/(L_1 + ... + L_B), "sequence_mean":
    1/(B L_b), "constant": 1/C, "B": B, "L": (L_1, ..., L_B)}`` for sequence b = 1, with
    ``lengths`` the concrete L_b (default: symbols for B = 3), and under "per_sequence" the
    same for every sequence: {reduction: (w_1, ..., w_B)}. The per-sequence totals
    follow: sequence b receives L_b / (sum L) of the token mean's gradient but 1 / B of the
    sequence mean's.
    """
    if lengths is None:
        L = sp.symbols("L_1:4", positive=True, integer=True)
        sizes = None
    else:
        if not isinstance(lengths, list | tuple) or not lengths or not all(
                isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in lengths):
            raise ValueError(f"lengths must be a non-empty list of positive ints, got {lengths!r}")
        L, sizes = tuple(sp.Integer(n) for n in lengths), list(lengths)
    B = len(L)
    C = sp.Symbol("C", positive=True)
    # symbolic per-token losses: sizes known -> concrete tokens; else a representative token
    # l_b1 plus the rest of sequence b summed as (L_b - 1) copies of a second symbol
    first = sp.symbols(f"l_1:{B + 1}")
    rest = sp.symbols(f"r_1:{B + 1}")
    if sizes is None:
        seq_sums = [first[b] + (L[b] - 1) * rest[b] for b in range(B)]
    else:
        seq_sums = [first[b] + sum(sp.Symbol(f"l_{b + 1}_{t}") for t in range(2, sizes[b] + 1))
                    for b in range(B)]
    total = sum(seq_sums)
    losses = {"sum": total, "token_mean": total / sum(L),
              "sequence_mean": sum(s / n for s, n in zip(seq_sums, L, strict=True)) / B,
              "constant": total / C}
    out: dict[str, Any] = {k: sp.simplify(sp.diff(v, first[0])) for k, v in losses.items()}
    out["B"], out["L"] = sp.Integer(B), L
    out["per_sequence"] = {k: tuple(sp.simplify(sp.diff(v, first[b])) for b in range(B))
                           for k, v in losses.items()}
    return out


def reduce_sequences(values: Tensor, reduction: str = "mean") -> Tensor:
    """Per-sequence (per-pair) values (N,) -> the loss: ``"mean"``, ``"sum"`` or ``"none"``.

    The reduction of the sequence-level losses (DPO, IPO, KTO, ORPO, SimPO, RLOO, GSPO,
    Bradley-Terry): each sequence or pair weighs 1/N (``"mean"``) or 1 (``"sum"``), or the
    values come back as they are (``"none"``). An empty ``values`` under ``"mean"`` is a
    ``ValueError``.
    """
    _check_floating(values, "values")
    reduction = check_reduction(reduction, SEQUENCE_REDUCTIONS)
    if reduction == "none":
        return values
    if reduction == "sum":
        return values.sum()
    if values.numel() == 0:
        raise ValueError("values is empty: reduction='mean' (a mean over no sequences) is undefined")
    return values.mean()


def sequence_values(values: Tensor, mask: Tensor, reduction: str = "sum") -> Tensor:
    """Per-token values (B, T) -> one per sequence (B,): their masked ``"sum"`` or ``"mean"``.

    With per-token log-probabilities, ``"sum"`` is log pi(y | x), what DPO, IPO (before its
    division by the length), KTO and RLOO take; ``"mean"`` is the length-normalised
    (1/|y|) log pi(y | x) of SimPO's reward and ORPO's odds, so those methods apply a
    per-sequence token mean where DPO applies a sum. A sequence with no tokens is a
    ``ValueError`` under ``"mean"`` and 0 under ``"sum"``.
    """
    _check_floating(values, "values")
    reduction = check_reduction(reduction, ("sum", "mean"))
    if values.ndim < 1:
        raise ValueError("values must have a token axis, (..., T), got a 0-d tensor")
    if reduction == "sum":
        return masked_sum(values, mask, dim=-1)
    return masked_mean(values, mask, dim=-1)
