"""Train a Mamba and a transformer of equal parameters on chapter 3's source; write data/ssm_vs_transformer/.

    OMP_NUM_THREADS=1 .venv/bin/python data/make_ssm_vs_transformer.py     # about 10 minutes on one (loaded) core

Chapter 23's comparison of the two families on the same task. Both models have two layers
and about 35 thousand parameters (``MambaLM`` with d_model 48, d_state 8, expand 2: 35,664;
``TransformerLM`` with d_model 36, 4 heads, GELU MLP, learned positions: 34,992). Each is
trained by ``llmbook.training.train.train`` with one recipe (``RECIPE``: AdamW, cosine
schedule, the same batches of windows of ``default_source()``'s tokens) for each
(peak learning rate, seed) pair in ``RUNS``: two seeds at the recipe's rate and one seed
at twice that rate, to see whether the ranking is an artefact of the rate. The seed sets
both the initialisation and the batch order. Writes
``results.json``: the recipe, the models' configurations and parameter counts, the
source's entropy rate (the floor), each run's validation curve and training losses, a
final validation loss that skips the first two positions of each window (which see less
than the source's two tokens of context), and the wall times and machine. Rerunning on
another CPU gives close but not identical numbers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

import torch

from llmbook.paths import data_path
from llmbook.scale.ssm import MambaConfig, MambaLM, mamba_num_parameters
from llmbook.text.data import default_source
from llmbook.training.pretrained import machine_facts
from llmbook.training.train import TrainConfig, evaluate, train
from llmbook.transformer.model import TransformerConfig, TransformerLM

RECIPE = {"steps": 1200, "batch_size": 16, "context_length": 64, "lr": 5e-3, "min_lr": 5e-4,  # per run: RUNS
          "warmup_steps": 100, "weight_decay": 0.1, "eval_every": 50, "eval_batches": 4}
DATA = {"num_train": 1_000_000, "train_seed": 0, "num_val": 50_000, "val_seed": 1}
FINAL_EVAL = {"num_batches": 32, "first_position": 2}
RUNS = ((5e-3, 0), (5e-3, 1), (1e-2, 0))  # (peak learning rate, seed)
MAMBA = {"vocab_size": 16, "d_model": 48, "n_layers": 2, "d_state": 8}
TRANSFORMER = {"vocab_size": 16, "d_model": 36, "n_layers": 2, "n_heads": 4, "max_seq_len": 64}


def build(kind: str, seed: int) -> torch.nn.Module:
    """The freshly initialised model of ``kind`` ("mamba" or "transformer") for ``seed``."""
    torch.manual_seed(seed)
    if kind == "mamba":
        return MambaLM(MambaConfig(**MAMBA))
    if kind == "transformer":
        return TransformerLM(TransformerConfig(**TRANSFORMER),
                             generator=torch.Generator().manual_seed(seed))
    raise ValueError(f"kind must be 'mamba' or 'transformer', got {kind!r}")


def tokens() -> tuple[torch.Tensor, torch.Tensor]:
    """The training and validation tokens: two independent samples of ``default_source()``."""
    source = default_source()
    return (source.sample(DATA["num_train"], seed=DATA["train_seed"]),
            source.sample(DATA["num_val"], seed=DATA["val_seed"]))


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    torch.set_num_threads(1)
    train_ids, val_ids = tokens()
    runs: dict[str, list[dict]] = {"mamba": [], "transformer": []}
    for lr, seed in RUNS:
        for kind in runs:
            model = build(kind, seed)
            recipe = {**RECIPE, "lr": lr, "min_lr": lr / 10}
            history = train(model, train_ids, val_ids, TrainConfig(**recipe, seed=seed))
            final = evaluate(model, val_ids, RECIPE["batch_size"], RECIPE["context_length"],
                             FINAL_EVAL["num_batches"], torch.Generator().manual_seed(seed + 2),
                             first_position=FINAL_EVAL["first_position"])
            runs[kind].append({"seed": seed, "lr": lr, "val_steps": history.val_steps,
                               "val_loss": history.val_loss, "train_loss": history.train_loss,
                               "final_val_loss": final, "tokens_seen": history.tokens_seen,
                               "train_seconds": history.seconds})
            print(f"{kind:11s} lr {lr:.0e} seed {seed}: val {history.val_loss[-1]:.4f}, final {final:.4f} "
                  f"in {history.seconds:.0f} s", flush=True)
    folder = data_path("ssm_vs_transformer")
    folder.mkdir(parents=True, exist_ok=True)
    info = {"recipe": RECIPE, "data": DATA, "final_eval": FINAL_EVAL,
            "models": {"mamba": {"config": MAMBA,
                                 "parameters": mamba_num_parameters(MambaConfig(**MAMBA))},
                       "transformer": {"config": TRANSFORMER,
                                       "parameters": build("transformer", 0).num_parameters()}},
            "entropy_rate": default_source().entropy_rate(), "runs": runs,
            "made": {"command": "python data/make_ssm_vs_transformer.py",
                     "date": datetime.date.today().isoformat(), **machine_facts()}}
    (folder / "results.json").write_text(json.dumps(info, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
