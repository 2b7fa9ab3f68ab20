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
import json
import os
import sys
from pathlib import Path

from llmbook.alignment.preference_training import FAMILY_RECIPE, family_setup, train_member
from llmbook.paths import data_path
from llmbook.training.pretrained import machine_facts


def _write_json(path: Path, obj: object) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)  # atomic: a parallel process never reads half a file


def merge(folder: Path) -> dict:
    """Merge ``folder/parts/seed*.json`` into ``folder/results.json``; returns it."""
    parts = [json.loads(p.read_text()) for p in (folder / "parts").glob("*seed*.json")]
    runs: dict[str, list] = {m: [] for m in FAMILY_RECIPE["methods"]}
    base, reference_seconds, made = None, [], []
    for data in sorted(parts, key=lambda d: d["seed"]):
        base = data["base"]
        reference_seconds.append(data["reference_seconds"])
        made.append(data["made"])
        for method in runs:
            if method in data["runs"]:
                runs[method].append(data["runs"][method])
    for method in runs:
        runs[method].sort(key=lambda r: r["seed"])
    info = {"recipe": FAMILY_RECIPE, "base": base, "reference_seconds": reference_seconds,
            "runs": {m: r for m, r in runs.items() if r},
            "made": {"command": "python data/make_preference_family.py",
                     "date": datetime.date.today().isoformat(), "parts": made}}
    _write_json(folder / "results.json", info)
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=FAMILY_RECIPE["seeds"])
    parser.add_argument("--methods", nargs="*", default=FAMILY_RECIPE["methods"])
    parser.add_argument("--tag", default="", help="write parts/<tag>_seed<k>.json (for a second process)")
    parser.add_argument("--merge-only", action="store_true", help="only merge the parts")
    parser.add_argument("--drop-parts", action="store_true", help="delete the parts after merging")
    args = parser.parse_args(argv)
    folder = data_path("preference_family")
    (folder / "parts").mkdir(parents=True, exist_ok=True)
    if not args.merge_only:
        setup = family_setup(FAMILY_RECIPE)
        for seed in args.seeds:
            part = folder / "parts" / (f"{args.tag}_seed{seed}.json" if args.tag else f"seed{seed}.json")
            data = json.loads(part.read_text()) if part.is_file() else {
                "seed": seed, "base": setup.base, "reference_seconds": setup.reference_seconds,
                "made": {"date": datetime.date.today().isoformat(), **machine_facts()}, "runs": {}}
            for method in args.methods:
                if method in data["runs"]:
                    continue
                run = train_member(method, FAMILY_RECIPE, seed, setup)
                data["runs"][method] = run
                _write_json(part, data)
                merge(folder)
                print(f"seed {seed} {method:6s} reward {run['final']['reward']:.3f} KL {run['final']['kl']:.3f} "
                      f"steps {run['compute']['step_seconds']:.0f} s, eval {run['compute']['eval_seconds']:.0f} s",
                      flush=True)
    merge(folder)
    if args.drop_parts:
        for part in (folder / "parts").glob("*seed*.json"):
            part.unlink()
        (folder / "parts").rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
