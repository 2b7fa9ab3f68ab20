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
    # 2.5: scaled_dot_product_attention's enable_gqa (chapters 4, 13) and a fully masked row
    # returned as zeros rather than NaN (chapter 4); check_environment runs both
    "torch": ("2.5", "tensors, autograd, the models; SDPA with enable_gqa and fully masked rows"),
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


def _attention_smoke_test() -> list[str]:
    """What the chapters need of ``scaled_dot_product_attention`` (torch >= 2.5), as problems.

    Grouped-query attention through ``enable_gqa=True`` (4 query heads sharing 2 key/value
    heads) must equal the key/value heads repeated by hand, and a row whose mask is all
    ``False`` must come back as zeros, not NaN.
    """
    import torch
    import torch.nn.functional as F

    problems = []
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 3, 8, generator=g)
    k, v = torch.randn(2, 1, 2, 3, 8, generator=g)
    try:
        gqa = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    except TypeError:
        problems.append("torch's scaled_dot_product_attention has no enable_gqa (needs torch >= 2.5)")
    else:
        ref = F.scaled_dot_product_attention(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1))
        if not torch.allclose(gqa, ref, atol=1e-6):
            problems.append("scaled_dot_product_attention(enable_gqa=True) disagrees with repeated heads")
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[1] = False
    row = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)[..., 1, :]
    if not torch.equal(row, torch.zeros_like(row)):
        problems.append("scaled_dot_product_attention gives a fully masked row that is not zero (needs torch >= 2.5)")
    return problems


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
        problems.extend(_attention_smoke_test())
    if problems:
        raise RuntimeError(
            "The environment is not ready for the book:\n  - " + "\n  - ".join(problems)
            + "\nFix: run `make setup` (or `pip install torch==2.13.0 && pip install -e '.[dev]'`)."
        )
    return rows
