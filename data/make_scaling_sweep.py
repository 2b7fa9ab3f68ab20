"""Train chapter 11's sweep of model sizes and write data/scaling/size_sweep.json.

Eight Llama-style models (widths 8 to 64, one or two layers, heads of width 8) each train
for 300 steps of 32 x 32 tokens of the synthetic source of chapter 3, with three seeds (the
seed draws the data sample, the initialisation and the batches), and are scored on held-out
windows from position 2 (``llmbook.training.scaling.size_sweep``). Section 11.3 fits a power
law to the smaller half of the sizes and predicts the larger half from it.

    OMP_NUM_THREADS=1 .venv/bin/python data/make_scaling_sweep.py   # about 2 minutes on a quiet core (8 on a loaded one)

Training in float32 on one thread is repeatable on one machine, not bit-equal across CPUs,
which is why the book ships the numbers instead of re-training them in the notebook.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import torch

from llmbook.training.pretrained import machine_facts, write_sweep
from llmbook.training.scaling import SIZE_SWEEP_RESULTS, size_sweep


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of every size")
    parser.add_argument("--steps", type=int, default=300, help="training steps per model")
    parser.add_argument("--out", type=Path, default=SIZE_SWEEP_RESULTS, help="where to write the JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the shipped numbers were made on one thread
    began = time.perf_counter()
    result = size_sweep(seeds=tuple(args.seeds), steps=args.steps,
                        log=lambda r: print(f"[{time.perf_counter() - began:5.0f} s] seed {r['seed']}, "
                                            f"d = {r['d_model']:2d}, L = {r['n_layers']}: N = {r['N']:6,d}, "
                                            f"val loss {r['val_loss']:.4f}", flush=True))
    result["made_by"] = "data/make_scaling_sweep.py"
    result["made"] = machine_facts()
    result["date"] = datetime.date.today().isoformat()
    write_sweep(args.out, result, began)
    return 0


if __name__ == "__main__":
    sys.exit(main())
