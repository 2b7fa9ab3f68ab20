"""Training a language model: batches from a token array, the loop, evaluation, checkpoints.

Introduced in notebooks/10_training. The pieces, in the order a run uses them:

* :func:`save_tokens` / :func:`load_tokens`: a tokenised corpus as a flat binary file of
  ``uint16`` ids, opened as a ``np.memmap`` so a corpus larger than memory is paged in
  on demand (the layout of nanoGPT's ``train.bin``);
* :func:`get_batch`: B random windows of T + 1 tokens, split into inputs x and targets y
  shifted by one, so position t of x is trained to predict token t + 1;
* :class:`TrainConfig`: the run's hyperparameters, checked when it is built;
* :func:`param_groups`: AdamW with weight decay on the weight matrices only;
* :func:`train_step`: one update: forward, cross-entropy (nats), backward, clipping, step;
  with ``autocast_dtype=torch.bfloat16`` the forward runs under ``torch.autocast`` (mixed
  precision, Micikevicius et al. (2018); the weights and the optimiser stay float32) and
  the loss is computed in float32;
* :func:`z_loss`: PaLM's auxiliary loss (log Z)^2 on the softmax normaliser (Chowdhery et
  al., 2022), an option of :func:`train_step` and :func:`train` (``z_loss_weight``);
* :func:`evaluate`: the mean validation cross-entropy, without gradients;
* :func:`train`: the loop, with the warmup + cosine schedule of chapter 9, logging,
  periodic checkpoints (:mod:`llmbook.training.checkpoint`) and exact resumption.

The objective is the maximum-likelihood one of chapter 3: minimise the mean of
-log p_theta(x_{t+1} | x_{<=t}) over every position of every window.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from tqdm.std import tqdm

from llmbook.text.functional import cross_entropy
from llmbook.training.checkpoint import (
    check_state_dict,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from llmbook.training.optim import AdamW, clip_grad_norm_, cosine_schedule, set_lr

__all__ = [
    "TrainConfig",
    "TrainHistory",
    "evaluate",
    "get_batch",
    "load_checkpoint",
    "load_tokens",
    "param_groups",
    "save_checkpoint",
    "save_tokens",
    "train",
    "train_step",
    "z_loss",
]

TokenArray = np.ndarray | Tensor


# ---------------------------------------------------------------- data


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {name}={value}")
    return int(value)


def _check_tokens(tokens: object, name: str = "tokens") -> int:
    """Check a 1-D integer token array (numpy, memmap or torch); return its length."""
    if isinstance(tokens, Tensor):
        integer = not tokens.dtype.is_floating_point and not tokens.dtype.is_complex \
            and tokens.dtype != torch.bool
        dtype, ndim, shape = tokens.dtype, tokens.ndim, tuple(tokens.shape)
    elif isinstance(tokens, np.ndarray):
        integer = np.issubdtype(tokens.dtype, np.integer)
        dtype, ndim, shape = tokens.dtype, tokens.ndim, tokens.shape
    else:
        raise TypeError(f"{name} must be a numpy array or a torch tensor of token ids, "
                        f"got {type(tokens).__name__}")
    if not integer:
        raise TypeError(f"{name} must hold integer token ids, got dtype {dtype}")
    if ndim != 1:
        raise ValueError(f"{name} must be 1-D (one long sequence), got shape {shape}")
    return shape[0]


def save_tokens(path: str | os.PathLike, tokens: TokenArray, dtype: Any = np.uint16) -> Path:
    """Write token ids to ``path`` as raw ``dtype`` values (default ``uint16``), atomically.

    ``uint16`` holds ids below 2^16 = 65,536 (GPT-2's 50,257 fit) in two bytes per token.
    Ids outside ``dtype``'s range raise ``ValueError`` instead of wrapping around. The
    file has no header: :func:`load_tokens` needs the same ``dtype``.
    """
    _check_tokens(tokens)
    arr = tokens.detach().cpu().numpy() if isinstance(tokens, Tensor) else np.asarray(tokens)
    info = np.iinfo(dtype)
    if arr.size and (arr.min() < info.min or arr.max() > info.max):
        bad = arr.min() if arr.min() < info.min else arr.max()
        raise ValueError(f"token id {int(bad)} does not fit in {np.dtype(dtype).name} "
                         f"(range {info.min}..{info.max})")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        arr.astype(dtype, copy=False).tofile(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def load_tokens(path: str | os.PathLike, dtype: Any = np.uint16) -> np.memmap:
    """Open a file written by :func:`save_tokens` as a read-only ``np.memmap`` of shape (N,).

    Nothing is read until it is indexed: :func:`get_batch` touches only the pages its
    windows fall in, so a corpus need not fit in memory. A file whose size is not a
    multiple of the item size, or an empty file, raises ``ValueError`` naming it.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no token file at {path}")
    size, item = path.stat().st_size, np.dtype(dtype).itemsize
    if size == 0 or size % item:
        raise ValueError(f"{path} has {size} bytes, not a positive multiple of the "
                         f"{item}-byte {np.dtype(dtype).name} token size")
    return np.memmap(path, dtype=dtype, mode="r")


def get_batch(tokens: TokenArray, batch_size: int, context_length: int,
              device: str | torch.device = "cpu",
              generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """B random windows of the token sequence as inputs and next-token targets.

    Each window starts at an offset drawn uniformly from 0..N-T-1 (``torch.randint`` with
    ``generator``) and holds T + 1 consecutive tokens w; then x = w[:T] and y = w[1:], so
    ``y[b, t] == x[b, t + 1]``: every position is a training example for the next token.

    Args:
        tokens: ``(N,)`` integer ids: a numpy array, a ``np.memmap`` or a torch tensor.
        batch_size: B. context_length: T, which must be shorter than N.
        device: where x and y go. generator: a ``torch.Generator`` for the offsets.

    Returns:
        ``(x, y)``, both ``(B, T)`` ``torch.long``.
    """
    n = _check_tokens(tokens)
    batch_size = _positive_int("batch_size", batch_size)
    context_length = _positive_int("context_length", context_length)
    if context_length >= n:
        raise ValueError(f"context_length={context_length} is not shorter than the data "
                         f"({n} tokens): a window needs context_length + 1 tokens")
    offsets = torch.randint(0, n - context_length, (batch_size,), generator=generator)  # (B,)
    index = offsets[:, None] + torch.arange(context_length + 1)  # (B, T + 1)
    if isinstance(tokens, Tensor):
        windows = tokens[index.to(tokens.device)].to(torch.long)  # (B, T + 1)
    else:  # numpy or memmap: fancy indexing reads only these windows
        windows = torch.from_numpy(np.asarray(tokens[index.numpy()]).astype(np.int64))
    x, y = windows[:, :-1], windows[:, 1:]  # (B, T) each, y shifted by one
    return x.to(device), y.to(device)


# ---------------------------------------------------------------- configuration


def _check_real(name: str, value: object, low: float = 0.0, high: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    if not math.isfinite(value) or value < low or (high is not None and value >= high):
        bound = f"in [{low}, {high})" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be finite and {bound}, got {name}={value}")
    return float(value)


@dataclass
class TrainConfig:
    """Hyperparameters of a training run, checked at construction.

    ``steps`` optimiser updates on batches of ``batch_size`` windows of
    ``context_length`` tokens; the learning rate follows chapter 9's
    ``cosine_schedule``: linear warmup from 0 to ``lr`` over ``warmup_steps``, cosine
    decay to ``min_lr`` at ``steps``. AdamW with ``betas`` and ``weight_decay`` (on the
    weight matrices only, see :func:`param_groups`); the global gradient norm is clipped
    to ``grad_clip`` (None: no clipping). Every ``eval_every`` steps (None: only at the
    end) the validation loss is the mean over ``eval_batches`` batches; every
    ``log_every`` steps (None: never) a line is printed; every ``checkpoint_every``
    steps (None: off) a checkpoint is written. ``seed`` seeds the batch sampler.
    """

    steps: int = 1000
    batch_size: int = 32
    context_length: int = 64
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float | None = 1.0
    eval_every: int | None = 100
    eval_batches: int = 10
    seed: int = 0
    log_every: int | None = None
    checkpoint_every: int | None = None

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "context_length", "eval_batches"):
            _positive_int(name, getattr(self, name))
        for name in ("eval_every", "log_every", "checkpoint_every"):
            if getattr(self, name) is not None:
                _positive_int(name, getattr(self, name))
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int):
            raise TypeError(f"warmup_steps must be an int, got {self.warmup_steps!r}")
        if not 0 <= self.warmup_steps <= self.steps:
            raise ValueError(f"warmup_steps={self.warmup_steps} must lie in [0, steps={self.steps}]"
                             f" (a warmup longer than the schedule never reaches lr)")
        self.lr = _check_real("lr", self.lr)
        self.min_lr = _check_real("min_lr", self.min_lr)
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr={self.min_lr} must not exceed lr={self.lr}")
        self.weight_decay = _check_real("weight_decay", self.weight_decay)
        if not isinstance(self.betas, tuple | list) or len(self.betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2), got betas={self.betas!r}")
        self.betas = (_check_real("beta1", self.betas[0], 0.0, 1.0),
                      _check_real("beta2", self.betas[1], 0.0, 1.0))
        if self.grad_clip is not None and _check_real("grad_clip", self.grad_clip) == 0:
            raise ValueError("grad_clip must be positive (or None for no clipping), got 0")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(f"seed must be an int, got {self.seed!r}")

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (for a checkpoint or a JSON file)."""
        d = asdict(self)
        d["betas"] = list(self.betas)
        return d


#: Fields that may change between an interrupted run and its resumption: they affect
#: what is printed or saved, not the sequence of parameters.
_RESUMABLE_CHANGES = ("log_every", "checkpoint_every")


@dataclass
class TrainHistory:
    """What a run measured: training loss per step, validation loss per evaluation.

    ``steps[i]`` is the number of updates done before ``train_loss[i]`` (its batch's mean
    cross-entropy in nats) was measured and ``lr[i]`` the learning rate of that update;
    ``val_loss[j]`` is the validation loss after ``val_steps[j]`` updates. ``tokens_seen``
    counts training tokens (B * T per step) and ``seconds`` the wall time of the loop.
    """

    steps: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    val_steps: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    tokens_seen: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainHistory:
        return cls(**{f.name: d[f.name] for f in fields(cls)})


# ---------------------------------------------------------------- the step


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two AdamW parameter groups: decay the matrices, not the vectors.

    As in GPT-2's training code and nanoGPT, parameters with two or more dimensions (the
    attention and MLP weight matrices, the embedding tables, an untied LM head) get
    ``weight_decay``; one-dimensional ones (biases, LayerNorm/RMSNorm gains) get none:
    shrinking a gain towards 0 or a bias towards 0 is not a preference for a simpler
    function, only a distortion of the normalisation. A tied matrix appears once.
    """
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def z_loss(logits: Tensor, targets: Tensor | None = None, ignore_index: int = -100) -> Tensor:
    """PaLM's z-loss (Chowdhery et al., 2022, section 5): the mean of (log Z)^2 over positions.

    ``logits`` (..., V) -> scalar, with log Z = logsumexp(z) the log of the softmax's
    normaliser at each position. The cross-entropy does not change when a constant is added
    to all logits of a position; this penalty does, and pulls log Z towards 0, so that
    log softmax(z) = z - log Z stays near z (PaLM adds it with weight 1e-4 for stability).
    Its gradient at one position is 2 log Z softmax(z) / n. With ``targets`` ((...), the
    leading shape of ``logits``) positions whose target is ``ignore_index`` do not count,
    as in :func:`llmbook.text.functional.cross_entropy`. The same penalty on router logits
    is ST-MoE's router z-loss (:func:`llmbook.scale.moe.router_z_loss`).
    """
    if not isinstance(logits, Tensor) or not logits.is_floating_point() or logits.ndim < 1:
        raise TypeError(f"logits must be a floating tensor of shape (..., V), got {logits!r:.60}")
    if logits.shape[-1] == 0:
        raise ValueError("logits has an empty vocabulary axis (V = 0)")
    log_z = torch.logsumexp(logits, dim=-1)  # (...)
    if targets is None:
        if log_z.numel() == 0:
            raise ValueError("logits has no positions")
        return log_z.pow(2).mean()
    if not isinstance(targets, Tensor) or targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets must be a tensor of shape {tuple(logits.shape[:-1])}, got "
                         f"{getattr(targets, 'shape', type(targets).__name__)}")
    keep = targets != ignore_index  # (...)
    if not bool(keep.any()):
        raise ValueError(f"no position to average over: every target is ignore_index = {ignore_index}")
    return log_z[keep].pow(2).mean()


_AUTOCAST_DTYPES = (torch.bfloat16, torch.float16)


def _check_autocast_dtype(autocast_dtype: object) -> torch.dtype | None:
    if autocast_dtype is not None and autocast_dtype not in _AUTOCAST_DTYPES:
        raise ValueError(f"autocast_dtype must be None, torch.bfloat16 or torch.float16, "
                         f"got autocast_dtype={autocast_dtype!r}")
    return autocast_dtype  # type: ignore[return-value]


def train_step(model: nn.Module, optimizer: Optimizer, x: Tensor, y: Tensor, lr: float,
               grad_clip: float | None = None, autocast_dtype: torch.dtype | None = None,
               z_loss_weight: float = 0.0) -> tuple[Tensor, Tensor | None]:
    """One update on the batch ``x, y`` (both ``(B, T)``); returns (loss, gradient norm).

    The loss is the mean cross-entropy -log softmax(z)[y] over all B * T positions, in
    nats, computed by the book's :func:`llmbook.text.functional.cross_entropy` (chapter 3);
    the norm is the global gradient norm before clipping (None without clipping).

    ``autocast_dtype`` (``torch.bfloat16`` or ``torch.float16``) runs the forward pass under
    ``torch.autocast`` on ``x``'s device: the matrix products run in 16 bits, the
    parameters, their gradients and the optimiser's state stay in the model's dtype (the
    float32 "master weights" of Micikevicius et al., 2018). The logits (``(B, T, V)``,
    16-bit) are cast to float32 before the loss, because autocast on the CPU leaves
    ``log_softmax`` in 16 bits. A float16 run may need loss scaling
    (:class:`llmbook.training.memory.DynamicLossScaler`); bfloat16 has float32's range.

    ``z_loss_weight`` > 0 adds that multiple of :func:`z_loss` to the loss that is
    differentiated; the returned loss is the cross-entropy alone, so that runs with and
    without it log comparable numbers.
    """
    autocast_dtype = _check_autocast_dtype(autocast_dtype)
    z_loss_weight = _check_real("z_loss_weight", z_loss_weight)
    set_lr(optimizer, lr)
    if autocast_dtype is None:
        logits = model(x)  # (B, T, V)
    else:
        with torch.autocast(device_type=x.device.type, dtype=autocast_dtype):
            logits = model(x).float()  # (B, T, V) 16-bit products, the loss in float32
    loss = cross_entropy(logits, y)  # () mean over B * T positions
    objective = loss + z_loss_weight * z_loss(logits, y) if z_loss_weight else loss
    optimizer.zero_grad(set_to_none=True)
    objective.backward()
    norm = clip_grad_norm_(model.parameters(), grad_clip) if grad_clip is not None else None
    optimizer.step()
    return loss.detach(), norm


@torch.no_grad()
def evaluate(model: nn.Module, tokens: TokenArray, batch_size: int, context_length: int,
             num_batches: int, generator: torch.Generator | None = None,
             first_position: int = 0) -> float:
    """Mean cross-entropy (nats/token) of ``model`` on random windows of ``tokens``.

    ``num_batches`` batches from :func:`get_batch`; ``generator=None`` means a fresh
    generator seeded with 0, so that repeated calls score the same windows. With
    ``first_position = j`` only the predictions at positions j..T-1 count: the first
    predictions of a window see less context than a long text gives them. The model
    runs in eval mode without gradients and is put back in the mode it was in.
    """
    num_batches = _positive_int("num_batches", num_batches)
    if isinstance(first_position, bool) or not isinstance(first_position, int) or \
            not 0 <= first_position < context_length:
        raise ValueError(f"first_position must be an int in [0, context_length={context_length}),"
                         f" got {first_position!r}")
    generator = torch.Generator().manual_seed(0) if generator is None else generator
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        total = 0.0
        for _ in range(num_batches):
            x, y = get_batch(tokens, batch_size, context_length, device, generator)
            nll = cross_entropy(model(x), y, reduction="none")  # (B, T)
            total += float(nll[:, first_position:].mean())
    finally:
        model.train(was_training)
    return total / num_batches


# ---------------------------------------------------------------- the loop


def _log_line(step: int, total: int, loss: float, lr: float, val: float | None) -> str:
    width = len(str(total))
    line = f"step {step:>{width}d}/{total}  train {loss:.4f}  lr {lr:.2e}"
    return line + (f"  val {val:.4f}" if val is not None else "")


def train(model: nn.Module, train_tokens: TokenArray, val_tokens: TokenArray | None,
          config: TrainConfig, checkpoint_path: str | os.PathLike | None = None,
          resume: bool = False, progress: bool = False, stop_at: int | None = None,
          autocast_dtype: torch.dtype | None = None, z_loss_weight: float = 0.0) -> TrainHistory:
    """Train ``model`` (ids (B, T) -> logits (B, T, V)) on ``train_tokens``; return its history.

    AdamW (:mod:`llmbook.training.optim`) with :func:`param_groups`, learning rate
    ``cosine_schedule(step, lr, min_lr, warmup_steps, steps)``, clipping at
    ``grad_clip``, one :func:`train_step` per batch from :func:`get_batch` with a
    generator seeded by ``config.seed``. Validation (when ``val_tokens`` is given) uses
    the same ``eval_batches`` windows every time (a generator seeded with ``seed + 1``),
    so the curve moves with the model only. A tqdm progress bar goes to stderr when
    ``progress``; log lines (``log_every``) are printed in a fixed format.

    With ``checkpoint_path`` a checkpoint (model, optimiser, the batch generator's and
    PyTorch's RNG states, the history, the config) is written every
    ``checkpoint_every`` steps and when the loop ends. ``resume=True`` continues from
    that file (``FileNotFoundError`` if absent): the continued run is identical, bit for
    bit on the CPU, to one that was never interrupted. ``stop_at`` ends the loop after
    that many updates, as an interruption would (the schedule still runs to ``steps``).
    ``autocast_dtype`` (mixed precision) and ``z_loss_weight`` are passed to
    :func:`train_step`; they are not part of the config (the shipped models' recipes do not
    change), and validation runs in the model's own dtype, on the cross-entropy alone.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    n_train = _check_tokens(train_tokens, "train_tokens")
    if config.context_length >= n_train:
        raise ValueError(f"context_length={config.context_length} is not shorter than the "
                         f"training data ({n_train} tokens)")
    if val_tokens is not None and config.context_length >= _check_tokens(val_tokens, "val_tokens"):
        raise ValueError(f"context_length={config.context_length} is not shorter than the "
                         f"validation data ({_check_tokens(val_tokens)} tokens)")
    if stop_at is not None:
        _positive_int("stop_at", stop_at)
    autocast_dtype = _check_autocast_dtype(autocast_dtype)
    z_loss_weight = _check_real("z_loss_weight", z_loss_weight)
    if resume and checkpoint_path is None:
        raise ValueError("resume=True needs a checkpoint_path to resume from")
    c = config
    device = next(model.parameters()).device
    optimizer = AdamW(param_groups(model, c.weight_decay), lr=c.lr, betas=c.betas,
                      weight_decay=c.weight_decay)
    batches = torch.Generator().manual_seed(c.seed)
    history, start = TrainHistory(), 0
    if resume:
        start, history = _resume(checkpoint_path, model, optimizer, batches, c)

    def checkpoint(step: int) -> None:
        if checkpoint_path is not None:
            save_checkpoint(checkpoint_path, model, optimizer, step,
                            batch_rng=batches.get_state(), torch_rng=torch.get_rng_state(),
                            history=history.to_dict(), config=c.to_dict())

    def validate(step: int) -> float | None:
        if val_tokens is None:
            return None
        loss = evaluate(model, val_tokens, c.batch_size, c.context_length, c.eval_batches,
                        torch.Generator().manual_seed(c.seed + 1))
        history.val_steps.append(step)
        history.val_loss.append(loss)
        return loss

    end = c.steps if stop_at is None else min(stop_at, c.steps)
    model.train()
    began = time.perf_counter()
    bar = tqdm(total=c.steps, initial=start, disable=not progress, file=sys.stderr,
               desc="training", unit="step", dynamic_ncols=True)
    try:
        for step in range(start, end):
            val = validate(step) if c.eval_every is not None and step % c.eval_every == 0 \
                else None
            lr = cosine_schedule(step, c.lr, c.min_lr, c.warmup_steps, c.steps)
            x, y = get_batch(train_tokens, c.batch_size, c.context_length, device, batches)
            loss, _ = train_step(model, optimizer, x, y, lr, c.grad_clip, autocast_dtype, z_loss_weight)
            history.steps.append(step)
            history.train_loss.append(float(loss))
            history.lr.append(lr)
            history.tokens_seen += x.numel()
            bar.update(1)
            bar.set_postfix(loss=f"{float(loss):.4f}", refresh=False)
            if c.log_every is not None and (step % c.log_every == 0 or val is not None):
                (bar.write if progress else print)(_log_line(step, c.steps, float(loss), lr, val))
            if c.checkpoint_every is not None and (step + 1) % c.checkpoint_every == 0 \
                    and step + 1 < end:
                history.seconds += time.perf_counter() - began
                began = time.perf_counter()
                checkpoint(step + 1)
        if end == c.steps and (not history.val_steps or history.val_steps[-1] != c.steps):
            val = validate(c.steps)
            if c.log_every is not None and val is not None:
                (bar.write if progress else print)(f"step {c.steps}/{c.steps}  val {val:.4f}")
    finally:
        bar.close()
    history.seconds += time.perf_counter() - began
    if start < end:
        checkpoint(end)
    return history


def _resume(path: str | os.PathLike, model: nn.Module, optimizer: Optimizer,
            batches: torch.Generator, config: TrainConfig) -> tuple[int, TrainHistory]:
    """Load a checkpoint written by :func:`train` into the fresh objects of a new run."""
    payload = read_checkpoint(path)
    extra = payload["extra"]
    if not {"batch_rng", "torch_rng", "history", "config"} <= set(extra):
        raise ValueError(f"checkpoint {path} was not written by llmbook.training.train.train "
                         f"(it lacks the RNG states and history needed to resume)")
    saved = extra["config"]
    changed = [k for k, v in config.to_dict().items()
               if k not in _RESUMABLE_CHANGES and saved.get(k) != v]
    if changed:
        diffs = ", ".join(f"{k}: {saved.get(k)!r} -> {getattr(config, k)!r}" for k in changed)
        raise ValueError(f"cannot resume from {path} exactly: the config changed ({diffs})")
    check_state_dict(model, payload["model"], source=f"checkpoint {path}")
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    batches.set_state(extra["batch_rng"])
    torch.set_rng_state(extra["torch_rng"])
    return int(payload["step"]), TrainHistory.from_dict(extra["history"])

