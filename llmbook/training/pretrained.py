"""The book's own small trained models, shipped as weights in the repository.

Introduced in notebooks/10_training; the later chapters (decoding, the KV cache,
quantisation, alignment) start from these models instead of downloading one. Two
recipes (:data:`RECIPES`):

* ``book_model("synthetic")``: a 2-layer GPT-2-style model (d = 64, 4 heads, the exact
  erf GELU; 0.1M parameters) trained on the synthetic Markov source of chapter 3
  (:func:`llmbook.text.data.default_source`, V = 16, entropy rate H = 1.6184 nats/token).
  Its validation loss on predictions with the full order-2 context comes within 3 % of
  H: the model has learned the source, up to what a finite sample can teach;
* ``book_model("text")``: a 4-layer GPT-2-style model (d = 192, 6 heads, context 128;
  2M parameters) over a 1024-token byte-level BPE vocabulary (chapter 1's tokenizer),
  trained on the Python standard library's docstrings (:mod:`llmbook.text.corpus`);
  ``info["tokenizer"]`` encodes and decodes its text.

Why ship weights instead of training on first use: training arithmetic is not the same
on every CPU (vector width, BLAS kernels and thread count change the order of float
sums), and a difference in the last bit of one step grows over hundreds of steps into a
different model. Loading the same file gives every reader the same model, so every
output downstream of it is the same. The files live in ``data/models/<kind>/``:

* ``model.safetensors``: the weights (float32, safetensors: a format that holds tensors
  and nothing else, so opening it cannot run code);
* ``info.json``: the recipe and its hash, the training history, the validation loss,
  and how, where and when the file was made;
* ``encoder.json`` + ``vocab.bpe`` (text model): the tokenizer in GPT-2's file format.

Training from the recipe stays one command away: ``make models`` (which runs
``python -m llmbook.training.pretrained``) retrains both and rewrites the files, and
``book_model(kind, retrain=True)`` trains one in memory. Sampling text from them is
chapter 12's subject (:mod:`llmbook.inference.sampling`).

The scripts ``data/make_*.py`` that ship other trained results share the plumbing at the
end of this module: :func:`machine_facts` (where a file was made), :func:`write_json` (the
book's JSON layout, written atomically), :func:`write_sweep` (a finished sweep with its
seconds) and :func:`run_in_parts` with :func:`merge_parts` (long runs kept one file per
seed, so that an interrupted run resumes where it stopped and several processes can share
the work).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from llmbook.paths import data_path, missing_data
from llmbook.text.data import default_source
from llmbook.training.train import TrainConfig, evaluate, train
from llmbook.transformer.model import TransformerConfig, TransformerLM

__all__ = ["RECIPES", "add_part_arguments", "book_model", "machine_facts", "merge_parts", "models_dir",
           "part_path", "recipe_hash", "run_in_parts", "write_book_model", "write_json", "write_sweep"]

#: Bumped when the training code changes in a way the recipe dicts do not show.
RECIPE_VERSION = 2

RECIPES: dict[str, dict[str, Any]] = {
    "synthetic": {
        "model": TransformerConfig.gpt2_style(
            vocab_size=16, d_model=64, n_layers=2, n_heads=4, max_seq_len=16,
            activation="gelu").to_dict(),
        "train": TrainConfig(
            steps=600, batch_size=128, context_length=16, lr=1e-2, min_lr=1e-3,
            warmup_steps=30, weight_decay=0.1, betas=(0.9, 0.95), grad_clip=1.0,
            eval_every=50, eval_batches=4, seed=0).to_dict(),
        "data": {"source": "default_source", "num_train": 1_000_000, "num_val": 100_000,
                 "seed": 0},
        "init_seed": 0,
        "final_eval": {"batch_size": 256, "num_batches": 20},
    },
    "text": {
        "model": TransformerConfig.gpt2_style(
            vocab_size=1024, d_model=192, n_layers=4, n_heads=6, max_seq_len=128,
            activation="gelu").to_dict(),
        "train": TrainConfig(
            steps=1000, batch_size=32, context_length=128, lr=3e-3, min_lr=3e-4,
            warmup_steps=50, weight_decay=0.1, betas=(0.9, 0.95), grad_clip=1.0,
            eval_every=100, eval_batches=8, seed=0).to_dict(),
        "data": {"corpus": "stdlib_docs", "bpe_vocab_size": 1024, "val_fraction": 0.1},
        "init_seed": 0,
        "final_eval": {"batch_size": 64, "num_batches": 20},
    },
}

#: What ``make models`` runs; recorded in each ``info.json``.
COMMAND = "make models  (= python -m llmbook.training.pretrained)"


def models_dir() -> Path:
    """``models/`` in the book's data (:func:`llmbook.paths.data_dir`), where the weights live.

    ``LLMBOOK_MODELS`` overrides it (``make models`` into another folder, or tests).
    """
    env = os.environ.get("LLMBOOK_MODELS")
    return Path(env) if env else data_path("models")


def recipe_hash(kind: str) -> str:
    """The first 12 hex digits of SHA-256 of the recipe (and :data:`RECIPE_VERSION`)."""
    text = json.dumps({"version": RECIPE_VERSION, "kind": kind, **RECIPES[kind]}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _check_kind(kind: object) -> str:
    if kind not in RECIPES:
        raise ValueError(f"kind must be one of {sorted(RECIPES)}, got {kind!r}")
    return str(kind)


# ---------------------------------------------------------------- training from the recipe


def _synthetic_data(recipe: dict[str, Any]) -> tuple[Tensor, Tensor, dict[str, Any], Any]:
    d = recipe["data"]
    source = default_source()
    tr, va = source.train_val(d["num_train"], d["num_val"], seed=d["seed"])
    return tr, va, {"entropy_rate": source.entropy_rate(), "order": source.order}, None


def _text_data(recipe: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, dict[str, Any], Any]:
    from llmbook.text.corpus import load_stdlib_docs
    from llmbook.text.tokenizer import BPETokenizer, train_bpe

    d = recipe["data"]
    text = load_stdlib_docs()
    tokenizer = BPETokenizer(*train_bpe(text, d["bpe_vocab_size"]))
    ids = np.asarray(tokenizer.encode(text), dtype=np.uint16)  # (N,)
    n_train = int(len(ids) * (1 - d["val_fraction"]))
    val_bytes = len(tokenizer.decode(ids[n_train:].tolist()).encode("utf-8"))
    return ids[:n_train], ids[n_train:], {"val_bytes": val_bytes}, tokenizer


def machine_facts() -> dict[str, Any]:
    """The CPU, core count, torch threads and kernel level, platform and versions of this machine."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__}


def _train_book_model(kind: str) -> tuple[TransformerLM, dict[str, Any], Any]:
    """Train ``kind`` from its recipe; return (model in eval mode, info, tokenizer or None)."""
    recipe = RECIPES[kind]
    tr, va, extra, tokenizer = (_synthetic_data if kind == "synthetic" else _text_data)(recipe)
    config = TrainConfig(**{**recipe["train"], "betas": tuple(recipe["train"]["betas"])})
    model = TransformerLM(TransformerConfig(**recipe["model"]),
                          generator=torch.Generator().manual_seed(recipe["init_seed"]))
    began = time.perf_counter()
    history = train(model, tr, va, config)
    seconds = time.perf_counter() - began
    fe = recipe["final_eval"]
    first = extra["order"] - 1 if kind == "synthetic" else 0  # full-context predictions
    val_loss = evaluate(model, va, fe["batch_size"], config.context_length, fe["num_batches"],
                        torch.Generator().manual_seed(1234), first_position=first)
    info: dict[str, Any] = {
        "kind": kind, "recipe_hash": recipe_hash(kind), "recipe": recipe,
        "history": history.to_dict(), "train_seconds": seconds,
        "val_loss": val_loss, "val_first_position": first, "num_train_tokens": len(tr),
        "num_val_tokens": len(va), **extra,
    }
    if kind == "synthetic":
        info["val_loss_over_entropy_rate"] = val_loss / extra["entropy_rate"]
    else:  # nats/token -> bits/byte: times tokens per byte of the held-out text, over ln 2
        info["val_bits_per_byte"] = val_loss * len(va) / extra["val_bytes"] / math.log(2)
    return model.eval(), info, tokenizer


def write_book_model(kind: str, directory: str | os.PathLike | None = None) -> dict[str, Any]:
    """Train ``kind`` from its recipe and write its files to ``directory/<kind>/``.

    ``directory`` defaults to :func:`models_dir`. Writes ``model.safetensors``,
    ``info.json`` (with the command, machine and date that made it) and, for the text
    model, the tokenizer as ``encoder.json`` + ``vocab.bpe``. Returns the info dict.
    """
    from safetensors.torch import save_model

    kind = _check_kind(kind)
    model, info, tokenizer = _train_book_model(kind)
    info["made"] = {"command": COMMAND, "date": datetime.date.today().isoformat(),
                    **machine_facts()}
    folder = Path(directory or models_dir()) / kind
    folder.mkdir(parents=True, exist_ok=True)
    save_model(model, str(folder / "model.safetensors"), metadata={"recipe_hash": info["recipe_hash"]})
    if tokenizer is not None:
        from llmbook.text.tokenizer import write_gpt2_files

        write_gpt2_files(folder, tokenizer.vocab, tokenizer.merges)
    (folder / "info.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


# ---------------------------------------------------------------- loading


def _load_tokenizer(folder: Path) -> Any:
    from llmbook.text.tokenizer import BPETokenizer, read_gpt2_files

    vocab, merges, _ = read_gpt2_files(folder / "encoder.json", folder / "vocab.bpe")
    return BPETokenizer(vocab, merges)


def book_model(kind: str = "synthetic", retrain: bool = False) -> tuple[TransformerLM, dict[str, Any]]:
    """The book's trained model of ``kind`` ("synthetic" or "text") and a dict about it.

    Loads the shipped weights from ``models_dir()/<kind>/`` (no training; the same model
    on every machine). ``retrain=True`` trains the model from :data:`RECIPES` instead,
    in memory (about 20 s for "synthetic", about 20 min for "text" on 2 CPU cores); its
    weights are close to the shipped ones in quality but not equal bit for bit unless
    the machine is the one that made them. The model is returned in eval mode.

    ``info`` holds ``val_loss`` (nats/token on held-out data; for "synthetic" only the
    predictions that see the source's full order-2 context, so it is comparable with
    ``entropy_rate``), ``history`` (a :class:`~llmbook.training.train.TrainHistory` as a dict),
    ``recipe``, ``made`` (command, machine and date of the shipped file), ``trained_now``
    and, for "text", ``val_bits_per_byte`` and ``tokenizer`` (a
    :class:`~llmbook.text.tokenizer.BPETokenizer`).

    A ``ValueError`` says so if the shipped files are missing or were made from another
    recipe than the one in :data:`RECIPES` (then ``make models`` rewrites them).
    """
    kind = _check_kind(kind)
    if retrain:
        model, info, tokenizer = _train_book_model(kind)
        info["trained_now"] = True
        if tokenizer is not None:
            info["tokenizer"] = tokenizer
        return model, info
    from safetensors.torch import load_model

    folder = models_dir() / kind
    info_path, weights = folder / "info.json", folder / "model.safetensors"
    if not (info_path.is_file() and weights.is_file()):
        raise missing_data(folder, f"the shipped {kind!r} model", COMMAND, error=ValueError)
    info = json.loads(info_path.read_text())
    if info.get("recipe_hash") != recipe_hash(kind):
        raise ValueError(f"the shipped {kind!r} model in {folder} was made from recipe "
                         f"{info.get('recipe_hash')}, but RECIPES[{kind!r}] is now "
                         f"{recipe_hash(kind)}; `make models` retrains and rewrites it")
    model = TransformerLM(TransformerConfig(**RECIPES[kind]["model"]))
    load_model(model, str(weights), strict=True)
    info["trained_now"] = False
    if kind == "text":
        info["tokenizer"] = _load_tokenizer(folder)
    return model.eval(), info


# ---------------------------------------------------------------- shipping results (data/make_*.py)


def write_json(path: str | os.PathLike, obj: object) -> Path:
    """Write ``obj`` to ``path`` as the book's data files hold JSON: ``indent=1`` and a final newline.

    The folder is made if missing, and the file is replaced atomically (written beside it
    under a temporary name, then renamed), so a process reading it meanwhile never sees half
    a file. Returns the path. An object JSON cannot hold is a ``TypeError`` and leaves no file.
    """
    path = Path(path)
    text = json.dumps(obj, indent=1) + "\n"  # before touching the disk: a TypeError writes nothing
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def write_sweep(path: str | os.PathLike, result: dict[str, Any], began: float) -> Path:
    """Write a finished sweep: ``result["seconds"]`` = time since ``began`` (a
    ``time.perf_counter()`` reading, rounded to 0.1 s), :func:`write_json`, and a line
    saying how many ``result["runs"]`` went where.
    """
    if not isinstance(result, dict) or not isinstance(result.get("runs"), list):
        raise ValueError("result must be a dict with a list of 'runs'")
    result["seconds"] = round(time.perf_counter() - began, 1)
    path = write_json(path, result)
    print(f"wrote {len(result['runs'])} runs to {path} in {result['seconds']:.0f} s")
    return path


def part_path(folder: str | os.PathLike, seed: int, tag: str = "") -> Path:
    """``folder/parts/[<tag>_]seed<seed>.json``: the part file of one seed (see :func:`run_in_parts`)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if not isinstance(tag, str) or any(c in tag for c in "/\\*?") or "seed" in tag:
        raise ValueError(f"tag must be a plain name without '/', wildcards or 'seed', got {tag!r}")
    return Path(folder) / "parts" / (f"{tag}_seed{seed}.json" if tag else f"seed{seed}.json")


def merge_parts(folder: str | os.PathLike, names: Iterable[str]) -> tuple[list[dict], dict[str, list]]:
    """Read the part files ``folder/parts/*seed*.json`` of :func:`run_in_parts`.

    Returns ``(parts, runs)``: the parts ordered by seed (then by file name, so two
    processes' parts of one seed come in a fixed order), and for each of ``names`` that has
    any, its runs ordered by seed. A run under a name not in ``names`` is a ``ValueError``.
    """
    names, parts_dir = list(names), Path(folder) / "parts"
    files = sorted(parts_dir.glob("*seed*.json"))  # by name; none when the folder is missing
    parts = sorted((json.loads(f.read_text()) for f in files), key=lambda d: d["seed"])
    runs: dict[str, list] = {name: [] for name in names}
    for data in parts:
        for name, run in data["runs"].items():
            if name not in runs:
                raise ValueError(f"{parts_dir}: seed {data['seed']} has a run {name!r}, "
                                 f"not one of {names}")
            runs[name].append(run)
    for name in runs:
        runs[name].sort(key=lambda r: r["seed"])
    return parts, {name: r for name, r in runs.items() if r}


def add_part_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the options of a script that uses :func:`run_in_parts`: ``--tag``, ``--merge-only``
    and ``--drop-parts`` (``--seeds`` and what to run are the script's own)."""
    parser.add_argument("--tag", default="", help="write parts/<tag>_seed<k>.json (for a second process)")
    parser.add_argument("--merge-only", action="store_true", help="only merge the parts")
    parser.add_argument("--drop-parts", action="store_true", help="delete the parts after merging")
    return parser


def run_in_parts(folder: str | os.PathLike, seeds: Iterable[int], names: Iterable[str],
                 run: Callable[[str, int], dict[str, Any]], new_part: Callable[[int], dict[str, Any]],
                 merge: Callable[[Path], object], tag: str = "", drop_parts: bool = False,
                 report: Callable[[int, str, dict[str, Any]], None] | None = None) -> None:
    """Run ``run(name, seed)`` for every seed and name, keeping one part file per seed.

    The part of ``seed`` (:func:`part_path`) is the dict ``new_part(seed)`` (which must
    hold ``"seed"`` and an empty ``"runs"``), or the one already on disk: a name already in
    its ``"runs"`` is skipped, so a rerun resumes where an interrupted one stopped, and two
    processes with different ``tag`` can share the work. After each run the part is
    rewritten (:func:`write_json`), ``merge(folder)`` rebuilds the merged file and
    ``report(seed, name, result)`` is called; ``merge`` runs once more at the end (with no
    seeds, only that), and ``drop_parts`` then deletes the part files and their folder.
    """
    folder = Path(folder)
    seeds, names = list(seeds), list(names)
    if len(set(seeds)) != len(seeds) or len(set(names)) != len(names):
        raise ValueError(f"seeds and names must not repeat, got {seeds} and {names}")
    (folder / "parts").mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        part = part_path(folder, seed, tag)
        data = json.loads(part.read_text()) if part.is_file() else new_part(seed)
        if data.get("seed") != seed or not isinstance(data.get("runs"), dict):
            raise ValueError(f"{part}: a part must hold 'seed': {seed} and a dict of 'runs'")
        for name in names:
            if name in data["runs"]:
                continue
            result = run(name, seed)
            data["runs"][name] = result
            write_json(part, data)
            merge(folder)
            if report is not None:
                report(seed, name, result)
    merge(folder)
    if drop_parts:
        for part in (folder / "parts").glob("*seed*.json"):
            part.unlink()
        (folder / "parts").rmdir()


def main(argv: list[str] | None = None) -> int:
    """``make models``: retrain the book's models from their recipes and rewrite their files."""
    parser = argparse.ArgumentParser(prog="python -m llmbook.training.pretrained", description=main.__doc__)
    parser.add_argument("kinds", nargs="*", default=sorted(RECIPES), help="which models")
    parser.add_argument("--out", default=None, help="folder to write to (default: data/models)")
    args = parser.parse_args(argv)
    for kind in args.kinds:
        info = write_book_model(kind, args.out)
        extra = (f", {info['val_bits_per_byte']:.3f} bits/byte" if "val_bits_per_byte" in info
                 else f", {info['val_loss_over_entropy_rate']:.4f} H")
        print(f"{kind}: val loss {info['val_loss']:.4f} nats/token{extra}; trained in "
              f"{info['train_seconds']:.0f} s; written to {Path(args.out or models_dir()) / kind}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
