"""Reference solutions to the exercises of notebooks/24b_real_model_interpretability.

Checked by tests/test_solutions_24b.py.
"""

from __future__ import annotations

import sympy as sp
import torch
from torch import Tensor

from llmbook.scale.interpretability import (
    ffn_activations,
    ffn_keys_values,
    patch_residual,
    read_through_unembedding,
    residual_stream,
)
from llmbook.transformer.model import TransformerLM

# ---------------------------------------------------------------- exercise 1


def recovered_fraction(model: TransformerLM, clean: Tensor, corrupt: Tensor, good: int, bad: int) -> Tensor:
    """(L + 1, T): the share of the clean logit gap logit(good) - logit(bad) that patching
    each (site, position) of the clean residual stream into the corrupted run recovers."""
    effects, m_clean, m_corrupt = patch_residual(model, clean, corrupt, lambda z: z[:, good] - z[:, bad])
    return (effects - m_corrupt) / (m_clean - m_corrupt)


def move_site(recovered: Tensor, position: int = -1, threshold: float = 0.5) -> int:
    """The first site at which patching ``position`` recovers more than ``threshold``."""
    above = (recovered[:, position] > threshold).nonzero()
    if len(above) == 0:
        raise ValueError(f"position {position} never recovers more than {threshold}")
    return int(above[0])


def japan_spain(model: TransformerLM, tok) -> int:  # noqa: ANN001 - the book's ChatTokenizer
    """The exercise on the real model: the move site for Japan (Tokyo) patched into Spain
    (Madrid). (It is 24 on SmolLM2-135M-Instruct, as for France and Italy.)"""
    clean = torch.tensor([tok.encode("The capital of Japan is")])
    corrupt = torch.tensor([tok.encode("The capital of Spain is")])
    good, bad = tok.encode(" Tokyo")[0], tok.encode(" Madrid")[0]
    return move_site(recovered_fraction(model, clean, corrupt, good, bad))


# ---------------------------------------------------------------- exercise 2


def uniform_sink_score(T: int | None = None) -> sp.Expr:
    """The sink score of a head attending uniformly over its causal positions:
    (1 / (T - 1)) sum_{t=1}^{T-1} 1 / (t + 1) = (H_T - 1) / (T - 1); with ``T`` a number."""
    n = sp.Symbol("T", integer=True, positive=True)
    closed = (sp.harmonic(n) - 1) / (n - 1)
    return closed if T is None else sp.nsimplify(closed.subs(n, T))


def uniform_sink_score_sum(T: int) -> sp.Rational:
    """The same mean, summed term by term."""
    t = sp.Symbol("t", integer=True, positive=True)
    return sp.summation(1 / (t + 1), (t, 1, T - 1)) / (T - 1)


# ---------------------------------------------------------------- exercise 3


def logit_gap_split(model: TransformerLM, ids: Tensor, good: int, bad: int) -> dict[str, Tensor]:
    """The last block's FFN units' share of logit(good) - logit(bad) at the last position.

    The final stream is x_L = m + sum_i h_i v_i (m: the stream entering the last FFN), and the
    logits are W_U (g * x_L) / rms(x_L), so gap * rms = read(m) + sum_i h_i read(v_i), with
    read the difference of the two unembedding rows after the gain. Returns ``gap``, ``rms``,
    ``rest`` (read(m)) and ``units`` (d_ff,), the h_i read(v_i).
    """
    L = model.config.n_layers
    x_L = residual_stream(model, ids)[-1, 0, -1]  # (d,)
    h = ffn_activations(model, ids, L - 1)[0, -1]  # (d_ff,)
    values = ffn_keys_values(model, L - 1)["values"]  # (d_ff, d)
    pair = torch.tensor([good, bad])
    read_v = read_through_unembedding(model, values, pair)  # (d_ff, 2)
    rest = x_L - h @ values
    read_m = read_through_unembedding(model, rest, pair)
    with torch.no_grad():
        logits = model(ids)[0, -1]
    rms = (x_L.pow(2).mean() + model.final_norm.eps).sqrt()
    return {"gap": logits[good] - logits[bad], "rms": rms, "rest": read_m[0] - read_m[1],
            "units": h * (read_v[:, 0] - read_v[:, 1])}


def top_writer(model: TransformerLM, ids: Tensor, good: int, bad: int) -> int:
    """The unit of the last block's FFN that adds most to logit(good) - logit(bad)."""
    return int(logit_gap_split(model, ids, good, bad)["units"].argmax())
