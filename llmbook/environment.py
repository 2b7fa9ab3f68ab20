"""Check that the machine has what the book needs, and fail loudly when it does not.

Introduced in notebooks/00_preface. :func:`check_environment` imports every package
the chapters use, compares its version with the minimum the book was tested with,
runs a tiny smoke test of the numerical stack, and raises ``RuntimeError`` naming
every problem at once, with the command that fixes it.
"""

from __future__ import annotations

import importlib
import platform
import sys
from dataclasses import dataclass

__all__ = ["REQUIREMENTS", "PackageStatus", "check_environment", "environment_table", "parse_version"]

#: Package (import name) -> (minimum version, what the book uses it for).
REQUIREMENTS: dict[str, tuple[str, str]] = {
    "torch": ("2.4", "tensors, autograd, the models"),
    "numpy": ("1.26", "arrays"),
    "sympy": ("1.13.3", "every derivation"),
    "matplotlib": ("3.8", "figures"),
    "regex": ("2023.0", "GPT-2 pre-tokenisation (Unicode classes)"),
    "tqdm": ("4.66", "progress bars"),
    "tokenizers": ("0.20", "peer for the BPE tokenizer"),
    "transformers": ("4.45", "peer models"),
}

MIN_PYTHON = (3, 11)


def parse_version(text: str) -> tuple[int, ...]:
    """``"2.13.0+cpu"`` -> ``(2, 13, 0)``: the leading numeric release parts of a version."""
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


@dataclass(frozen=True)
class PackageStatus:
    """One row of the environment table."""

    name: str
    required: str
    found: str | None
    purpose: str

    @property
    def ok(self) -> bool:
        return self.found is not None and parse_version(self.found) >= parse_version(self.required)


def _status(name: str, required: str, purpose: str) -> PackageStatus:
    try:
        module = importlib.import_module(name)
    except Exception:  # ImportError, or a broken install raising something else
        return PackageStatus(name, required, None, purpose)
    return PackageStatus(name, required, str(getattr(module, "__version__", "0")), purpose)


def environment_table(requirements: dict[str, tuple[str, str]] | None = None) -> list[PackageStatus]:
    """The status of every required package, without raising."""
    reqs = REQUIREMENTS if requirements is None else requirements
    return [_status(name, req, purpose) for name, (req, purpose) in reqs.items()]


def check_environment(requirements: dict[str, tuple[str, str]] | None = None, verbose: bool = True) -> list[PackageStatus]:
    """Print the environment table and raise ``RuntimeError`` if anything is missing or too old.

    Also checks the Python version and that torch can multiply two matrices and
    differentiate through the product (a broken binary install fails here).
    """
    rows = environment_table(requirements)
    problems = []
    if sys.version_info[:2] < MIN_PYTHON:
        problems.append(f"Python {platform.python_version()} is older than {'.'.join(map(str, MIN_PYTHON))}")
    for row in rows:
        if row.found is None:
            problems.append(f"{row.name} is not installed (needed for {row.purpose})")
        elif not row.ok:
            problems.append(f"{row.name} {row.found} is older than {row.required}")
    if verbose:
        print(f"Python {platform.python_version()} on {platform.system()} {platform.machine()}")
        for row in rows:
            mark = "ok" if row.ok else "MISSING" if row.found is None else "TOO OLD"
            print(f"  {row.name:<13}{row.found or '-':<14}>= {row.required:<10}{mark:<9}{row.purpose}")
    if not problems and all(r.ok for r in rows if r.name == "torch"):
        import torch

        a = torch.arange(6.0).reshape(2, 3).requires_grad_()
        (a @ a.T).sum().backward()
        if a.grad is None or not torch.isfinite(a.grad).all():
            problems.append("torch is installed but autograd does not work")
    if problems:
        raise RuntimeError(
            "The environment is not ready for the book:\n  - " + "\n  - ".join(problems)
            + "\nFix: run `make setup` (or `pip install torch==2.13.0 && pip install -e '.[dev]'`)."
        )
    return rows
