"""Training a small MoE language model against a dense one with the same active parameters.

Introduced in notebooks/21_mixture_of_experts. The book's Llama-style
:class:`~llmbook.transformer.model.TransformerLM` (chapter 7) becomes an MoE model by
replacing the feed-forward layer ``mlp`` of every block with an
:class:`~llmbook.scale.moe.MoELayer` (:func:`moe_lm`); nothing else changes, so attention,
norms, embeddings and initialisation are the dense model's. The loss adds the balancing
terms summed over the layers,

    L = CE + alpha sum_l LB_l + beta sum_l Z_l     (:func:`auxiliary_losses`),

with the Switch loss LB (Fedus et al., 2021) and the z-loss Z (Zoph et al., 2022); or,
instead of LB, the auxiliary-loss-free bias update of Wang et al. (2024) after each step.

The shipped artifact ``moe_vs_dense`` (:data:`MOE_VS_DENSE_RECIPE`, written by
``python -m llmbook.alignment.shipped moe_vs_dense``) trains, on the same batches of the
book's standard-library docstrings and BPE tokenizer (chapters 1 and 10):

* ``dense``: SwiGLU of width 2 f (the active width of the MoE models);
* ``moe_aux``: 8 experts of width f, top-2, Switch loss (alpha = 0.01, Switch's value) and
  z-loss (1e-3, ST-MoE's); ``moe_aux_small``: the same with alpha = 0.001;
* ``moe_free``: the same experts balanced by the selection bias instead of the Switch loss;
* ``moe_none``: the same experts with no balancing at all.

It stores their validation curves, the training compute, the expert load per layer at
every evaluation, and the weights of ``moe_aux`` (float16) for the notebook.

:func:`train_variant_seed` trains one variant of that recipe with another seed (for both the
initialisation and the batch order); ``data/make_moe_seeds.py`` runs the variants of
:data:`MOE_SEEDS_VARIANTS` (one change at a time from the unbalanced MoE) over three seeds
into ``data/moe_seeds/results.json``, and :func:`summarize_seeds` gives their means, paired
differences and Student-t intervals (chapter 21, section 21.10).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from llmbook.alignment.shipped import load_artifact, register
from llmbook.scale.moe import MoELayer, load_balancing_loss, router_z_loss, update_expert_bias
from llmbook.text.functional import cross_entropy
from llmbook.training.optim import AdamW, clip_grad_norm_, cosine_schedule, set_lr
from llmbook.training.train import evaluate, get_batch, param_groups
from llmbook.transformer.model import TransformerConfig, TransformerLM
from llmbook.validation import check_positive_int

__all__ = ["MOE_SEEDS_VARIANTS", "MOE_VS_DENSE_RECIPE", "active_parameters", "auxiliary_losses",
           "load_moe_vs_dense", "moe_layers", "moe_lm", "summarize_seeds", "train_lm", "train_variant_seed"]


def moe_lm(config: TransformerConfig, num_experts: int, top_k: int, d_ff: int,
           generator: torch.Generator | None = None, **moe_kwargs: Any) -> TransformerLM:
    """A :class:`TransformerLM` whose every block's ``mlp`` is an :class:`MoELayer`.

    ``num_experts`` experts of width ``d_ff``, top-``top_k`` routing; ``moe_kwargs`` go to
    :class:`MoELayer` (``expert_bias``, ``shared_d_ff``, ``capacity_factor``, ...). The
    model is then initialised as the dense one (GPT-2's scheme: the experts' ``down_proj``
    with the residual standard deviation), reproducibly with ``generator``.
    """
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
    model = TransformerLM(config)
    for block in model.blocks:
        block.mlp = MoELayer(config.d_model, d_ff, num_experts, top_k, **moe_kwargs)
    model.reset_parameters(generator)
    return model


def moe_layers(model: nn.Module) -> list[MoELayer]:
    """The model's :class:`MoELayer` modules, in order (empty for a dense model)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return [m for m in model.modules() if isinstance(m, MoELayer)]


def active_parameters(model: TransformerLM) -> int:
    """Parameters that one token's forward pass multiplies by: all of them except the
    token and position tables (a tied table counts once, as the LM head), with each MoE
    layer's routed experts counted k / N (the k an average token uses).

    Training costs about 6 such FLOPs per parameter and token (Kaplan et al., 2020,
    "Scaling Laws for Neural Language Models", C = 6 N D, chapter 11), the attention
    scores aside.
    """
    if not isinstance(model, TransformerLM):
        raise TypeError(f"model must be a TransformerLM, got {type(model).__name__}")
    total = model.num_parameters()
    if model.pos_embed is not None:
        total -= model.pos_embed.weight.numel()
    if model.lm_head is not None:  # untied: the input table is a lookup, not a matmul
        total -= model.embed.weight.numel()
    for layer in moe_layers(model):
        routed = sum(p.numel() for p in layer.experts.parameters())
        total -= routed - routed * layer.top_k // layer.num_experts
    return total


def auxiliary_losses(model: nn.Module) -> tuple[Tensor, Tensor]:
    """(sum over MoE layers of the Switch loss with alpha = 1, sum of the z-losses) of the
    model's last forward pass; two zeros for a dense model."""
    layers = moe_layers(model)
    if not layers:
        return torch.zeros(()), torch.zeros(())
    if any(layer.router_logits is None for layer in layers):
        raise ValueError("run the model forward before asking for its auxiliary losses")
    lb = sum(load_balancing_loss(m.router_logits, m.top_k, score=m.score) for m in layers)
    z = sum(router_z_loss(m.router_logits) for m in layers)
    return lb, z  # type: ignore[return-value]


@torch.no_grad()
def _expert_load(model: nn.Module, x: Tensor) -> Tensor:
    """(L, N) fraction of assignments per expert in each MoE layer on the batch ``x``."""
    was_training = model.training
    model.eval()
    model(x)
    model.train(was_training)
    return torch.stack([torch.bincount(m.expert_indices.reshape(-1), minlength=m.num_experts)
                        .double() / m.expert_indices.numel() for m in moe_layers(model)])


def train_lm(model: TransformerLM, train_ids: Any, val_ids: Any, train: dict[str, Any],
             aux_alpha: float = 0.0, z_coef: float = 0.0, bias_rate: float = 0.0) -> dict[str, Any]:
    """Train ``model`` with AdamW and cosine schedule (chapters 9-10) plus the MoE terms.

    ``train`` holds ``steps, batch_size, context_length, lr, min_lr, warmup_steps,
    weight_decay, grad_clip, eval_every, eval_batches, seed``. The loss is
    CE + ``aux_alpha`` sum LB + ``z_coef`` sum Z; with ``bias_rate`` > 0 every MoE layer's
    ``expert_bias`` takes one :func:`~llmbook.scale.moe.update_expert_bias` step per batch.
    Returns the history: ``train_loss`` per step, and at every evaluation step
    (``eval_steps``) ``val_loss`` (the same windows every time), ``load`` (L, N) on the
    first validation batch, ``lb`` (the summed Switch loss on it).
    """
    t = train
    steps = check_positive_int("steps", t["steps"])
    batches = torch.Generator().manual_seed(t["seed"])
    opt = AdamW(param_groups(model, t["weight_decay"]), lr=t["lr"], betas=(0.9, 0.95),
                weight_decay=t["weight_decay"])
    x_val, _ = get_batch(val_ids, t["batch_size"], t["context_length"],
                         generator=torch.Generator().manual_seed(t["seed"] + 1))
    hist: dict[str, Any] = {"train_loss": [], "eval_steps": [], "val_loss": [], "load": [], "lb": []}

    def validate(step: int) -> None:
        hist["eval_steps"].append(step)
        hist["val_loss"].append(evaluate(model, val_ids, t["batch_size"], t["context_length"],
                                         t["eval_batches"], torch.Generator().manual_seed(t["seed"] + 1)))
        if moe_layers(model):
            hist["load"].append(_expert_load(model, x_val).tolist())
            hist["lb"].append(float(auxiliary_losses(model)[0]))

    model.train()
    for step in range(steps):
        if step % t["eval_every"] == 0:
            validate(step)
        set_lr(opt, cosine_schedule(step, t["lr"], t["min_lr"], t["warmup_steps"], steps))
        x, y = get_batch(train_ids, t["batch_size"], t["context_length"], generator=batches)
        ce = cross_entropy(model(x), y)
        loss = ce
        if aux_alpha or z_coef:
            lb, z = auxiliary_losses(model)
            loss = loss + aux_alpha * lb + z_coef * z
        opt.zero_grad(set_to_none=True)
        loss.backward()
        clip_grad_norm_(model.parameters(), t["grad_clip"])
        opt.step()
        if bias_rate:
            with torch.no_grad():
                for m in moe_layers(model):
                    counts = torch.bincount(m.expert_indices.reshape(-1), minlength=m.num_experts)
                    m.expert_bias.copy_(update_expert_bias(m.expert_bias, counts, bias_rate))
        hist["train_loss"].append(float(ce.detach()))
    validate(steps)
    return hist


# ---------------------------------------------------------------- the shipped comparison

MOE_VS_DENSE_RECIPE: dict[str, Any] = {
    "data": {"corpus": "stdlib_docs", "tokenizer": "book_model('text')", "val_fraction": 0.1},
    "model": TransformerConfig.llama_style(vocab_size=1024, d_model=64, n_layers=2, n_heads=4,
                                           max_seq_len=64, d_ff=128, tie_embeddings=True,
                                           norm_eps=1e-6).to_dict(),
    "moe": {"num_experts": 8, "top_k": 2, "d_ff": 64},
    "train": {"steps": 600, "batch_size": 16, "context_length": 64, "lr": 3e-3, "min_lr": 3e-4,
              "warmup_steps": 20, "weight_decay": 0.1, "grad_clip": 1.0, "eval_every": 50,
              "eval_batches": 4, "seed": 0},
    "variants": {"dense": {},
                 "moe_aux": {"aux_alpha": 0.01, "z_coef": 0.001},
                 "moe_aux_small": {"aux_alpha": 0.001, "z_coef": 0.001},
                 "moe_free": {"z_coef": 0.001, "bias_rate": 0.001},
                 "moe_none": {}},
    "init_seed": 0,
}


def _book_text_ids(recipe: dict[str, Any]) -> tuple[Tensor, Tensor]:
    from llmbook.text.corpus import load_stdlib_docs
    from llmbook.training.pretrained import book_model

    tokenizer = book_model("text")[1]["tokenizer"]
    ids = torch.tensor(tokenizer.encode(load_stdlib_docs()), dtype=torch.int16)
    n_train = int(len(ids) * (1 - recipe["data"]["val_fraction"]))
    return ids[:n_train], ids[n_train:]


def _build(recipe: dict[str, Any], variant: str, expert_bias: bool | None = None) -> TransformerLM:
    config = TransformerConfig(**recipe["model"])
    gen = torch.Generator().manual_seed(recipe["init_seed"])
    if variant == "dense":
        return TransformerLM(config, generator=gen)
    m = recipe["moe"]
    return moe_lm(config, m["num_experts"], m["top_k"], m["d_ff"], generator=gen,
                  expert_bias=variant == "moe_free" if expert_bias is None else expert_bias)


def _train_moe_vs_dense(recipe: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_ids, val_ids = _book_text_ids(recipe)
        tensors: dict[str, Tensor] = {}
        info: dict[str, Any] = {"variants": {}}
        tokens_per_step = recipe["train"]["batch_size"] * recipe["train"]["context_length"]
        for variant, kw in recipe["variants"].items():
            model = _build(recipe, variant)
            hist = train_lm(model, train_ids, val_ids, recipe["train"], **kw)
            active = active_parameters(model)
            hist.update(active_parameters=active, total_parameters=model.num_parameters(),
                        flops_per_step=6 * active * tokens_per_step)
            if variant != "dense":
                tensors[f"{variant}.load"] = torch.tensor(hist.pop("load"), dtype=torch.float32)
            else:
                hist.pop("load")
            if variant == "moe_free":
                hist["final_bias"] = [m.expert_bias.tolist() for m in moe_layers(model)]
            if variant == "moe_aux":
                tensors.update({f"moe_aux.{k}": v.detach().to(torch.float16)
                                for k, v in model.state_dict().items()})
            info["variants"][variant] = hist
        return tensors, info
    finally:
        torch.set_num_threads(threads)


register("moe_vs_dense", MOE_VS_DENSE_RECIPE, _train_moe_vs_dense, __name__)


def load_moe_vs_dense() -> tuple[TransformerLM, dict[str, Tensor], dict[str, Any]]:
    """The shipped comparison: (the trained ``moe_aux`` model in float32, in eval mode;
    the expert loads ``{variant: (evals, L, N)}``; the info dict with every variant's
    curves under ``info["variants"]``)."""
    tensors, info = load_artifact("moe_vs_dense")
    model = _build(info["recipe"], "moe_aux")
    model.load_state_dict({k.removeprefix("moe_aux."): v.float() for k, v in tensors.items()
                           if k.startswith("moe_aux.") and not k.endswith(".load")})
    loads = {k.removesuffix(".load"): v for k, v in tensors.items() if k.endswith(".load")}
    return model.eval(), loads, info



# ---------------------------------------------------------------- the comparison over seeds

#: Chapter 21's seeded comparison (``data/make_moe_seeds.py``): from the unbalanced MoE,
#: one change at a time, plus the dense model. Each value holds :func:`train_lm`'s keywords.
MOE_SEEDS_VARIANTS: dict[str, dict[str, float]] = {
    "dense": {},
    "moe_none": {},
    "moe_z": {"z_coef": 0.001},
    "moe_switch": {"aux_alpha": 0.01},
    "moe_aux": {"aux_alpha": 0.01, "z_coef": 0.001},
    "moe_bias": {"bias_rate": 0.001},
}


def train_variant_seed(recipe: dict[str, Any], variant: str, kwargs: dict[str, float], seed: int,
                       train_ids: Tensor, val_ids: Tensor) -> dict[str, Any]:
    """Train one variant of ``recipe`` (shaped as :data:`MOE_VS_DENSE_RECIPE`) with both
    seeds, the initialisation's ``init_seed`` and the batch order's ``train["seed"]``, set
    to ``seed``; ``kwargs`` go to :func:`train_lm`, and ``variant == "dense"`` builds the
    dense model (any other name an MoE one, with a selection bias when ``bias_rate`` > 0).

    Returns ``val_loss`` (final), ``val_curve``, ``imbalance`` (per MoE layer, max over
    mean of the expert loads on the first validation batch at the end, 1 = balanced),
    ``router_z`` (per layer, the mean squared logsumexp of the router logits on that batch,
    :func:`~llmbook.scale.moe.router_z_loss`) and ``seconds``; the two lists are empty for
    the dense model.
    """
    import time

    if not isinstance(recipe, dict) or not {"train", "model", "init_seed"} <= recipe.keys():
        raise ValueError("recipe must be a dict shaped as MOE_VS_DENSE_RECIPE")
    if not isinstance(kwargs, dict) or not set(kwargs) <= {"aux_alpha", "z_coef", "bias_rate"}:
        raise ValueError(f"kwargs must hold only aux_alpha, z_coef, bias_rate; got {kwargs!r}")
    if variant == "dense" and kwargs:
        raise ValueError("the dense variant takes no balancing kwargs")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    run = {**recipe, "init_seed": seed, "train": {**recipe["train"], "seed": seed}}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        start = time.perf_counter()
        model = _build(run, variant, expert_bias=kwargs.get("bias_rate", 0.0) > 0)
        hist = train_lm(model, train_ids, val_ids, run["train"], **kwargs)
        seconds = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    layers = moe_layers(model)  # after train_lm's last evaluation: logits of the first val batch
    imbalance = [max(load) * len(load) for load in hist["load"][-1]] if layers else []
    router_z = [float(router_z_loss(m.router_logits)) for m in layers]
    return {"variant": variant, "seed": seed, "kwargs": dict(kwargs), "val_loss": hist["val_loss"][-1],
            "val_curve": hist["val_loss"], "eval_steps": hist["eval_steps"], "imbalance": imbalance,
            "router_z": router_z, "seconds": seconds}


def summarize_seeds(results: dict[str, Any], baseline: str = "moe_none",
                    level: float = 0.95) -> list[dict[str, Any]]:
    """One row per variant of ``data/moe_seeds/results.json``: means over seeds with
    Student-t intervals (t with seeds - 1 degrees of freedom; half-width 0 for one seed).

    ``results["runs"]`` maps a variant to its :func:`train_variant_seed` records. Each row:
    ``variant``, ``seeds``, ``val_loss`` / ``val_loss_pm`` (mean final validation loss and
    the half-width of its ``level`` interval), ``imbalance`` / ``imbalance_pm`` and
    ``router_z`` / ``router_z_pm`` (each run's mean over layers first; None for the dense
    model), and ``diff`` / ``diff_pm``: the variant's loss minus ``baseline``'s, paired by
    seed (the seeds both have), with its interval (None for the baseline itself).
    """
    from llmbook.alignment.preference_training import t_interval

    if not isinstance(results, dict) or not isinstance(results.get("runs"), dict) or not results["runs"]:
        raise ValueError("results must be a dict with a non-empty 'runs' dict (variant -> list of runs)")
    if baseline not in results["runs"]:
        raise ValueError(f"baseline {baseline!r} is not among the variants {sorted(results['runs'])}")
    if isinstance(level, bool) or not isinstance(level, int | float) or not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    base = {r["seed"]: r["val_loss"] for r in results["runs"][baseline]}
    rows = []
    for variant, runs in results["runs"].items():
        if not isinstance(runs, list) or not runs:
            raise ValueError(f"runs[{variant!r}] must be a non-empty list of runs")
        row: dict[str, Any] = {"variant": variant, "seeds": len(runs)}
        row["val_loss"], row["val_loss_pm"] = t_interval([r["val_loss"] for r in runs], level)
        for key in ("imbalance", "router_z"):
            if runs[0][key]:
                row[key], row[f"{key}_pm"] = t_interval([sum(r[key]) / len(r[key]) for r in runs], level)
            else:
                row[key] = row[f"{key}_pm"] = None
        paired = [r["val_loss"] - base[r["seed"]] for r in runs if r["seed"] in base]
        if variant == baseline or not paired:
            row["diff"] = row["diff_pm"] = None
        else:
            row["diff"], row["diff_pm"] = t_interval(paired, level)
        rows.append(row)
    return rows
