"""Token embeddings: one-hot vectors, the lookup table E, weight tying and cosine geometry.

Introduced in notebooks/02_embeddings. A vocabulary of V tokens is embedded in d
dimensions by a matrix E of shape (V, d). Multiplying the one-hot row vector of token i
by E picks out row i, so the embedding layer is a linear map that PyTorch computes as a
row lookup (``E[ids]``) instead of a (V-wide) matrix product. Its gradient with respect
to E is a scatter-add of the upstream gradients into the rows of the tokens that
occurred; every other row gets zero.

*Weight tying* (Press & Wolf, 2017, "Using the Output Embedding to Improve Language
Models"; used by GPT-2) reuses E as the output layer: logits ``z = h E^T``.

Contents:

* :func:`one_hot` - one-hot encoding with range and dtype checks;
* :class:`TokenEmbedding` - the lookup table (``forward``) and the tied output
  projection (``logits``);
* :func:`embedding_grad` - the scatter-add formula dL/dE = X^T G;
* :func:`cosine_similarity`, :func:`pairwise_cosine` - the geometry of embeddings;
* :func:`embedding_parameter_count` - V d, plus an untied head and a position table;
* :func:`nearest_rows` - the rows of E nearest a point (the origin: the smallest norms),
  indicators of under-trained ("glitch") tokens (Land & Bartolo, 2024; notebooks/01_tokens).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from llmbook.validation import check_floating_tensor, check_positive_int, check_positive_number

__all__ = [
    "TokenEmbedding",
    "cosine_similarity",
    "embedding_grad",
    "embedding_parameter_count",
    "nearest_rows",
    "one_hot",
    "pairwise_cosine",
]


def _check_ids(ids: object, vocab_size: int) -> Tensor:
    """Token ids must be an integer tensor with every entry in [0, vocab_size)."""
    if not isinstance(ids, Tensor):
        raise TypeError(f"token ids must be a torch.Tensor, got {type(ids).__name__}")
    if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        raise TypeError(f"token ids must have an integer dtype (e.g. torch.long), got {ids.dtype}")
    if ids.numel() > 0:
        lo, hi = int(ids.min()), int(ids.max())
        bad = lo if lo < 0 else hi if hi >= vocab_size else None
        if bad is not None:
            raise ValueError(
                f"token id {bad} is out of range for a vocabulary of size V={vocab_size} "
                f"(ids must lie in [0, {vocab_size - 1}])"
            )
    return ids


def one_hot(ids: Tensor, vocab_size: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """One-hot encode token ids: ``(*shape)`` integer ids -> ``(*shape, V)`` one-hot rows.

    Row ``t`` of the result is the standard basis vector e_{ids[t]} of R^V, so for a
    (T,) sequence the result X has shape (T, V) and ``X @ E`` gathers the rows of E.
    Raises ``TypeError`` for non-integer ids and ``ValueError`` (naming the id and V)
    for ids outside [0, V).
    """
    vocab_size = check_positive_int("vocab_size", vocab_size)
    ids = _check_ids(ids, vocab_size)
    vocab = torch.arange(vocab_size, device=ids.device)  # (V,)
    return (ids.unsqueeze(-1) == vocab).to(dtype)  # (*shape, V)


def embedding_grad(ids: Tensor, grad_output: Tensor, vocab_size: int) -> Tensor:
    """The gradient of a loss with respect to E, given the gradient at the lookup's output.

    With X the one-hot matrix of ``ids`` and G = dL/d(XE) the upstream gradient,
    dL/dE = X^T G: row i of the result is the sum of the rows of G at the positions where
    token i occurred (a scatter-add), and rows of tokens that did not occur are zero.

    Shapes: ``ids`` (*shape), ``grad_output`` (*shape, d) -> (V, d).
    """
    vocab_size = check_positive_int("vocab_size", vocab_size)
    ids = _check_ids(ids, vocab_size)
    if grad_output.shape[:-1] != ids.shape or grad_output.ndim != ids.ndim + 1:
        raise ValueError(
            f"grad_output must have shape (*ids.shape, d) = ({', '.join(map(str, ids.shape))}, d); "
            f"got ids {tuple(ids.shape)} and grad_output {tuple(grad_output.shape)}"
        )
    d = grad_output.shape[-1]
    grad = grad_output.new_zeros(vocab_size, d)  # (V, d)
    return grad.index_add_(0, ids.reshape(-1), grad_output.reshape(-1, d))  # (V, d)


class TokenEmbedding(nn.Module):
    """A token embedding table E of shape (V, d), with an optional tied output layer.

    ``forward(ids)`` looks up rows: (B, T) integer ids -> (B, T, d), the same as
    ``one_hot(ids, V) @ E`` and as ``torch.nn.Embedding`` with the same weight.
    ``logits(h)`` is the tied output projection z = h E^T: (B, T, d) -> (B, T, V)
    (Press & Wolf, 2017; GPT-2). Both uses share one ``weight`` parameter, so its
    gradient is the sum of the gradients of the two uses.

    Initialisation: E_ij ~ N(0, std^2) with std = 0.02, as in GPT-2 (Radford et al.,
    2019). The parameter is called ``weight`` (shape (V, d)) like ``nn.Embedding``'s, so
    state dicts move between the two.

    ``scale`` multiplies what ``forward`` returns (not ``logits``): Gemma's models multiply
    the looked-up rows of their tied matrix by sqrt(d) (Riviere et al., 2024, for Gemma 2;
    ``transformers``' ``Gemma2TextScaledWordEmbedding``), so that one matrix initialised for
    unit-variance logits also gives inputs of unit RMS (notebooks/02_embeddings, section 2.7).
    The default 1 is a plain lookup.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        std: float = 0.02,
        generator: torch.Generator | None = None,
        dtype: torch.dtype | None = None,
        scale: float = 1.0,
    ) -> None:
        super().__init__()
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.d_model = check_positive_int("d_model", d_model)
        if not std > 0:
            raise ValueError(f"std must be positive, got std={std}")
        self.std = float(std)
        self.scale = check_positive_number("scale", scale)
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model, dtype=dtype))  # (V, d)
        self.reset_parameters(generator)

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Draw E_ij ~ N(0, std^2) independently (from ``generator`` when given)."""
        with torch.no_grad():
            self.weight.normal_(0.0, self.std, generator=generator)

    def forward(self, ids: Tensor) -> Tensor:
        """Look up the embeddings of ``ids``: (B, T) integer ids -> (B, T, d)."""
        ids = _check_ids(ids, self.vocab_size)
        rows = self.weight[ids]  # (B, T, d)
        return rows if self.scale == 1.0 else rows * self.scale

    def logits(self, h: Tensor) -> Tensor:
        """Tied output projection z = h E^T: (B, T, d) hidden states -> (B, T, V) logits."""
        if not isinstance(h, Tensor) or h.ndim < 1 or h.shape[-1] != self.d_model:
            shape = tuple(h.shape) if isinstance(h, Tensor) else type(h).__name__
            raise ValueError(f"logits expects hidden states (..., d={self.d_model}), got {shape}")
        return h @ self.weight.T  # (B, T, V)

    def extra_repr(self) -> str:
        extra = "" if self.scale == 1.0 else f", scale={self.scale:g}"
        return f"vocab_size={self.vocab_size}, d_model={self.d_model}, std={self.std}{extra}"


def cosine_similarity(a: Tensor, b: Tensor, dim: int = -1, eps: float = 1e-8) -> Tensor:
    """cos(a, b) = a.b / (max(|a|, eps) max(|b|, eps)) along ``dim``, clamped to [-1, 1].

    ``a`` and ``b`` must have the same shape (no silent broadcasting); the result has
    that shape without ``dim``. Each norm is floored at ``eps`` (as
    ``torch.nn.functional.cosine_similarity`` does), so a zero vector has cosine 0
    with everything instead of NaN; the clamp removes round-off beyond +-1, so
    ``arccos`` of the result is always defined.
    """
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError(
            f"cosine_similarity expects tensors, got {type(a).__name__}, {type(b).__name__}"
        )
    if a.shape != b.shape:
        raise ValueError(
            f"cosine_similarity needs equal shapes, got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if a.ndim == 0:
        raise ValueError("cosine_similarity needs at least one dimension, got 0-d tensors")
    if not eps > 0:
        raise ValueError(f"eps must be positive, got eps={eps}")
    a_hat = a / torch.linalg.vector_norm(a, dim=dim, keepdim=True).clamp_min(eps)
    b_hat = b / torch.linalg.vector_norm(b, dim=dim, keepdim=True).clamp_min(eps)
    return (a_hat * b_hat).sum(dim=dim).clamp(-1.0, 1.0)


def pairwise_cosine(E: Tensor, eps: float = 1e-8) -> Tensor:
    """Cosine similarity between every pair of rows of E: (V, d) -> (V, V), symmetric.

    Entry (i, j) is cos(E[i], E[j]); the diagonal is 1 (up to round-off) for nonzero rows,
    and the matrix is symmetric exactly (it is averaged with its transpose).
    """
    if not isinstance(E, Tensor) or E.ndim != 2:
        shape = tuple(E.shape) if isinstance(E, Tensor) else type(E).__name__
        raise ValueError(f"pairwise_cosine expects a (V, d) matrix, got {shape}")
    if not eps > 0:
        raise ValueError(f"eps must be positive, got eps={eps}")
    E_hat = E / torch.linalg.vector_norm(E, dim=1, keepdim=True).clamp_min(eps)  # (V, d)
    C = E_hat @ E_hat.T  # (V, V); a blocked matmul may round C[i, j] and C[j, i] differently
    return (0.5 * (C + C.T)).clamp(-1.0, 1.0)  # exactly symmetric


def embedding_parameter_count(
    vocab_size: int,
    d_model: int,
    context_length: int | None = None,
    tied: bool = True,
) -> int:
    """Parameters in the embedding-related matrices of a language model.

    * token embedding E: V d;
    * output layer (LM head, no bias): 0 more when tied to E, another V d when untied;
    * learned absolute position table (GPT-2's ``wpe``): T_max d when ``context_length``
      = T_max is given; ``None`` for models without one (RoPE, e.g. Llama).

    GPT-2 small (V = 50257, d = 768, T_max = 1024, tied): 38,597,376 + 786,432.
    """
    vocab_size = check_positive_int("vocab_size", vocab_size)
    d_model = check_positive_int("d_model", d_model)
    count = vocab_size * d_model  # E
    if not tied:
        count += vocab_size * d_model  # separate LM head W_out (V, d)
    if context_length is not None:
        count += check_positive_int("context_length", context_length) * d_model  # (T_max, d)
    return count



def nearest_rows(E: Tensor, k: int, centre: Tensor | None = None,
                 exclude: list[int] | None = None) -> tuple[Tensor, Tensor]:
    """The ``k`` rows of E nearest to ``centre`` (Euclidean), nearest first.

    With ``centre = None`` (the zero vector) these are the rows of smallest norm. Both are
    indicators of *under-trained* ("glitch") tokens, tokens of the vocabulary that (almost)
    never occurred in the training text, so that their rows barely moved from where such
    rows end up. Land & Bartolo (2024, "Fishing for Magikarp: Automatically Detecting
    Under-trained Tokens in Large Language Models") start from tokens known to be unused
    (reserved control tokens, say) and look for other tokens whose rows resemble theirs:
    ``centre`` = the mean row of the known-unused tokens. Candidates are only candidates;
    notebooks/01_tokens compares both indicators on SmolLM2.

    Args:
        E: ``(V, d)`` floating matrix, one row per token.
        k: how many rows, ``1 <= k <= V - len(exclude)``.
        centre: ``(d,)`` vector of E's dtype, or ``None`` for the origin.
        exclude: ids to leave out (the reference tokens themselves, say), each in ``[0, V)``.

    Returns:
        ``(ids, distances)``: two ``(k,)`` tensors, ids (int64) in order of increasing
        distance (ties: the smaller id first) and the distances.
    """
    E = check_floating_tensor(E, "E")
    if E.ndim != 2:
        raise ValueError(f"E must be a (V, d) matrix, got shape {tuple(E.shape)}")
    k = check_positive_int("k", k)
    if centre is not None:
        centre = check_floating_tensor(centre, "centre")
        if centre.shape != (E.shape[1],):
            raise ValueError(f"centre must have shape ({E.shape[1]},), got {tuple(centre.shape)}")
    skip = sorted(set(exclude or []))
    if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < E.shape[0] for i in skip):
        raise ValueError(f"exclude must hold ids in [0, {E.shape[0]}), got {exclude!r}")
    if k > E.shape[0] - len(skip):
        raise ValueError(f"k = {k} exceeds the {E.shape[0] - len(skip)} rows left after exclude")
    distances = torch.linalg.vector_norm(E if centre is None else E - centre, dim=1)  # (V,)
    keep = torch.ones(E.shape[0], dtype=torch.bool)
    keep[skip] = False
    ids = torch.arange(E.shape[0])[keep]
    order = torch.sort(distances[keep], stable=True).indices[:k]  # stable: ties keep id order
    return ids[order], distances[keep][order]
