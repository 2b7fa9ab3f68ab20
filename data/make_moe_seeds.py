"""Chapter 21's MoE comparison over three seeds, one change at a time; writes data/moe_seeds/.

    OMP_NUM_THREADS=1 .venv/bin/python data/make_moe_seeds.py                 # all seeds in turn
    OMP_NUM_THREADS=1 .venv/bin/python data/make_moe_seeds.py --seeds 0 1     # some seeds (parallel)

Each run is llmbook.scale.moe_training.train_variant_seed with ``MOE_VS_DENSE_RECIPE``
(chapter 21's shipped comparison: 600 steps of batch 16 x 64 tokens of the standard-library
docstrings) and one of ``MOE_SEEDS_VARIANTS``: the dense model, the unbalanced MoE
(``moe_none``), and from it one change at a time: z-loss 1e-3 (``moe_z``), Switch loss 0.01
(``moe_switch``), both (``moe_aux``, the shipped one) and the selection bias alone
(``moe_bias``). The seed sets both the initialisation (``init_seed``) and the batch order
(``train.seed``); seed 0 is the shipped artifact's recipe. A run takes 20 s to 140 s on one
core, depending on the load: the shipped runs were made in two processes of three variants
each (``--variants moe_aux moe_none moe_z --tag a`` and ``--variants moe_switch moe_bias
dense --tag b``) on a two-core machine shared with other jobs, in 12 minutes in all.

Each finished run is written at once to ``parts/[<tag>_]seed<k>.json`` (a rerun skips the
runs found there) and all parts are merged into ``results.json``: the recipe, the variants,
and for each variant its runs in seed order (final validation loss and curve, load
imbalance and router z per layer at the end, seconds). ``--merge-only`` merges and
``--drop-parts`` then deletes the parts. Another CPU gives close but not identical numbers.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

from llmbook.paths import data_path
from llmbook.scale.moe_training import (
    MOE_SEEDS_VARIANTS,
    MOE_VS_DENSE_RECIPE,
    _book_text_ids,
    train_variant_seed,
)
from llmbook.training.pretrained import (
    add_part_arguments,
    machine_facts,
    merge_parts,
    run_in_parts,
    write_json,
)

SEEDS = [0, 1, 2]


def merge(folder: Path) -> dict:
    """Merge ``folder/parts/*seed*.json`` into ``folder/results.json``; returns it."""
    parts, runs = merge_parts(folder, MOE_SEEDS_VARIANTS)
    info = {"recipe": MOE_VS_DENSE_RECIPE, "variants": MOE_SEEDS_VARIANTS, "seeds": SEEDS, "runs": runs,
            "made": {"command": "python data/make_moe_seeds.py",
                     "date": datetime.date.today().isoformat(), "parts": [d["made"] for d in parts]}}
    write_json(folder / "results.json", info)
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=SEEDS)
    parser.add_argument("--variants", nargs="*", default=list(MOE_SEEDS_VARIANTS))
    args = add_part_arguments(parser).parse_args(argv)
    ids = None if args.merge_only else _book_text_ids(MOE_VS_DENSE_RECIPE)  # (train, validation)

    def run(variant: str, seed: int) -> dict:
        return train_variant_seed(MOE_VS_DENSE_RECIPE, variant, MOE_SEEDS_VARIANTS[variant], seed, *ids)

    def report(seed: int, variant: str, run: dict) -> None:
        print(f"seed {seed} {variant:10s} val {run['val_loss']:.4f} "
              f"imbalance {run['imbalance']} z {run['router_z']} {run['seconds']:.0f} s", flush=True)

    run_in_parts(data_path("moe_seeds"), [] if args.merge_only else args.seeds, args.variants, run,
                 new_part=lambda seed: {"seed": seed, "made": {"date": datetime.date.today().isoformat(),
                                                               **machine_facts()}, "runs": {}},
                 merge=merge, tag=args.tag, drop_parts=args.drop_parts, report=report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
