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

The conventions are those of Hugging Face ``peft`` (tested against it on a Llama model):
scaling alpha / r, A initialised as ``nn.Linear`` initialises its weights (Kaiming-uniform
with a = sqrt(5), i.e. U(-1/sqrt(d_in), 1/sqrt(d_in))), B = 0, dropout on the adapter's
input only, and adapters placed on the linear layers whose *last* name component is listed
(``"q_proj"`` matches ``blocks.0.attn.q_proj``).

Contents:

* :class:`LoRALinear` - a frozen ``nn.Linear`` plus the low-rank update, with merge/unmerge;
* :func:`apply_lora`, :func:`merge_lora`, :func:`unmerge_lora`, :func:`lora_state_dict`,
  :func:`count_trainable_parameters` - the same on a whole model;
* :func:`lora_parameter_count`, :func:`adamw_training_memory` and
  :func:`lora_memory_ratio_symbolic` - what LoRA saves. QLoRA (Dettmers et al., 2023,
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
from torch import Tensor, nn

from llmbook.validation import check_positive_int, check_same_dtype

__all__ = [
    "GPT2_TARGET_ALIASES",
    "LoRALinear",
    "adamw_training_memory",
    "apply_lora",
    "count_trainable_parameters",
    "lora_memory_ratio_symbolic",
    "lora_parameter_count",
    "lora_state_dict",
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


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank update (Hu et al., 2021, eq. 3).

        y = base(x) + (alpha / r) * dropout(x) A^T B^T,

    ``lora_A`` (r, d_in) is Kaiming-uniform (a = sqrt 5, as peft and ``nn.Linear``), drawn
    from ``generator`` when one is given; ``lora_B`` (d_out, r) is zero, so at first the
    layer computes exactly ``base(x)``. The base's parameters are frozen
    (``requires_grad=False``); A and B have the base weight's dtype and device.
    Shapes: (..., d_in) -> (..., d_out).

    :meth:`merge` adds Delta W = (alpha / r) B A into ``base.weight`` and :meth:`unmerge`
    subtracts it again; while merged, ``forward`` is ``base(x)`` alone, so the update is
    never counted twice.
    """

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float = 0.0,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"base must be a torch.nn.Linear, got {type(base).__name__}")
        self.r, self.alpha, p = _check_hyper(r, alpha, dropout)
        if self.r > min(base.in_features, base.out_features):
            raise ValueError(f"r={self.r} exceeds the layer's smaller side, min(d_in={base.in_features}, "
                             f"d_out={base.out_features}): B A could not have rank r")
        self.scaling = self.alpha / self.r
        self.base = base
        base.requires_grad_(False)
        kw: dict[str, Any] = {"dtype": base.weight.dtype, "device": base.weight.device}
        self.lora_A = nn.Parameter(torch.empty(self.r, base.in_features, **kw))  # (r, d_in)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, self.r, **kw))  # (d_out, r)
        # Kaiming-uniform with a = sqrt(5): gain sqrt(2 / 6), bound sqrt(3) gain / sqrt(d_in)
        # = 1 / sqrt(d_in), the default initialisation of nn.Linear.
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5), generator=generator)
        self.dropout = nn.Dropout(p) if p > 0 else nn.Identity()
        self.merged = False

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def delta_weight(self) -> Tensor:
        """Delta W = (alpha / r) B A, of shape (d_out, d_in) and rank at most r."""
        return self.scaling * (self.lora_B @ self.lora_A)  # (d_out, d_in)

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
        h = self.dropout(x) @ self.lora_A.T  # (..., r)
        return y + self.scaling * (h @ self.lora_B.T)  # (..., d_out)

    @torch.no_grad()
    def merge(self) -> None:
        """Fold the update into the base weight: W <- W + Delta W."""
        if self.merged:
            raise RuntimeError("this LoRALinear is already merged; unmerge() it first")
        self.base.weight += self.delta_weight()
        self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """Undo :meth:`merge`: W <- W - Delta W (exact up to round-off)."""
        if not self.merged:
            raise RuntimeError("this LoRALinear is not merged; there is nothing to unmerge")
        self.base.weight -= self.delta_weight()
        self.merged = False

    def extra_repr(self) -> str:
        return f"r={self.r}, alpha={self.alpha}, merged={self.merged}"


def _linear_names(model: nn.Module) -> dict[str, nn.Linear]:
    """Every nn.Linear of ``model`` by qualified name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}


def apply_lora(model: nn.Module, target_modules: str | Iterable[str], r: int, alpha: float,
               dropout: float = 0.0, generator: torch.Generator | None = None) -> nn.Module:
    """Freeze ``model`` and put a :class:`LoRALinear` on each targeted linear layer, in place.

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
            setattr(parent, child, LoRALinear(linear, r, alpha, dropout, generator=generator))
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
    """Only the adapter weights (the ``lora_A`` and ``lora_B`` entries of the state dict).

    This is all a fine-tune needs to save; load it back into a model prepared with the same
    :func:`apply_lora` call by ``model.load_state_dict(sd, strict=False)``.
    """
    _lora_layers(model)
    return {k: v for k, v in model.state_dict().items()
            if k.endswith(".lora_A") or k.endswith(".lora_B")}


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


def adamw_training_memory(n_trainable: int, n_frozen: int, bytes_per_param: float = 4.0,
                          frozen_bytes_per_param: float | None = None) -> dict[str, float]:
    """Bytes of training state with AdamW: weights, gradients and the two moment estimates.

    A trainable parameter holds its weight, its gradient and Adam's m and v: 4 numbers of
    ``bytes_per_param`` bytes each. A frozen one holds only its weight, of
    ``frozen_bytes_per_param`` bytes (default ``bytes_per_param``; QLoRA's NF4 is 0.5 plus
    its quantisation constants). Activations, which depend on batch and sequence length,
    are not counted. Returns ``weights``, ``gradients``, ``optimizer`` and ``total``.
    Full fine-tuning is ``n_frozen=0``.
    """
    for name, n in (("n_trainable", n_trainable), ("n_frozen", n_frozen)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"{name} must be a non-negative int, got {name}={n!r}")
    b = bytes_per_param
    bf = b if frozen_bytes_per_param is None else frozen_bytes_per_param
    for name, value in (("bytes_per_param", b), ("frozen_bytes_per_param", bf)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError(f"{name} must be a positive number, got {name}={value!r}")
    parts = {"weights": float(n_trainable * b + n_frozen * bf),
             "gradients": float(n_trainable * b),
             "optimizer": float(2 * n_trainable * b)}  # Adam's m and v
    parts["total"] = sum(parts.values())
    return parts


def lora_memory_ratio_symbolic() -> Any:
    """The ratio (LoRA training memory) / (full fine-tuning memory) of one d_out x d_in matrix.

    With b bytes per number, full fine-tuning keeps 4 d_in d_out numbers (weight, gradient,
    m, v); LoRA keeps d_in d_out frozen numbers plus 4 r (d_in + d_out). As a sympy
    expression in the symbols ``d_in``, ``d_out``, ``r``; it tends to 1/4 when r << d.
    """
    import sympy as sp

    d_in, d_out, r = sp.symbols("d_in d_out r", positive=True, integer=True)
    return sp.simplify((d_in * d_out + 4 * r * (d_in + d_out)) / (4 * d_in * d_out))
