"""Measure reward-model over-optimisation for chapter 18b; write data/overoptimisation/results.json.

    OMP_NUM_THREADS=1 .venv/bin/python data/make_overoptimisation.py     # 20 minutes on one thread of a busy 2-core machine

Three measurements with chapter 17's learned reward model (artifact ``reward_model``) as the
proxy and the keyword count as the gold reward, all from
llmbook.alignment.overoptimisation with its ``OVEROPTIMISATION_RECIPE``:

* ``pool``: 64 responses of the base model to each of 256 test prompts, each with its proxy
  score and gold reward (best-of-n for every n <= 64 is computed from them in the chapter);
* ``ppo``: 60 PPO iterations of 32 prompts against the proxy with beta = 0.003, evaluated
  (gold, proxy, KL on 256 test prompts) every 5 iterations;
* ``grpo``: 60 GRPO iterations of 8 prompts x 8 responses against the proxy, no KL term,
  evaluated the same way.

Writes the recipe, the three results, and the machine. Rerunning on another CPU gives close
but not identical numbers (an RL run amplifies round-off into different samples).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

import torch

from llmbook.alignment.overoptimisation import (
    OVEROPTIMISATION_RECIPE,
    best_of_n_pool,
    train_proxy_grpo,
    train_proxy_ppo,
)
from llmbook.paths import data_path
from llmbook.training.pretrained import machine_facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("pool", "ppo", "grpo"), nargs="*", default=None,
                        help="run only these parts (the others are kept from an existing results.json)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    folder = data_path("overoptimisation")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "results.json"
    old = json.loads(path.read_text()) if args.only and path.is_file() else {}
    parts = {"pool": best_of_n_pool, "ppo": train_proxy_ppo, "grpo": train_proxy_grpo}
    out = {}
    for name, fn in parts.items():
        if args.only and name not in args.only:
            out[name] = old[name]
            continue
        out[name] = fn(OVEROPTIMISATION_RECIPE)
        print(f"{name}: {out[name]['wall_seconds']:.0f} s", flush=True)
        if name != "pool":
            c = out[name]["curve"]
            for i in range(len(c["step"])):
                print(f"  step {c['step'][i]:3d} d {c['d'][i]:6.3f} gold {c['gold'][i]:6.3f} "
                      f"proxy {c['proxy'][i]:7.3f}", flush=True)
    info = {"recipe": OVEROPTIMISATION_RECIPE, **out,
            "made": {"command": "python data/make_overoptimisation.py",
                     "date": datetime.date.today().isoformat(), **machine_facts()}}
    path.write_text(json.dumps(info) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
