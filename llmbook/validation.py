"""Argument checks shared by the package: validate at the door, name the offending value.

Every public function of ``llmbook`` checks the arguments it relies on and raises a
``TypeError`` (wrong kind of value) or ``ValueError`` (right kind, wrong value) whose
message names the argument and the value it got.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

__all__ = ["check_array", "check_finite", "check_floating_tensor", "check_index", "check_keys", "check_nonempty",
           "check_nonnegative_number", "check_positive_int", "check_positive_number", "check_probability",
           "check_same_dtype", "check_sequence", "check_token_ids"]


def check_positive_int(name: str, value: object) -> int:
    """Return ``value`` as an ``int`` if it is a positive integer (not a bool), else raise.

    >>> check_positive_int("d_model", 64)
    64
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {name}={value}")
    return int(value)


def check_positive_number(name: str, value: object) -> float:
    """Return ``value`` as a ``float`` if it is a positive finite real number (not a bool).

    >>> check_positive_number("beta", 0.1)
    0.1
    """
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {name}={value}")
    return float(value)


def check_nonnegative_number(name: str, value: object) -> float:
    """Return ``value`` as a ``float`` if it is a finite real number >= 0 (not a bool), else raise.

    >>> check_nonnegative_number("latency", 0)
    0.0
    """
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {name}={value}")
    return float(value)


def check_index(name: str, value: object, size: int) -> int:
    """Return ``value`` as an ``int`` if it is an integer (not a bool) in [0, ``size``), else
    raise ``TypeError`` (not an int) or ``ValueError`` (out of range): ranks, layers, heads.

    >>> check_index("rank", 1, 4)
    1
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if not 0 <= value < size:
        raise ValueError(f"{name} must be an int in [0, {size}), got {name}={value}")
    return int(value)


def check_probability(name: str, value: object, allow_zero: bool = True) -> float:
    """Return ``value`` as a ``float`` if it is a number in [0, 1] ((0, 1] when ``allow_zero``
    is False), else raise ``TypeError`` (not a number) or ``ValueError`` (outside, or NaN).

    >>> check_probability("top_p", 0.9, allow_zero=False)
    0.9
    """
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not ((0 <= value if allow_zero else 0 < value) and value <= 1):
        raise ValueError(f"{name} must lie in {'[' if allow_zero else '('}0, 1], got {name}={value}")
    return float(value)


def check_token_ids(x: object, name: str, ndim: int | None = None, vocab_size: int | None = None) -> Any:
    """Return ``x`` if it is an integer ``torch.Tensor`` (token ids) with ``ndim`` dimensions
    (any number if None), every id in [0, ``vocab_size``) when that is given, else raise a
    ``TypeError`` (not an integer tensor) or a ``ValueError`` (wrong number of dimensions, an
    id out of range: an embedding lookup would fail with a bare IndexError) naming ``name``."""
    import torch

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor of token ids, got {type(x).__name__}")
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor of token ids, got dtype {x.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-d (have {ndim} dimensions), got shape {tuple(x.shape)}")
    if vocab_size is not None and x.numel() and not bool(((x >= 0) & (x < vocab_size)).all()):
        bad = x[(x < 0) | (x >= vocab_size)][0].item()
        raise ValueError(f"{name} must hold token ids in [0, {vocab_size}), found {bad}")
    return x


def check_floating_tensor(x: object, name: str) -> Any:
    """Return ``x`` if it is a floating-point ``torch.Tensor``, else raise ``TypeError``
    naming ``name`` and what it got (a list, an integer tensor...)."""
    import torch

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    return x


def check_finite(x: Any, name: str, allow_inf: bool = False) -> Any:
    """Return the tensor ``x`` if it holds no NaN (and no +-inf unless ``allow_inf``), else raise
    ``ValueError`` naming ``name``, the first offending entry and its value: a NaN that enters
    a loss comes out as a NaN loss, far from its cause."""
    import torch

    bad = torch.isnan(x) if allow_inf else ~torch.isfinite(x)
    if bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0]) if x.ndim else ()
        what = "NaN" if allow_inf else "NaN or inf"
        raise ValueError(f"{name} must not hold {what}; {name}[{', '.join(map(str, where))}] = "
                         f"{x[where].item()}")
    return x


def check_nonempty(x: Any, name: str) -> Any:
    """Return the tensor ``x`` if it has at least one entry, else raise ``ValueError`` naming
    ``name`` and its shape (a mean over nothing is NaN, a loop over nothing builds nothing)."""
    if x.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(x.shape)}): need at least one entry")
    return x


def check_same_dtype(x: Any, name: str, like: Any, like_name: str) -> Any:
    """Return the tensor ``x`` if its dtype is that of ``like``, else raise ``TypeError`` naming
    both (a float64 input to float32 weights fails deep inside a matmul, or silently promotes)."""
    if x.dtype != like.dtype:
        raise TypeError(f"{name} must have the dtype of {like_name}, {like.dtype}, got {x.dtype}")
    return x


def check_sequence(x: object, name: str, width: int, like: Any, like_name: str = "the layer's weights") -> Any:
    """Return ``x`` if it is a floating-point (batch, T, ``width``) tensor with T >= 1 and the
    dtype of ``like``, else raise ``TypeError`` (not a floating tensor, another dtype) or
    ``ValueError`` (another shape) naming ``name``: the input of a sequence-mixing layer."""
    check_floating_tensor(x, name)
    if x.ndim != 3 or x.shape[-1] != width or x.shape[1] == 0:
        raise ValueError(f"{name} must have shape (batch, T, d_model) = (batch, T, {width}) with T >= 1, "
                         f"got {tuple(x.shape)}")
    return check_same_dtype(x, name, like, like_name)


def check_keys(mapping: object, name: str, keys: Iterable[str]) -> Mapping:
    """Return ``mapping`` if it is a mapping holding every one of ``keys``, else raise
    ``TypeError`` (not a mapping) or ``ValueError`` naming ``name``, the missing keys and all
    the required ones (a bare ``KeyError: 'lr'`` says neither what was given nor what is needed).

    >>> check_keys({"seed": 0, "lr": 0.1}, "spec", ("seed", "lr"))
    {'seed': 0, 'lr': 0.1}
    """
    if not isinstance(mapping, Mapping):
        raise TypeError(f"{name} must be a dict, got {type(mapping).__name__}")
    keys = list(keys)
    missing = [k for k in keys if k not in mapping]
    if missing:
        raise ValueError(f"{name} is missing the key(s) {missing}: it needs {keys}, got {list(mapping)}")
    return mapping


def check_array(name: str, values: object, ndim: int = 1, sign: str | None = None) -> np.ndarray:
    """``values`` (a list, tuple, numpy array or tensor) as a finite float64 array of ``ndim`` dims.

    ``sign`` adds ``"nonnegative"`` (every entry >= 0) or ``"positive"`` (every entry > 0).
    A 1-D array must be non-empty. Raises ``TypeError`` for a string, a scalar or entries that
    are not numbers, and ``ValueError`` for the wrong number of dimensions, an empty vector, a
    non-finite entry or one of the wrong sign; each message names ``name``.
    """
    if sign not in (None, "nonnegative", "positive"):
        raise ValueError(f"sign must be None, 'nonnegative' or 'positive', got {sign!r}")
    if hasattr(values, "detach"):  # a torch tensor, without importing torch here
        values = values.detach().cpu().numpy()  # type: ignore[union-attr]
    if isinstance(values, str | bytes) or not isinstance(values, list | tuple | np.ndarray):
        raise TypeError(f"{name} must be a sequence of numbers, got {type(values).__name__}")
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must hold numbers, got {values!r}") from err
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {arr.shape}")
    if ndim == 1 and arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {arr.tolist()}")
    if sign == "positive" and np.any(arr <= 0):
        raise ValueError(f"{name} must be positive, got {arr.tolist()}")
    if sign == "nonnegative" and np.any(arr < 0):
        raise ValueError(f"{name} must be non-negative, got {arr.tolist()}")
    return arr
