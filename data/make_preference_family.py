"""Train DPO, IPO, KTO, ORPO, SimPO and RLOO on chapter 19's task; write data/preference_family/.

    OMP_NUM_THREADS=1 .venv/bin/python data/make_preference_family.py          # all seeds in turn
    OMP_NUM_THREADS=1 .venv/bin/python data/make_preference_family.py --seeds 1  # one seed (parallel)

Each run is llmbook.alignment.preference_training.train_member with ``FAMILY_RECIPE``:
chapter 19's DPO recipe (the book's text model with rank-8 LoRA, one pass over 4096
preference pairs in 64 steps of 64 pairs, AdamW 1e-3 with warmup and cosine decay, seed
per run), one method's loss, and for RLOO 2 samples of the current policy for each of the
same 64 prompts per step. On one quiet core a run takes one to three minutes (RLOO about
five), evaluation included: the last runs of the shipped file, made on a nearly quiet
machine, took SimPO 72 s, ORPO 95 s, IPO 145 s, KTO 177 s and RLOO 284 s. So about 15
minutes per seed and 45 for the three in turn, or about 15 with one process per seed
(``--seeds 0``, ``--seeds 1``, ``--seeds 2``; RLOO can run in its own process too,
``--methods RLOO --tag rloo``). The shipped runs were made that way, on two cores shared
with other jobs, so their recorded seconds are inflated, unevenly.

Each finished run is written at once to ``parts/seed<k>.json`` (a rerun skips the runs
found there) and all parts are merged into ``results.json``: the recipe, every run's path
in the reward-KL plane (every 8 steps), final score, per-step history and compute, the base
model's score and the machine. ``--merge-only`` merges, and ``--drop-parts`` then deletes the
parts. Rerunning on another CPU gives close but not identical numbers.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

from llmbook.alignment.preference_training import FAMILY_RECIPE, family_setup, train_member
from llmbook.paths import data_path
from llmbook.training.pretrained import (
    add_part_arguments,
    machine_facts,
    merge_parts,
    run_in_parts,
    write_json,
)


def merge(folder: Path) -> dict:
    """Merge ``folder/parts/*seed*.json`` into ``folder/results.json``; returns it."""
    parts, runs = merge_parts(folder, FAMILY_RECIPE["methods"])
    info = {"recipe": FAMILY_RECIPE, "base": parts[-1]["base"] if parts else None,
            "reference_seconds": [d["reference_seconds"] for d in parts], "runs": runs,
            "made": {"command": "python data/make_preference_family.py",
                     "date": datetime.date.today().isoformat(), "parts": [d["made"] for d in parts]}}
    write_json(folder / "results.json", info)
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=FAMILY_RECIPE["seeds"])
    parser.add_argument("--methods", nargs="*", default=FAMILY_RECIPE["methods"])
    args = add_part_arguments(parser).parse_args(argv)
    setup = None if args.merge_only else family_setup(FAMILY_RECIPE)

    def new_part(seed: int) -> dict:
        return {"seed": seed, "base": setup.base, "reference_seconds": setup.reference_seconds,
                "made": {"date": datetime.date.today().isoformat(), **machine_facts()}, "runs": {}}

    def report(seed: int, method: str, run: dict) -> None:
        print(f"seed {seed} {method:6s} reward {run['final']['reward']:.3f} KL {run['final']['kl']:.3f} "
              f"steps {run['compute']['step_seconds']:.0f} s, eval {run['compute']['eval_seconds']:.0f} s",
              flush=True)

    run_in_parts(data_path("preference_family"), [] if args.merge_only else args.seeds, args.methods,
                 lambda method, seed: train_member(method, FAMILY_RECIPE, seed, setup), new_part=new_part,
                 merge=merge, tag=args.tag, drop_parts=args.drop_parts, report=report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
