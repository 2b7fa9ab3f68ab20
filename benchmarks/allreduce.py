"""Benchmark: all-reduce time against message size on the CPU, gloo (notebooks/22_distributed_training).

``dist.all_reduce`` and the book's ring (``llmbook.scale.collectives.ring_all_reduce_``) are
timed on p = 2 and p = 4 real processes started by ``llmbook.scale.launch.run``, for float32
tensors of 2^10 ... 2^22 elements (4 KiB ... 16 MiB). Each number is the median of
``--repeats`` calls, each after a barrier, taking the slowest rank. The ring model
T = 2 (p - 1) alpha + 2 (p - 1)/p n beta is fitted by least squares
(``fit_alpha_beta``) to each series. Writes ``benchmarks/results/allreduce.json`` with the
machine, the UTC date, the times and the fits.

    .venv/bin/python benchmarks/allreduce.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
from pathlib import Path

import torch

from llmbook.scale.collectives import (
    all_reduce_timing_worker,
    fit_alpha_beta,
)
from llmbook.scale.launch import run

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "allreduce.json"
SIZES = [2**k for k in (10, 13, 16, 19, 22)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    series = []
    for p in (2, 4):
        for implementation in ("dist", "ring"):
            per_rank = run(all_reduce_timing_worker, p, SIZES, args.repeats, implementation, timeout=300)
            seconds = [max(times) for times in zip(*per_rank, strict=True)]
            n_bytes = [4 * n for n in SIZES]
            alpha, beta = fit_alpha_beta(n_bytes, seconds, p)
            series.append({"world_size": p, "implementation": implementation, "bytes": n_bytes,
                           "seconds": seconds, "alpha_s": alpha, "beta_s_per_byte": beta,
                           "bandwidth_GB_per_s": 1e-9 / beta if beta > 0 else None})
            print(f"p={p} {implementation:4s}: alpha = {alpha * 1e6:8.1f} us, "
                  f"beta = {beta * 1e9:7.3f} ns/byte ({1e-9 / beta if beta > 0 else float('nan'):.2f} GB/s)",
                  flush=True)
    result = {
        "benchmark": "all-reduce time vs message size: dist.all_reduce and the book's ring, gloo, CPU",
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "threads_per_rank": 1,
                    "python": platform.python_version(), "torch": torch.__version__,
                    "note": "shared machine: other processes may have run at the same time; "
                            "ranks are processes on one machine, so 'bandwidth' is memory copies "
                            "through the loopback interface"},
        "repeats": args.repeats,
        "statistic": "median of repeats, slowest rank",
        "model": "T = 2 (p - 1) alpha + 2 (p - 1)/p * n_bytes * beta, least squares",
        "results": series,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
