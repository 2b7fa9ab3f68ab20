"""How ``make lab`` opens the book in JupyterLab: each chapter once, as a notebook, paired.

``make lab`` runs ``jupyter lab --config=tools/jupyter_lab_config.py``, which calls
:func:`configure`. The server is rooted at ``notebooks/``, where ``jupytext.toml`` pairs
every ``NN_slug.ipynb`` with its ``NN_slug.py`` (jupytext finds its configuration in the
folder of the notebook or above it, but only inside the server's root). Saving a chapter
in the lab writes both files; saving it unchanged rewrites them byte for byte.

:class:`BookContentsManager` is jupytext's contents manager with one change: a folder's
listing leaves out the text half of each pair (``NN_slug.py`` beside ``NN_slug.ipynb``),
so every chapter is listed once, as the notebook that holds its outputs. Files without a
twin, such as ``solutions/NN_slug.py``, are listed as they are.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from jupytext.async_contentsmanager import build_async_jupytext_contents_manager_class

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"

__all__ = ["NOTEBOOKS", "BookContentsManager", "configure", "paired_sources"]


def paired_sources(names: list[str]) -> set[str]:
    """The ``.py`` names in ``names`` whose ``.ipynb`` twin is also in ``names``."""
    present = set(names)
    return {n for n in present if n.endswith(".py") and n[:-3] + ".ipynb" in present}


class BookContentsManager(build_async_jupytext_contents_manager_class(AsyncLargeFileManager)):
    """Jupytext's pairing contents manager; folder listings show each pair once."""

    async def get(self, path: str, content: bool = True, type: str | None = None,
                  format: str | None = None, **kwargs: Any) -> dict[str, Any]:
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        if model.get("type") == "directory" and model.get("content"):
            hidden = paired_sources([entry["name"] for entry in model["content"]])
            model["content"] = [e for e in model["content"] if e["name"] not in hidden]
        return model


def configure(c: Any, root: Path = NOTEBOOKS) -> None:
    """Fill a Jupyter config object ``c`` (``get_config()`` in a config file) for the book."""
    c.ServerApp.root_dir = str(root)
    c.ServerApp.contents_manager_class = BookContentsManager
    # JupyterLab refuses to start as root unless told; containers often run as root
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        c.ServerApp.allow_root = True
