"""Train chapter 20's arithmetic model with GRPO, Dr. GRPO, DAPO and GSPO; write data/grpo_variants/.

    OMP_NUM_THREADS=1 .venv/bin/python data/make_grpo_variants.py     # about 9 minutes on one core

Four short runs of llmbook.alignment.rl_variants.train_variant from the shipped SFT model
(artifact ``arithmetic_sft``), one per method of ``VARIANTS``, with one recipe
(``VARIANT_RECIPE``: 200 steps of 64 problems x 8 answers, two AdamW updates per batch, no
KL term) and one seed, so that the runs differ only in the loss (and, for DAPO, in the
extra answers that dynamic sampling draws). Writes ``results.json``: the recipe, each run's
curves (training reward, answer length, answers generated, groups kept, held-out greedy
accuracy every 20 steps), its final greedy and sampled held-out accuracy, its wall time,
and the machine. Rerunning on another CPU gives close but not identical numbers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

from llmbook.alignment.rl_variants import VARIANT_RECIPE, VARIANTS, train_variant
from llmbook.paths import data_path
from llmbook.training.pretrained import machine_facts


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    runs = {}
    for variant in VARIANTS:
        runs[variant] = train_variant(variant, VARIANT_RECIPE)
        print(f"{variant:8s} greedy {runs[variant]['greedy']:.3f} sampled {runs[variant]['sampled']:.3f} "
              f"in {runs[variant]['train_seconds']:.0f} s", flush=True)
    folder = data_path("grpo_variants")
    folder.mkdir(parents=True, exist_ok=True)
    info = {"recipe": VARIANT_RECIPE, "variants": VARIANTS, "runs": runs,
            "made": {"command": "python data/make_grpo_variants.py",
                     "date": datetime.date.today().isoformat(), **machine_facts()}}
    (folder / "results.json").write_text(json.dumps(info, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
