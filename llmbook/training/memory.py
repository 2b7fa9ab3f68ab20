"""Mixed precision and the memory budget of training (chapter 10).

Introduced in notebooks/10_training; chapter 22 (:mod:`llmbook.scale.mixed_precision`) re-exports
the mixed-precision tools for its distributed runs.

**Formats.** A binary floating-point format with e exponent bits and m stored mantissa bits
holds (-1)^s 2^(E - bias) (1 + M / 2^m), bias = 2^(e-1) - 1 (IEEE 754):
:func:`float_format_symbolic` derives its largest number, smallest normal and subnormal
numbers and machine epsilon from (e, m). float16 (e = 5, m = 10) has precision but little
range; bfloat16 (e = 8, m = 7) has float32's range and little precision.

**Mixed precision** (Micikevicius et al., 2018, "Mixed Precision Training") runs the
forward and backward passes in 16 bits and keeps three safeguards:

* **float32 master weights.** An update smaller than half the spacing (ulp) of the 16-bit
  numbers around a weight rounds away: bfloat16 has 8 significant bits, so at w = 1 any
  |update| < 2^-8 is lost. The optimizer therefore updates a float32 copy and the 16-bit
  weights are re-cast from it after every step (:class:`MasterWeightOptimizer`).
* **loss scaling.** float16's smallest positive (subnormal) number is 2^-24 ~ 6e-8; smaller
  gradients flush to zero. Multiplying the loss by S multiplies every gradient by S (the
  chain rule is linear), lifting them into range; the float32 copy is divided by S again.
* **dynamic scale.** S too large overflows to inf. :class:`DynamicLossScaler` starts high,
  and on a step whose gradients hold an inf or a NaN skips the update and halves S; after
  ``growth_interval`` good steps in a row it doubles S (the policy of ``torch.amp.GradScaler``).

**Memory.** 2 bytes of 16-bit weight + 2 of gradient + 4 of master weight + 4 + 4 of Adam's
moments = 16 bytes per parameter (:func:`mixed_precision_bytes_symbolic`), against 16 for
float32 training too (4 + 4 + 4 + 4): mixed precision saves activation memory and time, not
parameter-state memory. :func:`training_state_bytes` measures the tensors a step holds.
Activations: :func:`saved_activation_bytes` measures what autograd keeps for the backward
pass (``torch.autograd.graph.saved_tensors_hooks``), and
:func:`activation_elements_per_layer_symbolic` counts it for the book's GPT-2 block, in the
manner of Korthikanti et al. (2022, "Reducing Activation Recomputation in Large Transformer
Models", section 4.1).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable
from typing import Any

import sympy as sp
import torch
from torch import Tensor, nn

from llmbook.validation import check_floating_tensor, check_positive_int, check_positive_number

__all__ = [
    "DynamicLossScaler",
    "MasterWeightOptimizer",
    "activation_elements_per_layer_symbolic",
    "float_format_symbolic",
    "half_ulp",
    "mixed_precision_bytes_symbolic",
    "saved_activation_bytes",
    "scaler_trajectory",
    "training_state_bytes",
]


def float_format_symbolic(exponent_bits: int, mantissa_bits: int) -> dict[str, sp.Expr]:
    """The range and precision of a binary float format, derived from its bit layout.

    A normal number is (-1)^s 2^(E - bias) (1 + M / 2^m) with a biased exponent field
    E in 1 .. 2^e - 2 (all zeros is reserved for zero and the subnormals, all ones for inf
    and NaN), bias = 2^(e-1) - 1 and a mantissa field M in 0 .. 2^m - 1. A subnormal
    (E = 0) is 2^(1 - bias) M / 2^m. Returns ``max`` (largest finite), ``min_normal``,
    ``min_subnormal``, ``eps`` (spacing of the numbers just above 1) and ``digits``
    (decimal significant digits, (m + 1) log10 2), all exact SymPy numbers.
    float32 (8, 23), float16 (5, 10), bfloat16 (8, 7).
    """
    e = check_positive_int("exponent_bits", exponent_bits)
    m = check_positive_int("mantissa_bits", mantissa_bits)
    if e < 2:
        raise ValueError(f"exponent_bits must be at least 2 (zero and inf need two codes), got {e}")
    E, M = sp.symbols("E M", integer=True, nonnegative=True)
    bias = 2 ** (e - 1) - 1
    normal = sp.Integer(2) ** (E - bias) * (1 + M / sp.Integer(2) ** m)
    subnormal = sp.Integer(2) ** (1 - bias) * M / sp.Integer(2) ** m
    largest = normal.subs({E: 2**e - 2, M: 2**m - 1})
    one = normal.subs({E: bias, M: 0})
    return {"max": largest, "min_normal": normal.subs({E: 1, M: 0}),
            "min_subnormal": subnormal.subs(M, 1),
            "eps": normal.subs({E: bias, M: 1}) - one,
            "digits": (m + 1) * sp.log(2, 10)}


def _check_float_dtype(dtype: object) -> None:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")


def half_ulp(x: Tensor, dtype: torch.dtype) -> Tensor:
    """Half the spacing of ``dtype``'s numbers at |x| (normal range): an update of smaller
    magnitude added to x rounds back to x (round to nearest, ties to even).

    For |x| in [2^e, 2^(e+1)) the spacing is eps * 2^e, with eps = ``finfo(dtype).eps``
    (2^-7 for bfloat16, 2^-10 for float16, 2^-23 for float32).
    """
    _check_float_dtype(dtype)
    x = torch.as_tensor(check_floating_tensor(x, "x"), dtype=torch.float64)
    if (x == 0).any() or not torch.isfinite(x).all():
        raise ValueError("half_ulp needs finite non-zero x (the normal range)")
    exponent = torch.floor(torch.log2(x.abs()))
    return torch.finfo(dtype).eps * torch.exp2(exponent) / 2


def mixed_precision_bytes_symbolic() -> dict[str, sp.Expr]:
    """Bytes per parameter of mixed-precision Adam, from the bits of each copy kept.

    16-bit weight and gradient; float32 master weight and Adam's first and second moments.
    Returns each term and the total (16), and K = 12, the optimizer's share (ZeRO's K).
    """
    bits = {"weight (16-bit)": 16, "gradient (16-bit)": 16, "master weight (fp32)": 32,
            "Adam m (fp32)": 32, "Adam v (fp32)": 32}
    terms = {name: sp.Integer(b) / 8 for name, b in bits.items()}
    terms["total"] = sum(terms.values())
    terms["K (optimizer states)"] = sum(v for k, v in terms.items() if "fp32" in k)
    return terms


class DynamicLossScaler:
    """Dynamic loss scaling (Micikevicius et al., 2018, section 3.2; ``torch.amp.GradScaler``'s rule).

    Per step: ``scaled = scaler.scale(loss)``; ``scaled.backward()``; then
    ``scaler.step(optimizer, params)`` divides the gradients by S, and if any is inf/NaN
    skips ``optimizer.step()``; finally :meth:`update` halves S after an overflow (times
    ``backoff_factor``), or multiplies it by ``growth_factor`` after ``growth_interval``
    consecutive good steps. ``history`` records (scale used, stepped) per step.
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000) -> None:
        self.scale_value = check_positive_number("init_scale", init_scale)
        self.growth_factor = check_positive_number("growth_factor", growth_factor)
        self.backoff_factor = check_positive_number("backoff_factor", backoff_factor)
        if self.growth_factor <= 1 or self.backoff_factor >= 1:
            raise ValueError(f"need growth_factor > 1 and backoff_factor < 1, got "
                             f"{growth_factor} and {backoff_factor}")
        self.growth_interval = check_positive_int("growth_interval", growth_interval)
        self.good_steps = 0
        self.found_inf = False
        self.history: list[tuple[float, bool]] = []

    def scale(self, loss: Tensor) -> Tensor:
        """The loss times S (backward through it gives S times the gradients)."""
        return loss * self.scale_value

    @torch.no_grad()
    def unscale_(self, params: Iterable[Tensor]) -> bool:
        """Divide every ``.grad`` by S in place (in its own dtype); return whether any
        gradient holds an inf or a NaN."""
        found = False
        for p in params:
            if p.grad is None:
                continue
            p.grad.div_(self.scale_value)
            found = found or not bool(torch.isfinite(p.grad).all())
        self.found_inf = found
        return found

    def step(self, optimizer_step: Callable[[], object], params: Iterable[Tensor]) -> bool:
        """Unscale, then call ``optimizer_step()`` unless a gradient overflowed; then
        :meth:`update`. Returns whether the step was taken."""
        found = self.unscale_(params)
        if not found:
            optimizer_step()
        self.history.append((self.scale_value, not found))
        self.update()
        return not found

    def update(self) -> None:
        """Back off after an overflow; grow after ``growth_interval`` good steps in a row."""
        if self.found_inf:
            self.scale_value *= self.backoff_factor
            self.good_steps = 0
        else:
            self.good_steps += 1
            if self.good_steps == self.growth_interval:
                self.scale_value *= self.growth_factor
                self.good_steps = 0
        self.found_inf = False


class MasterWeightOptimizer:
    """Keep float32 master copies of a 16-bit model's parameters and step those.

    ``optimizer_factory(master_params)`` builds the optimizer on the masters (e.g.
    ``lambda ps: AdamW(ps, lr=1e-3)``). :meth:`step` copies the 16-bit gradients into the
    masters' float32 ``.grad`` (dividing by the loss scale, if a scaler is given), skips the
    step on overflow, updates the masters and casts them back into the model.
    """

    def __init__(self, params: Iterable[nn.Parameter],
                 optimizer_factory: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
                 scaler: DynamicLossScaler | None = None,
                 master_dtype: torch.dtype = torch.float32) -> None:
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("no parameter requires a gradient")
        self.masters = [nn.Parameter(p.detach().to(master_dtype).clone()) for p in self.params]
        self.optimizer = optimizer_factory(self.masters)
        self.scaler = scaler

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> bool:
        """One update; returns False if it was skipped (overflow)."""
        for p, m in zip(self.params, self.masters, strict=True):
            m.grad = None if p.grad is None else p.grad.to(m.dtype)
        if self.scaler is None:
            self.optimizer.step()
            stepped = True
        else:
            stepped = self.scaler.step(self.optimizer.step, self.masters)
        for p, m in zip(self.params, self.masters, strict=True):
            p.copy_(m)  # cast back to the model's 16-bit dtype
        return stepped


def scaler_trajectory(scaler: object, gradients: list[float], dtype: torch.dtype = torch.float16
                      ) -> list[tuple[float, bool]]:
    """Drive a loss scaler (the book's :class:`DynamicLossScaler` or ``torch.amp.GradScaler``)
    through one step per entry of ``gradients`` and record (scale used, step taken).

    A one-parameter model w (float32) has loss g_t * w; its scaled gradient g_t S is rounded
    to ``dtype`` as a 16-bit backward would (so S g_t above 65504 overflows to inf in
    float16), and SGD with lr = 1 is the optimizer. The step was taken iff w moved.
    """
    if not isinstance(scaler, DynamicLossScaler | torch.amp.GradScaler):
        raise TypeError(f"scaler must be a DynamicLossScaler or a torch.amp.GradScaler, got "
                        f"{type(scaler).__name__}")
    if not isinstance(gradients, list | tuple) or \
            any(isinstance(g, bool) or not isinstance(g, numbers.Real) for g in gradients):
        raise TypeError(f"gradients must be a list of numbers (one per step), got {gradients!r}")
    _check_float_dtype(dtype)
    w = nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([w], lr=1.0)
    out = []
    for g in gradients:
        optimizer.zero_grad()
        loss = torch.tensor(float(g)) * w.sum()
        is_book = isinstance(scaler, DynamicLossScaler)
        scale = scaler.scale_value if is_book else float(scaler.get_scale())
        scaler.scale(loss).backward()
        with torch.no_grad():  # what a 16-bit backward would have produced
            w.grad.copy_(w.grad.to(dtype).float())
        before = w.detach().clone()
        if is_book:
            scaler.step(optimizer.step, [w])
        else:
            scaler.step(optimizer)
            scaler.update()
        out.append((scale, not torch.equal(before, w.detach())))
    return out


def training_state_bytes(model: nn.Module, optimizer: Any,
                         masters: Iterable[Tensor] | None = None) -> dict[str, int]:
    """Bytes of the tensors a training step holds besides activations, measured.

    ``model``'s parameters (``weights``) and their ``.grad`` (``gradients``); the master
    copies ``masters`` (e.g. :attr:`MasterWeightOptimizer.masters`), if any; and every tensor
    in ``optimizer.state`` (``torch.optim.Optimizer`` or the book's optimisers), split into
    ``optimizer (per element)`` (tensors shaped like a parameter: Adam's m and v) and
    ``optimizer (scalars)`` (e.g. Adam's step counters, one per parameter tensor).
    Each entry is numel * element_size summed; ``total`` adds them.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    state = getattr(optimizer, "state", None)
    if state is None:
        raise TypeError(f"optimizer must have a .state (a torch optimizer), got {type(optimizer).__name__}")

    def nbytes(t: Tensor) -> int:
        return t.numel() * t.element_size()

    params = list(model.parameters())
    out = {"weights": sum(nbytes(p) for p in params),
           "gradients": sum(nbytes(p.grad) for p in params if p.grad is not None),
           "master weights": sum(nbytes(m) for m in masters) if masters is not None else 0,
           "optimizer (per element)": 0, "optimizer (scalars)": 0}
    for s in state.values():
        for t in s.values():
            if isinstance(t, Tensor):
                key = "optimizer (scalars)" if t.ndim == 0 else "optimizer (per element)"
                out[key] += nbytes(t)
    out["total"] = sum(out.values())
    return out


def saved_activation_bytes(fn: Callable[[], Any], exclude: Iterable[Tensor] = ()) -> dict[str, int]:
    """Run ``fn()`` and measure the tensors autograd saves for the backward pass.

    Every tensor an operation saves passes through the pack hook of
    ``torch.autograd.graph.saved_tensors_hooks``; one storage saved by several operations
    (a layer's input read by three projections) is counted once, and the storages of
    ``exclude`` (pass the model's parameters: weights are not activations) not at all.
    Returns ``bytes`` (distinct storages), ``tensors`` (distinct storages) and ``saves``
    (every pack, repeats included).
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable with no arguments, got {type(fn).__name__}")
    excluded = {t.untyped_storage().data_ptr() for t in exclude}
    storages: dict[int, int] = {}
    saves = 0

    def pack(t: Tensor) -> Tensor:
        nonlocal saves
        saves += 1
        storage = t.untyped_storage()
        if storage.data_ptr() not in excluded:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return {"bytes": sum(storages.values()), "tensors": len(storages), "saves": saves}


def activation_elements_per_layer_symbolic() -> dict[str, sp.Expr]:
    """What one of the book's GPT-2 blocks saves for backward, operation by operation.

    Symbols: b batch, s sequence length, h = d_model, a heads, f = d_ff. The block is
    chapter 7's pre-norm ``DecoderBlock`` with the book's own (unfused) attention, its
    LayerNorm and its tanh GELU, without dropout. Each entry is a number of saved
    elements (floats, or bytes for the boolean masks, which are 1 byte each):

    * ``layernorm`` (x2): (x - mu) for the square and again for the product with
      rsqrt(var + eps), the normalised x_hat for the gain: 3bsh, and rsqrt itself: bs;
    * ``qkv input``: the normed input, read by three projections, stored once: bsh;
    * ``scores``: Q and K for Q K^T: 2bsh;
    * ``softmax``: its output for its own backward, and the weights after masking for
      A V: 2abs^2; ``V``: bsh; ``o_proj input``: bsh;
    * ``masks`` (bytes): the causal mask s^2 and the fully-masked-row guard abs;
    * ``mlp input``: bsh; ``gelu`` (tanh form, elementwise ops): 4bsf; ``proj input``: bsf.

    Returns the entries, ``floats`` (all but the masks) and ``mask bytes``. Korthikanti et
    al. (2022), section 4.1, count sbh(34 + 5as/h) bytes for their 16-bit block with dropout
    and fused kernels; the terms differ because the implementations save different tensors.
    """
    b, s, h, a, f = sp.symbols("b s h a f", positive=True, integer=True)
    terms = {"layernorm (x2)": 2 * (3 * b * s * h + b * s), "qkv input": b * s * h,
             "scores (Q, K)": 2 * b * s * h, "softmax (twice)": 2 * a * b * s**2,
             "V": b * s * h, "o_proj input": b * s * h, "mlp input": b * s * h,
             "gelu (tanh, 4 tensors)": 4 * b * s * f, "proj input": b * s * f}
    out: dict[str, sp.Expr] = dict(terms)
    out["floats"] = sp.expand(sum(terms.values()))
    out["mask bytes"] = s**2 + a * b * s
    return out
