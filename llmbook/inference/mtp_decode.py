"""Self-speculative decoding with the extra heads of a multi-token model.

Introduced in notebooks/12b_multi_token_prediction. A model trained with n future-token
heads (:class:`~llmbook.training.mtp.ParallelMTP`) can draft its own continuation: at the
last position j of the text, head 1 gives the model's own next-token distribution
p(. | x_{<=j}), from which x_{j+1} is drawn exactly, and heads 2..n give draft
distributions q_k(. | x_{<=j}) for x_{j+k}, from which draft tokens are drawn. The next
forward pass reads x_{j+1} and the drafts, and head 1 at each of their positions scores the
following draft: chapter 12's rule accepts draft d with probability
min(1, p(d) / q(d)) and on the first rejection draws from norm(max(0, p - q)) (Leviathan
et al., 2023; Chen et al., 2023). Gloeckle et al. (2024, section 3.2) and Stern et al.
(2018, "Blockwise Parallel Decoding for Deep Autoregressive Models") decode this way.

Every pass yields 1 to n tokens, and the tokens are distributed exactly as sampling
from the next-token model ``model.lm`` alone (with ``temperature=0``: the same tokens as
its greedy decoding). :func:`continuation_distribution` computes the exact distribution of
short continuations by enumeration to test that, :func:`pooled_chi_square` is chapter 12's
chi-square test with rare outcomes pooled, and :func:`ideal_acceptance_rate` the acceptance
rate that perfect heads would reach on the synthetic Markov source.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import Tensor

from llmbook.inference.sampling import SpeculativeStats, chi_square_test, residual_distribution
from llmbook.text.data import MarkovSource
from llmbook.training.mtp import ParallelMTP, future_token_table
from llmbook.validation import check_nonnegative_number, check_positive_int

__all__ = [
    "BatchSpeculativeStats",
    "continuation_distribution",
    "ideal_acceptance_rate",
    "pooled_chi_square",
    "self_speculative_batch",
    "self_speculative_generate",
]


def _check_prompt(model: object, prompt_ids: object) -> Tensor:
    if not isinstance(model, ParallelMTP):
        raise TypeError(f"model must be a ParallelMTP, got {type(model).__name__}")
    if not isinstance(prompt_ids, Tensor) or prompt_ids.ndim != 2 or prompt_ids.shape[0] != 1 \
            or prompt_ids.shape[1] == 0 or prompt_ids.dtype not in (torch.int64, torch.int32):
        got = (tuple(prompt_ids.shape), prompt_ids.dtype) if isinstance(prompt_ids, Tensor) \
            else type(prompt_ids).__name__
        raise ValueError(f"prompt_ids must be integer ids of shape (1, T) with T >= 1, got {got}")
    return prompt_ids.long()


def _distributions(logits: Tensor, temperature: float) -> Tensor:
    """Logits (..., V) -> float64 probabilities at ``temperature``; one-hot argmax at 0."""
    z = logits.double()
    if temperature == 0:
        return torch.nn.functional.one_hot(z.argmax(-1), z.shape[-1]).double()
    return torch.softmax(z / temperature, dim=-1)


@torch.no_grad()
def self_speculative_generate(model: ParallelMTP, prompt_ids: Tensor, max_new_tokens: int,
                              n_draft: int | None = None, temperature: float = 1.0,
                              generator: torch.Generator | None = None,
                              ) -> tuple[Tensor, SpeculativeStats]:
    """Sample ``max_new_tokens`` tokens from ``model.lm``, drafting with the model's extra heads.

    ``prompt_ids`` (1, T). Each forward pass of the whole model reads the accepted text and
    the pending drafts; head 1 verifies the drafts left to right (accept d with probability
    min(1, p(d)/q(d)), tested as u q(d) < p(d)); after the last accepted position j one
    exact token is drawn, from p(. | x_{<=j}) or, after a rejection, from the residual
    norm(max(0, p - q)); heads 2..1+``n_draft`` at j propose the next drafts (default: all
    n - 1 extra heads). ``temperature`` applies to every head; 0 is greedy (drafts are the
    heads' argmax, accepted when they equal head 1's). Returns ids (1, T + max_new_tokens)
    and the :class:`~llmbook.inference.sampling.SpeculativeStats` of every pass
    (``proposed``: drafts scored, ``accepted``: drafts kept; the first pass has none), so
    ``sum(stats.tokens_per_step) == max_new_tokens``. The model must fit the whole output
    in ``max_seq_len``.
    """
    ids = _check_prompt(model, prompt_ids)
    max_new_tokens = check_positive_int("max_new_tokens", max_new_tokens)
    n_draft = model.n_future - 1 if n_draft is None else n_draft
    if isinstance(n_draft, bool) or not isinstance(n_draft, int) or not 0 <= n_draft < model.n_future:
        raise ValueError(f"n_draft must be an int in [0, {model.n_future - 1}] (the extra heads), "
                         f"got {n_draft!r}")
    temperature = check_nonnegative_number("temperature", temperature)
    T_end = ids.shape[1] + max_new_tokens
    if T_end > model.config.max_seq_len:
        raise ValueError(f"prompt + max_new_tokens = {T_end} exceed max_seq_len={model.config.max_seq_len}")
    was_training = model.training
    model.eval()
    stats = SpeculativeStats()
    drafts: list[int] = []
    qs: list[Tensor] = []
    try:
        while ids.shape[1] < T_end:
            T = ids.shape[1]
            seq = torch.cat([ids, torch.tensor([drafts], dtype=torch.long)], dim=1)
            probs = _distributions(model(seq)[:, 0], temperature)  # (n, T + g, V)
            n_ok = 0
            for i, d in enumerate(drafts):  # draft i sits at position T + i, scored at T + i - 1
                p = probs[0, T + i - 1]
                u = torch.rand((), generator=generator, dtype=torch.float64)
                if u * qs[i][d] < p[d]:
                    n_ok += 1
                else:
                    break
            j = T + n_ok - 1  # the last accepted position
            p = probs[0, j]
            if n_ok < len(drafts):  # a rejection: draw from the residual
                dist = p if temperature == 0 else residual_distribution(p, qs[n_ok])
            else:
                dist = p
            token = int(torch.multinomial(dist, 1, generator=generator))
            new = drafts[:n_ok] + [token]
            ids = torch.cat([ids, torch.tensor([new], dtype=torch.long)], dim=1)
            stats.proposed.append(len(drafts))
            stats.accepted.append(n_ok)
            room = T_end - ids.shape[1] - 1  # leave a place for the next pass's exact token
            g = max(min(n_draft, room), 0)
            qs = [probs[k, j] for k in range(1, 1 + g)]  # head k + 1 at j drafts x_{j+k+1}
            drafts = [int(torch.multinomial(q, 1, generator=generator)) for q in qs]
    finally:
        model.train(was_training)
    return ids, stats


@dataclass
class BatchSpeculativeStats:
    """What :func:`self_speculative_batch` counted: ``passes`` (B,) forward passes per
    sequence; per draft slot i (the draft of head i + 2), ``reached`` (G,) how often it was
    scored (every earlier draft of its pass accepted) and ``accepted`` (G,) how often kept."""

    passes: Tensor
    reached: Tensor
    accepted: Tensor
    new_tokens: int

    @property
    def tokens_per_pass(self) -> float:
        """New tokens per forward pass of the model, over all sequences."""
        return self.new_tokens * self.passes.shape[0] / float(self.passes.sum())

    @property
    def acceptance(self) -> list[float]:
        """Per slot: accepted / reached (the acceptance rate given that the slot was scored)."""
        return [a / r if r else float("nan") for a, r in zip(self.accepted.tolist(), self.reached.tolist(),
                                                          strict=True)]


@torch.no_grad()
def self_speculative_batch(model: ParallelMTP, prompt_ids: Tensor, max_new_tokens: int,
                           num_samples: int, n_draft: int | None = None,
                           temperature: float = 1.0, generator: torch.Generator | None = None,
                           ) -> tuple[Tensor, BatchSpeculativeStats]:
    """:func:`self_speculative_generate` for ``num_samples`` independent sequences at once.

    The same rule, vectorised: all sequences start from ``prompt_ids`` (1, T); each pass runs
    the model once on a (B, L) batch of accepted tokens plus drafts, right-padded (causal
    attention keeps padding from reaching earlier positions), and every sequence accepts,
    resamples and drafts on its own. Sequences that are complete stop drafting. Returns
    ids (B, T + max_new_tokens) and :class:`BatchSpeculativeStats`.
    """
    ids = _check_prompt(model, prompt_ids)
    max_new_tokens = check_positive_int("max_new_tokens", max_new_tokens)
    B = check_positive_int("num_samples", num_samples)
    n_draft = model.n_future - 1 if n_draft is None else n_draft
    if isinstance(n_draft, bool) or not isinstance(n_draft, int) or not 0 <= n_draft < model.n_future:
        raise ValueError(f"n_draft must be an int in [0, {model.n_future - 1}] (the extra heads), "
                         f"got {n_draft!r}")
    temperature = check_nonnegative_number("temperature", temperature)
    T0, G, V = ids.shape[1], n_draft, model.config.vocab_size
    T_end = T0 + max_new_tokens
    if T_end > model.config.max_seq_len:
        raise ValueError(f"prompt + max_new_tokens = {T_end} exceed max_seq_len={model.config.max_seq_len}")
    out = torch.zeros(B, T_end + G, dtype=torch.long)  # accepted tokens, then drafts
    out[:, :T0] = ids
    length = torch.full((B,), T0)  # accepted tokens per sequence
    g = torch.zeros(B, dtype=torch.long)  # drafts pending per sequence
    qs = torch.zeros(B, max(G, 1), V, dtype=torch.float64)  # their draft distributions
    passes = torch.zeros(B, dtype=torch.long)
    reached = torch.zeros(max(G, 1), dtype=torch.long)
    accepted = torch.zeros(max(G, 1), dtype=torch.long)
    was_training = model.training
    model.eval()
    try:
        while bool((length < T_end).any()):
            live = torch.nonzero(length < T_end)[:, 0]  # (b,)
            L = int((length[live] + g[live]).max())
            probs = _distributions(model(out[live, :L]), temperature)  # (n, b, L, V)
            T, gl, r = length[live], g[live], torch.arange(live.shape[0])
            n_ok = torch.zeros_like(T)
            still = torch.ones_like(T, dtype=torch.bool)
            for i in range(G):  # slot i: the draft at T + i, scored by head 1 at T + i - 1
                scored = still & (gl > i)
                d = out[live, (T + i).clamp(max=out.shape[1] - 1)]
                p_d = probs[0, r, (T + i - 1).clamp(max=L - 1), d]
                u = torch.rand(live.shape[0], generator=generator, dtype=torch.float64)
                ok = scored & (u * qs[live, i, :].gather(1, d[:, None])[:, 0] < p_d)
                reached[i] += int(scored.sum())
                accepted[i] += int(ok.sum())
                n_ok += ok.long()
                still = ok
            j = T + n_ok - 1  # the last accepted position of each sequence
            p = probs[0, r, j]  # (b, V)
            rejected = n_ok < gl
            if G and temperature > 0:
                q_rej = qs[live, n_ok.clamp(max=G - 1)]
                p = torch.where(rejected[:, None], residual_distribution(p, q_rej), p)
            token = torch.multinomial(p, 1, generator=generator)[:, 0]  # (b,)
            out[live, T + n_ok] = token
            length[live] = T + n_ok + 1
            passes[live] += 1
            room = (T_end - length[live] - 1).clamp(min=0)  # a place for the exact token
            g[live] = room.clamp(max=G)
            for i in range(G):  # head i + 2 at j drafts the token at j + i + 2
                q = probs[i + 1, r, j]  # (b, V)
                qs[live, i] = q
                out[live, length[live] + i] = torch.multinomial(q, 1, generator=generator)[:, 0]
    finally:
        model.train(was_training)
    stats = BatchSpeculativeStats(passes, reached[:G], accepted[:G], max_new_tokens)
    return out[:, :T_end], stats


@torch.no_grad()
def continuation_distribution(model: ParallelMTP, prompt_ids: Tensor, length: int,
                              temperature: float = 1.0) -> Tensor:
    """The exact distribution of the next ``length`` tokens under ``model.lm``: (V**length,).

    Entry c = sum_i x_i V^{length-1-i} is P(x_1..x_length | prompt) = prod_i p(x_i | prompt,
    x_{<i}), computed by enumerating every continuation (one batched forward pass per
    length). Meant for short continuations (V**length up to about a million).
    """
    ids = _check_prompt(model, prompt_ids)
    length = check_positive_int("length", length)
    temperature = check_nonnegative_number("temperature", temperature)
    V = model.config.vocab_size
    if V ** length > 2**20:
        raise ValueError(f"V**length = {V ** length} continuations are too many to enumerate")
    conts = torch.tensor(list(itertools.product(range(V), repeat=length)), dtype=torch.long)  # (V^l, l)
    seqs = torch.cat([ids.expand(conts.shape[0], -1), conts], dim=1)  # (V^l, T + l)
    was_training = model.training
    model.eval()
    try:
        probs = _distributions(model.lm(seqs[:, :-1]), temperature)  # (V^l, T + l - 1, V)
    finally:
        model.train(was_training)
    T = ids.shape[1]
    steps = probs[:, T - 1 :].gather(-1, conts[..., None])[..., 0]  # (V^l, l)
    return steps.prod(dim=1)


def pooled_chi_square(samples: Tensor, probs: Tensor, min_expected: float = 5.0
                      ) -> tuple[float, int, float]:
    """Chapter 12's :func:`~llmbook.inference.sampling.chi_square_test` after pooling the
    outcomes whose expected count N probs is below ``min_expected`` into one cell.

    Pearson's statistic is close to chi-square only when every expected count is a few
    or more; pooling rare outcomes keeps the test valid. ``samples`` (N,) outcome indices,
    ``probs`` (K,). Returns (X^2, degrees of freedom, p-value).
    """
    if not isinstance(samples, Tensor) or samples.ndim != 1 or samples.dtype not in (torch.int64, torch.int32):
        raise ValueError("samples must be a 1-D integer tensor of outcome indices")
    if not isinstance(probs, Tensor) or probs.ndim != 1:
        raise ValueError("probs must be a 1-D tensor of probabilities")
    min_expected = check_nonnegative_number("min_expected", min_expected)
    if samples.numel() and (int(samples.min()) < 0 or int(samples.max()) >= probs.shape[0]):
        raise ValueError(f"samples must lie in [0, {probs.shape[0]}), got {int(samples.min())}.."
                         f"{int(samples.max())}")
    rare = samples.shape[0] * probs.double() < min_expected  # (K,)
    if not bool(rare.any()):
        cells, pooled = samples.long(), probs.double()
    else:
        keep = torch.nonzero(~rare)[:, 0]
        index = torch.full((probs.shape[0],), keep.shape[0], dtype=torch.long)  # rare -> last cell
        index[keep] = torch.arange(keep.shape[0])
        cells = index[samples.long()]
        pooled = torch.cat([probs.double()[keep], probs.double()[rare].sum()[None]])
        pooled = pooled / pooled.sum()
    return chi_square_test(cells, pooled)


def ideal_acceptance_rate(source: MarkovSource, k: int) -> float:
    """Acceptance rate of a perfect head k on the Markov source, drafts verified by the source.

    The draft for x_{t+k} is drawn from the true q = P(x_{t+k} | context at t) and verified
    with p = P(x_{t+k} | context at t + k - 1): the expected sum_x min(p(x), q(x)) over the
    stationary context at t and the k - 1 tokens in between (k >= 2). This is the ceiling a
    trained head k approaches, for drafts that reach position k.
    """
    if not isinstance(source, MarkovSource):
        raise TypeError(f"source must be a MarkovSource, got {type(source).__name__}")
    k = check_positive_int("k", k)
    if k < 2:
        raise ValueError(f"k must be >= 2 (head 1 is the verifier itself), got {k}")
    q = future_token_table(source, k)  # (C, V)
    C, V = source.num_contexts, source.vocab_size
    step = torch.zeros(C, C, dtype=torch.float64)
    nxt = (torch.arange(C)[:, None] % (C // V)) * V + torch.arange(V)[None, :]
    step.scatter_add_(1, nxt, source.transition)
    reach = torch.linalg.matrix_power(step, k - 1)  # (C, C'): context at t + k - 1 given c
    overlap = torch.minimum(source.transition[None, :, :], q[:, None, :]).sum(-1)  # (C, C')
    return float((source.stationary[:, None] * reach * overlap).sum())
