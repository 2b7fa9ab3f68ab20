"""Multi-token prediction: several future tokens from one trunk, and the loss that trains them.

Introduced in notebooks/12b_multi_token_prediction. A next-token model learns
p(x_{t+1} | x_{<=t}); a multi-token model also predicts x_{t+2}, ..., x_{t+n} from the same
prefix, and is trained on the sum of the heads' cross-entropies

    L = - sum_{k=1..n} log p^{(k)}(x_{t+k} | x_{<=t})    (per position t, averaged over t).

Two designs, both built from the book's transformer (chapter 7):

* :class:`ParallelMTP` (Gloeckle et al., 2024, "Better & Faster Large Language Models via
  Multi-token Prediction", arXiv 2404.19737, section 2): a shared trunk of L - 1 blocks and
  n independent heads, each one transformer block, followed by the shared final norm and
  unembedding. Head 1 with the trunk *is* an ordinary L-block :class:`TransformerLM`
  (``model.lm``), so the next-token model can be evaluated and decoded on its own.
* :class:`SequentialMTP` (DeepSeek-AI, 2024, "DeepSeek-V3 Technical Report",
  arXiv 2412.19437, section 2.2): the main model plus D modules in a chain; module k
  combines RMSNorm(h^{k-1}_i) and RMSNorm(Emb(t_{i+k})) by concatenation and a projection
  M_k (2d -> d), runs one transformer block and predicts t_{i+k+1} with the shared output
  head; the loss is L_main + (lambda / D) sum_k L_MTP^k.

:func:`get_mtp_batch` cuts the windows (input plus n shifted targets), :func:`multi_token_loss`
sums the heads' losses, :func:`train_mtp` is chapter 10's loop for these models,
:func:`evaluate_heads` the per-head validation loss. For the synthetic Markov source
:func:`future_token_table` and :func:`head_entropy_floors` give the exact distribution of
x_{t+k} given the context and the floor of each head's loss.
:func:`mtp_gradient_symbolic` derives the gradient of L with SymPy.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sympy as sp
import torch
from torch import Tensor, nn

from llmbook.text.data import MarkovSource
from llmbook.text.functional import cross_entropy
from llmbook.training.optim import AdamW, clip_grad_norm_, cosine_schedule, set_lr
from llmbook.training.train import TrainConfig, get_batch, param_groups
from llmbook.transformer.layers import RMSNorm
from llmbook.transformer.model import DecoderBlock, TransformerConfig, TransformerLM, _make_norm
from llmbook.validation import check_nonnegative_number, check_positive_int

__all__ = [
    "MTPHistory",
    "ParallelMTP",
    "SequentialMTP",
    "deepseek_weights",
    "evaluate_heads",
    "future_token_table",
    "get_mtp_batch",
    "head_entropy_floors",
    "load_shipped_mtp",
    "mtp_gradient_symbolic",
    "multi_token_loss",
    "train_mtp",
]


@torch.no_grad()
def _init_block(block: nn.Module, config: TransformerConfig, generator: torch.Generator | None) -> None:
    """GPT-2's initialisation of a block added to an L-block model (as TransformerLM's)."""
    s = config.init_std
    residual_std = s / math.sqrt(2 * config.n_layers)
    for name, p in block.named_parameters():
        if name.endswith("bias"):
            p.zero_()
        elif p.ndim == 1:
            p.fill_(1.0)
        elif name.endswith(("o_proj.weight", "mlp.proj.weight", "down_proj.weight")):
            p.normal_(0.0, residual_std, generator=generator)
        else:
            p.normal_(0.0, s, generator=generator)


def _embed(lm: TransformerLM, ids: Tensor) -> tuple[Tensor, Tensor]:
    """Checked ids (B, T) -> (x_0 = E[ids] (+ P), positions (T,))."""
    positions = lm._check_inputs(ids, None)  # (T,)
    x = lm.embed.weight[ids]  # (B, T, d)
    if lm.pos_embed is not None:
        x = x + lm.pos_embed.weight[positions]
    return x, positions


def _unembed(lm: TransformerLM, h: Tensor) -> Tensor:
    """Shared output head: normed hidden states (..., d) -> logits (..., V)."""
    w_out = lm.embed.weight if lm.lm_head is None else lm.lm_head.weight  # (V, d)
    return h @ w_out.T


class ParallelMTP(nn.Module):
    """n future-token heads on a shared trunk (Gloeckle et al., 2024, section 2).

    ``config`` describes the next-token model: ``config.n_layers`` = L blocks, of which the
    first L - 1 form the shared trunk and the last is head 1. Heads 2..n (``extra_heads``)
    are further :class:`~llmbook.transformer.model.DecoderBlock` s reading the trunk's
    output; every head ends in the shared final norm and unembedding. So ``model.lm`` is an
    ordinary :class:`~llmbook.transformer.model.TransformerLM`, the next-token model, and
    ``forward`` returns logits of shape (n, B, T, V): entry k - 1 predicts x_{t+k}.
    """

    def __init__(self, config: TransformerConfig, n_future: int,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
        self.n_future = check_positive_int("n_future", n_future)
        self.config = config
        self.lm = TransformerLM(config, generator=generator)
        self.extra_heads = nn.ModuleList(DecoderBlock(config) for _ in range(n_future - 1))
        for block in self.extra_heads:
            _init_block(block, config, generator)

    def trunk(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """The shared trunk: ids (B, T) -> (residual stream after L - 1 blocks (B, T, d), positions)."""
        x, positions = _embed(self.lm, ids)
        for block in self.lm.blocks[:-1]:
            x = block(x, positions, self.lm.rope)  # (B, T, d)
        return x, positions

    def forward(self, ids: Tensor) -> Tensor:
        """Logits of every head: ids (B, T) -> (n, B, T, V); [k - 1] predicts x_{t+k}."""
        z, positions = self.trunk(ids)  # (B, T, d)
        heads = [self.lm.blocks[-1], *self.extra_heads]
        return torch.stack([_unembed(self.lm, self.lm.final_norm(head(z, positions, self.lm.rope)))
                            for head in heads])  # (n, B, T, V)

    def input_length(self, context_length: int) -> int:
        """Tokens of the window that ``forward`` reads: the T input positions."""
        return context_length


class MTPModule(nn.Module):
    """DeepSeek-V3's MTP module k (section 2.2): (h^{k-1}, Emb(t_{i+k})) -> h^k.

    h'_i = M_k [RMSNorm(h^{k-1}_i); RMSNorm(Emb(t_{i+k}))]  (M_k: 2d -> d, no bias),
    h^k = TRM_k(h'), a causal transformer block; ``out_norm`` normalises h^k for the
    shared output head. Shapes (B, T, d), (B, T, d) -> (B, T, d).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        d = config.d_model
        self.h_norm = RMSNorm(d, eps=config.norm_eps)
        self.e_norm = RMSNorm(d, eps=config.norm_eps)
        self.proj = nn.Linear(2 * d, d, bias=False)
        self.block = DecoderBlock(config)
        self.out_norm = _make_norm(config)

    def forward(self, h: Tensor, e: Tensor, positions: Tensor, rope: Any) -> Tensor:
        x = self.proj(torch.cat([self.h_norm(h), self.e_norm(e)], dim=-1))  # (B, T, d)
        return self.block(x, positions, rope)  # (B, T, d)


class SequentialMTP(nn.Module):
    """The main model and D sequential MTP modules (DeepSeek-AI, 2024, section 2.2).

    ``forward(ids)`` takes ids of shape (B, T + D): the main model reads the first T,
    module k also embeds ids[:, k : k + T] (the tokens t_{i+k}), and the result is the
    logits (1 + D, B, T, V): [0] the main model's next-token logits, [k] module k's
    prediction of t_{i+k+1}. The embedding and the output head are the main model's
    (shared); ``model.lm`` is the main model, an ordinary TransformerLM.
    """

    def __init__(self, config: TransformerConfig, depth: int,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
        self.depth = check_positive_int("depth", depth)
        self.n_future = depth + 1
        self.config = config
        self.lm = TransformerLM(config, generator=generator)
        self.modules_mtp = nn.ModuleList(MTPModule(config) for _ in range(depth))
        for module in self.modules_mtp:
            _init_block(module, config, generator)

    def forward(self, ids: Tensor) -> Tensor:
        """ids (B, T + D) -> logits (1 + D, B, T, V)."""
        if not isinstance(ids, Tensor) or ids.ndim != 2 or ids.shape[1] <= self.depth:
            got = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
            raise ValueError(f"ids must have shape (B, T + D) with T >= 1 and D = {self.depth}, got {got}")
        T = ids.shape[1] - self.depth
        lm = self.lm
        x, positions = _embed(lm, ids[:, :T])
        for block in lm.blocks:
            x = block(x, positions, lm.rope)  # (B, T, d): h^0, before the final norm
        logits = [_unembed(lm, lm.final_norm(x))]
        for k, module in enumerate(self.modules_mtp, start=1):
            e = lm.embed.weight[ids[:, k : k + T]]  # (B, T, d): Emb(t_{i+k})
            x = module(x, e, positions, lm.rope)  # (B, T, d): h^k
            logits.append(_unembed(lm, module.out_norm(x)))
        return torch.stack(logits)  # (1 + D, B, T, V)

    def input_length(self, context_length: int) -> int:
        """Tokens of the window that ``forward`` reads: T + D."""
        return context_length + self.depth


def deepseek_weights(depth: int, lam: float) -> list[float]:
    """DeepSeek-V3's loss weights: 1 for the main loss, lambda / D for each of the D modules."""
    depth = check_positive_int("depth", depth)
    lam = check_nonnegative_number("lam", lam)
    return [1.0] + [lam / depth] * depth


def get_mtp_batch(tokens: Any, batch_size: int, context_length: int, n_future: int,
                  generator: torch.Generator | None = None,
                  window: int | None = None) -> tuple[Tensor, Tensor]:
    """Windows for n future tokens: (ids (B, T + n - 1), targets (n, B, T)).

    ``targets[k - 1, b, t]`` is the token k places after input position t, so
    ``targets[0]`` is chapter 10's y. Windows of ``window`` + 1 tokens are drawn by
    :func:`~llmbook.training.train.get_batch` (default ``window = T + n - 1``); runs
    that pass the same ``window`` and generator see the same windows whatever their n.
    """
    check_positive_int("context_length", context_length)
    n_future = check_positive_int("n_future", n_future)
    need = context_length + n_future - 1
    window = need if window is None else check_positive_int("window", window)
    if window < need:
        raise ValueError(f"window={window} is shorter than context_length + n_future - 1 = {need}")
    x, y = get_batch(tokens, batch_size, window, generator=generator)  # (B, window) each
    targets = torch.stack([y[:, k : k + context_length] for k in range(n_future)])  # (n, B, T)
    return x[:, :need], targets


def multi_token_loss(logits: Tensor, targets: Tensor,
                     weights: Sequence[float] | None = None) -> tuple[Tensor, Tensor]:
    """sum_k w_k * mean_{b,t} -log softmax(logits[k])[targets[k]]: (n, B, T, V), (n, B, T).

    Returns (total, per-head losses (n,)). ``weights`` default to 1 for every head
    (Gloeckle et al.'s sum); :func:`deepseek_weights` gives DeepSeek-V3's.
    """
    if not isinstance(logits, Tensor) or logits.ndim != 4:
        got = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"logits must have shape (n, B, T, V), got {got}")
    if not isinstance(targets, Tensor) or tuple(targets.shape) != tuple(logits.shape[:3]):
        got = tuple(targets.shape) if isinstance(targets, Tensor) else type(targets).__name__
        raise ValueError(f"targets must have shape (n, B, T) = {tuple(logits.shape[:3])}, got {got}")
    n = logits.shape[0]
    if weights is None:
        weights = [1.0] * n
    if len(weights) != n or any(not (isinstance(w, int | float) and w >= 0) for w in weights):
        raise ValueError(f"weights must be {n} non-negative numbers, got {list(weights)}")
    per_head = torch.stack([cross_entropy(logits[k], targets[k]) for k in range(n)])  # (n,)
    w = torch.tensor([float(v) for v in weights], dtype=per_head.dtype)
    return (w * per_head).sum(), per_head


@dataclass
class MTPHistory:
    """Per step: the total training loss and each head's; validation curves of every head."""

    steps: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    train_head_loss: list[list[float]] = field(default_factory=list)
    val_steps: list[int] = field(default_factory=list)
    val_head_loss: list[list[float]] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@torch.no_grad()
def evaluate_heads(model: ParallelMTP | SequentialMTP, tokens: Any, batch_size: int,
                   context_length: int, num_batches: int, generator: torch.Generator | None = None,
                   first_position: int = 0, window: int | None = None) -> list[float]:
    """Mean cross-entropy of each head (nats/token) on held-out windows: a list of n floats.

    As chapter 10's :func:`~llmbook.training.train.evaluate`: a generator seeded with 0 by
    default, eval mode, only positions ``first_position``..T-1 count. Head 1's entry is the
    next-token loss of ``model.lm``.
    """
    num_batches = check_positive_int("num_batches", num_batches)
    if isinstance(first_position, bool) or not isinstance(first_position, int) or \
            not 0 <= first_position < context_length:
        raise ValueError(f"first_position must be an int in [0, {context_length}), got {first_position!r}")
    generator = torch.Generator().manual_seed(0) if generator is None else generator
    was_training = model.training
    model.eval()
    try:
        total = np.zeros(model.n_future)
        for _ in range(num_batches):
            ids, targets = get_mtp_batch(tokens, batch_size, context_length, model.n_future,
                                         generator, window)
            logits = model(ids[:, :model.input_length(context_length)])  # (n, B, T, V)
            nll = cross_entropy(logits, targets, reduction="none")  # (n, B, T)
            total += nll[:, :, first_position:].mean(dim=(1, 2)).numpy()
    finally:
        model.train(was_training)
    return (total / num_batches).tolist()


def train_mtp(model: ParallelMTP | SequentialMTP, train_tokens: Any, val_tokens: Any,
              config: TrainConfig, weights: Sequence[float] | None = None,
              window: int | None = None, first_position: int = 0) -> MTPHistory:
    """Chapter 10's loop for a multi-token model: AdamW on :func:`param_groups`, warmup +
    cosine, clipping; each step one :func:`get_mtp_batch` and :func:`multi_token_loss`.

    Runs with the same ``config.seed`` and ``window`` draw the same windows, so models with
    different n are trained on the same tokens (matched data). Validation every
    ``eval_every`` steps and at the end, per head, on the same windows each time.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    c = config
    optimizer = AdamW(param_groups(model, c.weight_decay), lr=c.lr, betas=c.betas,
                      weight_decay=c.weight_decay)
    batches = torch.Generator().manual_seed(c.seed)
    history = MTPHistory()

    def validate(step: int) -> None:
        history.val_steps.append(step)
        history.val_head_loss.append(evaluate_heads(
            model, val_tokens, c.batch_size, c.context_length, c.eval_batches,
            torch.Generator().manual_seed(c.seed + 1), first_position, window))

    began = time.perf_counter()
    model.train()
    for step in range(c.steps):
        if c.eval_every is not None and step % c.eval_every == 0:
            validate(step)
        set_lr(optimizer, cosine_schedule(step, c.lr, c.min_lr, c.warmup_steps, c.steps))
        ids, targets = get_mtp_batch(train_tokens, c.batch_size, c.context_length,
                                     model.n_future, batches, window)
        loss, per_head = multi_token_loss(model(ids[:, :model.input_length(c.context_length)]),
                                          targets, weights)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if c.grad_clip is not None:
            clip_grad_norm_(model.parameters(), c.grad_clip)
        optimizer.step()
        history.steps.append(step)
        history.train_loss.append(float(loss.detach()))
        history.train_head_loss.append(per_head.detach().tolist())
    validate(c.steps)
    history.seconds = time.perf_counter() - began
    return history


def load_shipped_mtp(name: str = "parallel_n4") -> tuple[ParallelMTP, dict[str, Any]]:
    """The multi-token model ``name`` shipped in ``data/models/mtp/`` and the run's info dict.

    ``data/make_mtp.py`` trains next-token models with n = 1, 2 and 4 parallel heads and one
    with a DeepSeek-V3 module on the synthetic source and writes ``info.json`` (the recipe,
    every run's curves, final per-head losses, timings) and the weights of the n = 4 model
    (``<name>.safetensors``). Returned in eval mode.
    """
    import json

    from safetensors.torch import load_model

    from llmbook.paths import data_path, missing_data

    folder = data_path("models", "mtp")
    info_path, weights = folder / "info.json", folder / f"{name}.safetensors"
    if not (info_path.is_file() and weights.is_file()):
        raise missing_data(folder, f"the shipped multi-token model {name!r}",
                           "python data/make_mtp.py", error=ValueError)
    info = json.loads(info_path.read_text())
    shipped = info["shipped"].get(name)
    if shipped is None:
        raise ValueError(f"no shipped model {name!r}; choose one of {sorted(info['shipped'])}")
    model = ParallelMTP(TransformerConfig(**info["recipe"]["model"]), shipped["n_future"])
    load_model(model, str(weights), strict=True)
    return model.eval(), info


# ---------------------------------------------------------------- exact floors of the heads


def future_token_table(source: MarkovSource, k: int) -> Tensor:
    """P(x_{t+k} | context of x_{t+1}) for the Markov source: (V**order, V) float64.

    Row c is the distribution of the token k places ahead given the context c (the last
    ``order`` tokens up to x_t): T for k = 1, M^{k-1} T for the context-to-context chain M.
    """
    if not isinstance(source, MarkovSource):
        raise TypeError(f"source must be a MarkovSource, got {type(source).__name__}")
    k = check_positive_int("k", k)
    V, C = source.vocab_size, source.num_contexts
    table = source.transition  # (C, V)
    step = torch.zeros(C, C, dtype=torch.float64)  # M[c, c'] = P(next context c' | c)
    nxt = (torch.arange(C)[:, None] % (C // V)) * V + torch.arange(V)[None, :]  # (C, V)
    step.scatter_add_(1, nxt, table)
    return torch.linalg.matrix_power(step, k - 1) @ table  # (C, V)


def head_entropy_floors(source: MarkovSource, n_future: int) -> list[float]:
    """The lowest expected loss of head k = 1..n: H(X_{t+k} | context at t), in nats.

    Head 1's floor is the entropy rate H; a head further ahead is uncertain about the
    tokens in between too, so its floor is higher. The floor of Gloeckle's summed loss is
    the sum of these.
    """
    n_future = check_positive_int("n_future", n_future)
    floors = []
    for k in range(1, n_future + 1):
        p = future_token_table(source, k)  # (C, V)
        plogp = torch.where(p > 0, p * p.clamp_min(1e-300).log(), torch.zeros_like(p))
        floors.append(float(-(source.stationary * plogp.sum(1)).sum()))
    return floors


# ---------------------------------------------------------------- the gradient, derived


def mtp_gradient_symbolic(n_future: int = 2, vocab_size: int = 3, d: int = 2) -> dict[str, Any]:
    """The gradient of L = -sum_k log softmax(W A_k s)[y_k] in SymPy, by differentiation and
    by the closed form.

    A model small enough for SymPy: trunk state s (d,), head k a linear map A_k (d x d),
    shared unembedding W (V x d), targets y_k. Returns ``loss``; ``grad_logits`` (per head
    dL/dz_k, to compare with softmax(z_k) - e_{y_k}); ``grad_trunk`` (dL/ds by sp.diff) and
    ``grad_trunk_formula`` = sum_k A_k^T W^T (p_k - e_{y_k}); ``grad_W`` and
    ``grad_W_formula`` = sum_k (p_k - e_{y_k}) (A_k s)^T; ``probs`` and ``onehots``.
    """
    n = check_positive_int("n_future", n_future)
    V = check_positive_int("vocab_size", vocab_size)
    d = check_positive_int("d", d)
    if V < 2:
        raise ValueError(f"vocab_size must be >= 2, got {V}")
    s = sp.Matrix(sp.symbols(f"s_0:{d}", real=True))
    W = sp.Matrix(V, d, lambda i, j: sp.Symbol(f"w_{i}{j}", real=True))
    A = [sp.Matrix(d, d, lambda i, j, k=k: sp.Symbol(f"a^{k + 1}_{i}{j}", real=True)) for k in range(n)]
    ys = [k % V for k in range(n)]  # head k's target: token k mod V (any choice works)
    loss, probs, onehots, grad_logits = sp.Integer(0), [], [], []
    for k in range(n):
        z = W * A[k] * s  # (V, 1)
        lse = sp.log(sum(sp.exp(z[i]) for i in range(V)))
        loss += lse - z[ys[k]]
        p = sp.Matrix([sp.exp(z[i]) for i in range(V)]) / sum(sp.exp(z[i]) for i in range(V))
        e = sp.Matrix([1 if i == ys[k] else 0 for i in range(V)])
        probs.append(p)
        onehots.append(e)
        zs = sp.Matrix(sp.symbols(f"z_0:{V}", real=True))
        lk = sp.log(sum(sp.exp(zs[i]) for i in range(V))) - zs[ys[k]]
        grad_logits.append((sp.Matrix([sp.diff(lk, zi) for zi in zs]), zs))
    grad_trunk = sp.Matrix([sp.diff(loss, si) for si in s])
    grad_trunk_formula = sum((A[k].T * W.T * (probs[k] - onehots[k]) for k in range(n)),
                             sp.zeros(d, 1))
    grad_W = sp.Matrix(V, d, lambda i, j: sp.diff(loss, W[i, j]))
    grad_W_formula = sum(((probs[k] - onehots[k]) * (A[k] * s).T for k in range(n)), sp.zeros(V, d))
    return {"loss": loss, "s": s, "W": W, "A": A, "targets": ys, "probs": probs,
            "onehots": onehots, "grad_logits": grad_logits, "grad_trunk": grad_trunk,
            "grad_trunk_formula": grad_trunk_formula, "grad_W": grad_W,
            "grad_W_formula": grad_W_formula}
