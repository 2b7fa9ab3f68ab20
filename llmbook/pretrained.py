"""The book's own small trained models, trained once on the CPU and cached on disk.

Introduced in notebooks/10_training; the later chapters (decoding, quantisation, LoRA,
alignment) start from these models instead of downloading one. Two recipes:

* ``book_model("synthetic")``: a 2-layer GPT-2-style model (d = 64, 4 heads, the exact
  erf GELU, which is cheaper on the CPU than GPT-2's tanh form; 0.1M parameters) trained on the synthetic Markov source of chapter 3
  (:func:`llmbook.data.default_source`, V = 16, entropy rate H = 1.6184 nats/token).
  Its validation loss on predictions with the full order-2 context comes within 3 % of
  H: the model has learned the source, up to what a finite sample can teach;
* ``book_model("text")``: a model of the same shape with a 512-token byte-level BPE
  vocabulary (chapter 1's tokenizer) trained for a few seconds on the Python standard
  library's docstrings (:mod:`llmbook.corpus`); ``info["tokenizer"]`` decodes it.

Training is deterministic (fixed seeds; the same weights bit for bit on re-training on
the same machine, on one thread or two) and takes under half a minute on an idle 2-core
machine. The result is cached under :func:`cache_dir` in a file named by a hash of the
recipe, so changing the recipe trains a new model. :func:`sample_text` draws a continuation of a prompt.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from llmbook.checkpoint import FORMAT, atomic_save, check_state_dict, read_checkpoint
from llmbook.data import default_source
from llmbook.model import TransformerConfig, TransformerLM
from llmbook.train import TrainConfig, evaluate, train

__all__ = ["RECIPES", "book_model", "cache_dir", "generate", "recipe_hash", "sample_text"]

#: Bumped when the training code changes in a way the recipe dicts do not show.
RECIPE_VERSION = 1

RECIPES: dict[str, dict[str, Any]] = {
    "synthetic": {
        "model": TransformerConfig.gpt2_style(
            vocab_size=16, d_model=64, n_layers=2, n_heads=4, max_seq_len=16,
            activation="gelu").to_dict(),
        "train": TrainConfig(
            steps=600, batch_size=128, context_length=16, lr=1e-2, min_lr=1e-3,
            warmup_steps=30, weight_decay=0.1, betas=(0.9, 0.95), grad_clip=1.0,
            eval_every=50, eval_batches=4, seed=0).to_dict(),
        "data": {"source": "default_source", "num_train": 1_000_000, "num_val": 100_000,
                 "seed": 0},
        "init_seed": 0,
        "final_eval": {"batch_size": 256, "num_batches": 20},
    },
    "text": {
        "model": TransformerConfig.gpt2_style(
            vocab_size=512, d_model=64, n_layers=2, n_heads=4, max_seq_len=64,
            activation="gelu").to_dict(),
        "train": TrainConfig(
            steps=250, batch_size=32, context_length=64, lr=1e-2, min_lr=1e-3,
            warmup_steps=15, weight_decay=0.1, betas=(0.9, 0.95), grad_clip=1.0,
            eval_every=25, eval_batches=4, seed=0).to_dict(),
        "data": {"corpus": "stdlib_docs", "bpe_vocab_size": 512, "val_fraction": 0.1},
        "init_seed": 0,
        "final_eval": {"batch_size": 64, "num_batches": 20},
    },
}


def cache_dir() -> Path:
    """Where trained models are cached (created if needed).

    ``LLMBOOK_CACHE`` if set; else ``.cache/llmbook`` in the source checkout (beside
    ``notebooks/``; git ignores it); else ``~/.cache/llmbook``.
    """
    env = os.environ.get("LLMBOOK_CACHE")
    if env:
        path = Path(env)
    else:
        root = Path(__file__).resolve().parents[1]
        path = root / ".cache" / "llmbook" if (root / "notebooks").is_dir() \
            else Path.home() / ".cache" / "llmbook"
    path.mkdir(parents=True, exist_ok=True)
    return path


def recipe_hash(kind: str) -> str:
    """The first 12 hex digits of SHA-256 of the recipe (and :data:`RECIPE_VERSION`)."""
    text = json.dumps({"version": RECIPE_VERSION, "kind": kind, **RECIPES[kind]}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@contextlib.contextmanager
def _training_threads() -> Iterator[None]:
    """Train on two threads when the machine is idle, else on one.

    For models this small the arithmetic is the same on one thread or two (the cached
    weights are bit for bit equal either way), so the choice only affects speed: two
    threads are about a fifth faster on an idle 2-core machine, and several times slower
    when other work already keeps the cores busy.
    """
    threads = torch.get_num_threads()
    try:
        idle = os.getloadavg()[0] < 0.75 * (os.cpu_count() or 1)
    except (AttributeError, OSError):  # no load average on this platform
        idle = False
    torch.set_num_threads(min(2, threads) if idle else 1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _synthetic_data(recipe: dict[str, Any]) -> tuple[Tensor, Tensor, dict[str, Any]]:
    d = recipe["data"]
    source = default_source()
    tr, va = source.train_val(d["num_train"], d["num_val"], seed=d["seed"])
    return tr, va, {"entropy_rate": source.entropy_rate(), "order": source.order}


def _text_data(recipe: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    from llmbook.corpus import load_stdlib_docs
    from llmbook.tokenizer import BPETokenizer, train_bpe

    d = recipe["data"]
    text = load_stdlib_docs()
    vocab, merges = train_bpe(text, d["bpe_vocab_size"])
    ids = np.asarray(BPETokenizer(vocab, merges).encode(text), dtype=np.uint16)  # (N,)
    n_train = int(len(ids) * (1 - d["val_fraction"]))
    extra = {"vocab": {i: list(b) for i, b in vocab.items()},
             "merges": [[list(a), list(b)] for a, b in merges]}
    return ids[:n_train], ids[n_train:], extra


def _train_book_model(kind: str) -> tuple[TransformerLM, dict[str, Any]]:
    recipe = RECIPES[kind]
    tr, va, extra = (_synthetic_data if kind == "synthetic" else _text_data)(recipe)
    config = TrainConfig(**{**recipe["train"], "betas": tuple(recipe["train"]["betas"])})
    model = TransformerLM(TransformerConfig(**recipe["model"]),
                          generator=torch.Generator().manual_seed(recipe["init_seed"]))
    began = time.perf_counter()
    history = train(model, tr, va, config)
    seconds = time.perf_counter() - began
    fe = recipe["final_eval"]
    first = extra["order"] - 1 if kind == "synthetic" else 0  # full-context predictions
    val_loss = evaluate(model, va, fe["batch_size"], config.context_length, fe["num_batches"],
                        torch.Generator().manual_seed(1234), first_position=first)
    info: dict[str, Any] = {
        "kind": kind, "recipe_hash": recipe_hash(kind), "recipe": recipe,
        "history": history.to_dict(), "train_seconds": seconds,
        "val_loss": val_loss, "val_first_position": first, "num_train_tokens": len(tr),
        "num_val_tokens": len(va), **extra,
    }
    if kind == "synthetic":
        info["val_loss_over_entropy_rate"] = val_loss / extra["entropy_rate"]
    return model, info


def book_model(kind: str = "synthetic", retrain: bool = False) -> tuple[TransformerLM, dict[str, Any]]:
    """The book's trained model of ``kind`` ("synthetic" or "text") and a dict about it.

    Loads ``cache_dir()/book_model_<kind>_<recipe hash>.pt`` if it exists (safely, with
    ``weights_only=True``), else trains the model (deterministically, on one thread)
    and writes that file atomically; ``retrain=True`` trains even when cached. The
    model is returned in eval mode. ``info`` holds ``val_loss`` (nats/token, on
    held-out data; for "synthetic" only the predictions that see the source's full
    order-2 context, so it is comparable with ``entropy_rate``), ``history`` (a
    :class:`~llmbook.train.TrainHistory` as a dict), ``train_seconds``, ``recipe`` and,
    for "text", ``tokenizer`` (a :class:`~llmbook.tokenizer.BPETokenizer`).
    """
    if kind not in RECIPES:
        raise ValueError(f"kind must be one of {sorted(RECIPES)}, got {kind!r}")
    path = cache_dir() / f"book_model_{kind}_{recipe_hash(kind)}.pt"
    model = TransformerLM(TransformerConfig(**RECIPES[kind]["model"]))
    info = None if retrain else _load_cached(path, model)
    if info is None:
        with _exclusive(path.with_name(path.name + ".lock")):
            # another process may have trained it while we waited for the lock
            info = None if retrain else _load_cached(path, model)
            if info is None:
                with _training_threads():
                    model, info = _train_book_model(kind)
                atomic_save({"format": FORMAT, "step": len(info["history"]["steps"]),
                             "model": model.state_dict(), "optimizer": None, "extra": info},
                            path)
                info["trained_now"] = True
    if kind == "text":
        from llmbook.tokenizer import BPETokenizer

        info["tokenizer"] = BPETokenizer({int(i): bytes(b) for i, b in info["vocab"].items()},
                                         [(bytes(a), bytes(b)) for a, b in info["merges"]])
    info["cache_path"] = str(path)
    return model.eval(), info


def _load_cached(path: Path, model: TransformerLM) -> dict[str, Any] | None:
    """Load a cached model into ``model``; None if there is no usable file.

    A damaged file (truncated, corrupt, or of another shape) is deleted and reported as
    missing, so it is retrained rather than trusted.
    """
    if not path.is_file():
        return None
    try:
        payload = read_checkpoint(path)
        check_state_dict(model, payload["model"], source=f"cached model {path}")
    except ValueError:
        path.unlink(missing_ok=True)
        return None
    model.load_state_dict(payload["model"])
    info = payload["extra"]
    info["trained_now"] = False
    return info


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (POSIX ``flock``), so that processes
    started together (parallel tests, notebooks) train a missing model once, not once
    each. Without ``fcntl`` (Windows) it does nothing: the atomic write still keeps the
    cache consistent, at the cost of duplicate work."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(lock_path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---------------------------------------------------------------- sampling


@torch.no_grad()
def generate(model: TransformerLM, ids: Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, generator: torch.Generator | None = None) -> Tensor:
    """Append ``max_new_tokens`` sampled tokens to ``ids`` (B, T) -> (B, T + max_new_tokens).

    At each step the model sees the last ``max_seq_len`` tokens; the next token is drawn
    from softmax(z / temperature) restricted to the ``top_k`` largest logits
    (``temperature == 0``: the arg max, greedy decoding). Chapter 12 studies these rules;
    this is the minimal version a training chapter needs to look at its model.
    """
    if ids.ndim != 2:
        raise ValueError(f"ids must have shape (B, T), got {tuple(ids.shape)}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k <= 0:
        raise ValueError(f"top_k must be positive or None, got {top_k}")
    was_training = model.training
    model.eval()
    for _ in range(max_new_tokens):
        logits = model(ids[:, -model.config.max_seq_len:])[:, -1]  # (B, V)
        if temperature == 0:
            nxt = logits.argmax(-1, keepdim=True)  # (B, 1)
        else:
            logits = logits / temperature
            if top_k is not None and top_k < logits.shape[-1]:
                kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)  # (B, 1)
        ids = torch.cat([ids, nxt], dim=1)
    model.train(was_training)
    return ids


def sample_text(model: TransformerLM, tokenizer: Any, prompt: str, max_new_tokens: int = 60,
                temperature: float = 1.0, top_k: int | None = None,
                generator: torch.Generator | None = None) -> str:
    """The prompt followed by ``max_new_tokens`` tokens from :func:`generate`, as text."""
    ids = torch.tensor([tokenizer.encode(prompt)], dtype=torch.long)  # (1, T)
    if ids.shape[1] == 0:
        raise ValueError("prompt must encode to at least one token")
    out = generate(model, ids, max_new_tokens, temperature, top_k, generator)
    return tokenizer.decode(out[0].tolist())
