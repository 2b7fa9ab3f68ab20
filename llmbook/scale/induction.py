"""Induction heads: repeated-sequence data, a small attention-only transformer, its training run.

Introduced in notebooks/24_induction_heads. An *induction head* (Elhage et al., 2021, "A
Mathematical Framework for Transformer Circuits"; Olsson et al., 2022, "In-context Learning
and Induction Heads") completes a pattern seen earlier in the context: at a token A whose
previous occurrence was followed by B, it attends to that B and copies it, [A][B] ... [A] -> [B].
It needs two attention layers: a *previous-token head* in layer 0 writes "the token before
me" into each position, and the induction head in layer 1 finds the key whose previous token
equals its own query token (K-composition).

This module provides

* :func:`repeated_tokens` - the canonical evaluation data: L random tokens, then the same L;
* :func:`induction_batch` - training data: a repeated segment of random length at a random
  place among random filler tokens, and the mask of the tokens an induction head can predict;
* :class:`AttentionOnlyTransformer` - embeddings, attention-only layers (no MLP, no norm) and an
  unembedding, with hooks: attention patterns, zero/mean ablation of heads, and "composition
  ablation" (a layer's queries, keys or values read only the embeddings);
* :func:`previous_token_score` and :func:`prefix_matching_score` - the head scores of
  Olsson et al. (2022), read off attention patterns;
* :func:`train_induction_model` - the training run that is shipped (``induction_2l``,
  ``induction_1l``) with its curves, and :func:`load_induction_model` to load it;
* :func:`alignment_chance` - how likely a given alignment of k curves' steepest steps is by
  chance, which sets the tolerance of the phase-change check before it is measured;
* :func:`lm_attention_patterns` - every head's attention pattern in a
  :class:`~llmbook.transformer.model.TransformerLM` (the book's own text model), so that the
  same scores can be read off a model trained on text.

Ablation, the in-context-learning score and the hand-built circuit are in
:mod:`llmbook.scale.interpretability`.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from llmbook.alignment.shipped import load_artifact, register
from llmbook.text.embedding import TokenEmbedding
from llmbook.training.optim import AdamW, clip_grad_norm_, cosine_schedule, set_lr
from llmbook.transformer.attention import MultiHeadAttention, attention_weights
from llmbook.transformer.positional import LearnedPositions, RotaryEmbedding
from llmbook.validation import (
    check_finite,
    check_floating_tensor,
    check_nonempty,
    check_positive_int,
    check_positive_number,
    check_token_ids,
)

__all__ = [
    "INDUCTION_RECIPES",
    "AttentionOnlyTransformer",
    "alignment_chance",
    "induction_batch",
    "lm_attention_patterns",
    "load_induction_model",
    "per_position_loss",
    "prefix_matching_score",
    "previous_token_score",
    "repeated_tokens",
    "train_induction_model",
]


def _check_generator(generator: object) -> torch.Generator:
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    return generator


def repeated_tokens(batch_size: int, segment_length: int, vocab_size: int,
                    generator: torch.Generator, distinct: bool = False) -> Tensor:
    """Sequences of L uniformly random tokens followed by the same L tokens: (B, 2L) int64.

    Token t of the second half equals token t - L. Tokens are drawn with replacement from
    0..V-1, so a token may also occur twice inside one half (rarely, for V >> L), unless
    ``distinct`` (then each half is L different tokens, which needs L <= V).
    """
    B = check_positive_int("batch_size", batch_size)
    L = check_positive_int("segment_length", segment_length)
    V = check_positive_int("vocab_size", vocab_size)
    g = _check_generator(generator)
    if distinct and L > V:
        raise ValueError(f"{L} distinct tokens need segment_length <= vocab_size, got {L} > {V}")
    if distinct:
        segment = torch.argsort(torch.rand(B, V, generator=g), dim=1)[:, :L]  # (B, L)
    else:
        segment = torch.randint(0, V, (B, L), generator=g)  # (B, L)
    return torch.cat([segment, segment], dim=1)  # (B, 2L)


def induction_batch(batch_size: int, seq_len: int, vocab_size: int, min_segment: int,
                    max_segment: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Training sequences with one repeated segment among random tokens: ``(ids, repeat)``.

    Each row draws a segment length L uniformly in [min_segment, max_segment] and a start o
    uniformly in [0, T - 2L]; positions o..o+L-1 hold L random tokens, o+L..o+2L-1 the same
    tokens again, every other position an independent random token. ``ids`` (B, T) int64;
    ``repeat`` (B, T) bool marks the tokens an induction head can predict: o+L+1..o+2L-1 (the
    first token of the copy is not predictable, its predecessor was never seen followed by it).

    The random L and o matter: with a fixed L a model could find "the token after the
    previous occurrence" by position alone (position t - L + 1), without any induction.
    """
    B = check_positive_int("batch_size", batch_size)
    T = check_positive_int("seq_len", seq_len)
    V = check_positive_int("vocab_size", vocab_size)
    lo = check_positive_int("min_segment", min_segment)
    hi = check_positive_int("max_segment", max_segment)
    if not 2 <= lo <= hi or 2 * hi > T:
        raise ValueError(f"need 2 <= min_segment <= max_segment <= seq_len / 2, got "
                         f"min_segment={lo}, max_segment={hi}, seq_len={T}")
    g = _check_generator(generator)
    ids = torch.randint(0, V, (B, T), generator=g)  # (B, T) filler
    L = torch.randint(lo, hi + 1, (B,), generator=g)  # (B,)
    start = (torch.rand(B, generator=g) * (T - 2 * L + 1)).long()  # (B,) in [0, T - 2L]
    pos = torch.arange(T)[None, :]  # (1, T)
    copy = (pos >= (start + L)[:, None]) & (pos < (start + 2 * L)[:, None])  # (B, T)
    source = (pos - L[:, None]).clamp(min=0)  # (B, T): where a copied token comes from
    ids = torch.where(copy, ids.gather(1, source), ids)  # copies read the (unchanged) first segment
    repeat = copy & (pos > (start + L)[:, None])
    return ids, repeat


class AttentionOnlyTransformer(nn.Module):
    """An attention-only transformer: x_0 = E[ids] + P, x_l = x_{l-1} + sum_h Attn_h(x_{l-1}),
    logits = x_L W_U^T. No MLP, no normalisation (Elhage et al., 2021, section "Zero, one and
    two layer attention-only transformers"), so everything the model computes is a sum of
    paths through attention heads.

    Each layer is a :class:`~llmbook.transformer.attention.MultiHeadAttention` (its ``q_proj``,
    ``k_proj``, ``v_proj``, ``o_proj`` and ``scale``); the forward pass runs the heads itself so
    that it can read and change them:

    * ``ablate``: ``{(layer, head): None}`` zero-ablates a head (its mixed values z are set to
      0), ``{(layer, head): m}`` with m of shape (T, d_head) replaces z by m (mean ablation);
    * ``composition``: ``{layer: "k"}`` (any of "q", "k", "v") makes that input of the layer's
      heads read the embeddings x_0 instead of the residual stream x_{l-1}: it cuts Q-, K- or
      V-composition with all earlier layers, and nothing else;
    * :meth:`run_with_cache` also returns every layer's attention patterns (B, H, T, T) and
      head outputs z (B, H, T, d_head).

    ``ids`` (B, T) -> logits (B, T, V).
    """

    def __init__(self, vocab_size: int, d_model: int, n_layers: int, n_heads: int,
                 max_seq_len: int, d_head: int | None = None, positions: str = "learned",
                 embed_std: float = 1.0, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.d_model = check_positive_int("d_model", d_model)
        self.n_layers = check_positive_int("n_layers", n_layers)
        self.n_heads = check_positive_int("n_heads", n_heads)
        self.max_seq_len = check_positive_int("max_seq_len", max_seq_len)
        if positions not in ("learned", "rope"):
            raise ValueError(f"positions must be 'learned' or 'rope', got {positions!r}")
        self.positions = positions
        check_positive_number("embed_std", embed_std)
        self.embed = TokenEmbedding(vocab_size, d_model, std=embed_std, generator=generator)
        self.layers = nn.ModuleList(
            MultiHeadAttention(d_model, n_heads, d_head=d_head) for _ in range(n_layers))
        self.d_head = self.layers[0].d_head
        self.pos = LearnedPositions(max_seq_len, d_model, std=embed_std, generator=generator) \
            if positions == "learned" else None
        self.rope = RotaryEmbedding(self.d_head, max_seq_len=max_seq_len) if positions == "rope" else None
        self.unembed = nn.Linear(d_model, vocab_size, bias=False)
        with torch.no_grad():  # N(0, 1/d): with unit-size embeddings, unit-size activations
            for p in [*self.layers.parameters(), self.unembed.weight]:
                p.normal_(0.0, d_model ** -0.5, generator=generator)

    def _check_ablate(self, ablate: dict, T: int) -> None:
        if not isinstance(ablate, dict):
            raise TypeError(f"ablate must be a dict {{(layer, head): None or value}}, got {type(ablate).__name__}")
        for key, value in ablate.items():
            if (not isinstance(key, tuple) or len(key) != 2
                    or not 0 <= key[0] < self.n_layers or not 0 <= key[1] < self.n_heads):
                raise ValueError(f"ablate keys must be (layer, head) with layer < {self.n_layers} "
                                 f"and head < {self.n_heads}, got {key!r}")
            if value is not None and (not isinstance(value, Tensor)
                                      or tuple(value.shape) != (T, self.d_head)):
                shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                raise ValueError(f"a mean-ablation value for head {key} must have shape "
                                 f"(T, d_head) = ({T}, {self.d_head}), got {shape}")

    def _check_composition(self, composition: dict) -> None:
        if not isinstance(composition, dict):
            raise TypeError(f"composition must be a dict {{layer: 'qkv'}}, got {type(composition).__name__}")
        for layer, which in composition.items():
            if not isinstance(layer, int) or not 0 <= layer < self.n_layers:
                raise ValueError(f"composition keys must be layers 0..{self.n_layers - 1}, got {layer!r}")
            if not isinstance(which, str) or not set(which) <= set("qkv"):
                raise ValueError(f"composition values must be strings of 'q', 'k', 'v', got {which!r}")

    def run_with_cache(self, ids: Tensor, ablate: dict | None = None,
                       composition: dict | None = None) -> tuple[Tensor, dict[str, list[Tensor]]]:
        """Logits (B, T, V) and ``{"pattern": [A_l (B, H, T, T)], "z": [z_l (B, H, T, d_head)]}``."""
        ids = check_nonempty(check_token_ids(ids, "ids", ndim=2, vocab_size=self.vocab_size), "ids")
        B, T = ids.shape
        if T > self.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds max_seq_len={self.max_seq_len}")
        ablate, composition = ablate or {}, composition or {}
        self._check_ablate(ablate, T)
        self._check_composition(composition)
        positions = torch.arange(T)
        x0 = self.embed(ids)  # (B, T, d)
        if self.pos is not None:
            x0 = x0 + self.pos(positions)
        x = x0
        cache: dict[str, list[Tensor]] = {"pattern": [], "z": []}
        for layer_index, attn in enumerate(self.layers):
            cut = composition.get(layer_index, "")
            xq, xk, xv = (x0 if c in cut else x for c in "qkv")
            q = attn.split_heads(attn.q_proj(xq), self.n_heads)  # (B, H, T, d_head)
            k = attn.split_heads(attn.k_proj(xk), self.n_heads)
            v = attn.split_heads(attn.v_proj(xv), self.n_heads)
            if self.rope is not None:  # rotary positions: scores depend on the offset t - s only
                q, k = self.rope(q, positions), self.rope(k, positions)
            pattern = attention_weights(q, k, is_causal=True, scale=attn.scale)  # (B, H, T, T)
            z = pattern @ v  # (B, H, T, d_head)
            for (layer, head), value in ablate.items():
                if layer == layer_index:
                    z = z.clone()
                    z[:, head] = 0.0 if value is None else value.to(z.dtype)
            cache["pattern"].append(pattern)
            cache["z"].append(z)
            x = x + attn.o_proj(z.transpose(1, 2).reshape(B, T, -1))  # (B, T, d)
        return self.unembed(x), cache

    def forward(self, ids: Tensor, ablate: dict | None = None,
                composition: dict | None = None) -> Tensor:
        """Logits (B, T, V) for ids (B, T); ``ablate`` and ``composition`` as in the class doc."""
        return self.run_with_cache(ids, ablate, composition)[0]


def per_position_loss(logits: Tensor, ids: Tensor) -> Tensor:
    """Cross-entropy (nats) of predicting token t+1 at position t: (B, T-1), not averaged.

    ``logits`` (B, T, V) and ``ids`` (B, T); entry [b, t] is -log p(ids[b, t+1] | ids[b, :t+1]).
    """
    ids = check_token_ids(ids, "ids", ndim=2)
    if not isinstance(logits, Tensor) or logits.ndim != 3 or logits.shape[:2] != ids.shape:
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"logits must have shape (B, T, V) with (B, T) = {tuple(ids.shape)}, got {shape}")
    check_finite(check_floating_tensor(logits, "logits"), "logits", allow_inf=True)
    check_token_ids(ids, "ids", vocab_size=logits.shape[-1])
    if ids.shape[1] < 2:
        raise ValueError(f"need at least 2 positions to predict one, got T={ids.shape[1]}")
    logp = F.log_softmax(logits[:, :-1].float() if logits.dtype == torch.float16 else logits[:, :-1], -1)
    return -logp.gather(-1, ids[:, 1:, None])[..., 0]  # (B, T-1)


def _check_pattern(pattern: object) -> Tensor:
    if not isinstance(pattern, Tensor) or not pattern.is_floating_point() or pattern.ndim < 2 \
            or pattern.shape[-1] != pattern.shape[-2]:
        shape = tuple(pattern.shape) if isinstance(pattern, Tensor) else type(pattern).__name__
        raise ValueError(f"pattern must be a floating-point (..., T, T) attention pattern, got {shape}")
    return check_finite(pattern, "pattern")


def previous_token_score(pattern: Tensor) -> Tensor:
    """Mean attention from each position t >= 1 to position t - 1: (B, H, T, T) -> (H,).

    A previous-token head scores near 1 (Olsson et al., 2022, use the same measure). The
    mean runs over the batch and the positions 1..T-1.
    """
    pattern = _check_pattern(pattern)
    if pattern.ndim != 4 or pattern.shape[-1] < 2 or pattern.shape[0] == 0:
        raise ValueError(f"pattern must have shape (B, H, T, T) with B >= 1 and T >= 2 (a previous "
                         f"token to attend to), got {tuple(pattern.shape)}")
    return pattern.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2))  # (H,)


def prefix_matching_score(pattern: Tensor, segment_length: int) -> Tensor:
    """Mean attention from each token of the repeat to the token after its first occurrence.

    For :func:`repeated_tokens` data (T = 2L) the query at position L + i holds the token of
    position i, and an induction head attends to position i + 1 (Olsson et al., 2022,
    "prefix matching"). ``pattern`` (B, H, 2L, 2L) -> (H,), the mean over the batch and
    i = 0..L-1 of A[L + i, i + 1].
    """
    pattern = _check_pattern(pattern)
    L = check_positive_int("segment_length", segment_length)
    if pattern.ndim != 4 or pattern.shape[-1] != 2 * L:
        raise ValueError(f"pattern must have shape (B, H, 2L, 2L) = (B, H, {2 * L}, {2 * L}), "
                         f"got {tuple(pattern.shape)}")
    return pattern.diagonal(offset=1 - L, dim1=-2, dim2=-1)[..., -L:].mean(dim=(0, 2))  # (H,)


# ---------------------------------------------------------------- the shipped training runs

_BASE_RECIPE: dict[str, Any] = {
    "vocab_size": 64, "d_model": 64, "n_heads": 2, "seq_len": 48, "min_segment": 8,
    "max_segment": 24, "batch_size": 32, "steps": 2000, "lr": 1e-2, "min_lr": 5e-4,
    "warmup_steps": 50, "weight_decay": 0.0, "grad_clip": 1.0, "embed_std": 1.0,
    "positions": "rope", "eval_every": 25, "eval_batch": 200, "eval_segment": 24,
    "snapshots": [800, 1200], "seed": 0,
}
#: The recipes of the shipped runs: a two-layer and a one-layer attention-only model.
INDUCTION_RECIPES: dict[str, dict[str, Any]] = {
    "induction_2l": {**_BASE_RECIPE, "n_layers": 2},
    "induction_1l": {**_BASE_RECIPE, "n_layers": 1},
}


def _build(recipe: dict[str, Any], generator: torch.Generator | None = None) -> AttentionOnlyTransformer:
    return AttentionOnlyTransformer(recipe["vocab_size"], recipe["d_model"], recipe["n_layers"],
                                    recipe["n_heads"], recipe["seq_len"], positions=recipe["positions"],
                                    embed_std=recipe["embed_std"],
                                    generator=generator)


def _head_scores(patterns: list[Tensor], L: int) -> tuple[list[list[float]], list[list[float]]]:
    return ([previous_token_score(p).tolist() for p in patterns],
            [prefix_matching_score(p, L).tolist() for p in patterns])


def train_induction_model(recipe: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Train an attention-only model on :func:`induction_batch` data; ``(tensors, info)``.

    AdamW with warmup and cosine decay (chapter 9), one thread. Every ``eval_every`` steps
    the model is measured on a fixed batch of :func:`repeated_tokens` (L = ``eval_segment``):
    the per-position loss (averaged over the batch), and each head's previous-token and
    prefix-matching scores. ``tensors`` holds the final weights (float32) and the weights at
    the steps listed in ``snapshots`` (prefixed ``step<N>.``); ``info`` the curves.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(recipe["seed"])
        model = _build(recipe, g)
        eval_ids = repeated_tokens(recipe["eval_batch"], recipe["eval_segment"], recipe["vocab_size"],
                                   torch.Generator().manual_seed(recipe["seed"] + 1000))
        decay = [p for n, p in model.named_parameters() if p.ndim == 2 and "pos" not in n]
        opt = AdamW([{"params": decay, "weight_decay": recipe["weight_decay"]}], lr=recipe["lr"])
        history: dict[str, list] = {"step": [], "train_loss": [], "train_repeat_loss": [],
                                    "position_loss": [], "previous_token": [], "prefix_matching": []}
        tensors: dict[str, Tensor] = {}
        seconds, running, running_rep = 0.0, [], []

        def evaluate(step: int) -> None:
            with torch.no_grad():
                logits, cache = model.run_with_cache(eval_ids)
            history["step"].append(step)
            history["position_loss"].append(
                [round(v, 5) for v in per_position_loss(logits, eval_ids).mean(0).tolist()])
            prev, prefix = _head_scores(cache["pattern"], recipe["eval_segment"])
            history["previous_token"].append(prev)
            history["prefix_matching"].append(prefix)
            history["train_loss"].append(sum(running) / max(len(running), 1))
            history["train_repeat_loss"].append(sum(running_rep) / max(len(running_rep), 1))
            running.clear()
            running_rep.clear()

        evaluate(0)
        for step in range(1, recipe["steps"] + 1):
            t0 = time.perf_counter()
            ids, repeat = induction_batch(recipe["batch_size"], recipe["seq_len"], recipe["vocab_size"],
                                          recipe["min_segment"], recipe["max_segment"], g)
            set_lr(opt, cosine_schedule(step - 1, recipe["lr"], recipe["min_lr"],
                                        recipe["warmup_steps"], recipe["steps"]))
            losses = per_position_loss(model(ids), ids)  # (B, T-1)
            loss = losses.mean()
            opt.zero_grad()
            loss.backward()
            clip_grad_norm_(model.parameters(), recipe["grad_clip"])
            opt.step()
            seconds += time.perf_counter() - t0
            running.append(float(loss.detach()))
            running_rep.append(float(losses.detach()[repeat[:, 1:]].mean()))
            if step in recipe["snapshots"]:
                tensors.update({f"step{step}.{k}": v.detach().clone().float()
                                for k, v in model.state_dict().items()})
            if step % recipe["eval_every"] == 0 or step == recipe["steps"]:
                evaluate(step)
        tensors.update({k: v.detach().clone().float() for k, v in model.state_dict().items()})
        info = {"history": history, "step_seconds": seconds,
                "parameters": sum(p.numel() for p in model.parameters())}
        return tensors, info
    finally:
        torch.set_num_threads(threads)


for _name, _recipe in INDUCTION_RECIPES.items():
    register(_name, _recipe, train_induction_model, __name__)


def load_induction_model(name: str = "induction_2l", step: int | None = None
                         ) -> tuple[AttentionOnlyTransformer, dict[str, Any]]:
    """The shipped model ``name`` (final weights, or those at a snapshot ``step``) and its info.

    The model is in float32 and eval mode; ``info`` is the artifact's ``info.json``.
    """
    if name not in INDUCTION_RECIPES:
        raise ValueError(f"unknown induction model {name!r}; choose one of {sorted(INDUCTION_RECIPES)}")
    tensors, info = load_artifact(name)
    recipe = info["recipe"]
    if step is not None and step not in recipe["snapshots"]:
        raise ValueError(f"no snapshot at step {step}; the shipped ones are {recipe['snapshots']}")
    prefix = "" if step is None else f"step{step}."
    model = _build(recipe)
    state = {k[len(prefix):]: v for k, v in tensors.items()
             if (k.startswith(prefix) if prefix else not k.startswith("step"))}
    model.load_state_dict(state)
    return model.eval(), info



# ---------------------------------------------------------------- thresholds and other models


def alignment_chance(n_points: int, k: int, window: int) -> float:
    """Probability that k independent uniform draws from n_points grid points span <= window.

    Counts the k-tuples by their minimum m: all draws in [m, m + w'] minus all in
    [m + 1, m + w'] with w' = min(window, n_points - 1 - m). Used to fix, before looking, how
    close the steps of steepest change of k training curves must be for "they change together"
    to mean something: with 80 evaluations and 4 curves, a window of 4 evaluations is met by
    chance with probability ~ 7e-4.
    """
    n = check_positive_int("n_points", n_points)
    k = check_positive_int("k", k)
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be a non-negative int, got {window!r}")
    count = sum((min(window, n - 1 - m) + 1) ** k - min(window, n - 1 - m) ** k for m in range(n))
    return count / n ** k


def lm_attention_patterns(model: nn.Module, ids: Tensor) -> tuple[Tensor, list[Tensor]]:
    """Logits (B, T, V) of a :class:`~llmbook.transformer.model.TransformerLM` and its patterns.

    Hooks each block's attention, recomputes its queries and keys from the same inputs
    (positions and RoPE included) and returns A_l = softmax(q k^T * scale) with the causal
    mask, (B, H, T, T) per layer; key-value heads shared by several query heads (GQA) are
    repeated. The forward pass itself is untouched.
    """
    from llmbook.transformer.model import TransformerLM

    if not isinstance(model, TransformerLM):
        raise TypeError(f"model must be a TransformerLM, got {type(model).__name__}")
    patterns: list[Tensor] = []

    def hook(attn: MultiHeadAttention, args: tuple, kwargs: dict) -> None:
        q, k, _ = attn.project_qkv(args[0], kwargs.get("positions"), kwargs.get("rope"))
        k = k.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=-3)  # (B, H, T, d_head)
        patterns.append(attention_weights(q, k, is_causal=True, scale=attn.scale))  # (B, H, T, T)

    handles = [block.attn.register_forward_pre_hook(hook, with_kwargs=True) for block in model.blocks]
    try:
        with torch.no_grad():
            logits = model(ids)
    finally:
        for h in handles:
            h.remove()
    return logits, patterns
