"""Build it yourself, Part VI (scale): a ring all-reduce from send and receive, and data parallelism.

Part VI of the book (chapters 21 to 24; collectives and data parallelism are chapter 22)
trains a model on many processes at once. Everything there rests on one collective, the
all-reduce: every rank holds a tensor and every rank ends with the sum over ranks. In this
unit you build it the way NCCL and gloo build it for large tensors, as a *ring*: a
reduce-scatter (p - 1 steps, each rank passing one chunk to its right neighbour and adding
the chunk that arrives from its left) followed by an all-gather (p - 1 more steps passing
the finished chunks on). Then you use it to average gradients, which is all that data
parallelism needs.

Your functions run inside real processes joined by ``torch.distributed`` with the gloo
backend (the grader starts 2, 3 and 4 of them with ``llmbook.scale.launch.run``), so in
them ``dist.get_rank()``, ``dist.get_world_size()``, ``dist.send``/``dist.recv`` and
``dist.isend``/``dist.irecv`` work. The built-in collectives (``dist.all_reduce``,
``dist.reduce_scatter``, ``dist.all_gather``, ``dist.broadcast``, ...) are switched off
while your functions run: build yours from point-to-point messages. A rank that waits for a
message that never comes (a ``recv`` with no matching ``send``) fails after 20 seconds
with gloo's time-out, and the grader says so.

Conventions. A tensor of n elements (any shape, contiguous, floating, n >= p) is split
along its flattened elements into p chunks with ``tensor.view(-1).tensor_split(p)``: views,
whose sizes differ by at most one when p does not divide n. Chunk r belongs to rank r.
Rank r's right neighbour is (r + 1) mod p and its left neighbour (r - 1) mod p.

Build in this order:

1. :func:`ring_reduce_scatter`: afterwards chunk r of rank r holds the sum over ranks;
2. :func:`ring_all_gather`: afterwards every rank holds every rank's chunk;
3. :func:`ring_all_reduce`: the two together, equal to ``dist.all_reduce``;
4. :func:`average_gradients`: the mean of every gradient over the ranks, with your ring.

Exercise 4 is the end-to-end check: three AdamW steps of the book's tiny transformer on 2
and 3 ranks, each on its slice of the batch, with your :func:`average_gradients` between
backward and the step, must give the parameters of one process training on the whole batch
(``llmbook.scale.data_parallel.train_single_process``).

Grade with ``llmbook grade build-VI``. Your functions may live in your file or be defined
in a notebook (``grade("build-VI", globals())``; that needs the ``cloudpickle`` package, to
send them to the processes). This file is the reference: every function calls the book's
own ring (``llmbook.scale.collectives``), so look at it only after trying.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def ring_reduce_scatter(tensor: torch.Tensor) -> torch.Tensor:
    """Ring reduce-scatter, in place: afterwards chunk r of ``tensor`` on rank r is the sum over ranks.

    ``tensor``: this rank's tensor, any shape, contiguous, floating, with n >= p elements.
    Split it with ``chunks = tensor.view(-1).tensor_split(p)`` (views: writing into a chunk
    writes into the tensor). At step s = 0, 1, ..., p - 2, rank r

        sends its chunk (r - s - 1) mod p to the right neighbour, and
        receives chunk (r - s - 2) mod p from the left neighbour, adding it into its own copy.

    After p - 1 steps chunk r of rank r holds the sum of all p ranks' chunk r (the others
    hold partial sums: leave them). Return ``chunks[r]``, the view of the reduced chunk.

    Post the send and the receive of a step together (``dist.isend`` and ``dist.irecv``,
    then ``.wait()`` on both), receiving into a fresh buffer (``torch.empty_like``) that you
    then add: if every rank first waits for its blocking ``send`` to complete, no rank is
    receiving, and large messages deadlock.

    Checked on 2, 3 and 4 ranks with tensors of 21 (shape (3, 7)) and 13 elements in
    float64: the chunk must equal chunk r of ``dist.all_reduce`` to 1e-12 absolute and be
    written into the tensor.
    """
    from llmbook.scale.collectives import ring_reduce_scatter_

    chunk, _ = ring_reduce_scatter_(tensor)
    return chunk


def ring_all_gather(tensor: torch.Tensor) -> torch.Tensor:
    """Ring all-gather, in place: rank r contributes chunk r of ``tensor``; afterwards every
    rank's ``tensor`` holds every rank's chunk. Returns ``tensor``.

    Chunks as in :func:`ring_reduce_scatter` (``tensor.view(-1).tensor_split(p)``). At step
    s = 0, 1, ..., p - 2, rank r sends its chunk (r - s) mod p (the one it completed last) to
    the right neighbour and receives chunk (r - s - 1) mod p from the left neighbour,
    *overwriting* its own copy (received straight into the chunk's view is fine). Only chunk r
    of rank r is read at the start: the other chunks' values do not matter.

    Checked on 2, 3 and 4 ranks, float64, chunk sizes differing by one: the result must be
    exactly (bit for bit: nothing is added) the concatenation of each rank's own chunk, as
    ``dist.all_gather_object`` collects them.
    """
    from llmbook.scale.collectives import ring_all_gather_

    ring_all_gather_(tensor)
    return tensor


def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Ring all-reduce (sum), in place: every rank's ``tensor`` becomes the sum over ranks.
    Returns ``tensor``.

    :func:`ring_reduce_scatter` followed by :func:`ring_all_gather` on the same tensor. Each
    rank sends 2 (p - 1) messages of about n / p elements: 2 (p - 1) / p * n in all, whatever
    p, which is why the ring is the algorithm of choice for large tensors (chapter 22).

    Checked on 2, 3 and 4 ranks against ``dist.all_reduce``: float64 tensors of 13, 21 and
    100,003 elements (large enough that blocking sends in the wrong order deadlock) to 1e-12
    absolute, and a float32 tensor to 1e-5 relative. Every rank must end with the same result.
    """
    from llmbook.scale.collectives import ring_all_reduce_

    ring_all_reduce_(tensor)
    return tensor


def average_gradients(model: torch.nn.Module) -> None:
    """Replace every parameter's ``.grad`` by its mean over the ranks, with your ring all-reduce.

    Called on every rank after ``loss.backward()`` and before ``optimizer.step()``: rank r's
    gradients are those of the mean loss over its slice of the batch, and the mean of the p
    ranks' gradients is the gradient of the mean loss over the whole batch (the slices have
    equal sizes), so every rank then takes the same step and the replicas stay identical.
    Skip parameters whose ``.grad`` is None. Return nothing.

    Hint: one all-reduce of one flat buffer is faster than one per parameter (2 (p - 1)
    messages each): ``torch.cat`` the flattened gradients, call :func:`ring_all_reduce`,
    divide by p, and copy the slices back into the ``.grad`` tensors (as PyTorch's
    ``DistributedDataParallel`` does with its buckets).

    Checked end to end: three AdamW steps of the book's tiny transformer (float64) on 2 and
    3 ranks, each on its slice of a batch of 6 sequences, against one process on the whole
    batch (``llmbook.scale.data_parallel.train_single_process``): every rank's parameters to
    1e-10 absolute and the mean of the ranks' losses to 1e-12.
    """
    from llmbook.scale.collectives import ring_all_reduce_

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    ring_all_reduce_(flat)
    flat /= dist.get_world_size()
    for g, piece in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        g.copy_(piece.view_as(g))
