"""Reading an attention-only model: in-context-learning score, head ablation, a hand-built circuit.

Introduced in notebooks/24_induction_heads, with :mod:`llmbook.scale.induction` (the data,
the model and the head scores). This module adds

* :func:`icl_score` - Olsson et al. (2022, "In-context Learning and Induction Heads"): the loss
  at a late token minus the loss at an early token;
* :func:`repeat_mask` - which predictions of :func:`~llmbook.scale.induction.repeated_tokens`
  data an induction head can make;
* :func:`head_ablation_effects` - the rise of the loss on those predictions when each head in
  turn is zero- or mean-ablated;
* :func:`induction_circuit_weights` and :func:`induction_circuit` - a two-layer attention-only
  model set by hand on one-hot embeddings that implements induction (Elhage et al., 2021, "A
  Mathematical Framework for Transformer Circuits"): a previous-token head in layer 0 writes
  the previous token into a subspace that the layer-1 head's keys read (K-composition).

Chapter 24b (notebooks/24b_real_model_interpretability) reads a real model, the book's
:class:`~llmbook.transformer.model.TransformerLM` of SmolLM2-135M-Instruct, through forward
hooks (the model is not changed):

* :func:`residual_stream` - the residual stream entering each block and the final norm,
  x_0 ... x_L; :func:`logit_lens` - each read through the final norm and the unembedding
  (nostalgebraist, 2020, "interpreting GPT: the logit lens");
* :func:`attention_patterns` - every head's attention matrix; :func:`attention_sink_score`
  - the mean attention paid to the first token (Xiao et al., 2024, "Efficient Streaming
  Language Models with Attention Sinks"); the previous-token and prefix-matching scores are
  chapter 24's;
* :func:`patch_residual` - activation patching (Meng et al., 2022, "Locating and Editing
  Factual Associations in GPT"): the clean residual at one (layer, position) put into a
  corrupted run, for all of them in one batch;
* :func:`ffn_activations`, :func:`ffn_keys_values`, :func:`read_through_unembedding`,
  :func:`top_activating` - the feed-forward layer as a key-value memory (Geva et al., 2021,
  "Transformer Feed-Forward Layers Are Key-Value Memories");
* :func:`auc`, :func:`random_rotation`, :func:`basis_probe` - do single coordinates of the
  embedding carry a property, or directions (Elhage et al., 2022, "Toy Models of
  Superposition", on privileged bases)?
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from llmbook.scale.induction import AttentionOnlyTransformer, per_position_loss
from llmbook.transformer.attention import attention_weights
from llmbook.transformer.model import TransformerLM
from llmbook.validation import (
    check_floating_tensor,
    check_index,
    check_positive_int,
    check_positive_number,
    check_token_ids,
)

__all__ = ["head_ablation_effects", "icl_score", "induction_circuit", "induction_circuit_weights",
           "repeat_mask", "ablation_value", "residual_stream", "logit_lens", "attention_patterns",
           "attention_sink_score", "patch_residual", "ffn_activations", "ffn_keys_values",
           "read_through_unembedding", "top_activating", "auc", "random_rotation", "basis_probe"]


def icl_score(position_loss: Tensor, early: int, late: int) -> Tensor:
    """In-context-learning score: loss at position ``late`` minus loss at position ``early``.

    Olsson et al. (2022) use the 500th minus the 50th token of natural text; a model that uses
    its context lowers the late loss, so the score is negative and grows in size with in-context
    learning. ``position_loss`` (..., T) -> (...).
    """
    position_loss = check_floating_tensor(position_loss, "position_loss")
    if position_loss.ndim == 0:
        raise ValueError("position_loss must have a position axis (..., T), got a 0-d tensor")
    T = position_loss.shape[-1]
    for name, value in (("early", early), ("late", late)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < T:
            raise ValueError(f"{name} must be an int position in [0, {T}), got {value!r}")
    if not early < late:
        raise ValueError(f"early must come before late, got early={early}, late={late}")
    return position_loss[..., late] - position_loss[..., early]


def repeat_mask(segment_length: int) -> Tensor:
    """(2L - 1,) booleans over the predictions of a [segment | segment] sequence of length 2L:
    True at positions L..2L-2, whose next token (L+1..2L-1) is a copy an induction head can
    predict (position L-1 must guess the first token of the copy, which nothing predicts)."""
    L = check_positive_int("segment_length", segment_length)
    return torch.arange(2 * L - 1) >= L


def ablation_value(model: AttentionOnlyTransformer, ids: Tensor, layer: int, head: int) -> Tensor:
    """The mean of head (layer, head)'s output z over the batch ``ids``: (T, d_head), the value
    that mean ablation puts in its place (the head's average behaviour, not its absence)."""
    if not isinstance(model, AttentionOnlyTransformer):
        raise TypeError(f"model must be an AttentionOnlyTransformer, got {type(model).__name__}")
    check_index("layer", layer, model.n_layers)
    check_index("head", head, model.n_heads)
    with torch.no_grad():
        _, cache = model.run_with_cache(ids)
    return cache["z"][layer][:, head].mean(dim=0)  # (T, d_head)


def head_ablation_effects(model: AttentionOnlyTransformer, ids: Tensor, mask: Tensor,
                          kind: str = "zero") -> Tensor:
    """Rise of the mean loss on the predictions ``mask`` when one head at a time is ablated.

    ``ids`` (B, T); ``mask`` (T-1,) or (B, T-1) booleans selecting the predictions that count
    (e.g. :func:`repeat_mask`). ``kind`` "zero" sets the head's output to 0, "mean" to its mean
    over the batch at each position (:func:`ablation_value`). Returns (n_layers, n_heads):
    loss with the head ablated minus the loss of the intact model, in nats.
    """
    ids = check_token_ids(ids, "ids", ndim=2)
    if kind not in ("zero", "mean"):
        raise ValueError(f"kind must be 'zero' or 'mean', got {kind!r}")
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or \
            mask.shape not in ((ids.shape[1] - 1,), (ids.shape[0], ids.shape[1] - 1)):
        shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"mask must be a boolean (T-1,) or (B, T-1) tensor for ids of shape "
                         f"{tuple(ids.shape)}, got {shape}")
    if not bool(mask.any()):
        raise ValueError("mask selects no predictions (all False): the mean loss over them is undefined")
    mask = mask.expand(ids.shape[0], -1)

    def loss(ablate: dict | None = None) -> Tensor:
        with torch.no_grad():
            return per_position_loss(model(ids, ablate=ablate), ids)[mask].mean()

    base = loss()
    effects = torch.zeros(model.n_layers, model.n_heads, dtype=base.dtype)
    for layer in range(model.n_layers):
        for head in range(model.n_heads):
            value = None if kind == "zero" else ablation_value(model, ids, layer, head)
            effects[layer, head] = loss({(layer, head): value}) - base
    return effects


def induction_circuit_weights(vocab_size: int, seq_len: int) -> dict[str, Tensor]:
    """The weights of a hand-built two-layer induction circuit, entries in {-1, 0, 1}: float64.

    The residual stream (width d = 3V + T) has four blocks: the current token (one-hot, V),
    the position (one-hot, T), the previous token (V, written by layer 0) and the output
    (V, written by layer 1). One head per layer, head width d_head = max(V, T). With a
    sharpness beta multiplying the queries (:func:`induction_circuit`):

    * layer 0, the previous-token head: query = beta * position t, key = position s + 1, so
      the score beta [s = t - 1] picks the previous position; its OV circuit copies that
      position's token into the previous-token block;
    * layer 1, the induction head: query = beta * token x_t, key = previous-token block at s
      minus 1 on every coordinate at s = 0 (whose "previous token" is only itself), so the
      score is beta ([x_{s-1} = x_t] - [s = 0]): the keys are built from layer 0's output,
      K-composition. Its OV circuit copies the token at s into the output block;
    * the unembedding reads the output block.

    Returns ``W_E`` (V, d), ``W_P`` (T, d), ``W_Q0, W_K0, W_V0, W_Q1, W_K1, W_V1`` (d_head, d),
    ``W_O0, W_O1`` (d, d_head), ``W_U`` (V, d), in ``nn.Linear`` layout (y = W x).
    """
    V = check_positive_int("vocab_size", vocab_size)
    T = check_positive_int("seq_len", seq_len)
    if T < 2:
        raise ValueError(f"seq_len must be at least 2 for a previous token to exist, got {T}")
    d, n = 3 * V + T, max(V, T)
    tok, pos, prev, out = slice(0, V), slice(V, V + T), slice(V + T, 2 * V + T), slice(2 * V + T, d)
    z = {name: torch.zeros(n, d, dtype=torch.float64) for name in ("W_Q0", "W_K0", "W_V0", "W_Q1", "W_K1", "W_V1")}
    eye_V, eye_T = torch.eye(V, dtype=torch.float64), torch.eye(T, dtype=torch.float64)
    z["W_Q0"][:T, pos] = eye_T  # query: my position t
    z["W_K0"][1:T, pos] = eye_T[:T - 1]  # key at s: the one-hot of s + 1 (nothing for s = T-1)
    z["W_V0"][:V, tok] = eye_V  # value: my token
    z["W_Q1"][:V, tok] = eye_V  # query: my token
    z["W_K1"][:V, prev] = eye_V  # key: the previous token that layer 0 wrote here
    z["W_K1"][:V, V] = -1.0  # ... minus 1 everywhere at position 0 (the position block's first entry)
    z["W_V1"][:V, tok] = eye_V  # value: my token
    W_O0, W_O1 = torch.zeros(d, n, dtype=torch.float64), torch.zeros(d, n, dtype=torch.float64)
    W_O0[prev, :V] = eye_V
    W_O1[out, :V] = eye_V
    W_E, W_P, W_U = (torch.zeros(V, d, dtype=torch.float64), torch.zeros(T, d, dtype=torch.float64),
                     torch.zeros(V, d, dtype=torch.float64))
    W_E[:, tok], W_P[:, pos], W_U[:, out] = eye_V, eye_T, eye_V
    return {"W_E": W_E, "W_P": W_P, **z, "W_O0": W_O0, "W_O1": W_O1, "W_U": W_U}


def induction_circuit(vocab_size: int, seq_len: int, beta: float = 20.0) -> AttentionOnlyTransformer:
    """The hand-built circuit of :func:`induction_circuit_weights` as a float64
    :class:`~llmbook.scale.induction.AttentionOnlyTransformer` (learned positions, one head per
    layer). ``beta`` scales both layers' attention scores (the queries; the model's
    1/sqrt(d_head) is undone) and the logits: as beta grows, the attention becomes a hard
    selection and the model predicts the token after the previous occurrence of the current one.
    """
    beta = check_positive_number("beta", beta)
    w = induction_circuit_weights(vocab_size, seq_len)
    d, n = w["W_E"].shape[1], w["W_Q0"].shape[0]
    model = AttentionOnlyTransformer(vocab_size, d, 2, 1, seq_len, d_head=n, positions="learned").double()
    with torch.no_grad():
        model.embed.weight.copy_(w["W_E"])
        model.pos.weight.copy_(w["W_P"])
        for i, attn in enumerate(model.layers):
            attn.q_proj.weight.copy_(beta / attn.scale * w[f"W_Q{i}"])  # scores = beta * q.k
            attn.k_proj.weight.copy_(w[f"W_K{i}"])
            attn.v_proj.weight.copy_(w[f"W_V{i}"])
            attn.o_proj.weight.copy_(w[f"W_O{i}"])
        model.unembed.weight.copy_(beta * w["W_U"])
    return model.eval()


# ---------------------------------------------------------------- reading a real model (24b)


def _check_model(model: object) -> TransformerLM:
    if not isinstance(model, TransformerLM):
        raise TypeError(f"model must be a TransformerLM, got {type(model).__name__}")
    return model


def _sites(model: TransformerLM) -> list[torch.nn.Module]:
    """The L + 1 modules whose input is the residual stream x_0 ... x_L: blocks, final norm."""
    return [*model.blocks, model.final_norm]


def _run_hooked(model: TransformerLM, ids: Tensor, handles: list) -> Tensor:
    """model(ids) without gradients, then remove the hook ``handles`` (even on an error)."""
    try:
        with torch.no_grad():
            return model(ids)
    finally:
        for h in handles:
            h.remove()


def residual_stream(model: TransformerLM, ids: Tensor) -> Tensor:
    """The residual stream x_l entering block l (l < L) and the final norm (l = L):
    ids (B, T) -> (L + 1, B, T, d). x_0 is the token embedding (plus learned positions)."""
    model = _check_model(model)
    ids = check_token_ids(ids, "ids", ndim=2, vocab_size=model.config.vocab_size)
    seen: list[Tensor] = []
    _run_hooked(model, ids, [site.register_forward_pre_hook(lambda _m, a: seen.append(a[0].detach()))
                             for site in _sites(model)])
    return torch.stack(seen)  # (L + 1, B, T, d)


def logit_lens(model: TransformerLM, resid: Tensor) -> Tensor:
    """Each residual stream read as if it were the last: final norm, then the unembedding.

    ``resid`` (..., d), e.g. (L + 1, B, T, d) from :func:`residual_stream` -> logits (..., V).
    At l = L this is the model's own output.
    """
    model = _check_model(model)
    resid = check_floating_tensor(resid, "resid")
    if resid.ndim == 0 or resid.shape[-1] != model.config.d_model:
        raise ValueError(f"resid must have shape (..., d_model={model.config.d_model}), got "
                         f"{tuple(resid.shape)}")
    with torch.no_grad():
        h = model.final_norm(resid)
        return F.linear(h, model.embed.weight) if model.lm_head is None else model.lm_head(h)


def attention_patterns(model: TransformerLM, ids: Tensor) -> Tensor:
    """Every head's attention matrix: ids (B, T) -> (L, B, H, T, T), rows summing to 1.

    Recomputed from each layer's own queries and keys (``project_qkv``, RoPE included), with
    the grouped key heads repeated (head h reads key head h // (H / H_kv)), whatever kernel
    the model runs.
    """
    model = _check_model(model)
    ids = check_token_ids(ids, "ids", ndim=2, vocab_size=model.config.vocab_size)
    seen: list[Tensor] = []

    def hook(attn: torch.nn.Module, args: tuple, kwargs: dict, _out: Tensor) -> None:
        q, k, _ = attn.project_qkv(args[0], kwargs.get("positions"), kwargs.get("rope"))
        k = k.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=-3)  # (B, H, T, d_head)
        seen.append(attention_weights(q, k, is_causal=True, scale=attn.scale))

    _run_hooked(model, ids, [b.attn.register_forward_hook(hook, with_kwargs=True) for b in model.blocks])
    return torch.stack(seen)  # (L, B, H, T, T)


def attention_sink_score(pattern: Tensor) -> Tensor:
    """Mean attention paid to position 0 by the queries t >= 1: (B, H, T, T) -> (H,).

    A sink head parks most of its attention on the first token whatever it is (Xiao et al.,
    2024); a uniform head scores the mean of 1/(t + 1), about ln(T)/T.
    """
    pattern = check_floating_tensor(pattern, "pattern")
    if pattern.ndim != 4 or pattern.shape[-1] < 2 or pattern.shape[-2] != pattern.shape[-1] \
            or pattern.shape[0] == 0:
        raise ValueError(f"pattern must have shape (B, H, T, T) with B >= 1 and T >= 2, got "
                         f"{tuple(pattern.shape)}")
    return pattern[..., 1:, 0].mean(dim=(0, 2))  # (H,)


def patch_residual(model: TransformerLM, clean_ids: Tensor, corrupt_ids: Tensor,
                   metric: Callable[[Tensor], Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """Activation patching of the residual stream (Meng et al., 2022).

    ``clean_ids`` and ``corrupt_ids`` (1, T) differ in a few tokens; ``metric`` maps the
    last position's logits (N, V) to (N,), e.g. logit(answer) - logit(other answer). For
    every site l = 0..L (the input of block l, or of the final norm) and position t, the
    corrupted run gets the clean x_l[t] in place of its own; all (L + 1) T runs go in one
    batch. Returns ``(effects, clean, corrupt)``: effects (L + 1, T) the metric of each
    patched run, and the two unpatched metrics (0-d). Patching every position at once at
    any site gives back ``clean``.
    """
    model = _check_model(model)
    V = model.config.vocab_size
    clean_ids = check_token_ids(clean_ids, "clean_ids", ndim=2, vocab_size=V)
    corrupt_ids = check_token_ids(corrupt_ids, "corrupt_ids", ndim=2, vocab_size=V)
    if clean_ids.shape[0] != 1 or clean_ids.shape != corrupt_ids.shape:
        raise ValueError(f"clean_ids and corrupt_ids must both have shape (1, T), got "
                         f"{tuple(clean_ids.shape)} and {tuple(corrupt_ids.shape)}")
    if not callable(metric):
        raise TypeError(f"metric must be callable, got {type(metric).__name__}")
    clean_resid = residual_stream(model, clean_ids)[:, 0]  # (L + 1, T, d)
    n_sites, T = clean_resid.shape[0], clean_ids.shape[1]
    rows = torch.arange(T)

    def hook_for(site: int) -> Callable:
        def hook(_m: torch.nn.Module, args: tuple) -> tuple:
            x = args[0].clone()
            x[site * T + rows, rows] = clean_resid[site]  # run site*T + t gets clean x_site[t]
            return (x, *args[1:])
        return hook

    patched = _run_hooked(model, corrupt_ids.expand(n_sites * T, -1),
                          [m.register_forward_pre_hook(hook_for(i)) for i, m in enumerate(_sites(model))])
    patched = patched[:, -1]  # (N, V)
    with torch.no_grad():
        base = metric(model(torch.cat([clean_ids, corrupt_ids]))[:, -1])  # (2,)
    return metric(patched).reshape(n_sites, T), base[0], base[1]


def _ffn_in(model: TransformerLM, layer: int) -> torch.nn.Linear:
    mlp = model.blocks[layer].mlp
    return mlp.down_proj if hasattr(mlp, "down_proj") else mlp.proj


def ffn_activations(model: TransformerLM, ids: Tensor, layer: int) -> Tensor:
    """The hidden activations of block ``layer``'s feed-forward layer, the input of its output
    matrix: ids (B, T) -> (B, T, d_ff). For SwiGLU, SiLU(W_gate x) * (W_up x); for the GELU
    MLP, GELU(W_fc x + b). The FFN's output is their weighted sum of the value vectors
    (:func:`ffn_keys_values`)."""
    model = _check_model(model)
    ids = check_token_ids(ids, "ids", ndim=2, vocab_size=model.config.vocab_size)
    layer = check_index("layer", layer, model.config.n_layers)
    seen: list[Tensor] = []
    _run_hooked(model, ids, [_ffn_in(model, layer).register_forward_pre_hook(lambda _m, a: seen.append(a[0]))])
    return seen[0]  # (B, T, d_ff)


def ffn_keys_values(model: TransformerLM, layer: int) -> dict[str, Tensor]:
    """Block ``layer``'s feed-forward layer as a key-value memory (Geva et al., 2021).

    In the book's ``nn.Linear`` layout (y = W x) hidden unit i has key ``W_in[i, :]`` (a row
    of ``up_proj`` / ``fc``, and for SwiGLU also the gate row ``W_gate[i, :]``) and value
    ``W_out[:, i]`` (a column of ``down_proj`` / ``proj``). In the row-vector form x W_1 W_2
    of C10 (W_1 = W_in^T, W_2 = W_out^T) the keys are columns of W_1 and the values *rows* of
    W_2. Returns ``keys`` (d_ff, d), ``values`` (d_ff, d) and, for SwiGLU, ``gates`` (d_ff, d).
    """
    model = _check_model(model)
    layer = check_index("layer", layer, model.config.n_layers)
    mlp = model.blocks[layer].mlp
    if hasattr(mlp, "down_proj"):
        return {"keys": mlp.up_proj.weight.detach(), "gates": mlp.gate_proj.weight.detach(),
                "values": mlp.down_proj.weight.detach().T}
    return {"keys": mlp.fc.weight.detach(), "values": mlp.proj.weight.detach().T}


def read_through_unembedding(model: TransformerLM, vectors: Tensor,
                             tokens: Tensor | None = None) -> Tensor:
    """Directions in the residual stream read as logits: (..., d) -> (..., V).

    A direction v moves the logits by W_U (g * v), with g the final norm's gain (the norm's
    division by the RMS is a positive factor and leaves the ranking alone). ``tokens`` (n,)
    reads only those logits, (..., n), at a fraction of the cost of all V.
    """
    model = _check_model(model)
    vectors = check_floating_tensor(vectors, "vectors")
    if vectors.ndim == 0 or vectors.shape[-1] != model.config.d_model:
        raise ValueError(f"vectors must have shape (..., d_model={model.config.d_model}), got "
                         f"{tuple(vectors.shape)}")
    W_U = model.embed.weight if model.lm_head is None else model.lm_head.weight
    if tokens is not None:
        W_U = W_U[check_token_ids(tokens, "tokens", ndim=1, vocab_size=model.config.vocab_size)]
    with torch.no_grad():
        return (vectors * model.final_norm.weight) @ W_U.T  # (..., V) or (..., n)


def top_activating(activations: Tensor, unit: int, k: int) -> tuple[Tensor, Tensor]:
    """The k (batch, position) pairs where hidden unit ``unit`` is largest.

    ``activations`` (B, T, d_ff) -> ``(values (k,), where (k, 2))``, largest first.
    """
    activations = check_floating_tensor(activations, "activations")
    if activations.ndim != 3:
        raise ValueError(f"activations must have shape (B, T, d_ff), got {tuple(activations.shape)}")
    unit = check_index("unit", unit, activations.shape[-1])
    k = check_positive_int("k", k)
    B, T = activations.shape[:2]
    if k > B * T:
        raise ValueError(f"k={k} exceeds the B * T = {B * T} positions")
    values, flat = activations[..., unit].reshape(-1).topk(k)
    return values, torch.stack([flat // T, flat % T], dim=1)


def auc(scores: Tensor, labels: Tensor) -> Tensor:
    """Area under the ROC curve: the probability that a random positive scores above a random
    negative (ties count 1/2), the Mann-Whitney U over n_pos n_neg. ``scores`` (N,) real,
    ``labels`` (N,) bool with both classes present -> 0-d float64."""
    scores = check_floating_tensor(scores, "scores")
    if scores.ndim != 1 or not isinstance(labels, Tensor) or labels.dtype != torch.bool or \
            labels.shape != scores.shape:
        got = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__
        raise ValueError(f"labels must be a boolean tensor of the shape of scores (N,) = "
                         f"{tuple(scores.shape)}, got {got}")
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"labels need both classes, got {n_pos} positives and {n_neg} negatives")
    pos, neg = scores[labels].double(), scores[~labels].double()
    wins = (pos[:, None] > neg[None, :]).double() + 0.5 * (pos[:, None] == neg[None, :]).double()
    return wins.mean()


def random_rotation(d: int, generator: torch.Generator | None = None) -> Tensor:
    """A random orthogonal (d, d) float64 matrix, Haar-distributed (QR of a Gaussian with the
    signs of R's diagonal moved into Q)."""
    d = check_positive_int("d", d)
    q, r = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def basis_probe(X: Tensor, labels: Tensor, train: Tensor) -> dict[str, float | int]:
    """Does one coordinate of X carry a binary property, or a direction?

    ``X`` (N, d) vectors (e.g. token embeddings), ``labels`` (N,) bool, ``train`` (N,) bool
    splits them. On the training rows: the single coordinate with the largest |AUC - 1/2|
    (oriented by its sign) and the mean-difference direction mu_pos - mu_neg. Returns the
    held-out AUCs ``best_dim_auc`` and ``direction_auc``, the chosen ``best_dim`` and the
    share of the direction's squared norm in its 10% largest coordinates, ``top10_share``
    (0.1 for a direction spread evenly, 1 for one confined to a tenth of the coordinates).
    """
    X = check_floating_tensor(X, "X")
    if X.ndim != 2:
        raise ValueError(f"X must have shape (N, d), got {tuple(X.shape)}")
    for name, m in (("labels", labels), ("train", train)):
        if not isinstance(m, Tensor) or m.dtype != torch.bool or m.shape != X.shape[:1]:
            got = tuple(m.shape) if isinstance(m, Tensor) else type(m).__name__
            raise ValueError(f"{name} must be a boolean (N,) = ({X.shape[0]},) tensor, got {got}")
    test = ~train
    for name, part in (("train", train), ("test", test)):
        if not bool((labels & part).any()) or not bool((~labels & part).any()):
            raise ValueError(f"the {name} split needs both classes")
    X = X.double()
    per_dim = torch.stack([auc(X[train, j], labels[train]) for j in range(X.shape[1])])
    best = int((per_dim - 0.5).abs().argmax())
    sign = 1.0 if per_dim[best] >= 0.5 else -1.0
    direction = X[train & labels].mean(0) - X[train & ~labels].mean(0)
    sq = direction.pow(2).sort(descending=True).values
    n_top = max(1, X.shape[1] // 10)
    return {"best_dim": best,
            "best_dim_auc": float(auc(sign * X[test, best], labels[test])),
            "direction_auc": float(auc(X[test] @ direction, labels[test])),
            "top10_share": float(sq[:n_top].sum() / sq.sum())}
