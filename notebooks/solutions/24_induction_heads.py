"""Reference solutions to the exercises of notebooks/24_induction_heads.

Checked by tests/test_solutions_24.py.
"""

from __future__ import annotations

import sympy as sp
import torch

from llmbook.scale.induction import AttentionOnlyTransformer, per_position_loss, repeated_tokens
from llmbook.scale.interpretability import induction_circuit, repeat_mask

# ---------------------------------------------------------------- exercise 1


def positional_copier(vocab_size: int, segment_length: int, beta: float = 20.0) -> AttentionOnlyTransformer:
    """A one-layer attention-only model that copies the token at t - L + 1 (float64).

    Residual blocks: token (V), position (T = 2L), output (V). The head's query is beta times
    the one-hot of t, its key the one-hot of s + L - 1, so the score beta [s = t - L + 1] picks
    the token that followed the previous occurrence, *if* the segment length is L; the value
    copies the token into the output block, which the unembedding reads.
    """
    V, L = vocab_size, segment_length
    T = 2 * L
    d, n = 2 * V + T, max(V, T)
    model = AttentionOnlyTransformer(V, d, 1, 1, T, d_head=n, positions="learned").double()
    attn = model.layers[0]
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.embed.weight[:, :V] = torch.eye(V, dtype=torch.float64)
        model.pos.weight[:, V:V + T] = torch.eye(T, dtype=torch.float64)
        attn.q_proj.weight[:T, V:V + T] = beta / attn.scale * torch.eye(T, dtype=torch.float64)
        for s in range(T - L + 1):  # key of position s: the one-hot of s + L - 1
            attn.k_proj.weight[s + L - 1, V + s] = 1.0
        attn.v_proj.weight[:V, :V] = torch.eye(V, dtype=torch.float64)
        attn.o_proj.weight[V + T:, :V] = torch.eye(V, dtype=torch.float64)
        model.unembed.weight[:, V + T:] = beta * torch.eye(V, dtype=torch.float64)
    return model.eval()


def repeat_accuracy(model: AttentionOnlyTransformer, segment_length: int, vocab_size: int,
                    seed: int = 0, batch_size: int = 200) -> float:
    """Fraction of the predictable repeated tokens that ``model`` predicts (argmax)."""
    ids = repeated_tokens(batch_size, segment_length, vocab_size, torch.Generator().manual_seed(seed),
                          distinct=True)
    with torch.no_grad():
        pred = model(ids)[:, :-1].argmax(-1)
    return float((pred == ids[:, 1:])[:, repeat_mask(segment_length)].double().mean())


# ---------------------------------------------------------------- exercise 2


def uniform_previous_token_score_sum(T: int | sp.Symbol) -> sp.Expr:
    """Previous-token score of a uniform causal head, as the sum (1/(T-1)) sum_{t=1}^{T-1} 1/(t+1).

    Query t attends 1/(t+1) to each of its t + 1 keys, t - 1 among them.
    """
    t = sp.Symbol("t", integer=True, positive=True)
    return sp.summation(1 / (t + 1), (t, 1, T - 1)) / (T - 1)


def uniform_previous_token_score(T: int | sp.Symbol | None = None) -> sp.Expr:
    """The closed form (H_T - 1) / (T - 1), H_T = 1 + 1/2 + ... + 1/T the harmonic number:
    the sum of 1/(t+1) for t = 1..T-1 is H_T minus its first term. Exact for an int T."""
    T = sp.Symbol("T", integer=True, positive=True) if T is None else T
    return (sp.harmonic(T) - 1) / (T - 1)


# ---------------------------------------------------------------- exercise 3


def hand_circuit_repeat_loss(beta: float, vocab_size: int = 16, segment_length: int = 12,
                             seed: int = 5) -> float:
    """Mean loss of the hand-built circuit on the predictable repeated tokens (float64)."""
    ids = repeated_tokens(200, segment_length, vocab_size, torch.Generator().manual_seed(seed), distinct=True)
    model = induction_circuit(vocab_size, 2 * segment_length, beta=beta)
    with torch.no_grad():
        loss = per_position_loss(model(ids), ids)
    return float(loss[:, repeat_mask(segment_length)].mean())


def min_beta(target: float = 1e-2, vocab_size: int = 16, segment_length: int = 12,
             lo: float = 0.5, hi: float = 40.0, iterations: int = 40) -> float:
    """Smallest beta with ``hand_circuit_repeat_loss(beta) <= target``, by bisection.

    The loss falls monotonically in beta (both softmaxes sharpen), so bisection applies.
    """
    if not hand_circuit_repeat_loss(hi, vocab_size, segment_length) <= target:
        raise ValueError(f"even beta={hi} does not reach a loss of {target}")
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if hand_circuit_repeat_loss(mid, vocab_size, segment_length) <= target:
            hi = mid
        else:
            lo = mid
    return hi


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))
