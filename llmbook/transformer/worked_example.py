"""The published worked example's feed-forward step (chapter 6), built once for every chapter.

The source of ``data/worked_examples/the_cat_sat.json`` applies its feed-forward layer to the
raw embedding of "sat" alone: h = W1 x + b1, ReLU, W2 h + b2, then the residual and a
LayerNorm with the population variance, gamma = 1, beta = 0 and eps = 0, whose output
``h_last`` feeds the output matrix. Chapter 6 grades that step; chapters 7 (logits and
cross-entropy) and 12 (temperature, top-k, top-p) start from its ``h_last`` and logits, and
``tests/test_worked_example.py`` pins them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from llmbook.text.worked_example import WorkedExample
from llmbook.transformer.layers import MLP, LayerNorm

__all__ = ["ffn_step"]


def ffn_step(example: WorkedExample) -> dict[str, Tensor]:
    """The source's step, computed with the book's ``MLP`` (ReLU) and ``LayerNorm`` (eps 0).

    Returns float64 tensors: ``"x"`` (4,) the embedding of the last input token,
    ``"pre_activation"`` (3,) = W1 x + b1, ``"ffn_out"`` (4,), ``"residual"`` (4,) = x +
    FFN(x), its ``"mean"`` and population ``"variance"`` (scalars), ``"h_last"`` (4,) the
    LayerNorm output, and ``"logits"`` (5,) = W_out h_last.
    """
    if not isinstance(example, WorkedExample):
        raise TypeError(f"example must be a WorkedExample (load_the_cat_sat()), got "
                        f"{type(example).__name__}")
    w = example.inputs
    d_ff, d = w["W1"].shape
    ffn = MLP(d, d_ff, activation="relu", dtype=torch.float64)  # fc.weight = W1, proj.weight = W2
    norm = LayerNorm(d, eps=0.0, dtype=torch.float64)  # gamma = 1, beta = 0 at initialisation
    with torch.no_grad():
        for lin, w_name, b_name in ((ffn.fc, "W1", "b1"), (ffn.proj, "W2", "b2")):
            lin.weight.copy_(w[w_name])
            lin.bias.copy_(w[b_name])
        x = w["E"][example.input_ids[-1]]  # (d,): the embedding of "sat"
        ffn_out = ffn(x)  # (d,)
        residual = x + ffn_out  # (d,)
        mean = residual.mean()
        h_last = norm(residual)  # (d,)
        return {"x": x, "pre_activation": ffn.fc(x), "ffn_out": ffn_out, "residual": residual,
                "mean": mean, "variance": (residual - mean).pow(2).mean(),  # as LayerNorm uses
                "h_last": h_last, "logits": w["W_out"] @ h_last}  # (5,)
