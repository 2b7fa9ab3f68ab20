"""Benchmark: TransformerLM against Hugging Face LlamaForCausalLM on the CPU (notebooks/07_decoder).

For each configuration (the small shapes the training chapters use) a randomly
initialised ``LlamaForCausalLM`` with ``attn_implementation="sdpa"`` is built, our model
gets its weights through ``llmbook.transformer.hf_loading.from_hf`` (so both compute the same function,
checked before timing), and both are timed on the same batch of token ids:

* ``forward``: logits under ``torch.no_grad()``;
* ``forward+backward``: logits, a scalar loss (cross-entropy against shifted ids), backward.

Runs of the two models are interleaved (ours, peer, ours, peer, ...) so that a change in
the machine's load affects both; each number is the median of ``--repeats`` runs after
``--warmup`` untimed ones. Prints a table of tokens/s and speed ratios (ours / peer,
above 1 means ours is faster) and writes ``benchmarks/results/model.json`` with the
machine, the versions, the UTC date and every number measured here.

    .venv/bin/python benchmarks/model.py [--repeats 9] [--warmup 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

from llmbook.transformer.hf_loading import from_hf

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "model.json"

# (name, vocab, d_model, layers, heads, kv heads, d_ff, T, batch)
CONFIGS = [
    ("tiny", 64, 64, 2, 4, 2, 176, 64, 32),
    ("small", 512, 128, 4, 4, 2, 352, 128, 16),
    ("medium", 2000, 256, 4, 8, 4, 688, 256, 8),
]


def build(vocab, d, L, H, H_kv, d_ff, T):
    hf = LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, hidden_size=d, num_hidden_layers=L, num_attention_heads=H,
        num_key_value_heads=H_kv, intermediate_size=d_ff, max_position_embeddings=T,
        attn_implementation="sdpa"))
    return hf, from_hf(hf)


def logits_of(model, ids):
    out = model(ids)
    return out if isinstance(out, torch.Tensor) else out.logits


def forward(model, ids):
    with torch.no_grad():
        logits_of(model, ids)


def forward_backward(model, ids):
    model.zero_grad(set_to_none=True)
    logits = logits_of(model, ids)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    loss.backward()


def interleaved_medians(fn, models, ids, repeats, warmup):
    """Median seconds of ``fn(model, ids)`` per model, runs interleaved across models."""
    for _ in range(warmup):
        for m in models:
            fn(m, ids)
    times = [[] for _ in models]
    for _ in range(repeats):
        for i, m in enumerate(models):
            start = time.perf_counter()
            fn(m, ids)
            times[i].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times], times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 is steadier on a shared machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    rows = []
    for name, V, d, L, H, H_kv, d_ff, T, B in CONFIGS:
        hf, ours = build(V, d, L, H, H_kv, d_ff, T)
        hf.train()  # no dropout in Llama; train mode as a training loop would use
        ours.train()
        ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            err = (logits_of(ours, ids) - logits_of(hf, ids)).abs().max().item()
        assert err < 1e-4, f"{name}: the models differ by {err}"
        row = {"name": name, "vocab_size": V, "d_model": d, "n_layers": L, "n_heads": H,
               "n_kv_heads": H_kv, "d_ff": d_ff, "seq_len": T, "batch": B,
               "parameters": ours.num_parameters(), "max_abs_logit_difference": err}
        for label, fn in (("forward", forward), ("forward_backward", forward_backward)):
            (t_ours, t_hf), (all_ours, all_hf) = interleaved_medians(
                fn, [ours, hf], ids, args.repeats, args.warmup)
            row[label] = {"ours_s": t_ours, "transformers_s": t_hf,
                          "ours_tokens_per_s": B * T / t_ours,
                          "transformers_tokens_per_s": B * T / t_hf,
                          "speed_ratio_ours_over_transformers": t_hf / t_ours,
                          "ours_all_s": all_ours, "transformers_all_s": all_hf}
        rows.append(row)

    ratios = [r[k]["speed_ratio_ours_over_transformers"] for r in rows
              for k in ("forward", "forward_backward")]
    result = {
        "benchmark": "TransformerLM vs transformers LlamaForCausalLM (sdpa), CPU, tokens/s",
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "repeats": args.repeats,
        "warmup": args.warmup,
        "statistic": "median of interleaved runs",
        "configs": rows,
        "min_speed_ratio": min(ratios),
        "goal": {"speed_ratio_at_least": 0.9},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")

    print(f"median of {args.repeats} interleaved runs, {torch.get_num_threads()} thread(s); "
          f"tokens/s (ratio = ours / transformers speed)")
    print(f"{'config':8s}{'params':>10s}{'B x T':>10s}  {'pass':16s}{'ours':>10s}"
          f"{'transformers':>14s}{'ratio':>8s}")
    for r in rows:
        for label in ("forward", "forward_backward"):
            x = r[label]
            print(f"{r['name']:8s}{r['parameters']:>10,d}{r['batch']:>5d} x {r['seq_len']:<4d}  "
                  f"{label:16s}{x['ours_tokens_per_s']:>10.0f}{x['transformers_tokens_per_s']:>14.0f}"
                  f"{x['speed_ratio_ours_over_transformers']:>8.2f}")
    print(f"lowest ratio {min(ratios):.2f} (goal >= 0.9); largest logit difference "
          f"{max(r['max_abs_logit_difference'] for r in rows):.1e}")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
