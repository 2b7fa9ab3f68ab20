"""Argument checks shared by the package: validate at the door, name the offending value.

Every public function of ``llmbook`` checks the arguments it relies on and raises a
``TypeError`` (wrong kind of value) or ``ValueError`` (right kind, wrong value) whose
message names the argument and the value it got.
"""

from __future__ import annotations

import numpy as np

__all__ = ["check_positive_int"]


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
