"""Benchmark: the book's training loop against the same loop on Hugging Face Llama (notebooks/10_training).

Two loops train the same function on the same batches on the CPU:

* **ours**: ``TransformerLM`` (``TransformerConfig.llama_style``) stepped by
  ``llmbook.training.train.train_step``: the book's ``cross_entropy``, ``llmbook.training.optim.AdamW``
  with :func:`~llmbook.training.train.param_groups`, ``cosine_schedule`` / ``set_lr`` and
  ``clip_grad_norm_``;
* **peer**: ``transformers.LlamaForCausalLM`` (``attn_implementation="sdpa"``) with
  ``torch.optim.AdamW`` (same two parameter groups, default single-tensor path as the
  book's follows), ``torch.nn.functional.cross_entropy``, the same schedule and
  ``torch.nn.utils.clip_grad_norm_``.

Our model gets the peer's initial weights (``llmbook.transformer.hf_loading.from_hf``) and both draw the
same batches, so their losses agree over the first ``--steps`` steps to 1e-3 (checked;
later, float32 round-off compounds and the runs drift apart slowly).
Each repeat times ``--steps`` consecutive steps of each loop, the loops interleaved
(ours, peer, ours, peer, ...) so a change in the machine's load hits both; the number
reported is the median over ``--repeats`` repeats after one untimed warm-up repeat.
Writes ``benchmarks/results/train.json``.

    .venv/bin/python benchmarks/train.py [--repeats 7] [--steps 10] [--threads 1]
"""

from __future__ import annotations

import argparse
import datetime
import functools
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

from llmbook.text.data import default_source
from llmbook.training.optim import AdamW, cosine_schedule
from llmbook.training.train import get_batch, param_groups, train_step
from llmbook.transformer.hf_loading import from_hf

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "train.json"

# (name, vocab, d_model, layers, heads, kv heads, d_ff, T, batch)
CONFIGS = [
    ("book-synthetic", 16, 64, 2, 4, 4, 176, 16, 128),
    ("small", 512, 128, 4, 4, 2, 352, 64, 32),
]
LR, MIN_LR, WARMUP, TOTAL, WD, CLIP = 1e-2, 1e-3, 5, 1000, 0.1, 1.0


def build(V, d, L, H, H_kv, d_ff, T):
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(
        vocab_size=V, hidden_size=d, num_hidden_layers=L, num_attention_heads=H,
        num_key_value_heads=H_kv, intermediate_size=d_ff, max_position_embeddings=T,
        tie_word_embeddings=False, attn_implementation="sdpa"))
    return from_hf(hf), hf


def hf_groups(model):
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return [{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}]


def peer_step(model, optimizer, x, y, lr):
    for group in optimizer.param_groups:
        group["lr"] = lr
    logits = model(x).logits  # (B, T, V)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    optimizer.step()
    return loss.detach()


def ours_step(model, optimizer, x, y, lr):
    return train_step(model, optimizer, x, y, lr, CLIP)[0]


def run_steps(step_fn, batches, first_step, losses):
    """Seconds taken by one training step per batch; appends each loss to ``losses``."""
    start = time.perf_counter()
    for i, (x, y) in enumerate(batches):
        lr = cosine_schedule(first_step + i, LR, MIN_LR, WARMUP, TOTAL)
        losses.append(step_fn(x, y, lr).item())
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10, help="training steps per timed repeat")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 is steadier on a shared machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokens = default_source().sample(200_000, seed=0)  # ids < 16 <= every V here

    rows = []
    for name, V, d, L, H, H_kv, d_ff, T, B in CONFIGS:
        ours, hf = build(V, d, L, H, H_kv, d_ff, T)
        ours.train()
        hf.train()
        opt_ours = AdamW(param_groups(ours, WD), lr=LR, betas=(0.9, 0.95))
        opt_hf = torch.optim.AdamW(hf_groups(hf), lr=LR, betas=(0.9, 0.95), foreach=False)
        batches = [get_batch(tokens, B, T, generator=torch.Generator().manual_seed(s))
                   for s in range(args.steps)]
        steps = {
            "ours": functools.partial(ours_step, ours, opt_ours),
            "transformers": functools.partial(peer_step, hf, opt_hf),
        }
        losses = {"ours": [], "transformers": []}
        times = {"ours": [], "transformers": []}
        for repeat in range(args.repeats + 1):
            for which, step_fn in steps.items():
                seconds = run_steps(step_fn, batches, len(losses[which]), losses[which])
                if repeat > 0:  # the first repeat warms up
                    times[which].append(seconds)
        gaps = [abs(a - b) for a, b in zip(losses["ours"], losses["transformers"], strict=True)]
        diff = max(gaps[: args.steps])  # the first steps: later, float32 round-off compounds
        t_ours, t_hf = statistics.median(times["ours"]), statistics.median(times["transformers"])
        tokens_per_repeat = args.steps * B * T
        rows.append({
            "name": name, "vocab_size": V, "d_model": d, "n_layers": L, "n_heads": H,
            "n_kv_heads": H_kv, "d_ff": d_ff, "context_length": T, "batch_size": B,
            "parameters": ours.num_parameters(),
            "ours_tokens_per_s": tokens_per_repeat / t_ours,
            "transformers_tokens_per_s": tokens_per_repeat / t_hf,
            "speed_ratio_ours_over_transformers": t_hf / t_ours,
            "max_abs_loss_difference_first_steps": diff,
            "steps_compared": args.steps,
            "max_abs_loss_difference_all_steps": max(gaps),
            "steps_run": len(gaps),
            "ours_repeat_s": times["ours"], "transformers_repeat_s": times["transformers"],
        })
        assert diff < 1e-3, f"{name}: the two loops differ (loss difference {diff})"

    ratios = [r["speed_ratio_ours_over_transformers"] for r in rows]
    result = {
        "benchmark": "training loop tokens/s: TransformerLM + llmbook.training.optim.AdamW vs "
                     "transformers LlamaForCausalLM (sdpa) + torch.optim.AdamW, CPU",
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "note": "shared machine: other jobs ran at the same time; runs are interleaved",
        },
        "schedule": {"max_lr": LR, "min_lr": MIN_LR, "warmup_steps": WARMUP,
                     "total_steps": TOTAL, "weight_decay": WD, "grad_clip": CLIP},
        "repeats": args.repeats,
        "steps_per_repeat": args.steps,
        "statistic": "median over interleaved repeats after one warm-up repeat",
        "configs": rows,
        "min_speed_ratio": min(ratios),
        "goal": {"speed_ratio_at_least": 0.9},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")

    print(f"median of {args.repeats} interleaved repeats of {args.steps} steps, "
          f"{torch.get_num_threads()} thread(s); training tokens/s (ratio = ours / transformers)")
    print(f"{'config':16s}{'params':>10s}{'B x T':>11s}{'ours':>10s}{'transformers':>14s}"
          f"{'ratio':>8s}{'loss diff':>11s}")
    for r in rows:
        print(f"{r['name']:16s}{r['parameters']:>10,d}{r['batch_size']:>6d} x {r['context_length']:<3d}"
              f"{r['ours_tokens_per_s']:>10.0f}{r['transformers_tokens_per_s']:>14.0f}"
              f"{r['speed_ratio_ours_over_transformers']:>8.2f}{r['max_abs_loss_difference_first_steps']:>11.1e}")
    print(f"lowest ratio {min(ratios):.2f} (goal >= 0.9); wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
