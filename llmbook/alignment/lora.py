"""LoRA: low-rank adapters on frozen linear layers, merging, parameter and memory counts.

Introduced in notebooks/16_lora. Low-Rank Adaptation (Hu et al., 2021, "LoRA: Low-Rank
Adaptation of Large Language Models") fine-tunes a pretrained weight W (d_out, d_in) by
freezing it and learning a low-rank update:

    h = W x + (alpha / r) B A x,    A (r, d_in),  B (d_out, r),  r << min(d_in, d_out),

so Delta W = (alpha / r) B A has rank at most r and costs r (d_in + d_out) parameters instead
of d_in d_out. A starts random and B at zero (section 4.1), so the adapted model *is* the
pretrained model at step 0. Dividing by r lets one keep alpha fixed while varying r. After
training, Delta W is added into W ("merging"): inference then costs exactly what the base
model costs.

Three later refinements are options of the same layer, each tested against ``peft``:

* **rsLoRA** (Kalajdzievski, 2023, "A Rank Stabilization Scaling Factor for Fine-Tuning with
  LoRA"): scale by alpha / sqrt(r) instead of alpha / r (``use_rslora=True``), so that the
  size of what a training step changes no longer falls with the rank;
* **LoRA+** (Hayou, Ghosh and Yu, 2024, "LoRA+: Efficient Low Rank Adaptation of Large
  Models"): train B with a learning rate lambda times A's (:func:`loraplus_param_groups`);
* **DoRA** (Liu et al., 2024, "DoRA: Weight-Decomposed Low-Rank Adaptation"): split the
  weight into a trained magnitude m (one number per output) and a direction,
  W' = m (W + Delta W) / ||W + Delta W||, the norm taken per output unit (``use_dora=True``).

The conventions are those of Hugging Face ``peft`` (tested against it on a Llama model):
scaling alpha / r, A initialised as ``nn.Linear`` initialises its weights (Kaiming-uniform
with a = sqrt(5), i.e. U(-1/sqrt(d_in), 1/sqrt(d_in))), B = 0, dropout on the adapter's
input only, and adapters placed on the linear layers whose *last* name component is listed
(``"q_proj"`` matches ``blocks.0.attn.q_proj``).

Contents:

* :class:`LoRALinear` - a frozen ``nn.Linear`` plus the low-rank update, with merge/unmerge;
* :func:`apply_lora`, :func:`merge_lora`, :func:`unmerge_lora`, :func:`lora_state_dict`,
  :func:`count_trainable_parameters` - the same on a whole model;
* :func:`lora_scaling` and :func:`loraplus_param_groups` - rsLoRA's scaling and LoRA+'s
  learning rates;
* :func:`lora_parameter_count`, :func:`adamw_training_memory` and
  :func:`lora_memory_ratio_symbolic` - what LoRA saves, with mixed-precision AdamW by default
  (16 bytes per trained parameter, 2 per frozen one). QLoRA (Dettmers et al., 2023,
  "QLoRA: Efficient Finetuning of Quantized LLMs") saves more by storing the frozen weights
  in 4-bit NF4: pass ``frozen_bytes_per_param=0.5`` to :func:`adamw_training_memory`,
  and :func:`quantize_frozen_nf4` rounds a model's linear weights to NF4 (chapter 15) so
  that adapters can be trained on a 4-bit base.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from llmbook.validation import (
    check_nonnegative_number,
    check_positive_int,
    check_positive_number,
    check_same_dtype,
)

__all__ = [
    "GPT2_TARGET_ALIASES",
    "LoRALinear",
    "adamw_training_memory",
    "apply_lora",
    "count_trainable_parameters",
    "lora_memory_ratio_symbolic",
    "lora_parameter_count",
    "lora_scaling",
    "lora_state_dict",
    "loraplus_param_groups",
    "merge_lora",
    "quantize_frozen_nf4",
    "unmerge_lora",
]

# The book's model uses Llama's module names (q_proj, k_proj, v_proj, o_proj, gate_proj,
# up_proj, down_proj), so a target list written for peft on a Llama or Qwen2 model selects
# the same matrices here. GPT-2's Hugging Face names differ; from_hf splits its fused c_attn
# into three projections, so "c_attn" maps to all three. (peft puts *one* rank-r adapter on
# the fused (d, 3d) matrix; here each of the three gets its own, 6 r d parameters, not 4 r d.)
GPT2_TARGET_ALIASES: dict[str, tuple[str, ...]] = {
    "c_attn": ("q_proj", "k_proj", "v_proj"),
    "c_proj": ("o_proj", "proj"),  # GPT-2 calls both output projections c_proj
    "c_fc": ("fc",),
}


def _check_hyper(r: object, alpha: object, dropout: object) -> tuple[int, float, float]:
    r = check_positive_int("r", r)
    for name, value in (("alpha", alpha), ("dropout", dropout)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if not (alpha > 0 and math.isfinite(alpha)):
        raise ValueError(f"alpha must be a positive finite number, got alpha={alpha}")
    if not 0 <= dropout < 1:
        raise ValueError(f"dropout must be in [0, 1), got dropout={dropout}")
    return r, float(alpha), float(dropout)


def _check_flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return value


def lora_scaling(r: int, alpha: float, use_rslora: bool = False) -> float:
    """The factor gamma_r in front of B A: alpha / r (Hu et al., 2021), or alpha / sqrt(r)
    with ``use_rslora`` (Kalajdzievski, 2023), as ``peft`` computes it.

    Why sqrt(r): one gradient step from B = 0 changes the layer's output by
    -eta gamma_r^2 ||A x||^2 g, and ||A x||^2 grows like r, so the change goes like
    gamma_r^2 r: constant in r for gamma_r = alpha / sqrt(r), falling like 1 / r for alpha / r.
    """
    r, alpha, _ = _check_hyper(r, alpha, 0.0)
    use_rslora = _check_flag("use_rslora", use_rslora)
    return alpha / math.sqrt(r) if use_rslora else alpha / r


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank update (Hu et al., 2021, eq. 3).

        y = base(x) + gamma * dropout(x) A^T B^T,    gamma = alpha / r (alpha / sqrt(r) with
                                                     ``use_rslora``, :func:`lora_scaling`)

    ``lora_A`` (r, d_in) is Kaiming-uniform (a = sqrt 5, as peft and ``nn.Linear``), drawn
    from ``generator`` when one is given; ``lora_B`` (d_out, r) is zero, so at first the
    layer computes exactly ``base(x)``. The base's parameters are frozen
    (``requires_grad=False``); A and B have the base weight's dtype and device.
    Shapes: (..., d_in) -> (..., d_out).

    With ``use_dora`` (Liu et al., 2024, eq. 5) the layer computes with the weight

        W' = diag(m / n) (W + gamma B A),    n = ||W + gamma B A|| per output unit (row of W),

    and a trained magnitude ``lora_magnitude`` m (d_out,), initialised to the row norms of W,
    so that again W' = W at the start. The norm n is a constant in the backward pass
    (``detach``, the paper's section 4.3 and peft's choice): the direction's gradient is
    (m / n) dL/dW' without the projection that differentiating n would add. As in peft, the
    bias is not rescaled, and with dropout in training the rescaled base term sees the dropped
    input: y = base(x) + (m / n - 1) W dropout(x) + (m / n) gamma B A dropout(x).

    :meth:`merge` folds the update into ``base.weight`` (W + gamma B A, or W' for DoRA) and
    :meth:`unmerge` takes it out again; while merged, ``forward`` is ``base(x)`` alone, so the
    update is never counted twice.
    """

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float = 0.0,
                 generator: torch.Generator | None = None, use_rslora: bool = False,
                 use_dora: bool = False) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"base must be a torch.nn.Linear, got {type(base).__name__}")
        self.r, self.alpha, p = _check_hyper(r, alpha, dropout)
        if self.r > min(base.in_features, base.out_features):
            raise ValueError(f"r={self.r} exceeds the layer's smaller side, min(d_in={base.in_features}, "
                             f"d_out={base.out_features}): B A could not have rank r")
        self.use_rslora = _check_flag("use_rslora", use_rslora)
        self.use_dora = _check_flag("use_dora", use_dora)
        self.scaling = lora_scaling(self.r, self.alpha, self.use_rslora)
        self.base = base
        base.requires_grad_(False)
        kw: dict[str, Any] = {"dtype": base.weight.dtype, "device": base.weight.device}
        self.lora_A = nn.Parameter(torch.empty(self.r, base.in_features, **kw))  # (r, d_in)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, self.r, **kw))  # (d_out, r)
        # Kaiming-uniform with a = sqrt(5): gain sqrt(2 / 6), bound sqrt(3) gain / sqrt(d_in)
        # = 1 / sqrt(d_in), the default initialisation of nn.Linear.
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5), generator=generator)
        self.merged = False
        self._merged_dora_factor: Tensor | None = None
        self.lora_magnitude: nn.Parameter | None = None
        if self.use_dora:  # m = ||W + gamma B A|| = ||W|| per output unit, since B = 0
            self.lora_magnitude = nn.Parameter(self.weight_norm())  # (d_out,)
        self.dropout = nn.Dropout(p) if p > 0 else nn.Identity()

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def delta_weight(self) -> Tensor:
        """Delta W = gamma B A, of shape (d_out, d_in) and rank at most r."""
        return self.scaling * (self.lora_B @ self.lora_A)  # (d_out, d_in)

    def weight_norm(self) -> Tensor:
        """n = ||W + gamma B A|| per output unit (the L2 norm of each row), shape (d_out,),
        detached from the graph (DoRA treats it as a constant in the backward pass)."""
        with torch.no_grad():
            w = self.base.weight
            if self.merged:  # the base holds the merged weight; use the one it came from
                w = self._unmerged_weight()
            return torch.linalg.vector_norm(w + self.delta_weight(), dim=1)  # (d_out,)

    def _unmerged_weight(self) -> Tensor:
        w = self.base.weight
        if self.use_dora:
            return w / self._merged_dora_factor[:, None] - self.delta_weight()
        return w - self.delta_weight()

    def forward(self, x: Tensor) -> Tensor:
        if not isinstance(x, Tensor):
            raise TypeError(f"LoRALinear expects a torch.Tensor, got {type(x).__name__}")
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"LoRALinear expects input of shape (..., {self.in_features}), "
                             f"got {tuple(x.shape)}")
        check_same_dtype(x, "x", self.lora_A, "the adapter's weights")
        y = self.base(x)  # (..., d_out)
        if self.merged:
            return y
        x_d = self.dropout(x)
        lora = self.scaling * ((x_d @ self.lora_A.T) @ self.lora_B.T)  # (..., r) -> (..., d_out)
        if not self.use_dora:
            return y + lora
        factor = self.lora_magnitude / self.weight_norm()  # m / n, (d_out,); n is a constant
        return y + (factor - 1) * F.linear(x_d, self.base.weight) + factor * lora

    @torch.no_grad()
    def merge(self) -> None:
        """Fold the update into the base weight: W <- W + gamma B A, or W <- W' for DoRA."""
        if self.merged:
            raise RuntimeError("this LoRALinear is already merged; unmerge() it first")
        if self.use_dora:
            factor = self.lora_magnitude / self.weight_norm()  # (d_out,)
            self.base.weight.copy_(factor[:, None] * (self.base.weight + self.delta_weight()))
            self._merged_dora_factor = factor.clone()
        else:
            self.base.weight += self.delta_weight()
        self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """Undo :meth:`merge` (exact up to round-off)."""
        if not self.merged:
            raise RuntimeError("this LoRALinear is not merged; there is nothing to unmerge")
        self.base.weight.copy_(self._unmerged_weight())
        self._merged_dora_factor = None
        self.merged = False

    def extra_repr(self) -> str:
        return (f"r={self.r}, alpha={self.alpha}, scaling={self.scaling:g}, "
                f"use_dora={self.use_dora}, merged={self.merged}")


def _linear_names(model: nn.Module) -> dict[str, nn.Linear]:
    """Every nn.Linear of ``model`` by qualified name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}


def apply_lora(model: nn.Module, target_modules: str | Iterable[str], r: int, alpha: float,
               dropout: float = 0.0, generator: torch.Generator | None = None,
               use_rslora: bool = False, use_dora: bool = False) -> nn.Module:
    """Freeze ``model`` and put a :class:`LoRALinear` on each targeted linear layer, in place.

    ``use_rslora`` and ``use_dora`` are passed to every layer (peft's options of the same names).

    A layer is targeted when the last component of its name is in ``target_modules`` (a
    name or a list of names); GPT-2's Hugging Face names are translated with
    :data:`GPT2_TARGET_ALIASES`. Every other parameter gets ``requires_grad=False``, so only
    the adapters train. The adapters are initialised in module order from ``generator``.
    A name that matches no layer is a ``ValueError`` listing the names there are.
    Returns ``model``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    targets = [target_modules] if isinstance(target_modules, str) else list(target_modules)
    if not targets or not all(isinstance(t, str) for t in targets):
        raise TypeError(f"target_modules must be a non-empty list of module names, "
                        f"got {target_modules!r}")
    r, alpha, dropout = _check_hyper(r, alpha, dropout)
    use_rslora, use_dora = _check_flag("use_rslora", use_rslora), _check_flag("use_dora", use_dora)
    if any(isinstance(m, LoRALinear) for m in model.modules()):
        raise ValueError("model already has LoRALinear layers; apply_lora once per model")
    linears = _linear_names(model)
    available = sorted({name.rsplit(".", 1)[-1] for name in linears})
    wanted: set[str] = set()
    for t in targets:
        names = (t,) if t in available else GPT2_TARGET_ALIASES.get(t, (t,))
        missing = [n for n in names if n not in available]
        if missing:
            raise ValueError(f"target module {t!r} matches no linear layer of the model; "
                             f"its linear layers are named {available}")
        wanted.update(names)

    model.requires_grad_(False)
    for name, linear in linears.items():
        parent_name, _, child = name.rpartition(".")
        if child in wanted:
            parent = model.get_submodule(parent_name)
            setattr(parent, child, LoRALinear(linear, r, alpha, dropout, generator=generator,
                                              use_rslora=use_rslora, use_dora=use_dora))
    return model


def _lora_layers(model: nn.Module) -> list[LoRALinear]:
    layers = [m for m in model.modules() if isinstance(m, LoRALinear)]
    if not layers:
        raise ValueError("model has no LoRALinear layers; call apply_lora first")
    return layers


def merge_lora(model: nn.Module) -> nn.Module:
    """Merge every adapter of ``model`` into its base weight (:meth:`LoRALinear.merge`)."""
    for layer in _lora_layers(model):
        layer.merge()
    return model


def unmerge_lora(model: nn.Module) -> nn.Module:
    """Undo :func:`merge_lora` (:meth:`LoRALinear.unmerge` on every adapter)."""
    for layer in _lora_layers(model):
        layer.unmerge()
    return model


def lora_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """Only the adapter weights (the ``lora_A``, ``lora_B`` and, for DoRA,
    ``lora_magnitude`` entries of the state dict).

    This is all a fine-tune needs to save; load it back into a model prepared with the same
    :func:`apply_lora` call by ``model.load_state_dict(sd, strict=False)``.
    """
    _lora_layers(model)
    return {k: v for k, v in model.state_dict().items()
            if k.rsplit(".", 1)[-1] in ("lora_A", "lora_B", "lora_magnitude")}


def loraplus_param_groups(model: nn.Module, lr: float, lr_ratio: float,
                          weight_decay: float = 0.0) -> list[dict[str, Any]]:
    """Optimizer parameter groups for LoRA+ (Hayou, Ghosh and Yu, 2024): B learns faster.

    The trainable parameters of ``model`` in two groups: the ``lora_A`` matrices (and any
    other trainable matrix) at learning rate ``lr``, and the ``lora_B`` matrices with every
    trainable vector (DoRA's magnitudes, biases) at ``lr * lr_ratio``, lambda = eta_B / eta_A.
    This is the grouping of peft's ``create_loraplus_optimizer`` (without its separate group
    for adapters on embeddings, which the book's LoRA does not place). Pass the result to any
    ``torch.optim`` optimizer: ``torch.optim.AdamW(loraplus_param_groups(m, 1e-3, 16))``.

    Why: with B = 0 and A random, a step on B moves the output by an amount set by ||A x||^2,
    which does not grow with the width d, while a step on A moves it by an amount set by
    ||x||^2, which grows like d; for both to move the output by comparable amounts as d
    grows, eta_B / eta_A must grow like d (Hayou et al. derive this in the limit of large
    width; with Adam, whose steps have a size set by eta alone, the same counting holds).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    lr = check_positive_number("lr", lr)
    lr_ratio = check_positive_number("lr_ratio", lr_ratio)
    weight_decay = check_nonnegative_number("weight_decay", weight_decay)
    group_a: list[nn.Parameter] = []
    group_b: list[nn.Parameter] = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (group_b if name.rsplit(".", 1)[-1] == "lora_B" or p.ndim == 1 else group_a).append(p)
    if not group_a and not group_b:
        raise ValueError("model has no trainable parameters; call apply_lora first")
    return [{"params": group_a, "lr": lr, "weight_decay": weight_decay},
            {"params": group_b, "lr": lr * lr_ratio, "weight_decay": weight_decay}]


def count_trainable_parameters(model: nn.Module) -> int:
    """The number of parameters with ``requires_grad=True`` (shared ones counted once)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@torch.no_grad()
def quantize_frozen_nf4(model: nn.Module, group_size: int = 64) -> nn.Module:
    """Round the weight of every ``nn.Linear`` of ``model`` to 4-bit NF4, in place; returns it.

    Each weight (d_out, d_in) is cut into groups of ``group_size`` consecutive inputs, each
    group divided by its absolute maximum and snapped to the nearest of the 16 NF4 levels
    (:func:`llmbook.inference.quant.quantize_nf4`, chapter 15). The values are kept as floats
    (a simulation: QLoRA stores the 4-bit indices and one constant per group, and
    dequantises on the fly), so a forward pass computes exactly what QLoRA's would with
    these weights. Biases, norms and embeddings stay in full precision, as in QLoRA.
    Call it before :func:`apply_lora`; a ``d_in`` that ``group_size`` does not divide is a
    ``ValueError``.
    """
    from llmbook.inference.quant import quantize_nf4

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    group_size = check_positive_int("group_size", group_size)
    linears = _linear_names(model)
    for name, linear in linears.items():
        if linear.in_features % group_size:
            raise ValueError(f"group_size={group_size} does not divide the input width "
                             f"{linear.in_features} of {name}")
    for linear in linears.values():
        linear.weight.copy_(quantize_nf4(linear.weight, group_size))
    return model


def lora_parameter_count(d_in: int, d_out: int, r: int) -> int:
    """Parameters of one adapter: r d_in (A) + d_out r (B) = r (d_in + d_out).

    Llama 2 7B's q_proj (4096 x 4096) with r = 8: 65,536, against 16,777,216 for W itself.
    """
    d_in = check_positive_int("d_in", d_in)
    d_out = check_positive_int("d_out", d_out)
    r = check_positive_int("r", r)
    return r * (d_in + d_out)


def adamw_training_memory(n_trainable: int, n_frozen: int, weight_bytes: float = 2,
                          grad_bytes: float = 2, master_bytes: float = 4, moment_bytes: float = 4,
                          frozen_bytes: float | None = None) -> dict[str, float]:
    """Bytes of training state with AdamW: weights, gradients, master weights, moments.

    The defaults are mixed precision (Micikevicius et al., 2018), what large models are
    trained with: a trained parameter holds a 16-bit weight (2 bytes) and gradient (2), a
    float32 master copy (4) and Adam's float32 m and v (4 + 4), 16 bytes in all; a frozen one
    holds only its weight, ``frozen_bytes`` (default ``weight_bytes``: 2; QLoRA's NF4 is 0.5
    plus its quantisation constants). Plain float32 training is ``weight_bytes=4,
    grad_bytes=4, master_bytes=0``: 16 bytes per trained parameter too, 4 per frozen one.
    Activations, which depend on batch and sequence length, and Adam's per-tensor step
    counters are not counted. Returns ``weights``, ``gradients``, ``master weights``,
    ``optimizer`` and ``total``, the parts :func:`llmbook.training.memory.training_state_bytes`
    measures on a real step. Full fine-tuning is ``n_frozen=0``.
    """
    for name, n in (("n_trainable", n_trainable), ("n_frozen", n_frozen)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"{name} must be a non-negative int, got {name}={n!r}")
    wb = check_positive_number("weight_bytes", weight_bytes)
    gb = check_positive_number("grad_bytes", grad_bytes)
    mb = check_nonnegative_number("master_bytes", master_bytes)
    ob = check_positive_number("moment_bytes", moment_bytes)
    fb = wb if frozen_bytes is None else check_positive_number("frozen_bytes", frozen_bytes)
    parts = {"weights": float(n_trainable * wb + n_frozen * fb),
             "gradients": float(n_trainable * gb),
             "master weights": float(n_trainable * mb),
             "optimizer": float(2 * n_trainable * ob)}  # Adam's m and v
    parts["total"] = sum(parts.values())
    return parts


def lora_memory_ratio_symbolic(trainable_bytes: float = 16, frozen_bytes: float = 2) -> Any:
    """The ratio rho = (LoRA training memory) / (full fine-tuning memory) of one d_out x d_in matrix.

    A trained parameter costs t = ``trainable_bytes`` (16 with mixed-precision AdamW: 2 + 2 +
    4 + 4 + 4, see :func:`adamw_training_memory`), a frozen one f = ``frozen_bytes`` (2, its
    16-bit weight). Full fine-tuning keeps t d_in d_out bytes; LoRA keeps f d_in d_out frozen
    and t r (d_in + d_out) trained:

        rho = (f d_in d_out + t r (d_in + d_out)) / (t d_in d_out),

    a sympy expression in the symbols ``d_in``, ``d_out``, ``r`` (positive integers); t and
    f may be Python numbers or exact sympy numbers. It
    tends to f / t when r << d: 1/8 in mixed precision, 1/4 in float32 (t = 16, f = 4).
    """
    import sympy as sp

    def exact(name: str, value: object) -> Any:  # a Python number, or an exact sympy one
        if isinstance(value, sp.Expr) and value.is_number:
            if not (value.is_positive and value.is_finite):
                raise ValueError(f"{name} must be a positive finite number, got {name}={value}")
            return value
        return sp.nsimplify(check_positive_number(name, value))

    t, f = exact("trainable_bytes", trainable_bytes), exact("frozen_bytes", frozen_bytes)
    d_in, d_out, r = sp.symbols("d_in d_out r", positive=True, integer=True)
    return (f * d_in * d_out + t * r * (d_in + d_out)) / (t * d_in * d_out)
