"""Decoding: turning next-token distributions into text.

Introduced in notebooks/12_decoding. A language model gives logits z (V,) for the next
token; a decoding rule picks the token. The rules here:

* greedy: argmax z (``temperature=0`` in :func:`generate` and :func:`sample_next`);
* sampling from softmax(z / T) (:func:`apply_temperature`), optionally restricted to the
  k most likely tokens (:func:`top_k_filter`; Fan, Lewis & Dauphin, 2018, "Hierarchical
  Neural Story Generation"), to the nucleus, the smallest set of most likely tokens
  whose probability reaches p (:func:`top_p_filter`; Holtzman et al., 2020, "The Curious
  Case of Neural Text Degeneration"), or to the tokens at least min_p times as likely as
  the most likely one (:func:`min_p_filter`; Nguyen et al., 2024, "Turning Up the Heat:
  Min-p Sampling for Creative and Coherent LLM Outputs");
* rules that look at the history: CTRL's repetition penalty (:func:`repetition_penalty`;
  Keskar et al., 2019) and a ban on repeating an n-gram (:func:`no_repeat_ngram_filter`);
  :func:`process_logits` chains all of them in Hugging Face's order;
* beam search (:func:`beam_search`), which keeps the ``num_beams`` most likely prefixes;
* speculative sampling (:func:`speculative_generate`; Leviathan, Kalman & Matias, 2023,
  "Fast Inference from Transformers via Speculative Decoding"; Chen et al., 2023,
  "Accelerating Large Language Model Decoding with Speculative Sampling"): a cheap draft
  model q proposes gamma tokens, the target p checks them in one forward pass, and an
  accept/reject rule makes the output tokens *exactly* p-distributed. The draft can be the
  target's first layers (:func:`early_exit_draft`) or a copy from the context
  (:class:`PromptLookupDraft`), and :func:`speculative_speedup` predicts the wall-clock gain.

:func:`stream` yields the tokens of a :class:`~llmbook.transformer.model.TransformerLM` one
step at a time, with the KV cache of :mod:`llmbook.inference.kvcache` and optional stop
tokens; :func:`generate` collects them, :func:`sample_text` works on text, and
:class:`IncrementalDecoder` turns streamed ids into text that never splits a character.
:func:`repeated_ngram_fraction` measures how much a text repeats itself. :class:`BigramLM`
is a hand-made model (next-token logits from a table indexed by the last token) for worked
examples, and :func:`chi_square_test` the goodness-of-fit test the chapter uses to check a
sampler.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from llmbook.inference.fast_decode import StaticKVCache, compiled_decode_step, decode_step
from llmbook.inference.kvcache import KVCache
from llmbook.transformer.model import TransformerLM
from llmbook.validation import check_probability

__all__ = [
    "BigramLM",
    "Hypothesis",
    "KV_CACHES",
    "IncrementalDecoder",
    "PromptLookupDraft",
    "SpeculativeStats",
    "apply_temperature",
    "beam_search",
    "chi_square_sf",
    "chi_square_test",
    "early_exit_draft",
    "expected_tokens_per_step",
    "generate",
    "min_p_filter",
    "no_repeat_ngram_filter",
    "process_logits",
    "repeated_ngram_fraction",
    "repetition_penalty",
    "residual_distribution",
    "sample_categorical",
    "sample_next",
    "sample_text",
    "sequence_log_prob",
    "speculative_generate",
    "speculative_sample",
    "speculative_speedup",
    "stream",
    "top_k_filter",
    "top_p_filter",
]


# ---------------------------------------------------------------- validation


def _check_logits(logits: object) -> Tensor:
    if not isinstance(logits, Tensor) or not logits.is_floating_point():
        what = logits.dtype if isinstance(logits, Tensor) else type(logits).__name__
        raise TypeError(f"logits must be a floating-point tensor (..., V), got {what}")
    if logits.ndim < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have shape (..., V) with V >= 1, got {tuple(logits.shape)}")
    return logits


def _check_drawable(logits: Tensor) -> None:
    """Logits (B, V) a token can be drawn from: no NaN, no +inf (-inf masks a token), and
    not every token of a row masked. The error names the first bad position."""
    bad = torch.isnan(logits) | (logits == float("inf"))
    if bool(bad.any()):
        b, v = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"logits must be finite or -inf (a masked token); logits[{b}, {v}] = "
                         f"{float(logits[b, v])}")
    dead = torch.isneginf(logits).all(dim=-1)
    if bool(dead.any()):
        raise ValueError(f"row {int(dead.nonzero()[0])} of logits is -inf for every token: "
                         f"nothing can be drawn")


def _check_temperature(temperature: object, allow_zero: bool) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        raise TypeError(f"temperature must be a number, got {temperature!r}")
    if math.isnan(temperature) or temperature < 0 or (temperature == 0 and not allow_zero):
        rule = ">= 0 (0 means greedy)" if allow_zero else "> 0"
        raise ValueError(f"temperature must be {rule}, got temperature={temperature}")
    return float(temperature)


def _check_top_k(k: object) -> int:
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"top_k must be an int, got {k!r}")
    if k < 1:
        raise ValueError(f"top_k must be >= 1, got top_k={k}")
    return k


def _check_top_p(p: object) -> float:
    return check_probability("top_p", p, allow_zero=False)


def _check_min_p(p: object) -> float:
    return check_probability("min_p", p)


def _check_penalty(penalty: object) -> float:
    if isinstance(penalty, bool) or not isinstance(penalty, int | float):
        raise TypeError(f"repetition penalty must be a number, got {penalty!r}")
    if not (math.isfinite(penalty) and penalty > 0):
        raise ValueError(f"repetition penalty must be a positive finite number (1 = none), "
                         f"got penalty={penalty}")
    return float(penalty)


def _check_ids(ids: object, name: str = "prompt_ids") -> Tensor:
    if not isinstance(ids, Tensor) or ids.dtype not in (torch.int64, torch.int32):
        what = ids.dtype if isinstance(ids, Tensor) else type(ids).__name__
        raise TypeError(f"{name} must be an integer tensor of token ids, got {what}")
    if ids.ndim != 2 or ids.shape[1] == 0:
        raise ValueError(f"{name} must have shape (B, T) with T >= 1, got {tuple(ids.shape)}")
    return ids.long()


def _check_history(previous_ids: object, logits: Tensor) -> Tensor:
    """previous_ids (..., T) of integer ids in [0, V) for logits (..., V); T may be 0."""
    if not isinstance(previous_ids, Tensor) or previous_ids.dtype not in (torch.int64, torch.int32):
        what = previous_ids.dtype if isinstance(previous_ids, Tensor) else type(previous_ids).__name__
        raise TypeError(f"previous_ids must be an integer tensor of token ids, got {what}")
    if previous_ids.shape[:-1] != logits.shape[:-1] or previous_ids.ndim != logits.ndim:
        raise ValueError(f"previous_ids must have shape (..., T) with the leading shape of logits "
                         f"{tuple(logits.shape)}, got {tuple(previous_ids.shape)}")
    V = logits.shape[-1]
    if previous_ids.numel() and not (0 <= int(previous_ids.min()) and int(previous_ids.max()) < V):
        raise ValueError(f"previous_ids must lie in [0, V={V}), got values from "
                         f"{int(previous_ids.min())} to {int(previous_ids.max())}")
    return previous_ids.long()


def _check_count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {name}={value}")
    return value


def _check_fits(model: nn.Module, total: int, what: str) -> None:
    config = getattr(model, "config", None)
    T_max = getattr(config, "max_seq_len", None)
    if T_max is not None and total > T_max:
        raise ValueError(f"{what} = {total} tokens exceed the model's context "
                         f"max_seq_len={T_max}")


# ---------------------------------------------------------------- the pure rules


def apply_temperature(logits: Tensor, temperature: float) -> Tensor:
    """z / T: softmax(z / T) is flatter for T > 1 and sharper for T < 1 (T > 0).

    As T -> 0 the distribution tends to the arg max (greedy decoding, which
    :func:`sample_next` uses for T = 0); as T -> infinity, to the uniform distribution.
    Shapes: (..., V) -> (..., V).
    """
    logits = _check_logits(logits)
    return logits / _check_temperature(temperature, allow_zero=False)


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the k largest logits of each row and set the others to -inf: (..., V) -> (..., V).

    Exactly min(k, V) entries are kept: ties at the boundary go to the lower token index
    (a stable sort), so the set kept is deterministic. k >= V keeps everything.
    """
    logits = _check_logits(logits)
    k = _check_top_k(k)
    V = logits.shape[-1]
    if k >= V:
        return logits.clone()
    order = torch.sort(logits, dim=-1, descending=True, stable=True).indices  # (..., V)
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order[..., :k], True)
    return logits.masked_fill(~keep, float("-inf"))


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Nucleus filtering (Holtzman et al., 2020): keep the smallest set of most likely tokens
    whose probability sums to at least p; set the rest to -inf. (..., V) -> (..., V).

    Sorting the probabilities p_(1) >= p_(2) >= ..., token (i) is kept when the mass before
    it, p_(1) + ... + p_(i-1), is below p: that is the shortest prefix reaching p. The
    probabilities and their running sum are computed in float64, so the set is the exact
    rule's unless a running sum lies within float64 round-off of p. The most likely token
    is always kept; ties are ordered by token index (a stable sort); p = 1 keeps everything.
    """
    logits = _check_logits(logits)
    p = _check_top_p(p)
    if p == 1.0:
        return logits.clone()
    probs = torch.softmax(logits.double(), dim=-1)  # (..., V)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # (..., V)
    keep_sorted = mass_before < p
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return logits.masked_fill(~keep, float("-inf"))


def min_p_filter(logits: Tensor, min_p: float) -> Tensor:
    """Min-p filtering (Nguyen et al., 2024, "Turning Up the Heat: Min-p Sampling for Creative
    and Coherent LLM Outputs"): keep the tokens with p(x) >= min_p * max_y p(y) and set the
    rest to -inf. (..., V) -> (..., V).

    The cut is relative to the most likely token: strict when the model is sure, lenient
    when it is not. Since p(x) / max p = exp(z_x - max z), the rule is
    z_x - max z >= log(min_p), tested in float64 on the logits (no softmax needed). After a
    temperature T the cut on the raw logits is max z + T log(min_p): unlike top-k, min-p
    depends on T. The most likely token is always kept; min_p = 0 keeps everything.
    """
    logits = _check_logits(logits)
    min_p = _check_min_p(min_p)
    if min_p == 0:
        return logits.clone()
    z = logits.double()
    keep = z - z.amax(dim=-1, keepdim=True) >= math.log(min_p)  # (..., V)
    return logits.masked_fill(~keep, float("-inf"))


def repetition_penalty(logits: Tensor, previous_ids: Tensor, penalty: float) -> Tensor:
    """CTRL's repetition penalty (Keskar et al., 2019, "CTRL: A Conditional Transformer
    Language Model for Controllable Generation", section 4.1). logits (..., V) and
    previous_ids (..., T) -> (..., V).

    Every token that occurs in ``previous_ids`` (once or many times: the penalty is applied
    once) has its logit z divided by ``penalty`` if z > 0 and multiplied by it if z < 0, so
    a penalty theta > 1 always lowers a seen token's logit and theta < 1 raises it. (The
    paper divides every seen logit by theta, which would *raise* a negative one; the
    sign-aware form is the one Hugging Face and llama.cpp implement.) Since z / T keeps the
    sign of z, penalising before or after a temperature T > 0 gives the same logits.
    Keskar et al. suggest theta = 1.2.
    """
    logits = _check_logits(logits)
    penalty = _check_penalty(penalty)
    ids = _check_history(previous_ids, logits)
    seen = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, ids, True)  # (..., V)
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalised, logits)


_penalise_repeats = repetition_penalty  # the name stays usable where a parameter shadows it


def no_repeat_ngram_filter(logits: Tensor, previous_ids: Tensor, n: int) -> Tensor:
    """Forbid any n-gram from occurring twice: a token that would complete an n-gram already
    present in ``previous_ids`` gets -inf. logits (..., V), previous_ids (..., T) -> (..., V).

    The rule of Paulus, Xiong & Socher (2018, "A Deep Reinforced Model for Abstractive
    Summarization"), who never let beam search output the same trigram twice; it is
    ``no_repeat_ngram_size`` in fairseq and Hugging Face. The last n - 1 tokens of the
    history begin the n-gram being written; each earlier occurrence of them bans the token
    that followed it. n = 1 bans every token seen; a history shorter than n bans nothing.
    Unlike the repetition penalty it is a hard constraint, and with a small n it also bans
    repeats that language needs ("of the" twice in a paragraph).
    """
    logits = _check_logits(logits)
    n = _check_count("no_repeat_ngram_size", n, 1)
    ids = _check_history(previous_ids, logits)
    T, V = ids.shape[-1], logits.shape[-1]
    if T < n:
        return logits.clone()
    rows = ids.reshape(-1, T)  # (R, T): one history per row of logits
    windows = rows.unfold(1, n, 1)  # (R, T - n + 1, n): every n-gram of the history
    prefix = rows[:, T - n + 1:]  # (R, n - 1): the start of the n-gram being written
    matches = (windows[..., :-1] == prefix[:, None]).all(dim=-1)  # (R, T - n + 1)
    banned = torch.zeros(rows.shape[0], V, dtype=torch.bool, device=logits.device)
    for r in range(rows.shape[0]):
        banned[r, windows[r, matches[r], -1]] = True  # the tokens that completed them
    return logits.masked_fill(banned.view(logits.shape), float("-inf"))


def process_logits(logits: Tensor, previous_ids: Tensor | None = None, *,
                   temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None, min_p: float | None = None,
                   repetition_penalty: float = 1.0,
                   no_repeat_ngram_size: int | None = None) -> Tensor:
    """Every rule of this module, in the order Hugging Face's ``generate`` applies them:
    (..., V) -> (..., V).

    First the rules that read the history ``previous_ids`` (..., T) (the prompt and the
    tokens generated so far): :func:`repetition_penalty` (1 = none) and
    :func:`no_repeat_ngram_filter`. They act on the model's own logits, and also in greedy
    decoding. Then the sampling rules: :func:`apply_temperature`, :func:`top_k_filter`,
    :func:`top_p_filter` (on the distribution top-k left) and :func:`min_p_filter` (after
    the temperature, which moves its cut). ``temperature == 0`` means greedy decoding: only
    the history rules apply, since every truncation rule keeps the arg max anyway.
    """
    logits = _check_logits(logits)
    temperature = _check_temperature(temperature, allow_zero=True)
    penalty = _check_penalty(repetition_penalty)
    if (penalty != 1.0 or no_repeat_ngram_size is not None) and previous_ids is None:
        raise ValueError("repetition_penalty and no_repeat_ngram_size need previous_ids, "
                         "the tokens of the context so far")
    for check, value in ((_check_top_k, top_k), (_check_top_p, top_p), (_check_min_p, min_p)):
        if value is not None:
            check(value)
    z = logits
    if penalty != 1.0:
        z = _penalise_repeats(z, previous_ids, penalty)
    if no_repeat_ngram_size is not None:
        z = no_repeat_ngram_filter(z, previous_ids, no_repeat_ngram_size)
    if temperature == 0:
        return z
    z = apply_temperature(z, temperature)
    if top_k is not None:
        z = top_k_filter(z, top_k)
    if top_p is not None:
        z = top_p_filter(z, top_p)
    if min_p is not None:
        z = min_p_filter(z, min_p)
    return z


def sample_categorical(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One draw from each row of ``probs`` (..., V) -> (...,) long, by an exponential race.

    Every token gets an independent clock E_i ~ Exp(1) and the largest p_i / E_i wins.
    E_i / p_i is exponential with rate p_i, and the first of independent exponential clocks
    to ring is clock i with probability p_i / sum_j p_j: the draw follows ``probs``
    (normalised or not). Since -log E_i is a standard Gumbel variable, this is the
    Gumbel-max trick, argmax (log p_i + G_i). It is also how ``torch.multinomial(probs, 1)``
    draws a single sample on the CPU, so with the same ``generator`` both give the same
    tokens (a test checks it). Zero-probability tokens never win.
    """
    if not isinstance(probs, Tensor) or not probs.is_floating_point() or probs.ndim < 1:
        raise TypeError(f"probs must be a floating-point tensor (..., V), got "
                        f"{probs.dtype if isinstance(probs, Tensor) else type(probs).__name__}")
    if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()) \
            or not bool((probs.sum(dim=-1) > 0).all()):
        raise ValueError("probs must be finite, non-negative, with a positive sum in every row")
    clocks = torch.empty_like(probs).exponential_(1, generator=generator)  # (..., V)
    return (probs / clocks).argmax(dim=-1)


def sample_next(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None, *,
                min_p: float | None = None, repetition_penalty: float = 1.0,
                no_repeat_ngram_size: int | None = None,
                previous_ids: Tensor | None = None) -> Tensor:
    """Draw the next token of each row of ``logits`` (B, V) -> (B,) long.

    The logits go through :func:`process_logits` (history rules, then temperature, top-k,
    top-p, min-p; ``previous_ids`` (B, T) is the history). ``temperature == 0`` is greedy
    decoding: the arg max (the lowest index among ties) of the penalised logits. Otherwise
    a token is drawn from the softmax, in float64, with :func:`sample_categorical` and
    ``generator``.
    """
    logits = _check_logits(logits)
    if logits.ndim != 2:
        raise ValueError(f"logits must have shape (B, V), got {tuple(logits.shape)}")
    _check_drawable(logits)
    z = process_logits(logits, previous_ids, temperature=temperature, top_k=top_k, top_p=top_p,
                       min_p=min_p, repetition_penalty=repetition_penalty,
                       no_repeat_ngram_size=no_repeat_ngram_size)
    if temperature == 0:
        return z.argmax(dim=-1)  # (B,)
    probs = torch.softmax(z.double(), dim=-1)  # (B, V)
    return sample_categorical(probs, generator)  # (B,)


# ---------------------------------------------------------------- generation


def _check_stop(stop_ids: object, pad_id: object, batch: int,
                vocab_size: int | None) -> tuple[Tensor | None, int | None]:
    if stop_ids is None:
        if pad_id is not None:
            raise ValueError("pad_id only pads rows that stopped: give stop_ids too")
        return None, None
    stops = [stop_ids] if isinstance(stop_ids, int) else stop_ids
    if not isinstance(stops, Iterable) or isinstance(stops, str | bytes):
        raise TypeError(f"stop_ids must be an int or an iterable of ints, got {stop_ids!r}")
    stops = list(stops)
    if not stops or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in stops):
        raise ValueError(f"stop_ids must be one or more token ids >= 0, got {stop_ids!r}")
    if pad_id is None and batch > 1:
        raise ValueError(f"pad_id is needed with stop_ids when B = {batch} > 1: rows that "
                         "stopped are padded with it until every row has stopped")
    if pad_id is not None:
        if isinstance(pad_id, bool) or not isinstance(pad_id, int):
            raise TypeError(f"pad_id must be an int, got {pad_id!r}")
        if pad_id < 0 or (vocab_size is not None and pad_id >= vocab_size):
            raise ValueError(f"pad_id must be a token id in [0, {vocab_size}), got {pad_id}")
    return torch.tensor(stops, dtype=torch.long), pad_id


def stream(model: nn.Module, prompt_ids: Tensor, max_new_tokens: int, temperature: float = 1.0,
           top_k: int | None = None, top_p: float | None = None, use_cache: bool = True,
           generator: torch.Generator | None = None, *, min_p: float | None = None,
           repetition_penalty: float = 1.0, no_repeat_ngram_size: int | None = None,
           stop_ids: int | Iterable[int] | None = None,
           pad_id: int | None = None, kv_cache: str = "dynamic") -> Iterator[Tensor]:
    """Generate token by token: an iterator over the new tokens, one (B,) long tensor per step.

    ``prompt_ids`` (B, T). Each step draws a token for every row with :func:`sample_next`
    (the rules of :func:`process_logits`; the history is the prompt plus the tokens so far;
    ``temperature=0`` is greedy) and yields it before the model runs again, so a caller can
    print it at once (with :class:`IncrementalDecoder`) or stop early. With ``stop_ids``
    (one id or several) a row stops once it has emitted one of them, the stop token
    included; the iteration ends when every row has stopped or after ``max_new_tokens``
    steps. Rows that stopped are filled with ``pad_id`` (needed when B > 1). The rows' random
    draws do not depend on when other rows stop.

    T + max_new_tokens must fit in the model's context (max_seq_len): there is no sliding
    window. With ``use_cache`` and a :class:`~llmbook.transformer.model.TransformerLM`, the
    prompt runs once (the *prefill*) into a :class:`~llmbook.inference.kvcache.KVCache` and
    every later step runs the one new token; otherwise (or for any other model
    ``ids -> logits``) each step recomputes the whole sequence. Both give the same tokens.
    ``kv_cache`` picks the cache of a cached ``TransformerLM``: "dynamic" (chapter 12's
    :class:`~llmbook.inference.kvcache.KVCache`, which hands attention the positions cached
    so far), "static" (:class:`~llmbook.inference.fast_decode.StaticKVCache` and
    :func:`~llmbook.inference.fast_decode.decode_step`: fixed shapes, a masked attention over
    every slot) or "compiled" (the same, with each one-token step run by ``torch.compile``;
    the cache is sized to a power of two, at least 256, so that prompts of different lengths
    reuse a compiled graph; the first call compiles, which takes tens of seconds on a CPU).
    The three agree to round-off (tests). The arguments are checked when ``stream`` is
    called, not at the first step.
    """
    ids = _check_ids(prompt_ids)
    max_new_tokens = _check_count("max_new_tokens", max_new_tokens, 0)
    _check_temperature(temperature, allow_zero=True)
    _check_penalty(repetition_penalty)
    for check, value in ((_check_top_k, top_k), (_check_top_p, top_p), (_check_min_p, min_p)):
        if value is not None:
            check(value)
    if no_repeat_ngram_size is not None:
        _check_count("no_repeat_ngram_size", no_repeat_ngram_size, 1)
    B, T0 = ids.shape
    vocab_size = getattr(getattr(model, "config", None), "vocab_size", None)
    stops, pad = _check_stop(stop_ids, pad_id, B, vocab_size)
    _check_fits(model, T0, "the prompt")
    _check_fits(model, T0 + max_new_tokens, "prompt + max_new_tokens")
    if kv_cache not in KV_CACHES:
        raise ValueError(f"kv_cache must be one of {list(KV_CACHES)}, got {kv_cache!r}")
    rules = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                 repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size)
    forward = _cached_forward(model, B, T0 + max_new_tokens, kv_cache) if use_cache else None
    return _steps(model, ids, max_new_tokens, forward, generator, rules, stops, pad)


#: The caches :func:`stream` can decode with (its ``kv_cache`` argument).
KV_CACHES = ("dynamic", "static", "compiled")


def _cached_forward(model: nn.Module, B: int, T_total: int,
                    kind: str) -> Any | None:
    """forward(x (B, T), start) -> logits (B, T, V) with a cache of ``kind`` for the
    positions start .. start + T - 1, or None for a model without one (recompute)."""
    if not isinstance(model, TransformerLM):
        return None
    if kind == "dynamic":
        cache = KVCache.for_model(model, B, T_total)
        return lambda x, start: model(x, cache=cache)
    size = T_total if kind == "static" else max(256, 1 << (T_total - 1).bit_length())
    static = StaticKVCache.for_model(model, B, min(size, model.config.max_seq_len))
    step = compiled_decode_step(model) if kind == "compiled" else None

    def forward(x: Tensor, start: int) -> Tensor:
        if step is None or x.shape[1] > 1:  # the prompt runs eagerly: its length varies
            return decode_step(model, x, torch.tensor(start), static)
        return step(x, torch.tensor(start), static)
    return forward


@torch.no_grad()
def _steps(model: nn.Module, ids: Tensor, max_new_tokens: int, forward: Any | None,
           generator: torch.Generator | None, rules: dict[str, Any], stops: Tensor | None,
           pad: int | None) -> Iterator[Tensor]:
    """The loop of :func:`stream` (arguments already checked); ``forward`` from
    :func:`_cached_forward`, or None to recompute the whole sequence at every step."""
    if max_new_tokens == 0:
        return
    was_training = model.training
    model.eval()
    try:
        B, T0 = ids.shape
        logits = (forward(ids, 0) if forward is not None else model(ids))[:, -1]  # (B, V)
        done = torch.zeros(B, dtype=torch.bool)
        for step in range(max_new_tokens):
            nxt = sample_next(logits, generator=generator, previous_ids=ids, **rules)  # (B,)
            if stops is not None:
                if pad is not None:
                    nxt = torch.where(done, pad, nxt)
                done = done | torch.isin(nxt, stops)
            ids = torch.cat([ids, nxt[:, None]], dim=1)  # (B, T0 + step + 1)
            yield nxt
            if step == max_new_tokens - 1 or bool(done.all()):
                return
            if forward is not None:  # only the new token: (B, V)
                logits = forward(nxt[:, None], T0 + step)[:, -1]
            else:
                logits = model(ids)[:, -1]  # the whole sequence again
    finally:
        model.train(was_training)


def generate(model: nn.Module, prompt_ids: Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, use_cache: bool = True,
             generator: torch.Generator | None = None, *, min_p: float | None = None,
             repetition_penalty: float = 1.0, no_repeat_ngram_size: int | None = None,
             stop_ids: int | Iterable[int] | None = None, pad_id: int | None = None,
             kv_cache: str = "dynamic") -> Tensor:
    """The prompt and its continuation: ``prompt_ids`` (B, T) -> (B, T + n).

    Collects :func:`stream` (same arguments): n = ``max_new_tokens``, or fewer with
    ``stop_ids``, when every row has stopped earlier (then each row ends with its stop token
    and, for rows that stopped before the last step, ``pad_id`` after it). With B = 1 the
    result ends at the first stop token.
    """
    ids = _check_ids(prompt_ids)
    steps = list(stream(model, ids, max_new_tokens, temperature, top_k, top_p, use_cache,
                        generator, min_p=min_p, repetition_penalty=repetition_penalty,
                        no_repeat_ngram_size=no_repeat_ngram_size, stop_ids=stop_ids,
                        pad_id=pad_id, kv_cache=kv_cache))
    if not steps:
        return ids.clone()
    return torch.cat([ids, torch.stack(steps, dim=1)], dim=1)  # (B, T + n)


def sample_text(model: nn.Module, tokenizer: Any, prompt: str, max_new_tokens: int = 60,
                temperature: float = 1.0, top_k: int | None = None,
                generator: torch.Generator | None = None, *, top_p: float | None = None,
                min_p: float | None = None, repetition_penalty: float = 1.0,
                stop_ids: int | Iterable[int] | None = None) -> str:
    """The prompt followed by up to ``max_new_tokens`` tokens from :func:`generate`, as text.

    ``tokenizer`` is anything with ``encode(str) -> list[int]`` and ``decode(list[int]) -> str``
    (the book's :class:`~llmbook.text.tokenizer.BPETokenizer`, the real model's chat
    tokenizer); the prompt must encode to at least one token.
    """
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
    ids = torch.tensor([tokenizer.encode(prompt)], dtype=torch.long)  # (1, T)
    if ids.shape[1] == 0:
        raise ValueError("prompt must encode to at least one token")
    out = generate(model, ids, max_new_tokens, temperature, top_k, top_p, generator=generator,
                   min_p=min_p, repetition_penalty=repetition_penalty, stop_ids=stop_ids)
    return tokenizer.decode(out[0].tolist())


class IncrementalDecoder:
    """Text from a stream of token ids, one whole character at a time.

    Byte-level BPE may split a multi-byte UTF-8 character (é is 2 bytes, 海 3, 🌊 4) across
    tokens, and decoding such a token alone gives U+FFFD, the replacement character.
    :meth:`push` appends a token and returns the text it completes: it decodes the ids not
    yet shown (after a little context, for tokenizers whose decoding depends on the text
    before) and returns the new text only once it no longer ends in U+FFFD; until then it
    returns "". :meth:`flush` returns what is left at the end. Everything returned, joined,
    equals ``tokenizer.decode(ids)``, provided the tokenizer's ``decode`` turns invalid
    UTF-8 into U+FFFD (``errors="replace"``, as the book's tokenizers and Hugging Face's do).
    The approach is vLLM's incremental detokenizer in miniature.
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = False) -> None:
        if not callable(getattr(tokenizer, "decode", None)):
            raise TypeError(f"tokenizer must have a decode method, got {type(tokenizer).__name__}")
        self.tokenizer = tokenizer
        self.skip_special_tokens = bool(skip_special_tokens)
        self._ids: list[int] = []
        self._context = 0  # ids[_context:_shown] were shown last: context for decoding
        self._shown = 0  # ids[:_shown] are shown

    def _decode(self, ids: Sequence[int]) -> str:
        if self.skip_special_tokens:
            return self.tokenizer.decode(list(ids), skip_special_tokens=True)
        return self.tokenizer.decode(list(ids))

    def _new_text(self, final: bool) -> str:
        before = self._decode(self._ids[self._context:self._shown])
        text = self._decode(self._ids[self._context:])
        new = text[len(before):]
        if not new or (new.endswith("\ufffd") and not final):
            return ""  # nothing yet, or a character still incomplete
        self._ids = self._ids[self._shown:]  # keep the ids shown last as context
        self._context, self._shown = 0, len(self._ids)
        return new

    def push(self, token_id: int | Tensor) -> str:
        """Add one token id; return the text it completes ("" while a character is open)."""
        if isinstance(token_id, Tensor):
            if token_id.numel() != 1:
                raise ValueError(f"push takes one token id, got a tensor of shape "
                                 f"{tuple(token_id.shape)}")
            token_id = int(token_id.item())
        if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
            raise ValueError(f"token_id must be an int >= 0, got {token_id!r}")
        self._ids.append(token_id)
        return self._new_text(final=False)

    def flush(self) -> str:
        """The text not yet returned, incomplete characters included (as U+FFFD)."""
        return self._new_text(final=True)


def repeated_ngram_fraction(ids: Sequence[int] | Tensor, n: int) -> float:
    """The fraction of the n-grams of ``ids`` that repeat an earlier one: 1 - distinct / total.

    Welleck et al. (2020, "Neural Text Generation with Unlikelihood Training") call it
    seq-rep-n and measure it on generated continuations. 0 means no n-gram repeats; a text
    stuck in a loop of length L has, after m loops, about 1 - 1/m of its n-grams repeated
    (for n <= L), so the fraction tends to 1. A sequence shorter than n has no n-grams:
    the fraction is 0.
    """
    n = _check_count("n", n, 1)
    if isinstance(ids, Tensor):
        if ids.ndim != 1:
            raise ValueError(f"ids must be one sequence (T,), got shape {tuple(ids.shape)}")
        ids = ids.tolist()
    tokens = list(ids)
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return 0.0 if not grams else 1.0 - len(set(grams)) / len(grams)


class BigramLM(nn.Module):
    """A hand-made model whose next-token logits depend on the last token only.

    ``table`` (V, V): row a holds the logits of the token that follows token a. Forward:
    ids (B, T) -> logits (B, T, V) = table[ids]. It makes worked examples of decoding whose
    exact answer can be enumerated (beam search) or whose distributions are fixed
    (speculative decoding); with identical rows the next token ignores the context.
    """

    def __init__(self, table: Tensor) -> None:
        super().__init__()
        if not isinstance(table, Tensor) or table.ndim != 2 or table.shape[0] != table.shape[1] \
                or not table.is_floating_point():
            raise ValueError(f"table must be a floating-point (V, V) tensor, got "
                             f"{tuple(table.shape) if isinstance(table, Tensor) else table!r}")
        self.table = nn.Parameter(table.clone(), requires_grad=False)

    @classmethod
    def from_probs(cls, probs: Tensor) -> BigramLM:
        """The model with next-token probabilities ``probs`` (V, V) (logits = log probs)."""
        return cls(torch.log(probs))

    def forward(self, ids: Tensor) -> Tensor:
        ids = _check_ids(ids, "ids")
        return self.table[ids]  # (B, T, V)


# ---------------------------------------------------------------- beam search


@dataclass(frozen=True)
class Hypothesis:
    """A finished beam: ``tokens`` (T_prompt + n,), the sum of the generated tokens' log
    probabilities ``log_prob``, and the ranking ``score`` = log_prob / n ** length_penalty."""

    tokens: Tensor
    log_prob: float
    score: float


@torch.no_grad()
def sequence_log_prob(model: nn.Module, ids: Tensor, prompt_length: int) -> Tensor:
    """log P(ids[:, prompt_length:] | prompt) under ``model``: ids (B, T) -> (B,) float.

    The sum over t >= prompt_length of log softmax(z_{t-1})[ids_t] (nats).
    """
    ids = _check_ids(ids, "ids")
    if not 1 <= prompt_length <= ids.shape[1]:
        raise ValueError(f"prompt_length must lie in [1, {ids.shape[1]}], got {prompt_length}")
    logp = torch.log_softmax(model(ids)[:, :-1].double(), dim=-1)  # (B, T-1, V)
    taken = logp.gather(-1, ids[:, 1:, None])[..., 0]  # (B, T-1): log p(x_t | x_<t)
    return taken[:, prompt_length - 1:].sum(dim=-1)  # (B,)


@torch.no_grad()
def beam_search(model: nn.Module, prompt_ids: Tensor, num_beams: int, max_new_tokens: int,
                length_penalty: float = 1.0, eos_token_id: int | None = None) -> list[Hypothesis]:
    """Beam search: keep the ``num_beams`` most probable continuations at every step.

    ``prompt_ids`` (1, T). Each step extends every beam by every token, scores the
    candidates by their total log probability, and keeps the ``num_beams`` best; a
    candidate ending in ``eos_token_id`` is finished and set aside. When ``max_new_tokens``
    have been generated the unfinished beams are finished too. Hypotheses are ranked by
    log_prob / n ** length_penalty (n generated tokens, the end token included; the
    normalisation of Hugging Face's ``generate``): 0 ranks by total log probability,
    which favours short answers, 1 by the mean per token. Returns the hypotheses, best
    first. ``num_beams=1`` is greedy decoding; a beam as wide as V**n is exhaustive search.
    """
    ids = _check_ids(prompt_ids)
    if ids.shape[0] != 1:
        raise ValueError(f"beam_search takes one prompt, shape (1, T), got {tuple(ids.shape)}")
    num_beams = _check_count("num_beams", num_beams, 1)
    max_new_tokens = _check_count("max_new_tokens", max_new_tokens, 1)
    _check_fits(model, ids.shape[1] + max_new_tokens, "prompt + max_new_tokens")
    if not isinstance(length_penalty, int | float) or math.isnan(length_penalty):
        raise ValueError(f"length_penalty must be a number, got {length_penalty!r}")

    def score(log_prob: float, n: int) -> float:
        return log_prob / n**length_penalty

    beams, beam_logp = ids, torch.zeros(1, dtype=torch.float64)  # (k, T), (k,)
    finished: list[Hypothesis] = []
    for n in range(1, max_new_tokens + 1):
        logp = torch.log_softmax(model(beams)[:, -1].double(), dim=-1)  # (k, V)
        V = logp.shape[-1]
        cand = (beam_logp[:, None] + logp).flatten()  # (k V,) log P(prefix + token)
        top = torch.sort(cand, descending=True, stable=True).indices
        new_beams, new_logp = [], []
        for flat in top.tolist():
            if cand[flat] == float("-inf") or len(new_beams) == num_beams:
                break
            b, tok = divmod(flat, V)
            seq = torch.cat([beams[b], beams.new_tensor([tok])])
            if eos_token_id is not None and tok == eos_token_id:
                finished.append(Hypothesis(seq, float(cand[flat]), score(float(cand[flat]), n)))
            else:
                new_beams.append(seq)
                new_logp.append(cand[flat])
        if not new_beams:  # every candidate ended: nothing is left open
            return sorted(finished, key=lambda h: h.score, reverse=True)
        beams, beam_logp = torch.stack(new_beams), torch.stack(new_logp)  # (k, T + n), (k,)
    finished += [Hypothesis(seq, float(lp), score(float(lp), max_new_tokens))
                 for seq, lp in zip(beams, beam_logp, strict=True)]  # still open at the end
    return sorted(finished, key=lambda h: h.score, reverse=True)


# ---------------------------------------------------------------- speculative decoding


def residual_distribution(p: Tensor, q: Tensor) -> Tensor:
    """norm(max(0, p - q)): where speculative sampling draws after a rejection. (..., V).

    Its normaliser sum max(0, p - q) equals 1 - sum min(p, q), the rejection probability.
    When p == q there is never a rejection; the result is then p (any choice would do).
    """
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and "
                         f"{tuple(q.shape)}")
    r = torch.clamp(p - q, min=0)  # (..., V)
    mass = r.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp_min(torch.finfo(r.dtype).tiny), p)


def speculative_sample(p: Tensor, q: Tensor, num_samples: int,
                       generator: torch.Generator | None = None) -> Tensor:
    """``num_samples`` independent single-token speculative draws: (V,), (V,) -> (N,) long.

    Each draw: x ~ q; accept x with probability min(1, p(x) / q(x)) (tested as
    u q(x) < p(x), u ~ U(0, 1)); else draw from :func:`residual_distribution`. The result
    is distributed exactly as p (Leviathan et al., 2023, appendix A.1).
    """
    if p.ndim != 1 or p.shape != q.shape:
        raise ValueError(f"p and q must be (V,) distributions, got {tuple(p.shape)} and "
                         f"{tuple(q.shape)}")
    num_samples = _check_count("num_samples", num_samples, 1)
    x = torch.multinomial(q, num_samples, replacement=True, generator=generator)  # (N,)
    u = torch.rand(num_samples, generator=generator, dtype=p.dtype)  # (N,)
    accept = u * q[x] < p[x]  # (N,)
    y = torch.multinomial(residual_distribution(p, q), num_samples, replacement=True,
                          generator=generator)  # (N,)
    return torch.where(accept, x, y)


def expected_tokens_per_step(alpha: float, gamma: int) -> float:
    """E[tokens per target pass] = (1 - alpha^(gamma+1)) / (1 - alpha) (Leviathan et al.,
    2023, eq. 1) for acceptance rate alpha = sum min(p, q), i.i.d. over positions;
    gamma + 1 when alpha = 1."""
    gamma = _check_count("gamma", gamma, 1)
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must lie in [0, 1], got alpha={alpha}")
    return float(gamma + 1) if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def speculative_speedup(alpha: float, gamma: int, cost_ratio: float) -> float:
    """Expected wall-clock speed-up of speculative decoding over plain decoding:
    (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)) (Leviathan et al., 2023, theorem 3.8).

    A step costs gamma draft passes (c target passes each) and one target pass, and emits
    :func:`expected_tokens_per_step` tokens. The model assumes the target's pass over
    gamma + 1 tokens costs what a one-token pass does (true when decoding is memory-bound)
    and i.i.d. acceptance. Below 1 it is a slow-down: for alpha -> 0 it tends to
    1 / (gamma c + 1).
    """
    if isinstance(cost_ratio, bool) or not isinstance(cost_ratio, int | float) \
            or not (math.isfinite(cost_ratio) and cost_ratio >= 0):
        raise ValueError(f"cost_ratio must be a finite number >= 0, got {cost_ratio!r}")
    return expected_tokens_per_step(alpha, gamma) / (gamma * cost_ratio + 1)


@dataclass
class SpeculativeStats:
    """Per target pass: how many drafted tokens were proposed (``gamma``, fewer near the end)
    and accepted; ``tokens_per_step`` = accepted + 1 (the target always adds one)."""

    proposed: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)

    @property
    def tokens_per_step(self) -> list[int]:
        return [a + 1 for a in self.accepted]

    @property
    def acceptance_rate(self) -> float:
        """The measured per-token acceptance rate: accepted / (accepted + rejected) drafts.

        A step tests its drafted tokens left to right and stops at the first rejection, so
        each step contributes its accepted tokens plus one rejection if it accepted fewer
        than it proposed; tokens after a rejection were never tested and do not count. With
        a context-free draft q and target p every test is an independent trial that
        succeeds with probability alpha = sum_x min(p(x), q(x)) (Leviathan et al., 2023),
        and this is its maximum-likelihood estimate, the alpha to put in
        :func:`expected_tokens_per_step` and :func:`speculative_speedup`. NaN when no
        drafted token was tested. Introduced in notebooks/12_decoding (section 12.8).
        """
        rejected = sum(a < n for a, n in zip(self.accepted, self.proposed, strict=True))
        tested = sum(self.accepted) + rejected
        return sum(self.accepted) / tested if tested else float("nan")


def _probs(model: nn.Module, ids: Tensor) -> Tensor:
    return torch.softmax(model(ids)[0].double(), dim=-1)  # (T, V)


def _vocab_size(model: nn.Module, ids: Tensor) -> int:
    """V of ``model``: from its config or attribute, else from one forward pass on ``ids``."""
    V = getattr(getattr(model, "config", None), "vocab_size", None) or getattr(model, "vocab_size", None)
    return int(V) if isinstance(V, int) else int(model(ids).shape[-1])


class PromptLookupDraft(nn.Module):
    """A draft "model" that copies from the context: prompt lookup decoding.

    To guess the token after ``ids``, it finds the longest suffix of ``ids`` (at most
    ``max_ngram`` tokens) that occurred earlier, takes its first (leftmost) earlier
    occurrence and proposes the token that followed it. Its distribution q is one-hot on that
    token; with no match, q is uniform. It needs no weights and almost no time, and it is
    accepted whenever the target copies: quoting, editing or summarising a text given in the
    prompt, or a loop. This is the idea of Yang et al. (2023, "Inference with Reference:
    Lossless Acceleration of Large Language Models"), who copy spans from reference
    documents, in the form of ``prompt_lookup_num_tokens`` in Hugging Face's ``generate``,
    whose first proposed token it reproduces (a test). With a one-hot q, speculative
    sampling accepts the proposal x with probability p(x) and otherwise draws from p with x
    removed: the output is still exactly p-distributed.

    :meth:`next_token_logits` (B, T) -> (B, V) is what :func:`speculative_generate` calls;
    ``forward`` (B, T) -> (B, T, V) gives every position's guess, as a model would.
    """

    def __init__(self, vocab_size: int, max_ngram: int = 3) -> None:
        super().__init__()
        self.vocab_size = _check_count("vocab_size", vocab_size, 1)
        self.max_ngram = _check_count("max_ngram", max_ngram, 1)

    def guess(self, ids: Tensor) -> list[int | None]:
        """The proposed next token of each row of ``ids`` (B, T), or None without a match."""
        ids = _check_ids(ids, "ids")
        T = ids.shape[1]
        guesses: list[int | None] = []
        for row in ids:
            found = None
            for n in range(min(self.max_ngram, T - 1), 0, -1):
                windows = row[:T - 1].unfold(0, n, 1)  # (T - n, n): n-grams with a successor
                hits = torch.nonzero((windows == row[T - n:]).all(dim=-1)).flatten()
                if hits.numel():
                    found = int(row[int(hits[0]) + n])
                    break
            guesses.append(found)
        return guesses

    def next_token_logits(self, ids: Tensor) -> Tensor:
        """(B, T) -> (B, V): 0 for the guessed token and -inf elsewhere; all 0 without a guess."""
        guesses = self.guess(ids)
        logits = torch.zeros(len(guesses), self.vocab_size, dtype=torch.float64)
        for b, x in enumerate(guesses):
            if x is not None:
                logits[b].fill_(float("-inf"))[x] = 0.0
        return logits

    def forward(self, ids: Tensor) -> Tensor:
        """(B, T) -> (B, T, V): position t holds the guess after ids[:, :t + 1]."""
        ids = _check_ids(ids, "ids")
        return torch.stack([self.next_token_logits(ids[:, :t + 1]) for t in range(ids.shape[1])],
                           dim=1)


class _Scorer:
    """Next-token probabilities of ``model`` at the last positions of a growing sequence.

    With a KV cache (a :class:`~llmbook.transformer.model.TransformerLM` and ``use_cache``)
    only the positions not yet cached run through the model; :meth:`forget` drops cached
    positions that were rejected. Other models rerun the whole sequence.
    """

    def __init__(self, model: nn.Module, use_cache: bool, max_len: int,
                 temperature: float = 1.0) -> None:
        self.model = model
        self.temperature = temperature
        self.cache = KVCache.for_model(model, 1, max_len) \
            if use_cache and isinstance(model, TransformerLM) else None

    def __call__(self, ids: Tensor, n: int) -> Tensor:
        """p(. | ids[:, :t]) for the last ``n`` positions t of ``ids`` (1, L): (n, V) float64."""
        if n == 1 and isinstance(self.model, PromptLookupDraft):  # only the last guess
            return torch.softmax(self.model.next_token_logits(ids) / self.temperature, dim=-1)
        if self.cache is None:
            return torch.softmax(self.model(ids)[0, -n:].double() / self.temperature, dim=-1)
        if self.cache.length > ids.shape[1] - n:  # keep at least n positions to run
            self.cache.truncate(ids.shape[1] - n)
        logits = self.model(ids[:, self.cache.length:], cache=self.cache)[0]  # (new, V)
        return torch.softmax(logits[-n:].double() / self.temperature, dim=-1)

    def forget(self, length: int) -> None:
        """Drop cached positions from ``length`` on (they held rejected draft tokens)."""
        if self.cache is not None and self.cache.length > length:
            self.cache.truncate(length)


def early_exit_draft(model: TransformerLM, n_layers: int) -> TransformerLM:
    """A draft model made of the first ``n_layers`` blocks of ``model`` and its output head.

    The embeddings, the first ``n_layers`` decoder blocks, the final norm and the (tied or
    separate) output projection are copied from ``model``; the later blocks are skipped.
    This is the *self-speculative* draft of Zhang et al. (2024, "Draft & Verify: Lossless
    Large Language Model Acceleration via Self-Speculative Decoding") and Elhoushi et al.
    (2024, "LayerSkip: Enabling Early Exit Inference and Self-Speculative Decoding"): it
    shares the target's vocabulary, costs about n_layers / L of a target pass, and needs no
    training (a model trained for early exit, as in LayerSkip, drafts better). Returned in
    eval mode, on ``model``'s device and dtype; ``n_layers = L`` gives a copy of ``model``.
    """
    if not isinstance(model, TransformerLM):
        raise TypeError(f"model must be a TransformerLM, got {type(model).__name__}")
    L = model.config.n_layers
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or not 1 <= n_layers <= L:
        raise ValueError(f"n_layers must be an int in [1, {L}], got {n_layers!r}")
    p = next(model.parameters())
    draft = TransformerLM(dataclasses.replace(model.config, n_layers=n_layers)).to(p.device, p.dtype)
    kept = {k: v for k, v in model.state_dict().items()
            if not k.startswith("blocks.") or int(k.split(".")[1]) < n_layers}
    draft.load_state_dict(kept)
    return draft.eval()


@torch.no_grad()
def speculative_generate(target: nn.Module, draft: nn.Module, prompt_ids: Tensor,
                         max_new_tokens: int, gamma: int,
                         generator: torch.Generator | None = None,
                         use_cache: bool = True,
                         temperature: float = 1.0) -> tuple[Tensor, SpeculativeStats]:
    """Speculative sampling from ``target`` with proposals from ``draft``, both at ``temperature``.

    ``prompt_ids`` (1, T). Each step: the draft samples gamma tokens x_1..x_gamma one by one
    from q; the target scores the prefix plus all of them in *one* forward pass, giving p at
    the gamma + 1 positions; x_i is accepted with probability min(1, p(x_i) / q(x_i)),
    left to right; the first rejected x_i is replaced by a draw from norm(max(0, p - q))
    and the step ends; if all are accepted, one more token is drawn from p. Every token is
    distributed exactly as under the target alone. Near the end fewer than gamma tokens
    are drafted, so that exactly ``max_new_tokens`` are returned: ids (1, T + max_new_tokens)
    and the :class:`SpeculativeStats`.

    With ``use_cache`` each :class:`~llmbook.transformer.model.TransformerLM` among the two
    keeps a :class:`~llmbook.inference.kvcache.KVCache`: a draft pass runs one new token, a
    target pass the gamma + 1 new ones, and the positions of rejected tokens are truncated
    away. Without it (and for any other model ``ids -> logits``) every pass reruns the
    whole sequence. Both give the same tokens for the same ``generator``, up to
    floating-point round-off in the probabilities. ``temperature`` (> 0) divides both
    models' logits, so the tokens follow the target sampled at that temperature; a low one
    makes the target surer and a copying draft likelier to be accepted. A
    :class:`PromptLookupDraft` is asked only for its guess at the last position.
    """
    ids = _check_ids(prompt_ids)
    if ids.shape[0] != 1:
        raise ValueError(f"speculative_generate takes one prompt, shape (1, T), got "
                         f"{tuple(ids.shape)}")
    max_new_tokens = _check_count("max_new_tokens", max_new_tokens, 1)
    gamma = _check_count("gamma", gamma, 1)
    for model in (target, draft):
        _check_fits(model, ids.shape[1] + max_new_tokens, "prompt + max_new_tokens")
    v_target, v_draft = _vocab_size(target, ids), _vocab_size(draft, ids)
    if v_target != v_draft:
        raise ValueError(f"the draft's vocabulary (V={v_draft}) differs from the target's "
                         f"(V={v_target}): speculative decoding compares their probabilities "
                         "token by token, so both must share one vocabulary")
    stats = SpeculativeStats()
    T_end = ids.shape[1] + max_new_tokens
    temperature = _check_temperature(temperature, allow_zero=False)
    target_probs = _Scorer(target, use_cache, T_end, temperature)
    draft_probs = _Scorer(draft, use_cache, T_end, temperature)
    while ids.shape[1] < T_end:
        g = min(gamma, T_end - ids.shape[1] - 1)
        x, qs = ids, []
        for _ in range(g):  # the draft proposes g tokens
            q = draft_probs(x, 1)[0]  # (V,)
            tok = torch.multinomial(q, 1, generator=generator)  # (1,)
            qs.append(q)
            x = torch.cat([x, tok[None]], dim=1)
        p = target_probs(x, g + 1)  # (g + 1, V): one target pass
        drafted = x[0, ids.shape[1]:].tolist()
        n_ok, extra = 0, None
        for i, tok in enumerate(drafted):
            u = torch.rand((), generator=generator, dtype=torch.float64)
            if u * qs[i][tok] < p[i, tok]:
                n_ok += 1
            else:
                extra = torch.multinomial(residual_distribution(p[i], qs[i]), 1,
                                          generator=generator)
                break
        if extra is None:
            extra = torch.multinomial(p[g], 1, generator=generator)  # all accepted: a bonus
        new = torch.tensor(drafted[:n_ok] + [int(extra)], dtype=torch.long)
        ids = torch.cat([ids, new[None]], dim=1)
        for scorer in (target_probs, draft_probs):  # keep only accepted positions cached
            scorer.forget(ids.shape[1] - 1)
        stats.proposed.append(g)
        stats.accepted.append(n_ok)
    return ids, stats


# ---------------------------------------------------------------- goodness of fit


def chi_square_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square with integer ``df`` degrees of freedom, in closed form.

    With k = df and y = x / 2, the survival function is the regularised upper incomplete
    gamma function Q(k/2, y), which for integer k is a finite sum (Abramowitz & Stegun,
    1964, 26.4.4-26.4.5):
    even k: Q = e^{-y} sum_{i<k/2} y^i / i!;
    odd k:  Q = erfc(sqrt(y)) + e^{-y} sum_{i=1}^{(k-1)/2} y^{i-1/2} / Gamma(i + 1/2).
    """
    df = _check_count("df", df, 1)
    if not x >= 0:
        raise ValueError(f"x must be >= 0, got x={x}")
    y = x / 2
    if df % 2 == 0:
        if y == 0:
            return 1.0
        # summed in log space: y^i / i! alone overflows a float for large x and df
        terms = [i * math.log(y) - math.lgamma(i + 1) for i in range(df // 2)]
        top = max(terms)
        log_sum = top + math.log(math.fsum(math.exp(t - top) for t in terms))
        return min(1.0, math.exp(log_sum - y))
    total = math.erfc(math.sqrt(y))
    if y > 0:
        total += math.fsum(math.exp(-y + (i - 0.5) * math.log(y) - math.lgamma(i + 0.5))
                           for i in range(1, (df - 1) // 2 + 1))
    return min(1.0, total)


def chi_square_test(samples: Tensor, probs: Tensor) -> tuple[float, int, float]:
    """Pearson's chi-square goodness-of-fit test of integer ``samples`` (N,) against ``probs`` (V,).

    X^2 = sum_x (O_x - E_x)^2 / E_x with observed counts O and expected E = N probs, over the
    tokens with probs > 0 (a sample of a zero-probability token gives X^2 = inf); V' - 1
    degrees of freedom for V' such tokens. Returns (X^2, df, p-value).
    """
    if samples.ndim != 1 or probs.ndim != 1:
        raise ValueError(f"samples must be (N,) and probs (V,), got {tuple(samples.shape)} and "
                         f"{tuple(probs.shape)}")
    if abs(float(probs.sum()) - 1) > 1e-6 or bool((probs < 0).any()):
        raise ValueError(f"probs must be a distribution, got sum {float(probs.sum())}")
    observed = torch.bincount(samples, minlength=probs.shape[0]).double()  # (V,)
    if observed.shape[0] > probs.shape[0]:
        raise ValueError(f"samples contain token {int(samples.max())} >= V={probs.shape[0]}")
    expected = samples.shape[0] * probs.double()
    support = expected > 0
    if bool((observed[~support] > 0).any()):
        return float("inf"), int(support.sum()) - 1, 0.0
    stat = float((((observed - expected) ** 2)[support] / expected[support]).sum())
    df = int(support.sum()) - 1
    return stat, df, chi_square_sf(stat, df)

