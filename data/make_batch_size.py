"""Chapter 10b's training runs: batch-size sweep, gradient noise scale, AdamW recipe choices.

Writes ``data/batch_size/runs.json`` (through :func:`llmbook.paths.data_dir`). From the
repository root, with the book's environment::

    OMP_NUM_THREADS=1 .venv/bin/python data/make_batch_size.py

A thin driver: the experiment is :class:`llmbook.training.batch_size.BatchSizeExperiment`,
whose defaults are the shipped runs. The model is the book's GPT-2-style ``TransformerLM``
at a tiny size (d = 32, one layer, 4 heads, context 8), trained by ``llmbook.training.train.train_step`` with the book's AdamW
on an order-1 Markov source over 16 tokens (``llmbook.text.data.MarkovSource``), whose
entropy rate H is the exact floor of the loss. Three parts:

1. ``sweep``: for each batch size B (sequences of 8 tokens), a constant learning rate after
   a short warmup, the validation loss on a fixed set of windows after a geometric grid of
   steps, until it reaches the target H + ``target_excess``; and the steps S to reach it;
2. ``noise``: along the run at ``NOISE_BATCH``, at each evaluation, the gradients of K
   fresh micro-batches of b sequences at the current parameters, reduced to unbiased
   estimates of |G|^2 and tr(Sigma) (``microbatch_noise_estimate``);
3. ``recipes``: short runs with beta2 in {0.95, 0.999}, warmup 0 or 10 % of the run, and
   final learning rate 0.1x, 0x or 1x the peak (the choices of claim C12).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch

from llmbook.paths import data_dir
from llmbook.training.batch_size import BatchSizeExperiment, steps_to_target
from llmbook.training.pretrained import machine_facts

EXPERIMENT = BatchSizeExperiment()
BATCH_SIZES = (4, 8, 16, 32, 64, 128, 256)
MAX_STEPS = 1500
NOISE_BATCH = 32
RECIPE_STEPS, RECIPE_BATCH = 300, 32
RECIPES = {  # name: (betas, warmup steps, final learning rate / peak)
    "beta2=0.95, warmup 10%, final 0.1x": ((0.9, 0.95), 30, 0.1),
    "beta2=0.999, warmup 10%, final 0.1x": ((0.9, 0.999), 30, 0.1),
    "beta2=0.95, no warmup, final 0.1x": ((0.9, 0.95), 0, 0.1),
    "beta2=0.95, warmup 10%, final 0x": ((0.9, 0.95), 30, 0.0),
    "beta2=0.95, warmup 10%, final 1x (constant)": ((0.9, 0.95), 30, 1.0),
}


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    torch.set_num_threads(1)
    began = time.perf_counter()
    exp = EXPERIMENT
    data = exp.experiment_data()
    target = exp.target(data)

    sweep = {}
    for b in BATCH_SIZES:
        t = time.perf_counter()
        r = exp.train_run(data, b, MAX_STEPS, stop_at=target, noise=b == NOISE_BATCH)
        r["steps_to_target"] = steps_to_target(r["steps"], r["val_loss"], target)
        r["seconds"] = time.perf_counter() - t
        sweep[str(b)] = r
        print(f"B={b:4d}  S={r['steps_to_target']:.1f}  {r['seconds']:.1f} s", flush=True)

    recipes = {}
    for name, (betas, warmup, final) in RECIPES.items():
        t = time.perf_counter()
        r = exp.train_run(data, RECIPE_BATCH, RECIPE_STEPS,
                          exp.cosine_recipe(warmup, final, RECIPE_STEPS), betas=betas)
        r["seconds"] = time.perf_counter() - t
        r.update({"beta2": betas[1], "warmup_steps": warmup, "final_lr_fraction": final})
        recipes[name] = r
        print(f"{name}: final val {r['val_loss'][-1]:.4f}  {r['seconds']:.1f} s", flush=True)

    result = {
        "source": exp.source_spec(), "entropy_rate": data.entropy_rate,
        "model": exp.model_config().to_dict(), "context_length": exp.context,
        "lr": exp.lr, "warmup_steps": exp.warmup_steps, "betas": list(exp.betas),
        "grad_clip": exp.grad_clip, "target_excess": exp.target_excess, "target": target,
        "max_steps": MAX_STEPS,
        "noise": {"batch_size": NOISE_BATCH, "micro_batch": exp.noise_micro_batch,
                  "micro_batches": exp.noise_micro_batches},
        "recipe_steps": RECIPE_STEPS, "recipe_batch": RECIPE_BATCH,
        "sweep": sweep, "recipes": recipes,
        "made": {"command": "OMP_NUM_THREADS=1 python data/make_batch_size.py",
                 "seconds": time.perf_counter() - began, **machine_facts()},
    }
    path = data_dir() / "batch_size" / "runs.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, allow_nan=True) + "\n")
    print(f"wrote {path} in {result['made']['seconds']:.0f} s", flush=True)
    return 0 if all(math.isfinite(r["steps_to_target"]) for r in sweep.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
