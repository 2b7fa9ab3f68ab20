"""Decoding: turning next-token distributions into text.

Introduced in notebooks/12_decoding. A language model gives logits z (V,) for the next
token; a decoding rule picks the token. The rules here:

* greedy: argmax z (``temperature=0`` in :func:`generate` and :func:`sample_next`);
* sampling from softmax(z / T) (:func:`apply_temperature`), optionally restricted to the
  k most likely tokens (:func:`top_k_filter`; Fan, Lewis & Dauphin, 2018, "Hierarchical
  Neural Story Generation") or to the nucleus, the smallest set of most likely tokens
  whose probability reaches p (:func:`top_p_filter`; Holtzman et al., 2020, "The Curious
  Case of Neural Text Degeneration");
* beam search (:func:`beam_search`), which keeps the ``num_beams`` most likely prefixes;
* speculative sampling (:func:`speculative_generate`; Leviathan, Kalman & Matias, 2023,
  "Fast Inference from Transformers via Speculative Decoding"; Chen et al., 2023,
  "Accelerating Large Language Model Decoding with Speculative Sampling"): a cheap draft
  model q proposes gamma tokens, the target p checks them in one forward pass, and an
  accept/reject rule makes the output tokens *exactly* p-distributed.

:func:`generate` uses the KV cache of :mod:`llmbook.inference.kvcache` for a
:class:`~llmbook.transformer.model.TransformerLM`. :class:`BigramLM` is a hand-made model (next-token
logits from a table indexed by the last token) for worked examples, and
:func:`chi_square_test` the goodness-of-fit test the chapter uses to check a sampler.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from llmbook.inference.kvcache import KVCache
from llmbook.transformer.model import TransformerLM

__all__ = [
    "BigramLM",
    "Hypothesis",
    "SpeculativeStats",
    "apply_temperature",
    "beam_search",
    "chi_square_sf",
    "chi_square_test",
    "early_exit_draft",
    "expected_tokens_per_step",
    "generate",
    "residual_distribution",
    "sample_next",
    "sequence_log_prob",
    "speculative_generate",
    "speculative_sample",
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
    if isinstance(p, bool) or not isinstance(p, int | float):
        raise TypeError(f"top_p must be a number, got {p!r}")
    if not 0 < p <= 1:
        raise ValueError(f"top_p must lie in (0, 1], got top_p={p}")
    return float(p)


def _check_ids(ids: object, name: str = "prompt_ids") -> Tensor:
    if not isinstance(ids, Tensor) or ids.dtype not in (torch.int64, torch.int32):
        what = ids.dtype if isinstance(ids, Tensor) else type(ids).__name__
        raise TypeError(f"{name} must be an integer tensor of token ids, got {what}")
    if ids.ndim != 2 or ids.shape[1] == 0:
        raise ValueError(f"{name} must have shape (B, T) with T >= 1, got {tuple(ids.shape)}")
    return ids.long()


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
    it, p_(1) + ... + p_(i-1), is below p: that is the shortest prefix reaching p. The most
    likely token is always kept; ties are ordered by token index (a stable sort); p = 1
    keeps everything.
    """
    logits = _check_logits(logits)
    p = _check_top_p(p)
    if p == 1.0:
        return logits.clone()
    probs = torch.softmax(logits, dim=-1)  # (..., V)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # (..., V)
    keep_sorted = mass_before < p
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return logits.masked_fill(~keep, float("-inf"))


def sample_next(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> Tensor:
    """Draw the next token of each row of ``logits`` (B, V) -> (B,) long.

    ``temperature == 0`` is greedy decoding: the arg max (the lowest index among ties), and
    ``top_k``/``top_p`` are then irrelevant. Otherwise the logits are divided by the
    temperature, filtered by top-k and then top-p (the order Hugging Face uses), and a token
    is drawn from the softmax with ``generator``.
    """
    logits = _check_logits(logits)
    if logits.ndim != 2:
        raise ValueError(f"logits must have shape (B, V), got {tuple(logits.shape)}")
    temperature = _check_temperature(temperature, allow_zero=True)
    if top_k is not None:
        _check_top_k(top_k)
    if top_p is not None:
        _check_top_p(top_p)
    if temperature == 0:
        return logits.argmax(dim=-1)  # (B,)
    z = apply_temperature(logits, temperature)
    if top_k is not None:
        z = top_k_filter(z, top_k)
    if top_p is not None:
        z = top_p_filter(z, top_p)
    probs = torch.softmax(z.double(), dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]  # (B,)


# ---------------------------------------------------------------- generation


@torch.no_grad()
def generate(model: nn.Module, prompt_ids: Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, use_cache: bool = True,
             generator: torch.Generator | None = None) -> Tensor:
    """Append ``max_new_tokens`` tokens to ``prompt_ids`` (B, T) -> (B, T + max_new_tokens).

    Each token is drawn by :func:`sample_next` (``temperature=0``: greedy). The whole
    sequence must fit in the model's context: T + max_new_tokens <= max_seq_len (there is
    no sliding window, so cached and uncached decoding see exactly the same context). With
    ``use_cache`` and a :class:`~llmbook.transformer.model.TransformerLM`, the prompt is run once
    (the *prefill*) into a :class:`~llmbook.inference.kvcache.KVCache` and every later step runs the
    model on the one new token; otherwise (or for any other model ``ids -> logits``) each
    step recomputes the whole sequence. Both give the same tokens.
    """
    ids = _check_ids(prompt_ids)
    max_new_tokens = _check_count("max_new_tokens", max_new_tokens, 0)
    _check_temperature(temperature, allow_zero=True)
    B, T0 = ids.shape
    _check_fits(model, T0, "the prompt")
    _check_fits(model, T0 + max_new_tokens, "prompt + max_new_tokens")
    if max_new_tokens == 0:
        return ids.clone()
    was_training = model.training
    model.eval()
    cache = KVCache.for_model(model, B, T0 + max_new_tokens) \
        if use_cache and isinstance(model, TransformerLM) else None
    logits = (model(ids, cache=cache) if cache is not None else model(ids))[:, -1]  # (B, V)
    out = [ids]
    for step in range(max_new_tokens):
        nxt = sample_next(logits, temperature, top_k, top_p, generator)[:, None]  # (B, 1)
        out.append(nxt)
        if step == max_new_tokens - 1:
            break
        if cache is not None:
            logits = model(nxt, cache=cache)[:, -1]  # only the new token: (B, V)
        else:
            logits = model(torch.cat(out, dim=1))[:, -1]  # the whole sequence again
    model.train(was_training)
    return torch.cat(out, dim=1)  # (B, T0 + max_new_tokens)


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


@dataclass
class SpeculativeStats:
    """Per target pass: how many drafted tokens were proposed (``gamma``, fewer near the end)
    and accepted; ``tokens_per_step`` = accepted + 1 (the target always adds one)."""

    proposed: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)

    @property
    def tokens_per_step(self) -> list[int]:
        return [a + 1 for a in self.accepted]


def _probs(model: nn.Module, ids: Tensor) -> Tensor:
    return torch.softmax(model(ids)[0].double(), dim=-1)  # (T, V)


class _Scorer:
    """Next-token probabilities of ``model`` at the last positions of a growing sequence.

    With a KV cache (a :class:`~llmbook.transformer.model.TransformerLM` and ``use_cache``)
    only the positions not yet cached run through the model; :meth:`forget` drops cached
    positions that were rejected. Other models rerun the whole sequence.
    """

    def __init__(self, model: nn.Module, use_cache: bool, max_len: int) -> None:
        self.model = model
        self.cache = KVCache.for_model(model, 1, max_len) \
            if use_cache and isinstance(model, TransformerLM) else None

    def __call__(self, ids: Tensor, n: int) -> Tensor:
        """p(. | ids[:, :t]) for the last ``n`` positions t of ``ids`` (1, L): (n, V) float64."""
        if self.cache is None:
            return _probs(self.model, ids)[-n:]
        if self.cache.length > ids.shape[1] - n:  # keep at least n positions to run
            self.cache.truncate(ids.shape[1] - n)
        logits = self.model(ids[:, self.cache.length:], cache=self.cache)[0]  # (new, V)
        return torch.softmax(logits.double(), dim=-1)[-n:]

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
                         use_cache: bool = True) -> tuple[Tensor, SpeculativeStats]:
    """Speculative sampling from ``target`` with proposals from ``draft`` (both at T = 1).

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
    floating-point round-off in the probabilities.
    """
    ids = _check_ids(prompt_ids)
    if ids.shape[0] != 1:
        raise ValueError(f"speculative_generate takes one prompt, shape (1, T), got "
                         f"{tuple(ids.shape)}")
    max_new_tokens = _check_count("max_new_tokens", max_new_tokens, 1)
    gamma = _check_count("gamma", gamma, 1)
    for model in (target, draft):
        _check_fits(model, ids.shape[1] + max_new_tokens, "prompt + max_new_tokens")
    v_target, v_draft = _probs(target, ids).shape[-1], _probs(draft, ids).shape[-1]
    if v_target != v_draft:
        raise ValueError(f"the draft's vocabulary (V={v_draft}) differs from the target's "
                         f"(V={v_target}): speculative decoding compares their probabilities "
                         "token by token, so both must share one vocabulary")
    stats = SpeculativeStats()
    T_end = ids.shape[1] + max_new_tokens
    target_probs = _Scorer(target, use_cache, T_end)
    draft_probs = _Scorer(draft, use_cache, T_end)
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
        terms = [i * math.log(y) - math.lgamma(i + 1) for i in range(df // 2)] if y > 0 else [0.0]
        return min(1.0, math.exp(-y) * math.fsum(math.exp(t) for t in terms)) if y > 0 else 1.0
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

