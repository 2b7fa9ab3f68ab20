"""Benchmark: weight-only matrix-vector products and SIMD kernel levels, repeated (chapter 15).

Chapter 15 (sections 15.9 and 15.14) reads the JSON this writes; timings vary from run to
run, so every figure here is repeated and reported as a median with its spread (min, max and
the quartiles), and the chapter only claims differences larger than that spread.

* **matvec**: one token's product ``x @ W.T`` with a weight as large as SmolLM2's output
  layer (49152 x 576: 113 MB in float32, far beyond the caches), stored as float32,
  bfloat16, int8 with one scale per row (``aten._weight_int8pack_mm`` through
  ``fast_decode.Int8Linear``) and int4 in groups of 32 (``aten._weight_int4pack_mm_for_cpu``
  through ``fast_decode.Int4Linear``). The variants are timed in interleaved rounds (one
  sample of each per round, a sample being the mean of ``--calls`` products), so a change
  of machine load hits them alike; the speed-up over float32 is taken per round.
* **simd**: ns per element of a compute-bound elementwise function (sigmoid) and of a
  product (two loads and a store per element) on 16,384 float32 values in cache, in fresh
  processes under each kernel level this CPU has (``ATEN_CPU_CAPABILITY``),
  ``--simd-samples`` samples of about 0.2 ms each: short samples, so that on a shared
  machine a sample the scheduler interrupts is an outlier of the set (the quartiles ignore
  it) rather than the rule.

One thread throughout. Writes ``benchmarks/results/quant_bandwidth.json`` with the recipe,
every sample, the summaries, ``made`` (``machine_facts()``, the date and the load average).
About 1-2 minutes on 2 cores.

    .venv/bin/python benchmarks/quant_bandwidth.py [--repeats 21] [--calls 10] [--simd-samples 101]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from llmbook.inference.fast_decode import Int4Linear, Int8Linear
from llmbook.training.pretrained import machine_facts

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "quant_bandwidth.json"
SHAPE = (49152, 576)  # (N, K): SmolLM2-135M's output layer

SIMD_TIMING = """
import json, sys, time, torch
torch.set_num_threads(1)
x, z = torch.rand(16384) + 0.5, torch.rand(16384)
y = torch.empty_like(x)
out = {"capability": torch.backends.cpu.get_cpu_capability()}
for name, fn in (("sigmoid", lambda: torch.sigmoid(x, out=y)), ("product", lambda: torch.mul(x, z, out=y))):
    for _ in range(100):
        fn()
    t0 = time.perf_counter()
    for _ in range(20):
        fn()
    calls = max(1, round(2e-4 / ((time.perf_counter() - t0) / 20)))  # a sample of about 0.2 ms
    samples = []
    for _ in range(int(sys.argv[1])):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls / 16384 * 1e9)
    out[name] = samples
print(json.dumps(out))
"""


def summary(samples: list[float]) -> dict[str, float]:
    """Median, min, max and the quartiles of ``samples``."""
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
            "q1": q1, "q3": q3}


def matvec(repeats: int, calls: int) -> dict:
    g = torch.Generator().manual_seed(0)
    W = torch.randn(*SHAPE, generator=g) / SHAPE[1] ** 0.5  # (N, K) float32
    x = torch.randn(1, SHAPE[1], generator=g)
    W_bf16, x_bf16 = W.bfloat16(), x.bfloat16()
    int8, int4 = Int8Linear(W), Int4Linear.from_float(W, 32)
    n = W.numel()
    variants = {  # name -> (call, bytes of the weight as stored)
        "float32": (lambda: x @ W.T, 4 * n),
        "bfloat16": (lambda: x_bf16 @ W_bf16.T, 2 * n),
        "int8, row scales": (lambda: int8(x_bf16), int8.storage_bytes()),
        "int4, groups of 32": (lambda: int4(x_bf16), int4.storage_bytes()),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for fn, _ in variants.values():
        for _ in range(3):
            fn()  # warm up
    for _ in range(repeats):
        for name, (fn, _) in variants.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - t0) / calls)
    rows = {}
    for name, (_, n_bytes) in variants.items():
        gbps = [n_bytes / t / 1e9 for t in times[name]]
        speedup = [a / b for a, b in zip(times["float32"], times[name], strict=True)]
        rows[name] = {"bytes": n_bytes, "bits_per_weight": 8 * n_bytes / n,
                      "bytes_ratio_vs_float32": 4 * n / n_bytes,
                      "seconds": times[name], "time_ms": summary([1e3 * t for t in times[name]]),
                      "GBps": summary(gbps), "speedup_vs_float32": summary(speedup)}
    return {"shape": list(SHAPE), "calls_per_sample": calls, "variants": rows}


def simd(samples: int) -> dict:
    native = torch.backends.cpu.get_cpu_capability()
    levels = ["default"] + (["avx2"] if native == "AVX512" else []) + [None]  # None: native
    out = {}
    for level in levels:
        env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
        env |= {"ATEN_CPU_CAPABILITY": level} if level else {}
        res = subprocess.run([sys.executable, "-c", SIMD_TIMING, str(samples)], env=env,
                             capture_output=True, text=True, check=True)
        r = json.loads(res.stdout)
        out[r["capability"]] = {k: {"ns_per_element": r[k], "summary": summary(r[k])}
                                for k in ("sigmoid", "product")}
    return {"native": native, "levels": out}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21, help="matvec rounds (21)")
    parser.add_argument("--calls", type=int, default=10, help="products per matvec sample (10)")
    parser.add_argument("--simd-samples", type=int, default=101, help="samples per SIMD kernel (101)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    args = parser.parse_args(argv)
    if args.repeats < 4 or args.calls < 1 or args.simd_samples < 4:
        parser.error("--repeats and --simd-samples must be >= 4 (quartiles) and --calls >= 1")
    torch.set_num_threads(1)
    began = time.perf_counter()
    result = {"benchmark": "quant_bandwidth",
              "recipe": {"repeats": args.repeats, "calls": args.calls, "simd_samples": args.simd_samples,
                         "threads": 1, "command": "python benchmarks/quant_bandwidth.py --repeats "
                         f"{args.repeats} --calls {args.calls} --simd-samples {args.simd_samples}"},
              "matvec": matvec(args.repeats, args.calls), "simd": simd(args.simd_samples)}
    result["made"] = {**machine_facts(), "date": datetime.datetime.now(datetime.UTC).isoformat(
        timespec="seconds"), "load_average_1min": os.getloadavg()[0],
        "seconds": time.perf_counter() - began}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    for name, row in result["matvec"]["variants"].items():
        s = row["speedup_vs_float32"]
        print(f"{name:20s} {row['GBps']['median']:6.1f} GB/s  speed-up {s['median']:.2f} "
              f"[{s['min']:.2f}, {s['max']:.2f}] (bytes {row['bytes_ratio_vs_float32']:.2f}x)")
    for cap, r in result["simd"]["levels"].items():
        print(cap, {k: round(v["summary"]["median"], 3) for k, v in r.items()})
    return result


if __name__ == "__main__":
    main()
