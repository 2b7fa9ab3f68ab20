"""Benchmark: the pipeline bubble in wall-clock time, GPipe vs 1F1B (notebooks/22_distributed_training).

``llmbook.scale.pipeline.run_pipeline`` runs a 6-block float64 MLP stack as p stages on p real
processes (gloo, CPU). Each forward is made to take ``compute_seconds`` and each backward twice
that (a sleep: the tiny model's own compute is negligible), so the timeline has the shape the
schedule gives it. The ranks record ``time.perf_counter`` around every operation; the bubble
is 1 - busy / (p * makespan). Compared with (p-1)/(m+p-1): the excess is communication and
process scheduling, which the formula does not count. Best (lowest) of ``--repeats`` runs.
Writes ``benchmarks/results/pipeline.json`` with the machine, the UTC date and the numbers.

    .venv/bin/python benchmarks/pipeline.py [--repeats 2] [--compute-seconds 0.01]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

import torch

from llmbook.scale.pipeline import bubble_fraction, make_mlp_stack, measured_bubble, run_pipeline

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "pipeline.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--compute-seconds", type=float, default=0.01)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = make_mlp_stack([6, 8, 8, 8, 8, 8, 5], seed=0)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for p, m in ((2, 2), (2, 4), (2, 8), (3, 3), (3, 6), (3, 12)):
        x = torch.randn(12 * 2, 6, generator=gen, dtype=torch.float64)
        y = torch.randn(12 * 2, 5, generator=gen, dtype=torch.float64)
        for name in ("gpipe", "1f1b"):
            best = min(float(measured_bubble(run_pipeline(model, x, y, p, m, name,
                                                          compute_seconds=args.compute_seconds),
                                             "wall")[0]) for _ in range(args.repeats))
            rows.append({"schedule": name, "stages": p, "microbatches": m,
                         "bubble_wall": best, "bubble_formula": float(bubble_fraction(p, m))})
            print(rows[-1], flush=True)
    out = {
        "benchmark": "pipeline bubble, wall clock: llmbook.scale.pipeline.run_pipeline (gloo, CPU)",
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "threads": 1, "python": sys.version.split()[0],
                    "torch": torch.__version__,
                    "note": "shared machine: other processes may have run at the same time"},
        "compute_seconds_forward": args.compute_seconds,
        "compute_seconds_backward": 2 * args.compute_seconds,
        "repeats": args.repeats,
        "statistic": "lowest bubble of repeats",
        "results": rows,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
