"""Train the book's small model on mixtures of three sources; write data/mixtures/sweep.json.

Chapter 10d (notebooks/10d_data_mixtures) fits a data-mixing law to these results. Each
run trains the same 2-layer GPT-2-style model (same initialisation, same batch seed)
on a different mixture r = (synthetic, prose, docs) of the sources of
:func:`llmbook.training.mixtures.book_sources` (256 bytes + 16 synthetic symbols, V = 272),
then measures its validation loss on each source's held-out tail. One thread; about
four minutes on the book's 2-core machine.

    OMP_NUM_THREADS=1 .venv/bin/python data/make_mixtures.py           # writes the JSON
    OMP_NUM_THREADS=1 .venv/bin/python data/make_mixtures.py --steps 30 --out /tmp/m.json  # a smoke run
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path

import torch

from llmbook.training.mixtures import (
    book_sources,
    epochs_per_source,
    temperature_weights,
    train_on_mixture,
)
from llmbook.training.pretrained import machine_facts
from llmbook.training.train import TrainConfig, evaluate
from llmbook.transformer.model import TransformerConfig, TransformerLM

OUT = Path(__file__).resolve().parent / "mixtures" / "sweep.json"
SOURCES = ("synthetic", "prose", "docs")
MODEL = TransformerConfig.gpt2_style(vocab_size=272, d_model=64, n_layers=2, n_heads=4,
                                     max_seq_len=64, activation="gelu")
TRAIN = dict(steps=300, batch_size=32, context_length=32, lr=3e-3, min_lr=3e-4, warmup_steps=30,
             weight_decay=0.1, betas=(0.9, 0.95), grad_clip=1.0, eval_every=None, seed=0)
EVAL = {"batch_size": 32, "num_batches": 8, "seed": 1}
INIT_SEED = 0
HELD_OUT = "alpha = 0.5"


def mixtures(sizes: list[int]) -> dict[str, list[float]]:
    """The mixtures of the sweep: six fixed points, and temperature sampling at alpha = 0, 0.5, 1."""
    fixed = {"(0.6, 0.2, 0.2)": [0.6, 0.2, 0.2], "(0.2, 0.6, 0.2)": [0.2, 0.6, 0.2],
             "(0.2, 0.2, 0.6)": [0.2, 0.2, 0.6], "(0.45, 0.45, 0.1)": [0.45, 0.45, 0.1],
             "(0.1, 0.45, 0.45)": [0.1, 0.45, 0.45], "(0.45, 0.1, 0.45)": [0.45, 0.1, 0.45]}
    temp = {f"alpha = {a}": temperature_weights(sizes, a).tolist() for a in (0, 0.5, 1)}
    return {**fixed, **temp}


def run_one(sources: dict, weights: list[float], steps: int) -> tuple[list[float], list[float]]:
    """Train one model on ``weights``; return (validation loss per source, train losses)."""
    model = TransformerLM(MODEL, generator=torch.Generator().manual_seed(INIT_SEED))
    config = TrainConfig(**{**TRAIN, "steps": steps, "warmup_steps": min(TRAIN["warmup_steps"], steps)})
    train_losses = train_on_mixture(model, [sources[s][0] for s in SOURCES], weights, config)
    val = [evaluate(model, sources[s][1], EVAL["batch_size"], config.context_length,
                    EVAL["num_batches"], torch.Generator().manual_seed(EVAL["seed"]))
           for s in SOURCES]
    return val, train_losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=TRAIN["steps"])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sources = book_sources()
    sizes = [len(sources[s][0]) for s in SOURCES]
    budget = args.steps * TRAIN["batch_size"] * TRAIN["context_length"]
    runs, began = [], time.perf_counter()
    for name, weights in mixtures(sizes).items():
        start = time.perf_counter()
        val, train_losses = run_one(sources, weights, args.steps)
        runs.append({"name": name, "weights": weights,
                     "epochs": epochs_per_source(weights, sizes, budget).tolist(),
                     "val_loss": val, "train_loss": [round(x, 5) for x in train_losses],
                     "seconds": time.perf_counter() - start})
        print(f"{name:>18}: " + "  ".join(f"{s} {v:.4f}" for s, v in zip(SOURCES, val, strict=True))
              + f"  ({runs[-1]['seconds']:.1f} s)", flush=True)
    result = {
        "sources": list(SOURCES), "train_sizes": sizes,
        "val_sizes": [len(sources[s][1]) for s in SOURCES],
        "model": MODEL.to_dict(), "train": {**TRAIN, "steps": args.steps, "betas": list(TRAIN["betas"])},
        "init_seed": INIT_SEED, "eval": EVAL, "budget_tokens": budget, "held_out": HELD_OUT,
        "runs": runs, "seconds": time.perf_counter() - began,
        "made": {"command": "OMP_NUM_THREADS=1 .venv/bin/python data/make_mixtures.py",
                 "date": datetime.date.today().isoformat(), **machine_facts()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} ({result['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
