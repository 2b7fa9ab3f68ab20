"""Packing documents into fixed-length training chunks, and a batch order that can resume.

Training on documents of uneven length either pads each to the longest (wasting compute on
padding) or *packs* them: the token streams of several documents, each closed by a separator,
fill one chunk of L tokens after another. Packing wastes nothing, but a plain causal mask then
lets a token attend to the end of the *previous* document in its chunk, and the loss asks the
model to predict the first token of a document from an unrelated one. A document-aware packing
fixes both (as in Krell et al., 2021, "Efficient Sequence Packing without Cross-contamination"):

* every token carries the id of its *segment* (the part of one document that lies in one
  chunk); the attention mask is causal **and** block-diagonal over segments, so the packed
  chunk computes exactly what each segment would compute alone;
* positions restart at 0 at each segment, as if the segment were its own sequence;
* a target is kept only where the next token belongs to the same segment; the last token of
  a segment predicts nothing (``ignore_index``).

:func:`pack_documents` returns the chunks with these tensors; :meth:`PackedChunks.attention_mask`
builds the (N, 1, L, L) boolean mask the book's attention takes (True = may attend).

:class:`ResumableBatches` draws batches of chunk indices in an order fixed by a seed and the
epoch number alone (a fresh permutation per epoch, from numpy's PCG64), and can save and
restore where it is: a run stopped at step s and resumed from :meth:`~ResumableBatches.state_dict`
sees exactly the batches an uninterrupted run would.

This is packing for pretraining-style data: a stream of documents, cut wherever a chunk is
full. Chapter 17's :func:`llmbook.alignment.sft.pack_examples` packs (prompt, response)
examples for fine-tuning instead: it never splits an example, places whole examples into
rows (in order, or best fit decreasing as trl does) and carries the loss mask of the
responses; the masks and positions follow the same rule.

Shapes: N chunks of L tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from llmbook.validation import check_positive_int

__all__ = ["PackedChunks", "ResumableBatches", "pack_documents"]


@dataclass(frozen=True)
class PackedChunks:
    """N packed chunks of L tokens; every tensor is (N, L) ``torch.long``.

    ``ids``: the tokens (``pad_id`` after the last document). ``targets``: the next token of
    the same segment, else ``ignore_index``. ``positions``: the position within the segment,
    0 at each segment's first token (and at padding). ``segments``: the segment each token
    belongs to, numbered over the whole packing, -1 at padding. ``documents``: the index of
    the document each token comes from, -1 at padding.
    """

    ids: Tensor
    targets: Tensor
    positions: Tensor
    segments: Tensor
    documents: Tensor

    def attention_mask(self) -> Tensor:
        """(N, 1, L, L) booleans: query i may attend to key j iff j <= i in the same segment.

        Padding attends to nothing (the book's attention gives such a row zero output).
        """
        s = self.segments  # (N, L)
        L = s.shape[1]
        same = (s[:, :, None] == s[:, None, :]) & (s[:, :, None] >= 0)  # (N, L, L)
        causal = torch.ones(L, L, dtype=torch.bool).tril()
        return (same & causal)[:, None]  # (N, 1, L, L): one mask for every head

    @property
    def padding_fraction(self) -> float:
        """The share of the N * L slots that hold padding."""
        return float((self.segments < 0).double().mean())


def _check_documents(documents: object) -> list[list[int]]:
    if isinstance(documents, (str, bytes, Tensor)) or not isinstance(documents, Sequence):
        raise TypeError(f"documents must be a sequence of token-id sequences, got {type(documents).__name__}")
    if len(documents) == 0:
        raise ValueError("documents must hold at least one document, got none")
    out = []
    for i, doc in enumerate(documents):
        if isinstance(doc, Tensor):
            if doc.dim() != 1 or doc.dtype.is_floating_point or doc.dtype == torch.bool:
                raise TypeError(f"documents[{i}] must be a 1-D integer tensor, got {doc.dtype} "
                                f"of shape {tuple(doc.shape)}")
            doc = doc.tolist()
        if isinstance(doc, (str, bytes)) or not isinstance(doc, Sequence):
            raise TypeError(f"documents[{i}] must be a sequence of token ids, got {type(doc).__name__}")
        if len(doc) == 0:
            raise ValueError(f"documents[{i}] is empty; drop empty documents before packing")
        for t in doc:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
                raise ValueError(f"documents[{i}] must hold non-negative integer token ids, got {t!r}")
        out.append([int(t) for t in doc])
    return out


def _check_token_id(name: str, value: object, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer token id, got {value!r}")
    return int(value)


def pack_documents(documents: Sequence[Sequence[int]], chunk_len: int, sep_id: int | None = None,
                   pad_id: int = 0, ignore_index: int = -100) -> PackedChunks:
    """Pack token-id documents, in order, into ``ceil(total / chunk_len)`` chunks of ``chunk_len``.

    Each document is followed by ``sep_id`` (when given; it belongs to the document, so the
    model learns to predict the end of a document). The stream is cut every ``chunk_len``
    tokens, so a long document continues in the next chunk as a new segment; the last chunk
    is padded with ``pad_id``. See :class:`PackedChunks` for the tensors returned.
    """
    docs = _check_documents(documents)
    L = check_positive_int("chunk_len", chunk_len)
    sep = _check_token_id("sep_id", sep_id, allow_none=True)
    pad = _check_token_id("pad_id", pad_id)
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int) or ignore_index >= 0:
        raise ValueError(f"ignore_index must be a negative integer (it may not be a token id), "
                         f"got {ignore_index!r}")
    stream, doc_of = [], []
    for d, doc in enumerate(docs):
        tokens = doc + ([sep] if sep is not None else [])
        stream += tokens
        doc_of += [d] * len(tokens)
    total = len(stream)
    n = -(-total // L)
    ids = torch.full((n * L,), pad, dtype=torch.long)
    documents_t = torch.full((n * L,), -1, dtype=torch.long)
    ids[:total] = torch.tensor(stream, dtype=torch.long)
    documents_t[:total] = torch.tensor(doc_of, dtype=torch.long)
    ids, documents_t = ids.view(n, L), documents_t.view(n, L)
    # a segment starts at each chunk's first slot and wherever the document changes
    starts = torch.ones(n, L, dtype=torch.bool)
    starts[:, 1:] = documents_t[:, 1:] != documents_t[:, :-1]
    starts &= documents_t >= 0
    segments = starts.view(-1).cumsum(0).view(n, L) - 1
    segments = torch.where(documents_t >= 0, segments, torch.full_like(segments, -1))
    index = torch.arange(L).expand(n, L)
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values  # (N, L)
    positions = torch.where(documents_t >= 0, index - first, torch.zeros_like(index))
    targets = torch.full((n, L), ignore_index, dtype=torch.long)
    keep = (segments[:, 1:] == segments[:, :-1]) & (segments[:, :-1] >= 0)  # next token, same segment
    targets[:, :-1] = torch.where(keep, ids[:, 1:], targets[:, :-1])
    return PackedChunks(ids, targets, positions, segments, documents_t)


class ResumableBatches:
    """Batches of indices into ``num_items`` items, in an order that depends on the seed only.

    Epoch e visits the items in the permutation ``numpy.random.default_rng([seed, e])``
    draws (or in order, with ``shuffle=False``), ``batch_size`` at a time; with
    ``drop_last=True`` (the default) a last, smaller batch of an epoch is skipped, so every
    batch has the same size. The iterator never ends: after the last batch of an epoch comes
    the first of the next. :meth:`state_dict` and :meth:`load_state_dict` save and restore
    the position, so a resumed run continues with exactly the batches it would have seen.
    """

    def __init__(self, num_items: int, batch_size: int, seed: int = 0, shuffle: bool = True,
                 drop_last: bool = True) -> None:
        self.num_items = check_positive_int("num_items", num_items)
        self.batch_size = check_positive_int("batch_size", batch_size)
        if drop_last and batch_size > num_items:
            raise ValueError(f"batch_size={batch_size} is larger than num_items={num_items}: "
                             f"with drop_last=True no batch would ever be drawn")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.seed, self.shuffle, self.drop_last = seed, bool(shuffle), bool(drop_last)
        self.epoch, self.position = 0, 0

    @property
    def batches_per_epoch(self) -> int:
        full, rest = divmod(self.num_items, self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def order(self, epoch: int) -> np.ndarray:
        """The order in which epoch ``epoch`` visits the items, shape (num_items,)."""
        if not self.shuffle:
            return np.arange(self.num_items)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_items)

    def __iter__(self) -> ResumableBatches:
        return self

    def __next__(self) -> Tensor:
        """The next batch: a (batch_size,) long tensor of item indices (smaller only at the end
        of an epoch with ``drop_last=False``)."""
        if self.position >= self.batches_per_epoch:
            self.epoch, self.position = self.epoch + 1, 0
        start = self.position * self.batch_size
        batch = self.order(self.epoch)[start:start + self.batch_size]
        self.position += 1
        return torch.from_numpy(batch.astype(np.int64))

    def state_dict(self) -> dict[str, Any]:
        """Everything that fixes the batches still to come."""
        return {"num_items": self.num_items, "batch_size": self.batch_size, "seed": self.seed,
                "shuffle": self.shuffle, "drop_last": self.drop_last, "epoch": self.epoch,
                "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`); its settings must equal ours."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        missing = {"num_items", "batch_size", "seed", "shuffle", "drop_last", "epoch", "position"} - set(state)
        if missing:
            raise ValueError(f"state lacks {sorted(missing)}")
        for key in ("num_items", "batch_size", "seed", "shuffle", "drop_last"):
            if state[key] != getattr(self, key):
                raise ValueError(f"state was saved with {key}={state[key]!r}, this iterator has "
                                 f"{key}={getattr(self, key)!r}")
        epoch, position = state["epoch"], state["position"]
        for key, value in (("epoch", epoch), ("position", position)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"state[{key!r}] must be a non-negative integer, got {value!r}")
        if position > self.batches_per_epoch:
            raise ValueError(f"state['position']={position} is past the {self.batches_per_epoch} "
                             f"batches of an epoch")
        self.epoch, self.position = epoch, position
