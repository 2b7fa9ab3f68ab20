"""Benchmark: the Triton FlashAttention kernels against PyTorch's SDPA (notebooks/14_flash_attention).

On a CUDA GPU, for T = 1k ... 16k, head dims 64 and 128, causal and not, float16 and
bfloat16, it times the forward and the forward+backward of ``llmbook.inference.flash.
flash_attention_triton`` and of ``torch.nn.functional.scaled_dot_product_attention`` in the
same run (``triton.testing.do_bench``: median of the timed repetitions, CUDA events), after
checking that the two agree. The shapes follow Dao (2023): B T = 16k tokens and H d = 2048
(so B = 16384 / T sequences and H = 2048 / d heads). FLOPs counted: 4 B H T^2 d for the
forward (two matrix products), 2.5 times that for the backward (five), halved when causal.
It prints TFLOP/s and ratios (ours / SDPA) and writes
``benchmarks/results/flash_<gpu-name-slug>.json`` with the machine, GPU, UTC date, versions
and every number measured.

Without a GPU it runs the kernels on the CPU under the Triton interpreter at a tiny size
(T = 64, d = 16), checks them against SDPA (forward and gradients, float32, 1e-5), measures
no speed, and writes ``benchmarks/results/flash_cpu_interpreter.json`` marked as such.

    .venv/bin/python benchmarks/flash.py [--seq-lens 1024 2048 ...] [--head-dims 64 128]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import sys
from pathlib import Path

import torch

GPU = torch.cuda.is_available()
if not GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton defines the kernels

import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

from llmbook.inference.flash import flash_attention_triton  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
GOAL = {"forward_ratio_at_least": 0.8, "backward_ratio_at_least": 0.6,
        "where": "T >= 4096, d = 128, float16"}


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def attention_flops(B: int, H: int, T: int, d: int, causal: bool) -> dict[str, float]:
    """FLOPs of the forward (Q K^T and P V) and of the backward (five products), per call."""
    forward = 4.0 * B * H * T * T * d * (0.5 if causal else 1.0)
    return {"forward": forward, "backward": 2.5 * forward, "forward_backward": 3.5 * forward}


def max_errors(B, H, T, d, dtype, causal, device):
    """Max |ours - SDPA| for the output and dq, dk, dv, on one set of inputs."""
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v, do = (torch.randn(B, H, T, d, generator=g, device=device, dtype=dtype)
                   for _ in range(4))
    results = []
    for fn in (flash_attention_triton, F.scaled_dot_product_attention):
        x = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fn(*x, is_causal=causal)
        results.append([out, *torch.autograd.grad(out, x, do)])
    names = ("out", "dq", "dk", "dv")
    return {n: (a.float() - b.float()).abs().max().item()
            for n, a, b in zip(names, *results, strict=True)}


def cpu_interpreter_run() -> dict:
    T, d, B, H = 64, 16, 1, 2
    checks = {}
    for causal in (False, True):
        errs = max_errors(B, H, T, d, torch.float32, causal, "cpu")
        checks["causal" if causal else "full"] = errs
        assert max(errs.values()) < 1e-5, f"the kernels disagree with SDPA: {errs}"
        print(f"T={T} d={d} causal={causal}: max |ours - SDPA| "
              + ", ".join(f"{n} {e:.1e}" for n, e in errs.items()))
    print("no GPU: the kernels ran under the Triton interpreter for correctness only; "
          "GPU figures are not measured")
    return {"mode": "cpu-interpreter", "speed_measured": False,
            "note": "Triton interpreter on the CPU: a correctness run, no speed figures",
            "shape": {"B": B, "H": H, "T": T, "d": d, "dtype": "float32"},
            "max_abs_error_vs_sdpa": checks}


def gpu_run(seq_lens, head_dims, dtypes, warmup, rep) -> dict:
    from triton.testing import do_bench

    rows = []
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        for d in head_dims:
            for causal in (False, True):
                for T in seq_lens:
                    B, H = max(1, 16384 // T), 2048 // d
                    errs = max_errors(1, 2, min(T, 2048), d, dtype, causal, "cuda")
                    g = torch.Generator(device="cuda").manual_seed(1)
                    q, k, v, do = (torch.randn(B, H, T, d, generator=g, device="cuda",
                                               dtype=dtype) for _ in range(4))
                    row = {"dtype": dtype_name, "d": d, "causal": causal, "T": T, "B": B,
                           "H": H, "max_abs_error_vs_sdpa": errs}
                    flops = attention_flops(B, H, T, d, causal)
                    for label, fn in (("ours", flash_attention_triton),
                                      ("sdpa", F.scaled_dot_product_attention)):
                        ms_f = do_bench(lambda fn=fn, q=q, k=k, v=v, c=causal: fn(q, k, v, is_causal=c),
                                        warmup=warmup, rep=rep, return_mode="median")
                        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))

                        def fwd_bwd(fn=fn, qg=qg, kg=kg, vg=vg, c=causal, do=do):
                            fn(qg, kg, vg, is_causal=c).backward(do)

                        ms_fb = do_bench(fwd_bwd, warmup=warmup, rep=rep, return_mode="median",
                                         grad_to_none=[qg, kg, vg])
                        ms_b = ms_fb - ms_f
                        row[label] = {
                            "forward_ms": ms_f, "forward_backward_ms": ms_fb,
                            "backward_ms": ms_b,
                            "forward_tflops": flops["forward"] / ms_f / 1e9,
                            "forward_backward_tflops": flops["forward_backward"] / ms_fb / 1e9,
                            "backward_tflops": flops["backward"] / ms_b / 1e9,
                        }
                    for key in ("forward", "forward_backward", "backward"):
                        row[f"{key}_ratio"] = (row["ours"][f"{key}_tflops"]
                                               / row["sdpa"][f"{key}_tflops"])
                    rows.append(row)
                    print(f"{dtype_name:9s} d={d:<4d} causal={causal!s:5s} T={T:<6d} "
                          f"fwd {row['ours']['forward_tflops']:6.1f} vs "
                          f"{row['sdpa']['forward_tflops']:6.1f} TFLOP/s ({row['forward_ratio']:.2f}x)"
                          f"  bwd {row['ours']['backward_tflops']:6.1f} vs "
                          f"{row['sdpa']['backward_tflops']:6.1f} ({row['backward_ratio']:.2f}x)"
                          f"  max err {max(errs.values()):.1e}")
    goal_rows = [r for r in rows if r["T"] >= 4096 and r["d"] == 128 and r["dtype"] == "float16"]
    summary = {}
    if goal_rows:
        summary = {"min_forward_ratio": min(r["forward_ratio"] for r in goal_rows),
                   "min_backward_ratio": min(r["backward_ratio"] for r in goal_rows)}
        summary["goal_met"] = (summary["min_forward_ratio"] >= GOAL["forward_ratio_at_least"]
                               and summary["min_backward_ratio"] >= GOAL["backward_ratio_at_least"])
        print(f"at T >= 4k, d = 128, fp16: forward >= {summary['min_forward_ratio']:.2f}x SDPA, "
              f"backward >= {summary['min_backward_ratio']:.2f}x (goal 0.8x, 0.6x)")
    return {"mode": "gpu", "speed_measured": True, "statistic": "median of do_bench repetitions",
            "warmup_ms": warmup, "rep_ms": rep,
            "flops": "forward 4 B H T^2 d, backward 2.5x, causal halved", "rows": rows,
            "summary": summary, "goal": GOAL}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", type=int, nargs="+",
                        default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"])
    parser.add_argument("--warmup", type=int, default=25, help="do_bench warmup, ms")
    parser.add_argument("--rep", type=int, default=100, help="do_bench repetitions, ms")
    args = parser.parse_args()
    torch.manual_seed(0)
    machine = {"platform": platform.platform(), "processor": platform.processor()
               or platform.machine(), "cpu_count": os.cpu_count(),
               "python": sys.version.split()[0], "torch": torch.__version__,
               "triton": triton.__version__}
    if GPU:
        gpu_name = torch.cuda.get_device_name()
        machine.update({"gpu": gpu_name, "cuda": torch.version.cuda,
                        "capability": list(torch.cuda.get_device_capability())})
        result = gpu_run(args.seq_lens, args.head_dims, args.dtypes, args.warmup, args.rep)
        path = RESULTS / f"flash_{slug(gpu_name)}.json"
    else:
        machine["gpu"] = None
        result = cpu_interpreter_run()
        path = RESULTS / "flash_cpu_interpreter.json"
    result = {"benchmark": "FlashAttention Triton kernels vs torch SDPA",
              "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "machine": machine, **result}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
