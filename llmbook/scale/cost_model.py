"""A cost model for training on a cluster: memory per GPU, step time and MFU of a parallel layout.

Introduced in notebooks/22_distributed_training. Given a model (:class:`ModelSpec`), a cluster
(:class:`Cluster`) and a layout (:class:`Layout`: tensor-parallel t x pipeline p x data-parallel
d, micro-batch, recomputation, ZeRO stage), :func:`predict` estimates

* **memory per GPU**: 16 bytes per parameter with mixed-precision Adam (2 for bf16 weights,
  2 for bf16 gradients, 12 for the fp32 master copy and two moments; Rajbhandari et al. 2020,
  "ZeRO"), divided by t p, and the optimizer (ZeRO-1), gradients (2) and weights (3) also
  by d; plus activations, per layer and micro-batch s b h (34 + 5 a s / h) bytes (Korthikanti
  et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", eq. 1 and
  table 2, with their variants for tensor/sequence parallelism and recomputation), times the
  L/p layers of a stage and the min(p, m) micro-batches its first stage holds under 1F1B;
* **step time**: compute 6 N D (1 + recompute) / (G * peak * efficiency) (Kaplan et al. 2020;
  Hoffmann et al. 2022; plus the attention term 12 L h s per token of Chowdhery et al. 2022,
  appendix B), stretched by the pipeline bubble (m + p - 1)/m, plus the exposed
  communication of each kind of parallelism in the alpha-beta model (Thakur, Rabenseifner &
  Gropp 2005): a ring all-reduce of n bytes over k ranks takes 2 (k-1) alpha + 2 (k-1)/k * n / beta;
* **MFU**, model FLOPs utilisation: 6 N D (+ attention) / (step time * G * peak), not counting
  recomputation (Chowdhery et al. 2022); the hardware FLOP/s, which count it, too.

It is a model with knobs: :class:`Efficiency` holds the fraction of peak the matrix products
reach and how much data-parallel communication hides behind the backward pass. The chapter
calibrates the first on one published run (:func:`calibrate_compute_efficiency`) and checks
the prediction on the others (:data:`PUBLISHED_RUNS`); the second is a guess, so
:func:`overlap_sensitivity` re-runs the layout search over a range of it and
:func:`layout_ranges` reports each degree of parallelism as the range the guess allows.

Expert parallelism's traffic is all-to-all, not all-reduce: :func:`alltoall_cost_symbolic`
derives the time of a pairwise-exchange all-to-all, :func:`alltoall_time` evaluates it and
:func:`expert_parallel_time` counts the four all-to-alls (dispatch and combine, forward and
backward) of each MoE layer (Lepikhin et al. 2020, "GShard").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import sympy as sp

from llmbook.scale.collectives import alpha_beta_time
from llmbook.validation import (
    check_nonnegative_number,
    check_positive_int,
    check_positive_number,
    check_probability,
)

__all__ = [
    "Cluster",
    "Efficiency",
    "Layout",
    "ModelSpec",
    "PUBLISHED_RUNS",
    "PublishedRun",
    "a100_cluster",
    "activation_bytes_per_layer",
    "activation_memory_symbolic",
    "allreduce_time",
    "alltoall_cost_symbolic",
    "alltoall_time",
    "best_layout",
    "calibrate_compute_efficiency",
    "check_layout",
    "expert_parallel_time",
    "h100_cluster",
    "layout_ranges",
    "memory_per_gpu",
    "overlap_sensitivity",
    "predict",
    "tpu_v4_cluster",
]

RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class ModelSpec:
    """A GPT-style decoder: L layers, width h, a heads, sequence s, vocabulary V.

    ``n_params`` defaults to 12 L h^2 (1 + 13/(12 h) + (V + s)/(12 L h)) (Narayanan et al.
    2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
    section 5.1); give it for models whose MLP is not 4h wide (Llama's SwiGLU, GQA).
    """

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    seq_len: int
    vocab_size: int
    n_params: float | None = None

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "seq_len", "vocab_size"):
            check_positive_int(name, getattr(self, name))
        if self.n_params is not None:
            check_positive_number("n_params", self.n_params)

    @property
    def params(self) -> float:
        if self.n_params is not None:
            return float(self.n_params)
        L, h, V, s = self.n_layers, self.d_model, self.vocab_size, self.seq_len
        return 12 * L * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * L * h))

    def flops_per_token(self) -> float:
        """Model FLOPs per token, forward and backward: 6 N + 12 L h s (PaLM's appendix B)."""
        return 6 * self.params + 12 * self.n_layers * self.d_model * self.seq_len


@dataclass(frozen=True)
class Cluster:
    """G accelerators of ``peak_flops`` (dense bf16 FLOP/s) and ``memory_bytes`` each, in nodes
    of ``gpus_per_node`` joined by ``intra_bandwidth`` (bytes/s per GPU and direction, NVLink)
    and, between nodes, ``inter_bandwidth`` (bytes/s per GPU, InfiniBand); ``latency`` is
    alpha, the fixed cost of one message (s)."""

    name: str
    n_gpus: int
    peak_flops: float
    memory_bytes: float
    intra_bandwidth: float
    inter_bandwidth: float
    gpus_per_node: int = 8
    latency: float = 10e-6

    def __post_init__(self) -> None:
        check_positive_int("n_gpus", self.n_gpus)
        check_positive_int("gpus_per_node", self.gpus_per_node)
        for name in ("peak_flops", "memory_bytes", "intra_bandwidth", "inter_bandwidth"):
            check_positive_number(name, getattr(self, name))
        check_nonnegative_number("latency", self.latency)


@dataclass(frozen=True)
class Layout:
    """tp x pp x dp GPUs; ``global_batch`` sequences per step in micro-batches of ``micro_batch``.

    ``recompute``: "none", "selective" (attention scores only; Korthikanti et al.) or "full"
    (each layer's forward again in the backward pass). ``zero_stage`` 0-3 shards optimizer
    states (1), gradients (2) and weights (3) over the data-parallel ranks. ``virtual_stages``
    v > 1 is the interleaved 1F1B schedule (Narayanan et al. 2021): each GPU holds v chunks of
    L/(p v) layers, the bubble shrinks to (p-1)/(v m) and point-to-point traffic grows v-fold.
    """

    tp: int
    pp: int
    dp: int
    micro_batch: int
    global_batch: int
    recompute: str = "none"
    sequence_parallel: bool = False
    zero_stage: int = 0
    virtual_stages: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "micro_batch", "global_batch", "virtual_stages"):
            check_positive_int(name, getattr(self, name))
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {RECOMPUTE}, got {self.recompute!r}")
        if not isinstance(self.sequence_parallel, bool):
            raise TypeError(f"sequence_parallel must be a bool, got {self.sequence_parallel!r}")
        if isinstance(self.zero_stage, bool) or self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")

    @property
    def n_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def n_microbatches(self) -> int:
        """m: micro-batches per pipeline per step."""
        return self.global_batch // (self.dp * self.micro_batch)


@dataclass(frozen=True)
class Efficiency:
    """The model's knobs: ``compute`` is the fraction of peak FLOP/s the layers reach,
    ``dp_overlap`` the fraction of data-parallel communication hidden behind the backward
    (PyTorch DDP overlaps its bucketed all-reduces with the backward, Li et al. 2020; 0.5 is
    a guess, not calibrated)."""

    compute: float = 0.5
    dp_overlap: float = 0.5

    def __post_init__(self) -> None:
        check_probability("compute", self.compute, allow_zero=False)
        check_probability("dp_overlap", self.dp_overlap)


def _check_specs(**specs: object) -> None:
    """Each of model=, cluster=, layout=, eff= must be an instance of its class (the classes
    check their own fields at construction)."""
    classes = {"model": ModelSpec, "cluster": Cluster, "layout": Layout, "eff": Efficiency}
    for name, value in specs.items():
        if not isinstance(value, classes[name]):
            cls = classes[name].__name__
            raise TypeError(f"{name} must be {'an' if cls[0] in 'AEIOU' else 'a'} {cls}, got {type(value).__name__}")


def check_layout(model: ModelSpec, cluster: Cluster, layout: Layout) -> None:
    """Raise ValueError for a layout that cannot run the model on the cluster (TypeError for
    arguments of the wrong class)."""
    _check_specs(model=model, cluster=cluster, layout=layout)
    if layout.n_gpus != cluster.n_gpus:
        raise ValueError(f"tp*pp*dp = {layout.tp}*{layout.pp}*{layout.dp} = {layout.n_gpus} "
                         f"does not equal the cluster's {cluster.n_gpus} GPUs")
    if model.n_heads % layout.tp != 0:
        raise ValueError(f"tp={layout.tp} does not divide n_heads={model.n_heads}")
    if model.n_layers % (layout.pp * layout.virtual_stages) != 0:
        raise ValueError(f"pp*virtual_stages = {layout.pp}*{layout.virtual_stages} does not "
                         f"divide n_layers={model.n_layers}")
    if layout.global_batch % (layout.dp * layout.micro_batch) != 0:
        raise ValueError(f"global_batch={layout.global_batch} is not divisible by "
                         f"dp*micro_batch = {layout.dp * layout.micro_batch}")


# ---------------------------------------------------------------- memory


def activation_memory_symbolic() -> sp.Expr:
    """SymPy: bytes of activations one transformer layer keeps for backward (16-bit values,
    1-byte dropout masks), summed term by term from Korthikanti et al. 2022, section 4.1.

    Attention: input of the QKV projection 2sbh, Q and K 4sbh, softmax output 2as^2b, its
    dropout mask as^2b, dropout output 2as^2b, V 2sbh, input of the output projection 2sbh,
    its dropout mask sbh. MLP: input 2sbh, GELU input 8sbh, second linear's input 8sbh,
    dropout mask sbh. Two layer norms: 4sbh. Total sbh (34 + 5 a s / h).
    """
    s, b, h, a = sp.symbols("s b h a", positive=True)
    attention = 2 * s * b * h + 4 * s * b * h + 2 * a * s**2 * b + a * s**2 * b \
        + 2 * a * s**2 * b + 2 * s * b * h + 2 * s * b * h + s * b * h
    mlp = 2 * s * b * h + 8 * s * b * h + 8 * s * b * h + s * b * h
    norms = 4 * s * b * h
    return sp.factor(attention + mlp + norms)


def activation_bytes_per_layer(model: ModelSpec, micro_batch: int, tp: int = 1,
                               recompute: str = "none", sequence_parallel: bool = False) -> float:
    """Bytes of activations one layer keeps per micro-batch on one GPU (Korthikanti, table 2).

    none: sbh(10 + 24/t + 5as/(ht)), with sequence parallelism sbh(34 + 5as/h)/t;
    selective (attention scores recomputed): sbh(10 + 24/t), or 34 sbh/t;
    full: the layer's input only, 2 sbh (2 sbh/t with sequence parallelism).
    """
    _check_specs(model=model)
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    s, b, h, a = model.seq_len, check_positive_int("micro_batch", micro_batch), model.d_model, model.n_heads
    t = check_positive_int("tp", tp)
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / (t if sequence_parallel else 1)
    if recompute == "selective":
        return 34 * sbh / t if sequence_parallel else sbh * (10 + 24 / t)
    if sequence_parallel:
        return sbh * (34 + 5 * a * s / h) / t
    return sbh * (10 + 24 / t + 5 * a * s / (h * t))


def memory_per_gpu(model: ModelSpec, layout: Layout) -> dict[str, float]:
    """Bytes per GPU: ``weights``, ``grads``, ``optimizer``, ``activations`` and ``total``."""
    _check_specs(model=model, layout=layout)
    n = model.params / (layout.tp * layout.pp)
    d = layout.dp
    weights = 2 * n / (d if layout.zero_stage >= 3 else 1)
    grads = 2 * n / (d if layout.zero_stage >= 2 else 1)
    optimizer = 12 * n / (d if layout.zero_stage >= 1 else 1)
    per_layer = activation_bytes_per_layer(model, layout.micro_batch, layout.tp, layout.recompute,
                                           layout.sequence_parallel)
    in_flight = min(layout.pp, max(layout.n_microbatches, 1))  # 1F1B, first stage
    activations = model.n_layers / layout.pp * in_flight * per_layer
    return {"weights": weights, "grads": grads, "optimizer": optimizer,
            "activations": activations, "total": weights + grads + optimizer + activations}


# ---------------------------------------------------------------- time


def allreduce_time(n_bytes: float, ranks: int, bandwidth: float, latency: float) -> float:
    """Ring all-reduce time in the alpha-beta model of section 22.2
    (:func:`~llmbook.scale.collectives.alpha_beta_time`), with beta = 1 / ``bandwidth``."""
    k = check_positive_int("ranks", ranks)
    check_nonnegative_number("n_bytes", n_bytes)
    check_positive_number("bandwidth", bandwidth)
    check_nonnegative_number("latency", latency)
    return 0.0 if k == 1 else alpha_beta_time(n_bytes, k, latency, 1.0 / bandwidth)


def alltoall_cost_symbolic() -> dict[str, sp.Expr]:
    """SymPy: the alpha-beta time of an all-to-all of n bytes per rank over p ranks.

    Each rank holds p blocks of n/p bytes, block j destined for rank j. In the pairwise
    exchange (Thakur, Rabenseifner & Gropp 2005, section 3) step i = 1 .. p-1 sends block
    (r + i) mod p to rank r + i and receives from r - i: one message of n/p bytes per step, all
    links busy at once. Summing the steps: T = (p-1) alpha + (p-1)/p n beta, and each rank sends
    (p-1)/p n bytes (its own block stays). Half an all-reduce's bandwidth term, and a
    collective whose volume does not shrink as p grows.
    """
    p, n, alpha, beta, i = sp.symbols("p n alpha beta i", positive=True)
    step = alpha + n / p * beta
    return {"time": sp.expand(sp.summation(step, (i, 1, p - 1))),
            "bytes_per_rank": sp.factor(sp.summation(n / p, (i, 1, p - 1)))}


def alltoall_time(n_bytes: float, ranks: int, bandwidth: float, latency: float) -> float:
    """Pairwise all-to-all of ``n_bytes`` per rank over ``ranks``: (k-1) alpha + (k-1)/k n / bandwidth
    (:func:`alltoall_cost_symbolic`); 0 for one rank."""
    k = check_positive_int("ranks", ranks)
    check_nonnegative_number("n_bytes", n_bytes)
    check_positive_number("bandwidth", bandwidth)
    check_nonnegative_number("latency", latency)
    return (k - 1) * latency + (k - 1) / k * n_bytes / bandwidth


def expert_parallel_time(tokens_per_rank: int, d_model: int, n_moe_layers: int, ep: int,
                         cluster: Cluster, top_k: int = 1, capacity_factor: float = 1.0,
                         bytes_per_value: int = 2) -> float:
    """Seconds of expert-parallel all-to-all per training step and rank.

    Each MoE layer does four all-to-alls: dispatch and combine in the forward pass, their
    transposes in the backward (GShard; Fedus et al. 2022). Each sends the rank's buffer of
    C = capacity_factor k n tokens of d values (b bytes each), so one layer costs
    4 * alltoall_time(C d b, ep): bytes per layer and pass 2 n k d b (chapter 21's
    :func:`~llmbook.scale.moe.all_to_all_bytes`) times the factor. Over NVLink when ep fits a
    node, else over the inter-node links.
    """
    _check_specs(cluster=cluster)
    n = check_positive_int("tokens_per_rank", tokens_per_rank)
    d = check_positive_int("d_model", d_model)
    layers = check_positive_int("n_moe_layers", n_moe_layers)
    k = check_positive_int("top_k", top_k)
    e = check_positive_int("ep", ep)
    cf = check_positive_number("capacity_factor", capacity_factor)
    b = check_positive_int("bytes_per_value", bytes_per_value)
    bw = cluster.intra_bandwidth if e <= cluster.gpus_per_node else cluster.inter_bandwidth
    return layers * 4 * alltoall_time(cf * k * n * d * b, e, bw, cluster.latency)


def predict(model: ModelSpec, cluster: Cluster, layout: Layout,
            eff: Efficiency = Efficiency()) -> dict[str, float]:
    """Predicted step time (s) and its parts, tokens/s, model and hardware TFLOP/s per GPU,
    MFU, and memory per GPU (bytes), for ``layout`` on ``cluster``.

    compute = F_hw / (G peak eff), F_hw the model FLOPs plus recomputation (a second forward of
    the layers, 2N + 4Lhs per token, for full; the attention scores, 4Lhs, for selective);
    tp = (L/p) m n_ar t_ar, n_ar = 4 all-reduces of b s h 2 bytes per layer and micro-batch
    (6 with full recomputation), over NVLink when t fits a node; pipeline = (compute + tp)
    (1 + (p - 1)/(v m)) (the bubble); pp = 2 v m point-to-point sends of b s h 2 / t bytes
    between nodes;
    dp = (1 - overlap) * all-reduce of the stage's 2-byte gradients over d ranks (x1.5 for
    ZeRO-3, which also all-gathers the weights).
    """
    check_layout(model, cluster, layout)
    _check_specs(eff=eff)
    L, h, s = model.n_layers, model.d_model, model.seq_len
    G, m, t, p, d = cluster.n_gpus, layout.n_microbatches, layout.tp, layout.pp, layout.dp
    tokens = layout.global_batch * s
    model_flops = model.flops_per_token() * tokens
    extra = {"none": 0.0, "selective": 4 * L * h * s,
             "full": 2 * model.params + 4 * L * h * s}[layout.recompute]
    hw_flops = model_flops + extra * tokens
    compute = hw_flops / (G * cluster.peak_flops * eff.compute)
    msg = layout.micro_batch * s * h * 2
    tp_bw = cluster.intra_bandwidth if t <= cluster.gpus_per_node else cluster.inter_bandwidth
    n_ar = 6 if layout.recompute == "full" else 4
    tp_comm = L / p * m * n_ar * allreduce_time(msg, t, tp_bw, cluster.latency)
    v = layout.virtual_stages
    bubble = (compute + tp_comm) * (p - 1) / (v * m)
    pipeline = compute + tp_comm + bubble
    pp_comm = 2 * v * m * (cluster.latency + msg / t / cluster.inter_bandwidth) if p > 1 else 0.0
    grad_bytes = 2 * model.params / (t * p) * (1.5 if layout.zero_stage == 3 else 1.0)
    dp_bw = cluster.inter_bandwidth if G > cluster.gpus_per_node else cluster.intra_bandwidth
    dp_comm = (1 - eff.dp_overlap) * allreduce_time(grad_bytes, d, dp_bw, cluster.latency)
    step = pipeline + pp_comm + dp_comm
    mem = memory_per_gpu(model, layout)
    return {"step_time": step, "compute": compute, "bubble": bubble,
            "tp_comm": tp_comm, "pp_comm": pp_comm, "dp_comm": dp_comm,
            "tokens_per_s": tokens / step, "model_tflops_per_gpu": model_flops / step / G / 1e12,
            "hardware_tflops_per_gpu": hw_flops / step / G / 1e12,
            "mfu": model_flops / (step * G * cluster.peak_flops),
            "memory": mem["total"], "fits": mem["total"] <= cluster.memory_bytes}


def calibrate_compute_efficiency(model: ModelSpec, cluster: Cluster, layout: Layout,
                                 tflops_per_gpu: float, hardware: bool = True,
                                 eff: Efficiency = Efficiency()) -> float:
    """The compute efficiency at which :func:`predict` reproduces a reported TFLOP/s per GPU.

    The step time is compute / e * (1 + (p-1)/(v m)) + everything else, linear in 1/e, so e comes out
    in closed form. ``hardware``: the reported number counts recomputation (Megatron does).
    """
    check_positive_number("tflops_per_gpu", tflops_per_gpu)
    at_one = predict(model, cluster, layout, replace(eff, compute=1.0))
    flops = at_one["hardware_tflops_per_gpu" if hardware else "model_tflops_per_gpu"] * \
        at_one["step_time"]  # TFLOP per GPU per step: fixed
    step = flops / tflops_per_gpu
    m, p, v = layout.n_microbatches, layout.pp, layout.virtual_stages
    stretched = at_one["compute"] * (1 + (p - 1) / (v * m))
    rest = at_one["step_time"] - stretched
    if step <= rest:
        raise ValueError(f"the reported {tflops_per_gpu} TFLOP/s is unreachable: communication "
                         f"alone takes {rest:.3g} s of the {step:.3g} s step")
    return stretched / (step - rest)


# ---------------------------------------------------------------- choosing a layout


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def best_layout(model: ModelSpec, cluster: Cluster, global_batch: int,
                eff: Efficiency = Efficiency(), micro_batches: tuple[int, ...] = (1, 2, 4),
                recompute: tuple[str, ...] = RECOMPUTE,
                zero_stages: tuple[int, ...] = (0, 1)) -> tuple[Layout, dict[str, float]] | None:
    """The layout with the most predicted tokens/s that fits in memory, or None if none fits.

    Searches tp over the powers of two up to a node that divide the heads, pp over the
    divisors of L, dp = G / (tp pp), and the given micro-batch sizes, recomputation and ZeRO
    stages. Ties go to the first found (smaller tp, pp).
    """
    _check_specs(model=model, cluster=cluster, eff=eff)
    check_positive_int("global_batch", global_batch)
    for b in micro_batches:
        check_positive_int("micro_batches", b)
    best: tuple[Layout, dict[str, float]] | None = None
    G = cluster.n_gpus
    tps = [t for t in (2 ** k for k in range(int(math.log2(cluster.gpus_per_node)) + 1))
           if model.n_heads % t == 0 and G % t == 0]
    for t in tps:
        for p in _divisors(model.n_layers):
            if (G // t) % p != 0:
                continue
            d = G // (t * p)
            for b in micro_batches:
                if global_batch % (d * b) != 0:
                    continue
                for r in recompute:
                    for z in zero_stages:
                        lay = Layout(t, p, d, b, global_batch, r, sequence_parallel=t > 1, zero_stage=z)
                        pred = predict(model, cluster, lay, eff)
                        if pred["fits"] and (best is None or pred["tokens_per_s"] > best[1]["tokens_per_s"]):
                            best = (lay, pred)
    return best


def overlap_sensitivity(model: ModelSpec, cluster: Cluster, global_batch: int,
                        overlaps: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0),
                        eff: Efficiency = Efficiency(),
                        **search: object) -> list[tuple[float, Layout | None, dict[str, float] | None]]:
    """:func:`best_layout` re-run for each guessed ``dp_overlap`` (the other knobs of ``eff``
    unchanged): a list of (overlap, layout, prediction), layout and prediction None where
    nothing fits. ``search`` goes on to :func:`best_layout` (micro_batches, recompute, ...)."""
    _check_specs(eff=eff)
    if not overlaps:
        raise ValueError("overlaps must list at least one value")
    out = []
    for o in overlaps:
        found = best_layout(model, cluster, global_batch, replace(eff, dp_overlap=o), **search)  # type: ignore[arg-type]
        out.append((o, *found) if found is not None else (o, None, None))
    return out


def layout_ranges(sensitivity: list[tuple[float, Layout | None, dict[str, float] | None]]) -> dict[str, tuple]:
    """The range of each choice over an :func:`overlap_sensitivity` sweep: (min, max) of
    ``tp``, ``pp``, ``dp``, ``micro_batch``, ``zero_stage`` and ``mfu``, and the set of
    ``recompute`` modes; ``distinct`` counts the different layouts. Sweeps where nothing
    fits are skipped (ValueError if none fits)."""
    found = [(lay, pred) for _, lay, pred in sensitivity if lay is not None]
    if not found:
        raise ValueError("no layout fits at any overlap of the sweep")
    out: dict[str, tuple] = {}
    for key in ("tp", "pp", "dp", "micro_batch", "zero_stage"):
        vals = [getattr(lay, key) for lay, _ in found]
        out[key] = (min(vals), max(vals))
    mfus = [pred["mfu"] for _, pred in found]
    out["mfu"] = (min(mfus), max(mfus))
    out["recompute"] = tuple(sorted({lay.recompute for lay, _ in found}))
    out["distinct"] = (len({lay for lay, _ in found}),)
    return out


# ---------------------------------------------------------------- published runs


@dataclass(frozen=True)
class PublishedRun:
    """A large training run with its reported throughput: ``reported_tflops`` per GPU
    (``hardware``: counting recomputation) and/or ``reported_mfu``; ``source`` cites it."""

    name: str
    model: ModelSpec
    cluster: Cluster
    layout: Layout
    source: str
    reported_tflops: float | None = None
    hardware: bool = False
    reported_mfu: float | None = None


def a100_cluster(n_gpus: int) -> Cluster:
    """A100 80 GB in DGX nodes (Selene): 312 TFLOP/s dense bf16, NVLink 300 GB/s per direction,
    8 x 200 Gb/s InfiniBand per node (25 GB/s per GPU)."""
    return Cluster(f"{n_gpus} x A100 80GB", n_gpus, 312e12, 80e9, 300e9, 25e9)


def h100_cluster(n_gpus: int) -> Cluster:
    """H100 SXM 80 GB: 989 TFLOP/s dense bf16, NVLink 450 GB/s per direction, 400 Gb/s per GPU."""
    return Cluster(f"{n_gpus} x H100 80GB", n_gpus, 989e12, 80e9, 450e9, 50e9)


def tpu_v4_cluster(n_chips: int) -> Cluster:
    """TPU v4: 275 TFLOP/s bf16, 32 GiB HBM; its 3-D torus is modelled as 'nodes' of 4 chips
    with ~135 GB/s between them (an approximation: the cost model knows no torus)."""
    return Cluster(f"{n_chips} x TPU v4", n_chips, 275e12, 32 * 2**30, 135e9, 135e9, gpus_per_node=4)


GPT3_175B = ModelSpec("GPT-3 175B", 96, 12288, 96, 2048, 51200)
GPT_1T = ModelSpec("GPT 1T", 128, 25600, 160, 2048, 51200)

PUBLISHED_RUNS: tuple[PublishedRun, ...] = (
    PublishedRun("Megatron GPT-3 175B", GPT3_175B, a100_cluster(1024),
                 Layout(8, 8, 16, 1, 1536, "full"),
                 "Narayanan et al. 2021, sec. 5.1: 175B on 1024 A100s, batch 1536, 140 TFLOP/s per GPU",
                 reported_tflops=140.0, hardware=True),
    PublishedRun("Megatron GPT 1T", GPT_1T, a100_cluster(3072),
                 Layout(8, 64, 6, 1, 3072, "full"),
                 "Narayanan et al. 2021, table 1: 1T (t=8, p=64) on 3072 A100s, 163 TFLOP/s per GPU",
                 reported_tflops=163.0, hardware=True),
    # OPT's "up to 147 TFLOP/s per GPU" is a peak, and the paper does not say which FLOPs it
    # counts. Its run recomputes activations and uses Megatron's tensor parallelism, so it is
    # scored like the Megatron runs, counting recomputation (hardware=True); read as model
    # FLOPs instead, 147 would be 47 % MFU (chapter 22 shows both readings).
    PublishedRun("OPT-175B", ModelSpec("OPT-175B", 96, 12288, 96, 2048, 50272), a100_cluster(992),
                 Layout(8, 1, 124, 1, 992, "full", zero_stage=3),
                 "Zhang et al. 2022 (OPT), sec. 2.3: 992 A100 80GB, Megatron TP 8 + FSDP, "
                 "up to 147 TFLOP/s per GPU",
                 reported_tflops=147.0, hardware=True),
    PublishedRun("PaLM 540B", ModelSpec("PaLM 540B", 118, 18432, 48, 2048, 256000, 540.35e9),
                 tpu_v4_cluster(6144), Layout(12, 1, 512, 4, 2048, "full", True, zero_stage=3),
                 "Chowdhery et al. 2022, sec. 4 and table 3: 6144 TPU v4 chips, 46.2% MFU",
                 reported_mfu=0.462),
    # 126 layers in 16 stages: Llama 3 gives the first and last stage one layer less; the
    # cost model needs equal stages, so it counts 128 layer slots (and 405B parameters).
    # FlashAttention keeps no attention scores: the memory of "selective" recomputation.
    # Interleaving v = 4 is our assumption (the paper tunes its schedule, sec. 3.3.2).
    PublishedRun("Llama 3 405B", ModelSpec("Llama 3 405B", 128, 16384, 128, 8192, 128256, 405e9),
                 h100_cluster(16384),
                 Layout(8, 16, 128, 1, 2048, "selective", True, zero_stage=1, virtual_stages=4),
                 "Dubey et al. 2024, table 4: 16K H100s, TP 8, PP 16, DP 128, 400 TFLOP/s, 41% MFU",
                 reported_tflops=400.0, reported_mfu=0.41),
)
