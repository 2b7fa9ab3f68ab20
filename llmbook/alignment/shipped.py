"""Shipped artifacts of Part V: trained reward models, policies and preference data.

Part V trains things (a reward model, PPO, DPO and GRPO policies, an arithmetic model)
whose results the chapters show. As with the book's base models
(:mod:`llmbook.training.pretrained`), training arithmetic differs between CPUs in the last
bits, and an RL run amplifies such a difference into a different sampled token and then a
different run; so the trained tensors are shipped as files and every reader loads the
same ones. A chapter can still train in front of the reader for a few steps, and the full
recipe stays one command away: ``make models`` (which also runs
``python -m llmbook.alignment.shipped``).

An *artifact* is a named folder ``data/models/<name>/`` holding

* ``tensors.safetensors``: a flat dict of named tensors (weights, token ids, curves);
* ``info.json``: the recipe, its hash, anything the trainer reports (histories, scores)
  and how, where and when it was made.

Each chapter module registers its artifacts with :func:`register` (a recipe dict and a
function ``recipe -> (tensors, info)``); :func:`load_artifact` returns the shipped tensors
after checking that the recipe they were made from is still the one in the code, and
:func:`write_artifact` retrains and rewrites one.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from llmbook.training.pretrained import machine_facts, models_dir

__all__ = ["ARTIFACTS", "Artifact", "artifact_hash", "load_artifact", "register", "write_artifact"]

#: Bumped when shared training code changes in a way the recipes do not show.
ARTIFACT_VERSION = 1

Trainer = Callable[[dict[str, Any]], tuple[dict[str, Tensor], dict[str, Any]]]


@dataclass(frozen=True)
class Artifact:
    """A registered artifact: its ``name``, ``recipe`` (JSON-able) and ``trainer``.

    ``trainer(recipe)`` returns ``(tensors, info)``: a flat dict of tensors to ship and a
    JSON-able dict of facts about them (curves, scores). ``module`` names the module that
    registered it, so :func:`write_artifact` can import it by name.
    """

    name: str
    recipe: dict[str, Any]
    trainer: Trainer
    module: str


#: name -> Artifact, filled by the chapter modules when they are imported.
ARTIFACTS: dict[str, Artifact] = {}

#: Modules that register artifacts; :func:`_import_all` imports them for the CLI.
ARTIFACT_MODULES = (
    "llmbook.alignment.preferences",
    "llmbook.alignment.reward_model",
    "llmbook.alignment.ppo",
    "llmbook.alignment.dpo",
    "llmbook.alignment.reasoning",
    "llmbook.scale.moe_training",
    "llmbook.scale.induction",
)


def register(name: str, recipe: dict[str, Any], trainer: Trainer, module: str) -> Artifact:
    """Register artifact ``name`` (idempotent for the same module); returns it."""
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"artifact name must be a non-empty string without '/', got {name!r}")
    if name in ARTIFACTS and ARTIFACTS[name].module != module:
        raise ValueError(f"artifact {name!r} is already registered by {ARTIFACTS[name].module}")
    json.dumps(recipe)  # the recipe must be JSON-able: it is hashed and stored
    ARTIFACTS[name] = Artifact(name, recipe, trainer, module)
    return ARTIFACTS[name]


def _get(name: object) -> Artifact:
    if not isinstance(name, str):
        raise TypeError(f"artifact name must be a str, got {type(name).__name__}")
    if name not in ARTIFACTS:
        for module in ARTIFACT_MODULES:  # registering happens on import
            try:
                __import__(module)
            except ModuleNotFoundError as err:
                if err.name != module:
                    raise
    if name not in ARTIFACTS:
        raise ValueError(f"unknown artifact {name!r}; registered: {sorted(ARTIFACTS)}")
    return ARTIFACTS[name]


def artifact_hash(name: str) -> str:
    """The first 12 hex digits of SHA-256 of the recipe of ``name`` (and the version)."""
    art = _get(name)
    text = json.dumps({"version": ARTIFACT_VERSION, "name": name, **art.recipe}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def write_artifact(name: str, directory: str | os.PathLike | None = None) -> dict[str, Any]:
    """Run the trainer of ``name`` and write ``<directory>/<name>/``; returns its info.

    ``directory`` defaults to :func:`~llmbook.training.pretrained.models_dir`.
    """
    from safetensors.torch import save_file

    art = _get(name)
    began = time.perf_counter()
    tensors, info = art.trainer(art.recipe)
    seconds = time.perf_counter() - began
    info = {"name": name, "recipe_hash": artifact_hash(name), "recipe": art.recipe, **info,
            "train_seconds": seconds,
            "made": {"command": f"python -m llmbook.alignment.shipped {name}",
                     "date": datetime.date.today().isoformat(), **machine_facts()}}
    folder = Path(directory or models_dir()) / name
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in tensors.items()},
              str(folder / "tensors.safetensors"), metadata={"recipe_hash": info["recipe_hash"]})
    (folder / "info.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def load_artifact(name: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The shipped ``(tensors, info)`` of artifact ``name``.

    Raises a ``ValueError`` naming the command that rewrites the files if they are
    missing or were made from another recipe than the registered one.
    """
    from safetensors.torch import load_file

    art = _get(name)
    folder = models_dir() / name
    info_path, data = folder / "info.json", folder / "tensors.safetensors"
    fix = f"`python -m llmbook.alignment.shipped {name}` (or `make models`) rewrites it"
    if not (info_path.is_file() and data.is_file()):
        raise ValueError(f"the shipped artifact {name!r} is missing from {folder}; {fix}")
    info = json.loads(info_path.read_text())
    if info.get("recipe_hash") != artifact_hash(art.name):
        raise ValueError(f"the shipped artifact {name!r} was made from recipe "
                         f"{info.get('recipe_hash')}, but the code's recipe is now "
                         f"{artifact_hash(art.name)}; {fix}")
    return load_file(str(data)), info


def _import_all() -> None:
    for module in ARTIFACT_MODULES:
        try:
            __import__(module)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise


def main(argv: list[str] | None = None) -> int:
    """Retrain Part V's artifacts from their recipes and rewrite their files (in order)."""
    _import_all()
    parser = argparse.ArgumentParser(prog="python -m llmbook.alignment.shipped", description=main.__doc__)
    parser.add_argument("names", nargs="*", default=list(ARTIFACTS), help="which artifacts")
    parser.add_argument("--out", default=None, help="folder to write to (default: data/models)")
    args = parser.parse_args(argv)
    for name in args.names:
        info = write_artifact(name, args.out)
        print(f"{name}: made in {info['train_seconds']:.0f} s; written to "
              f"{Path(args.out or models_dir()) / name}")
    return 0


if __name__ == "__main__":  # run the imported module's main, whose registry the chapters fill
    from llmbook.alignment.shipped import main as _main

    sys.exit(_main())
