"""Reference solutions to the exercises of notebooks/07_decoder (checked by tests/test_solutions_07.py)."""

from __future__ import annotations

import dataclasses
import math

import sympy as sp
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from llmbook.text.functional import cross_entropy
from llmbook.transformer.model import TransformerLM
from llmbook.transformer.positional import rope_permutation
from llmbook.transformer.sizing import flops_shares


def width_for_budget(n_params: int = 350_000_000, n_layers: int = 24, vocab_size: int = 50257,
                     max_seq_len: int = 1024, multiple: int = 64) -> tuple[float, int]:
    """Exercise 1: the width d of a GPT-2-style model with ``n_params`` parameters.

    Solves 12 L d^2 + 13 L d + V d + T_max d + 2 d = N (section 7.3) for its positive root
    and rounds it to the nearest multiple of ``multiple``. Returns (exact root, rounded d).
    """
    d = sp.Symbol("d", positive=True)
    L, V, T_max = n_layers, vocab_size, max_seq_len
    N = 12 * L * d**2 + 13 * L * d + V * d + T_max * d + 2 * d
    (root,) = sp.solve(sp.Eq(N, n_params), d)
    exact = float(root)
    return exact, multiple * round(exact / multiple)


def interleave_rope(model: TransformerLM) -> TransformerLM:
    """Exercise 2: an equal model whose RoPE pairs (x_0, x_1), (x_2, x_3), ... .

    The half-split layout pairs (x_j, x_{j + d_h/2}). With perm = rope_permutation(d_h),
    q[perm] is in the interleaved layout, so permuting the rows of W_Q and W_K (and their
    biases) head by head gives queries and keys whose interleaved rotation is the
    half-split rotation, permuted; dot products ignore a common permutation, so the scores,
    and everything after them, are unchanged.
    """
    c = model.config
    if c.positions != "rope":
        raise ValueError(f"the model has positions={c.positions!r}, not 'rope'")
    if c.rope_interleaved:
        raise ValueError("the model already uses the interleaved pairing")
    new = TransformerLM(dataclasses.replace(c, rope_interleaved=True)).to(model.embed.weight.dtype)
    perm = rope_permutation(c.d_head)  # (d_h,)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for name, n_heads in (("q_proj", c.n_heads), ("k_proj", c.n_kv_heads)):
        rows = (torch.arange(n_heads)[:, None] * c.d_head + perm[None, :]).reshape(-1)  # (n d_h,)
        for key in [k for k in state if f"attn.{name}." in k]:
            state[key] = state[key][rows]
    new.load_state_dict(state)
    return new


def training_flops(model: TransformerLM, ids: torch.Tensor) -> tuple[int, int]:
    """Exercise 3: FlopCounterMode's count of (forward, forward + backward) on ``ids``.

    The loss is the next-token cross-entropy; the book's (unfused) attention is used so
    that the counter sees every product.
    """
    model.set_fused_attention(False)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(ids)
    forward = counter.get_total_flops()
    counter = FlopCounterMode(display=False)
    with counter:
        logits = model(ids)  # (B, T, V)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()
    model.zero_grad(set_to_none=True)
    return forward, counter.get_total_flops()


def attention_crossover(config) -> sp.Rational:
    """Exercise 4: the length T* at which the attention-score FLOPs (4 L T H d_h per token)
    equal all other forward FLOPs, which do not depend on T."""
    T = sp.Symbol("T", positive=True)
    rest = flops_shares(config, 1)
    others = rest["total"] - rest["attention_scores"]
    scores = 4 * T * config.n_layers * config.n_heads * config.d_head
    (T_star,) = sp.solve(sp.Eq(scores, others), T)
    return sp.nsimplify(T_star)


def uniform_bits_per_byte(text: str, tokenizer=None) -> tuple[float, float]:
    """Exercise 5: (perplexity per token, bits per byte) of the uniform model on ``text``.

    ``tokenizer=None`` means raw UTF-8 bytes (V = 256); otherwise a BPE tokenizer with a
    ``vocab`` dict and ``encode``. The loss of all-zero logits is computed with chapter 3's
    cross-entropy (it is log V per token)."""
    data = text.encode("utf-8")
    ids = list(data) if tokenizer is None else tokenizer.encode(text)
    V = 256 if tokenizer is None else len(tokenizer.vocab)
    logits = torch.zeros(len(ids), V, dtype=torch.float64)  # (n_tokens, V): knows nothing
    nats = cross_entropy(logits, torch.tensor(ids)).item()  # log V
    return math.exp(nats), nats * len(ids) / (len(data) * math.log(2))


def max_attention_score(model: TransformerLM, ids: torch.Tensor) -> float:
    """Exercise 6: the largest |q . k| * scale over every layer, head and causal pair.

    Walks the stream block by block as ``minimal_forward`` does, taking each layer's
    queries and keys from its own ``project_qkv`` (normalised first when the model has
    QK-norm, rotated by the model's RoPE)."""
    positions = torch.arange(ids.shape[1])  # (T,)
    x = model.embed.weight[ids]  # (B, T, d)
    T = ids.shape[1]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)  # (T, T): j > i
    largest = 0.0
    with torch.no_grad():
        for block in model.blocks:
            attn = block.attn
            q, k, _ = attn.project_qkv(block.attn_norm(x), positions, model.rope)  # (B, H | H_kv, T, d_h)
            k = k.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=-3)  # (B, H, T, d_h)
            scores = (q @ k.transpose(-1, -2) * attn.scale).masked_fill(future, 0.0)  # (B, H, T, T)
            largest = max(largest, float(scores.abs().max()))
            x = block(x, positions, model.rope)  # (B, T, d)
    return largest


def scale_queries_and_keys(model: TransformerLM, c: float) -> TransformerLM:
    """Exercise 6: a copy of ``model`` with every W_Q and W_K multiplied by ``c`` (what
    training can do to them: nothing in the loss holds their size down)."""
    scaled = dataclasses.replace(model.config)
    out = TransformerLM(scaled).to(model.embed.weight.dtype)
    out.load_state_dict(model.state_dict())
    with torch.no_grad():
        for block in out.blocks:
            block.attn.q_proj.weight.mul_(c)
            block.attn.k_proj.weight.mul_(c)
    return out


def softcap_loss_bound(vocab_size: int, cap: float) -> float:
    """Exercise 7: the largest cross-entropy a model whose logits lie in (-cap, cap) can have.

    ell = log sum_v exp(z_v) - z_y < log(V exp(cap)) + cap = log V + 2 cap, whatever the weights."""
    return math.log(vocab_size) + 2 * cap


def worst_token_loss(model: TransformerLM, ids: torch.Tensor, targets: torch.Tensor) -> float:
    """Exercise 7: the largest per-token cross-entropy (nats) of ``model`` on ``ids`` (B, T)
    with ``targets`` (B, T), computed in float64."""
    with torch.no_grad():
        z = model(ids).double()  # (B, T, V)
    return F.cross_entropy(z.flatten(0, 1), targets.flatten(), reduction="none").max().item()


def scale_output_layer(model: TransformerLM, c: float, final_softcap: float | None) -> TransformerLM:
    """Exercise 7: a copy of ``model`` with the output matrix (E when tied) times ``c`` and the
    final soft-cap set to ``final_softcap`` (None: none)."""
    out = TransformerLM(dataclasses.replace(model.config, final_softcap=final_softcap)).to(model.embed.weight.dtype)
    out.load_state_dict(model.state_dict())
    with torch.no_grad():
        (out.embed if out.lm_head is None else out.lm_head).weight.mul_(c)
    return out


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))
