"""Checkpoints that survive a crash and never run code: atomic save, safe load, exact resume.

Introduced in notebooks/10_training. A checkpoint is one file holding everything needed
to continue a training run as if it had never stopped: the model's parameters, the
optimiser's state (AdamW's moments m, v and step counts), the step reached, and
whatever else the loop needs (random-number-generator states, the loss history).

Two properties matter more than the format:

* **Atomic writes.** :func:`atomic_save` writes to a temporary file in the same
  directory, flushes and ``fsync``-s it, and only then renames it over the old file
  with ``os.replace`` (an atomic rename on POSIX and Windows). A crash in the middle of
  a save leaves the previous checkpoint untouched instead of half-overwritten.
* **Safe loading.** :func:`read_checkpoint` calls ``torch.load(..., weights_only=True)``,
  PyTorch's restricted unpickler that rebuilds tensors, numbers, strings and containers
  but refuses any other object: a checkpoint cannot execute code when it is opened
  (a plain ``pickle.load`` of an untrusted file can). Corrupt or truncated files, and
  checkpoints of a different model, raise ``ValueError`` naming the file or the keys.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
from pathlib import Path
from typing import IO, Any

import torch
from torch import nn
from torch.optim import Optimizer

__all__ = ["FORMAT", "atomic_save", "check_state_dict", "load_checkpoint", "read_checkpoint",
           "save_checkpoint"]

#: The tag every checkpoint written by :func:`save_checkpoint` carries.
FORMAT = "llmbook-checkpoint-1"


def atomic_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save(obj)`` to ``path`` so that ``path`` is either the old file or the new one.

    The bytes go to a temporary file beside ``path`` (same directory, hence same file
    system, so the final rename is atomic), which is flushed and ``fsync``-ed before
    ``os.replace`` moves it into place; the directory is then ``fsync``-ed so the rename
    itself is durable. If anything fails before the rename, the temporary file is
    removed and the exception propagates; an existing ``path`` is never touched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # directories cannot be opened for fsync everywhere
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return path


def _is_file_object(target: object, method: str) -> bool:
    return not isinstance(target, (str, os.PathLike)) and callable(getattr(target, method, None))


def save_checkpoint(path: str | os.PathLike | IO[bytes], model: nn.Module,
                    optimizer: Optimizer | None, step: int, **extra: Any) -> Path | IO[bytes]:
    """Write a checkpoint of ``model`` (and ``optimizer``) after ``step`` updates, atomically.

    ``extra`` holds anything else to keep (RNG states as tensors, a loss history, a
    config dict); it must consist of tensors, numbers, strings, ``None`` and
    lists/tuples/dicts of them, because :func:`read_checkpoint` loads nothing else.
    ``path`` may also be a binary file object (``io.BytesIO``, an open file): the
    checkpoint is written into it at its current position, and atomicity is then the
    caller's business. Returns the path (or the file object).
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got step={step!r}")
    payload = {
        "format": FORMAT,
        "step": step,
        "model": model.state_dict(),
        "optimizer": None if optimizer is None else optimizer.state_dict(),
        "extra": extra,
    }
    if _is_file_object(path, "write"):
        torch.save(payload, path)
        return path
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str, a path or a binary file object with write(), "
                        f"got {type(path).__name__}")
    return atomic_save(payload, path)


def read_checkpoint(path: str | os.PathLike | IO[bytes]) -> dict[str, Any]:
    """Load a checkpoint file safely (``weights_only=True``) and check its format.

    Returns the dict written by :func:`save_checkpoint`: ``format``, ``step``, ``model``
    (a state dict), ``optimizer`` (a state dict or None) and ``extra``. A missing file is
    a ``FileNotFoundError``; a truncated or corrupt file, a file holding objects that
    the restricted unpickler refuses, or a file that is not an llmbook checkpoint is a
    ``ValueError`` naming the file. ``path`` may also be a binary file object with
    ``read`` and ``seek`` (read from its current position).
    """
    if _is_file_object(path, "read"):
        if not callable(getattr(path, "seek", None)):
            raise TypeError("a checkpoint file object must support seek() (torch.load needs it)")
    elif isinstance(path, (str, os.PathLike)):
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no checkpoint at {path}")
    else:
        raise TypeError(f"path must be a str, a path or a binary file object with read(), "
                        f"got {type(path).__name__}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # The restricted unpickler names the class or function it refused ("GLOBAL
        # module.name"); any other unpickling failure means the bytes are damaged.
        refused = [line.strip() for line in str(exc).splitlines() if "GLOBAL" in line]
        if refused:
            raise ValueError(f"checkpoint {path} holds objects that safe loading "
                             f"(torch.load with weights_only=True) refuses to build, so it "
                             f"was not loaded: {refused[0]}") from None
        raise ValueError(f"checkpoint {path} is corrupt or truncated (it does not "
                         f"unpickle)") from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, IndexError) as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"checkpoint {path} is corrupt or truncated ({first_line})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path} is not an llmbook checkpoint (no format tag {FORMAT!r})")
    return payload


def check_state_dict(model: nn.Module, state: dict[str, torch.Tensor],
                     source: str = "checkpoint") -> None:
    """Raise ``ValueError`` unless ``state`` has exactly the keys and shapes of ``model``'s.

    The message lists the missing keys, the unexpected keys and the shape mismatches
    (up to five of each), so a checkpoint of a different model is recognised at once.
    """
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
              for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or shapes:
        parts = []
        for label, items in (("missing keys", missing), ("unexpected keys", unexpected),
                             ("shape mismatches", shapes)):
            if items:
                more = f" (and {len(items) - 5} more)" if len(items) > 5 else ""
                parts.append(f"{label} {items[:5]}{more}")
        raise ValueError(f"{source} does not fit this model: " + "; ".join(parts))


def load_checkpoint(path: str | os.PathLike | IO[bytes], model: nn.Module,
                    optimizer: Optimizer | None = None) -> int:
    """Restore ``model`` (and ``optimizer``, if given) from a checkpoint; return its step.

    The state dict is checked against the model first (:func:`check_state_dict`), so a
    checkpoint of another model is a ``ValueError`` naming the keys, not a half-loaded
    model. The rest of the file (``extra``) is available from :func:`read_checkpoint`.
    """
    payload = read_checkpoint(path)
    check_state_dict(model, payload["model"], source=f"checkpoint {path}")
    if optimizer is not None and payload["optimizer"] is None:
        raise ValueError(f"checkpoint {path} holds no optimizer state")
    model.load_state_dict(payload["model"])
    if optimizer is not None:
        optimizer.load_state_dict(payload["optimizer"])
    return int(payload["step"])
