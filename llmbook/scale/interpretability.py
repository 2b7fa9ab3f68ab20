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
"""

from __future__ import annotations

import torch
from torch import Tensor

from llmbook.scale.induction import AttentionOnlyTransformer, per_position_loss
from llmbook.validation import (
    check_floating_tensor,
    check_index,
    check_positive_int,
    check_positive_number,
    check_token_ids,
)

__all__ = ["head_ablation_effects", "icl_score", "induction_circuit", "induction_circuit_weights",
           "repeat_mask", "ablation_value"]


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
