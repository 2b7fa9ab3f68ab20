"""Benchmark: speculative decoding against plain decoding, wall-clock, on the CPU (notebooks/12_decoding).

The target is the book's trained text model (chapter 10: 4 layers, d = 192, V = 1024,
context 128); the drafts are its own first 1 or 2 layers with its output head
(``llmbook.inference.sampling.early_exit_draft``, self-speculative decoding). Both models
keep a KV cache: plain decoding is ``generate(target, ..., temperature=1.0,
use_cache=True)`` and speculative decoding ``speculative_generate(target, draft, ...,
use_cache=True)``, which samples from the same distribution. For every draft and draft
length gamma the two are timed in the same run, alternating, on the same prompt and the
same number of new tokens; each time is the best of ``--repeats`` runs (the machine may
be shared). Also recorded: the number of target passes and the acceptance rate.
Writes ``benchmarks/results/speculative.json`` with the machine and the UTC date.

    .venv/bin/python benchmarks/speculative.py [--repeats 3] [--threads 1] [--new-tokens 100]
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

from llmbook.inference.sampling import early_exit_draft, generate, speculative_generate
from llmbook.nbtools import best_time
from llmbook.training.pretrained import book_model

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "speculative.json"
PROMPT = "Return the "



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, info = book_model("text")
    prompt = torch.tensor([info["tokenizer"].encode(PROMPT)])  # (1, T)
    n = args.new_tokens

    def plain():
        return generate(target, prompt, n, temperature=1.0, use_cache=True,
                        generator=torch.Generator().manual_seed(0))

    rows = []
    for draft_layers in (1, 2):
        draft = early_exit_draft(target, draft_layers)
        for gamma in (1, 2, 3, 4):
            def spec(draft=draft, gamma=gamma):
                return speculative_generate(target, draft, prompt, n, gamma, use_cache=True,
                                            generator=torch.Generator().manual_seed(0))
            t_plain, t_spec = float("inf"), float("inf")
            for _ in range(args.repeats):  # alternate, keep the best of each
                t_plain = min(t_plain, best_time(plain, 1)[0])
                seconds, (_, stats) = best_time(spec, 1)
                t_spec = min(t_spec, seconds)
            row = {"draft_layers": draft_layers, "gamma": gamma, "new_tokens": n,
                   "seconds_plain": t_plain, "seconds_speculative": t_spec,
                   "speedup": t_plain / t_spec, "target_passes": len(stats.accepted),
                   "acceptance_rate": sum(stats.accepted) / sum(stats.proposed),
                   "tokens_per_target_pass": n / len(stats.accepted)}
            rows.append(row)
            print(f"draft {draft_layers}/{target.config.n_layers} layers, gamma {gamma}: plain "
                  f"{1e3 * t_plain:7.1f} ms, speculative {1e3 * t_spec:7.1f} ms, speed-up "
                  f"{row['speedup']:4.2f}x, {row['target_passes']} target passes, acceptance "
                  f"{row['acceptance_rate']:.2f}", flush=True)
    payload = {
        "benchmark": "speculative_generate (cached target and draft) vs generate (cached), "
                     "temperature 1, book text model, early-exit drafts",
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "threads": args.threads,
                    "python": sys.version.split()[0], "torch": torch.__version__,
                    "note": "shared machine: other processes may have run at the same time"},
        "prompt": PROMPT, "repeats": args.repeats, "statistic": "best of repeats",
        "target": target.config.to_dict(), "rows": rows,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
