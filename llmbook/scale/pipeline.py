"""Pipeline parallelism: GPipe and 1F1B schedules run across processes, their bubble and memory.

Introduced in notebooks/22_distributed_training. A model of L blocks is cut into p *stages*
of L/p consecutive blocks, one per rank. A batch is split into m *micro-batches*; stage s
receives a micro-batch's activation from stage s - 1, runs its blocks and sends the result to
s + 1; the backward pass flows the other way, stage s + 1 sending the gradient of the loss
with respect to what s sent it. Gradients of the m micro-batches add up, so one step equals a
step on the whole batch (the loss of a micro-batch is its share of the full batch's loss).

Two schedules order each stage's forward (F) and backward (B) work:

* **GPipe** (Huang et al. 2019, "GPipe: Efficient Training of Giant Neural Networks using
  Pipeline Parallelism"): all m forwards, then all m backwards. Stage s holds the
  activations of all m micro-batches at once.
* **1F1B** (PipeDream-Flush; Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN
  Training", and "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM"): stage s runs p - s - 1 warm-up forwards, then alternates one forward and
  one backward, then drains the remaining backwards. Same bubble, but stage s never holds
  more than p - s micro-batches.

Both idle for (p - 1)(t_f + t_b) per stage out of (m + p - 1)(t_f + t_b): the *bubble
fraction* (p - 1)/(m + p - 1) (:func:`bubble_fraction_symbolic`). The worker
:func:`pipeline_worker` measures it as it runs, in two clocks:

* **logical ticks**: a forward takes ``t_f`` ticks and a backward ``t_b`` (default 1 and 2:
  a backward does twice a forward's multiplications). Every message carries the tick at which
  its sender finished; an operation starts at max(own clock, that tick). This is the
  schedule's ideal timing, computed by the real processes in their real order, and exact;
* **wall-clock seconds**, where each operation is made to take ``compute_seconds * t_f`` (or
  ``* t_b``) by sleeping, so that the tiny model's own compute does not hide the structure.

It also counts, with ``torch.autograd.graph.saved_tensors_hooks``, the bytes of activations
autograd keeps for the micro-batches a stage holds: the peak is the memory 1F1B saves.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import sympy as sp
import torch
import torch.distributed as dist
from torch import Tensor, nn

from llmbook.validation import (
    check_finite,
    check_keys,
    check_nonnegative_number,
    check_positive_int,
    check_same_dtype,
)

__all__ = [
    "StageReport",
    "bubble_fraction",
    "bubble_fraction_symbolic",
    "check_pipeline",
    "gpipe_schedule",
    "make_mlp_stack",
    "measured_bubble",
    "one_f_one_b_schedule",
    "pipeline_worker",
    "pipeline_worker_many",
    "reference_gradients",
    "run_pipeline",
    "run_pipelines",
    "schedule",
    "split_microbatches",
    "split_stages",
]

Op = tuple[str, int]  # ("F" or "B", micro-batch index)


# ---------------------------------------------------------------- schedules and the bubble


def _check_pm(num_stages: int, num_microbatches: int) -> tuple[int, int]:
    return (check_positive_int("num_stages", num_stages),
            check_positive_int("num_microbatches", num_microbatches))


def gpipe_schedule(num_stages: int, num_microbatches: int) -> list[list[Op]]:
    """GPipe: every stage runs F0 .. F(m-1), then B0 .. B(m-1). One list of ops per stage."""
    p, m = _check_pm(num_stages, num_microbatches)
    ops = [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
    return [list(ops) for _ in range(p)]


def one_f_one_b_schedule(num_stages: int, num_microbatches: int) -> list[list[Op]]:
    """1F1B (PipeDream-Flush): stage s does p-s-1 warm-up forwards, then alternates F and B,
    then the remaining backwards. Needs m >= p (ValueError otherwise), as Megatron does."""
    p, m = _check_pm(num_stages, num_microbatches)
    if m < p:
        raise ValueError(f"1F1B needs at least as many micro-batches as pipeline stages, got "
                         f"num_microbatches={m} < num_stages={p}")
    out = []
    for s in range(p):
        warmup = p - s - 1
        ops: list[Op] = [("F", j) for j in range(warmup)]
        for i in range(m - warmup):
            ops += [("F", warmup + i), ("B", i)]
        ops += [("B", j) for j in range(m - warmup, m)]
        out.append(ops)
    return out


def schedule(name: str, num_stages: int, num_microbatches: int) -> list[list[Op]]:
    """The schedule called ``"gpipe"`` or ``"1f1b"``."""
    if name == "gpipe":
        return gpipe_schedule(num_stages, num_microbatches)
    if name == "1f1b":
        return one_f_one_b_schedule(num_stages, num_microbatches)
    raise ValueError(f"unknown pipeline schedule {name!r}; choose 'gpipe' or '1f1b'")


def bubble_fraction(num_stages: int, num_microbatches: int) -> Fraction:
    """(p - 1)/(m + p - 1), exact: the share of a step each stage spends idle."""
    p, m = _check_pm(num_stages, num_microbatches)
    return Fraction(p - 1, m + p - 1)


def bubble_fraction_symbolic() -> sp.Expr:
    """SymPy: derive the bubble fraction from the GPipe timeline.

    With one forward taking t_f and one backward t_b: the last stage starts its first forward
    after the p - 1 stages before it, (p-1) t_f; the forwards then take m t_f. The backwards
    mirror that: m t_b, plus (p-1) t_b for the gradient to reach stage 0. Each stage works
    m (t_f + t_b) of the makespan, so idle/makespan simplifies to (p-1)/(m+p-1), whatever
    t_f and t_b.
    """
    p, m, t_f, t_b = sp.symbols("p m t_f t_b", positive=True)
    makespan = (p - 1) * t_f + m * t_f + m * t_b + (p - 1) * t_b
    busy = m * (t_f + t_b)
    return sp.simplify((makespan - busy) / makespan)


# ---------------------------------------------------------------- model, stages, micro-batches


def make_mlp_stack(widths: list[int], seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Sequential:
    """A stack of ``len(widths) - 1`` blocks Linear(widths[i], widths[i+1]) -> tanh."""
    if len(widths) < 2:
        raise ValueError(f"widths must list at least 2 sizes, got {widths!r}")
    widths = [check_positive_int("width", w) for w in widths]
    gen = torch.Generator().manual_seed(seed)
    blocks = []
    for d_in, d_out in zip(widths[:-1], widths[1:], strict=True):
        lin = nn.Linear(d_in, d_out, dtype=dtype)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(d_out, d_in, generator=gen, dtype=dtype) / d_in ** 0.5)
            lin.bias.copy_(0.1 * torch.randn(d_out, generator=gen, dtype=dtype))
        blocks.append(nn.Sequential(lin, nn.Tanh()))
    return nn.Sequential(*blocks)


def split_stages(model: nn.Sequential, num_stages: int) -> list[nn.Sequential]:
    """Cut a sequential model into p stages of equal numbers of consecutive blocks (copies)."""
    p = check_positive_int("num_stages", num_stages)
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"model must be an nn.Sequential of blocks, got {type(model).__name__}")
    if len(model) % p != 0:
        raise ValueError(f"num_stages={p} does not divide the model's {len(model)} blocks")
    k = len(model) // p
    return [copy.deepcopy(model[s * k:(s + 1) * k]) for s in range(p)]


def split_microbatches(x: Tensor, num_microbatches: int) -> list[Tensor]:
    """Split a batch (B, ...) into m micro-batches of B/m rows; m must divide B."""
    m = check_positive_int("num_microbatches", num_microbatches)
    if not isinstance(x, Tensor) or x.ndim < 1:
        raise TypeError(f"x must be a tensor with a batch dimension, got {type(x).__name__}")
    if x.shape[0] % m != 0:
        raise ValueError(f"the batch of {x.shape[0]} is not divisible into "
                         f"num_microbatches={m} equal micro-batches")
    return list(x.split(x.shape[0] // m))


def _loss(out: Tensor, y: Tensor, batch: int) -> Tensor:
    """Squared error summed over the micro-batch, divided by the *full* batch size."""
    return ((out - y) ** 2).sum() / batch


def _check_xy(model: nn.Sequential, x: object, y: object) -> None:
    """x (B, d_in) and y (B, d_out): 2-d, finite, in the model's dtype, as wide as its first
    linear layer's input and its last one's output (y - out would silently broadcast)."""
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"model must be an nn.Sequential of blocks, got {type(model).__name__}")
    for name, t in (("x", x), ("y", y)):
        if not isinstance(t, Tensor) or not t.is_floating_point() or t.ndim != 2:
            raise TypeError(f"{name} must be a 2-d floating-point tensor (B, features), got "
                            f"{getattr(t, 'shape', type(t).__name__)}")
        check_finite(t, name)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y must have the same batch size, got {x.shape[0]} and {y.shape[0]}")
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if linears:
        for name, t, width in (("x", x, linears[0].in_features), ("y", y, linears[-1].out_features)):
            if t.shape[1] != width:
                raise ValueError(f"{name} must have shape (B, {width}) for this model, got {tuple(t.shape)}")
            check_same_dtype(t, name, linears[0].weight, "the model's weights")


def _check_ticks(t_f: object, t_b: object, compute_seconds: object) -> None:
    if not all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in (t_f, t_b)):
        raise ValueError(f"t_f and t_b must be positive int ticks, got t_f={t_f!r} and t_b={t_b!r}")
    check_nonnegative_number("compute_seconds", compute_seconds)


def reference_gradients(model: nn.Sequential, x: Tensor, y: Tensor) -> tuple[float, list[Tensor]]:
    """Single-process loss and parameter gradients (in ``model.parameters()`` order) on the
    whole batch, with the loss the pipeline uses: sum of squared errors / B."""
    _check_xy(model, x, y)
    model = copy.deepcopy(model)
    loss = _loss(model(x), y, x.shape[0])
    loss.backward()
    return float(loss.detach()), [p.grad for p in model.parameters()]


# ---------------------------------------------------------------- the worker


def check_pipeline(model: nn.Sequential, x: Tensor, y: Tensor, num_stages: int,
                   num_microbatches: int, schedule_name: str) -> None:
    """Raise ValueError/TypeError for a pipeline run that cannot work, before starting it:
    stages that do not divide the blocks, micro-batches that do not divide the batch or (for
    1F1B) are fewer than the stages, x and y of different batch sizes, an unknown schedule."""
    p, m = _check_pm(num_stages, num_microbatches)
    schedule(schedule_name, p, m)  # unknown name, 1F1B with m < p
    split_stages(model, p)
    _check_xy(model, x, y)
    split_microbatches(x, m)


def run_pipeline(model: nn.Sequential, x: Tensor, y: Tensor, num_stages: int,
                 num_microbatches: int, schedule_name: str = "1f1b", t_f: int = 1, t_b: int = 2,
                 compute_seconds: float = 0.0, timeout: float = 60.0) -> list[StageReport]:
    """Check the arguments in this process (a clear ValueError, not a failed rank), then run
    :func:`pipeline_worker` on ``num_stages`` processes; return the stages' reports."""
    from llmbook.scale.launch import run

    check_pipeline(model, x, y, num_stages, num_microbatches, schedule_name)
    _check_ticks(t_f, t_b, compute_seconds)
    return run(pipeline_worker, num_stages, model, x, y, num_microbatches, schedule_name,
               t_f, t_b, compute_seconds, timeout=timeout)


@dataclass
class StageReport:
    """What one stage recorded while running its schedule.

    ``events``: (kind, micro-batch, tick start, tick end, wall start, wall end) per op, wall
    times from ``time.perf_counter`` (a clock shared by the processes of one machine).
    ``grads``: the stage's parameter gradients. ``peak_microbatches``: most micro-batches
    whose activations it held at once; ``peak_activation_bytes``: most bytes autograd kept
    saved at once; ``activation_bytes``: per micro-batch.
    """

    stage: int
    events: list[tuple[str, int, int, int, float, float]] = field(default_factory=list)
    grads: list[Tensor] = field(default_factory=list)
    loss: float = 0.0
    peak_microbatches: int = 0
    peak_activation_bytes: int = 0
    activation_bytes: list[int] = field(default_factory=list)


def _out_features(stage: nn.Sequential) -> int:
    return [m for m in stage.modules() if isinstance(m, nn.Linear)][-1].out_features


def pipeline_worker(rank: int, world_size: int, model: nn.Sequential, x: Tensor, y: Tensor,
                    num_microbatches: int, schedule_name: str = "1f1b", t_f: int = 1,
                    t_b: int = 2, compute_seconds: float = 0.0) -> StageReport:
    """Worker for :func:`llmbook.scale.launch.run`: rank s runs stage s of ``model``.

    x (B, d_in) and y (B, d_out) are the whole batch (every rank gets it; stage 0 reads x,
    the last stage y). Activations go forward and gradients backward with ``dist.isend`` /
    ``dist.recv``, each followed by the sender's finishing tick. ``compute_seconds`` > 0
    makes a forward sleep ``compute_seconds * t_f`` and a backward ``compute_seconds * t_b``.
    """
    p = world_size
    m = check_positive_int("num_microbatches", num_microbatches)
    _check_ticks(t_f, t_b, compute_seconds)
    check_pipeline(model, x, y, p, m, schedule_name)
    ops = schedule(schedule_name, p, m)[rank]
    stages = split_stages(model, p)
    stage = stages[rank]
    xs, ys = split_microbatches(x, m), split_microbatches(y, m)
    first, last = rank == 0, rank == p - 1
    params = {q.data_ptr() for q in stage.parameters()}
    report = StageReport(stage=rank)
    inputs: dict[int, Tensor] = {}
    outputs: dict[int, Tensor] = {}
    held_bytes: dict[int, int] = {}
    pending: list[Any] = []
    clock = 0
    tick = torch.zeros(1, dtype=torch.int64)
    dist.barrier()
    for kind, j in ops:
        if kind == "F":
            if first:
                inp, ready = xs[j], 0
            else:
                inp = torch.empty(xs[j].shape[0], _out_features(stages[rank - 1]), dtype=x.dtype)
                dist.recv(inp, src=rank - 1, tag=0)
                dist.recv(tick, src=rank - 1, tag=1)
                inp.requires_grad_(True)
                ready = int(tick)
            start, wall0 = max(clock, ready), time.perf_counter()
            seen: dict[int, int] = {}

            def pack(t: Tensor, seen: dict[int, int] = seen) -> Tensor:
                if t.data_ptr() not in params:  # activations only, each tensor once
                    seen[t.data_ptr()] = t.numel() * t.element_size()
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = stage(inp)
                if last:
                    out = _loss(out, ys[j], x.shape[0])
                    report.loss += float(out.detach())
            inputs[j], outputs[j] = inp, out
            held_bytes[j] = sum(seen.values())
            report.activation_bytes.append(held_bytes[j])
            report.peak_microbatches = max(report.peak_microbatches, len(held_bytes))
            report.peak_activation_bytes = max(report.peak_activation_bytes, sum(held_bytes.values()))
            if compute_seconds > 0:
                time.sleep(compute_seconds * t_f)
            clock = start + t_f
            report.events.append(("F", j, start, clock, wall0, time.perf_counter()))
            if not last:
                pending.append(dist.isend(out.detach().contiguous(), dst=rank + 1, tag=0))
                pending.append(dist.isend(torch.tensor([clock]), dst=rank + 1, tag=1))
        elif kind == "B":
            if last:
                grad, ready = None, clock
            else:
                grad = torch.empty_like(outputs[j])
                dist.recv(grad, src=rank + 1, tag=2)
                dist.recv(tick, src=rank + 1, tag=3)
                ready = int(tick)
            start, wall0 = max(clock, ready), time.perf_counter()
            outputs[j].backward(grad)
            if compute_seconds > 0:
                time.sleep(compute_seconds * t_b)
            clock = start + t_b
            report.events.append(("B", j, start, clock, wall0, time.perf_counter()))
            if not first:
                pending.append(dist.isend(inputs[j].grad.contiguous(), dst=rank - 1, tag=2))
                pending.append(dist.isend(torch.tensor([clock]), dst=rank - 1, tag=3))
            del inputs[j], outputs[j], held_bytes[j]  # the micro-batch's activations are freed
    for work in pending:
        work.wait()
    report.grads = [q.grad.detach().clone() for q in stage.parameters()]
    return report


def pipeline_worker_many(rank: int, world_size: int, model: nn.Sequential, x: Tensor, y: Tensor,
                         runs: list[dict[str, Any]]) -> list[StageReport]:
    """:func:`pipeline_worker` for several runs in one launch of the processes; each run is a
    dict of its keyword arguments (``num_microbatches``, ``schedule_name``, ...)."""
    return [pipeline_worker(rank, world_size, model, x, y, **kw) for kw in runs]


def run_pipelines(model: nn.Sequential, x: Tensor, y: Tensor, num_stages: int,
                  runs: list[dict[str, Any]], timeout: float = 60.0) -> list[list[StageReport]]:
    """Several pipeline runs on the same ``num_stages`` processes, started once (saves the
    start-up of the processes). ``runs``: keyword arguments of :func:`pipeline_worker`, each
    checked here first. Returns, per run, the stages' reports."""
    from llmbook.scale.launch import run

    if not isinstance(runs, list | tuple) or not runs:
        raise TypeError(f"runs must be a non-empty list of dicts, got {runs!r}")
    for kw in runs:
        check_keys(kw, "each of runs", ("num_microbatches",))
        check_pipeline(model, x, y, num_stages, kw["num_microbatches"], kw.get("schedule_name", "1f1b"))
        _check_ticks(kw.get("t_f", 1), kw.get("t_b", 2), kw.get("compute_seconds", 0.0))
    per_rank = run(pipeline_worker_many, num_stages, model, x, y, list(runs), timeout=timeout)
    return [[per_rank[s][i] for s in range(num_stages)] for i in range(len(runs))]


def measured_bubble(reports: list[StageReport], clock: str = "tick") -> tuple[Any, list[Any]]:
    """Bubble fraction measured from the ranks' events: 1 - busy / makespan, for the whole
    pipeline and per stage. ``clock="tick"`` gives exact Fractions, ``"wall"`` floats (the
    makespan from the earliest start to the latest end over all ranks)."""
    if not reports:
        raise ValueError("measured_bubble needs the reports of at least one stage")
    if clock not in ("tick", "wall"):
        raise ValueError(f"clock must be 'tick' or 'wall', got {clock!r}")
    a, b = (2, 3) if clock == "tick" else (4, 5)
    begin = min(e[a] for r in reports for e in r.events)
    end = max(e[b] for r in reports for e in r.events)
    span = end - begin
    busy = [sum(e[b] - e[a] for e in r.events) for r in reports]
    if clock == "tick":
        per = [Fraction(span - w, span) for w in busy]
        return Fraction(len(reports) * span - sum(busy), len(reports) * span), per
    per_w = [1 - w / span for w in busy]
    return 1 - sum(busy) / (len(reports) * span), per_w
