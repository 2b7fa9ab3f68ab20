"""Where the book's shipped data lives, in a source checkout and in an installed wheel.

The data (the corpus ``stdlib_docs.txt``, the held-out prose, the worked example, the
trained models under ``models/``, the scaling and quantisation results) has one home in
the repository: its ``data/`` folder. A wheel (``pip install .``, not editable) carries a
copy of it inside the package, as ``llmbook/_data/`` (``setup.py`` copies it at build
time). Every loader in the package finds it through :func:`data_dir`, which looks, in
order, at

1. ``LLMBOOK_DATA``, if set: a folder laid out like the repository's ``data/``;
2. the source checkout's ``data/`` (the package sits beside ``pyproject.toml``);
3. the wheel's ``llmbook/_data/``.

:func:`missing_data` builds the one error every loader raises when a file is absent, so
that each names the same remedies.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DATA_ENV", "data_dir", "data_path", "missing_data", "source_checkout"]

#: The environment variable that points every loader at another copy of ``data/``.
DATA_ENV = "LLMBOOK_DATA"

_PACKAGE = Path(__file__).resolve().parent


def source_checkout() -> Path | None:
    """The repository root when the package is imported from a source checkout, else None.

    A checkout is recognised by ``pyproject.toml`` and ``data/`` beside the package
    (an editable install or ``PYTHONPATH`` at the clone); an installed wheel has neither.
    """
    root = _PACKAGE.parent
    return root if (root / "pyproject.toml").is_file() and (root / "data").is_dir() else None


def data_dir() -> Path:
    """The folder holding the book's data (see the module's docstring for the order).

    It is not checked for completeness here; a loader that misses a file raises
    :func:`missing_data`.
    """
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser()
    root = source_checkout()
    if root is not None:
        return root / "data"
    return _PACKAGE / "_data"


def data_path(*parts: str) -> Path:
    """``data_dir()`` joined with ``parts``, e.g. ``data_path("models", "text")``."""
    for part in parts:
        if not isinstance(part, str) or not part or part.startswith(("/", "\\")) or ".." in part:
            raise ValueError(f"data_path: each part must be a relative name, got {part!r}")
    return data_dir().joinpath(*parts)


def missing_data(path: Path, what: str, remake: str | None = None,
                 error: type[Exception] = FileNotFoundError) -> Exception:
    """The error (of type ``error``) for a shipped file that is absent, naming every remedy.

    ``what`` says what the file is ("the corpus"); ``remake`` is the command that
    rebuilds it from a source checkout, if there is one. The caller raises it.
    """
    lines = [f"{what} is missing: {path}",
             f"  the data folder in use is {data_dir()} "
             f"(set {DATA_ENV} to a folder laid out like the repository's data/ to use another);",
             "  an installed wheel carries the data in llmbook/_data/: reinstall with "
             "`pip install --force-reinstall llmbook` (or `pip install .` from a clone)"]
    if remake:
        lines.append(f"  from a source checkout, `{remake}` rebuilds it")
    return error("\n".join(lines))
