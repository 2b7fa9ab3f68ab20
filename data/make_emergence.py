"""Train chapter 11's emergence sweep and write data/emergence/fact_recall_sweep.json.

Models of the book's Llama-style transformer (two layers, d_model // 8 heads) at six widths
learn the same table of 1,000 facts (each 3-digit key has a random 6-digit answer) for 300
full-batch steps, and each is scored on the table: per-token accuracy and mean
log-probability of the answer tokens under teacher forcing, exact match, and the token edit
distance of its greedy answers (``llmbook.training.emergence``).

    OMP_NUM_THREADS=1 .venv/bin/python data/make_emergence.py   # a few minutes on one thread

Training in float32 on one thread is repeatable on one machine, not bit-equal across CPUs:
on another machine the numbers agree to about two decimals, which is why the book ships
them instead of re-training in the notebook.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

from llmbook.training.emergence import EMERGENCE_RESULTS, emergence_sweep
from llmbook.training.pretrained import write_sweep


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[8, 12, 16, 20, 24, 32],
                        help="model widths d_model")
    parser.add_argument("--steps", type=int, default=300, help="training steps per model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=EMERGENCE_RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the shipped numbers were made on one thread
    began = time.perf_counter()
    result = emergence_sweep(tuple(args.widths), steps=args.steps, seed=args.seed,
                             log=lambda r: print(f"[{time.perf_counter() - began:5.0f} s] d = {r['d_model']:2d}, "
                                                 f"N = {r['N']:6,d}: per-token {r['per_token_accuracy']:.3f}, "
                                                 f"exact match {r['exact_match']:.3f}", flush=True))
    result["machine"] = f"{platform.machine()}, torch {torch.__version__}, one thread"
    write_sweep(args.out, result, began)
    return 0


if __name__ == "__main__":
    sys.exit(main())
