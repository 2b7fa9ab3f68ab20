"""Train chapter 12b's multi-token models on the synthetic source and write data/models/mtp/.

    OMP_NUM_THREADS=1 .venv/bin/python data/make_mtp.py          # about 4 minutes on one core

Four runs of the same next-token model (a 2-block GPT-2-style TransformerLM, d = 32, the
synthetic Markov source of chapter 3): next-token prediction alone (n = 1), Gloeckle et
al.'s parallel heads with n = 2 and n = 4 (llmbook.training.mtp.ParallelMTP: a 1-block trunk,
one block per head), and one DeepSeek-V3 MTP module (SequentialMTP, depth 1, lambda = 0.3).
What is matched: the next-token model's shape, the optimiser and schedule, the number of
steps and the training windows themselves (every run draws the same windows of T + 3
tokens from the same seed and uses the first T + n of each). What is not: the heads' extra
FLOPs, which ``info.json`` records per run, from llmbook.transformer.sizing and measured
with FlopCounterMode.

Writes ``info.json`` (the recipe, every run's training and validation curves per head, the
final per-head losses on 20 x 256 held-out windows, the exact floors, timings, machine)
and ``parallel_n4.safetensors`` (the n = 4 model, float32, about 0.25 MB), which the chapter
decodes with. The shipped files are what the chapter reads; rerunning on another CPU gives
close but not bit-identical weights (chapter 10 explains why).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from llmbook.paths import data_path
from llmbook.text.data import default_source
from llmbook.training.mtp import (
    ParallelMTP,
    SequentialMTP,
    deepseek_weights,
    evaluate_heads,
    get_mtp_batch,
    head_entropy_floors,
    multi_token_loss,
    train_mtp,
)
from llmbook.training.pretrained import machine_facts
from llmbook.training.train import TrainConfig
from llmbook.transformer.model import TransformerConfig
from llmbook.transformer.sizing import flops_per_token

CONTEXT = 16
WINDOW = CONTEXT + 3  # the longest look-ahead (n = 4): every run draws the same windows

RECIPE = {
    "model": TransformerConfig.gpt2_style(vocab_size=16, d_model=32, n_layers=2, n_heads=2,
                                          max_seq_len=CONTEXT, activation="gelu").to_dict(),
    "train": TrainConfig(steps=600, batch_size=64, context_length=CONTEXT, lr=1e-2, min_lr=1e-3,
                         warmup_steps=30, weight_decay=0.1, betas=(0.9, 0.95), grad_clip=1.0,
                         eval_every=50, eval_batches=4, seed=0).to_dict(),
    "data": {"source": "default_source", "num_train": 1_000_000, "num_val": 100_000, "seed": 0},
    "window": WINDOW,
    "init_seed": 0,
    "first_position": 1,  # score only predictions that see the source's full order-2 context
    "final_eval": {"batch_size": 256, "num_batches": 20},
    "runs": {
        "next_token": {"kind": "parallel", "n_future": 1},
        "parallel_n2": {"kind": "parallel", "n_future": 2},
        "parallel_n4": {"kind": "parallel", "n_future": 4},
        "deepseek_d1": {"kind": "sequential", "depth": 1, "lambda": 0.3},
    },
}
SHIP = {"parallel_n4": {"n_future": 4}}


def build(run: dict, config: TransformerConfig) -> tuple[torch.nn.Module, list[float] | None]:
    g = torch.Generator().manual_seed(RECIPE["init_seed"])
    if run["kind"] == "parallel":
        return ParallelMTP(config, run["n_future"], generator=g), None
    return SequentialMTP(config, run["depth"], generator=g), deepseek_weights(run["depth"], run["lambda"])


def step_flops(model: torch.nn.Module, weights: list[float] | None, tokens: torch.Tensor) -> int:
    """FLOPs of one training step (forward + backward) on one batch, counted by PyTorch."""
    ids, targets = get_mtp_batch(tokens, RECIPE["train"]["batch_size"], CONTEXT, model.n_future,
                                 torch.Generator().manual_seed(0), WINDOW)
    with FlopCounterMode(display=False) as counter:
        loss, _ = multi_token_loss(model(ids[:, :model.input_length(CONTEXT)]), targets, weights)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


def rounded(x: object, digits: int = 5) -> object:
    """Floats rounded to ``digits`` decimals, recursively (keeps info.json small)."""
    if isinstance(x, float):
        return round(x, digits)
    if isinstance(x, list):
        return [rounded(v, digits) for v in x]
    if isinstance(x, dict):
        return {k: rounded(v, digits) for k, v in x.items()}
    return x


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    torch.set_num_threads(1)
    source = default_source()
    d = RECIPE["data"]
    train_ids, val_ids = source.train_val(d["num_train"], d["num_val"], seed=d["seed"])
    config = TransformerConfig(**RECIPE["model"])
    tc = TrainConfig(**{**RECIPE["train"], "betas": tuple(RECIPE["train"]["betas"])})
    fe = RECIPE["final_eval"]
    info: dict = {"recipe": RECIPE, "entropy_rate": source.entropy_rate(),
                  "head_floors": head_entropy_floors(source, 4),
                  "next_token_forward_flops_per_token": flops_per_token(config, CONTEXT),
                  "runs": {}, "shipped": SHIP}
    folder = data_path("models", "mtp")
    folder.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    for name, run in RECIPE["runs"].items():
        model, weights = build(run, config)
        flops = step_flops(model, weights, train_ids)
        history = train_mtp(model, train_ids, val_ids, tc, weights, window=WINDOW,
                            first_position=RECIPE["first_position"])
        final = evaluate_heads(model, val_ids, fe["batch_size"], CONTEXT, fe["num_batches"],
                               torch.Generator().manual_seed(1234), RECIPE["first_position"], WINDOW)
        info["runs"][name] = {**run, "history": rounded({k: v for k, v in history.to_dict().items()
                                                              if k != "train_head_loss"}), "final_head_loss": final,
                              "train_step_flops": flops,
                              "parameters": sum(p.numel() for p in model.parameters())}
        print(f"{name:12s} {history.seconds:6.1f} s  next-token loss {final[0]:.4f} "
              f"({final[0] / info['entropy_rate']:.4f} H)  heads {[round(x, 4) for x in final]}",
              flush=True)
        if name in SHIP:
            from safetensors.torch import save_model

            save_model(model, str(folder / f"{name}.safetensors"))
    info["train_seconds"] = time.perf_counter() - began
    info["made"] = {"command": "OMP_NUM_THREADS=1 .venv/bin/python data/make_mtp.py",
                    "date": datetime.date.today().isoformat(), **machine_facts()}
    (folder / "info.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"total {info['train_seconds']:.0f} s; wrote {Path(folder)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
