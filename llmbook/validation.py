"""Argument checks shared by the package: validate at the door, name the offending value.

Every public function of ``llmbook`` checks the arguments it relies on and raises a
``TypeError`` (wrong kind of value) or ``ValueError`` (right kind, wrong value) whose
message names the argument and the value it got.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["check_floating_tensor", "check_positive_int"]


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


def check_floating_tensor(x: object, name: str) -> Any:
    """Return ``x`` if it is a floating-point ``torch.Tensor``, else raise ``TypeError``
    naming ``name`` and what it got (a list, an integer tensor...)."""
    import torch

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    return x
