"""The book's shipped English corpus: the Python standard library's docstrings.

Introduced in notebooks/01_tokens. ``data/stdlib_docs.txt`` (about 1.3 MB of UTF-8
text, PSF licence) is built by ``data/make_stdlib_docs.py`` from the docstrings of a
fixed list of standard-library modules; see ``data/README.md``. Chapters that need
real text (training tokenizers and small language models) load it from here.
"""

from __future__ import annotations

from pathlib import Path

from llmbook.paths import data_path, missing_data

__all__ = ["load_stdlib_docs", "stdlib_docs_path"]


def stdlib_docs_path() -> Path:
    """Path of ``stdlib_docs.txt`` in the book's data (:func:`llmbook.paths.data_dir`).

    ``FileNotFoundError`` naming the remedies if it is absent.
    """
    path = data_path("stdlib_docs.txt")
    if not path.is_file():
        raise missing_data(path, "the corpus", "python data/make_stdlib_docs.py")
    return path


def load_stdlib_docs(max_bytes: int | None = None) -> str:
    """The corpus as a string; with ``max_bytes``, only its first ``max_bytes`` bytes.

    The cut falls back to the last complete UTF-8 character at or before
    ``max_bytes``, so the result always decodes and ``len(result.encode()) <= max_bytes``.
    """
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int)):
        raise TypeError(f"max_bytes must be an int or None, got {type(max_bytes).__name__}")
    if max_bytes is not None and max_bytes < 0:
        raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
    data = stdlib_docs_path().read_bytes()
    if max_bytes is not None:
        data = data[:max_bytes]
    return data.decode("utf-8", errors="ignore") if max_bytes is not None else data.decode("utf-8")
