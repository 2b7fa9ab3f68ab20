"""Benchmark: generation with and without the KV cache on the CPU (notebooks/13_kv_cache).

``llmbook.inference.sampling.generate`` (greedy) is timed with ``use_cache=True`` and
``use_cache=False`` on the same prompt, in the same run, for several numbers of generated
tokens, on two models:

* ``book-text``: the book's trained text model (chapter 10; its configuration, read from the
  shipped weights, is recorded), up to its context minus the 8-token prompt;
* ``d256-L4``: a randomly initialised GPT-2-style model with d = 256, 4 layers, 4 heads,
  V = 512 and a context of 640 tokens, where recomputation becomes expensive.

Both runs must produce the same tokens (checked). The cached and uncached runs alternate,
and each number is the best of ``--repeats`` runs (the machine may be shared with other
work; the minimum is the least disturbed). Writes ``benchmarks/results/kvcache.json``
with the machine, the UTC date, the configurations, tokens/s and the speed-ups. Chapter 13
compares the recorded configurations with its own models and fails if they differ, so rerun
this script whenever the book's text model or the d = 256 model changes. About 2 minutes on
one thread of a quiet CPU (the recomputed 512-token generation dominates):

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/kvcache.py [--repeats 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from llmbook.inference.sampling import generate
from llmbook.training.pretrained import book_model
from llmbook.transformer.model import TransformerConfig, TransformerLM

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "kvcache.json"
PROMPT_LEN = 8


def timed_generate(model, prompt, n, use_cache):
    began = time.perf_counter()
    out = generate(model, prompt, n, temperature=0, use_cache=use_cache)
    return time.perf_counter() - began, out


def bench(name, model, lengths, repeats):
    V = model.config.vocab_size
    prompt = torch.randint(0, V, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(0))
    rows = []
    for n in lengths:
        best = {True: float("inf"), False: float("inf")}
        outs = {}
        for _ in range(repeats):
            for use_cache in (True, False):
                seconds, outs[use_cache] = timed_generate(model, prompt, n, use_cache)
                best[use_cache] = min(best[use_cache], seconds)
        same = torch.equal(outs[True], outs[False])
        row = {"new_tokens": n, "seconds_cache": best[True], "seconds_no_cache": best[False],
               "tokens_per_s_cache": n / best[True], "tokens_per_s_no_cache": n / best[False],
               "speedup": best[False] / best[True], "same_tokens": same}
        rows.append(row)
        print(f"{name:10s} {n:5d} new tokens: cache {row['tokens_per_s_cache']:8.1f} tok/s, "
              f"no cache {row['tokens_per_s_no_cache']:8.1f} tok/s, speed-up "
              f"{row['speedup']:5.2f}x, same tokens: {same}", flush=True)
        if not same:
            raise SystemExit(f"{name}: cached and uncached generations differ at n={n}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    text_model, _ = book_model("text")
    big_config = TransformerConfig.gpt2_style(vocab_size=512, d_model=256, n_layers=4,
                                              n_heads=4, max_seq_len=640)
    big_model = TransformerLM(big_config, generator=torch.Generator().manual_seed(0)).eval()
    n_max = text_model.config.max_seq_len - PROMPT_LEN
    runs = [("book-text", text_model, [n_max // 8, n_max // 4, n_max // 2, n_max]),
            ("d256-L4", big_model, [64, 128, 256, 512])]
    results = []
    for name, model, lengths in runs:
        results.append({"name": name, "config": model.config.to_dict(),
                        "prompt_len": PROMPT_LEN, "rows": bench(name, model, lengths,
                                                                args.repeats)})
    payload = {
        "benchmark": "KV cache: llmbook.inference.sampling.generate, greedy, use_cache True vs False",
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "threads": args.threads,
                    "python": sys.version.split()[0], "torch": torch.__version__,
                    "note": "shared machine: other processes may have run at the same time"},
        "repeats": args.repeats, "statistic": "best of repeats",
        "results": results,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
